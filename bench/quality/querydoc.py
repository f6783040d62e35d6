"""Query → document benchmark on real text: lemma (query) → gloss (document), as users search.

    python -m bench.quality.querydoc                 # all 24,000 WordNet nouns, seed 0
    python -m bench.quality.querydoc --seeds 0,1,2   # several seeds, mean ± sd
    python -m bench.quality.querydoc --quick         # the committed 800-synset fixture, test-sized params
    python -m bench.quality.querydoc --seeds 1 --out a.json; …; python -m bench.quality.querydoc --merge a.json …
                                             # seeds in parallel processes, then one results file
                                             # and the BENCHMARKS.md section

The scenario of the data README ("Query → document"): gallery = every synset's old gloss vector
(all-MiniLM-L6-v2); the dataset = the new model's gloss features (all-mpnet-base-v2) paired with
them; evaluation = the held-out synsets' lemmas (40 %, the README's split for seed 0), relevant =
the query's own synset. Two variants:

- **without a query log**: the held-out lemmas are the only logged queries (by both models, so
  ``stay`` is measurable); nothing about queries reaches training or validation;
- **with a query log**: every training synset's lemma is logged too, by both models, with its
  synset as relevant — the training part teaches ``instance-map`` the query distribution and a
  share of it validates.

One ``auto`` run per variant and seed trains every candidate; the report gives each candidate's
validation and held-out figures beside stay, reindex and procrustes. JSON goes to
``bench/results/querydoc.json`` (``querydoc-quick.json`` for ``--quick``), a markdown table to
stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.run import QueryLog, UpgradeData, run_backbone_upgrade
from bench.common.report import replace_section
from bench.common.stats import t_interval, target_state
from bench.common.wordnet import FIELDS, NEW_MODEL, OLD_MODEL, REPO_ROOT, load_wordnet

RESULTS = REPO_ROOT / "bench/results/querydoc.json"
SECTION, TITLE = (
    "bench.quality.querydoc",
    "Query → document search, every alternative (bench.quality.querydoc)",
)
FIXTURE = REPO_ROOT / "tests/fixtures/wordnet_small.npz"
EVAL_FRACTION = 0.4
QUICK_PARAMS = {"epochs": 5}
VARIANTS = ("without query log", "with query log")
ROW_METRICS = ("recall@1", "recall@10", "mrr@100", "ndcg@10")
# The targets on this task (query view) and the instance floor.
TARGET_R10_NO_LOG = 0.46
TARGET_ARR_R10_LOG = 0.87
TARGET_INSTANCE_SHARE = 0.95


def load_arrays(quick: bool) -> dict[str, np.ndarray]:
    """Gloss (documents) and lemma (queries) features by both models: the committed fixture
    for ``quick``, else the full data."""
    if quick:
        with np.load(FIXTURE) as f:
            get = {k: f[k].astype(np.float32) for k in f.files if k.split(".")[0] in FIELDS}
    else:
        data = load_wordnet(fields=FIELDS)
        get = {f"{fld}.{m}": data.get(fld, m) for fld in FIELDS for m in (OLD_MODEL, NEW_MODEL)}
    return {
        "doc_old": get[f"gloss.{OLD_MODEL}"],
        "doc_new": get[f"gloss.{NEW_MODEL}"],
        "query_old": get[f"lemma.{OLD_MODEL}"],
        "query_new": get[f"lemma.{NEW_MODEL}"],
    }


def build_data(arrays: dict[str, np.ndarray], with_log: bool, seed: int) -> UpgradeData:
    n = arrays["doc_new"].shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    n_eval = int(np.floor(n * EVAL_FRACTION))
    held_out = np.sort(perm[n - n_eval :])
    rows = np.arange(n) if with_log else held_out
    queries = QueryLog(
        features=arrays["query_new"][rows],
        old_vectors=arrays["query_old"][rows],
        relevant=[np.array([i]) for i in rows],
    )
    return UpgradeData(arrays["doc_new"], arrays["doc_old"], None, queries)


def run_once(arrays: dict[str, np.ndarray], with_log: bool, seed: int, params: dict) -> dict:
    started = time.perf_counter()
    out = run_backbone_upgrade(
        "auto",
        build_data(arrays, with_log, seed),
        EuclideanLift(),
        params=params,
        seed=seed,
        eval_fraction=EVAL_FRACTION,
    )
    report = out.report
    rows: dict[str, dict[str, Any]] = {}
    for name in ("stay", "reindex", *[c["name"] for c in report["candidates"]]):
        m = report["metrics"][name]
        rows[name] = {
            "query": m.get("query"),
            "instance": m.get("instance"),
            "arr_query": m.get("arr", {}).get("query"),
        }
    chosen = report["chosen_candidate"]  # the candidate; out.method is its method
    rows["auto"] = {**rows[chosen], "chosen": chosen}
    return {
        "seed": seed,
        "variant": "with query log" if with_log else "without query log",
        "seconds": time.perf_counter() - started,
        "rows": rows,
        "candidates": report["candidates"],
        "recommendation": report["recommendation"],
        "auto": report["auto"],
    }


def _mean_sd(values: list[float | None]) -> tuple[float, float] | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    return float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0


def summarise(runs: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for variant in VARIANTS:
        vr = [r for r in runs if r["variant"] == variant]
        if not vr:
            continue
        table: dict[str, dict[str, Any]] = {}
        for name in vr[0]["rows"]:
            entry: dict[str, Any] = {}
            for metric in ROW_METRICS:
                entry[metric] = _mean_sd([(r["rows"][name]["query"] or {}).get(metric) for r in vr])
            entry["arr@10"] = _mean_sd(
                [(r["rows"][name]["arr_query"] or {}).get("recall@10") for r in vr]
            )
            entry["own_r1"] = _mean_sd(
                [(r["rows"][name]["instance"] or {}).get("recall@1") for r in vr]
            )
            if name == "auto":
                entry["chosen"] = [r["rows"]["auto"]["chosen"] for r in vr]
            table[name] = entry
        out[variant] = table
    return out


def _fmt(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return "—"
    return f"{pair[0]:.3f}" if pair[1] == 0 else f"{pair[0]:.3f} ± {pair[1]:.3f}"


def _seeds(runs: list[dict], variant: str, name: str, view: str, metric: str) -> list[float]:
    """Per seed of ``variant``: the row's figure (the runs of one variant share their seeds)."""
    return [
        float((r["rows"][name][view] or {})[metric])
        for r in sorted(runs, key=lambda r: r["seed"])
        if r["variant"] == variant
    ]


