"""Consumer-group tooling on 3 node processes (API.md "Operating a cluster", kafka-consumer-groups.sh):
describe with lag, offset resets (dry run, execute, by timestamp), deletes, the lag metric and the CLI.

Every request goes through a node chosen without regard to the group's coordinator, so forwarding is
exercised too. One cluster serves the whole module; each test uses its own groups and topics.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clients.admin import Admin
from clients.aio.admin import AsyncAdmin
from tests.support.cluster import LocalCluster, http, samples, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOPIC = "ga"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("group-admin")), 3, group_min_session_timeout_ms=1000)
    try:
        c.start()
        c.create_topic(TOPIC, partitions=2, rf=3)
        c.wait_leaders(TOPIC, 2)
        yield c
    finally:
        c.close()


def produce(c: LocalCluster, topic: str, partition: int, n: int, timestamps: list[int] | None = None) -> None:
    stamps = timestamps or [None] * n
    records = [{"value": base64.b64encode(b"r%d" % i).decode(), **({"timestamp": t} if t is not None else {})}
               for i, t in enumerate(stamps)]  # fmt: skip
    body = {"acks": "all", "timeout_ms": 10_000, "partitions": [
        {"topic": topic, "partition": partition, "producer_id": -1, "producer_epoch": -1, "base_sequence": -1,
         "records": records}]}  # fmt: skip
    leader = wait_for(lambda: c.leader(topic, partition), 20, f"a leader of {topic}-{partition}")
    status, res = http("POST", c.url(leader) + "/v1/produce", body)
    assert status == 200, res


def commit(c: LocalCluster, group: str, offsets: dict[int, int], topic: str = TOPIC, via: int = 1) -> None:
    body = {"offsets": [{"topic": topic, "partition": p, "offset": o} for p, o in offsets.items()]}
    status, res = http("POST", c.url(via) + f"/v1/groups/{group}/offsets", body)
    assert status == 200, res


def describe(c: LocalCluster, group: str, via: int = 2) -> dict[str, Any]:
    status, res = http("GET", c.url(via) + f"/v1/groups/{group}")
    assert status == 200, res
    return dict(res)


def rows(d: dict[str, Any], topic: str = TOPIC) -> dict[int, tuple[int, int | None, int | None]]:
    """partition -> (committed offset, log end offset, lag)."""
    return {o["partition"]: (o["offset"], o["log_end_offset"], o["lag"]) for o in d["offsets"] if o["topic"] == topic}


def reset(c: LocalCluster, group: str, body: dict[str, Any], via: int = 3) -> tuple[int, Any]:
    return http("POST", c.url(via) + f"/v1/groups/{group}/offsets/reset", body)


def committed(c: LocalCluster, group: str) -> dict[int, int]:
    return {p: off for p, (off, _end, _lag) in rows(describe(c, group)).items() if off >= 0}


def hw(c: LocalCluster, topic: str, partition: int) -> int:
    return int(c.partition_meta(topic, partition, via=c.leader(topic, partition) or 1)["high_watermark"])


def txbroker(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "cluster", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)  # fmt: skip


def test_describe_shows_lag_that_follows_new_records(cluster: LocalCluster) -> None:
    produce(cluster, TOPIC, 0, 5)
    produce(cluster, TOPIC, 1, 3)
    base0, base1 = hw(cluster, TOPIC, 0), hw(cluster, TOPIC, 1)
    commit(cluster, "lagging", {0: base0 - 3, 1: base1})
    want = {0: (base0 - 3, base0, 3), 1: (base1, base1, 0)}
    wait_for(lambda: rows(describe(cluster, "lagging")) == want, 20, "lag 3 and 0 on the two partitions")
    produce(cluster, TOPIC, 1, 4)
    want[1] = (base1, base1 + 4, 4)
    for via in (1, 2, 3):  # any node answers (a non-coordinator forwards)

        def seen(v: int = via) -> bool:
            return rows(describe(cluster, "lagging", via=v)) == want

        wait_for(seen, 20, f"lag 4 seen via node {via}")
    d = describe(cluster, "lagging")
    assert d["state"] == "Empty" and d["members"] == []
    for via in (1, 2, 3):
        status, listed = http("GET", cluster.url(via) + "/v1/groups")
        assert status == 200 and not listed["unreachable"], listed
        mine = [g for g in listed["groups"] if g["group_id"] == "lagging"]
        assert [(g["state"], g["members"]) for g in mine] == [("Empty", 0)]


def test_an_unknown_group_is_described_as_dead(cluster: LocalCluster) -> None:
    d = describe(cluster, "never-used")
    assert (d["state"], d["members"], d["offsets"]) == ("Dead", [], [])


def test_reset_is_a_dry_run_until_executed(cluster: LocalCluster) -> None:
    produce(cluster, TOPIC, 0, 4)
    commit(cluster, "resetting", {0: 1})
    before = committed(cluster, "resetting")
    status, res = reset(cluster, "resetting", {"topic": TOPIC, "to": "earliest"})
    assert status == 200, res
    assert res["dry_run"] is True and res["group_id"] == "resetting"
    assert [(o["partition"], o["current_offset"], o["new_offset"]) for o in res["offsets"]] == [(0, 1, 0), (1, -1, 0)]
    assert committed(cluster, "resetting") == before  # nothing written
    status, res = reset(cluster, "resetting", {"topic": TOPIC, "to": "latest", "dry_run": False})
    assert status == 200 and res["dry_run"] is False, res
    ends = {p: hw(cluster, TOPIC, p) for p in (0, 1)}
    assert {o["partition"]: o["new_offset"] for o in res["offsets"]} == ends
    assert committed(cluster, "resetting") == ends
    # --to-offset is clamped to [log start, log end]; --partitions narrows the reset
    status, res = reset(cluster, "resetting", {"topic": TOPIC, "partitions": [1], "to": {"offset": 10**9},
                                               "dry_run": False})  # fmt: skip
    assert status == 200 and [(o["partition"], o["new_offset"]) for o in res["offsets"]] == [(1, ends[1])], res
    status, res = reset(cluster, "resetting", {"topic": TOPIC, "partitions": [0], "to": {"offset": 2},
                                               "dry_run": False})  # fmt: skip
    assert status == 200, res
    assert committed(cluster, "resetting") == {0: 2, 1: ends[1]}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"topic": TOPIC, "to": "beginning"}, 400, "INVALID_REQUEST"),
        ({"topic": TOPIC, "to": {"offset": -1}}, 400, "INVALID_REQUEST"),
        ({"topic": TOPIC}, 400, "INVALID_REQUEST"),
        ({"topic": TOPIC, "to": "earliest", "partitions": []}, 400, "INVALID_REQUEST"),
        ({"topic": TOPIC, "to": "earliest", "dry_run": "no"}, 400, "INVALID_REQUEST"),
        ({"topic": "no-such-topic", "to": "earliest"}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
        ({"topic": TOPIC, "to": "earliest", "partitions": [7], "dry_run": False}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    ],
)
def test_bad_resets_change_nothing(cluster: LocalCluster, body: dict[str, Any], status: int, code: str) -> None:
    commit(cluster, "bad-resets", {0: 1})
    got, res = reset(cluster, "bad-resets", body)
    assert (got, res.get("error_code")) == (status, code), res
    assert committed(cluster, "bad-resets") == {0: 1}


def join(c: LocalCluster, group: str) -> str:
    body = {"topics": [TOPIC], "session_timeout_ms": 30_000, "rebalance_timeout_ms": 10_000}
    status, res = http("POST", c.url(2) + f"/v1/groups/{group}/join", body, timeout=60)
    assert status == 200, res
    return str(res["member_id"])


def test_an_active_member_blocks_reset_and_delete_then_delete_removes_the_group(cluster: LocalCluster) -> None:
    commit(cluster, "busy", {0: 1, 1: 1})
    member = join(cluster, "busy")
    d = describe(cluster, "busy")
    assert d["state"] == "Stable" and [m["member_id"] for m in d["members"]] == [member]
    assert {o["partition"]: o["member_id"] for o in d["offsets"]} == {0: member, 1: member}
    status, res = reset(cluster, "busy", {"topic": TOPIC, "to": "earliest", "dry_run": False})
    assert (status, res["error_code"]) == (409, "NON_EMPTY_GROUP"), res
    assert "inactive" in res["message"]
    status, res = http("DELETE", cluster.url(3) + "/v1/groups/busy")
    assert (status, res["error_code"]) == (409, "NON_EMPTY_GROUP"), res
    assert committed(cluster, "busy") == {0: 1, 1: 1} and describe(cluster, "busy")["state"] == "Stable"
    status, res = http("POST", cluster.url(1) + "/v1/groups/busy/leave", {"member_id": member})
    assert status == 200, res
    wait_for(lambda: describe(cluster, "busy")["state"] == "Empty", 20, "the group empty after the leave")
    status, res = http("DELETE", cluster.url(3) + "/v1/groups/busy")
    assert status == 200 and res["deleted"] is True and res["offsets_deleted"] == 2, res
    d = describe(cluster, "busy")
    assert (d["state"], d["members"], d["offsets"]) == ("Dead", [], [])
    for via in (1, 2, 3):
        _, listed = http("GET", cluster.url(via) + "/v1/groups")
        assert "busy" not in {g["group_id"] for g in listed["groups"]}
    status, res = http("DELETE", cluster.url(1) + "/v1/groups/busy")
    assert (status, res["error_code"]) == (404, "GROUP_ID_NOT_FOUND"), res


def test_reset_to_a_timestamp_picks_the_first_record_at_or_after_it(cluster: LocalCluster) -> None:
    cluster.create_topic("gts", partitions=1, rf=3)
    cluster.wait_leaders("gts", 1)
    base = 1_700_000_000_000
    produce(cluster, "gts", 0, 4, [base + 1000, base + 2000, base + 3000, base + 4000])
    for ts, expected in ((base, 0), (base + 2000, 1), (base + 2500, 2), (base + 4000, 3), (base + 9000, 4)):
        status, res = reset(cluster, "ts-group", {"topic": "gts", "to": {"timestamp": ts}})
        assert status == 200 and res["offsets"][0]["new_offset"] == expected, (ts, res)
    status, res = reset(cluster, "ts-group", {"topic": "gts", "to": {"timestamp": base + 2500}, "dry_run": False})
    assert status == 200, res
    assert {o["partition"]: o["offset"] for o in describe(cluster, "ts-group")["offsets"]} == {0: 2}


def coordinator(c: LocalCluster, group: str) -> int:
    status, res = http("GET", c.url(1) + f"/v1/coordinators/group/{group}")
    assert status == 200, res
    return int(res["node_id"])


def test_the_coordinator_exports_the_lag_of_its_groups(cluster: LocalCluster) -> None:
    produce(cluster, TOPIC, 0, 3)
    end = hw(cluster, TOPIC, 0)
    commit(cluster, "metered", {0: end - 2})
    node = coordinator(cluster, "metered")

    def lag_series() -> dict[str, float] | None:
        found = {labels["partition"]: v for labels, v in samples(cluster.url(node), "txbroker_consumer_group_lag")
                 if labels["group"] == "metered"}  # fmt: skip
        return found if found.get("0") == 2 else None

    assert wait_for(lag_series, 20, "txbroker_consumer_group_lag of partition 0 on the coordinator") == {"0": 2}
    total = [v for labels, v in samples(cluster.url(node), "txbroker_consumer_group_total_lag")
             if labels["group"] == "metered"]  # fmt: skip
    assert total == [2]
    for other in {1, 2, 3} - {node}:  # only the coordinator exports a group
        assert not [s for s in samples(cluster.url(other), "txbroker_consumer_group_lag") if s[0]["group"] == "metered"]


def test_the_cli_lists_describes_resets_and_deletes(cluster: LocalCluster) -> None:
    commit(cluster, "cli-group", {0: 0, 1: 0})
    url = cluster.url(2)
    res = txbroker("group", "list", "--bootstrap", url)
    assert res.returncode == 0 and "cli-group" in res.stdout.split(), res
    res = txbroker("group", "describe", "cli-group", "--bootstrap", url)
    assert res.returncode == 0, res
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "Consumer group 'cli-group' has no active members."
    assert lines[2].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                "CONSUMER-ID", "HOST", "CLIENT-ID"]  # fmt: skip
    table = {int(cols[2]): cols for cols in (line.split() for line in lines[3:])}
    assert table[0][:4] == ["cli-group", TOPIC, "0", "0"] and table[0][5] == table[0][4]  # lag = log end - 0
    res = txbroker("group", "reset-offsets", "cli-group", "--topic", TOPIC, "--to-latest", "--partitions", "0",
                   "--bootstrap", url)  # fmt: skip
    assert res.returncode == 0 and "dry run" in res.stderr, res
    assert committed(cluster, "cli-group") == {0: 0, 1: 0}
    end = hw(cluster, TOPIC, 0)
    res = txbroker("group", "reset-offsets", "cli-group", "--topic", TOPIC, "--to-offset", "1", "--execute",
                   "--bootstrap", url)  # fmt: skip
    assert res.returncode == 0 and "dry run" not in res.stderr, res
    assert res.stdout.splitlines()[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"]
    assert committed(cluster, "cli-group") == {0: min(1, end), 1: min(1, hw(cluster, TOPIC, 1))}
    res = txbroker("group", "reset-offsets", "cli-group", "--topic", TOPIC, "--to-datetime", "2999-01-01T00:00:00Z",
                   "--execute", "--bootstrap", url)  # fmt: skip
    assert res.returncode == 0, res
    assert committed(cluster, "cli-group") == {0: hw(cluster, TOPIC, 0), 1: hw(cluster, TOPIC, 1)}
    res = txbroker("group", "delete", "cli-group", "--bootstrap", url)
    assert res.returncode == 0 and "was successful" in res.stdout, res
    res = txbroker("group", "describe", "cli-group", "--bootstrap", url)
    assert res.returncode == 1 and "does not exist" in res.stderr, res
    res = txbroker("group", "delete", "cli-group", "--bootstrap", url)
    assert res.returncode == 1 and "GROUP_ID_NOT_FOUND" in res.stderr, res


def test_the_python_admin_clients(cluster: LocalCluster) -> None:
    commit(cluster, "py-admin", {0: 0})
    admin = Admin(cluster.urls)
    assert "py-admin" in {g["group_id"] for g in admin.list_consumer_groups()}
    [known, unknown] = admin.describe_consumer_groups(["py-admin", "py-unknown"])
    assert known["state"] == "Empty" and rows(known)[0][0] == 0 and unknown["state"] == "Dead"
    plan = admin.reset_consumer_group_offsets("py-admin", TOPIC, "latest", partitions=[0])
    assert plan["dry_run"] is True and committed(cluster, "py-admin") == {0: 0}

    async def run() -> tuple[list[dict[str, Any]], dict[str, Any], list[tuple[str, Any]]]:
        async with AsyncAdmin(cluster.urls) as aio:
            described = await aio.describe_consumer_groups(["py-admin"])
            reset_res = await aio.reset_consumer_group_offsets("py-admin", TOPIC, {"offset": 0}, execute=True)
            deleted = await aio.delete_consumer_groups(["py-admin", "py-unknown"])
            return described, reset_res, deleted

    described, reset_res, deleted = asyncio.run(run())
    assert described[0]["group_id"] == "py-admin" and reset_res["dry_run"] is False
    assert [(g, e.error_code.name if e else None) for g, e in deleted] == [
        ("py-admin", None),
        ("py-unknown", "GROUP_ID_NOT_FOUND"),
    ]
    assert admin.describe_consumer_groups(["py-admin"])[0]["state"] == "Dead"
