"""Exact hyperbolic k-NN over FAISS: the Lorentz lift turns nearest points into largest inner
products, then an exact float64 re-rank repairs float32 cancellation far from the origin.

A gallery point x (space components, curvature −c) is indexed as x̃ = (x₀, x) and a query q is
searched as q̃ = (−q₀, q), so q̃·x̃ = ⟨q,x⟩_L and larger scores are nearer points. FAISS computes in
float32, where x·q − x₀q₀ cancels badly at large radii; so FAISS only proposes an over-fetched
candidate list and the final order and distances come from the float64 formula on the stored
points. Pure: no files, no database (``to_bytes``/``from_bytes`` for whoever persists it).
"""

from __future__ import annotations

import io
import json
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

import faiss
import numpy as np
import torch

from app.vectors.faiss.shared_lock import SharedLock
from app.vectors.lorentz_rows import (
    exact_distances,
    exact_distances_and_cosines,
    lifted_gallery,
    lifted_queries,
    nearest_first,
)
from app.vectors.rerank import RERANK_BUDGET
from app.vectors.scans import flat_scan, top_inner_products

IndexKind = Literal["flat", "ivf", "hnsw"]
INDEX_KINDS: tuple[str, ...] = ("flat", "ivf", "hnsw")
DEFAULT_PARAMS: dict[str, dict[str, int]] = {
    "flat": {},
    "ivf": {"nlist": 64, "nprobe": 8},
    "hnsw": {"m": 32, "ef_construction": 80, "ef_search": 64},
}
# IVF is retrained once the gallery has grown this many times past its training size.
IVF_RETRAIN_GROWTH = 4
# 2: lifted rows stored (not the space components); FAISS serialised only where its structure
# costs more than a copy to rebuild (IVF, HNSW). Files of another format are rebuilt.
FORMAT = 2
# Float64 values a candidate search's exact re-score works on at once (queries × candidates ×
# dim): 1 MiB, blocks that stay in cache (at depth 200 and 384 dimensions a re-score of 256
# queries in one 157 MB block cost about 4× what it costs in these).
CANDIDATE_BLOCK = 2**17
# Which engine scores a flat gallery exactly: "auto", "torch" (matrix product) or "faiss" (flat
# scan). IVF and HNSW always search through FAISS. "auto" on a CPU lets FAISS scan batches of fewer
# than FAISS_BELOW_BATCH queries and torch the rest: on the quiet 2-core benchmark machine, at 100k
# and 1M rows, FAISS scanned 1 and 2 queries 1.5–3× faster than torch (whose matrix-vector path
# reads the gallery once per query), the two were about even at 4, and torch won from 8 up, 3–4×
# at 256 (`python -m bench.perf.search --batches 1 2 4 8`, BENCHMARKS.md). A GPU's torch scan takes
# every batch.
FAISS_BELOW_BATCH = 4
# Torch scans an exclusion (a partial backfill's re-embedded items) of at least this share of the
# rows over a copy of the other rows (made once per exclusion and state of the rows) when it fits
# in COMPACT_SCAN_BYTES; else every row, the excluded ones biased to −inf.
COMPACT_SCAN_SHARE = 0.1
COMPACT_SCAN_BYTES = 2**30
SearchEngine = Literal["auto", "torch", "faiss"]
SEARCH_ENGINES: tuple[str, ...] = ("auto", "torch", "faiss")


def validate_index_params(kind: str, params: dict[str, Any]) -> dict[str, int]:
    """Defaults filled in; unknown keys or non-positive values raise ``ValueError`` (→ 422)."""
    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown index kind {kind!r}, expected one of {list(INDEX_KINDS)}")
    allowed = DEFAULT_PARAMS[kind]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {kind} parameters {unknown}, allowed: {sorted(allowed)}")
    merged = {**allowed, **params}
    for key, value in merged.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65536:
            raise ValueError(f"{key} must be an integer in [1, 65536]")
    return merged


def faiss_gpu_count() -> int:
    """GPUs FAISS can use: 0 on CPU builds (which lack ``StandardGpuResources``)."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


class Candidates(NamedTuple):
    """A candidate search's answer (``LorentzIndex.search_candidates``), nq × n each."""

    ids: np.ndarray  # int64, −1 padded
    distances: np.ndarray  # float64 exact Lorentz distances, inf padded; nearest first
    cosines: np.ndarray | None  # float64 cos(q, x) of the space components (0 padded), if asked


