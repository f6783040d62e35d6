"""What two-stage search embeds under real traffic (issue 43, "skewed traffic" target): documents
embedded per search and the share of the gallery embedded after N searches, beside the quality,
for depths 10–200, with uniform and with skewed (Zipf) traffic.

Data and splits as ``bench.quality.two_stage`` (the public WordNet nouns: lemma → gloss, old =
MiniLM, new = mpnet, all 24,000 glosses in the gallery; the frozen held-back synsets are never a
query). Per seed: that module's split of the seed, and a stream of ``SEARCHES`` searches drawn
i.i.d. from the seed's evaluation queries with Zipf popularity p(rank r) ∝ r^−s over a seeded
permutation of them (s = 0: uniform; s = 1: the traffic bench's skew). Each search takes its
``depth`` candidates from the old index by the old query vector (stage one) and embeds those it
has not embedded before (the service's lazy re-embed, which stores them); its quality is the
two-stage R@10 at that depth with the new model alone (weight 0, what the service serves),
averaged over the stream, so that popular queries count as often as they are searched.

Nothing is chosen here: depths and exponents are the grid reported, not tuned. Intervals:
Student's t (95 %) over the seed means, covering the split, the popularity permutation and the
stream draw of each seed.

``python -m bench.quality.two_stage_traffic [--seeds 5] [--quick]`` writes
``bench/results/two_stage_traffic.json`` and the BENCHMARKS section
``bench.quality.two_stage_traffic`` (``--quick``: the committed fixture, no section);
``--render`` writes the section again from the results file.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from app.ml.backfill.two_stage import rerank, stage_one
from bench.common.machine import machine_facts
from bench.common.report import command_line, publish, replace_section
from bench.common.stats import t_interval
from bench.common.wordnet import REPO_ROOT
from bench.quality.querydoc import load_arrays
from bench.quality.two_stage import K, hits_at, split

OUT = REPO_ROOT / "bench/results/two_stage_traffic.json"
QUICK_OUT = REPO_ROOT / "bench/results/two_stage_traffic-quick.json"
SECTION = "bench.quality.two_stage_traffic"
TITLE = "Two-stage search under traffic: what it embeds (issue 43)"
DEPTHS = (10, 25, 50, 100, 200)
EXPONENTS = (0.0, 1.0)
SEARCHES = 20_000
CHECKPOINTS = (1_000, 5_000, 20_000)
# Embedded per search is reported over the first and the last window of this many searches.
WINDOW = 1_000


def zipf_stream(n_queries: int, exponent: float, searches: int, seed: int) -> np.ndarray:
    """``searches`` query indices drawn i.i.d. with p(rank r) ∝ r^−exponent over a seeded
    permutation of the queries (which query is popular is part of the draw)."""
    rng = np.random.default_rng([seed, 4301, int(exponent * 1000)])
    popularity = np.arange(1, n_queries + 1, dtype=np.float64) ** -exponent
    popularity /= popularity.sum()
    order = rng.permutation(n_queries)
    return order[rng.choice(n_queries, size=searches, p=popularity)]


def simulate(candidate_ids: np.ndarray, stream: np.ndarray, n_docs: int) -> np.ndarray:
    """Per search of ``stream``, how many of its candidates it embedded (those no earlier search
    embedded): the service's lazy re-embed, which stores what it embeds."""
    embedded = np.zeros(n_docs, dtype=bool)
    out = np.empty(stream.size, dtype=np.int64)
    for step, query in enumerate(stream.tolist()):
        row = candidate_ids[query]
        fresh = row[~embedded[row]]
        out[step] = fresh.size
        embedded[fresh] = True
    return out


