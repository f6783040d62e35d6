"""The markdown section of ``bench.perf.engines``: the table of every engine and layout, and the
targets (issue 14), each met or missed by how much."""

from __future__ import annotations

from typing import Any

from app.vectors.milvus_engine import DEFAULT_HNSW
from bench.common.machine import facts_markdown
from bench.perf.engine_workload import (
    BATCHES,
    QUERIES,
    K,
)

TARGETS = {
    "cosine_recall": 0.99,
    "tangent_recall": 0.95,
    "ingest_ratio": 0.5,
    "search_ratio_256": 0.8,
}


# -- report ---------------------------------------------------------------------------------------
def verdict(value: float, target: float) -> str:
    return "met" if value >= target else f"missed by {target - value:.3f}"


def targets(result: dict[str, Any]) -> list[str]:
    m, f = result["milvus"], result["faiss"]
    lines = []
    for name, e in m["layouts"].items():
        kind = name.rsplit("_r", 1)[0]
        target = TARGETS["cosine_recall" if kind == "cosine" else "tangent_recall"]
        lines.append(
            f"- Milvus {kind} layout, radius {e['radius']:g}: recall@10 {e['recall_at_10']:.3f} "
            f"(target ≥ {target}): {verdict(e['recall_at_10'], target)}."
        )
    first = next(iter(m["layouts"].values()))
    ratio = first["ingest_per_s"] / m["raw"]["ingest_per_s"]
    lines.append(
        f"- Milvus ingest, cosine layout: {first['ingest_per_s']:.0f} vectors/s = {ratio:.2f} × "
        f"raw pymilvus (target ≥ {TARGETS['ingest_ratio']}): "
        f"{verdict(ratio, TARGETS['ingest_ratio'])}."
    )
    ratio = f["engine"]["ingest_per_s"] / f["raw"]["ingest_per_s"]
    lines.append(
        f"- FAISS ingest: {f['engine']['ingest_per_s']:.0f} vectors/s = {ratio:.2f} × raw faiss "
        f"(target ≥ {TARGETS['ingest_ratio']}): {verdict(ratio, TARGETS['ingest_ratio'])}."
    )
    for name, e in m["layouts"].items():
        if "queries_per_s" not in e:
            continue
        ratio = e["queries_per_s"]["256"] / m["raw"]["queries_per_s"]["256"]
        lines.append(
            f"- Milvus search, {name} at batch 256: {e['queries_per_s']['256']:.0f} q/s = "
            f"{ratio:.2f} × raw pymilvus top-10 (target ≥ {TARGETS['search_ratio_256']}): "
            f"{verdict(ratio, TARGETS['search_ratio_256'])}."
        )
    ratio = f["engine"]["queries_per_s"]["256"] / f["raw"]["queries_per_s"]["256"]
    lines.append(
        f"- FAISS search at batch 256: {f['engine']['queries_per_s']['256']:.0f} q/s = "
        f"{ratio:.2f} × raw faiss (target ≥ {TARGETS['search_ratio_256']}): "
        f"{verdict(ratio, TARGETS['search_ratio_256'])}."
    )
    return lines


def render_markdown(result: dict[str, Any]) -> str:
    m, f = result["milvus"], result["faiss"]
    speeds = " / ".join(str(b) for b in BATCHES)
    spread = result.get("spread_layout", "tangent")
    overfetch = result["overfetch"]
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min), {result['rows']:,} "
        f"rows, {QUERIES} queries, k = {K}, {spread} layout k′ = {overfetch}, search ef = "
        f"{result['ef_factor'] * overfetch} (k′ and ef chosen on validation galleries: "
        f"`python -m bench.perf.engines --validate --rows 100000 --seed 7 --layout {spread}` and "
        "`--seed 8`), HNSW M "
        f"{DEFAULT_HNSW['m']} efConstruction {DEFAULT_HNSW['ef_construction']}. "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        "Gallery: WordNet-noun MiniLM rows tiled with noise (real-data-derived); cosine layout = "
        f"cosine lift at scale R (one radius); {spread} layout = radii spread over [0.2 R, R] by "
        "specificity (`spread_points`). Truth: brute-force float64 top-10, ties counted. Milvus "
        "is a milvus-lite file served inside the benchmark process (pure Python over FAISS), "
        "so its speeds are milvus-lite's, not a Milvus cluster's. Raw engines: pymilvus insert "
        "of (id, vector) and top-10 search on a COSINE HNSW at the layer's ef; faiss "
        "`IndexFlatIP` add and search of lifted rows (no re-rank).",
        "",
        f"| engine | ingest vectors/s | ready s | q/s at batch {speeds} | recall@10 | "
        "recall@10 with k′ = k |",
        "|---|---|---|---|---|---|",
    ]
    raw = m["raw"]
    lines.append(
        f"| pymilvus raw (COSINE HNSW) | {raw['ingest_per_s']:.0f} | {raw['ready_s']:.1f} | "
        + " / ".join(f"{raw['queries_per_s'][str(b)]:.0f}" for b in BATCHES)
        + " | – | – |"
    )
    for name, e in m["layouts"].items():
        speed = (
            " / ".join(f"{e['queries_per_s'][str(b)]:.0f}" for b in BATCHES)
            if "queries_per_s" in e
            else "–"
        )
        without = e.get("recall_at_10_without_overfetch")
        lines.append(
            f"| Milvus engine, {name} | {e['ingest_per_s']:.0f} | {e['ready_s']:.1f} | {speed} | "
            f"{e['recall_at_10']:.3f} | {'–' if without is None else f'{without:.3f}'} |"
        )
    for label, e in (("faiss raw (IndexFlatIP)", f["raw"]), ("FAISS engine (flat)", f["engine"])):
        lines.append(
            f"| {label} | {e['ingest_per_s']:.0f} | – | "
            + " / ".join(f"{e['queries_per_s'][str(b)]:.0f}" for b in BATCHES)
            + " | – | – |"
        )
    recalls = ", ".join(f"{k} {v:.3f}" for k, v in f["recall_at_10"].items())
    lines += [
        "",
        f"FAISS engine recall@10 (flat scan + float64 re-rank): {recalls}.",
        f"Resident memory of the benchmark process: Milvus run {m['rss_mib']['start']:.0f} → "
        f"peak {m['rss_mib']['peak']:.0f} MiB (milvus-lite holds the collections in this "
        f"process; a Milvus server would hold them instead), FAISS run "
        f"{f['rss_mib']['start']:.0f} → {f['rss_mib']['peak']:.0f} MiB.",
        "",
        "Targets (issue 14):",
        *targets(result),
    ]
    return "\n".join(lines) + "\n"
