"""The connector's options, parsed and checked once, on the driver (pure, no I/O).

Spark hands options over as strings in a case-insensitive map (keys arrive
lower-cased), so every lookup here lower-cases the name. Names follow Spark's
Kafka connector where one exists (``subscribe``, ``startingOffsets``,
``maxOffsetsPerTrigger``, ...); ``kafka.bootstrap.servers`` and
``kafka.isolation.level`` are accepted as aliases so Kafka jobs port with a
format change. A bad option raises ``BrokerError(INVALID_CONFIG)`` naming it.

A secured cluster: ``username`` / ``password`` (HTTP Basic on every request of
the driver and the executors), ``ssl.cafile`` (the CA of the nodes'
certificates, for ``https://`` bootstrap URLs), ``ssl.certfile`` /
``ssl.keyfile`` (a client certificate). They travel to the executors inside
the pickled settings (as Spark's Kafka connector ships its JAAS config); the
password is in no ``repr`` and so in no plan string or log line.

Offsets JSON is Kafka's: ``{"topic": {"0": 23, "1": -2}}`` with -2 = earliest
and -1 = latest; by-timestamp JSON is ``{"topic": {"0": 1700000000000}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clients.aio import parse_bootstrap
from clients.protocol import BrokerError, ErrorCode
from clients.security import ClientSecurity

TP = tuple[str, int]
EARLIEST = -2
LATEST = -1
# Characters a write id / sink id may not contain: ':' separates the parts of transactional ids.
_ID_RX = re.compile(r"[A-Za-z0-9._\-]{1,200}")


def bad(name: str, message: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_CONFIG, f"option {name!r}: {message}")


class Options:
    """Lower-cased view of Spark's option map with typed getters."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = {str(k).lower(): str(v) for k, v in raw.items()}

    def get(self, *names: str) -> str | None:
        for n in names:
            v = self.raw.get(n.lower())
            if v is not None and v.strip() != "":
                return v.strip()
        return None

    def optional_integer(self, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int | None:
        v = self.get(name)
        if v is None:
            return None
        try:
            n = int(v)
        except ValueError:
            raise bad(name, f"{v!r} is not an integer") from None
        if not lo <= n <= hi:
            raise bad(name, f"{n} is outside {lo}..{hi}")
        return n

    def integer(self, name: str, default: int, lo: int = 0, hi: int = 2**63 - 1) -> int:
        v = self.optional_integer(name, lo, hi)
        return default if v is None else v

    def flag(self, name: str, default: bool) -> bool:
        v = self.get(name)
        if v is None:
            return default
        if v.lower() in ("true", "1", "yes"):
            return True
        if v.lower() in ("false", "0", "no"):
            return False
        raise bad(name, f"{v!r} is not true or false")

    def duration_ms(self, name: str, default: int) -> int:
        """Spark's time strings: ``500ms``, ``30s``, ``15m``, ``1h``, ``1d``; a bare number is milliseconds."""
        v = self.get(name)
        if v is None:
            return default
        m = re.fullmatch(r"(\d+)\s*(ms|s|m|min|h|d)?", v.lower())
        if m is None:
            raise bad(name, f"{v!r} is not a duration such as 500ms, 30s, 15m")
        unit = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
        return int(m.group(1)) * unit[m.group(2)]

    def bootstrap(self) -> str:
        v = self.get("bootstrap", "kafka.bootstrap.servers", "bootstrap.servers")
        if v is None:
            raise bad("bootstrap", "required: the broker URL(s), e.g. http://127.0.0.1:9091")
        return v

    def identifier(self, *names: str) -> str | None:
        v = self.get(*names)
        if v is not None and not _ID_RX.fullmatch(v):
            raise bad(names[0], f"{v!r} must be 1-200 characters of A-Z a-z 0-9 . _ -")
        return v


@dataclass(frozen=True)
class Credentials:
    """How to reach a secured cluster (picklable strings only; the password is kept out of ``repr``)."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    @classmethod
    def parse(cls, o: Options, bootstrap: str) -> Credentials:
        creds = cls(o.get("username"), o.get("password"), o.get("ssl.cafile"), o.get("ssl.certfile"),
                    o.get("ssl.keyfile"))  # fmt: skip
        try:
            creds.client_security(bootstrap)
        except ValueError as exc:
            name = "ssl.cafile" if "ssl_" in str(exc) else "username"
            raise bad(name, str(exc).replace("sasl_plain_", "").replace("ssl_", "ssl.")) from None
        return creds

    def client_security(self, bootstrap: str) -> ClientSecurity:
        """The clients' settings (TLS context, Basic header): checked, built where they are used."""
        return ClientSecurity.from_options(
            parse_bootstrap(bootstrap), sasl_plain_username=self.username, sasl_plain_password=self.password,
            ssl_cafile=self.cafile, ssl_certfile=self.certfile, ssl_keyfile=self.keyfile,
        )  # fmt: skip


NO_CREDENTIALS = Credentials()


# ---- offsets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends.

    ``kind``: ``earliest`` | ``latest`` | ``offsets`` (per partition, -2/-1
    allowed) | ``timestamp`` (one time for every partition) | ``timestamps``
    (per partition). ``missing`` is the by-timestamp strategy when no record
    is that new: ``error`` or ``latest``.
    """

    kind: str
    offsets: dict[TP, int] = field(default_factory=dict)
    timestamp: int | None = None
    missing: str = "error"


def parse_partition_json(name: str, text: str) -> dict[TP, int]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise bad(name, f'{text!r} is not JSON like {{"topic": {{"0": 23}}}}') from None
    if not isinstance(doc, dict):
        raise bad(name, "expected a JSON object of topics")
    out: dict[TP, int] = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise bad(name, f"topic {topic!r} must map partitions to numbers")
        for p, v in parts.items():
            try:
                out[(str(topic), int(p))] = int(v)
            except (TypeError, ValueError):
                raise bad(name, f"{topic}[{p}] = {v!r} is not a number") from None
    return out


def offset_spec(opts: Options, which: str, default: str, *, streaming: bool) -> OffsetSpec:
    """``which`` is ``starting`` or ``ending``. Precedence as in Spark: timestamp, by-timestamp, offsets."""
    # Kafka: a starting time with no record that new fails unless the strategy says latest; an ending
    # time with no record that new means the latest offset.
    missing = (opts.get(f"{which}OffsetsByTimestampStrategy") or ("error" if which == "starting" else "latest")).lower()
    if missing not in ("error", "latest"):
        raise bad(f"{which}OffsetsByTimestampStrategy", "must be error or latest")
    ts = opts.optional_integer(f"{which}Timestamp")
    if ts is not None:
        return OffsetSpec("timestamp", timestamp=ts, missing=missing)
    by_ts = opts.get(f"{which}OffsetsByTimestamp")
    if by_ts is not None:
        return OffsetSpec("timestamps", offsets=parse_partition_json(f"{which}OffsetsByTimestamp", by_ts),
                          missing=missing)  # fmt: skip
    name = f"{which}Offsets"
    v = opts.get(name) or default
    if v.lower() in ("earliest", "latest"):
        if which == "ending" and v.lower() == "earliest":
            raise bad(name, "earliest is not allowed for endingOffsets")
        return OffsetSpec(v.lower())
    offsets = parse_partition_json(name, v)
    for tp, off in offsets.items():
        if off < EARLIEST:
            raise bad(name, f"{tp[0]}[{tp[1]}] = {off}: offsets are >= 0, -2 (earliest) or -1 (latest)")
        if which == "ending" and off == EARLIEST:
            raise bad(name, f"{tp[0]}[{tp[1]}]: -2 (earliest) is not allowed as an ending offset")
        if which == "starting" and off == LATEST and not streaming:
            raise bad(name, f"{tp[0]}[{tp[1]}]: -1 (latest) is not allowed as a batch starting offset")
    return OffsetSpec("offsets", offsets=offsets)


# ---- reader -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReaderOptions:
    bootstrap: str
    subscribe: tuple[str, ...] | None
    pattern: str | None
    assign: tuple[TP, ...] | None
    starting: OffsetSpec
    ending: OffsetSpec
    isolation: str
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    fetch_max_bytes: int
    poll_timeout_ms: int
    request_timeout_ms: int
    group_id: str | None
    read_replica: str = "leader"
    credentials: Credentials = NO_CREDENTIALS

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, streaming: bool) -> ReaderOptions:
        o = Options(raw)
        chosen = [n for n in ("subscribe", "subscribePattern", "assign", "topic") if o.get(n) is not None]
        if len(chosen) != 1:
            raise bad("subscribe", f"give exactly one of subscribe, subscribePattern, assign, topic (got {chosen})")
        subscribe = pattern = assign = None
        if chosen[0] in ("subscribe", "topic"):
            names = tuple(t.strip() for t in (o.get(chosen[0]) or "").split(",") if t.strip())
            subscribe = tuple(dict.fromkeys(names))
        elif chosen[0] == "subscribePattern":
            pattern = o.get("subscribePattern")
            try:
                re.compile(pattern or "")
            except re.error as exc:
                raise bad("subscribePattern", f"not a regular expression: {exc}") from None
        else:
            assign = _parse_assign(o.get("assign") or "")
        isolation = (o.get("isolation.level", "kafka.isolation.level", "isolationLevel") or "read_committed").lower()
        if isolation not in ("read_committed", "read_uncommitted"):
            raise bad("isolation.level", "must be read_committed or read_uncommitted")
        read_replica = (o.get("readReplica") or "leader").lower()
        if read_replica not in ("leader", "any"):
            raise bad("readReplica", "must be leader or any")
        max_t = o.optional_integer("maxOffsetsPerTrigger", lo=1)
        min_t = o.optional_integer("minOffsetsPerTrigger", lo=1)
        if max_t is not None and min_t is not None and min_t > max_t:
            raise bad("minOffsetsPerTrigger", f"{min_t} is more than maxOffsetsPerTrigger {max_t}")
        return cls(
            bootstrap=o.bootstrap(),
            subscribe=subscribe,
            pattern=pattern,
            assign=assign,
            starting=offset_spec(o, "starting", "latest" if streaming else "earliest", streaming=streaming),
            ending=offset_spec(o, "ending", "latest", streaming=streaming),
            isolation=isolation,
            fail_on_data_loss=o.flag("failOnDataLoss", True),
            include_headers=o.flag("includeHeaders", True),
            min_partitions=o.optional_integer("minPartitions", lo=1, hi=1_000_000),
            max_offsets_per_trigger=max_t,
            min_offsets_per_trigger=min_t,
            max_trigger_delay_ms=o.duration_ms("maxTriggerDelay", 15 * 60_000),
            fetch_max_bytes=o.integer("fetch.maxBytes", 4 << 20, lo=1024, hi=64 << 20),
            poll_timeout_ms=o.integer("pollTimeoutMs", o.integer("kafkaConsumer.pollTimeoutMs", 120_000, lo=1), lo=1),
            request_timeout_ms=o.integer("requestTimeoutMs", 30_000, lo=100),
            group_id=o.get("groupId", "kafka.group.id"),
            read_replica=read_replica,
            credentials=Credentials.parse(o, o.bootstrap()),
        )


def _parse_assign(text: str) -> tuple[TP, ...]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise bad("assign", f'{text!r} is not JSON like {{"topic": [0, 1]}}') from None
    if not isinstance(doc, dict) or not all(isinstance(v, list) for v in doc.values()):
        raise bad("assign", 'expected {"topic": [0, 1]}')
    try:
        return tuple(sorted({(str(t), int(p)) for t, ps in doc.items() for p in ps}))
    except (TypeError, ValueError):
        raise bad("assign", "partitions must be integers") from None


# ---- writer -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterOptions:
    bootstrap: str
    topic: str | None
    write_id: str | None
    transaction_timeout_ms: int
    batch_bytes: int
    commit_timeout_ms: int
    request_timeout_ms: int
    test_fail_task: str | None = None
    test_handoff_commit: str | None = None
    credentials: Credentials = NO_CREDENTIALS

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, streaming: bool) -> WriterOptions:
        o = Options(raw)
        id_names = ("sinkId", "transactionalId") if streaming else ("writeId", "transactionalId")
        return cls(
            bootstrap=o.bootstrap(),
            topic=o.get("topic"),
            write_id=o.identifier(*id_names),
            transaction_timeout_ms=o.integer("transactionTimeoutMs", 300_000, lo=1000, hi=2**31 - 1),
            batch_bytes=o.integer("batchBytes", 512 << 10, lo=1024, hi=64 << 20),
            commit_timeout_ms=o.integer("commitTimeoutMs", 120_000, lo=1000),
            request_timeout_ms=o.integer("requestTimeoutMs", 30_000, lo=100),
            test_fail_task=o.get("_test.failTask"),
            test_handoff_commit=o.get("_test.handoffCommit"),
            credentials=Credentials.parse(o, o.bootstrap()),
        )
