"""Continual upgrades on real data: HMCL (CA, MR) against fine-tuning and EWC.

    python -m bench.continual            # full run: writes bench/results/continual.json and
                                         # the continual section of BENCHMARKS.md
    python -m bench.continual --quick    # smaller tasks, fewer epochs (≤ 3 minutes on 2 cores)

A stream of 8 tasks, each a fixed group of WordNet noun lexicographer files; two modalities, the
lemma text and the gloss text of each synset, both embedded by one frozen encoder
(all-MiniLM-L6-v2, from the shared WordNet-noun data). Every method trains the same Lorentz
linear heads on the same schedule. Per task: symmetric recall@5 lemma↔gloss on the task's held-out
items, and classification of held-out glosses among the task's fine classes by the nearest
class-name embedding (the class's ancestor synset lemmas, through the lemma head). Reported per
method, mean ± sd over seeds: final, BWT (final − right after the task), Overall (mean over t of
the mean over tasks ≤ t after task t), the four drift measures on old tasks' held-out items
(version at the task's end vs final version), no-backfill recall@5 (each old task's gloss gallery
embedded by the version at its end, queried by the final model's lemma embeddings, with and
without the recorded rotations, as a fraction of the task-end recall@5) and the per-step time
ratio of each method to plain AdamW.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.hmcl import (
    METHODS,
    ContinualParams,
    TaskTrainer,
    fit_shared_rotation,
    map_query_to_ancestor,
    run_continual_task,
)
from app.ml.hmcl_metrics import (
    DRIFT_MEASURES,
    drift_measures,
    nearest_class_accuracy,
    paired_recall_at_k,
    symmetric_recall_at_k,
)
from bench.report import replace_section
from bench.wordnet import OLD_MODEL, REPO_ROOT, WordNetData, fine_labels, load_wordnet

# The task stream: lexicographer files grouped by theme, in this fixed order.
TASK_GROUPS: tuple[tuple[str, ...], ...] = (
    ("noun.animal", "noun.body"),
    ("noun.artifact",),
    ("noun.person", "noun.group"),
    ("noun.plant", "noun.food"),
    ("noun.act", "noun.event", "noun.process", "noun.phenomenon"),
    ("noun.communication", "noun.cognition", "noun.feeling"),
    ("noun.location", "noun.object", "noun.substance"),
    (
        "noun.state",
        "noun.attribute",
        "noun.quantity",
        "noun.possession",
        "noun.time",
        "noun.relation",
        "noun.shape",
    ),
)
MODALITIES = ("lemma", "gloss")  # lemma first: the concept's name is the entailment apex
QUERY, GALLERY = "lemma", "gloss"
ENCODER = OLD_MODEL
RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.continual"
DRIFT_ANCHORS = 300  # held-out items per old task used for the drift measures


@dataclass
class Task:
    name: str
    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    test_labels: np.ndarray  # indices into class_names
    class_names: np.ndarray  # lemma features of the task's class names


@dataclass
class Config:
    quick: bool
    seeds: tuple[int, ...]
    items_per_task: int
    epochs: int
    timing_repeats: int
    methods: tuple[str, ...]
    params: dict[str, dict[str, Any]]


@dataclass
class Corpus:
    """The WordNet-noun rows with a fine label, their features, and where class names live."""

    data: WordNetData
    ancestors: WordNetData
    keep: np.ndarray
    labels: list[str]
    encoder: str = ENCODER


def load_corpus(encoder: str = ENCODER) -> Corpus:
    """The corpus with both modalities embedded by ``encoder`` (``bench.training`` also times
    the 768-d all-mpnet-base-v2)."""
    data = load_wordnet(fields=MODALITIES, models=(encoder,))
    ancestors = load_wordnet(fields=("lemma",), models=(encoder,), prefix="ancestors.")
    keep, labels = fine_labels(data.meta)
    return Corpus(data, ancestors, keep, labels, encoder)


def build_tasks(corpus: Corpus, items_per_task: int, seed: int) -> list[Task]:
    """Each task: up to ``items_per_task`` labelled synsets of its lexnames (0: all of them),
    split 60/40 by seed."""
    data, ancestors, keep, labels = corpus.data, corpus.ancestors, corpus.keep, corpus.labels
    encoder = corpus.encoder
    where = {m["synset_id"]: ("main", i) for i, m in enumerate(data.meta)}
    where.update({m["synset_id"]: ("anc", i) for i, m in enumerate(ancestors.meta)})
    rng = np.random.default_rng(seed)
    tasks = []
    for group in TASK_GROUPS:
        rows = np.array(
            [i for i, lab in zip(keep, labels, strict=True) if lab.split("/")[0] in group]
        )
        row_labels = {int(i): lab for i, lab in zip(keep, labels, strict=True)}
        chosen = rng.permutation(rows)[: items_per_task or None]
        cut = round(0.6 * len(chosen))
        train, test = chosen[:cut], chosen[cut:]
        classes = sorted({row_labels[int(i)] for i in test})
        index = {c: k for k, c in enumerate(classes)}
        names = []
        for c in classes:
            source, i = where[c.split("/", 1)[1]]
            names.append((data if source == "main" else ancestors).get("lemma", encoder)[i])
        tasks.append(
            Task(
                name="+".join(g.removeprefix("noun.") for g in group),
                train={m: data.get(m, encoder)[train] for m in MODALITIES},
                test={m: data.get(m, encoder)[test] for m in MODALITIES},
                test_labels=np.array([index[row_labels[int(i)]] for i in test]),
                class_names=np.stack(names),
            )
        )
    return tasks


def evaluate(model, task: Task) -> tuple[float, float]:
    """(symmetric recall@5 lemma↔gloss, gloss → class-name accuracy) on the task's test items."""
    emb = {m: model.embed(task.test[m], m) for m in MODALITIES}
    recall = symmetric_recall_at_k(emb, model.curv, k=5)
    class_emb = model.embed(task.class_names, QUERY)
    acc = nearest_class_accuracy(emb[GALLERY], class_emb, task.test_labels, model.curv)
    return recall, acc


