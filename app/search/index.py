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
from typing import Any, Literal

import faiss
import numpy as np

IndexKind = Literal["flat", "ivf", "hnsw"]
INDEX_KINDS: tuple[str, ...] = ("flat", "ivf", "hnsw")
DEFAULT_PARAMS: dict[str, dict[str, int]] = {
    "flat": {},
    "ivf": {"nlist": 64, "nprobe": 8},
    "hnsw": {"m": 32, "ef_construction": 80, "ef_search": 64},
}
# IVF is retrained once the gallery has grown this many times past its training size.
IVF_RETRAIN_GROWTH = 4
FORMAT = 1
# Float64 values the exact re-rank may hold at once (queries × candidates × dim): 256 MiB.
RERANK_BUDGET = 2**25


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


def time_component64(x: np.ndarray, curv: float) -> np.ndarray:
    return np.sqrt(1.0 / curv + np.einsum("...i,...i->...", x, x))


def exact_distances(queries: np.ndarray, points: np.ndarray, curv: float) -> np.ndarray:
    """Lorentz distances in float64 for paired rows (… × d), without catastrophic cancellation.

    −c⟨q,x⟩_L = 1 + t with t = (c/2)(‖q − x‖² − (q₀ − x₀)²) ≥ 0 and q₀ − x₀ written as
    (‖q‖² − ‖x‖²)/(q₀ + x₀); then d = acosh(1 + t)/√c = log1p(t + √(t(t + 2)))/√c.
    """
    q = np.asarray(queries, dtype=np.float64)
    x = np.asarray(points, dtype=np.float64)
    q0 = time_component64(q, curv)
    x0 = time_component64(x, curv)
    diff = q - x
    dt = (np.einsum("...i,...i->...", q, q) - np.einsum("...i,...i->...", x, x)) / (q0 + x0)
    # The spacelike difference of two sheet points has a non-negative Lorentz norm; rounding
    # can leave a tiny negative t for (near-)identical points, where the distance is 0.
    t = np.maximum(0.5 * curv * (np.einsum("...i,...i->...", diff, diff) - dt * dt), 0.0)
    return np.log1p(t + np.sqrt(t * (t + 2.0))) / np.sqrt(curv)


def lifted_gallery(points: np.ndarray, curv: float) -> np.ndarray:
    x = np.asarray(points, dtype=np.float64)
    return np.ascontiguousarray(
        np.concatenate([time_component64(x, curv)[:, None], x], axis=1), dtype=np.float32
    )


def lifted_queries(queries: np.ndarray, curv: float) -> np.ndarray:
    q = np.asarray(queries, dtype=np.float64)
    return np.ascontiguousarray(
        np.concatenate([-time_component64(q, curv)[:, None], q], axis=1), dtype=np.float32
    )


