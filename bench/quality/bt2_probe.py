"""BT²-style extra dimensions against class-map, through the service's ``auto`` (issue 26 item 5).

    python -m bench.quality.bt2_probe                  # external, split seeds 0..2, --final
    python -m bench.quality.bt2_probe --quick          # the committed fixture, seconds

Per split seed (the same splits as ``bench.quality.compat``: each seed its own train /
evaluation split and validation carve, 15 % held back from every development run), on the
``external`` scenario (old = the raw MiniLM vectors, lifted; new = MPNet): the service's ``auto``
run twice with objective ``class``, once restricted to ``class-map`` and once to
``class-map-bt2`` (each with procrustes, which auto always trains; the same 3 + 2 validation
trials on ``class_weight``, the same instance floor), each trained on the training part and
measured on the evaluation part and on the held-back items. P_com / P_up use the independent
head as ``bench.quality.compat`` selects it (its base temperature chosen on the validation carve).
The table shows each arm's mean and 95 % interval across seeds, and the paired difference
(bt2 − class-map, per seed) with its interval: the question is whether the extra dimensions help,
and the pairing removes the split's own variation.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from app.ml.auto.candidates import AutoParams
from app.ml.evaluation.retrieval import json_safe
from app.ml.upgrade.alternatives import assemble, measure_bridge, measure_reindex, measure_stay
from app.ml.upgrade.pipeline import run_auto
from bench.common.report import command_line, publish
from bench.common.stats import t_interval
from bench.common.wordnet import REPO_ROOT
from bench.common.workers import exit_with_parent
from bench.quality.compat import EMPTY, FULL, QUICK, RunConfig, ScenarioRun
from bench.quality.compat_report import _flatten
from bench.quality.compat_scenarios import SCENARIOS, load_split

RESULTS = REPO_ROOT / "bench/results/bt2_probe.json"
SECTION = "bench.quality.bt2_probe"
ARMS = ("class-map", "class-map-bt2")
SCENARIO = "external"
# A development probe scores the evaluation part only: the held-back items are for the compat
# benchmark's one final look (issue 42 item 3). Its earlier results scored issue 26's draw, since
# replaced; the table still shows them, labelled as such.
PARTS = {"evaluation": False}
COLUMNS = (
    ("new→old CMC@1", "class.cmc1"),
    ("new→old mAP@100", "class.map@100"),
    ("own space CMC@1", "class_own_space.cmc1"),
    ("P_com CMC@1", "p_com.cmc1"),
    ("P_up CMC@1", "p_up.cmc1"),
    ("own-item R@1", "instance.recall@1"),
)


def run_seed(seed: int, cfg: RunConfig, quick: bool, threads: int) -> dict[str, Any]:
    """One split seed: the independent head's selection and training (the P_com reference),
    then each arm's auto run, measured on the evaluation part and the held-back items."""
    torch.set_num_threads(threads)
    scenario = next(s for s in SCENARIOS if s.name == SCENARIO)
    split = load_split(quick, seed)
    run = ScenarioRun(scenario, split, cfg)
    selection = run.select(methods=("independent", "procrustes"))
    base = run.methods(selection, methods=("independent",), final=True)
    ctx = run.context()
    out: dict[str, Any] = {"seed": seed, "arms": {}, "seconds": {}}
    measured: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
    for arm in ARMS:
        t0 = time.perf_counter()
        params = AutoParams.from_dict({**cfg.auto_params, "candidates": [arm]})
        outcome = run_auto(ctx, params, "class", split.train, split.evaluation, EMPTY, EMPTY)
        report = outcome.report
        by_name = {c["name"]: c for c in report["candidates"]}
        out["arms"][arm] = {
            "chosen": report["chosen_candidate"],
            "chosen_settings": by_name[report["chosen_candidate"]]["chosen_settings"],
            "tried": [t["settings"] for t in by_name[arm]["trials"]],
            "validation": by_name[arm]["validation"],
        }
        for part, final in PARTS.items():
            measured[part][arm] = measure_bridge(run.evaluation_set(ctx, final), outcome.model)
        out["seconds"][arm] = time.perf_counter() - t0
    for part, final in PARTS.items():
        ev = run.evaluation_set(ctx, final)
        independent = base[part]["independent"]
        out[part] = assemble(measure_stay(ev), measure_reindex(ev), measured[part], independent)
    return json_safe(out)