def continual_figures(matrix: np.ndarray) -> dict[str, float]:
    """matrix[t, i] = performance on task i after task t (i ≤ t). Final, BWT and Overall."""
    n = len(matrix)
    final = float(np.mean(matrix[-1]))
    bwt = float(np.mean([matrix[-1, i] - matrix[i, i] for i in range(n - 1)]))
    overall = float(np.mean([np.mean(matrix[t, : t + 1]) for t in range(n)]))
    return {"final": final, "bwt": bwt, "overall": overall}


def run_method(method: str, tasks: Sequence[Task], params: dict[str, Any], seed: int) -> dict:
    """Train the stream with one method; every figure of the table for this (method, seed)."""
    n = len(tasks)
    recall = np.full((n, n), np.nan)
    accuracy = np.full((n, n), np.nan)
    state, versions, rotations, procrustes = None, [], [], []
    tic = time.perf_counter()
    for t, task in enumerate(tasks):
        result = run_continual_task(
            method, state, task.train, None, params=params, seed=seed * 1000 + t
        )
        if state is not None:
            # Post-hoc Procrustes fit for every method (shows what a rotation alone can repair).
            old_heads, new_heads = state.heads, result.state.heads
            procrustes.append(
                fit_shared_rotation(old_heads, new_heads, state.second_moments).numpy()
            )
        else:
            procrustes.append(np.eye(result.model.dim))
        state = result.state
        versions.append(result.model)
        rotations.append(result.rotation)
        for i in range(t + 1):
            recall[t, i], accuracy[t, i] = evaluate(result.model, tasks[i])
    train_seconds = time.perf_counter() - tic

    final = versions[-1]
    drift = {k: [] for k in DRIFT_MEASURES}
    nobackfill = {"plain": [], "recorded_rotation": [], "procrustes_rotation": [], "backfilled": []}
    for i in range(n - 1):
        test = {m: tasks[i].test[m][:DRIFT_ANCHORS] for m in MODALITIES}
        before = {m: versions[i].embed(test[m], m) for m in MODALITIES}
        after = {m: final.embed(test[m], m) for m in MODALITIES}
        for k, v in drift_measures(before, after, final.curv).items():
            drift[k].append(v)
        gallery = versions[i].embed(tasks[i].test[GALLERY], GALLERY)
        task_end = paired_recall_at_k(
            versions[i].embed(tasks[i].test[QUERY], QUERY), gallery, final.curv
        )
        query = final.embed(tasks[i].test[QUERY], QUERY)
        variants = {
            "plain": query,
            "recorded_rotation": map_query_to_ancestor(query, rotations[i + 1 :]),
            "procrustes_rotation": map_query_to_ancestor(query, procrustes[i + 1 :]),
            "backfilled": None,
        }
        for name, q in variants.items():
            if name == "backfilled":
                r = paired_recall_at_k(
                    query, final.embed(tasks[i].test[GALLERY], GALLERY), final.curv
                )
            else:
                r = paired_recall_at_k(q, gallery, final.curv)
            nobackfill[name].append(r / task_end)
    return {
        "recall_at_5": continual_figures(recall),
        "accuracy": continual_figures(accuracy),
        "recall_matrix": recall.tolist(),
        "accuracy_matrix": accuracy.tolist(),
        "drift": {k: float(np.mean(v)) for k, v in drift.items()},
        "no_backfill_fraction": {k: float(np.mean(v)) for k, v in nobackfill.items()},
        "train_seconds": train_seconds,
    }