def run_seed(arrays: dict[str, np.ndarray], seed: int, searches: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    n = arrays["doc_old"].shape[0]
    ev = split(n, seed)["evaluation"]
    cands = stage_one(arrays["query_old"][ev], arrays["doc_old"], max(DEPTHS))
    qn, docs_new = arrays["query_new"][ev], arrays["doc_new"]
    hit = {d: hits_at(rerank(cands, qn, docs_new, K, 0.0, None, d)[0], ev) for d in DEPTHS}
    out: dict[str, Any] = {"seed": seed, "queries": int(ev.size), "traffic": {}}
    for exponent in EXPONENTS:
        stream = zipf_stream(ev.size, exponent, searches, seed)
        per_depth = {}
        for d in DEPTHS:
            counts = simulate(cands.ids[:, :d], stream, n)
            total = np.cumsum(counts)
            per_depth[str(d)] = {
                "recall@10": float(hit[d][stream].mean()),
                "embedded_per_search_first": float(counts[:WINDOW].mean()),
                "embedded_per_search_last": float(counts[-WINDOW:].mean()),
                "gallery_share_after": {
                    str(c): float(total[c - 1] / n) for c in CHECKPOINTS if c <= searches
                },
            }
        distinct = np.unique(stream).size
        out["traffic"][str(exponent)] = {"distinct_queries": int(distinct), "depths": per_depth}
    out["seconds"] = time.perf_counter() - t0
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's t interval over the seeds."""
    summary: dict[str, Any] = {}
    for exponent in runs[0]["traffic"]:
        rows = {}
        for d in runs[0]["traffic"][exponent]["depths"]:
            cells = [r["traffic"][exponent]["depths"][d] for r in runs]
            rows[d] = {
                key: t_interval([c[key] for c in cells])
                for key in (
                    "recall@10",
                    "embedded_per_search_first",
                    "embedded_per_search_last",
                )
            } | {
                f"share_after_{c}": t_interval([x["gallery_share_after"][c] for x in cells])
                for c in cells[0]["gallery_share_after"]
            }
        distinct = t_interval([r["traffic"][exponent]["distinct_queries"] for r in runs])
        summary[exponent] = {"depths": rows, "distinct_queries": distinct}
    return summary


def _ci(values: list[float] | tuple[float, float, float], digits: int = 3) -> str:
    mean, low, high = values
    if not np.isfinite(low):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def render(payload: dict[str, Any]) -> str:
    runs, summary = payload["runs"], payload["summary"]
    checkpoints = [c for c in CHECKPOINTS if c <= payload["searches"]]
    lines = [
        f"`{payload['command']}` — {payload['machine']['cpu']}, {payload['machine']['cores']} "
        f"cores, {payload['machine']['date']}, {payload['minutes']:.1f} min; {len(runs)} seeds, "
        f"{payload['searches']:,} searches each drawn from the seed's "
        f"{runs[0]['queries']:,} evaluation lemma queries; gallery: all "
        f"{payload['gallery']:,} glosses. Each cell: mean [95 % t interval over the seed means: "
        "split, popularity permutation and stream draw].",
        "",
    ]
    names = {"0.0": "uniform traffic (Zipf s = 0)", "1.0": "skewed traffic (Zipf s = 1)"}
    for exponent, block in summary.items():
        distinct = block["distinct_queries"][0]
        lines += [
            f"**{names.get(exponent, f'Zipf s = {exponent}')}** — {distinct:,.0f} distinct "
            "queries in the stream on average.",
            "",
            "| depth | R@10 (traffic-weighted) | embedded / search, first "
            f"{WINDOW:,} | embedded / search, last {WINDOW:,} | "
            + " | ".join(f"gallery embedded after {c:,}" for c in checkpoints)
            + " |",
            "|---:|---|---|---|" + "---|" * len(checkpoints),
        ]
        for d, row in block["depths"].items():
            lines.append(
                f"| {d} | {_ci(row['recall@10'])} | {_ci(row['embedded_per_search_first'], 1)} "
                f"| {_ci(row['embedded_per_search_last'], 1)} | "
                + " | ".join(_ci(row[f"share_after_{c}"]) for c in checkpoints)
                + " |"
            )
        lines.append("")
    lines.append(
        "Read: a search embeds at most `depth` documents and only those no earlier search "
        "embedded; what it costs falls as traffic repeats itself, and the share of the gallery "
        "embedded grows with the distinct queries, not with the searches. The R@10 column is "
        "the two-stage quality the same searches get (new model alone among the candidates)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--searches", type=int, default=SEARCHES)
    parser.add_argument("--quick", action="store_true", help="the committed fixture")
    parser.add_argument("--render", action="store_true", help="rewrite the section only")
    args = parser.parse_args(argv)
    if args.render:
        import json

        payload = json.loads(OUT.read_text())
        replace_section(SECTION, TITLE, render(payload))
        return payload
    started = time.perf_counter()
    arrays = load_arrays(args.quick)
    runs = [run_seed(arrays, seed, args.searches) for seed in range(args.seeds)]
    payload = {
        "command": command_line("bench.quality.two_stage_traffic", argv),
        "machine": machine_facts(),
        "minutes": (time.perf_counter() - started) / 60,
        "searches": args.searches,
        "gallery": int(arrays["doc_old"].shape[0]),
        "runs": runs,
        "summary": summarise(runs),
    }
    publish(
        payload,
        QUICK_OUT if args.quick else OUT,
        render(payload),
        None if args.quick else SECTION,
        TITLE,
    )
    return payload


if __name__ == "__main__":
    main()