def _interval(values: tuple[float, float, float], sign: str = "+") -> str:
    """``mean [low, high]``; ``sign`` "+" for a difference, "" for a figure."""
    mean, low, high = values
    if not np.isfinite(low):
        return f"{mean:{sign}.3f}"
    return f"{mean:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def targets(summary: dict, runs: list[dict]) -> list[str]:
    """Each target judged on a 95 % t interval over the seeds (paired per seed where it compares
    two rows): met when it clears the target, missed when it lies below, else not shown."""
    lines = []
    if not runs:
        raise ValueError("the targets are judged on the runs (per seed), not on the summary alone")
    no_log, log = summary.get(VARIANTS[0]), summary.get(VARIANTS[1])
    for variant, table in ((VARIANTS[0], no_log), (VARIANTS[1], log)):
        if table is None:
            continue
        a, p = table["auto"], table["procrustes"]
        share = a["own_r1"][0] / p["own_r1"][0]
        auto = _seeds(runs, variant, "auto", "instance", "recall@1")
        proc = _seeds(runs, variant, "procrustes", "instance", "recall@1")
        diff = t_interval([x - TARGET_INSTANCE_SHARE * y for x, y in zip(auto, proc, strict=True)])
        lines.append(
            f"- {variant}: auto own-item R@1 {a['own_r1'][0]:.3f} = {share:.2f} × procrustes's "
            f"(target ≥ {TARGET_INSTANCE_SHARE}; auto − {TARGET_INSTANCE_SHARE} × procrustes "
            f"{_interval(diff)}) — " + target_state(diff, 0.0)
        )
    if no_log is not None:
        a, p = no_log["auto"], no_log["procrustes"]
        r10 = t_interval(_seeds(runs, VARIANTS[0], "auto", "query", "recall@10"))
        lines.append(
            f"- without query log: auto R@10 {_interval(r10, '')} (target ≥ {TARGET_R10_NO_LOG}) — "
            + target_state(r10, TARGET_R10_NO_LOG)
        )
        auto = _seeds(runs, VARIANTS[0], "auto", "query", "recall@1")
        proc = _seeds(runs, VARIANTS[0], "procrustes", "query", "recall@1")
        diff = t_interval([x - y for x, y in zip(auto, proc, strict=True)])
        lines.append(
            f"- without query log: auto R@1 {a['recall@1'][0]:.3f} vs procrustes "
            f"{p['recall@1'][0]:.3f}, auto − procrustes {_interval(diff)} — "
            + target_state(diff, 0.0)
        )
    if log is not None:
        arr = t_interval(
            [
                float((r["rows"]["auto"]["arr_query"] or {})["recall@10"])
                for r in runs
                if r["variant"] == VARIANTS[1]
            ]
        )
        lines.append(
            f"- with query log: auto ARR(R@10) {_interval(arr, '')} (target ≥ "
            f"{TARGET_ARR_R10_LOG}) — " + target_state(arr, TARGET_ARR_R10_LOG)
        )
    return lines