def time_steps(
    tasks: Sequence[Task], params: Mapping[str, dict[str, Any]], repeats: int, seed: int
) -> dict[str, Any]:
    """Per-step wall time of every method on task 2 (protected data = task 1), interleaved.

    One trainer per method, all starting from the same task-1 state; each round steps every
    trainer once in a fresh random order, so CPU contention from other processes falls on all
    methods alike. Ratios: median over rounds of (method step / plain AdamW step in that round).
    """
    first = run_continual_task(
        "finetune", None, tasks[0].train, None, params=params["finetune"], seed=seed
    )
    trainers = {
        m: TaskTrainer(m, first.state, tasks[1].train, None, params=params[m], seed=seed)
        for m in METHODS
    }
    # One mini-batch of the task, the same for every method and round.
    batch = torch.arange(min(trainers["finetune"].rows, trainers["finetune"].params.batch_size))
    for trainer in trainers.values():  # warm-up: allocator, first-call overheads
        trainer.train_step(batch)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    correction: dict[str, list[float]] = {m: [] for m in METHODS}
    order = list(METHODS)
    rng = np.random.default_rng(seed)
    for _ in range(repeats):
        rng.shuffle(order)
        for m in order:
            before = trainers[m].correction_seconds
            tic = time.perf_counter()
            trainers[m].train_step(batch)
            times[m].append(time.perf_counter() - tic)
            correction[m].append(trainers[m].correction_seconds - before)
    base = np.array(times["finetune"])
    out: dict[str, Any] = {"repeats": repeats, "rows": len(batch)}
    for m in METHODS:
        t = np.array(times[m])
        ratios = t / base
        out[m] = {
            "step_ms_median": float(np.median(t) * 1e3),
            "correction_ms_median": float(np.median(correction[m]) * 1e3),
            "ratio_median": float(np.median(ratios)),
            "ratio_iqr": [float(np.quantile(ratios, 0.25)), float(np.quantile(ratios, 0.75))],
        }
    return out


def summarise(per_seed: Mapping[str, list[dict]]) -> dict[str, Any]:
    """Mean and sd over seeds of every scalar figure, per method."""

    def flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
        out = {}
        for k, v in d.items():
            if isinstance(v, Mapping):
                out.update(flat(v, f"{prefix}{k}."))
            elif isinstance(v, float | int):
                out[f"{prefix}{k}"] = float(v)
        return out

    summary = {}
    for method, runs in per_seed.items():
        flats = [flat(r) for r in runs]
        summary[method] = {
            k: {
                "mean": float(np.mean([f[k] for f in flats])),
                "sd": float(np.std([f[k] for f in flats], ddof=1)) if len(flats) > 1 else 0.0,
            }
            for k in flats[0]
        }
    return summary


def _pm(stat: Mapping[str, float], scale: float = 1.0, digits: int = 3) -> str:
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['sd'] * scale:.{digits}f}"


