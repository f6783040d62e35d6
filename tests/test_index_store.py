"""IndexStore under concurrent reads and writes: a reader that read the gallery before a write
committed asks for an older version than the one in memory. It gets the newer index (a later,
valid view) instead of a rebuild from the database at its version, which also set the store back
to that version, so the writer's next in-place patch found the wrong version and rebuilt too: under
bench.perf.load (8 searchers, 1 uploader) most of the server's time went to those rebuilds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.vectors.faiss.index_store import IndexSpec, IndexStore

DIM = 8


def _spec(version: int) -> IndexSpec:
    return IndexSpec("g1", version, DIM, 1.0, "flat", {})


class Loader:
    """The database's rows at the newest version, counting the rebuilds that read them."""

    def __init__(self, ids: np.ndarray, points: np.ndarray) -> None:
        self.ids, self.points, self.calls = ids, points, 0

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        return self.ids, self.points


@pytest.fixture
def rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return np.arange(20, dtype=np.int64), rng.standard_normal((20, DIM)).astype(np.float32)


@pytest.mark.parametrize("flush_interval_s", [0.0, 60.0])
def test_a_reader_behind_a_write_gets_the_newer_index_and_nothing_is_rebuilt(
    tmp_path: Path, rows: tuple[np.ndarray, np.ndarray], flush_interval_s: float
) -> None:
    ids, points = rows
    store = IndexStore(tmp_path, flush_interval_s=flush_interval_s)
    loader = Loader(ids[:10], points[:10])
    first = store.get(_spec(1), loader)
    assert loader.calls == 1 and first.ntotal == 10
    # A write commits version 2 and patches the index in memory.
    loader.ids, loader.points = ids[:15], points[:15]
    store.apply(_spec(2), 1, loader, upsert_ids=ids[10:15], upsert_points=points[10:15])
    assert loader.calls == 1
    # A search that read the gallery at version 1, before that commit.
    behind = store.get(_spec(1), loader)
    assert loader.calls == 1, "the reader rebuilt an index the store already holds, newer"
    assert behind.ntotal == 15
    assert store.current_version("g1") == 2
    # The next write still finds version 2 in memory and patches it.
    loader.ids, loader.points = ids, points
    store.apply(_spec(3), 2, loader, upsert_ids=ids[15:], upsert_points=points[15:])
    assert loader.calls == 1
    assert np.array_equal(np.sort(store.get(_spec(3), loader).ids), ids)
    assert loader.calls == 1


def test_a_reader_ahead_of_memory_still_rebuilds_at_its_version(
    tmp_path: Path, rows: tuple[np.ndarray, np.ndarray]
) -> None:
    """Another process committed version 2: this process's version 1 is behind, so the reader
    rebuilds from the database (what it would do without a cached index at all)."""
    ids, points = rows
    store = IndexStore(tmp_path)
    loader = Loader(ids[:10], points[:10])
    store.get(_spec(1), loader)
    loader.ids, loader.points = ids, points
    ahead = store.get(_spec(2), loader)
    assert loader.calls == 2 and ahead.ntotal == 20
    assert store.current_version("g1") == 2
