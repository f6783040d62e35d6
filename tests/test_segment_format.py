"""Segment batches: what is encoded decodes unchanged; any flipped or missing byte is caught."""

from __future__ import annotations

import numpy as np
import pytest

from app.vectors.faiss.segment_format import (
    DELETE,
    UPSERT,
    SegmentCorrupted,
    decode,
    encode_delete,
    encode_upsert,
)


def sample(n: int = 5, dim: int = 3) -> tuple:
    rng = np.random.default_rng(0)
    ids = np.arange(10, 10 + n, dtype=np.int64)
    items = [f"item-{i}-é" for i in range(n)]
    labels = [None if i % 2 else f"class {i}" for i in range(n)]
    metadata = [None if i % 3 else {"n": i, "tags": ["a", "ß"]} for i in range(n)]
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    return ids, items, labels, metadata, vectors


def test_batches_round_trip_with_aligned_vectors() -> None:
    ids, items, labels, metadata, vectors = sample()
    data = encode_upsert(ids, items, labels, metadata, vectors) + encode_delete(ids[:2])
    assert len(data) % 8 == 0
    base = 4096
    decoded = list(decode(data, base, "test"))
    assert [b.op for b, _ in decoded] == [UPSERT, DELETE]
    upsert, end = decoded[0]
    assert upsert.ids.tolist() == ids.tolist() and upsert.item_ids == items
    assert upsert.labels == labels and upsert.metadata == metadata
    assert upsert.vector_offset % 8 == 0
    start = upsert.vector_offset - base
    block = np.frombuffer(data[start : start + vectors.nbytes], dtype="<f4").reshape(vectors.shape)
    np.testing.assert_array_equal(block, vectors)
    assert decoded[1][0].ids.tolist() == ids[:2].tolist()
    assert decoded[1][1] == base + len(data) and end < decoded[1][1]


@pytest.mark.parametrize("position", [0, 5, 30, 40, -12, -1])
def test_a_flipped_byte_is_caught(position: int) -> None:
    data = bytearray(encode_upsert(*sample()))
    data[position] ^= 0x40
    with pytest.raises(SegmentCorrupted):
        list(decode(bytes(data), 0, "test"))


def test_a_torn_batch_is_caught() -> None:
    data = encode_upsert(*sample()) + encode_upsert(*sample())
    for cut in (len(data) - 1, len(data) // 2 + 7, 20):
        with pytest.raises(SegmentCorrupted):
            list(decode(data[:cut], 0, "test"))
