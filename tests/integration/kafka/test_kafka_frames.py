"""The Kafka listener's framing and robustness, over raw sockets against a real one-node cluster.

Frames are built with kafka-python's protocol messages; what a hostile or
broken client can send (unknown keys and versions, oversized and garbage
frames, silence) closes that connection only, and the node goes on serving.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

from tests.support.cluster import LocalCluster, http, samples, wait_for

pytestmark = pytest.mark.integration

IDLE_MS = 1500


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        tmp_path_factory.mktemp("frames"), 1, kafka_connections_max_idle_ms=IDLE_MS, kafka_max_frame_bytes=65536
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def _connect(cluster: LocalCluster) -> socket.socket:
    host, port = cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.settimeout(10)
    return s


def _frame(request: Any, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="frames-test")
    return bytes(request.encode(header=True, framed=True))


def _read_frame(s: socket.socket) -> bytes:
    head = _recv_exactly(s, 4)
    (size,) = struct.unpack(">i", head)
    return _recv_exactly(s, size)


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def _closed_by_peer(s: socket.socket, within: float = 10.0) -> bool:
    """True once the node closed the connection (EOF or reset) within ``within`` seconds."""
    s.settimeout(within)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _metadata_works(cluster: LocalCluster) -> None:
    with _connect(cluster) as s:
        s.sendall(_frame(MetadataRequest[9](topics=None, allow_auto_topic_creation=False), 77))
        resp = MetadataResponse.decode(_read_frame(s), version=9, header=True)
        assert resp.header.correlation_id == 77
        assert [b.node_id for b in resp.brokers] == [1]


def test_api_versions_lists_every_served_api_and_downgrades_unknown_versions(node: LocalCluster) -> None:
    with _connect(node) as s:
        s.sendall(_frame(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 1))
        resp = ApiVersionsResponse.decode(_read_frame(s), version=3, header=True)
        assert resp.error_code == 0
        ranges = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert ranges[0] == (0, 9)  # Produce: 0 advertised for librdkafka, batch v2 from 3
        assert ranges[1][0] <= 4 <= ranges[1][1]  # Fetch with aborted transactions
        assert ranges[3][1] >= 4  # Metadata >= 4: kafka-python keeps idempotence on
        assert ranges[18] == (0, 3)
        # A version newer than served: a version-0 answer with UNSUPPORTED_VERSION and the ranges (KIP-511).
        raw = bytearray(_frame(ApiVersionsRequest[0](), 2))
        struct.pack_into(">h", raw, 6, 99)
        s.sendall(bytes(raw))
        resp0 = ApiVersionsResponse.decode(_read_frame(s), version=0, header=True)
        assert resp0.header.correlation_id == 2
        assert resp0.error_code == 35
        assert {k.api_key for k in resp0.api_keys} == set(ranges)


def test_unknown_api_key_and_version_close_only_that_connection(node: LocalCluster) -> None:
    for key, version in ((999, 0), (3, 99)):
        with _connect(node) as s:
            raw = bytearray(_frame(MetadataRequest[1](topics=None), 5))
            struct.pack_into(">hh", raw, 4, key, version)
            s.sendall(bytes(raw))
            assert _closed_by_peer(s), f"key {key} v{version} left the connection open"
    _metadata_works(node)


def test_a_frame_above_the_limit_closes_before_its_body_is_read(node: LocalCluster) -> None:
    with _connect(node) as s:
        s.sendall(struct.pack(">i", 65536 + 1))  # only the size: the node must not wait for the body
        assert _closed_by_peer(s)
    with _connect(node) as s:
        s.sendall(struct.pack(">i", -5))
        assert _closed_by_peer(s)
    _metadata_works(node)


def test_requests_pipelined_on_one_connection_are_answered_in_order(node: LocalCluster) -> None:
    with _connect(node) as s:
        s.sendall(
            b"".join(_frame(MetadataRequest[9](topics=None, allow_auto_topic_creation=False), i) for i in range(30))
        )
        ids = [MetadataResponse.decode(_read_frame(s), version=9, header=True).header.correlation_id for _ in range(30)]
        assert ids == list(range(30))


def test_an_idle_connection_is_closed(node: LocalCluster) -> None:
    with _connect(node) as s:
        started = time.monotonic()
        assert _closed_by_peer(s, within=IDLE_MS / 1000 + 10)
        assert time.monotonic() - started >= IDLE_MS / 1000 * 0.8


def test_fuzzed_frames_close_connections_without_hanging_or_killing_the_node(node: LocalCluster) -> None:
    rng = random.Random(20261126)
    valid = [_frame(MetadataRequest[v](topics=None), 9) for v in (1, 4, 9, 12)]
    valid += [_frame(ApiVersionsRequest[3](client_software_name="f", client_software_version="1"), 9)]
    hangs = 0
    for _ in range(150):
        base = bytearray(rng.choice(valid))
        mode = rng.randrange(4)
        if mode == 0:  # flip bytes of the body (the size stays right)
            for _i in range(rng.randrange(1, 8)):
                base[rng.randrange(12, len(base))] = rng.randrange(256)
        elif mode == 1:  # truncate the body, keep the size
            base = base[: rng.randrange(4, len(base))]
        elif mode == 2:  # random body under a plausible header
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
            base = bytearray(struct.pack(">ihhi", 8 + len(body), rng.choice((0, 1, 3, 18, 19)), rng.randrange(20), 1))
            base += body
        else:  # random api key and version in an otherwise valid frame
            struct.pack_into(">hh", base, 4, rng.randrange(-5, 80), rng.randrange(-2, 20))
        with _connect(node) as s:
            s.sendall(bytes(base))
            s.shutdown(socket.SHUT_WR)  # the stream ends after the frame: answered or refused, then closed
            # Each connection either answers or closes; a hang is a connection that does neither.
            s.settimeout(5)
            try:
                while s.recv(65536):
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass
            except TimeoutError:
                hangs += 1
    assert hangs == 0
    assert node.procs[1].poll() is None, "the node died"
    wait_for(lambda: node.is_ready(1), 10, "node ready after the fuzzing")
    _metadata_works(node)


def test_the_listener_counts_requests_per_api_and_version(node: LocalCluster) -> None:
    _metadata_works(node)
    found = samples(node.url(1), "txbroker_kafka_requests_total")
    assert any(lbl.get("api") == "Metadata" and lbl.get("version") == "9" and v >= 1 for lbl, v in found)
    assert any(lbl.get("outcome") == "unsupported" for lbl, _v in found)


def test_kafka_address_is_in_the_cluster_view(node: LocalCluster) -> None:
    status, body = http("GET", node.url(1) + "/v1/cluster")
    assert status == 200
    assert body["nodes"][0]["kafka"] == node.bootstrap_servers