class _Rows(NamedTuple):
    """One consistent state of the stored rows: a search reads it once, writers replace it."""

    lifted: np.ndarray  # N × (d+1) float32: (x₀, x); the space components are [:, 1:]
    ids: np.ndarray  # N int64
    tensor: torch.Tensor  # ``lifted`` as a tensor sharing its memory (or a device copy)


def _rows_of(lifted: np.ndarray, ids: np.ndarray) -> _Rows:
    return _Rows(lifted, ids, torch.from_numpy(lifted))


class LorentzIndex:
    """Points (space components, float32) by int64 id, searchable by exact Lorentz distance.

    The lifted rows are kept in one growing float32 buffer: a flat gallery is scanned exactly by
    torch's matrix product (``engine``; FAISS's flat scan on request), IVF and HNSW through FAISS,
    which stays the index of record for ids and structure. Writes must be serialised by the
    caller; searches may run concurrently with each other and with a write: each reads one
    consistent state of the rows (published rows are never changed in place), a flat scan reads
    only those, and a search of a FAISS structure (HNSW, IVF, a GPU copy) shares a lock that a
    write holds alone (FAISS changes its structures in place, outside the GIL).
    """

    def __init__(
        self,
        dim: int,
        curv: float,
        kind: str = "flat",
        params: dict[str, Any] | None = None,
        *,
        use_gpu: bool = False,
        engine: str = "auto",
    ) -> None:
        if dim < 1 or not curv > 0:
            raise ValueError("dim must be ≥ 1 and curv > 0")
        if engine not in SEARCH_ENGINES:
            raise ValueError(f"unknown search engine {engine!r}, expected one of {SEARCH_ENGINES}")
        self.dim = dim
        self.curv = float(curv)
        self.kind = kind
        self.params = validate_index_params(kind, params or {})
        self.engine = engine
        self.scan_exactly = kind == "flat" and engine != "faiss"
        # A torch scan runs on the GPU when torch sees one; FAISS's only on GPU builds of FAISS.
        self.scan_device = torch.device(
            "cuda" if use_gpu and self.scan_exactly and torch.cuda.is_available() else "cpu"
        )
        self.use_gpu = (
            use_gpu and kind == "flat" and not self.scan_exactly and faiss_gpu_count() > 0
        )
        # Capacity grows geometrically, so appending a batch copies the buffer O(1) times amortised.
        self._lifted_buffer = np.empty((0, dim + 1), dtype=np.float32)
        self._id_buffer = np.empty(0, dtype=np.int64)
        self._rows = _rows_of(self._lifted_buffer[:0], self._id_buffer[:0])
        self._position: dict[int, int] = {}
        self._trained_size = 0
        self._faiss: faiss.Index | None = self._empty_faiss()
        self._gpu_index: Any = None
        self._gpu_lock = threading.Lock()
        # The last exclusion's rows (see ``_allowed``): (rows, excluded ids, allowed, bitmap, n).
        self._allowed_cache: tuple[_Rows, np.ndarray, np.ndarray, np.ndarray, int] | None = None
        # torch's form of the last exclusion: (allowed array it was made from, bias on a device).
        self._bias_cache: tuple[np.ndarray, torch.Tensor] | None = None
        # The last exclusion's compact rows: (allowed array, their positions, rows on a device).
        self._compact_cache: tuple[np.ndarray, np.ndarray, torch.Tensor] | None = None
        self._device_rows: tuple[_Rows, torch.Tensor] | None = None
        # Shared by searches of the FAISS structure, held alone by writes (see shared_lock).
        self._structure = SharedLock()

    # -- structure ------------------------------------------------------------------------------
    def _empty_faiss(self) -> faiss.Index | None:
        """``IndexIDMap2`` over a flat or HNSW inner-product index; IVF keeps ids itself (its
        inverted lists store them), which is also the only way its removals stay correct: an
        ``IndexIDMap`` compacts its id table on removal while IVF keeps its internal ids.

        None for a flat index on the CPU: its scans read the published rows themselves
        (``flat_scan``), so a FAISS copy would only double the gallery's memory and each
        write's copying. A GPU flat index keeps one, the source of its GPU copy."""
        d = self.dim + 1
        if self.kind == "flat" and not self.use_gpu:
            return None
        if self.kind == "ivf":
            n = self.ntotal
            # FAISS wants ≥ 39 training points per list; fewer lists beat a degenerate training.
            nlist = max(1, min(self.params["nlist"], n // 39))
            ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
            ivf.nprobe = min(self.params["nprobe"], nlist)
            return ivf
        if self.kind == "flat":
            base = faiss.IndexFlatIP(d)
        else:
            base = faiss.IndexHNSWFlat(d, self.params["m"], faiss.METRIC_INNER_PRODUCT)
            base.hnsw.efConstruction = self.params["ef_construction"]
            base.hnsw.efSearch = self.params["ef_search"]
        return faiss.IndexIDMap2(base)

    def _rebuild_faiss(self) -> None:
        self._faiss = self._empty_faiss()
        self._gpu_index = None
        rows = self._rows
        if self._faiss is None or not len(rows.ids):
            self._trained_size = 0
            return
        if self.kind == "ivf":
            self._faiss.train(rows.lifted)
            self._trained_size = len(rows.ids)
        self._faiss.add_with_ids(rows.lifted, rows.ids)

    def _set_rows(self, lifted: np.ndarray, ids: np.ndarray) -> None:
        """Adopt exactly these rows (buffers at their size) and the id → row map."""
        self._lifted_buffer = np.ascontiguousarray(lifted, dtype=np.float32)
        self._id_buffer = np.ascontiguousarray(ids, dtype=np.int64)
        self._rows = _rows_of(self._lifted_buffer, self._id_buffer)
        self._position = {item: pos for pos, item in enumerate(self._id_buffer.tolist())}

    @property
    def faiss_structure(self) -> faiss.Index | None:
        """The FAISS index searches consult (HNSW's graph, IVF's lists, a GPU flat index's
        source); None for a flat index on the CPU, which scans its rows themselves."""
        return self._faiss

    @property
    def ntotal(self) -> int:
        return len(self._rows.ids)

    @property
    def ids(self) -> np.ndarray:
        return self._rows.ids.copy()

    @property
    def lifted(self) -> np.ndarray:
        """The lifted rows (x₀, x), read-only view, in id order of ``ids``."""
        view = self._rows.lifted.view()
        view.flags.writeable = False
        return view

    # -- writes ---------------------------------------------------------------------------------
    def upsert(self, ids: np.ndarray, points: np.ndarray) -> None:
        """Insert or replace points by id (a replaced id moves to the new point)."""
        ids = np.asarray(ids, dtype=np.int64)
        points = np.asarray(points, dtype=np.float32).reshape(len(ids), self.dim)
        with self._structure.exclusive():
            self._upsert(ids, points)

    def _upsert(self, ids: np.ndarray, points: np.ndarray) -> None:
        existing = np.array([i for i in ids.tolist() if i in self._position], dtype=np.int64)
        if len(existing):
            self._remove(existing)
        if not len(ids):
            return
        start, end = self.ntotal, self.ntotal + len(ids)
        if end > len(self._id_buffer):
            # New buffers (never resized in place): a search still reading the old rows keeps
            # a valid view of them.
            capacity = max(end, int(len(self._id_buffer) * 1.5), 1024)
            lifted = np.empty((capacity, self.dim + 1), dtype=np.float32)
            lifted[:start] = self._lifted_buffer[:start]
            id_buffer = np.empty(capacity, dtype=np.int64)
            id_buffer[:start] = self._id_buffer[:start]
            self._lifted_buffer, self._id_buffer = lifted, id_buffer
        # Rows past the published ones: no reader looks there until the new state is published.
        new_rows = lifted_gallery(points, self.curv, out=self._lifted_buffer[start:end])
        self._id_buffer[start:end] = ids
        for offset, item in enumerate(ids.tolist()):
            self._position[item] = start + offset
        self._rows = _rows_of(self._lifted_buffer[:end], self._id_buffer[:end])
        grown = self.kind == "ivf" and (
            self._trained_size == 0 or end > IVF_RETRAIN_GROWTH * self._trained_size
        )
        if grown:
            self._rebuild_faiss()
        elif self._faiss is not None:
            self._faiss.add_with_ids(new_rows, ids)
            self._gpu_index = None

    def remove(self, ids: np.ndarray) -> int:
        """Remove the ids present; returns how many were removed."""
        with self._structure.exclusive():
            return self._remove(ids)

    def _remove(self, ids: np.ndarray) -> int:
        present = [int(i) for i in np.asarray(ids, dtype=np.int64) if int(i) in self._position]
        if not present:
            return 0
        keep = np.ones(self.ntotal, dtype=bool)
        keep[[self._position[i] for i in present]] = False
        rows = self._rows
        self._set_rows(rows.lifted[keep], rows.ids[keep])
        if self.kind == "hnsw":
            # HNSW graphs cannot drop nodes; rebuild from the stored points.
            self._rebuild_faiss()
        elif self._faiss is not None:
            self._faiss.remove_ids(np.asarray(present, dtype=np.int64))
            self._gpu_index = None
        return len(present)

    # -- search ---------------------------------------------------------------------------------
    def _faiss_search(self, lifted: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        assert self._faiss is not None  # only a flat CPU index has none, and it scans its rows
        if not self.use_gpu:
            return self._faiss.search(lifted, m)
        with self._gpu_lock:
            if self._gpu_index is None:
                self._gpu_index = faiss.index_cpu_to_all_gpus(self._faiss)
            return self._gpu_index.search(lifted, m)

    @property
    def can_exclude(self) -> bool:
        """Whether ``search_with_points`` takes ``exclude``: an exact scan (torch, or FAISS's flat
        scan on the CPU) skips excluded rows; HNSW, IVF and GPU FAISS would need a filtered
        search whose recall nothing here measures."""
        return self.kind == "flat" and not self.use_gpu

    def _allowed(self, rows: _Rows, exclude: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(bool per row position: its id is not in ``exclude``, the same as FAISS's little-endian
        bitmap, how many are allowed), kept for one state of the rows and one exclusion list: a
        partial backfill's searches exclude the same re-embedded items until the next write."""
        cached = self._allowed_cache
        if cached is not None and cached[0] is rows and np.array_equal(cached[1], exclude):
            return cached[2], cached[3], cached[4]
        allowed = ~np.isin(rows.ids, exclude)
        bitmap = np.packbits(allowed, bitorder="little")
        count = int(allowed.sum())
        self._allowed_cache = (rows, exclude.copy(), allowed, bitmap, count)
        return allowed, bitmap, count

    def _scan_bias(self, allowed: np.ndarray, device: torch.device) -> torch.Tensor:
        """0 for allowed rows, −inf for excluded ones (float32, on ``device``), made once per
        exclusion (``allowed`` is the cached array ``_allowed`` returned)."""
        cached = self._bias_cache
        if cached is not None and cached[0] is allowed and cached[1].device == device:
            return cached[1]
        bias = torch.from_numpy(np.where(allowed, 0.0, -np.inf).astype(np.float32)).to(device)
        self._bias_cache = (allowed, bias)
        return bias

    def _compact_rows(
        self, rows: _Rows, allowed: np.ndarray, device: torch.device
    ) -> tuple[np.ndarray, torch.Tensor] | None:
        """(row positions, those rows on ``device``) of the allowed rows, made once per exclusion;
        None when the exclusion is small or the copy too large (``COMPACT_SCAN_SHARE``)."""
        cached = self._compact_cache
        if cached is not None and cached[0] is allowed and cached[2].device == device:
            return cached[1], cached[2]
        positions = np.flatnonzero(allowed)
        excluded = len(allowed) - len(positions)
        if excluded < COMPACT_SCAN_SHARE * len(allowed) or (
            len(positions) * rows.tensor.shape[1] * 4 > COMPACT_SCAN_BYTES
        ):
            return None
        compact = rows.tensor[torch.from_numpy(positions)].to(device)
        self._compact_cache = (allowed, positions, compact)
        return positions, compact

    def _torch_candidates(
        self, rows: _Rows, lifted_q: np.ndarray, m: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Row positions (and which are real) of the torch scan's ``m`` best per query: over the
        allowed rows' compact copy where there is one, else over every row (excluded at −inf)."""
        compact = None if allowed is None else self._compact_rows(rows, allowed, self.scan_device)
        kept, bias = None, None
        if compact is None:
            gallery = self._scan_tensor(rows)
            bias = None if allowed is None else self._scan_bias(allowed, gallery.device)
        else:
            kept, gallery = compact
        found = top_inner_products(gallery, torch.from_numpy(lifted_q).to(gallery.device), m, bias)
        positions = found.cpu().numpy() if kept is None else kept[found.cpu().numpy()]
        if allowed is None or kept is not None:
            return positions, np.ones(positions.shape, dtype=bool)
        return positions, allowed[positions]

    def _faiss_candidates(
        self, rows: _Rows, lifted_q: np.ndarray, m: int, bitmap: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Row positions (and which are real) of FAISS's ``m`` best per query.

        Flat and HNSW hold the rows in the same order as ``rows`` (added in order, removed
        in order or rebuilt), so the inner index's labels are row positions; searching it
        directly also skips ``IndexIDMap2``'s label translation, an OpenMP loop that costs a
        thread wake-up (milliseconds on a busy machine) even for one query. IVF stores the
        ids themselves, mapped back through the id → row table."""
        n = len(rows.ids)
        if self.kind == "flat" and not self.use_gpu:
            # FAISS's flat scan over the published rows themselves (what IndexFlatIP.search
            # runs), not over its own copy, which a concurrent write reallocates.
            labels = flat_scan(rows.lifted, lifted_q, m, bitmap)
            valid = (labels >= 0) & (labels < n)
            return np.where(valid, labels, 0), valid
        if isinstance(self._faiss, faiss.IndexIDMap2) and not self.use_gpu:
            _, labels = faiss.downcast_index(self._faiss.index).search(lifted_q, m)
            valid = (labels >= 0) & (labels < n)
            return np.where(valid, labels, 0), valid
        if bitmap is not None:
            raise ValueError("only a flat index on the CPU excludes ids (see can_exclude)")
        _, candidates = self._faiss_search(lifted_q, m)
        valid = candidates >= 0
        positions = np.zeros_like(candidates)
        position = self._position
        positions[valid] = [position[int(c)] for c in candidates[valid]]
        return positions, valid

    def _scans_with_torch(self, n_queries: int) -> bool:
        if not self.scan_exactly:
            return False
        if self.engine == "torch" or self.scan_device.type != "cpu":
            return True
        return n_queries >= FAISS_BELOW_BATCH

    def _scan_tensor(self, rows: _Rows) -> torch.Tensor:
        """The rows on the scan's device (a GPU copy is made once per state of the rows)."""
        if self.scan_device.type == "cpu":
            return rows.tensor
        with self._gpu_lock:
            cached = self._device_rows
            if cached is None or cached[0] is not rows:
                self._device_rows = cached = (rows, rows.tensor.to(self.scan_device))
            return cached[1]

    def search(
        self, queries: np.ndarray, k: int, *, overfetch: int = 4, min_candidates: int = 64
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest ids per query (−1 padded when fewer exist) and float64 distances (inf
        padded), nearest first. The float32 scan proposes max(overfetch·k, k + min_candidates)
        candidates; their order and distances come from the float64 formula."""
        ids, dist, _ = self.search_with_points(
            queries, k, overfetch=overfetch, min_candidates=min_candidates
        )
        return ids, dist

    def search_with_points(
        self,
        queries: np.ndarray,
        k: int,
        *,
        overfetch: int = 4,
        min_candidates: int = 64,
        exclude: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``search`` plus the hits' stored points (nq × k × d float32, NaN padded), read from
        the same state of the rows as the distances (a concurrent write cannot mismatch them).
        ``exclude``: ids never returned, skipped by the scan (only where ``can_exclude``)."""
        queries = np.asarray(queries, dtype=np.float64).reshape(-1, self.dim)
        nq = len(queries)
        out_ids = np.full((nq, k), -1, dtype=np.int64)
        out_dist = np.full((nq, k), np.inf, dtype=np.float64)
        out_points = np.full((nq, k, self.dim), np.nan, dtype=np.float32)
        reads_structure = not self._scans_with_torch(nq) and (self.kind != "flat" or self.use_gpu)
        with self._structure.shared() if reads_structure else nullcontext():
            # The rows and what FAISS proposes from them, read at one state.
            rows = self._rows
            found = self._candidates(rows, queries, k, overfetch, min_candidates, exclude)
        if found is None:
            return out_ids, out_dist, out_points
        positions, valid, m = found
        found_k = min(k, m)
        # The re-rank gathers queries × candidates × dim float64 values: bound that working set.
        chunk = max(1, RERANK_BUDGET // (m * self.dim))
        for start in range(0, nq, chunk):
            part = slice(start, start + chunk)
            ids, dist, points = self._rerank(
                rows, queries[part], positions[part], valid[part], found_k
            )
            out_ids[part, :found_k], out_dist[part, :found_k] = ids, dist
            out_points[part, :found_k] = points
        out_points[out_ids < 0] = np.nan
        return out_ids, out_dist, out_points

    def search_candidates(
        self,
        queries: np.ndarray,
        n: int,
        *,
        cosines: bool = False,
        exclude: np.ndarray | None = None,
    ) -> Candidates:
        """The candidates of a two-stage search's stage one: per query the ``n`` rows the float32
        scan ranks best — no over-fetch beyond them for an exact re-rank: a later stage re-scores
        them, so only their set matters — each re-scored exactly (float64 distance, and with
        ``cosines`` the cosine of the space components, as ``exact_distances_and_cosines``) and
        ordered nearest first, ties by id.

        The set is the exact top n but where float32 rounding swaps rows across the n-th place
        (rows whose exact distances lie within the float32 scan's error of it); the order and
        values within it are those ``search_with_points`` gives the same rows. Far from the
        origin, where the float32 inner product cancels (see the module's docstring), that error
        grows: a search whose hits must be exact uses ``search_with_points``."""
        queries = np.asarray(queries, dtype=np.float64).reshape(-1, self.dim)
        nq = len(queries)
        out_ids = np.full((nq, n), -1, dtype=np.int64)
        out_dist = np.full((nq, n), np.inf, dtype=np.float64)
        out_cos = np.zeros((nq, n), dtype=np.float64) if cosines else None
        reads_structure = not self._scans_with_torch(nq) and (self.kind != "flat" or self.use_gpu)
        with self._structure.shared() if reads_structure else nullcontext():
            rows = self._rows
            found = self._candidates(rows, queries, n, 1, 0, exclude)
        if found is None:
            return Candidates(out_ids, out_dist, out_cos)
        positions, valid, m = found
        # Blocks of queries small enough for the float64 copy of their rows to stay in cache.
        chunk = max(1, CANDIDATE_BLOCK // (m * self.dim))
        for start in range(0, nq, chunk):
            part = slice(start, start + chunk)
            at, ok = positions[part], valid[part]
            dist, cos = exact_distances_and_cosines(
                queries[part, None, :], rows.lifted[at][..., 1:], self.curv, cosines
            )
            dist[~ok] = np.inf
            ids = rows.ids[at]
            order = nearest_first(dist, ids, m)
            top_dist = np.take_along_axis(dist, order, axis=1)
            top_ids = np.take_along_axis(ids, order, axis=1)
            out_ids[part, :m] = np.where(np.isfinite(top_dist), top_ids, -1)
            out_dist[part, :m] = top_dist
            if out_cos is not None and cos is not None:
                top_cos = np.take_along_axis(cos, order, axis=1)
                out_cos[part, :m] = np.where(np.isfinite(top_dist), top_cos, 0.0)
        return Candidates(out_ids, out_dist, out_cos)

    def _candidates(
        self,
        rows: _Rows,
        queries: np.ndarray,
        k: int,
        overfetch: int,
        min_candidates: int,
        exclude: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(row positions, which are real, how many per query) the scan proposes for the
        re-rank; None when there is nothing to search."""
        nq = len(queries)
        n = len(rows.ids)
        allowed = bitmap = None
        searchable = n
        if exclude is not None and len(exclude) and n:
            if not self.can_exclude:
                raise ValueError(f"a {self.kind} index cannot exclude ids from its search")
            allowed, bitmap, searchable = self._allowed(rows, np.asarray(exclude, dtype=np.int64))
        if searchable == 0 or nq == 0:
            return None
        m = min(searchable, max(overfetch * k, k + min_candidates))
        lifted_q = lifted_queries(queries, self.curv)
        if self._scans_with_torch(nq):
            positions, valid = self._torch_candidates(rows, lifted_q, m, allowed)
        else:
            positions, valid = self._faiss_candidates(rows, lifted_q, m, bitmap)
        return positions, valid, m

    def _rerank(
        self,
        rows: _Rows,
        queries: np.ndarray,
        positions: np.ndarray,
        valid: np.ndarray,
        k: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dist = exact_distances(queries[:, None, :], rows.lifted[positions][..., 1:], self.curv)
        dist[~valid] = np.inf
        order = nearest_first(dist, rows.ids[positions], k)
        top_dist = np.take_along_axis(dist, order, axis=1)
        top_positions = np.take_along_axis(positions, order, axis=1)
        top_ids = rows.ids[top_positions]
        top_points = rows.lifted[top_positions][..., 1:]
        return np.where(np.isfinite(top_dist), top_ids, -1), top_dist, top_points

    # -- serialisation --------------------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dim": self.dim,
            "curv": self.curv,
            "kind": self.kind,
            "params": self.params,
            "trained_size": self._trained_size,
        }

    def write_to(self, fh: IO[bytes]) -> None:
        """Serialise into an open binary file, streaming the arrays (no whole copy in memory).

        A flat index's FAISS structure is its rows again, rebuilt on load by a copy; IVF and
        HNSW structures are stored (training and graph building cost far more)."""
        with self._structure.shared():
            # The rows and the FAISS structure of one state (a write may run meanwhile).
            rows = self._rows
            arrays: dict[str, np.ndarray] = {
                "meta": np.array(json.dumps(self._meta())),
                "ids": rows.ids,
                "lifted": rows.lifted,
            }
            if self.kind != "flat":
                arrays["faiss"] = faiss.serialize_index(self._faiss)
        np.savez(fh, **arrays)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        self.write_to(buf)
        return buf.getvalue()

    @classmethod
    def read_from(
        cls, source: str | Path | IO[bytes], *, use_gpu: bool = False, engine: str = "auto"
    ) -> LorentzIndex:
        with np.load(source, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != FORMAT:
                raise ValueError("unknown index file format")
            index = cls(
                meta["dim"],
                meta["curv"],
                meta["kind"],
                meta["params"],
                use_gpu=use_gpu,
                engine=engine,
            )
            ids = data["ids"].astype(np.int64)
            lifted = data["lifted"].astype(np.float32)
            if lifted.shape != (len(ids), index.dim + 1):
                raise ValueError("index file is inconsistent (ids and stored rows disagree)")
            index._set_rows(lifted, ids)
            index._trained_size = int(meta["trained_size"])
            if index.kind == "flat":
                index._rebuild_faiss()
            else:
                index._faiss = faiss.deserialize_index(data["faiss"])
        if index._faiss is not None and index._faiss.ntotal != index.ntotal:
            raise ValueError("index file is inconsistent (FAISS and stored points disagree)")
        return index

    @classmethod
    def from_bytes(
        cls, blob: bytes, *, use_gpu: bool = False, engine: str = "auto"
    ) -> LorentzIndex:
        return cls.read_from(io.BytesIO(blob), use_gpu=use_gpu, engine=engine)

    @classmethod
    def build(
        cls,
        dim: int,
        curv: float,
        kind: str,
        params: dict[str, Any],
        ids: np.ndarray,
        points: np.ndarray,
        *,
        use_gpu: bool = False,
        engine: str = "auto",
    ) -> LorentzIndex:
        index = cls(dim, curv, kind, params, use_gpu=use_gpu, engine=engine)
        ids = np.asarray(ids, dtype=np.int64)
        points = np.asarray(points, dtype=np.float32).reshape(len(ids), dim)
        index._set_rows(lifted_gallery(points, index.curv), ids)
        index._rebuild_faiss()
        return index
