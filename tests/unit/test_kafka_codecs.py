"""Bounded decompression of Kafka batches' records (storage.kafka_codecs), with Kafka clients' own encoders."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import snappy
import zstandard
from kafka import codec

from clients.protocol import BrokerError, ErrorCode
from storage.kafka_codecs import CODEC_GZIP, CODEC_LZ4, CODEC_SNAPPY, CODEC_ZSTD, decompress

DATA = b"records of a batch " * 2000
ENCODERS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "gzip": (CODEC_GZIP, codec.gzip_encode),
    "snappy-xerial": (CODEC_SNAPPY, lambda d: codec.snappy_encode(d, xerial_compatible=True)),
    "snappy-raw": (CODEC_SNAPPY, snappy.compress),
    "lz4": (CODEC_LZ4, codec.lz4_encode),
    "zstd": (CODEC_ZSTD, codec.zstd_encode),
}


def _code(kind: int, data: bytes, limit: int) -> ErrorCode:
    with pytest.raises(BrokerError) as err:
        decompress(kind, data, limit)
    return err.value.error_code


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_what_a_client_compressed_comes_back(name: str) -> None:
    kind, encode = ENCODERS[name]
    assert decompress(kind, encode(DATA), len(DATA)) == DATA


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_one_byte_over_the_limit_is_message_too_large(name: str) -> None:
    kind, encode = ENCODERS[name]
    assert _code(kind, encode(DATA), len(DATA) - 1) is ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_a_truncated_stream_is_corrupt(name: str) -> None:
    kind, encode = ENCODERS[name]
    assert _code(kind, encode(DATA)[:-7], len(DATA)) is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("name", ["gzip", "lz4", "zstd", "snappy-xerial"])
def test_bytes_after_the_stream_are_corrupt(name: str) -> None:
    kind, encode = ENCODERS[name]
    assert _code(kind, encode(DATA) + b"\x01\x02\x03", len(DATA)) is ErrorCode.CORRUPT_MESSAGE


def test_several_gzip_members_and_zstd_frames_read_as_one_stream() -> None:
    half = len(DATA) // 2
    gz = codec.gzip_encode(DATA[:half]) + codec.gzip_encode(DATA[half:])
    assert decompress(CODEC_GZIP, gz, len(DATA)) == DATA
    z = zstandard.ZstdCompressor()
    frames = z.compress(DATA[:half]) + z.compress(DATA[half:])
    assert decompress(CODEC_ZSTD, frames, len(DATA)) == DATA
    assert _code(CODEC_ZSTD, frames, len(DATA) - 1) is ErrorCode.MESSAGE_TOO_LARGE


def test_a_raw_snappy_block_is_refused_by_its_stated_length_before_decompressing() -> None:
    bomb = snappy.compress(bytes(50 << 20))
    assert len(bomb) < 3 << 20
    assert _code(CODEC_SNAPPY, bomb, 1 << 20) is ErrorCode.MESSAGE_TOO_LARGE


def test_an_unknown_codec_is_unsupported() -> None:
    assert _code(5, b"x", 10) is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