def faiss_gpu_count() -> int:
    """GPUs FAISS can use: 0 on CPU builds (which lack ``StandardGpuResources``)."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


class LorentzIndex:
    """Points (space components, float32) by int64 id, searchable by exact Lorentz distance.

    Writes must be serialised by the caller; searches may run concurrently with each other on
    CPU (a GPU copy, when used, is guarded by a lock here).
    """

    def __init__(
        self,
        dim: int,
        curv: float,
        kind: str = "flat",
        params: dict[str, Any] | None = None,
        *,
        use_gpu: bool = False,
    ) -> None:
        if dim < 1 or not curv > 0:
            raise ValueError("dim must be ≥ 1 and curv > 0")
        self.dim = dim
        self.curv = float(curv)
        self.kind = kind
        self.params = validate_index_params(kind, params or {})
        self.use_gpu = use_gpu and kind == "flat" and faiss_gpu_count() > 0
        self._ids = np.empty(0, dtype=np.int64)
        self._points = np.empty((0, dim), dtype=np.float32)
        self._position: dict[int, int] = {}
        self._trained_size = 0
        self._faiss = self._empty_faiss()
        self._gpu_index: Any = None
        self._gpu_lock = threading.Lock()

    # -- structure ------------------------------------------------------------------------------
    def _empty_faiss(self) -> faiss.Index:
        """``IndexIDMap2`` over a flat or HNSW inner-product index; IVF keeps ids itself (its
        inverted lists store them), which is also the only way its removals stay correct: an
        ``IndexIDMap`` compacts its id table on removal while IVF keeps its internal ids."""
        d = self.dim + 1
        if self.kind == "ivf":
            n = len(self._ids)
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
        if not len(self._ids):
            self._trained_size = 0
            return
        lifted = lifted_gallery(self._points, self.curv)
        if self.kind == "ivf":
            self._faiss.train(lifted)
            self._trained_size = len(self._ids)
        self._faiss.add_with_ids(lifted, self._ids)

    @property
    def ntotal(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> np.ndarray:
        return self._ids.copy()

    def points_for(self, ids: np.ndarray) -> np.ndarray:
        return self._points[[self._position[int(i)] for i in ids]]

    # -- writes ---------------------------------------------------------------------------------
    def upsert(self, ids: np.ndarray, points: np.ndarray) -> None:
        """Insert or replace points by id (a replaced id moves to the new point)."""
        ids = np.asarray(ids, dtype=np.int64)
        points = np.asarray(points, dtype=np.float32).reshape(len(ids), self.dim)
        existing = np.array([i for i in ids.tolist() if i in self._position], dtype=np.int64)
        if len(existing):
            self.remove(existing)
        if not len(ids):
            return
        start = len(self._ids)
        self._ids = np.concatenate([self._ids, ids])
        self._points = np.concatenate([self._points, points])
        for offset, item in enumerate(ids.tolist()):
            self._position[item] = start + offset
        grown = self.kind == "ivf" and (
            self._trained_size == 0 or len(self._ids) > IVF_RETRAIN_GROWTH * self._trained_size
        )
        if grown:
            self._rebuild_faiss()
        else:
            self._faiss.add_with_ids(lifted_gallery(points, self.curv), ids)
            self._gpu_index = None

    def remove(self, ids: np.ndarray) -> int:
        """Remove the ids present; returns how many were removed."""
        present = [int(i) for i in np.asarray(ids, dtype=np.int64) if int(i) in self._position]
        if not present:
            return 0
        keep = np.ones(len(self._ids), dtype=bool)
        keep[[self._position[i] for i in present]] = False
        self._ids = self._ids[keep]
        self._points = self._points[keep]
        self._position = {item: pos for pos, item in enumerate(self._ids.tolist())}
        if self.kind == "hnsw":
            # HNSW graphs cannot drop nodes; rebuild from the stored points.
            self._rebuild_faiss()
        else:
            self._faiss.remove_ids(np.asarray(present, dtype=np.int64))
            self._gpu_index = None
        return len(present)

    # -- search ---------------------------------------------------------------------------------
    def _faiss_search(self, lifted: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.use_gpu:
            return self._faiss.search(lifted, m)
        with self._gpu_lock:
            if self._gpu_index is None:
                self._gpu_index = faiss.index_cpu_to_all_gpus(self._faiss)
            return self._gpu_index.search(lifted, m)

    def search(
        self, queries: np.ndarray, k: int, *, overfetch: int = 4, min_candidates: int = 64
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest ids per query (−1 padded when fewer exist) and float64 distances (inf
        padded), nearest first. FAISS proposes max(overfetch·k, k + min_candidates) candidates."""
        queries = np.asarray(queries, dtype=np.float64).reshape(-1, self.dim)
        nq = len(queries)
        out_ids = np.full((nq, k), -1, dtype=np.int64)
        out_dist = np.full((nq, k), np.inf, dtype=np.float64)
        if self.ntotal == 0 or nq == 0:
            return out_ids, out_dist
        m = min(self.ntotal, max(overfetch * k, k + min_candidates))
        _, candidates = self._faiss_search(lifted_queries(queries, self.curv), m)
        found = min(k, m)
        # The re-rank gathers queries × candidates × dim float64 values: bound that working set.
        chunk = max(1, RERANK_BUDGET // (m * self.dim))
        for start in range(0, nq, chunk):
            rows = slice(start, start + chunk)
            ids, dist = self._rerank(queries[rows], candidates[rows], found)
            out_ids[rows, :found], out_dist[rows, :found] = ids, dist
        return out_ids, out_dist

    def _rerank(
        self, queries: np.ndarray, candidates: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        valid = candidates >= 0
        positions = np.zeros_like(candidates)
        positions[valid] = [self._position[int(c)] for c in candidates[valid]]
        dist = exact_distances(queries[:, None, :], self._points[positions], self.curv)
        dist[~valid] = np.inf
        order = np.argsort(dist, axis=1, kind="stable")[:, :k]
        top_dist = np.take_along_axis(dist, order, axis=1)
        top_ids = np.take_along_axis(candidates, order, axis=1)
        return np.where(np.isfinite(top_dist), top_ids, -1), top_dist

    # -- serialisation --------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        meta = {
            "format": FORMAT,
            "dim": self.dim,
            "curv": self.curv,
            "kind": self.kind,
            "params": self.params,
            "trained_size": self._trained_size,
        }
        buf = io.BytesIO()
        np.savez(
            buf,
            meta=np.array(json.dumps(meta)),
            ids=self._ids,
            points=self._points,
            faiss=faiss.serialize_index(self._faiss),
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes, *, use_gpu: bool = False) -> LorentzIndex:
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != FORMAT:
                raise ValueError("unknown index file format")
            index = cls(meta["dim"], meta["curv"], meta["kind"], meta["params"], use_gpu=use_gpu)
            index._ids = data["ids"].astype(np.int64)
            index._points = data["points"].astype(np.float32)
            index._faiss = faiss.deserialize_index(data["faiss"])
        index._trained_size = int(meta["trained_size"])
        index._position = {item: pos for pos, item in enumerate(index._ids.tolist())}
        if index._faiss.ntotal != len(index._ids) or index._points.shape != (
            len(index._ids),
            index.dim,
        ):
            raise ValueError("index file is inconsistent (FAISS and stored points disagree)")
        return index

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
    ) -> LorentzIndex:
        index = cls(dim, curv, kind, params, use_gpu=use_gpu)
        index._ids = np.asarray(ids, dtype=np.int64).copy()
        index._points = np.asarray(points, dtype=np.float32).reshape(len(ids), dim).copy()
        index._position = {item: pos for pos, item in enumerate(index._ids.tolist())}
        index._rebuild_faiss()
        return index
