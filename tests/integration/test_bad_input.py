"""Hostile input against every HTTP route of a real 3-node cluster.

API.md: "A malformed request never causes a 500, never changes state, and
never stops the node. Unknown routes and wrong methods also answer with a
JSON ``error_code``."

Every request here is malformed or refers to something that does not exist.
For each one the answer must be a 4xx whose JSON body carries an
``error_code`` that is a real ``ErrorCode`` name and a boolean
``retriable``. Around every barrage the topic list and every partition's
offsets, as each of the three nodes reports them, must be unchanged, and all
three nodes must still answer ``/livez`` and ``/readyz`` with 200.

One module-scoped cluster (small ``max_request_bytes``) serves every test.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import struct
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from clients.protocol import (
    PRODUCE_CONTENT_TYPE,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    encode_batch,
    encode_produce_request,
)
from tests.support.cluster import LocalCluster, http, wait_for

pytestmark = [pytest.mark.integration]

LIMIT = 65_536  # max_request_bytes of every node
TOPIC = "victim"  # exists; every barrage aims at it, none may change it
PARTITIONS = 3
MAX_MESSAGE_BYTES = 4096  # topic config, so "batch too large" fits under LIMIT
SEEDED = 2  # records produced into each partition before the barrages
LEGAL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

HOSTILE_NAMES = [
    "",
    ".",
    "..",
    "a" * 250,
    "\u00fcber",
    "\u0442\u043e\u043f\u0438\u043a",
    "emoji\U0001f600",
    "a/b",
    "../victim",
    "victim/..",
    "a b",
    "a\tb",
    "a\x00b",
    "__internal",
    "__consumer_offsets",
    "victim ",
    " victim",
    "VICTIM\u200b",
    "a%2Fb",
    "a?b",
    "a#b",
    "a\\b",
    "$(rm -rf /)",
    "'; DROP TABLE topics; --",
    "<script>",
]


# ---------------------------------------------------------------------------
# plumbing
# ---------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    content_type: str
    raw: bytes

    @property
    def body(self) -> Any:
        try:
            return json.loads(self.raw)
        except ValueError:
            return None


def send(
    method: str,
    url: str,
    raw: bytes | None = None,
    *,
    content_type: str | None = "application/json",
    headers: dict[str, str] | None = None,
    timeout: float = 15.0,
) -> Reply:
    req = urllib.request.Request(url, data=raw, method=method)
    if raw is not None and content_type is not None:
        req.add_header("Content-Type", content_type)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(resp.status, resp.headers.get("Content-Type", ""), resp.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers.get("Content-Type", ""), exc.read())


def q(name: str) -> str:
    """A path segment: every reserved and non-ASCII character percent-encoded."""
    return urllib.parse.quote(name, safe="")


def jdump(v: Any) -> bytes:
    return json.dumps(v).encode()


@dataclass
class Case:
    name: str
    method: str
    path: str
    raw: bytes | None = None
    content_type: str | None = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    node: int | str = 1  # node id, or "leader" (leader of TOPIC-0)
    status: int | tuple[int, ...] | None = None  # expected status(es); None: any 4xx
    code: str | tuple[str, ...] | None = None  # expected error code(s)


def error_problem(reply: Reply, status: Any = None, code: Any = None) -> str | None:
    """Why ``reply`` breaks the error contract, or None."""
    if not 400 <= reply.status < 500:
        return f"status {reply.status} is not 4xx: {reply.raw[:300]!r}"
    body = reply.body
    if not isinstance(body, dict):
        return f"status {reply.status} with a non-JSON-object body {reply.raw[:200]!r}"
    if "json" not in reply.content_type:
        return f"content type {reply.content_type!r}"
    ec = body.get("error_code")
    if not isinstance(ec, str) or ec not in ErrorCode.__members__:
        return f"error_code {ec!r} is not an ErrorCode name"
    if ErrorCode[ec] in (ErrorCode.NONE, ErrorCode.UNKNOWN_SERVER_ERROR):
        return f"error_code {ec}"
    if not isinstance(body.get("retriable"), bool):
        return f"retriable {body.get('retriable')!r} is not a bool"
    if body["retriable"] is not ErrorCode[ec].retriable:
        return f"retriable {body['retriable']} disagrees with {ec}"
    if ErrorCode[ec].http_status != reply.status and ec != "INVALID_REQUEST":
        # INVALID_REQUEST also answers unknown routes (404) and wrong methods (405).
        return f"status {reply.status} does not match {ec} ({ErrorCode[ec].http_status})"
    if status is not None:
        want = status if isinstance(status, tuple) else (status,)
        if reply.status not in want:
            return f"status {reply.status}, expected {want}: {body}"
    if code is not None:
        want_codes = code if isinstance(code, tuple) else (code,)
        # compare members, so an alias name (INVALID_TOPIC / INVALID_TOPIC_EXCEPTION) matches
        if ErrorCode[ec] not in {ErrorCode[c] for c in want_codes}:
            return f"error_code {ec}, expected {want_codes}: {body}"
    return None


class Env:
    def __init__(self, cluster: LocalCluster) -> None:
        self.c = cluster
        self.sent = 0
        self.counts: dict[str, int] = {}  # test -> hostile requests sent

    def count(self, n: int = 1) -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]
        self.counts[test] = self.counts.get(test, 0) + n
        self.sent += n

    def url(self, node: int | str) -> str:
        if node == "leader":
            leader = self.c.leader(TOPIC, 0)
            assert leader is not None
            return self.c.url(leader)
        assert isinstance(node, int)
        return self.c.url(node)

    def snapshot(self) -> dict[int, Any]:
        """What each node reports: topic names and every partition's offsets."""
        out: dict[int, Any] = {}
        for i in range(1, self.c.n + 1):
            md = self.c.metadata(i)
            out[i] = {
                t["name"]: [
                    (p["partition"], p["replicas"], p["high_watermark"], p["last_stable_offset"], p["log_start_offset"])
                    for p in t["partitions"]
                ]
                for t in md["topics"]
            }
            status, topics = http("GET", self.c.url(i) + "/v1/topics", timeout=5)
            assert status == 200, topics
            assert sorted(t["name"] for t in topics["topics"]) == sorted(out[i]), (topics, out[i])
        return out

    def settled_snapshot(self) -> dict[int, Any]:
        """A snapshot once every node agrees (followers may lag a moment behind the leader)."""

        def agree() -> dict[int, Any]:
            snap = self.snapshot()
            views = list(snap.values())
            return snap if all(v == views[0] for v in views) else {}

        return wait_for(agree, 15, "all nodes to report the same topics and offsets")

    def assert_healthy(self) -> None:
        for i in range(1, self.c.n + 1):
            assert self.c.procs[i].poll() is None, f"node {i} exited:\n{self.c.log_text(i)[-4000:]}"
            for path in ("/livez", "/readyz"):
                r = send("GET", self.c.url(i) + path, timeout=5)
                assert r.status == 200, (i, path, r)

    def run(self, cases: list[Case]) -> list[str]:
        problems = []
        for case in cases:
            try:
                reply = send(
                    case.method,
                    self.url(case.node) + case.path,
                    case.raw,
                    content_type=case.content_type,
                    headers=case.headers,
                )
            except OSError as exc:
                problems.append(f"[{case.name}] {case.method} {case.path[:80]}: transport error {exc!r}")
                continue
            self.count()
            p = error_problem(reply, case.status, case.code)
            if p is not None:
                problems.append(f"[{case.name}] {case.method} {case.path[:80]}: {p}")
        return problems

    def barrage(self, cases: list[Case]) -> None:
        """Send ``cases``; each must be a contract-conforming 4xx and nothing may change."""
        before = self.settled_snapshot()
        problems = self.run(cases)
        self.assert_healthy()
        after = self.settled_snapshot()
        assert not problems, f"{len(problems)} of {len(cases)} requests broke the contract:\n" + "\n".join(problems)
        assert after == before


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    cluster = LocalCluster(Path(tmp_path_factory.mktemp("bad-input")), 3, max_request_bytes=LIMIT)
    try:
        cluster.start()
        for cfg in cluster.configs:
            assert cfg.max_request_bytes == LIMIT
        body = {
            "name": TOPIC,
            "partitions": PARTITIONS,
            "replication_factor": 3,
            "config": {"max.message.bytes": MAX_MESSAGE_BYTES},
        }

        def create() -> bool:
            # right after startup the controller may still be electing (421/503): retry those
            status, res = http("POST", cluster.url(1) + "/v1/topics", body, timeout=10)
            if status in (201, 409):
                return True
            assert status in (421, 503, 504), (status, res)
            return False

        wait_for(create, 30, f"creating {TOPIC}", interval=0.2)
        cluster.wait_leaders(TOPIC, PARTITIONS)
        for p in range(PARTITIONS):
            body = {"records": [{"value": "c2VlZA==", "partition": p} for _ in range(SEEDED)]}
            status, res = http("POST", cluster.url(1) + f"/v1/topics/{TOPIC}/records", body)
            assert status == 200, res
        e = Env(cluster)
        e.settled_snapshot()
        yield e
    finally:
        cluster.close()


