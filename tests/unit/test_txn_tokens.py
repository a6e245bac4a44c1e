"""Tokens and receipts of carried markers, and how produce requests carry tokens (docs/carried-markers.md)."""

from __future__ import annotations

import pytest

from clients.protocol import (
    BrokerError,
    ControlType,
    ErrorCode,
    ProducePartition,
    ProduceRequest,
    Record,
    decode_produce_request,
    decode_token,
    encode_batch,
    encode_produce_request,
    encode_token,
)
from cluster.http.parsing import parse_json_produce
from cluster.txn import CarriedMarker, TxnTokens

TID, PID, EPOCH = "tx", 42, 7
MARK = CarriedMarker(ControlType.ABORT, 12)


def test_a_token_opens_only_for_the_batch_it_was_made_for() -> None:
    tokens = TxnTokens("secret")
    tok = tokens.token(TID, PID, EPOCH, "t", 1, MARK)
    assert tokens.open_token(tok, TID, PID, EPOCH, "t", 1) == MARK
    others = [("other", PID, EPOCH, "t", 1), (TID, PID + 1, EPOCH, "t", 1), (TID, PID, EPOCH + 1, "t", 1),
              (TID, PID, EPOCH, "u", 1), (TID, PID, EPOCH, "t", 2)]  # fmt: skip
    for fields in others:
        with pytest.raises(BrokerError) as exc:
            tokens.open_token(tok, *fields)
        assert exc.value.error_code is ErrorCode.INVALID_REQUEST, fields
    # Another cluster's key, a flipped bit, a truncation, another control type: all refused.
    commit_head = tokens.token(TID, PID, EPOCH, "t", 1, CarriedMarker(ControlType.COMMIT, 12))[:6]
    tampered = [TxnTokens("other").token(TID, PID, EPOCH, "t", 1, MARK), tok[:1] + bytes([tok[1] ^ 1]) + tok[2:],
                tok[:-1], commit_head + tok[6:]]  # fmt: skip
    for raw in tampered:
        with pytest.raises(BrokerError):
            tokens.open_token(raw, TID, PID, EPOCH, "t", 1)


def test_receipts_check_every_field() -> None:
    tokens = TxnTokens("secret")
    r = tokens.receipt(TID, PID, EPOCH, "t", 0)
    assert tokens.check_receipt(r, TID, PID, EPOCH, "t", 0)
    assert not tokens.check_receipt(r, TID, PID, EPOCH, "t", 1)
    assert not tokens.check_receipt(r, TID, PID, EPOCH - 1, "t", 0)
    assert not tokens.check_receipt(r[:-1], TID, PID, EPOCH, "t", 0)
    assert not TxnTokens("other").check_receipt(r, TID, PID, EPOCH, "t", 0)
    # A receipt is not a token for the same fields, and a token is no receipt.
    tok = tokens.token(TID, PID, EPOCH, "t", 0, MARK)
    assert not tokens.check_receipt(tok, TID, PID, EPOCH, "t", 0)


def test_wire_form_round_trips_and_refuses_garbage() -> None:
    raw = bytes(range(22))
    assert decode_token(encode_token(raw), "x") == raw and "=" not in encode_token(raw)
    with pytest.raises(BrokerError) as exc:
        decode_token("not base64!", "txn_token")
    assert exc.value.error_code is ErrorCode.INVALID_REQUEST


def test_the_binary_produce_form_carries_tokens_per_partition() -> None:
    b = encode_batch([Record(value=b"v")], producer_id=PID, producer_epoch=EPOCH, base_sequence=0, transactional=True)
    req = ProduceRequest((ProducePartition("t", 0, b, b"tok"), ProducePartition("t", 1, b)), transactional_id=TID)
    raw = encode_produce_request(req)
    assert raw[:4] == b"TXP2" and decode_produce_request(raw) == req
    plain = ProduceRequest((ProducePartition("t", 1, b),), transactional_id=TID)
    assert (
        encode_produce_request(plain)[:4] == b"TXP1" and decode_produce_request(encode_produce_request(plain)) == plain
    )
    for bad in (raw[:-1], raw + b"x", raw.replace(b"\x00\x03tok", b"\x7f\xfftok")):
        with pytest.raises(BrokerError) as exc:
            decode_produce_request(bad)
        assert exc.value.error_code is ErrorCode.INVALID_REQUEST


def test_the_json_produce_form_takes_a_token_only_for_transactional_writes() -> None:
    part = {"topic": "t", "partition": 0, "producer_id": PID, "producer_epoch": EPOCH, "base_sequence": 0,
            "records": [{"value": "dg=="}], "txn_token": encode_token(b"tok")}  # fmt: skip
    req = parse_json_produce({"transactional_id": TID, "partitions": [part]})
    assert req.partitions[0].txn_token == b"tok"
    for body in ({"partitions": [part]}, {"transactional_id": TID, "partitions": [{**part, "txn_token": "%%"}]},
                 {"transactional_id": TID, "partitions": [{**part, "txn_token": "A" * 400}]}):  # fmt: skip
        with pytest.raises(BrokerError) as exc:
            parse_json_produce(body)
        assert exc.value.error_code is ErrorCode.INVALID_REQUEST, body
