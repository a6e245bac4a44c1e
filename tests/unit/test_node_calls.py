"""Node-call signatures (cluster/security/node_calls.py): what binds a call, freshness, replay windows, bounds."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import re

import pytest

from cluster.security.node_calls import (
    NodeCall,
    NodeCallRejected,
    NodeCallSigner,
    NodeCallVerifier,
    body_sha256,
    derive_key,
)

SECRET = "cluster-secret-for-tests"
PATH = "/v1/internal/txn/decide?x=%2F%7E&t=%C3%A9t%C3%A9"
BODY = b'{"transactional_id": "t-1"}'
T0 = 1_800_000_000.0
RECEIVER = 7


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def pair(clock: Clock | None = None, **kw: object) -> tuple[NodeCallSigner, NodeCallVerifier, Clock]:
    clock = clock or Clock()
    return NodeCallSigner(SECRET, 2, clock=clock), NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, **kw), clock  # type: ignore[arg-type]


def fields(header: str) -> dict[str, str]:
    version, _, rest = header.partition(" ")
    assert version == "v1"
    return dict(item.split("=", 1) for item in rest.split(","))


def rebuild(f: dict[str, str]) -> str:
    return "v1 " + ",".join(f"{k}={f[k]}" for k in ("n", "t", "c", "p", "s"))


def test_round_trip_internal_and_forwarded() -> None:
    signer, verifier, _ = pair()
    assert verifier.verify("POST", PATH, BODY, signer.sign("POST", PATH, BODY, None, receiver=RECEIVER)) == NodeCall(
        2, None
    )
    call = verifier.verify(
        "GET", "/v1/topics/x", b"", signer.sign("GET", "/v1/topics/x", b"", "User:alice", receiver=RECEIVER)
    )
    assert call == NodeCall(2, "User:alice", "*")
    call = verifier.verify(
        "GET", "/v1/x", b"", signer.sign("GET", "/v1/x", b"", "User:a b", receiver=RECEIVER, host="10.1.2.3")
    )
    assert call == NodeCall(2, "User:a b", "10.1.2.3")  # the client's address travels with its principal
    with pytest.raises(ValueError, match="client host"):
        signer.sign("GET", "/v1/x", b"", "User:a", receiver=RECEIVER, host="10.1.2.3 User:admin")
    unicode = "User:\u00e9t\u00e9 \u4e16\u754c"
    assert (
        verifier.verify("POST", "/", b"", signer.sign("POST", "/", b"", unicode, receiver=RECEIVER)).principal
        == unicode
    )


def test_the_header_has_the_documented_shape_and_the_key_is_not_the_secret() -> None:
    signer, _, _ = pair()
    header = signer.sign("POST", PATH, BODY, "User:bob", receiver=RECEIVER)
    assert re.fullmatch(r"v1 n=2,t=\d+,c=[0-9a-f]{16}\.1,p=[A-Za-z0-9_-]+,s=[0-9a-f]{64}", header), header
    f = fields(header)
    assert base64.urlsafe_b64decode(f["p"] + "=" * (-len(f["p"]) % 4)) == b"* User:bob"  # client host, principal
    canonical = "\n".join(
        ("txbroker-node-call", "v1", "POST", PATH, body_sha256(BODY), f["p"], "2", str(RECEIVER), f["t"], f["c"])
    ).encode()
    assert hmac.new(derive_key(SECRET), canonical, hashlib.sha256).hexdigest() == f["s"]
    assert hmac.new(SECRET.encode(), canonical, hashlib.sha256).hexdigest() != f["s"]
    assert derive_key(SECRET) != SECRET.encode() and len(derive_key(SECRET)) == 32


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", PATH, BODY),  # method
        ("POST", "/v1/internal/txn/marker?x=%2F%7E&t=%C3%A9t%C3%A9", BODY),  # path
        ("POST", "/v1/internal/txn/decide?x=%2f%7E&t=%C3%A9t%C3%A9", BODY),  # query: another escape's case
        ("POST", "/v1/internal/txn/decide?x=/~&t=%C3%A9t%C3%A9", BODY),  # query: unescaped
        ("POST", "/v1/internal/txn/decide", BODY),  # query dropped
        ("POST", PATH, BODY + b" "),  # body
        ("POST", PATH, b""),
    ],
)
def test_an_altered_request_is_rejected(method: str, path: str, body: bytes) -> None:
    signer, verifier, _ = pair()
    header = signer.sign("POST", PATH, BODY, None, receiver=RECEIVER)
    with pytest.raises(NodeCallRejected, match="bad signature"):
        verifier.verify(method, path, body, header)


def test_altered_principal_sender_timestamp_nonce_are_rejected() -> None:
    signer, verifier, _ = pair()
    f = fields(signer.sign("POST", PATH, BODY, "User:alice", receiver=RECEIVER))
    other_p = base64.urlsafe_b64encode(b"User:admin").rstrip(b"=").decode()
    t = int(f["t"])
    boot, counter = f["c"].split(".")
    for change in (
        {"p": other_p},
        {"p": ""},  # the forwarded call turned into the node's own
        {"n": "3"},
        {"t": str(t - 1)},
        {"t": str(t + 1000)},
        {"c": f"{boot}.{int(counter) + 1}"},
        {"c": f"{'0' * 16}.{counter}"},
        {"s": f["s"][:-1] + ("0" if f["s"][-1] != "0" else "1")},
    ):
        with pytest.raises(NodeCallRejected, match="bad signature"):
            verifier.verify("POST", PATH, BODY, rebuild({**f, **change}))
    assert verifier.verify("POST", PATH, BODY, rebuild(f)) == NodeCall(2, "User:alice", "*")


def test_a_call_signed_for_another_node_is_rejected_there() -> None:
    clock = Clock()
    signer = NodeCallSigner(SECRET, 2, clock=clock)
    to_3 = signer.sign("POST", PATH, BODY, None, receiver=3)
    with pytest.raises(NodeCallRejected, match="bad signature"):
        NodeCallVerifier(SECRET, node_id=4, clock=clock).verify("POST", PATH, BODY, to_3)
    assert NodeCallVerifier(SECRET, node_id=3, clock=clock).verify("POST", PATH, BODY, to_3).sender == 2


def test_another_secret_is_rejected() -> None:
    clock = Clock()
    header = NodeCallSigner("another-secret", 2, clock=clock).sign("POST", PATH, BODY, None, receiver=RECEIVER)
    with pytest.raises(NodeCallRejected, match="bad signature"):
        NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock).verify("POST", PATH, BODY, header)


def test_stale_and_future_timestamps_are_rejected() -> None:
    clock = Clock()
    verifier = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, max_skew_s=30.0, start_skew_s=60.0)
    old = NodeCallSigner(SECRET, 1, clock=Clock(T0 - 30.001)).sign("GET", "/", b"", None, receiver=RECEIVER)
    with pytest.raises(NodeCallRejected, match="stale"):
        verifier.verify("GET", "/", b"", old)
    edge = NodeCallSigner(SECRET, 1, clock=Clock(T0 - 30.0)).sign("GET", "/", b"", None, receiver=RECEIVER)
    assert verifier.verify("GET", "/", b"", edge).sender == 1
    future = NodeCallSigner(SECRET, 1, clock=Clock(T0 + 30.001)).sign("GET", "/", b"", None, receiver=RECEIVER)
    with pytest.raises(NodeCallRejected, match="future"):
        verifier.verify("GET", "/", b"", future)
    # a call that was fresh goes stale as the verifier's clock moves on
    signer = NodeCallSigner(SECRET, 1, clock=clock)
    header = signer.sign("GET", "/", b"", None, receiver=RECEIVER)
    clock.now += 31
    with pytest.raises(NodeCallRejected, match="stale"):
        verifier.verify("GET", "/", b"", header)


def test_the_freshness_bound_is_configurable() -> None:
    clock = Clock()
    verifier = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, max_skew_s=5.0, start_skew_s=10.0)
    header = NodeCallSigner(SECRET, 1, clock=Clock(T0 - 6)).sign("GET", "/", b"", None, receiver=RECEIVER)
    with pytest.raises(NodeCallRejected, match="stale"):
        verifier.verify("GET", "/", b"", header)


def test_the_same_header_is_accepted_once() -> None:
    signer, verifier, clock = pair()
    header = signer.sign("POST", PATH, BODY, None, receiver=RECEIVER)
    verifier.verify("POST", PATH, BODY, header)
    for _ in range(3):
        with pytest.raises(NodeCallRejected, match="replayed"):
            verifier.verify("POST", PATH, BODY, header)
    clock.now += 10  # still fresh: still refused
    with pytest.raises(NodeCallRejected, match="replayed"):
        verifier.verify("POST", PATH, BODY, header)


def test_out_of_order_nonces_within_the_window_are_accepted_once_each() -> None:
    signer, verifier, _ = pair(window=64)
    headers = [signer.sign("GET", "/", b"", None, receiver=RECEIVER) for _ in range(64)]
    order = list(range(63, -1, -1))  # newest first, then every older one
    order[10], order[40] = order[40], order[10]
    for i in order:
        verifier.verify("GET", "/", b"", headers[i])
    for i in (0, 31, 63):
        with pytest.raises(NodeCallRejected, match="replayed"):
            verifier.verify("GET", "/", b"", headers[i])


def test_the_window_slides_and_what_falls_below_it_is_rejected() -> None:
    signer, verifier, _ = pair(window=8)
    headers = [signer.sign("GET", "/", b"", None, receiver=RECEIVER) for _ in range(30)]
    verifier.verify("GET", "/", b"", headers[0])
    verifier.verify("GET", "/", b"", headers[9])  # counter 10: the window is now counters 3..10
    with pytest.raises(NodeCallRejected, match="below the replay window"):
        verifier.verify("GET", "/", b"", headers[1])  # counter 2
    verifier.verify("GET", "/", b"", headers[2])  # counter 3: the window's oldest, not seen yet
    with pytest.raises(NodeCallRejected, match="replayed"):
        verifier.verify("GET", "/", b"", headers[2])
    verifier.verify("GET", "/", b"", headers[29])  # a jump far past the window
    with pytest.raises(NodeCallRejected, match="below the replay window"):
        verifier.verify("GET", "/", b"", headers[20])
    verifier.verify("GET", "/", b"", headers[25])
    with pytest.raises(NodeCallRejected, match="replayed"):
        verifier.verify("GET", "/", b"", headers[29])


def test_a_huge_counter_jump_does_not_grow_the_window() -> None:
    # The counter is signed, so only a node could jump it; the bitmap still never exceeds the window.
    clock = Clock()
    verifier = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, window=16)
    signer = NodeCallSigner(SECRET, 1, clock=clock)
    verifier.verify("GET", "/", b"", signer.sign("GET", "/", b"", None, receiver=RECEIVER))
    signer._counters[RECEIVER] = itertools.count(2**62)  # a signer that ran for a very long time
    verifier.verify("GET", "/", b"", signer.sign("GET", "/", b"", None, receiver=RECEIVER))
    win = next(iter(verifier._windows[1].values()))
    assert win.top == 2**62 and win.bits.bit_length() <= 16


def test_separate_senders_and_boots_have_separate_windows() -> None:
    clock = Clock()
    verifier = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock)
    a, b = NodeCallSigner(SECRET, 1, clock=clock), NodeCallSigner(SECRET, 2, clock=clock)
    a2 = NodeCallSigner(SECRET, 1, clock=clock)  # node 1 restarted: a new boot, its counter starts again
    for signer in (a, b, a2):
        assert (
            verifier.verify("GET", "/", b"", signer.sign("GET", "/", b"", None, receiver=RECEIVER)).sender
            == signer.node_id
        )
    assert verifier.windows() == 3


def test_a_restarted_verifier_rejects_calls_signed_before_it_started() -> None:
    clock = Clock()
    signer = NodeCallSigner(SECRET, 1, clock=clock)
    first = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, start_skew_s=1.0)
    captured = signer.sign("POST", PATH, BODY, None, receiver=RECEIVER)
    first.verify("POST", PATH, BODY, captured)
    clock.now += 5  # the receiving node restarts: its replay memory is empty
    restarted = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, start_skew_s=1.0)
    with pytest.raises(NodeCallRejected, match="before this node started"):
        restarted.verify("POST", PATH, BODY, captured)
    # calls signed within the start skew (clocks of nodes differ a little) and after are accepted
    clock.now -= 0.5
    assert restarted.verify("POST", PATH, BODY, signer.sign("POST", PATH, BODY, None, receiver=RECEIVER)).sender == 1
    clock.now += 0.5
    assert restarted.verify("POST", PATH, BODY, signer.sign("POST", PATH, BODY, None, receiver=RECEIVER)).sender == 1


def test_memory_is_bounded_with_many_boots_and_senders() -> None:
    clock = Clock()
    verifier = NodeCallVerifier(
        SECRET, node_id=RECEIVER, clock=clock, max_skew_s=30.0, window=1024, max_boots=8, max_senders=4
    )
    for step in range(200):  # node 1 restarts every 5 s for 1000 s: old boots' windows are forgotten
        clock.now += 5
        signer = NodeCallSigner(SECRET, 1, clock=clock)
        for _ in range(3):
            verifier.verify("GET", "/", b"", signer.sign("GET", "/", b"", None, receiver=RECEIVER))
        assert verifier.windows() <= 8, step
    assert verifier.windows() <= 7  # only boots whose newest call is still fresh (30 s / 5 s, and this one)
    # restarting faster than the freshness bound allows: refused once the boots of the bound are held
    for _ in range(8):
        signer = NodeCallSigner(SECRET, 2, clock=clock)
        verifier.verify("GET", "/", b"", signer.sign("GET", "/", b"", None, receiver=RECEIVER))
    with pytest.raises(NodeCallRejected, match="too many boots"):
        verifier.verify(
            "GET", "/", b"", NodeCallSigner(SECRET, 2, clock=clock).sign("GET", "/", b"", None, receiver=RECEIVER)
        )
    for sender in (3, 4):
        verifier.verify(
            "GET", "/", b"", NodeCallSigner(SECRET, sender, clock=clock).sign("GET", "/", b"", None, receiver=RECEIVER)
        )
    with pytest.raises(NodeCallRejected, match="too many senders"):
        verifier.verify(
            "GET", "/", b"", NodeCallSigner(SECRET, 5, clock=clock).sign("GET", "/", b"", None, receiver=RECEIVER)
        )
    assert verifier.windows() <= 4 * 8
    clock.now += 31 + 30  # everything stale: the next call sweeps every window
    verifier.verify(
        "GET", "/", b"", NodeCallSigner(SECRET, 1, clock=clock).sign("GET", "/", b"", None, receiver=RECEIVER)
    )
    assert verifier.windows() == 1


def test_a_forgotten_boot_cannot_be_replayed() -> None:
    clock = Clock()
    verifier = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, max_boots=1)
    old = NodeCallSigner(SECRET, 1, clock=clock)
    captured = old.sign("GET", "/", b"", None, receiver=RECEIVER)
    verifier.verify("GET", "/", b"", captured)
    clock.now += 31
    verifier.verify(
        "GET", "/", b"", NodeCallSigner(SECRET, 1, clock=clock).sign("GET", "/", b"", None, receiver=RECEIVER)
    )
    assert verifier.windows() == 1  # the old boot's window is gone...
    with pytest.raises(NodeCallRejected, match="stale"):
        verifier.verify("GET", "/", b"", captured)  # ...and its calls are stale


def test_unknown_senders_are_rejected_when_the_cluster_is_known() -> None:
    clock = Clock()
    members = [1, 2, 3]

    def call(sender: int) -> str:
        return NodeCallSigner(SECRET, sender, clock=clock).sign("GET", "/", b"", None, receiver=RECEIVER)

    for senders in (members, lambda n: n in members):
        verifier = NodeCallVerifier(SECRET, node_id=RECEIVER, clock=clock, senders=senders)
        assert verifier.verify("GET", "/", b"", call(3)).sender == 3
        with pytest.raises(NodeCallRejected, match="not a node of this cluster"):
            verifier.verify("GET", "/", b"", call(9))
    members.append(9)  # a node that joins (a live view of the cluster): its calls are taken at once
    assert verifier.verify("GET", "/", b"", call(9)).sender == 9


def test_counters_are_per_receiver() -> None:
    signer, _, _ = pair()
    nonces = [fields(signer.sign("GET", "/", b"", None, receiver=r))["c"].split(".")[1] for r in (1, 2, 1, 2, 3)]
    assert nonces == ["1", "1", "2", "2", "1"]


def _garbage(valid: str) -> list[str]:
    f = fields(valid)
    return [
        "",
        " ",
        "v1",
        "v1 ",
        "v2 " + valid[3:],
        valid + ",",
        valid + " ",
        " " + valid,
        valid.replace(",", ";"),
        valid.upper(),
        valid[:-1],
        rebuild({**f, "s": f["s"].upper()}),
        rebuild({**f, "n": "-1"}),
        rebuild({**f, "n": "01"}),
        rebuild({**f, "n": "99999999999"}),
        rebuild({**f, "t": "1e9"}),
        rebuild({**f, "t": "9" * 40}),
        rebuild({**f, "c": "zz" * 8 + ".1"}),
        rebuild({**f, "c": f["c"].split(".")[0]}),
        rebuild({**f, "c": f["c"].split(".")[0] + ".99999999999999999999"}),
        rebuild({**f, "p": "!!!"}),
        rebuild({**f, "p": "A"}),  # not base64 of anything
        rebuild({**f, "p": base64.urlsafe_b64encode(b"\xff\xfe").rstrip(b"=").decode()}),
        rebuild({**f, "p": base64.urlsafe_b64encode(b"User:\n").rstrip(b"=").decode()}),
        "v1 n=2,t=1,c=" + "0" * 16 + ".1,p=,s=" + "0" * 64 + ",x=1",
        "v1 s=" + f["s"] + ",n=2,t=" + f["t"] + ",c=" + f["c"] + ",p=",
        "\u00e9" * 100,
        "v1 n=\u0662,t=1,c=" + "0" * 16 + ".1,p=,s=" + "0" * 64,  # a non-ASCII digit
        valid + "\udcff",  # what surrogateescape makes of a hostile byte
        "\x00" * 10,
        "x" * 100_000,
        valid + "," + valid,
    ]


def test_garbage_headers_are_rejected_never_another_exception() -> None:
    signer, verifier, _ = pair()
    valid = signer.sign("POST", PATH, BODY, "User:alice", receiver=RECEIVER)
    for garbage in _garbage(valid):
        with pytest.raises(NodeCallRejected):
            verifier.verify("POST", PATH, BODY, garbage)
    # a request target no signer could have signed
    for method, path in (("post", PATH), ("P\u00d6ST", PATH), ("POST", "/\u00e9"), ("POST", "/\udcff")):
        with pytest.raises(NodeCallRejected):
            verifier.verify(method, path, BODY, valid)
    assert verifier.verify("POST", PATH, BODY, valid).principal == "User:alice"


def test_the_signer_refuses_what_it_cannot_sign_exactly() -> None:
    signer, _, _ = pair()
    for method, path, principal in (
        ("POST", "/\u00e9", None),  # the target is signed as sent: ASCII
        ("POST", "/a b", None),
        ("POST", "/a#b", None),
        ("POST", "relative", None),
        ("post", "/", None),
        ("POST", "/", ""),
        ("POST", "/", "User:\n"),
        ("POST", "/", "User:" + "x" * 600),
    ):
        with pytest.raises(ValueError, match=r"method|target|principal|fragment"):
            signer.sign(method, path, b"", principal, receiver=RECEIVER)


def test_a_precomputed_body_digest_is_the_same_as_hashing() -> None:
    signer, verifier, _ = pair()
    header = signer.sign("POST", PATH, b"", None, receiver=RECEIVER, body_digest=body_sha256(BODY))
    assert verifier.verify("POST", PATH, BODY, header).sender == 2
    header = signer.sign("POST", PATH, BODY, None, receiver=RECEIVER)
    assert verifier.verify("POST", PATH, b"", header, body_digest=body_sha256(BODY)).sender == 2
