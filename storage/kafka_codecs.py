"""Bounded decompression of a Kafka batch's records (gzip, snappy, lz4, zstd).

A compressed batch of a few KiB can expand to gigabytes. Every codec here
stops once the output would pass ``limit`` bytes and raises
``BrokerError(MESSAGE_TOO_LARGE)``, so a hostile batch costs at most ``limit``
bytes of memory; a stream that does not decode raises
``BrokerError(CORRUPT_MESSAGE)``. The codecs are the maintained libraries
Kafka's Python clients use: zlib (stdlib), python-snappy, lz4 and zstandard.

Framings, as Kafka producers write them: gzip is one or more gzip members;
lz4 is the LZ4 frame format; zstd one or more zstd frames; snappy either
raw snappy (librdkafka with ``snappy``) or the xerial framing of the Java
client (a magic header, then blocks of ``u32 length | raw snappy``). Raw
snappy states its uncompressed length up front, which is checked before
anything is decompressed.

Pure functions; any thread.
"""

from __future__ import annotations

import struct
import zlib

import lz4.frame
import snappy
import zstandard

from clients.protocol import BrokerError, ErrorCode

__all__ = ["CODEC_GZIP", "CODEC_LZ4", "CODEC_NONE", "CODEC_SNAPPY", "CODEC_ZSTD", "decompress"]

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic, then version and compatible version (i32 each)
_U32 = struct.Struct(">I")
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZSTD_READ = 1 << 20


def _too_large(limit: int) -> BrokerError:
    return BrokerError(ErrorCode.MESSAGE_TOO_LARGE, f"the batch's records decompress to more than {limit} bytes")


def _corrupt(codec: str, why: object) -> BrokerError:
    return BrokerError(ErrorCode.CORRUPT_MESSAGE, f"{codec}-compressed records do not decompress: {why}")


def decompress(codec: int, data: bytes | bytearray | memoryview, limit: int) -> bytes:
    """The decompressed records of a batch compressed with ``codec`` (1-4), at most ``limit`` bytes."""
    if codec == CODEC_GZIP:
        return _gzip(data, limit)
    if codec == CODEC_SNAPPY:
        return _snappy(bytes(data), limit)
    if codec == CODEC_LZ4:
        return _lz4(data, limit)
    if codec == CODEC_ZSTD:
        return _zstd(data, limit)
    raise BrokerError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression type {codec}")


def _gzip(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    size = 0
    rest = bytes(data)
    try:
        while rest:  # one member after another, as Java's GZIPInputStream reads them
            d = zlib.decompressobj(_GZIP_WBITS)
            chunk = d.decompress(rest, limit - size + 1)
            size += len(chunk)
            if size > limit or d.unconsumed_tail:
                raise _too_large(limit)
            if not d.eof:
                raise _corrupt("gzip", "the stream ends early")
            out.append(chunk)
            rest = d.unused_data
    except zlib.error as exc:
        raise _corrupt("gzip", exc) from exc
    if not out:
        raise _corrupt("gzip", "no data")
    return b"".join(out)


def _raw_snappy_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block starts with (a little-endian base-128 varint)."""
    value = shift = 0
    for i, byte in enumerate(block[:5]):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if i == 4:
            break
    raise _corrupt("snappy", "no uncompressed length")


def _snappy_block(block: bytes, budget: int, limit: int) -> bytes:
    if _raw_snappy_length(block) > budget:
        raise _too_large(limit)
    try:
        out: bytes = snappy.uncompress(block)
    except Exception as exc:  # python-snappy reports a damaged block with its own exception types
        raise _corrupt("snappy", exc) from exc
    return out


def _snappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, limit, limit)
    out: list[bytes] = []
    size, pos = 0, _XERIAL_HEADER
    while pos < len(data):
        if pos + 4 > len(data):
            raise _corrupt("snappy", "a truncated block length")
        (length,) = _U32.unpack_from(data, pos)
        block = data[pos + 4 : pos + 4 + length]
        if len(block) != length:
            raise _corrupt("snappy", "a truncated block")
        chunk = _snappy_block(block, limit - size, limit)
        size += len(chunk)
        out.append(chunk)
        pos += 4 + length
    return b"".join(out)


def _lz4(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    d = lz4.frame.LZ4FrameDecompressor()
    try:
        out: bytes = d.decompress(bytes(data), max_length=limit + 1)
    except RuntimeError as exc:  # the lz4 binding's error for a damaged frame
        raise _corrupt("lz4", exc) from exc
    if len(out) > limit or (not d.eof and not d.needs_input):  # output was cut at max_length
        raise _too_large(limit)
    if not d.eof:
        raise _corrupt("lz4", "the frame ends early")
    if d.unused_data:
        raise _corrupt("lz4", f"{len(d.unused_data)} bytes after the frame")
    return out


def _zstd(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    size = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(bytes(data), read_across_frames=True) as reader:
            while chunk := reader.read(min(_ZSTD_READ, limit - size + 1)):
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                out.append(chunk)
    except zstandard.ZstdError as exc:
        raise _corrupt("zstd", exc) from exc
    if not out:
        raise _corrupt("zstd", "no data")
    return b"".join(out)