def render_markdown(result: Mapping[str, Any]) -> str:
    s = result["summary"]
    methods = [m for m in result["config"]["methods"]]
    lines = [
        f"Command: `{result['command']}` ({result['date']}, {result['seconds']:.0f} s, "
        f"torch {result['torch']}, {result['threads']} thread(s)). "
        f"{len(TASK_GROUPS)} tasks (train/test pairs, classes: "
        + ", ".join(
            f"{t['name']} {t['train']}/{t['test']}, {t['classes']}" for t in result["tasks"]
        )
        + f"), encoder {ENCODER} for lemma and gloss, at least {result['config']['epochs']} "
        "epochs per task (one AdamW step per mini-batch), seeds {list(result['config']['seeds'])}; mean ± sd over "
        "seeds. Overall = mean over t of the mean performance on tasks 1…t right after task t.",
        "",
        "Parameters (every method; `app.ml.hmcl.ContinualParams` with the command's overrides): "
        + ", ".join(f"{k} {v}" for k, v in result["params"].items())
        + ".",
        "",
        "Recall@5 (symmetric lemma↔gloss) and gloss→class accuracy, continual figures:",
        "",
        "| method | R@5 final | R@5 BWT | R@5 Overall | acc final | acc BWT | acc Overall |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        lines.append(
            f"| {m} | {_pm(s[m]['recall_at_5.final'])} | {_pm(s[m]['recall_at_5.bwt'])} | "
            f"{_pm(s[m]['recall_at_5.overall'])} | {_pm(s[m]['accuracy.final'])} | "
            f"{_pm(s[m]['accuracy.bwt'])} | {_pm(s[m]['accuracy.overall'])} |"
        )
    lines += [
        "",
        f"Drift (×10⁻³) of old tasks' held-out items (the first {DRIFT_ANCHORS} per task), version "
        f"at the task's end → final version, averaged over tasks 1–{len(TASK_GROUPS) - 1}: radial = "
        "mean |Δx₀|, angular "
        "= mean |Δ| of the within-modality cosine Gram matrix, cross-modal = the same for the "
        "lemma–gloss block, paired distance = mean |Δd(lemma_i, gloss_i)|; reduction = "
        "1 − method / `finetune` on the seed means:",
        "",
        "| method | radial | angular | cross-modal | paired distance | reduction (r / a / c / p) |",
        "|---|---|---|---|---|---|",
    ]
    for m in methods:
        red = []
        for k in DRIFT_MEASURES:
            base = s["finetune"][f"drift.{k}"]["mean"] if "finetune" in s else float("nan")
            red.append(f"{100 * (1 - s[m][f'drift.{k}']['mean'] / base):.0f} %")
        lines.append(
            f"| {m} | "
            + " | ".join(_pm(s[m][f"drift.{k}"], scale=1e3, digits=2) for k in DRIFT_MEASURES)
            + f" | {' / '.join(red)} |"
        )
    lines += [
        "",
        "No-backfill recall@5 (lemma queries by the final model against each old task's gloss "
        "gallery embedded at that task's end) as a fraction of the task-end recall@5; "
        "`recorded` uses the rotations each method records (identity except CA), `Procrustes` a "
        "post-hoc fit from the stored moments for any method, `backfilled` re-embeds the gallery "
        "with the final model (what the product avoids):",
        "",
        "| method | plain | recorded rotation | Procrustes rotation | backfilled |",
        "|---|---|---|---|---|",
    ]
    for m in methods:
        lines.append(
            f"| {m} | {_pm(s[m]['no_backfill_fraction.plain'])} | "
            f"{_pm(s[m]['no_backfill_fraction.recorded_rotation'])} | "
            f"{_pm(s[m]['no_backfill_fraction.procrustes_rotation'])} | "
            f"{_pm(s[m]['no_backfill_fraction.backfilled'])} |"
        )
    t = result["timing"]
    lines += [
        "",
        f"Per-step time (one AdamW step on a mini-batch of {t['rows']} of task 2's training pairs, "
        f"protected data from task 1), {t['repeats']} interleaved rounds in a fresh random order "
        "each, so contention from other processes hits every method alike; ratio = median over "
        "rounds of method / plain AdamW in the same round:",
        "",
        "| method | step (ms, median) | correction (ms, median) | ratio to AdamW (median, IQR) |",
        "|---|---|---|---|",
    ]
    for m in methods:
        r = t[m]
        lines.append(
            f"| {m} | {r['step_ms_median']:.1f} | {r['correction_ms_median']:.2f} | "
            f"{r['ratio_median']:.3f} ({r['ratio_iqr'][0]:.3f}–{r['ratio_iqr'][1]:.3f}) |"
        )
    return "\n".join(lines) + "\n"


SWEEP_LRS = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3)
SWEEP_EPOCHS = (10, 20, 40)


