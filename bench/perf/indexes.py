"""Index choices on lifted vectors: flat against IVF and HNSW, recall@10 and speed by radius.

    python -m bench.perf.indexes           # galleries of 10k and 100k rows at radii 1, 3 and 6:
                                      # bench/results/indexes.json and its BENCHMARKS.md section
    python -m bench.perf.indexes --quick   # 5k rows, radii 1 and 6

Gallery: the WordNet-noun MiniLM rows tiled with small noise (``bench.common.tiled``), lifted as a
cosine gallery whose lift scale is the radius (every row at that hyperbolic radius; the service
refuses radii above 6 by default). Queries: 200 MiniLM rows with fresh noise, lifted the same
way. Truth: the exact top-10 by the Lorentz inner product in float64 over the whole gallery.
Every index answers through ``LorentzIndex.search`` (over-fetch max(4k, k+64), float64 re-rank),
so recall counts what the service returns. Speed: queries/s at batch 1 and 200 (median of calls).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch

from app.ml.geometry.space import EuclideanLift
from app.vectors.faiss.index import LorentzIndex
from app.vectors.lorentz_rows import lifted_queries
from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.tiled import lift_points, tiled, wordnet_rows
from bench.common.wordnet import REPO_ROOT

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.indexes"
K = 10
QUERIES = 200
# (label, kind, params, engine): the defaults of each kind and one larger setting of each.
CONFIGS: tuple[tuple[str, str, dict[str, int], str], ...] = (
    ("flat (torch scan)", "flat", {}, "auto"),
    ("flat (FAISS scan)", "flat", {}, "faiss"),
    ("ivf nlist 64 nprobe 8 (default)", "ivf", {"nlist": 64, "nprobe": 8}, "auto"),
    ("ivf nlist 1024 nprobe 32", "ivf", {"nlist": 1024, "nprobe": 32}, "auto"),
    ("hnsw m 32 ef 64 (default)", "hnsw", {}, "auto"),
    ("hnsw m 32 ef 256", "hnsw", {"ef_search": 256}, "auto"),
)
RECALL_TARGET = 0.99


def exact_top(gallery_lifted: np.ndarray, queries_lifted: np.ndarray, k: int) -> np.ndarray:
    """Row positions of the k largest Lorentz inner products, computed in float64."""
    g = torch.from_numpy(gallery_lifted.astype(np.float64))
    q = torch.from_numpy(queries_lifted.astype(np.float64))
    return torch.topk(q @ g.T, k, dim=1).indices.numpy()


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth, strict=True)]))


def queries_per_s(index: LorentzIndex, queries: np.ndarray, batch: int, calls: int) -> float:
    index.search(queries[:batch], K)
    times = []
    for c in range(calls):
        start = (c * batch) % len(queries)
        part = queries[start : start + batch]
        tic = time.perf_counter()
        index.search(part, K)
        times.append(time.perf_counter() - tic)
    return batch / float(np.median(times))


def bench_case(rows, size: int, radius: float, quick: bool, seed: int) -> dict[str, Any]:
    lift = EuclideanLift(curv=1.0, scale=radius, metric="cosine")
    points = lift_points(tiled(rows.old, size, seed=seed), lift)
    rng = np.random.default_rng(seed + 1)
    picks = rng.integers(0, len(rows.old), QUERIES)
    noisy = rows.old[picks] + 0.05 * rng.standard_normal((QUERIES, rows.old.shape[1]))
    queries = lift_points(noisy.astype(np.float32), lift).astype(np.float64)
    flat = LorentzIndex.build(points.shape[1], 1.0, "flat", {}, np.arange(size), points)
    truth = exact_top(flat.lifted, lifted_queries(queries, 1.0), K)
    out: dict[str, Any] = {"size": size, "radius": radius, "configs": {}}
    built: dict[tuple, tuple[LorentzIndex, float]] = {("flat", "auto"): (flat, 0.0)}
    for label, kind, params, engine in CONFIGS:
        # Search-time settings (IVF nprobe, HNSW ef_search) reuse one build of the structure.
        search_keys = {"nprobe", "ef_search"}
        key = (kind, engine, *sorted((k, v) for k, v in params.items() if k not in search_keys))
        if key not in built:
            tic = time.perf_counter()
            index = LorentzIndex.build(
                points.shape[1], 1.0, kind, params, np.arange(size), points, engine=engine
            )
            built[key] = (index, time.perf_counter() - tic)
        index, build_s = built[key]
        index.params = {**index.params, **params}
        structure = index.faiss_structure
        if kind == "ivf":
            structure.nprobe = min(index.params["nprobe"], structure.nlist)
        elif kind == "hnsw":
            faiss.downcast_index(structure.index).hnsw.efSearch = index.params["ef_search"]
        found, _ = index.search(queries, K)
        # Raw FAISS alone (no over-fetch, no re-rank) shows what the re-rank repairs; a flat
        # index holds no FAISS structure on the CPU, so its raw scan is FAISS's flat kernel.
        lifted_q = lifted_queries(queries, 1.0)
        if structure is None:
            _, raw = faiss.knn(lifted_q, index.lifted, K, faiss.METRIC_INNER_PRODUCT)
        else:
            _, raw = structure.search(lifted_q, K)
        out["configs"][label] = {
            "kind": kind,
            "params": index.params,
            "engine": engine,
            "build_s": build_s,
            "recall_at_10": recall_at_k(found, truth),
            "faiss_alone_recall_at_10": recall_at_k(raw, truth),
            "single_queries_per_s": queries_per_s(index, queries, 1, 10 if quick else 50),
            "batch_queries_per_s": queries_per_s(index, queries, QUERIES, 2 if quick else 5),
        }
        e = out["configs"][label]
        print(
            f"  N {size:,} radius {radius:g} {label}: recall {e['recall_at_10']:.3f} "
            f"(FAISS alone {e['faiss_alone_recall_at_10']:.3f}), single "
            f"{e['single_queries_per_s']:.0f} q/s, batch {e['batch_queries_per_s']:.0f} q/s, "
            f"build {build_s:.1f} s",
            flush=True,
        )
    out["choice"] = choose(out["configs"])
    return out


def choose(configs: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """Per batch shape, the fastest configuration whose recall@10 reaches the target."""
    good = {k: v for k, v in configs.items() if v["recall_at_10"] >= RECALL_TARGET}
    return {
        shape: max(good, key=lambda k: good[k][f"{shape}_queries_per_s"]) if good else None
        for shape in ("single", "batch")
    }


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        "Gallery: WordNet-noun MiniLM rows tiled with noise (real-data-derived), lifted as a "
        "cosine gallery with lift scale = radius; 200 noisy MiniLM queries; truth = exact "
        "float64 top-10 by Lorentz inner product. Recall is of `LorentzIndex.search` (over-fetch "
        "+ float64 re-rank); 'FAISS alone' is the index's own float32 top-10 without them. "
        f"Choice = fastest configuration with recall@10 ≥ {RECALL_TARGET}.",
        "",
        "| N | radius | configuration | recall@10 | FAISS alone | single q/s | batch-200 q/s | "
        "build s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in result["cases"]:
        for label, e in case["configs"].items():
            lines.append(
                f"| {case['size']:,} | {case['radius']:g} | {label} | {e['recall_at_10']:.3f} | "
                f"{e['faiss_alone_recall_at_10']:.3f} | {e['single_queries_per_s']:.0f} | "
                f"{e['batch_queries_per_s']:.0f} | {e['build_s']:.1f} |"
            )
    lines += [
        "",
        "| N | radius | choice, single queries | choice, batches of 200 |",
        "|---|---|---|---|",
    ]
    for case in result["cases"]:
        c = case["choice"]
        lines.append(f"| {case['size']:,} | {case['radius']:g} | {c['single']} | {c['batch']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5k rows, radii 1 and 6")
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--radii", type=float, nargs="+", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([5_000] if args.quick else [10_000, 100_000])
    radii = args.radii or ([1.0, 6.0] if args.quick else [1.0, 3.0, 6.0])
    load_start = load_average()
    tic = time.perf_counter()
    rows = wordnet_rows()
    cases = [bench_case(rows, n, r, args.quick, args.seed) for n in sizes for r in radii]
    result = {
        **run_record(command_line("bench.perf.indexes", argv), tic, load_start),
        "recall_target": RECALL_TARGET,
        "cases": cases,
    }
    out = args.out or RESULTS / ("indexes_quick.json" if args.quick else "indexes.json")
    section = None if args.no_markdown else SECTION
    publish(
        result,
        Path(out),
        render_markdown(result),
        section,
        "Index choices on lifted vectors (bench.perf.indexes)",
    )
    return result


if __name__ == "__main__":
    main()
