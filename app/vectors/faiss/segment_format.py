"""The bytes of a segment file: a sequence of checksummed batches, pure encode/decode.

A batch (little-endian, every batch starts and ends on an 8-byte boundary):

    header  magic b"NBSG" | format u8 | op u8 | reserved u16 | count u32 | dim u32
            | payload length u64 | reserved u32 | crc32 u32                      (32 bytes)
    payload ids int64[count]
            item-id lengths uint32[count], UTF-8 bytes            (upserts only from here)
            label lengths int32[count] (−1: none), UTF-8 bytes
            metadata lengths int32[count] (−1: none), JSON bytes
            zero padding to 8 bytes, vectors float32[count × dim]
            zero padding to 8 bytes

The CRC32 covers the header's other 28 bytes and the payload, so a torn or flipped byte anywhere
in a batch is caught when it is read. Vectors sit 8-byte aligned in the file, so a reader maps
the file and views them as float32 rows without copying the batch.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"NBSG"
FORMAT = 1
UPSERT = 1
DELETE = 2
HEADER = struct.Struct("<4sBBHIIQII")
HEADER_SIZE = HEADER.size
CHECKED = 28  # header bytes covered by the checksum (all before the crc field)


class SegmentCorrupted(Exception):
    """A batch inside the committed part of a segment fails its checksum or does not parse."""


class SegmentMissing(SegmentCorrupted):
    """A segment file the manifest names is not there: damage, unless the manifest is stale (a
    newer committed one no longer names the file, deleted after another process compacted)."""


def _pad(n: int) -> int:
    return -n % 8


def _strings(values: Sequence[str | None], nullable: bool) -> tuple[bytes, bytes]:
    encoded = [None if v is None else v.encode("utf-8") for v in values]
    lengths = np.fromiter(
        (-1 if e is None else len(e) for e in encoded),
        dtype="<i4" if nullable else "<u4",
        count=len(encoded),
    )
    return lengths.tobytes(), b"".join(e for e in encoded if e is not None)


def encode_upsert(
    ids: np.ndarray,
    item_ids: Sequence[str],
    labels: Sequence[str | None],
    metadata: Sequence[dict[str, Any] | None],
    vectors: np.ndarray,
) -> bytes:
    dim = vectors.shape[1]
    meta_text = [None if m is None else json.dumps(m, separators=(",", ":")) for m in metadata]
    parts = [np.ascontiguousarray(ids, dtype="<i8").tobytes()]
    for values, nullable in ((item_ids, False), (labels, True), (meta_text, True)):
        parts.extend(_strings(values, nullable))
    head = sum(len(p) for p in parts)
    parts.append(b"\0" * _pad(HEADER.size + head))
    block = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    parts.append(block)
    parts.append(b"\0" * _pad(len(block)))
    return _frame(UPSERT, len(item_ids), dim, b"".join(parts))


def vector_offset(batch: bytes, shape: tuple[int, int]) -> int:
    """Offset of the vector block inside an encoded upsert batch of ``shape`` vectors."""
    block = 4 * shape[0] * shape[1]
    return len(batch) - _pad(block) - block


def encode_delete(ids: np.ndarray) -> bytes:
    payload = np.ascontiguousarray(ids, dtype="<i8").tobytes()
    return _frame(DELETE, len(ids), 0, payload)


def _frame(op: int, count: int, dim: int, payload: bytes) -> bytes:
    prefix = HEADER.pack(MAGIC, FORMAT, op, 0, count, dim, len(payload), 0, 0)[:CHECKED]
    crc = zlib.crc32(payload, zlib.crc32(prefix))
    return prefix + struct.pack("<I", crc) + payload


@dataclass(frozen=True)
class Batch:
    """One decoded batch. ``vector_offset``: file offset of its first vector row (upserts)."""

    op: int
    ids: np.ndarray
    item_ids: list[str]
    labels: list[str | None]
    metadata: list[dict[str, Any] | None]
    vector_offset: int
    dim: int


def _take_strings(
    buf: memoryview, pos: int, count: int, nullable: bool
) -> tuple[list[str | None], int]:
    lengths = np.frombuffer(buf, dtype="<i4" if nullable else "<u4", count=count, offset=pos)
    pos += 4 * count
    out: list[str | None] = []
    for n in lengths.tolist():
        if n < 0:
            out.append(None)
        else:
            out.append(str(buf[pos : pos + n], "utf-8"))
            pos += n
    return out, pos


def decode(data: bytes, base: int, where: str) -> Iterator[tuple[Batch, int]]:
    """Batches of ``data`` (the bytes of a file from offset ``base``), each with the offset just
    after it. Any damage raises ``SegmentCorrupted`` naming ``where`` and the offset."""
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        at = f"{where} at byte {base + pos}"
        if len(data) - pos < HEADER.size:
            raise SegmentCorrupted(f"{at}: truncated batch header")
        magic, fmt, op, _, count, dim, length, _, crc = HEADER.unpack_from(data, pos)
        if magic != MAGIC or fmt != FORMAT or op not in (UPSERT, DELETE):
            raise SegmentCorrupted(f"{at}: not a batch header")
        start = pos + HEADER.size
        end = start + length
        if end > len(data):
            raise SegmentCorrupted(f"{at}: batch runs past the committed end")
        if zlib.crc32(view[start:end], zlib.crc32(view[pos : pos + CHECKED])) != crc:
            raise SegmentCorrupted(f"{at}: checksum mismatch")
        try:
            yield _parse(view[start:end], op, count, dim, base + start), base + end
        except (ValueError, UnicodeDecodeError) as exc:
            raise SegmentCorrupted(f"{at}: {exc}") from exc
        pos = end


def _parse(payload: memoryview, op: int, count: int, dim: int, file_offset: int) -> Batch:
    ids = np.frombuffer(payload, dtype="<i8", count=count).astype(np.int64)
    if op == DELETE:
        return Batch(op, ids, [], [], [], 0, 0)
    pos = 8 * count
    item_ids, pos = _take_strings(payload, pos, count, False)
    labels, pos = _take_strings(payload, pos, count, True)
    meta_text, pos = _take_strings(payload, pos, count, True)
    pos += _pad(HEADER.size + pos)
    if pos + 4 * count * dim > len(payload):
        raise ValueError("vector block runs past the batch")
    metadata = [None if m is None else json.loads(m) for m in meta_text]
    return Batch(op, ids, item_ids, labels, metadata, file_offset + pos, dim)  # type: ignore[arg-type]
