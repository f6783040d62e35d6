"""Training cost: HBCT epochs against the Euclidean baselines, HMCL steps against plain AdamW.

    python -m bench.perf.training          # bench/results/training.json and its BENCHMARKS.md section
    python -m bench.perf.training --quick  # 1,000 rows, fewer steps (about a minute)
    python -m bench.perf.training --default-upgrade [--quick]  # the default upgrade's time and
        # ETA error (bench.perf.default_upgrade: training_default_upgrade.json, its own section)

HBCT and baselines: ``train_compatible_model`` on the WordNet-noun gloss rows with a fine label
(new model = all-mpnet-base-v2 features, 768-d; old space = all-MiniLM-L6-v2 lifted, 384-d),
each method for a few epochs in turn, two rounds in a fresh random order; epoch time = median of
the per-epoch wall times (from the trainer's progress hook), first epoch of each run dropped
(warm-up). Device: CUDA when torch sees one, else the CPU.

HMCL: ``bench.quality.continual_timing.time_steps`` (one AdamW step on a mini-batch of task 2 of the continual
stream, task 1 protected; methods interleaved round by round) with both modalities embedded by
the 384-d MiniLM and by the 768-d MPNet encoder. Ratio = median over rounds of method step /
plain-AdamW ("finetune") step; the paper reports 1.02× (MR) and 1.04× (CA).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.geometry.space import EuclideanLift
from app.ml.hmcl import METHODS
from app.ml.methods.compat import resolve_device, train_compatible_model
from app.ml.methods.training import TrainingHooks
from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.tiled import lift_points
from bench.common.wordnet import (
    NEW_MODEL,
    OLD_MODEL,
    REPO_ROOT,
    encode_labels,
    fine_labels,
    load_wordnet,
)
from bench.perf import default_upgrade
from bench.quality.continual import build_tasks, load_corpus
from bench.quality.continual_timing import time_steps

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.training"
COMPAT_METHODS = ("hbct", "hbct-noentail", "independent", "l2", "bct", "contrastive")
EUCLIDEAN = ("l2", "bct", "contrastive")


def epoch_times(
    method: str,
    new: np.ndarray,
    old_points: np.ndarray,
    labels: np.ndarray,
    epochs: int,
    device: torch.device,
) -> list[float]:
    """Wall time of each epoch after the first (the first carries one-off set-up costs)."""
    stamps: list[float] = []
    hooks = TrainingHooks(progress=lambda _: stamps.append(time.perf_counter()))
    train_compatible_model(
        method, new, old_points, labels, 1.0, {"epochs": epochs}, seed=0, hooks=hooks, device=device
    )
    return [b - a for a, b in itertools.pairwise(stamps)]


def bench_compat(quick: bool, device: torch.device, seed: int) -> dict[str, Any]:
    data = load_wordnet(fields=("gloss",), models=(OLD_MODEL, NEW_MODEL))
    keep, fine = fine_labels(data.meta)
    # An evenly spread subset: epoch time is linear in the rows, and the full benchmark must
    # stay within minutes on two cores.
    subset = np.linspace(0, len(keep) - 1, 1000 if quick else 8000).astype(int)
    keep, fine = keep[subset], [fine[i] for i in subset]
    labels, _ = encode_labels(fine)
    new = data.get("gloss", NEW_MODEL)[keep]
    old_points = lift_points(data.get("gloss", OLD_MODEL)[keep], EuclideanLift())
    epochs = 3
    times: dict[str, list[float]] = {m: [] for m in COMPAT_METHODS}
    rng = np.random.default_rng(seed)
    for _ in range(2):
        for method in rng.permutation(COMPAT_METHODS):
            times[str(method)] += epoch_times(str(method), new, old_points, labels, epochs, device)
            print(f"  {method}: {np.median(times[str(method)]):.2f} s/epoch", flush=True)
    median = {m: float(np.median(t)) for m, t in times.items()}
    fastest_euclidean = min(median[m] for m in EUCLIDEAN)
    return {
        "rows": len(keep),
        "epochs_per_run": epochs,
        "device": str(device),
        "epoch_s_median": median,
        "epoch_s_all": times,
        "hbct_vs_fastest_euclidean": median["hbct"] / fastest_euclidean,
        "hbct_vs_independent": median["hbct"] / median["independent"],
    }


def bench_hmcl(quick: bool, seed: int) -> dict[str, Any]:
    out = {}
    for encoder in (OLD_MODEL, NEW_MODEL):
        corpus = load_corpus(encoder)
        tasks = build_tasks(corpus, 300 if quick else 0, seed)
        timing = time_steps(tasks, {m: {} for m in METHODS}, 5 if quick else 40, seed)
        dim = next(iter(tasks[0].train.values())).shape[1]
        out[str(dim)] = {"encoder": encoder, **timing}
        print(
            f"  d={dim}: " + ", ".join(f"{m} {timing[m]['ratio_median']:.3f}×" for m in METHODS),
            flush=True,
        )
    return out


def hmcl_caption(hmcl: dict[str, Any]) -> str:
    """What the HMCL table timed. ``time_steps`` records ``dim`` since it times one mini-batch
    step; a results file without it was timed by the earlier ``time_steps`` (one accumulated step
    over the whole of task 2, before CA became the exact closest admissible update), and its
    caption must say so rather than describe the current code."""
    if all("dim" in t for t in hmcl.values()):
        return (
            "**HMCL steps against plain AdamW** (`bench.quality.continual_timing.time_steps`: "
            "one AdamW step on a mini-batch of task 2's pairs, task 1 protected; ratio = median "
            "over interleaved rounds; CPU):"
        )
    return (
        "**HMCL steps against plain AdamW** (`bench.quality.continual.time_steps`: one "
        "accumulated step over task 2, task 1 protected; ratio = median over interleaved "
        "rounds; CPU). *Taken before CA became the exact closest admissible update and before "
        "mini-batch steps (issue 13); the current figures are in the continual section above.*"
    )


def render_markdown(result: dict[str, Any]) -> str:
    c = result["compat"]
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"**HBCT against the baselines** ({c['rows']:,} labelled WordNet gloss rows, MPNet → "
        f"lifted MiniLM, batch 512, device {c['device']}; median epoch time over two runs of "
        f"{c['epochs_per_run']} epochs each, first epoch of a run dropped):",
        "",
        "| method | s / epoch | ÷ independent |",
        "|---|---|---|",
    ]
    for m in COMPAT_METHODS:
        t = c["epoch_s_median"][m]
        lines.append(f"| {m} | {t:.2f} | {t / c['epoch_s_median']['independent']:.2f} |")
    lines += [
        "",
        f"HBCT ÷ fastest Euclidean baseline: {c['hbct_vs_fastest_euclidean']:.2f}.",
        "",
        hmcl_caption(result["hmcl"]),
        "",
        "| d | encoder | rows | method | step ms (median) | correction ms | ratio to AdamW "
        "(median, IQR) |",
        "|---|---|---|---|---|---|---|",
    ]
    for dim, t in result["hmcl"].items():
        for m in METHODS:
            r = t[m]
            lines.append(
                f"| {dim} | {t['encoder']} | {t['rows']:,} | {m} | {r['step_ms_median']:.1f} | "
                f"{r['correction_ms_median']:.2f} | {r['ratio_median']:.3f} "
                f"({r['ratio_iqr'][0]:.3f}–{r['ratio_iqr'][1]:.3f}) |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | Path:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if "--default-upgrade" in args_list:
        rest = [a for a in args_list if a != "--default-upgrade"]
        return default_upgrade.main(rest, command_line("bench.perf.training", args_list))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA if present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    load_start = load_average()
    tic = time.perf_counter()
    print("HBCT and baselines:", flush=True)
    compat = bench_compat(args.quick, device, args.seed)
    print("HMCL steps:", flush=True)
    hmcl = bench_hmcl(args.quick, args.seed)
    result = {
        **run_record(command_line("bench.perf.training", argv), tic, load_start),
        "compat": compat,
        "hmcl": hmcl,
    }
    out = args.out or RESULTS / ("training_quick.json" if args.quick else "training.json")
    section = None if args.no_markdown else SECTION
    publish(
        result, Path(out), render_markdown(result), section, "Training cost (bench.perf.training)"
    )
    return result


if __name__ == "__main__":
    main()
