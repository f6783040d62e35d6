"""The markdown section of ``bench.perf.engines``: the table of every engine and layout, and the
targets (issue 14), each met or missed by how much."""

from __future__ import annotations

import re
from typing import Any

from app.vectors.milvus.layouts import DEFAULT_HNSW
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


# -- sections rendered from other results files (issue 42 item 8) ---------------------------------
def _rate(value: float) -> str:
    """q/s as the 1M-row table gives it: two decimals below one, one above."""
    return f"{value:.2f}" if value < 1 else f"{value:.1f}"


def _machine(facts: dict[str, Any], date: bool = True) -> str:
    """``facts_markdown`` without its load-average sentence (for runs that recorded none, or
    list it apart), and without the date where ``date`` is false."""
    text = facts_markdown(facts, [], []).split(" Load average", 1)[0]
    return text if date else text.rsplit("; ", 1)[0] + "."


def render_1m(result: dict[str, Any]) -> str:
    """``bench/results/engines_1m.json``: the Milvus stages of ``bench.perf.engines`` at 1M rows,
    a run killed before its FAISS stage (its ``outcome``), so ``render_markdown`` cannot render
    it. Ratios are to raw pymilvus in the same run; targets as in ``targets``."""
    m = result["milvus"]
    raw = m["raw"]
    batches = " / ".join(str(b) for b in BATCHES)
    hnsw = result["hnsw"]
    lines = [
        f"Command: `{result['command']}` — {result['rows']:,} rows, {result['queries']} "
        f"queries, k = {result['k']}, radius {result['radius']:g} only, poincare layout "
        f"k′ = {result['poincare_overfetch']}, search ef = "
        f"{result['poincare_overfetch'] * result['poincare_ef_factor']}, HNSW M {hnsw['m']} "
        f"efConstruction {hnsw['ef_construction']}. {_machine(result['machine'])}",
        "",
        f"Outcome: {result['outcome']}",
        "",
        f"Load: {result['load']}",
        "",
        f"| {result['rows']:,} rows, radius {result['radius']:g} | ingest vectors/s | q/s at "
        f"batch {batches} | recall@10 | recall@10 with k′ = k | resident MiB after ingest |",
        "|---|---|---|---|---|---|",
        f"| pymilvus raw (COSINE HNSW) | {raw['ingest_per_s']:.0f} | "
        + " / ".join(_rate(raw["queries_per_s"][str(b)]) for b in BATCHES)
        + " | – | – | – |",
    ]
    top = str(BATCHES[-1])
    for name, e in m["layouts"].items():
        ingest = e["ingest_per_s"] / raw["ingest_per_s"]
        search = e["queries_per_s"][top] / raw["queries_per_s"][top]
        without = e.get("recall_at_10_without_overfetch")
        lines.append(
            f"| Milvus engine, {name} | {e['ingest_per_s']:.0f} ({ingest:.2f} × raw) | "
            + " / ".join(_rate(e["queries_per_s"][str(b)]) for b in BATCHES)
            + f" ({search:.2f} × raw at {top}) | {e['recall_at_10']:.3f} | "
            f"{'–' if without is None else f'{without:.3f}'} | {e['rss_mib_after_ingest']:.0f} |"
        )
    lines += ["", "Targets (issue 14), at this size:"]
    for name, e in m["layouts"].items():
        kind = name.rsplit("_r", 1)[0]
        target = TARGETS["cosine_recall" if kind == "cosine" else "tangent_recall"]
        lines.append(
            f"- Milvus {kind} layout, radius {e['radius']:g}: recall@10 {e['recall_at_10']:.3f} "
            f"(target ≥ {target}): {verdict(e['recall_at_10'], target)}."
        )
    first = next(iter(m["layouts"].values()))  # the ingest target is the cosine layout's
    ratio = first["ingest_per_s"] / raw["ingest_per_s"]
    lines.append(
        f"- Milvus ingest, cosine layout: {ratio:.2f} × raw pymilvus (target ≥ "
        f"{TARGETS['ingest_ratio']}): {verdict(ratio, TARGETS['ingest_ratio'])}."
    )
    for name, e in m["layouts"].items():
        ratio = e["queries_per_s"][top] / raw["queries_per_s"][top]
        lines.append(
            f"- Milvus search, {name} at batch {top}: {ratio:.2f} × raw pymilvus top-10 (target ≥ "
            f"{TARGETS['search_ratio_256']}): {verdict(ratio, TARGETS['search_ratio_256'])}."
        )
    return "\n".join(lines) + "\n"


_ORDERING = re.compile(r"ordering_(\d+)k_seed(\d+)")
_COST = re.compile(r"search_cost_(\d+)k_r(\d+)")