def _stat(values: list[float], signed: bool = False) -> str:
    mean, low, high = t_interval(values)
    f = "{:+.3f}" if signed else "{:.3f}"
    if len(values) < 2:
        return f.format(mean)
    return f"{f.format(mean)} [{f.format(low)}, {f.format(high)}]"


def _column(runs: list[dict[str, Any]], part: str, row: str, key: str) -> list[float]:
    return [dict(_flatten(r[part][row]))[key] for r in runs]


def summary_markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    lines = [
        f"Command: `{result['command']}` — scenario `{SCENARIO}`, split seeds "
        f"{[r['seed'] for r in runs]} (the splits of `bench.quality.compat`), {result['epochs']} "
        f"epochs, {result['elapsed_minutes']:.1f} min on {result['machine']}.",
        "",
        "The service's `auto` (objective `class`) restricted to one candidate (plus procrustes, "
        "which auto always trains), 3 + 2 validation trials on `class_weight` under the instance "
        "floor; `class-map-bt2` is class-map whose own-space prototype term also sees 128 extra "
        "dimensions the served map never outputs. Mean [95 % interval across seeds]; the last "
        "row is the paired difference per seed.",
        "",
    ]
    for arm in ARMS:
        picks = [f"{r['arms'][arm]['chosen']} {r['arms'][arm]['chosen_settings']}" for r in runs]
        lines.append(f"- `{arm}` served, per seed: " + "; ".join(picks))
    for part in [p for p in ("evaluation", "held_back") if p in runs[0]]:
        title = (
            "Evaluation part"
            if part == "evaluation"
            else "Held-back items of issue 26's draw (scored by this probe; replaced by a fresh "
            "draw in issue 42, which no probe scores)"
        )
        lines += ["", f"{title}:", ""]
        lines.append("| | " + " | ".join(c for c, _ in COLUMNS) + " |")
        lines.append("|---" * (len(COLUMNS) + 1) + "|")
        stay = [
            _stat(_column(runs, part, "stay", k)) if k.startswith(("class.", "instance.")) else "—"
            for _, k in COLUMNS
        ]
        lines.append("| stay (old→old) | " + " | ".join(stay) + " |")
        for arm in ARMS:
            cells = [_stat(_column(runs, part, arm, k), k.startswith("p_")) for _, k in COLUMNS]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        diffs = []
        for _, key in COLUMNS:
            a, b = _column(runs, part, ARMS[0], key), _column(runs, part, ARMS[1], key)
            diffs.append(_stat([y - x for x, y in zip(a, b, strict=True)], signed=True))
        lines.append("| bt2 − class-map | " + " | ".join(diffs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="BT²-style extra dimensions vs class-map")
    parser.add_argument("--quick", action="store_true", help="the committed fixture, seconds")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once, one process each")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    started = time.time()
    cfg = QUICK if args.quick else FULL
    seeds = list(range(args.seeds))
    if args.jobs <= 1:
        runs = [run_seed(s, cfg, args.quick, args.threads) for s in seeds]
    else:
        with ProcessPoolExecutor(
            max_workers=args.jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=exit_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = [pool.submit(run_seed, s, cfg, args.quick, args.threads) for s in seeds]
            runs = [f.result() for f in futures]
    result = {
        "command": command_line("bench.quality.bt2_probe", argv),
        "quick": args.quick,
        "scenario": SCENARIO,
        "epochs": cfg.epochs,
        "machine": f"{os.uname().machine}, {args.threads} torch thread(s), {args.jobs} job(s)",
        "elapsed_minutes": (time.time() - started) / 60,
        "runs": runs,
    }
    out = args.out or (RESULTS.with_name("bt2_probe-quick.json") if args.quick else RESULTS)
    section = None if args.no_markdown or args.quick else SECTION
    title = "BT²-style extra dimensions against class-map (`bench.quality.bt2_probe`)"
    publish(result, out, summary_markdown(result), section, title)
    return out


if __name__ == "__main__":
    main()
