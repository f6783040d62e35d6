"""The arithmetic of an access-count upload, apart from the database: repeated ids summed and
sorted, sums saturating at int64's largest value, and the Idempotency-Key's fingerprint telling
different uploads apart."""

from __future__ import annotations

from collections import Counter

import numpy as np

from app.migration.access import INT64_MAX, _fingerprinted, summed


def _reference(ids: list[str], counts: np.ndarray) -> tuple[list[str], list[int]]:
    totals: Counter[str] = Counter()
    for item_id, count in zip(ids, counts.tolist(), strict=True):
        totals[item_id] += count
    keys = sorted(totals)
    return keys, [min(totals[k], INT64_MAX) for k in keys]


def test_repeated_ids_are_summed_in_id_order() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 7, 500):
        ids = [f"id-{i}" for i in rng.integers(0, max(1, n // 3), size=n)]
        counts = rng.integers(0, 1000, size=n, dtype=np.int64)
        keys, sums = summed(ids, counts)
        assert (keys, sums.tolist()) == _reference(ids, counts)
        assert sums.dtype == np.int64


def test_sums_saturate_at_the_largest_int64() -> None:
    ids = ["b", "a", "b", "c"]
    counts = np.array([INT64_MAX, 5, INT64_MAX - 1, INT64_MAX // 2], dtype=np.int64)
    keys, sums = summed(ids, counts)
    assert keys == ["a", "b", "c"]
    assert sums.tolist() == [5, INT64_MAX, INT64_MAX // 2]


def test_the_fingerprint_tells_uploads_apart() -> None:
    class G:
        id = "gal_x"

    def fp(ids: list[str], counts: list[int]) -> str:
        request = _fingerprinted("k", G(), ids, np.array(counts, dtype=np.int64))  # type: ignore[arg-type]
        assert request is not None
        return request.fingerprint

    same = fp(["a", "b"], [1, 2])
    assert fp(["a", "b"], [1, 2]) == same
    others = {fp(["ab"], [1]), fp(["a", "b"], [2, 1]), fp(["b", "a"], [1, 2]), fp(["a"], [1])}
    assert same not in others and len(others) == 4