# ---------------------------------------------------------------------------
# binary produce builders
# ---------------------------------------------------------------------------


def good_batch(n: int = 1, **kw: Any) -> bytes:
    return encode_batch([Record(value=b"v%d" % i, key=b"k") for i in range(n)], **kw)


def recrc(buf: bytearray | bytes) -> bytes:
    b = bytearray(buf)
    struct.pack_into(">I", b, 1, crc32c.crc32c(bytes(b[5:])))
    return bytes(b)


def patch(batch: bytes, fmt: str, offset: int, value: int, *, fix_crc: bool = True) -> bytes:
    b = bytearray(batch)
    struct.pack_into(fmt, b, offset, value)
    return recrc(b) if fix_crc else bytes(b)


def produce_req(batch: bytes, topic: str = TOPIC, partition: int = 0, **kw: Any) -> bytes:
    return encode_produce_request(ProduceRequest((ProducePartition(topic, partition, batch),), **kw))


def raw_produce(
    *,
    magic: bytes = b"TXP1",
    timeout: int = 1000,
    acks: int = -1,
    tid: bytes | None = None,
    count: int | None = None,
    parts: list[tuple[bytes, int, bytes]] | None = None,
    tlen: int | None = None,
    topic_len: int | None = None,
    blen: int | None = None,
) -> bytes:
    """Hand-framed binary produce request, with every length open to lies."""
    out = [struct.pack(">4siih", magic, timeout, acks, (-1 if tid is None else len(tid)) if tlen is None else tlen)]
    if tid is not None:
        out.append(tid)
    parts = parts if parts is not None else [(TOPIC.encode(), 0, good_batch())]
    out.append(struct.pack(">i", len(parts) if count is None else count))
    for topic, partition, batch in parts:
        out.append(struct.pack(">h", len(topic) if topic_len is None else topic_len))
        out.append(topic)
        out.append(struct.pack(">ii", partition, len(batch) if blen is None else blen))
        out.append(batch)
    return b"".join(out)


