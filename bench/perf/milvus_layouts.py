"""Why the Milvus engine indexes Poincaré-ball coordinates, and where its search time goes.

    python -m bench.perf.milvus_layouts   # bench/results/milvus_layouts.json (about 5 min on 2 cores)

Two measurements behind BENCHMARKS.md's prose under "Vector engines":

* ordering — brute force, no engine: for each query, the position of each of its exact Lorentz
  top-10 items in the Euclidean order of the tangent vectors log₀(x) and of the ball coordinates
  p (``app.vectors.milvus.layouts``); the share within the first k′ is the recall an exact index
  over that layout would give after the re-rank (30k-row gallery, seed 7, radii 1 / 3 / 6).
* search cost — a 100k-row poincare gallery at radius 3 (seed 0) in milvus-lite, searched at the
  engine's k′ and ef with batch 256: queries/s asking the engine for the hits' indexed rows and
  gaps (what the re-rank reads), for the gaps alone, and for nothing beyond the ids; and the time
  of fetching 20 rows per query by id (the second pass a two-pass search would need).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.vectors.milvus.engine import ID_BATCH, MilvusEngine, ids_filter
from app.vectors.milvus.layouts import gallery_search_vectors, query_search_vectors
from app.vectors.milvus.search import POINCARE_EF_FACTOR, POINCARE_OVERFETCH
from app.vectors.rerank import exact_top_k
from bench.common.machine import load_average, run_record
from bench.common.report import command_line
from bench.common.wordnet import REPO_ROOT
from bench.perf.engine_workload import Data
from bench.perf.engines import ingest, milvus_gallery

OUT = REPO_ROOT / "bench/results/milvus_layouts.json"
K = 10
SHORTLISTS = (30, 50, 100, 200)
FETCHED_PER_QUERY = 20


def shortlist_recall(
    layout: str, points: np.ndarray, queries: np.ndarray, truth: np.ndarray
) -> dict[str, float]:
    """Share of the exact top-10 within the first k′ of the layout's exact Euclidean order."""
    gallery = gallery_search_vectors(layout, points, 1.0).astype(np.float64)
    asked = query_search_vectors(layout, queries, 1.0).astype(np.float64)
    squared = (gallery**2).sum(1)
    positions = []
    for q in range(len(asked)):
        order = np.argsort(squared - 2 * gallery @ asked[q], kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        positions.append(rank[truth[q]])
    ranks = np.array(positions)
    return {str(k): float((ranks < k).mean()) for k in SHORTLISTS}


def ordering(rows: int) -> dict[str, Any]:
    data = Data(rows, 7)
    out: dict[str, Any] = {}
    for radius in (1.0, 3.0, 6.0):
        points, queries = data.spread(radius)
        truth, _ = exact_top_k(queries, points, K, 1.0)
        out[f"r{int(radius)}"] = {
            layout: shortlist_recall(layout, points, queries, truth)
            for layout in ("tangent", "poincare")
        }
        print(f"  ordering r{int(radius)}: {out[f'r{int(radius)}']}", flush=True)
    return out


def median_rate(call: Callable[[], object], n: int, repeats: int = 3) -> float:
    call()
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        call()
        times.append(time.perf_counter() - tic)
    return n / float(np.median(times))


def search_cost(rows: int, store: Path) -> dict[str, Any]:
    data = Data(rows, 0)
    points, queries = data.spread(3.0)
    engine = MilvusEngine(str(store / "layouts.db"))
    gallery = milvus_gallery(engine, "cost_r3", "poincare", points.shape[1], 3.0)
    ingest(gallery, data, points)
    asked = query_search_vectors("poincare", queries, 1.0)
    ef = POINCARE_OVERFETCH * POINCARE_EF_FACTOR
    out: dict[str, Any] = {"k_prime": POINCARE_OVERFETCH, "ef": ef, "queries": len(queries)}
    out["engine_search_per_s"] = median_rate(lambda: gallery.search(queries, K), len(queries))
    for label, fields in (("rows_and_gaps", ["search", "row_id", "gap"]), ("gaps", ["gap"])):
        out[f"raw_search_{label}_per_s"] = median_rate(
            lambda fields=fields: engine.client.search(
                gallery.name,
                data=asked,
                limit=POINCARE_OVERFETCH,
                anns_field="search",
                search_params={"metric_type": "L2", "params": {"ef": ef}},
                output_fields=fields,
            ),
            len(queries),
        )
    picks = np.random.default_rng(0).integers(0, rows, FETCHED_PER_QUERY * len(queries))
    wanted = [data.ids[i] for i in picks]
    tic = time.perf_counter()
    for start in range(0, len(wanted), ID_BATCH):
        engine.client.query(
            gallery.name,
            filter=ids_filter(wanted[start : start + ID_BATCH]),
            output_fields=["item_id", "row_id", "search", "gap"],
        )
    out["fetch_rows_by_id_s"] = time.perf_counter() - tic
    out["fetched_rows"] = len(wanted)
    print(f"  search cost: {out}", flush=True)
    engine.close()
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    torch.set_num_threads(1)
    load_start = load_average()
    tic = time.perf_counter()
    store = Path(tempfile.mkdtemp(prefix="bench-layouts-"))
    try:
        result = {
            "ordering_30k_seed7": ordering(30_000),
            "search_cost_100k_r3": search_cost(100_000, store),
        }
    finally:
        shutil.rmtree(store, ignore_errors=True)
    record = {
        **run_record(command_line("bench.perf.milvus_layouts", argv), tic, load_start),
        **result,
    }
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
