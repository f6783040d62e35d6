"""The default upgrade's wall time and the honesty of its ETA (issue 44 item 4).

    python -m bench.perf.training --default-upgrade          # the same as the line below
    python -m bench.perf.default_upgrade                     # results + its BENCHMARKS.md section
    python -m bench.perf.default_upgrade --quick             # the 800-synset fixture, no section
    python -m bench.perf.default_upgrade --halving off       # every trial at full length
    python -m bench.perf.default_upgrade --threads 2         # torch's two threads (see below)

The issue's case, as a user runs it: a gallery of every WordNet noun's old gloss vector (24,000,
all-MiniLM-L6-v2); a dataset pairing a seeded 60 % of them (14,400) with their new glosses
(all-mpnet-base-v2), the rest in the gallery without new features (``UpgradeData``'s
distractors); no query log. One ``auto`` upgrade with every default (``run_backbone_upgrade``,
as the service's worker runs it: the default torch threads, ``eval_fraction`` 0.2) is timed from
call to return, and every progress event is kept with its time. Threads: the service's rule
(``app.ml.upgrade.run.default_threads``: one intra-op thread on a host of ≤ 2 cores), or
``--threads``.

- **Time**: wall seconds, and the process's CPU seconds beside them (other people share the
  cores: a run under load is slower, and the load average at start and end is recorded).
- **ETA error**: at each progress event from 20 % of the run's wall time on, (reported ETA − time
  actually left) ÷ time actually left; the largest in magnitude up to 95 % (the last seconds
  divide by almost nothing) and the finish time the ETA implied, as a share of the whole run.
- **Held-out figures**: the upgrade report's own (instance view on its held-out items: stay,
  the served bridge, reindex), and the user's search — the lemmas of the 9,600 synsets the
  dataset does not pair, each relevant to its own gloss, against all 24,000 glosses (numpy:
  stay = old lemma → old glosses by cosine; bridge = the served model's query → the lifted old
  glosses by the Lorentz inner product; reindex = new lemma → new glosses by cosine).

JSON to ``bench/results/training_default_upgrade.json`` (``…_quick.json`` with ``--quick``,
``…_halving_off.json`` with ``--halving off``, ``…_threads<N>.json`` with ``--threads N``); the
section is written for the default full run only.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.geometry.space import EuclideanLift
from app.ml.methods.training import TrainingHooks
from app.ml.upgrade.run import UpgradeData, default_threads, run_backbone_upgrade
from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.wordnet import REPO_ROOT
from bench.quality.querydoc import load_arrays

RESULTS = REPO_ROOT / "bench/results/training_default_upgrade.json"
SECTION = "bench.perf.training.default_upgrade"
TITLE = "The default upgrade's time and ETA (bench.perf.training --default-upgrade)"
PAIRED_SHARE = 0.6
# The ETA is judged from this share of the run's wall time on (issue 44: "within ±30 % from
# 20 % done") up to ETA_UNTIL (past it the time left is a few seconds, and any error is large
# relative to it).
ETA_FROM, ETA_UNTIL = 0.2, 0.95
BLOCK = 1024  # query rows scored at once by the numpy searches


def scenario(arrays: dict[str, np.ndarray], seed: int) -> tuple[UpgradeData, np.ndarray]:
    """The issue's data: (the upgrade's input, the gallery order — paired rows first, then the
    unpaired ones, whose lemmas are the user's held-out queries)."""
    n = arrays["doc_new"].shape[0]
    perm = np.random.default_rng([seed, 44]).permutation(n)
    n_paired = round(PAIRED_SHARE * n)
    paired, unpaired = np.sort(perm[:n_paired]), np.sort(perm[n_paired:])
    data = UpgradeData(
        arrays["doc_new"][paired],
        arrays["doc_old"][paired],
        distractors=arrays["doc_old"][unpaired],
    )
    return data, np.concatenate([paired, unpaired])


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def user_search(
    arrays: dict[str, np.ndarray], order: np.ndarray, n_paired: int, model: Any, lift: EuclideanLift
) -> dict[str, dict[str, float]]:
    """R@1 / R@10 of the unpaired synsets' lemmas (each relevant to its own gloss) against every
    gloss of the gallery: stay, the served bridge and a reindex (every gloss re-embedded)."""
    synsets = order[n_paired:]
    targets = np.arange(n_paired, order.size)
    old_docs, new_docs = _unit(arrays["doc_old"][order]), _unit(arrays["doc_new"][order])
    points = lift(torch.from_numpy(arrays["doc_old"][order])).numpy().astype(np.float64)
    c = lift.curv
    time_x = np.sqrt(1 / c + (points * points).sum(axis=1))
    bridged = model.embed(arrays["query_new"][synsets]).astype(np.float64)
    time_q = np.sqrt(1 / c + (bridged * bridged).sum(axis=1))
    old_q, new_q = _unit(arrays["query_old"][synsets]), _unit(arrays["query_new"][synsets])
    searches = {
        "stay": lambda part: old_q[part] @ old_docs.T,
        # ⟨q, x⟩_L = q·x − q₀x₀: larger is nearer.
        "bridge": lambda part: bridged[part] @ points.T - np.outer(time_q[part], time_x),
        "reindex": lambda part: new_q[part] @ new_docs.T,
    }
    out = {}
    for name, search in searches.items():
        ranks = np.empty(targets.size, dtype=np.int64)
        for start in range(0, targets.size, BLOCK):
            part = slice(start, start + BLOCK)
            scores = search(part)
            own = scores[np.arange(scores.shape[0]), targets[part]]
            ranks[part] = (scores > own[:, None]).sum(axis=1)
        out[name] = {"recall@1": float((ranks < 1).mean()), "recall@10": float((ranks < 10).mean())}
    return out


