"""The upgrade report's held-out figures against independent whole-gallery figures (issue 44
item 2).

    python -m bench.quality.whole_gallery            # all 24,000 WordNet nouns, seed 0
    python -m bench.quality.whole_gallery --quick    # the committed 800-synset fixture

The scenario the issue describes: the gallery is every synset's old gloss vector
(all-MiniLM-L6-v2); the dataset pairs a seeded ``PAIRED_SHARE`` of them with their new glosses
(all-mpnet-base-v2), the rest are in the gallery with no new features (``UpgradeData``'s
``distractors``, as ``load_inputs`` reads them from a gallery); the query log is the paired
synsets' lemmas by both models, each relevant to its own synset. One default upgrade (``auto``,
its default objective, ``EVAL_FRACTION`` held out) is run as the service runs it, and its
report's figures are set beside numpy searches of the same held-out queries written here:

- over the whole gallery (what a user's search meets), and over the paired items alone (what
  the report searched before issue 44);
- stay (old lemma → every old gloss, cosine), the served bridge (its query → every lifted old
  gloss, Lorentz inner product) and a true reindex (new lemma → every new gloss, cosine: the
  fixture has every item's new features; the service does not, so the report's reindex is the
  paired items re-embedded and the rest in the old space, and says so);
- the backfill fit's curves at 0 % (gallery get's "now" before any re-embedding: the
  transition search is stay, the mixed one the bridge) on the fit's own queries.

R@k here is the share of queries whose own gloss has fewer than k items scoring strictly above
it. JSON to ``bench/results/whole_gallery.json`` (``whole_gallery-quick.json`` for ``--quick``),
the section to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.backfill.plan import fit_planner
from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.data import split_for_evaluation, split_queries
from app.ml.upgrade.fit_view import build_fit_view
from app.ml.upgrade.run import QueryLog, UpgradeData, run_backbone_upgrade
from bench.common.report import publish
from bench.common.wordnet import REPO_ROOT
from bench.quality.querydoc import QUICK_PARAMS, load_arrays

RESULTS = REPO_ROOT / "bench/results/whole_gallery.json"
SECTION, TITLE = (
    "bench.quality.whole_gallery",
    "The report's figures on the whole gallery (bench.quality.whole_gallery)",
)
# The case: 14,400 of 24,000 items paired with the dataset.
PAIRED_SHARE = 0.6
EVAL_FRACTION = 0.4
# Query rows scored at once by the numpy searches (bounds a block to ~100 MB at 24,000 items).
BLOCK = 1024


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _ranks(score_block, n_queries: int, relevant: np.ndarray, columns: int | None) -> np.ndarray:
    """Per query, how many of the first ``columns`` gallery items (all: None) score strictly
    above its relevant item, scoring ``BLOCK`` queries at a time."""
    out = np.empty(n_queries, dtype=np.int64)
    for start in range(0, n_queries, BLOCK):
        part = slice(start, start + BLOCK)
        scores = score_block(part)
        if columns is not None:
            scores = scores[:, :columns]
        own = scores[np.arange(scores.shape[0]), relevant[part]]
        out[part] = (scores > own[:, None]).sum(axis=1)
    return out


def _recalls(ranks: np.ndarray) -> dict[str, float]:
    return {"recall@1": float((ranks < 1).mean()), "recall@10": float((ranks < 10).mean())}


def independent(
    arrays: dict[str, np.ndarray],
    order: np.ndarray,
    n_paired: int,
    queries: np.ndarray,
    bridge_points: np.ndarray,
    lift: EuclideanLift,
) -> dict[str, dict[str, dict[str, float]]]:
    """Numpy stay, bridge and reindex of held-out queries (``queries``: rows of the paired
    items, each relevant to itself) over the gallery in ``order`` (the paired items first),
    whole and paired-only."""
    synsets = order[queries]
    old_docs = _unit(arrays["doc_old"][order])
    new_docs = _unit(arrays["doc_new"][order])
    old_q = _unit(arrays["query_old"][synsets])
    new_q = _unit(arrays["query_new"][synsets])
    points = lift(torch.from_numpy(arrays["doc_old"][order])).numpy().astype(np.float64)
    c = lift.curv
    time_x = np.sqrt(1 / c + (points * points).sum(axis=1))
    q = bridge_points.astype(np.float64)
    time_q = np.sqrt(1 / c + (q * q).sum(axis=1))

    searches = {
        "stay": lambda part: old_q[part] @ old_docs.T,
        # ⟨q, x⟩_L = q·x − q₀x₀: larger is nearer.
        "bridge": lambda part: q[part] @ points.T - np.outer(time_q[part], time_x),
        "reindex": lambda part: new_q[part] @ new_docs.T,
    }
    out: dict[str, dict[str, dict[str, float]]] = {"whole": {}, "paired": {}}
    for name, search in searches.items():
        for scope, columns in (("whole", None), ("paired", n_paired)):
            out[scope][name] = _recalls(_ranks(search, len(queries), queries, columns))
    return out


def run(arrays: dict[str, np.ndarray], seed: int, params: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    n = arrays["doc_new"].shape[0]
    perm = np.random.default_rng([seed, 44]).permutation(n)
    n_paired = round(PAIRED_SHARE * n)
    paired, unpaired = np.sort(perm[:n_paired]), np.sort(perm[n_paired:])
    data = UpgradeData(
        arrays["doc_new"][paired],
        arrays["doc_old"][paired],
        None,
        QueryLog(
            features=arrays["query_new"][paired],
            old_vectors=arrays["query_old"][paired],
            relevant=[np.array([i]) for i in range(n_paired)],
        ),
        distractors=arrays["doc_old"][unpaired],
    )
    lift = EuclideanLift()
    outcome = run_backbone_upgrade(
        "auto", data, lift, params=params, seed=seed, eval_fraction=EVAL_FRACTION
    )
    upgrade_seconds = time.perf_counter() - started
    report = outcome.report
    _, eval_idx = split_for_evaluation(n_paired, EVAL_FRACTION, seed)
    _, eval_q = split_queries(data.queries, eval_idx, EVAL_FRACTION, seed)
    order = np.concatenate([paired, unpaired])
    bridged = outcome.model.embed(arrays["query_new"][paired][eval_q])
    numpy_figures = independent(arrays, order, n_paired, eval_q, bridged, lift)

    # The backfill fit (the plan's curves, gallery get's "now"), on its own queries: each is
    # relevant to one paired row, its own, so the row names the query.
    view = build_fit_view(outcome.model, data, lift, eval_idx, eval_q, seed)
    fit = fit_planner(view, seed)
    fit_rows = np.array([int(rel[0]) for rel in view.relevant])
    fit_bridged = outcome.model.embed(arrays["query_new"][paired][fit_rows])
    fit_numpy = independent(arrays, order, n_paired, fit_rows, fit_bridged, lift)

    def at(curve: list[dict[str, Any]] | None, fraction: float) -> float | None:
        for point in curve or []:
            if point["fraction"] == fraction and point["metric"] == "recall@10":
                return float(point["value"])
        return None

    served = report["chosen_candidate"]
    metrics = report["metrics"]
    return {
        "seed": seed,
        "seconds": time.perf_counter() - started,
        "upgrade_seconds": upgrade_seconds,
        "items": n,
        "paired": n_paired,
        "held_out_queries": len(eval_q),
        "served": served,
        "recommendation": report["recommendation"]["action"],
        "searched": report["searched"],
        "report": {
            "stay": metrics["stay"]["query"],
            "bridge": metrics[served]["query"],
            "reindex": metrics["reindex"]["query"],
            "transition_outlook": report["recommendation"].get("expected"),
        },
        "numpy": numpy_figures,
        "fit": {
            "queries": len(fit_rows),
            "searched": fit.validation.get("searched"),
            "transition_at_0": at(fit.transition, 0.0),
            "transition_at_1": at(fit.transition, 1.0),
            # Validation curves are {fraction, recall@1, recall@10} points.
            "mixed_at_0": next(
                float(p["recall@10"])
                for p in fit.validation["curves"]["random"]
                if p["fraction"] == 0.0
            ),
            "numpy_whole": fit_numpy["whole"],
            "numpy_paired": fit_numpy["paired"],
        },
    }


def _f(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render_markdown(payload: dict[str, Any]) -> str:
    r = payload["run"]
    rep, num, fit = r["report"], r["numpy"], r["fit"]
    lines = [
        f"Command: `{payload['command']}` — seed {r['seed']}; {r['items']} synsets in the "
        f"gallery, {r['paired']} of them paired with the dataset (the rest have no new "
        f"features), {payload['eval_fraction']:.0%} of the paired held out "
        f"({r['held_out_queries']} held-out lemma queries); `auto` served `{r['served']}`, "
        f"verdict `{r['recommendation']}`; {r['seconds'] / 60:.1f} min on {payload['machine']}"
        + (
            f" (load average {payload['load_average_at_start']:.1f} at the start)."
            if "load_average_at_start" in payload
            else "."
        ),
        "",
        "Held-out query R@10. *Report*: the upgrade report's figure. *Whole* and *paired*: "
        "numpy searches of the same queries over every item of the gallery, and over the "
        "paired items alone (what the report searched before issue 44).",
        "",
        "| figure | report | numpy, whole gallery | numpy, paired items only |",
        "|---|---|---|---|",
    ]
    for name, label in (("stay", "stay"), ("bridge", f"bridge (`{r['served']}`)")):
        lines.append(
            f"| {label} | {_f(rep[name]['recall@10'])} | {_f(num['whole'][name]['recall@10'])}"
            f" | {_f(num['paired'][name]['recall@10'])} |"
        )
    lines.append(
        f"| reindex | {_f(rep['reindex']['recall@10'])} (paired re-embedded, the rest old) | "
        f"{_f(num['whole']['reindex']['recall@10'])} (every item re-embedded) | "
        f"{_f(num['paired']['reindex']['recall@10'])} |"
    )
    lines.append(
        f"| backfill fit, transition at 0 % ({fit['queries']} fit queries) | "
        f"{_f(fit['transition_at_0'])} | {_f(fit['numpy_whole']['stay']['recall@10'])} (stay) | "
        f"{_f(fit['numpy_paired']['stay']['recall@10'])} |"
    )
    lines.append(
        f"| backfill fit, bridged mixed search at 0 % | {_f(fit['mixed_at_0'])} | "
        f"{_f(fit['numpy_whole']['bridge']['recall@10'])} (bridge) | "
        f"{_f(fit['numpy_paired']['bridge']['recall@10'])} |"
    )
    lines.append(
        f"| backfill fit, transition at 100 % | {_f(fit['transition_at_1'])} | — | "
        f"{_f(fit['numpy_paired']['reindex']['recall@10'])} (reindex) |"
    )
    lines += [
        "",
        f"What the report says it searched (query view): {r['searched']['query']['reindex']}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="report figures vs whole-gallery numpy figures")
    parser.add_argument("--quick", action="store_true", help="the 800-synset fixture")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    arrays = load_arrays(args.quick)
    # The machine's load when the run started: a timing taken beside other jobs says so.
    load_at_start = os.getloadavg()[0]
    payload = {
        "command": "python -m bench.quality.whole_gallery" + (" --quick" if args.quick else ""),
        "quick": args.quick,
        "params": QUICK_PARAMS if args.quick else {},
        "paired_share": PAIRED_SHARE,
        "eval_fraction": EVAL_FRACTION,
        "machine": f"{platform.machine()}, {args.threads} torch thread(s)",
        "load_average_at_start": load_at_start,
        "run": run(arrays, args.seed, QUICK_PARAMS if args.quick else {}),
    }
    out = args.out or (RESULTS.with_name("whole_gallery-quick.json") if args.quick else RESULTS)
    section = None if args.quick or args.no_markdown else SECTION
    publish(payload, out, render_markdown(payload), section, TITLE)
    return out


if __name__ == "__main__":
    main()