def sweep_first_task(corpus: Corpus, seeds: Sequence[int]) -> dict[str, Any]:
    """Held-out recall@5 after the first task alone, over lr × epochs: the schedule's choice.

    Every method trains the first task identically (nothing is protected yet), so this picks
    lr and epochs without looking at any continual figure.
    """
    grid = []
    for lr in SWEEP_LRS:
        for epochs in SWEEP_EPOCHS:
            recalls = []
            for seed in seeds:
                task = build_tasks(corpus, 0, seed)[0]
                result = run_continual_task(
                    "finetune", None, task.train, params={"lr": lr, "epochs": epochs}, seed=seed
                )
                recalls.append(evaluate(result.model, task)[0])
            grid.append({"lr": lr, "epochs": epochs, "recall_at_5": recalls})
            print(f"lr {lr:g} epochs {epochs}: R@5 {np.mean(recalls):.3f}", flush=True)
    return {"task": TASK_GROUPS[0], "seeds": list(seeds), "grid": grid}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small tasks, few epochs (≤ 3 min)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--items-per-task", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--timing-repeats", type=int, default=None)
    parser.add_argument(
        "--params",
        type=json.loads,
        default={},
        help="JSON overrides for every method, e.g. '{\"lr\": 1e-3}'",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="results JSON path")
    parser.add_argument("--no-markdown", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument(
        "--section",
        default=SECTION,
        help="BENCHMARKS.md section (marker name) to write; a variant run keeps its own section",
    )
    parser.add_argument("--title", default="Continual upgrades (HMCL)")
    parser.add_argument(
        "--sweep-first-task",
        action="store_true",
        help="only the lr × epochs sweep on the first task (writes continual_first_task_sweep.json)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.sweep_first_task:
        sweep = sweep_first_task(load_corpus(), tuple(args.seeds or (0, 1, 2)))
        out = args.out or RESULTS / "continual_first_task_sweep.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(sweep, indent=1))
        return sweep

    quick = args.quick
    cfg = Config(
        quick=quick,
        seeds=tuple(args.seeds or ((0, 1, 2) if quick else (0, 1, 2, 3, 4))),
        items_per_task=args.items_per_task
        if args.items_per_task is not None
        else (600 if quick else 0),
        epochs=args.epochs or (20 if quick else ContinualParams().epochs),
        timing_repeats=args.timing_repeats or (10 if quick else 40),
        methods=tuple(args.methods),
        params={},
    )
    for m in METHODS:
        cfg.params[m] = {"epochs": cfg.epochs, **args.params}
    tic = time.perf_counter()
    per_seed: dict[str, list[dict]] = {m: [] for m in cfg.methods}
    corpus = load_corpus()
    task_sizes: list[dict[str, Any]] = []
    for seed in cfg.seeds:
        tasks = build_tasks(corpus, cfg.items_per_task, seed)
        task_sizes = task_sizes or [
            {
                "name": t.name,
                "train": len(t.train[QUERY]),
                "test": len(t.test[QUERY]),
                "classes": len(t.class_names),
            }
            for t in tasks
        ]
        for m in cfg.methods:
            run = run_method(m, tasks, cfg.params[m], seed)
            per_seed[m].append(run)
            print(
                f"seed {seed} {m:9s} R@5 final {run['recall_at_5']['final']:.3f} "
                f"bwt {run['recall_at_5']['bwt']:+.4f} | acc bwt {run['accuracy']['bwt']:+.4f} | "
                f"nobackfill {run['no_backfill_fraction']['recorded_rotation']:.3f} | "
                f"{run['train_seconds']:.0f} s",
                flush=True,
            )
    timing = time_steps(
        build_tasks(corpus, cfg.items_per_task, cfg.seeds[0]),
        cfg.params,
        cfg.timing_repeats,
        cfg.seeds[0],
    )
    # shlex.join quotes the JSON of --params so the recorded command runs as written.
    command = "python -m bench.continual " + shlex.join(argv if argv is not None else sys.argv[1:])
    result = {
        "command": command.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - tic,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": args.threads,
        "config": {**cfg.__dict__, "task_groups": TASK_GROUPS},
        "tasks": task_sizes,
        "params": {
            k: v
            for k, v in asdict(ContinualParams.from_dict(cfg.params[cfg.methods[0]])).items()
            if k not in ("rotation", "apex_modality")
        },
        "summary": summarise(per_seed),
        "per_seed": per_seed,
        "timing": timing,
    }
    out = args.out or RESULTS / ("continual_quick.json" if quick else "continual.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=list))
    markdown = render_markdown(result)
    print(markdown)
    if not args.no_markdown:
        replace_section(args.section, args.title, markdown)
    return result


if __name__ == "__main__":
    main()