def render_markdown(payload: dict) -> str:
    lines = [
        f"Command: `{payload['command']}` — seeds {payload['seeds']}; {payload['n_items']} "
        f"synsets, {payload['eval_fraction']:.0%} held out; {payload['elapsed_minutes']:.1f} min "
        f"on {payload['machine']}.",
        "Query = lemma, document = gloss, relevant = own synset; gallery = every old gloss "
        "vector. Rows below `reindex` are `auto`'s candidates (each tuned on validation with "
        "the same number of trials), trained on the fit part.",
        "",
        *targets(payload["summary"], payload["runs"]),
        "",
        f"Each cell: mean ± standard deviation over the seeds {payload['seeds']} (not an "
        "interval; the targets above use t intervals over the seeds, paired where they compare "
        "two rows).",
        "",
    ]
    for variant, table in payload["summary"].items():
        lines += [
            f"### {variant}",
            "",
            "| search | R@1 | R@10 | MRR@100 | nDCG@10 | ARR(R@10) | own-item R@1 |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, e in table.items():
            label = name if name != "auto" else f"**auto** (chose {', '.join(e['chosen'])})"
            cells = [_fmt(e[m]) for m in ROW_METRICS] + [_fmt(e["arr@10"]), _fmt(e["own_r1"])]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def merge(paths: list[Path], out: Path, markdown: bool) -> dict[str, Any]:
    """One payload from runs written by separate invocations (other seeds, same code and data):
    their runs concatenated, summarised again, their minutes summed; optionally the
    BENCHMARKS.md section."""
    parts = [json.loads(p.read_text()) for p in paths]
    first = parts[0]
    for part in parts[1:]:
        for key in ("quick", "params", "n_items", "eval_fraction"):
            if part[key] != first[key]:
                raise ValueError(f"{key} differs between the files to merge")
    runs = [run for part in parts for run in part["runs"]]
    seeds = sorted({run["seed"] for run in runs})
    if len(runs) != len({(run["seed"], run["variant"]) for run in runs}):
        raise ValueError("a (seed, variant) run appears in more than one file")
    seed_list = ",".join(map(str, seeds))
    payload = {
        **first,
        "command": f"python -m bench.quality.querydoc{' --quick' if first['quick'] else ''} "
        f"--seeds {seed_list} (one process per seed, then --merge)",
        "seeds": seeds,
        "elapsed_minutes": sum(part["elapsed_minutes"] for part in parts),
        "runs": runs,
        "summary": summarise(runs),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    if markdown:
        replace_section(SECTION, TITLE, render_markdown(payload))
    return payload


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="lemma → gloss search: stay, reindex, bridges")
    parser.add_argument("--quick", action="store_true", help="the 800-synset fixture, < 1 min")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--variants", default="both", choices=("both", "log", "nolog"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--merge", nargs="+", type=Path, default=None, help="results files of other runs to merge"
    )
    parser.add_argument("--no-markdown", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.merge:
        out = args.out or RESULTS
        print(render_markdown(merge(args.merge, out, markdown=not args.no_markdown)))
        return out
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    arrays = load_arrays(args.quick)
    params = QUICK_PARAMS if args.quick else {}
    logs = {"both": (False, True), "log": (True,), "nolog": (False,)}[args.variants]
    started = time.time()
    runs = []
    for seed in seeds:
        for with_log in logs:
            run = run_once(arrays, with_log, seed, params)
            print(
                f"[{time.strftime('%H:%M:%S')}] seed {seed}, {run['variant']}: "
                f"{run['seconds']:.0f} s, chose {run['rows']['auto']['chosen']}",
                flush=True,
            )
            runs.append(run)
    command = "python -m bench.quality.querydoc" + (" --quick" if args.quick else "")
    if args.seeds != "0":
        command += f" --seeds {args.seeds}"
    payload = {
        "command": command,
        "quick": args.quick,
        "seeds": seeds,
        "params": params,
        "n_items": int(arrays["doc_new"].shape[0]),
        "eval_fraction": EVAL_FRACTION,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
        "elapsed_minutes": (time.time() - started) / 60,
        "summary": {},
        "runs": runs,
    }
    payload["summary"] = summarise(runs)
    out = args.out or (RESULTS.with_name("querydoc-quick.json") if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    print(render_markdown(payload))
    print(out)
    return out


if __name__ == "__main__":
    main()