def eta_errors(events: list[dict[str, Any]], total: float) -> dict[str, Any]:
    """The ETA against the time actually left, from ``ETA_FROM`` of the run on."""
    points = []
    for e in events:
        if e.get("eta_s") is None:
            continue
        t = float(e["t"])
        left = total - t
        points.append(
            {
                "t": t,
                "done": t / total,
                "eta_s": float(e["eta_s"]),
                "left_s": left,
                "error": (float(e["eta_s"]) - left) / left if left > 0 else None,
                "finish_error": (t + float(e["eta_s"]) - total) / total,
            }
        )
    judged = [p for p in points if ETA_FROM <= p["done"] <= ETA_UNTIL and p["error"] is not None]
    worst = max(judged, key=lambda p: abs(p["error"]), default=None)
    return {
        "from": ETA_FROM,
        "until": ETA_UNTIL,
        "events_judged": len(judged),
        "max_abs_error": None if worst is None else abs(worst["error"]),
        "worst": worst,
        "max_abs_finish_error": max((abs(p["finish_error"]) for p in judged), default=None),
        # Every tenth point of the whole run, for the curve.
        "trace": points[:: max(1, len(points) // 60)],
    }


def phases(events: list[dict[str, Any]], total: float) -> dict[str, float]:
    """Wall seconds spent evaluating — the validation evaluations that ended (the events'
    ``evaluated_s``) and the held-out one (from its event to the end) — and the rest, training."""
    evaluating = 0.0
    if events:
        last = events[-1]
        evaluating = float(last.get("evaluated_s") or 0.0)
        if last.get("phase") == "evaluating":
            evaluating += total - float(last["t"])
    return {"training": total - evaluating, "evaluating": evaluating}


def run(
    arrays: dict[str, np.ndarray], seed: int, halving: bool, threads: int | None = None
) -> dict[str, Any]:
    data, order = scenario(arrays, seed)
    lift = EuclideanLift()
    events: list[dict[str, Any]] = []
    began = time.perf_counter()

    def progress(event: dict[str, Any]) -> None:
        events.append({"t": time.perf_counter() - began, **event})

    cpu = time.process_time()
    outcome = run_backbone_upgrade(
        "auto",
        data,
        lift,
        params=None if halving else {"halving": False},
        seed=seed,
        hooks=TrainingHooks(progress=progress),
        threads=threads,
    )
    total = time.perf_counter() - began
    cpu = time.process_time() - cpu
    report = outcome.report
    chosen = report["chosen_candidate"]
    metrics = report["metrics"]
    candidates = {
        c["name"]: {
            "chosen_settings": c["chosen_settings"],
            "validation_r1": c["validation"].get("instance", {}).get("recall@1"),
            "epochs_trained": c.get("epochs_trained"),
            "trials": len(c["trials"]),
        }
        for c in report["candidates"]
    }
    return {
        "seed": seed,
        "halving": halving,
        # The intra-op threads the upgrade ran with (None: torch's own setting).
        "threads": default_threads() if threads is None else threads,
        "threads_rule": "the service's default" if threads is None else "--threads",
        "torch_threads_outside": torch.get_num_threads(),
        "items": int(order.size),
        "paired": len(data),
        "seconds": total,
        "cpu_seconds": cpu,
        "phases": phases(events, total),
        "eta": eta_errors(events, total),
        "events": len(events),
        "chosen": chosen,
        "recommendation": report["recommendation"]["action"],
        "epochs_trained": report["auto"].get("halving", {}).get("epochs_trained"),
        "candidates": candidates,
        "held_out": {name: metrics[name]["instance"] for name in ("stay", chosen, "reindex")},
        "held_out_items": report["n_eval"],
        "user_queries": int(order.size - len(data)),
        "user_search": user_search(arrays, order, len(data), outcome.model, lift),
    }


def _threads(r: dict[str, Any]) -> str:
    if r.get("threads") is None:
        return "torch's own intra-op threads"
    rule = "the service's rule on this host" if r.get("threads_rule") != "--threads" else "set"
    return f"{r['threads']} torch intra-op thread(s) during the upgrade ({rule})"


def _f(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def render_markdown(result: dict[str, Any]) -> str:
    r = result["run"]
    eta = r["eta"]
    worst = eta["worst"]
    lines = [
        f"Command: `{result['command']}` — seed {r['seed']}; {r['items']:,} old gloss vectors "
        f"in the gallery, {r['paired']:,} paired with new features, no query log; every "
        "default (`auto`, successive halving "
        + ("on" if r["halving"] else "off")
        + "; "
        + _threads(r)
        + "). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        "| measure | value |",
        "|---|---|",
        f"| wall time | {r['seconds']:.0f} s ({r['seconds'] / 60:.1f} min) |",
        f"| CPU time of the process | {r['cpu_seconds']:.0f} s |",
        f"| training / evaluating (wall) | {r['phases']['training']:.0f} s / "
        f"{r['phases']['evaluating']:.0f} s |",
        f"| epochs trained, every candidate | {r['epochs_trained']} |",
        f"| largest ETA error, {eta['from']:.0%}–{eta['until']:.0%} of the run "
        f"({eta['events_judged']} progress events) | {_f(eta['max_abs_error'], 2)}"
        + (
            f" (at {worst['done']:.0%}: ETA {worst['eta_s']:.0f} s, {worst['left_s']:.0f} s "
            "actually left)"
            if worst
            else ""
        )
        + " |",
        f"| largest error of the finish time the ETA implied, ÷ the run | "
        f"{_f(eta['max_abs_finish_error'], 2)} |",
        f"| served | `{r['chosen']}` (verdict `{r['recommendation']}`) |",
        "",
        f"Held-out figures. *Report*: the upgrade's own, own-item search of its "
        f"{r['held_out_items']:,} held-out items. *User*: the {r['user_queries']:,} unpaired "
        "synsets' lemmas against every gloss (numpy; reindex = every gloss re-embedded).",
        "",
        "| | report R@1 | report R@10 | user R@1 | user R@10 |",
        "|---|---|---|---|---|",
    ]
    for name, label in (
        ("stay", "stay"),
        (r["chosen"], f"bridge (`{r['chosen']}`)"),
        ("reindex", "reindex"),
    ):
        held = r["held_out"][name]
        user = r["user_search"]["bridge" if name == r["chosen"] else name]
        lines.append(
            f"| {label} | {_f(held['recall@1'])} | {_f(held['recall@10'])} | "
            f"{_f(user['recall@1'])} | {_f(user['recall@10'])} |"
        )
    lines += [
        "",
        "| candidate | chosen setting | validation own-item R@1 | trials | epochs trained |",
        "|---|---|---|---|---|",
    ]
    for name, c in r["candidates"].items():
        setting = ", ".join(f"{k} {v}" for k, v in c["chosen_settings"].items()) or "—"
        lines.append(
            f"| {name} | {setting} | {_f(c['validation_r1'], 4)} | {c['trials']} | "
            f"{c['epochs_trained']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None, command: str | None = None) -> Path:
    """``command``: how the run is named in its results (``bench.perf.training`` passes its
    own ``--default-upgrade`` command line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 800-synset fixture")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--halving", choices=("on", "off"), default="on")
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads (default: the service's)"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    arrays = load_arrays(args.quick)
    load_start = load_average()
    tic = time.perf_counter()
    measured = run(arrays, args.seed, args.halving == "on", args.threads)
    result = {
        **run_record(command or command_line("bench.perf.default_upgrade", argv), tic, load_start),
        "quick": args.quick,
        "nice": os.nice(0),
        "run": measured,
    }
    suffix = "_quick" if args.quick else "" if args.halving == "on" else "_halving_off"
    suffix += "" if args.threads is None else f"_threads{args.threads}"
    out = args.out or RESULTS.with_name(f"training_default_upgrade{suffix}.json")
    variant = args.halving == "off" or args.threads is not None
    markdown = not (args.quick or args.no_markdown or variant or args.out)
    publish(result, out, render_markdown(result), SECTION if markdown else None, TITLE)
    return out


if __name__ == "__main__":
    main()
