"""The applied-index barrier endpoint on real nodes: only nodes may call it, it answers once the node's
controller replica reached the index, waits bounded without blocking the node, and rejects bad input."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.controller_service import APPLIED_PATH, APPLIED_WAIT_S
from tests.support.cluster import LocalCluster, http, node_call

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the module: no test stops a node or changes what another one reads."""
    with LocalCluster(tmp_path_factory.mktemp("controller-applied"), 3) as c:
        yield c.start()


def applied(c: LocalCluster, node: int, body: Any, *, signed: bool = True, timeout: float = 30.0) -> tuple[int, Any]:
    headers = node_call(c.configs[0], node, "POST", APPLIED_PATH, body) if signed else {}
    return http("POST", c.url(node) + APPLIED_PATH, body, headers=headers, timeout=timeout)


def test_every_node_answers_once_it_applied_the_index(cluster: LocalCluster) -> None:
    c = cluster
    c.create_topic("barrier", partitions=1, rf=3, via=1)
    # the index some node has applied after the topic exists: every node reaches it
    status, body = applied(c, 1, {"index": 0})
    assert status == 200, body
    reached = body["applied"]
    assert reached > 0
    for node in (1, 2, 3):
        status, body = applied(c, node, {"index": reached})
        assert status == 200 and body["applied"] >= reached, (node, body)


def test_only_nodes_may_ask_and_bad_input_is_rejected(cluster: LocalCluster) -> None:
    c = cluster
    status, body = applied(c, 2, {"index": 1}, signed=False)
    assert status == 403 and body["error_code"] == "CLUSTER_AUTHORIZATION_FAILED"
    for bad in ({}, {"index": -1}, {"index": "7"}, {"index": 2**63}, [1]):
        status, body = applied(c, 2, bad)
        assert status == 400 and body["error_code"] == "INVALID_REQUEST", (bad, body)


def test_a_future_index_times_out_bounded_and_the_node_keeps_serving(cluster: LocalCluster) -> None:
    c = cluster
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        waiting = pool.submit(applied, c, 3, {"index": 2**40})
        answered_meanwhile = 0
        while not waiting.done():  # the node keeps answering while the call waits
            asked = time.monotonic()
            status, _ = http("GET", c.url(3) + "/livez", timeout=5)
            assert status == 200 and time.monotonic() - asked < 1.0
            answered_meanwhile += not waiting.done()
        status, body = waiting.result(timeout=APPLIED_WAIT_S + 20)
    assert answered_meanwhile > 0
    assert status == 504 and body["error_code"] == "REQUEST_TIMED_OUT", body
    assert APPLIED_WAIT_S - 0.5 < time.monotonic() - started < APPLIED_WAIT_S + 10