def binary_cases() -> list[Case]:
    from clients.protocol import BATCH_HEADER

    rec0 = BATCH_HEADER.size
    gb = good_batch()
    rng = random.Random(1234)
    corrupt = bytearray(gb)
    corrupt[-1] ^= 0xFF
    framing: list[tuple[str, bytes, str | None]] = [
        ("batch truncated header", gb[:20], "CORRUPT_MESSAGE"),
        ("batch empty", b"", "CORRUPT_MESSAGE"),
        ("batch truncated records", recrc(gb[:-3]), "CORRUPT_MESSAGE"),
        ("batch wrong magic", patch(gb, ">B", 0, 1), "CORRUPT_MESSAGE"),
        ("batch magic 0xff", patch(gb, ">B", 0, 0xFF), "CORRUPT_MESSAGE"),
        ("batch crc corrupted payload", bytes(corrupt), "CORRUPT_MESSAGE"),
        ("batch crc field wrong", patch(gb, ">I", 1, 0xDEADBEEF, fix_crc=False), "CORRUPT_MESSAGE"),
        ("batch trailing bytes", recrc(gb + b"\x00" * 7), "CORRUPT_MESSAGE"),
        ("batch garbage", bytes(rng.getrandbits(8) for _ in range(200)), "CORRUPT_MESSAGE"),
        ("batch unknown attribute bits", patch(gb, ">B", 5, 0x04), "CORRUPT_MESSAGE"),
        ("batch attribute bits 0xff", patch(gb, ">B", 5, 0xFF), "CORRUPT_MESSAGE"),
        ("batch control flag", good_batch(control=True), "INVALID_REQUEST"),
        (
            "batch control+txn flag",
            good_batch(control=True, transactional=True, producer_id=7, producer_epoch=0, base_sequence=0),
            "INVALID_REQUEST",
        ),
        ("batch transactional", good_batch(transactional=True, producer_id=7, producer_epoch=0, base_sequence=0), None),
        ("batch transactional no pid", good_batch(transactional=True), None),
        ("batch producer id -2", good_batch(producer_id=-2), "INVALID_REQUEST"),
        ("batch producer id min", good_batch(producer_id=-(2**63)), "INVALID_REQUEST"),
        ("batch idempotent epoch -1", good_batch(producer_id=77, producer_epoch=-1, base_sequence=0), None),
        ("batch idempotent seq -1", good_batch(producer_id=77, producer_epoch=0, base_sequence=-1), None),
        (
            "batch idempotent new pid seq 5",
            good_batch(producer_id=987_654, producer_epoch=0, base_sequence=5),
            "OUT_OF_ORDER_SEQUENCE_NUMBER",
        ),
    ]
    # header field offsets: magic 0, crc 1, attrs 5, pid 6, epoch 14, seq 16, count 20, first_ts 24, max_ts 32
    framing += [
        ("batch record_count 0", patch(gb, ">i", 20, 0), "CORRUPT_MESSAGE"),
        ("batch record_count -1", patch(gb, ">i", 20, -1), "CORRUPT_MESSAGE"),
        ("batch record_count lies high", patch(gb, ">i", 20, 2), "CORRUPT_MESSAGE"),
        ("batch record_count huge", patch(gb, ">i", 20, 2**31 - 1), "CORRUPT_MESSAGE"),
        ("batch record_count lies low", patch(good_batch(3), ">i", 20, 2), "CORRUPT_MESSAGE"),
        ("record key_len -5", patch(gb, ">i", rec0 + 8, -5), "CORRUPT_MESSAGE"),
        ("record key_len huge", patch(gb, ">i", rec0 + 8, 2**31 - 1), "CORRUPT_MESSAGE"),
        ("record key_len past end", patch(gb, ">i", rec0 + 8, 50), "CORRUPT_MESSAGE"),
        ("record value_len -7", patch(gb, ">i", rec0 + 8 + 4 + 1, -7), "CORRUPT_MESSAGE"),
        ("record value_len huge", patch(gb, ">i", rec0 + 8 + 4 + 1, 2**31 - 1), "CORRUPT_MESSAGE"),
        ("record header_count -1", patch(gb, ">h", len(gb) - 2, -1), "CORRUPT_MESSAGE"),
        ("record header_count lies", patch(gb, ">h", len(gb) - 2, 3), "CORRUPT_MESSAGE"),
        ("record header_count max", patch(gb, ">h", len(gb) - 2, 32767), "CORRUPT_MESSAGE"),
    ]
    hb = encode_batch([Record(value=b"v", headers=(("hk", b"hv"),))])
    hk_at = len(hb) - (2 + 2 + 4 + 2)  # hklen i16 | "hk" | hvlen i32 | "hv"
    framing += [
        ("header key_len -3", patch(hb, ">h", hk_at, -3), "CORRUPT_MESSAGE"),
        ("header key_len past end", patch(hb, ">h", hk_at, 30000), "CORRUPT_MESSAGE"),
        ("header key not utf-8", recrc(hb[: hk_at + 2] + b"\xff\xfe" + hb[hk_at + 4 :]), "CORRUPT_MESSAGE"),
        ("header value_len -9", patch(hb, ">i", hk_at + 4, -9), "CORRUPT_MESSAGE"),
        ("header value_len huge", patch(hb, ">i", hk_at + 4, 2**31 - 1), "CORRUPT_MESSAGE"),
        (
            "batch over max.message.bytes",
            encode_batch([Record(value=b"x" * (MAX_MESSAGE_BYTES + 10))]),
            "MESSAGE_TOO_LARGE",
        ),
    ]
    cases = [
        Case(f"bin {n}", "POST", "/v1/produce", produce_req(b), PRODUCE_CONTENT_TYPE, node="leader", code=c)
        for n, b, c in framing
    ]
    # request framing
    req_framing: list[tuple[str, bytes, str | None]] = [
        ("empty", b"", "INVALID_REQUEST"),
        ("magic only", b"TXP1", "INVALID_REQUEST"),
        ("truncated head", raw_produce()[:9], "INVALID_REQUEST"),
        ("truncated mid batch", raw_produce()[:-5], "INVALID_REQUEST"),
        ("wrong magic", raw_produce(magic=b"TXP2"), "INVALID_REQUEST"),
        ("json magic", raw_produce(magic=b'{"a"'), "INVALID_REQUEST"),
        ("garbage", bytes(rng.getrandbits(8) for _ in range(500)), "INVALID_REQUEST"),
        ("zeros", b"\x00" * 1000, "INVALID_REQUEST"),
        ("json body", jdump({"partitions": []}), "INVALID_REQUEST"),
        ("tid len -2", raw_produce(tlen=-2), "INVALID_REQUEST"),
        ("tid len past end", raw_produce(tid=b"t", tlen=30000), "INVALID_REQUEST"),
        ("tid not utf-8", raw_produce(tid=b"\xff\xfe"), "INVALID_REQUEST"),
        ("tid set", raw_produce(tid=b"txn-1"), "INVALID_REQUEST"),
        ("partition count -1", raw_produce(count=-1), "INVALID_REQUEST"),
        ("partition count 0", raw_produce(parts=[]), "INVALID_REQUEST"),
        ("partition count huge", raw_produce(count=2**31 - 1), "INVALID_REQUEST"),
        ("partition count lies", raw_produce(count=5), "INVALID_REQUEST"),
        (
            "partition count short",
            raw_produce(count=1, parts=[(b"victim", 0, gb), (b"victim", 1, gb)]),
            "INVALID_REQUEST",
        ),
        ("topic len 0", raw_produce(topic_len=0), "INVALID_REQUEST"),
        ("topic len -1", raw_produce(topic_len=-1), "INVALID_REQUEST"),
        ("topic len past end", raw_produce(topic_len=32000), "INVALID_REQUEST"),
        ("topic not utf-8", raw_produce(parts=[(b"\xc3\x28", 0, gb)]), "INVALID_REQUEST"),
        ("topic surrogate", raw_produce(parts=[(b"\xed\xa0\x80", 0, gb)]), "INVALID_REQUEST"),
        ("batch len -1", raw_produce(blen=-1), "INVALID_REQUEST"),
        ("batch len past end", raw_produce(blen=10_000), "INVALID_REQUEST"),
        ("batch len short", raw_produce(blen=10), "INVALID_REQUEST"),
        ("trailing bytes", raw_produce() + b"\x00", "INVALID_REQUEST"),
        ("acks 5", raw_produce(acks=5), "INVALID_REQUIRED_ACKS"),
        ("acks -7", raw_produce(acks=-7), "INVALID_REQUIRED_ACKS"),
        ("acks min", raw_produce(acks=-(2**31)), "INVALID_REQUIRED_ACKS"),
        ("duplicate partition", raw_produce(parts=[(b"victim", 0, gb), (b"victim", 0, gb)]), "INVALID_REQUEST"),
        ("unknown topic", produce_req(gb, topic="no-such-topic"), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("partition -1", produce_req(gb, partition=-1), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("partition 3", produce_req(gb, partition=PARTITIONS), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("partition max", produce_req(gb, partition=2**31 - 1), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("partition min", produce_req(gb, partition=-(2**31)), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("hostile topic __internal", produce_req(gb, topic="__internal"), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("hostile topic ..", produce_req(gb, topic=".."), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("hostile topic unicode", produce_req(gb, topic="\u00fcber"), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("valid + corrupt", raw_produce(parts=[(b"victim", 0, gb), (b"victim", 1, bytes(corrupt))]), None),
    ]
    cases += [
        Case(f"bin req {n}", "POST", "/v1/produce", b, PRODUCE_CONTENT_TYPE, node="leader", code=c)
        for n, b, c in req_framing
        if n != "valid + corrupt"  # would write partition 0: see test_partial_produce
    ]
    cases.append(
        Case("bin to follower", "POST", "/v1/produce", produce_req(bytes(corrupt)), PRODUCE_CONTENT_TYPE, node=2)
    )
    cases.append(
        Case(
            "bin content-type params",
            "POST",
            "/v1/produce",
            b"TXP1garbage",
            PRODUCE_CONTENT_TYPE + "; charset=utf-8",
            node="leader",
            code="INVALID_REQUEST",
        )
    )
    return cases


# ---------------------------------------------------------------------------
# JSON cases
# ---------------------------------------------------------------------------

B64 = "dmFsdWU="  # "value"


def jp(part: dict[str, Any] | None = None, **body: Any) -> bytes:
    """A JSON produce body with one partition entry (defaults: a valid plain write to TOPIC-0)."""
    p: dict[str, Any] = {"topic": TOPIC, "partition": 0, "records": [{"value": B64}]}
    if part:
        p.update(part)
    out: dict[str, Any] = {"partitions": [p]}
    out.update(body)
    return jdump(out)


def jp_raw(part_json: str) -> bytes:
    return ('{"partitions": [' + part_json + "]}").encode()


def json_produce_cases() -> list[Case]:
    rec = '{"topic": "victim", "partition": 0, "records": [%s]}'
    bodies: list[tuple[str, bytes, str | None]] = [
        ("empty body", b"", "INVALID_REQUEST"),
        ("whitespace", b"   \n", "INVALID_REQUEST"),
        ("not json", b"hello", "INVALID_REQUEST"),
        ("truncated json", jp()[:-3], "INVALID_REQUEST"),
        ("trailing garbage", jp() + b"}", "INVALID_REQUEST"),
        ("two objects", jp() + jp(), "INVALID_REQUEST"),
        ("single quotes", b"{'partitions': []}", "INVALID_REQUEST"),
        ("null", b"null", "INVALID_REQUEST"),
        ("array", b"[]", "INVALID_REQUEST"),
        ("array of body", b"[" + jp() + b"]", "INVALID_REQUEST"),
        ("number", b"42", "INVALID_REQUEST"),
        ("string", b'"partitions"', "INVALID_REQUEST"),
        ("true", b"true", "INVALID_REQUEST"),
        ("invalid utf-8", b'{"partitions": "\xff\xfe"}', "INVALID_REQUEST"),
        ("utf-16", jp().decode().encode("utf-16"), "INVALID_REQUEST"),
        ("bom + valid partial", b"\xef\xbb\xbf{}", "INVALID_REQUEST"),
        ("nul bytes", b"\x00" * 100, "INVALID_REQUEST"),
        ("deep arrays", b"[" * 60_000, "INVALID_REQUEST"),
        ("deep arrays closed", b"[" * 30_000 + b"]" * 30_000, "INVALID_REQUEST"),
        ("deep objects", b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "INVALID_REQUEST"),
        ("deep in partitions", b'{"partitions": [' + b"[" * 20_000 + b"]" * 20_000 + b"]}", "INVALID_REQUEST"),
        ("NaN", b'{"partitions": [], "timeout_ms": NaN}', "INVALID_REQUEST"),
        ("Infinity", b'{"partitions": [], "timeout_ms": Infinity}', "INVALID_REQUEST"),
        ("-Infinity", b'{"partitions": [], "timeout_ms": -Infinity}', "INVALID_REQUEST"),
        (
            "1e400 partition",
            jp_raw('{"topic": "victim", "partition": 1e400, "records": [{"value": null}]}'),
            "INVALID_REQUEST",
        ),
        (
            "NaN partition",
            jp_raw('{"topic": "victim", "partition": NaN, "records": [{"value": null}]}'),
            "INVALID_REQUEST",
        ),
        ("huge int literal", ('{"partitions": [], "timeout_ms": ' + "9" * 5000 + "}").encode(), "INVALID_REQUEST"),
        ("no partitions", jdump({}), "INVALID_REQUEST"),
        ("partitions null", jdump({"partitions": None}), "INVALID_REQUEST"),
        ("partitions object", jdump({"partitions": {"topic": TOPIC}}), "INVALID_REQUEST"),
        ("partitions string", jdump({"partitions": "victim"}), "INVALID_REQUEST"),
        ("partitions empty", jdump({"partitions": []}), "INVALID_REQUEST"),
        ("partitions of ints", jdump({"partitions": [1, 2]}), "INVALID_REQUEST"),
        ("partitions of null", jdump({"partitions": [None]}), "INVALID_REQUEST"),
        ("partitions too many", jdump({"partitions": [{}] * 10_001}), "INVALID_REQUEST"),
        ("topic missing", jp({"topic": None}), "INVALID_REQUEST"),
        ("topic int", jp({"topic": 5}), "INVALID_REQUEST"),
        ("topic list", jp({"topic": [TOPIC]}), "INVALID_REQUEST"),
        ("topic too long", jp({"topic": "a" * 250}), "INVALID_REQUEST"),
        ("topic lone surrogate", jp_raw('{"topic": "\\ud800", "partition": 0, "records": [{"value": null}]}'), None),
        ("partition missing", jp({"partition": None}), "INVALID_REQUEST"),
        ("partition -1", jp({"partition": -1}), "INVALID_REQUEST"),
        ("partition 2**31", jp({"partition": 2**31}), "INVALID_REQUEST"),
        ("partition 2**70", jp({"partition": 2**70}), "INVALID_REQUEST"),
        ("partition -2**70", jp({"partition": -(2**70)}), "INVALID_REQUEST"),
        ("partition float", jp({"partition": 0.0}), "INVALID_REQUEST"),
        ("partition 1.5", jp({"partition": 1.5}), "INVALID_REQUEST"),
        ("partition bool", jp({"partition": False}), "INVALID_REQUEST"),
        ("partition string", jp({"partition": "0"}), "INVALID_REQUEST"),
        ("partition 3", jp({"partition": PARTITIONS}), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("unknown topic", jp({"topic": "no-such-topic"}), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("producer_id 2**70", jp({"producer_id": 2**70, "producer_epoch": 0, "base_sequence": 0}), "INVALID_REQUEST"),
        ("producer_id -2", jp({"producer_id": -2}), "INVALID_REQUEST"),
        ("producer_id bool", jp({"producer_id": True, "producer_epoch": 0, "base_sequence": 0}), "INVALID_REQUEST"),
        ("producer_id string", jp({"producer_id": "1", "producer_epoch": 0, "base_sequence": 0}), "INVALID_REQUEST"),
        ("producer_id float", jp({"producer_id": 1.0, "producer_epoch": 0, "base_sequence": 0}), "INVALID_REQUEST"),
        ("epoch without pid", jp({"producer_epoch": 0}), "INVALID_REQUEST"),
        ("sequence without pid", jp({"base_sequence": 0}), "INVALID_REQUEST"),
        ("pid without epoch", jp({"producer_id": 5, "base_sequence": 0}), "INVALID_REQUEST"),
        ("pid without seq", jp({"producer_id": 5, "producer_epoch": 0}), "INVALID_REQUEST"),
        ("epoch 2**15", jp({"producer_id": 5, "producer_epoch": 2**15, "base_sequence": 0}), "INVALID_REQUEST"),
        ("seq 2**31", jp({"producer_id": 5, "producer_epoch": 0, "base_sequence": 2**31}), "INVALID_REQUEST"),
        (
            "new pid seq 9",
            jp({"producer_id": 987_655, "producer_epoch": 0, "base_sequence": 9}),
            "OUT_OF_ORDER_SEQUENCE_NUMBER",
        ),
        ("records missing", jp({"records": None}), "INVALID_REQUEST"),
        ("records empty", jp({"records": []}), "INVALID_REQUEST"),
        ("records object", jp({"records": {"value": B64}}), "INVALID_REQUEST"),
        ("records of strings", jp({"records": [B64]}), "INVALID_REQUEST"),
        ("records of null", jp({"records": [None]}), "INVALID_REQUEST"),
        ("value int", jp({"records": [{"value": 5}]}), "INVALID_REQUEST"),
        ("value list", jp({"records": [{"value": [1, 2]}]}), "INVALID_REQUEST"),
        ("value bool", jp({"records": [{"value": True}]}), "INVALID_REQUEST"),
        ("value bad base64 chars", jp({"records": [{"value": "!!!!"}]}), "INVALID_REQUEST"),
        ("value bad base64 padding", jp({"records": [{"value": "abc"}]}), "INVALID_REQUEST"),
        ("value base64 whitespace", jp({"records": [{"value": "dm Fs dWU="}]}), "INVALID_REQUEST"),
        ("value base64 newline", jp({"records": [{"value": "dmFs\ndWU="}]}), "INVALID_REQUEST"),
        ("value base64 urlsafe", jp({"records": [{"value": "-_-_"}]}), "INVALID_REQUEST"),
        ("value base64 unicode", jp({"records": [{"value": "d\u00fc=="}]}), "INVALID_REQUEST"),
        ("value base64 excess padding", jp({"records": [{"value": "dmFsdWU===="}]}), "INVALID_REQUEST"),
        ("key bad base64", jp({"records": [{"key": "%%%", "value": B64}]}), "INVALID_REQUEST"),
        ("key object", jp({"records": [{"key": {}, "value": B64}]}), "INVALID_REQUEST"),
        ("headers object", jp({"records": [{"value": B64, "headers": {"k": B64}}]}), "INVALID_REQUEST"),
        ("headers string", jp({"records": [{"value": B64, "headers": "k"}]}), "INVALID_REQUEST"),
        ("header not object", jp({"records": [{"value": B64, "headers": [["k", B64]]}]}), "INVALID_REQUEST"),
        ("header key missing", jp({"records": [{"value": B64, "headers": [{"value": B64}]}]}), "INVALID_REQUEST"),
        ("header key int", jp({"records": [{"value": B64, "headers": [{"key": 1, "value": B64}]}]}), "INVALID_REQUEST"),
        (
            "header value bad b64",
            jp({"records": [{"value": B64, "headers": [{"key": "k", "value": "*"}]}]}),
            "INVALID_REQUEST",
        ),
        (
            "header value int",
            jp({"records": [{"value": B64, "headers": [{"key": "k", "value": 1}]}]}),
            "INVALID_REQUEST",
        ),
        (
            "header key lone surrogate",
            jp_raw(rec % '{"value": null, "headers": [{"key": "\\udc80", "value": null}]}'),
            "INVALID_REQUEST",
        ),
        (
            "header key surrogate pair half",
            jp_raw(rec % '{"value": null, "headers": [{"key": "a\\ud83d", "value": null}]}'),
            "INVALID_REQUEST",
        ),
        ("headers of null", jp({"records": [{"value": None, "headers": [None, None]}]}), "INVALID_REQUEST"),
        ("format hex", jp(format="hex"), "INVALID_REQUEST"),
        ("format int", jp(format=1), "INVALID_REQUEST"),
        ("format list", jp(format=["string"]), "INVALID_REQUEST"),
        (
            "format string surrogate value",
            b'{"format": "string", "partitions": [' + (rec % '{"value": "\\ud800x"}').encode() + b"]}",
            "INVALID_REQUEST",
        ),
        (
            "format string surrogate key",
            b'{"format": "string", "partitions": [' + (rec % '{"key": "\\udfff", "value": "v"}').encode() + b"]}",
            "INVALID_REQUEST",
        ),
        (
            "format string surrogate header",
            b'{"format": "string", "partitions": ['
            + (rec % '{"value": "v", "headers": [{"key": "k", "value": "\\ud800"}]}').encode()
            + b"]}",
            "INVALID_REQUEST",
        ),
        ("timestamp -2", jp({"records": [{"value": B64, "timestamp": -2}]}), "INVALID_REQUEST"),
        ("timestamp 2**63", jp({"records": [{"value": B64, "timestamp": 2**63}]}), "INVALID_REQUEST"),
        ("timestamp string", jp({"records": [{"value": B64, "timestamp": "now"}]}), "INVALID_REQUEST"),
        ("timestamp float", jp({"records": [{"value": B64, "timestamp": 1.5}]}), "INVALID_REQUEST"),
        ("timestamp 1e400", jp_raw(rec % '{"value": null, "timestamp": 1e400}'), "INVALID_REQUEST"),
        ("timestamp -1e400", jp_raw(rec % '{"value": null, "timestamp": -1e400}'), "INVALID_REQUEST"),
        ("acks 1", jp(acks=1), "INVALID_REQUIRED_ACKS"),
        ("acks 2", jp(acks=2), "INVALID_REQUIRED_ACKS"),
        ("acks '1'", jp(acks="1"), "INVALID_REQUIRED_ACKS"),
        ("acks ALL", jp(acks="ALL"), "INVALID_REQUIRED_ACKS"),
        ("acks true", jp(acks=True), "INVALID_REQUIRED_ACKS"),
        ("acks false", jp(acks=False), "INVALID_REQUIRED_ACKS"),
        ("acks 0.0", jp(acks=0.0), "INVALID_REQUIRED_ACKS"),
        ("acks -1.0", jp(acks=-1.0), "INVALID_REQUIRED_ACKS"),
        ("acks list", jp(acks=["all"]), "INVALID_REQUIRED_ACKS"),
        ("acks 2**70", jp(acks=2**70), "INVALID_REQUIRED_ACKS"),
        ("timeout 0", jp(timeout_ms=0), "INVALID_REQUEST"),
        ("timeout -1", jp(timeout_ms=-1), "INVALID_REQUEST"),
        ("timeout 2**31", jp(timeout_ms=2**31), "INVALID_REQUEST"),
        ("timeout string", jp(timeout_ms="1000"), "INVALID_REQUEST"),
        ("timeout bool", jp(timeout_ms=True), "INVALID_REQUEST"),
        ("tid int", jp(transactional_id=5), "INVALID_REQUEST"),
        ("tid list", jp(transactional_id=["t"]), "INVALID_REQUEST"),
        ("tid too long", jp(transactional_id="t" * 40_000), "INVALID_REQUEST"),
        ("tid set", jp(transactional_id="txn"), "INVALID_REQUEST"),
        ("duplicate partition", jdump({"partitions": [json.loads(jp())["partitions"][0]] * 2}), "INVALID_REQUEST"),
        (
            "valid then invalid entry",
            jdump(
                {
                    "partitions": [
                        json.loads(jp())["partitions"][0],
                        {"topic": TOPIC, "partition": 1, "records": [{}]},
                        {"topic": TOPIC, "partition": 2, "records": [{"value": "*"}]},
                    ]
                }
            ),
            "INVALID_REQUEST",
        ),
        (
            "valid then unknown partition entry",
            jdump({"partitions": [json.loads(jp())["partitions"][0], {"topic": TOPIC, "partition": 1, "records": 5}]}),
            "INVALID_REQUEST",
        ),
        (
            "batch over max.message.bytes",
            jp({"records": [{"value": "eHh4" * (MAX_MESSAGE_BYTES // 3 + 10)}]}),
            "MESSAGE_TOO_LARGE",
        ),
    ]
    cases = [Case(f"json {n}", "POST", "/v1/produce", b, node="leader", code=c) for n, b, c in bodies]
    # wrong content types: a garbage body is still garbage whatever it claims to be
    for ct in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "application/json; charset=latin-1",
        "",
        None,
    ):
        cases.append(
            Case(
                f"json ctype {ct!r}",
                "POST",
                "/v1/produce",
                b"partitions=1&topic=victim",
                content_type=ct,
                node="leader",
                code="INVALID_REQUEST",
            )
        )
    cases.append(
        Case(
            "json body as binary ctype",
            "POST",
            "/v1/produce",
            jp(),
            PRODUCE_CONTENT_TYPE,
            node="leader",
            code="INVALID_REQUEST",
        )
    )
    cases.append(
        Case(
            "json to follower", "POST", "/v1/produce", jp({"records": [{"value": "!"}]}), node=2, code="INVALID_REQUEST"
        )
    )
    return cases


def topic_create_cases() -> list[Case]:
    def body(**kw: Any) -> bytes:
        b: dict[str, Any] = {"name": "fresh-topic", "partitions": 1, "replication_factor": 1}
        b.update(kw)
        return jdump({k: v for k, v in b.items() if v is not ...})

    items: list[tuple[str, bytes, str | None]] = []
    for n in HOSTILE_NAMES:
        items.append((f"name {n[:20]!r}", body(name=n), "INVALID_TOPIC_EXCEPTION"))
    items += [
        ("name missing", body(name=...), "INVALID_TOPIC_EXCEPTION"),
        ("name null", body(name=None), "INVALID_TOPIC_EXCEPTION"),
        ("name int", body(name=5), "INVALID_TOPIC_EXCEPTION"),
        ("name list", body(name=["a"]), "INVALID_TOPIC_EXCEPTION"),
        ("name object", body(name={"a": 1}), "INVALID_TOPIC_EXCEPTION"),
        ("name bool", body(name=True), "INVALID_TOPIC_EXCEPTION"),
        ("name 10k chars", body(name="a" * 10_000), "INVALID_TOPIC_EXCEPTION"),
        ("name lone surrogate", b'{"name": "\\ud800", "partitions": 1}', "INVALID_REQUEST"),
        ("partitions 0", body(partitions=0), "INVALID_PARTITIONS"),
        ("partitions -1", body(partitions=-1), "INVALID_PARTITIONS"),
        ("partitions 2**70", body(partitions=2**70), "INVALID_PARTITIONS"),
        ("partitions -2**70", body(partitions=-(2**70)), "INVALID_PARTITIONS"),
        ("partitions 10001", body(partitions=10_001), "INVALID_PARTITIONS"),
        ("partitions 1.0", body(partitions=1.0), "INVALID_PARTITIONS"),
        ("partitions 1.5", body(partitions=1.5), "INVALID_PARTITIONS"),
        ("partitions string", body(partitions="1"), "INVALID_PARTITIONS"),
        ("partitions true", body(partitions=True), "INVALID_PARTITIONS"),
        ("partitions null", body(partitions=None), "INVALID_PARTITIONS"),
        ("partitions list", body(partitions=[1]), "INVALID_PARTITIONS"),
        ("partitions 1e400", b'{"name": "fresh-topic", "partitions": 1e400}', "INVALID_REQUEST"),
        ("partitions -1e999", b'{"name": "fresh-topic", "partitions": -1e999}', "INVALID_REQUEST"),
        ("partitions NaN", b'{"name": "fresh-topic", "partitions": NaN}', "INVALID_REQUEST"),
        ("rf 0", body(replication_factor=0), "INVALID_REPLICATION_FACTOR"),
        ("rf -1", body(replication_factor=-1), "INVALID_REPLICATION_FACTOR"),
        ("rf 4", body(replication_factor=4), "INVALID_REPLICATION_FACTOR"),
        ("rf 2**70", body(replication_factor=2**70), "INVALID_REPLICATION_FACTOR"),
        ("rf 1.0", body(replication_factor=1.0), "INVALID_REPLICATION_FACTOR"),
        ("rf string", body(replication_factor="3"), "INVALID_REPLICATION_FACTOR"),
        ("rf true", body(replication_factor=True), "INVALID_REPLICATION_FACTOR"),
        ("rf null", body(replication_factor=None), "INVALID_REPLICATION_FACTOR"),
        ("config list", body(config=[]), "INVALID_CONFIG"),
        ("config string", body(config="retention.ms=1"), "INVALID_CONFIG"),
        ("config unknown key", body(config={"compression.type": "zstd"}), "INVALID_CONFIG"),
        ("config bad int", body(config={"retention.ms": "soon"}), "INVALID_CONFIG"),
        ("config bool", body(config={"retention.ms": True}), "INVALID_CONFIG"),
        ("config float", body(config={"retention.ms": 1.5}), "INVALID_CONFIG"),
        ("config huge", body(config={"retention.ms": 2**70}), "INVALID_CONFIG"),
        ("config huge string", body(config={"retention.ms": "9" * 5000}), "INVALID_CONFIG"),
        ("config below min", body(config={"max.message.bytes": 1}), "INVALID_CONFIG"),
        ("config -2", body(config={"retention.bytes": -2}), "INVALID_CONFIG"),
        ("config null value", body(config={"retention.ms": None}), "INVALID_CONFIG"),
        ("config object value", body(config={"retention.ms": {}}), "INVALID_CONFIG"),
        ("config compact", body(config={"cleanup.policy": "compact"}), "INVALID_CONFIG"),
        ("config 1e400", b'{"name": "fresh-topic", "config": {"retention.ms": 1e400}}', "INVALID_REQUEST"),
        ("config -1e400", b'{"name": "fresh-topic", "config": {"retention.bytes": -1e400}}', "INVALID_REQUEST"),
        ("config Infinity", b'{"name": "fresh-topic", "config": {"retention.ms": Infinity}}', "INVALID_REQUEST"),
        ("duplicate", body(name=TOPIC), "TOPIC_ALREADY_EXISTS"),
        ("duplicate other params", body(name=TOPIC, partitions=7, replication_factor=2), "TOPIC_ALREADY_EXISTS"),
        ("empty body", b"", "INVALID_REQUEST"),
        ("not json", b"name=fresh", "INVALID_REQUEST"),
        ("array", b'["fresh-topic"]', "INVALID_REQUEST"),
        ("null", b"null", "INVALID_REQUEST"),
        ("string", b'"fresh-topic"', "INVALID_REQUEST"),
        ("deep", b"[" * 50_000, "INVALID_REQUEST"),
        ("invalid utf-8", b'{"name": "\xff"}', "INVALID_REQUEST"),
    ]
    cases = []
    for i, (n, b, c) in enumerate(items):
        # alternate the node: followers validate locally or forward to the controller
        cases.append(Case(f"create {n}", "POST", "/v1/topics", b, node=1 + i % 3, code=c))
    cases.append(
        Case("create binary ctype", "POST", "/v1/topics", raw_produce(), PRODUCE_CONTENT_TYPE, code="INVALID_REQUEST")
    )
    return cases


def path_cases() -> list[Case]:
    """describe/delete/records/fetch with hostile topic names and parameters."""
    cases: list[Case] = []
    names = [*HOSTILE_NAMES[1:], "no-such-topic", "victim2", "Victim"]
    for i, n in enumerate(names):
        seg = q(n)
        node = 1 + i % 3
        cases += [
            Case(f"describe {n[:20]!r}", "GET", f"/v1/topics/{seg}", node=node, status=404),
            Case(f"delete {n[:20]!r}", "DELETE", f"/v1/topics/{seg}", node=node, status=404),
            Case(
                f"records {n[:20]!r}",
                "POST",
                f"/v1/topics/{seg}/records",
                jdump({"records": [{"value": B64}]}),
                node=node,
                status=404,
            ),
            Case(f"fetch {n[:20]!r}", "GET", f"/v1/topics/{seg}/partitions/0/records?offset=0", node=node, status=404),
        ]
    base = f"/v1/topics/{TOPIC}/records"
    rec_bodies: list[tuple[str, bytes, str | None]] = [
        ("empty", b"", "INVALID_REQUEST"),
        ("not json", b"{", "INVALID_REQUEST"),
        ("array", b"[]", "INVALID_REQUEST"),
        ("records missing", jdump({}), "INVALID_REQUEST"),
        ("records empty", jdump({"records": []}), "INVALID_REQUEST"),
        ("records string", jdump({"records": "x"}), "INVALID_REQUEST"),
        ("record int", jdump({"records": [1]}), "INVALID_REQUEST"),
        ("record null", jdump({"records": [None]}), "INVALID_REQUEST"),
        ("partition -1", jdump({"records": [{"value": B64, "partition": -1}]}), "INVALID_REQUEST"),
        ("partition 3", jdump({"records": [{"value": B64, "partition": PARTITIONS}]}), "UNKNOWN_TOPIC_OR_PARTITION"),
        ("partition 2**70", jdump({"records": [{"value": B64, "partition": 2**70}]}), "INVALID_REQUEST"),
        ("partition string", jdump({"records": [{"value": B64, "partition": "0"}]}), "INVALID_REQUEST"),
        ("partition bool", jdump({"records": [{"value": B64, "partition": True}]}), "INVALID_REQUEST"),
        ("partition float", jdump({"records": [{"value": B64, "partition": 0.0}]}), "INVALID_REQUEST"),
        ("partition 1e400", b'{"records": [{"value": null, "partition": 1e400}]}', "INVALID_REQUEST"),
        ("value bad b64", jdump({"records": [{"value": "a"}]}), "INVALID_REQUEST"),
        ("key bad b64", jdump({"records": [{"key": "a=b", "value": B64}]}), "INVALID_REQUEST"),
        ("value int", jdump({"records": [{"value": 7}]}), "INVALID_REQUEST"),
        ("format bad", jdump({"format": "utf8", "records": [{"value": "x"}]}), "INVALID_REQUEST"),
        ("format string surrogate", b'{"format": "string", "records": [{"value": "\\udcff"}]}', "INVALID_REQUEST"),
        (
            "format string surrogate key",
            b'{"format": "string", "records": [{"key": "\\ud800", "value": "v"}]}',
            "INVALID_REQUEST",
        ),
        ("header surrogate", b'{"records": [{"value": null, "headers": [{"key": "\\ud800"}]}]}', "INVALID_REQUEST"),
        ("timestamp -5", jdump({"records": [{"value": B64, "timestamp": -5}]}), "INVALID_REQUEST"),
        ("timestamp NaN", b'{"records": [{"value": null, "timestamp": NaN}]}', "INVALID_REQUEST"),
        (
            "valid then invalid",
            jdump({"records": [{"value": B64, "partition": 0}, {"value": "!", "partition": 1}]}),
            "INVALID_REQUEST",
        ),
        (
            "valid then bad partition",
            jdump({"records": [{"value": B64, "partition": 0}, {"partition": 9}]}),
            "UNKNOWN_TOPIC_OR_PARTITION",
        ),
        (
            "record too large",
            jdump({"records": [{"value": "eHh4" * (MAX_MESSAGE_BYTES // 3 + 10)}]}),
            "RECORD_TOO_LARGE",
        ),
        ("batch too large", jdump({"records": [{"value": "eHh4" * 300, "partition": 1}] * 5}), "MESSAGE_TOO_LARGE"),
    ]
    for i, (n, b, c) in enumerate(rec_bodies):
        cases.append(Case(f"records {n}", "POST", base, b, node=1 + i % 3, code=c))
    fetch = f"/v1/topics/{TOPIC}/partitions"
    params: list[tuple[str, str, str | None]] = [
        ("no offset", "", "INVALID_REQUEST"),
        ("offset empty", "offset=", "INVALID_REQUEST"),
        ("offset -1", "offset=-1", "INVALID_REQUEST"),
        ("offset abc", "offset=abc", "INVALID_REQUEST"),
        ("offset 1.5", "offset=1.5", "INVALID_REQUEST"),
        ("offset 1e3", "offset=1e3", "INVALID_REQUEST"),
        ("offset hex", "offset=0x10", "INVALID_REQUEST"),
        ("offset plus", "offset=%2B1", "INVALID_REQUEST"),
        ("offset spaces", "offset=%201%20", "INVALID_REQUEST"),
        ("offset underscore", "offset=1_0", "INVALID_REQUEST"),
        ("offset arabic digit", "offset=" + q("\u0661"), "INVALID_REQUEST"),
        ("offset fullwidth digit", "offset=" + q("\uff11"), "INVALID_REQUEST"),
        ("offset 2**63", f"offset={2**63}", "INVALID_REQUEST"),
        ("offset 2**70", f"offset={2**70}", "INVALID_REQUEST"),
        ("offset 5000 digits", "offset=" + "9" * 5000, "INVALID_REQUEST"),
        ("offset NaN", "offset=NaN", "INVALID_REQUEST"),
        # a follower read: every node holds a replica and answers itself (a leader read: 421 at the others)
        ("offset beyond hw", f"offset={SEEDED + 1}&read_replica=any", "OFFSET_OUT_OF_RANGE"),
        ("offset far beyond hw", f"offset={2**63 - 1}&read_replica=any", "OFFSET_OUT_OF_RANGE"),
        (
            "offset beyond hw long poll",
            f"offset={SEEDED + 5}&max_wait_ms=10000&read_replica=any",
            "OFFSET_OUT_OF_RANGE",
        ),
        ("max_bytes 0", "offset=0&max_bytes=0", "INVALID_REQUEST"),
        ("max_bytes -1", "offset=0&max_bytes=-1", "INVALID_REQUEST"),
        ("max_bytes 2**70", f"offset=0&max_bytes={2**70}", "INVALID_REQUEST"),
        ("max_bytes x", "offset=0&max_bytes=x", "INVALID_REQUEST"),
        ("max_wait -1", "offset=0&max_wait_ms=-1", "INVALID_REQUEST"),
        ("max_wait 2**31", f"offset=0&max_wait_ms={2**31}", "INVALID_REQUEST"),
        ("max_wait float", "offset=0&max_wait_ms=0.5", "INVALID_REQUEST"),
        ("isolation bad", "offset=0&isolation=serializable", "INVALID_REQUEST"),
        ("isolation upper", "offset=0&isolation=READ_COMMITTED", "INVALID_REQUEST"),
        ("isolation empty", "offset=0&isolation=", "INVALID_REQUEST"),
        ("format xml", "offset=0&format=xml", "INVALID_REQUEST"),
        ("format empty", "offset=0&format=", "INVALID_REQUEST"),
        ("format unicode", "offset=0&format=" + q("b\u00e4tches"), "INVALID_REQUEST"),
        ("format + bad offset", "offset=-5&format=batches", "INVALID_REQUEST"),
        ("binary + beyond hw", f"offset={SEEDED + 3}&format=binary&read_replica=any", "OFFSET_OUT_OF_RANGE"),
        ("read_replica follower", "offset=0&read_replica=follower", "INVALID_REQUEST"),
        ("read_replica empty", "offset=0&read_replica=", "INVALID_REQUEST"),
        ("read_replica upper", "offset=0&read_replica=ANY", "INVALID_REQUEST"),
        ("read_replica + beyond hw", f"offset={SEEDED + 1}&read_replica=x", "INVALID_REQUEST"),
    ]
    for i, (n, qs, c) in enumerate(params):
        cases.append(Case(f"fetch {n}", "GET", f"{fetch}/0/records?{qs}", node=1 + i % 3, code=c))
    for i, p in enumerate(
        [
            "-1",
            "3",
            "abc",
            "1.0",
            "0x1",
            "%2B0",
            "%200",
            "1_0",
            q("\u0661"),
            str(2**31),
            str(2**70),
            "9" * 5000,
            "",
            "%00",
        ]
    ):
        cases.append(Case(f"fetch partition {p[:12]!r}", "GET", f"{fetch}/{p}/records?offset=0", node=1 + i % 3))
    return cases


def producer_init_cases() -> list[Case]:
    items: list[tuple[str, bytes, str | None]] = [
        ("not json", b"{", "INVALID_REQUEST"),
        ("array", b"[]", "INVALID_REQUEST"),
        ("string", b'"x"', "INVALID_REQUEST"),
        ("null", b"null", "INVALID_REQUEST"),
        ("tid int", jdump({"transactional_id": 5}), "INVALID_REQUEST"),
        ("tid list", jdump({"transactional_id": ["a"]}), "INVALID_REQUEST"),
        ("tid bool", jdump({"transactional_id": False}), "INVALID_REQUEST"),
        ("tid empty", jdump({"transactional_id": ""}), "INVALID_REQUEST"),
        ("tid too long", jdump({"transactional_id": "t" * 40_000}), "INVALID_REQUEST"),
        ("timeout 0", jdump({"transactional_id": None, "transaction_timeout_ms": 0}), "INVALID_TRANSACTION_TIMEOUT"),
        ("timeout -1", jdump({"transaction_timeout_ms": -1}), "INVALID_TRANSACTION_TIMEOUT"),
        ("timeout 2**31", jdump({"transaction_timeout_ms": 2**31}), "INVALID_TRANSACTION_TIMEOUT"),
        ("timeout 2**70", jdump({"transaction_timeout_ms": 2**70}), "INVALID_TRANSACTION_TIMEOUT"),
        ("timeout string", jdump({"transaction_timeout_ms": "1000"}), "INVALID_REQUEST"),
        ("timeout float", jdump({"transaction_timeout_ms": 1000.0}), "INVALID_REQUEST"),
        ("timeout bool", jdump({"transaction_timeout_ms": True}), "INVALID_REQUEST"),
        ("timeout NaN", b'{"transaction_timeout_ms": NaN}', "INVALID_REQUEST"),
        ("timeout 1e400", b'{"transaction_timeout_ms": 1e400}', "INVALID_REQUEST"),
        ("invalid utf-8", b'{"transactional_id": "\xff"}', "INVALID_REQUEST"),
    ]
    return [
        Case(f"init {n}", "POST", "/v1/producers/init", b, node=1 + i % 3, code=c) for i, (n, b, c) in enumerate(items)
    ]


def route_cases() -> list[Case]:
    routes: list[tuple[str, str, int]] = [
        ("GET", "/", 404),
        ("GET", "/v1", 404),
        ("GET", "/v2/topics", 404),
        ("GET", "/v1/topic", 404),
        ("GET", "/v1/topics/victim/partitions/0", 404),
        ("GET", "/v1/topics/victim/partitions/0/records/extra", 404),
        ("GET", "/v1/topics/victim/partitions//records", 404),
        ("GET", "/" + "a" * 4000, 404),
        ("GET", "/v1/%00", 404),
        ("GET", "/v1/" + q("\u00fc\U0001f600"), 404),
        ("GET", "/v1/topics/a%2Fb/partitions/0/records?offset=0", 404),
        ("POST", "/livez", 405),
        ("POST", "/readyz", 405),
        ("POST", "/v1/metadata", 405),
        ("PUT", "/v1/topics", 405),
        ("DELETE", "/v1/topics", 405),
        ("PATCH", "/v1/topics/victim", 405),
        ("PUT", "/v1/topics/victim", 405),
        ("GET", "/v1/produce", 405),
        ("PUT", "/v1/produce", 405),
        ("DELETE", "/v1/produce", 405),
        ("GET", "/v1/producers/init", 405),
        ("GET", "/v1/topics/victim/records", 405),
        ("POST", "/v1/topics/victim/partitions/0/records", 405),
        ("DELETE", "/v1/topics/victim/partitions/0/records", 405),
        ("OPTIONS", "/v1/produce", 405),
    ]
    cases = [
        Case(f"route {m} {p[:40]}", m, p, b"{}" if m in ("POST", "PUT", "PATCH") else None, node=1 + i % 3, status=s)
        for i, (m, p, s) in enumerate(routes)
    ]
    cases += [
        Case("internal state no auth", "GET", "/v1/internal/state", code="CLUSTER_AUTHORIZATION_FAILED"),
        Case(
            "internal state bad auth",
            "GET",
            "/v1/internal/state",
            headers={"X-Txbroker-Auth": "0" * 64},
            code="CLUSTER_AUTHORIZATION_FAILED",
        ),
        Case(
            "internal state latin-1 auth",
            "GET",
            "/v1/internal/state",
            headers={"X-Txbroker-Auth": "\u00e9" * 64},
            code="CLUSTER_AUTHORIZATION_FAILED",
        ),
        Case(
            "internal pids no auth",
            "POST",
            "/v1/internal/producer-ids",
            jdump({"node_id": 1}),
            code="CLUSTER_AUTHORIZATION_FAILED",
        ),
        Case(
            "internal pids bad auth",
            "POST",
            "/v1/internal/producer-ids",
            jdump({"node_id": 1}),
            headers={"X-Txbroker-Auth": "x"},
            code="CLUSTER_AUTHORIZATION_FAILED",
        ),
        Case(
            "internal pids latin-1 auth",
            "POST",
            "/v1/internal/producer-ids",
            jdump({"node_id": 1}),
            headers={"X-Txbroker-Auth": "\u00ff"},
            node=2,
            code="CLUSTER_AUTHORIZATION_FAILED",
        ),
    ]
    return cases


def oversize_cases() -> list[Case]:
    big = b"x" * (LIMIT + 1)
    big_json = jdump({"partitions": [{"topic": TOPIC, "partition": 0, "records": [{"value": "eHh4" * (LIMIT // 3)}]}]})
    big_records = jdump({"records": [{"value": "eHh4" * (LIMIT // 3)}]})
    big_bin = produce_req(encode_batch([Record(value=b"x" * (LIMIT + 10))]))
    c = "MESSAGE_TOO_LARGE"
    return [
        Case("oversize produce json", "POST", "/v1/produce", big_json, node="leader", status=413, code=c),
        Case("oversize produce garbage", "POST", "/v1/produce", big, node=2, status=413, code=c),
        Case(
            "oversize produce binary",
            "POST",
            "/v1/produce",
            big_bin,
            PRODUCE_CONTENT_TYPE,
            node="leader",
            status=413,
            code=c,
        ),
        Case("oversize produce 4x", "POST", "/v1/produce", b"[" * (4 * LIMIT), node=3, status=413, code=c),
        Case("oversize records", "POST", f"/v1/topics/{TOPIC}/records", big_records, node=1, status=413, code=c),
        Case(
            "oversize create topic",
            "POST",
            "/v1/topics",
            jdump({"name": "big", "pad": "x" * LIMIT}),
            node=2,
            status=413,
            code=c,
        ),
        Case("oversize init", "POST", "/v1/producers/init", big, node=3, status=413, code=c),
    ]


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------


def test_harness_applies_max_request_bytes(env: Env) -> None:
    for p in env.c.paths:
        assert f"max_request_bytes = {LIMIT}" in p.read_text()
    # exactly at the limit is still read (and rejected only for being bad JSON)
    r = send("POST", env.c.url(1) + "/v1/produce", b" " * (LIMIT - 1) + b"x")
    assert error_problem(r, 400, "INVALID_REQUEST") is None, r


def test_api_specific_error_codes(env: Env) -> None:
    """The codes API.md names for topics, offsets and unknown things (nothing changes)."""
    url = env.c.url(2)
    cases = [
        Case(
            "duplicate",
            "POST",
            "/v1/topics",
            jdump({"name": TOPIC, "partitions": 1, "replication_factor": 1}),
            node=2,
            status=409,
            code="TOPIC_ALREADY_EXISTS",
        ),
        Case(
            "rf > nodes",
            "POST",
            "/v1/topics",
            jdump({"name": "rf4", "partitions": 1, "replication_factor": 4}),
            node=3,
            status=400,
            code="INVALID_REPLICATION_FACTOR",
        ),
        Case(
            "partitions 0",
            "POST",
            "/v1/topics",
            jdump({"name": "p0", "partitions": 0, "replication_factor": 1}),
            node=1,
            status=400,
            code="INVALID_PARTITIONS",
        ),
        Case(
            "bad name",
            "POST",
            "/v1/topics",
            jdump({"name": "bad/name", "partitions": 1}),
            node=2,
            status=400,
            code="INVALID_TOPIC_EXCEPTION",
        ),
        Case("unknown describe", "GET", "/v1/topics/nope", node=1, status=404, code="UNKNOWN_TOPIC_OR_PARTITION"),
        Case("unknown delete", "DELETE", "/v1/topics/nope", node=2, status=404, code="UNKNOWN_TOPIC_OR_PARTITION"),
        Case(
            "unknown fetch",
            "GET",
            "/v1/topics/nope/partitions/0/records?offset=0",
            node=3,
            status=404,
            code="UNKNOWN_TOPIC_OR_PARTITION",
        ),
        Case(
            "unknown records",
            "POST",
            "/v1/topics/nope/records",
            jdump({"records": [{"value": B64}]}),
            node=1,
            status=404,
            code="UNKNOWN_TOPIC_OR_PARTITION",
        ),
        Case(
            "beyond hw",
            "GET",
            f"/v1/topics/{TOPIC}/partitions/1/records?offset={SEEDED + 1}&read_replica=any",
            node=3,
            status=400,
            code="OFFSET_OUT_OF_RANGE",
        ),
    ]
    env.barrage(cases)
    # the bad-name answer uses the name API.md lists
    r = send("POST", url + "/v1/topics", jdump({"name": "..", "partitions": 1}))
    assert r.body["error_code"] in ("INVALID_TOPIC", "INVALID_TOPIC_EXCEPTION"), r.body
    # offset == high watermark is not an error: no records
    r = send("GET", url + f"/v1/topics/{TOPIC}/partitions/1/records?offset={SEEDED}&read_replica=any")
    assert r.status == 200 and r.body["records"] == [], r


def test_binary_produce_barrage(env: Env) -> None:
    env.barrage(binary_cases())


def test_json_produce_barrage(env: Env) -> None:
    env.barrage(json_produce_cases())


def test_topic_create_barrage(env: Env) -> None:
    env.barrage(topic_create_cases())


def test_path_and_fetch_barrage(env: Env) -> None:
    env.barrage(path_cases())


def test_producer_init_and_route_barrage(env: Env) -> None:
    env.barrage(producer_init_cases() + route_cases())


def test_oversize_bodies_get_413(env: Env) -> None:
    env.barrage(oversize_cases())


def test_raw_http_garbage_does_not_hurt_nodes(env: Env) -> None:
    """Below HTTP: garbage request lines, lying Content-Length, half requests, non-ASCII headers."""
    before = env.settled_snapshot()
    port = env.c.configs[0].http_port
    payloads: list[tuple[bytes, bool]] = [  # (bytes, half-close after sending)
        (b"GARBAGE\r\n\r\n", False),
        (b"\x00\xff" * 100 + b"\r\n\r\n", False),
        (b"GET / HTTP/9.9\r\n\r\n", False),
        (b"FOO /v1/topics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
        (b"POST /v1/produce HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", False),
        (b"POST /v1/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}", False),
        (b"POST /v1/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}", True),  # body never ends
        (b"POST /v1/produce HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", False),
        (
            b"GET /v1/internal/state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"X-Txbroker-Auth: \xff\xfe\xc3\x28\r\n\r\n",
            False,
        ),
        (b"GET /v1/topics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 20_000 + b"\r\n\r\n", False),
    ]
    auth_reply = b""
    for payload, half_close in payloads:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(payload)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            chunks = []
            try:
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            except OSError:
                pass
            reply = b"".join(chunks)
        if b"internal/state" in payload:
            auth_reply = reply
        assert not reply.startswith(b"HTTP/1.1 5"), (payload[:60], reply[:300])
    assert auth_reply.startswith(b"HTTP/1.1 403"), auth_reply[:300]
    assert b"CLUSTER_AUTHORIZATION_FAILED" in auth_reply
    env.assert_healthy()
    assert env.settled_snapshot() == before


# -- hypothesis: generated JSON bodies ------------------------------------------------

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
hostile_int = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-1, 0, 2**31, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=5),
    st.none(),
)
hostile_name = st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=30), json_leaf)
SETTINGS = settings(
    derandomize=True,
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def valid_create(body: Any) -> bool:
    """Would ``body`` create a topic? (those are not hostile; skip them)"""
    if not isinstance(body, dict):
        return False
    name = body.get("name")
    return (
        isinstance(name, str)
        and bool(LEGAL_NAME.match(name))
        and name not in (".", "..")
        and not name.startswith("__")
        and name != TOPIC
    )


@st.composite
def topic_bodies(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(json_values)
    body: dict[str, Any] = {}
    for key, strat in (
        ("name", hostile_name),
        ("partitions", hostile_int),
        ("replication_factor", hostile_int),
        ("config", json_values),
    ):
        if draw(st.booleans()):
            body[key] = draw(strat)
    body.update(draw(st.dictionaries(st.text(max_size=6), json_leaf, max_size=2)))
    return body


@st.composite
def produce_bodies(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 3)) == 0:
        return draw(json_values)
    record = st.fixed_dictionaries(
        {},
        optional={
            "key": st.one_of(st.none(), st.text(max_size=8), json_leaf),
            "value": st.one_of(st.none(), st.sampled_from([B64, "", "===", "a"]), json_leaf),
            "headers": st.one_of(
                json_values,
                st.lists(st.fixed_dictionaries({}, optional={"key": json_leaf, "value": json_leaf}), max_size=3),
            ),
            "timestamp": hostile_int,
            "partition": hostile_int,
        },
    )
    part = st.fixed_dictionaries(
        {},
        optional={
            # never the existing topic: whatever else is (in)valid, nothing can be written
            "topic": st.one_of(hostile_name, st.just("no-such-topic")),
            "partition": hostile_int,
            "producer_id": hostile_int,
            "producer_epoch": hostile_int,
            "base_sequence": hostile_int,
            "records": st.one_of(json_values, st.lists(st.one_of(record, json_leaf), max_size=3)),
        },
    )
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["partitions"] = draw(st.one_of(json_values, st.lists(st.one_of(part, json_leaf), max_size=3)))
    else:
        body["partitions"] = draw(st.lists(part, min_size=1, max_size=3))
    for key, strat in (
        ("acks", st.one_of(st.sampled_from(["all", 0, -1, 1, "0"]), json_leaf)),
        ("timeout_ms", hostile_int),
        ("transactional_id", json_leaf),
        ("format", st.one_of(st.sampled_from(["base64", "string", "hex"]), json_leaf)),
    ):
        if draw(st.booleans()):
            body[key] = draw(strat)
    return body


def mentions_topic(body: Any) -> bool:
    return TOPIC in json.dumps(body)


def test_hypothesis_topic_bodies(env: Env) -> None:
    before = env.settled_snapshot()
    problems: list[str] = []

    @SETTINGS
    @given(topic_bodies())
    def one(body: Any) -> None:
        assume(not valid_create(body))
        r = send("POST", env.c.url(1 + env.sent % 3) + "/v1/topics", jdump(body))
        env.count()
        p = error_problem(r)
        if p:
            problems.append(f"{body!r:.300}: {p}")

    one()
    env.assert_healthy()
    assert not problems, "\n".join(problems)
    assert env.settled_snapshot() == before


def test_hypothesis_produce_bodies(env: Env) -> None:
    before = env.settled_snapshot()
    problems: list[str] = []

    @SETTINGS
    @given(produce_bodies())
    def one(body: Any) -> None:
        assume(not mentions_topic(body))
        r = send("POST", env.url("leader") + "/v1/produce", jdump(body))
        env.count()
        p = error_problem(r)
        if p:
            problems.append(f"{body!r:.300}: {p}")

    one()
    env.assert_healthy()
    assert not problems, "\n".join(problems)
    assert env.settled_snapshot() == before


def test_partial_produce_only_writes_the_good_partition(env: Env) -> None:
    """A request with one good and one bad partition: per-partition results (Kafka's shape).

    The bad entry gets its error and changes nothing; the good one is written
    (this is the only test that changes a partition).
    """
    before = env.settled_snapshot()
    corrupt = bytearray(good_batch())
    corrupt[-1] ^= 0xFF
    body = raw_produce(parts=[(TOPIC.encode(), 0, good_batch()), (b"no-such-topic", 0, bytes(corrupt))])
    r = send("POST", env.url("leader") + "/v1/produce", body, content_type=PRODUCE_CONTENT_TYPE)
    assert r.status == 200, r
    by_topic = {p["topic"]: p for p in r.body["partitions"]}
    assert by_topic[TOPIC]["error_code"] == "NONE"
    assert by_topic["no-such-topic"]["error_code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    after = env.settled_snapshot()
    for node in after:
        parts_before = {p[0]: p for p in before[node][TOPIC]}
        parts_after = {p[0]: p for p in after[node][TOPIC]}
        assert parts_after[0][2] == parts_before[0][2] + 1
        assert parts_after[1] == parts_before[1]
        assert parts_after[2] == parts_before[2]
    assert sorted(after[1]) == sorted(before[1])


def test_every_node_survived(env: Env) -> None:
    env.assert_healthy()
    assert env.sent >= 300, env.sent
    print(f"\n{env.sent} hostile requests: {env.counts}")
    for i in range(1, env.c.n + 1):
        # the middleware logs every 5xx it turns an exception into (aiohttp itself logs
        # malformed HTTP and dropped connections; those are not failures)
        log = env.c.log_text(i)
        assert "unhandled error" not in log, log[log.index("unhandled error") - 200 :][:4000]