def render_layouts(layouts: dict[str, Any], engines: dict[str, Any]) -> str:
    """``bench/results/milvus_layouts.json`` (``bench.perf.milvus_layouts``): why the Milvus
    engine indexes Poincaré-ball coordinates, and where its search time goes. The two-pass
    estimate is compared with raw pymilvus at the largest batch of ``bench/results/engines.json``
    (the section ``bench.perf.engines``), the reference of the search target."""
    ((order_key, ordering),) = [(k, v) for k, v in layouts.items() if _ORDERING.fullmatch(k)]
    ((cost_key, cost),) = [(k, v) for k, v in layouts.items() if _COST.fullmatch(k)]
    order_match, cost_match = _ORDERING.fullmatch(order_key), _COST.fullmatch(cost_key)
    assert order_match and cost_match
    shortlists = list(next(iter(ordering.values()))["tangent"])
    lines = [
        f"Command: `{layouts['command']}` ({layouts['seconds'] / 60:.1f} min). "
        + facts_markdown(layouts["machine"], layouts["load_start"], layouts["load_end"]),
        "",
        f"Ordering, by brute force (no engine; a {order_match.group(1)}k-row gallery, seed "
        f"{order_match.group(2)}): the share of each query's exact Lorentz top-{K} within its "
        "first k′ Euclidean neighbours, in the tangent vectors log₀(x) the earlier layout indexed "
        "and in the Poincaré-ball coordinates p the engine indexes now: the recall an exact index "
        "over that layout would give after the re-rank.",
        "",
        "| radius | layout | " + " | ".join(f"within {s}" for s in shortlists) + " |",
        "|---|---|" + "---|" * len(shortlists),
    ]
    for radius, by_layout in ordering.items():
        for layout, label in (("tangent", "tangent log₀(x)"), ("poincare", "ball p")):
            shares = " | ".join(f"{by_layout[layout][s]:.3f}" for s in shortlists)
            lines.append(f"| {radius.removeprefix('r')} | {label} | {shares} |")
    queries = cost["queries"]
    raw = engines["milvus"]["raw"]["queries_per_s"][str(queries)]
    per_query = cost["fetched_rows"] / queries
    two_pass = queries / (queries / cost["raw_search_gaps_per_s"] + cost["fetch_rows_by_id_s"])
    lines += [
        "",
        f"Search cost on a {cost_match.group(1)}k-row poincare gallery at radius "
        f"{cost_match.group(2)} in milvus-lite, batch {queries}, k′ {cost['k_prime']}, ef "
        f"{cost['ef']}:",
        "",
        "| search | q/s |",
        "|---|---|",
        f"| the engine (its search and re-rank) | {cost['engine_search_per_s']:.1f} |",
        "| the same search sent to pymilvus directly as one request, asking for the hits' rows "
        f"and gaps (what the re-rank reads) | {cost['raw_search_rows_and_gaps_per_s']:.1f} |",
        f"| the same, asking for the gaps alone | {cost['raw_search_gaps_per_s']:.1f} |",
        f"| a second pass fetching {per_query:.0f} rows per query by id (what a two-pass search "
        f"would add) | {cost['fetch_rows_by_id_s']:.2f} s per {queries} queries |",
        f"| two passes, estimated: {queries} / ({queries} / gaps alone + second pass) | "
        f"{two_pass:.1f} ({two_pass / raw:.2f} × raw pymilvus top-10 at batch {queries}, "
        f"{raw:.0f} q/s in `bench.perf.engines`) |",
    ]
    return "\n".join(lines) + "\n"


def render_validation(*payloads: dict[str, Any]) -> str:
    """The ``--validate`` grids of ``bench.perf.engines`` behind the poincare layout's k′ and ef
    (``app.vectors.milvus.search``): recall@10 and batch speed per (radius, k′, ef) and seed.
    A point measured more than once (a grid's first point, measured again at its end; radius 1,
    measured again by the ``--radii`` runs) shows the range of its measurements."""
    seeds = sorted({p["seed"] for p in payloads})
    points: dict[tuple[float, int, int], dict[int, list[dict[str, Any]]]] = {}
    for payload in payloads:
        for entries in payload["grid"].values():
            for e in entries:
                key = (e["radius"], e["overfetch"], e["ef"])
                points.setdefault(key, {}).setdefault(payload["seed"], []).append(e)

    def spread(values: list[float], digits: int) -> str:
        low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
        return low if low == high else f"{low}–{high}"

    machines = {_machine(p["machine"], date=False) for p in payloads}
    lines = [
        "Each run is a validation gallery of its own seed, never the benchmark's."
        + (f" {next(iter(machines))}" if len(machines) == 1 else ""),
        "",
    ]
    for p in payloads:
        machine = "" if len(machines) == 1 else f" {_machine(p['machine'], date=False)}"
        lines.append(
            f"- `{p['command']}` ({p['seconds'] / 60:.1f} min, {p['rows']:,} rows, seed "
            f"{p['seed']}, layout {p['layout']}; {p['machine']['date']}, load average "
            f"(1/5/15 min) at start {p['load_start']}, at end {p['load_end']}).{machine}"
        )
    per_seed = " / ".join(f"seed {s}" for s in seeds)
    batch = str(BATCHES[-1])
    lines += [
        "",
        f"| radius | k′ | ef | recall@10 ({per_seed}) | q/s at batch {batch} ({per_seed}) |",
        "|---|---|---|---|---|",
    ]
    for (radius, overfetch, ef), by_seed in sorted(points.items()):
        recall = " / ".join(
            spread([e["recall_at_10"] for e in by_seed[s]], 3) if s in by_seed else "–"
            for s in seeds
        )
        speed = " / ".join(
            spread([e[f"queries_per_s_{batch}"] for e in by_seed[s]], 1) if s in by_seed else "–"
            for s in seeds
        )
        lines.append(f"| {radius:g} | {overfetch} | {ef} | {recall} | {speed} |")
    return "\n".join(lines) + "\n"
