"""Continual upgrades on real data: HMCL (CA, MR) against fine-tuning and EWC, on a stream that
alternates classification-style and retrieval tasks (``bench.quality.continual_stream``;
``--stream interleaved`` C1 R1 C2 R2 …, the default, or ``reordered`` R4 C1′ R3 C2′ …).

    python -m bench.quality.continual --quick   # one seed, small tasks, two settings per method (< 2 min)
    python -m bench.quality.continual --jobs 7  # 5 seeds, full tasks, twelve settings per method and seed
    python -m bench.quality.continual --final   # the same, also scored on the held-back split
    python -m bench.quality.continual --params '{"energy": 0.6}' --methods hmcl-ca finetune \
        --out bench/results/continual_energy0.6.json           # a variant: overrides for every method
    python -m bench.quality.continual --timing-only --batch-size 1024   # only the per-step times
    python -m bench.quality.continual --render bench/results/continual.json   # only the tables
    python -m bench.quality.continual --render bench/results/continual.json \
        bench/results/continual_reordered.json bench/results/continual_final.json \
        bench/results/continual_reordered_final.json --publish   # into BENCHMARKS.md

Each method gets its own settings, chosen **per seed** on validation rows carved from every
task's **training** rows (``carve_validation``) of that seed's stream: min_steps × the one setting
the method reads itself (ρ for HMCL, λ for EWC, the learning rate for fine-tuning), the same
number of distinct trials for every method (``Config.check_equal_budgets``); the criterion is the
validation Overall (mean over t of the mean performance on tasks 1…t after task t), averaged over
the two kinds of task. The test rows are never seen before the chosen settings are fixed. Then
every seed's stream is trained on its full training rows with that seed's chosen settings and
scored on its test rows. Every seed draws its
own items and train/test split (``build_tasks``), so the spread over seeds includes split
sampling: every figure is reported as the mean and its 95 % Student-t interval over the seeds
(``bench.common.stats``), and a target counts as met only when that interval clears it
(``continual_report.targets``).

Held-back split: a fixed fifth of every class's members and of every retrieval group's rows
(``continual_stream.HELD_BACK_SEED``; a fresh draw for issue 42 item 3, frozen by the SHA-256 of
its synset ids, ``HELD_BACK_SHA256``: a ``--final`` run on other rows is refused, and every
run records its commit, so each look is dated) is in no seed's train, test or validation rows. Only
``--final`` scores it: every seed's trained versions (the same training as the development run,
whose figures it also writes) are scored on held-back test rows, into ``<out>_final.json``;
it is meant to be run once per release, after the code and the settings are fixed.

Per kind of task (retrieval: symmetric recall@5 text↔gloss; classification: accuracy of each
test gloss's nearest class-name text among the task's classes): task-end (right after the task),
final, BWT (final − task-end, the gallery re-embedded: "backfilled"), and no-backfill retention:
an old task's stored side (its glosses, embedded by the version at the task's end) searched by
the final model's text embeddings — lemma queries for retrieval, class-name texts for
classification — with and without the recorded rotations, as a fraction of the task-end figure.
Also the four drift measures and the per-step time of each method over plain AdamW at the
stream's d = 384 and at d = 768 (all-mpnet-base-v2). The results go to ``bench/results``; the
markdown is printed (``bench.quality.continual_report``) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from app.ml.hmcl import METHODS
from bench.common.machine import source_state
from bench.common.report import command_line, replace_section
from bench.common.wordnet import NEW_MODEL, REPO_ROOT, quick_data_dir
from bench.quality.continual_config import Config, full_config, quick_config
from bench.quality.continual_report import (
    SECTION,
    SECTION_TITLE,
    render_markdown,
    render_streams,
    summarise,
    targets,
    timing_lines,
)
from bench.quality.continual_selection import (
    selection_result,
    selection_score,
    submit_selection,
    trainer_pool,
)
from bench.quality.continual_stream import (
    CLASS_DEPTH,
    CLASSES_PER_TASK,
    DEV,
    GLOSS,
    HELD_BACK,
    HELD_BACK_FRACTION,
    HELD_BACK_SEED,
    HELD_BACK_SHA256,
    INTERLEAVED,
    MIN_CLASS_ITEMS,
    RETRIEVAL_GROUPS,
    STREAMS,
    VALIDATION_FRACTION,
    Corpus,
    Task,
    build_tasks,
    held_back_digest,
    load_corpus,
)
from bench.quality.continual_timing import time_steps
from bench.quality.continual_training import kind_figures, run_method

# Re-exported: the tests and ``bench.perf.training`` import these from here.
__all__ = [
    "Config",
    "Corpus",
    "Task",
    "build_tasks",
    "full_config",
    "kind_figures",
    "load_corpus",
    "quick_config",
    "run_method",
    "selection_score",
    "time_steps",
]

RESULTS = REPO_ROOT / "bench/results"


def stream_constants() -> dict[str, Any]:
    return {
        "class_depth": CLASS_DEPTH,
        "min_class_items": MIN_CLASS_ITEMS,
        "classes_per_task": CLASSES_PER_TASK,
        "retrieval_groups": RETRIEVAL_GROUPS,
        "validation_fraction": VALIDATION_FRACTION,
        "held_back_fraction": HELD_BACK_FRACTION,
        "held_back_seed": HELD_BACK_SEED,
    }


def timing_provenance(path: Path, earlier: Mapping[str, Any]) -> dict[str, str]:
    """Where ``--timing-from``'s per-step times were taken: the earlier run's file and date, or,
    when that run took them from another in turn, the first run's (its date is the times')."""
    return dict(earlier.get("timing_from") or {"path": str(path), "date": earlier["date"]})


def check_frozen_held_back(corpus: Corpus) -> None:
    """Refuse a ``--final`` run whose held-back rows are not the frozen ones (issue 42 item 3):
    the SHA-256 of their synset ids must be ``HELD_BACK_SHA256``."""
    digest = held_back_digest(corpus.data.meta)
    if digest != HELD_BACK_SHA256:
        raise SystemExit(
            f"the held-back rows' SHA-256 is {digest}, not the frozen {HELD_BACK_SHA256}: "
            "the data or the draw changed, and a --final run would score another split"
        )


def task_sizes(tasks: Sequence[Task]) -> list[dict[str, Any]]:
    return [
        {
            "name": t.name,
            "kind": t.kind,
            "train": t.train_rows,
            "test": t.test_rows,
            "classes": t.classes,
        }
        for t in tasks
    ]


def run_benchmark(
    config: Config,
    corpus: Corpus | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
    stream: Callable[[int], list[Task]] | None = None,
    held_back_stream: Callable[[int], list[Task]] | None = None,
    timed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Select settings per method and seed (on that seed's validation carve), run every seed
    with its own choice, time the steps (or take ``timed``, an
    earlier run's ``timing``, when the training code has not changed since); the results record
    (``checkpoint`` gets it after every seed, over the seeds finished so far). ``stream(seed)``
    replaces the WordNet stream (tests); timing at another width than the stream's loads the
    768-d encoder's stream.

    ``config.final``: every seed's trained versions are also scored on the held-back rows
    (``held_back_stream(seed)``: the seed's tasks with held-back test rows), after the settings
    are fixed; that record, the same shape as the development one, is under ``"held_back"``."""
    tic = time.perf_counter()
    if stream is None:
        corpus = corpus or load_corpus()

        def build(seed: int, split: str) -> list[Task]:
            return build_tasks(
                corpus, config.retrieval_items, seed, config.per_class, config.stream, split
            )

        def stream(seed: int) -> list[Task]:
            return build(seed, DEV)

        def held_back_stream(seed: int) -> list[Task]:
            return build(seed, HELD_BACK)

    held_back_sha256 = held_back_digest(corpus.data.meta) if corpus is not None else None
    # The code measured: taken once, at the start, so a commit made while the run trains is not
    # recorded as the one it measured.
    source = source_state("app", "bench/quality")
    if config.final and held_back_stream is None:
        raise ValueError("config.final needs the held-back stream of the caller's tasks")
    config.check_equal_budgets()
    first_seed = config.seeds[0]
    streams = {first_seed: stream(first_seed)}
    first = streams[first_seed]
    print("selecting settings per seed, on validation carves of its own stream", flush=True)
    per_seed: dict[str, list[dict]] = {m: [] for m in config.methods}
    per_seed_held_back: dict[str, list[dict]] = {m: [] for m in config.methods}
    held_back_sizes: list[dict[str, Any]] = []
    timing: dict[str, Any] = {}
    result: dict[str, Any] = {}
    # Per method, one entry per seed (in seed order): that seed's trials and choice, and the
    # settings its test-side run used (issue 42 item 2: chosen per seed).
    selection: dict[str, list[dict[str, Any]]] = {m: [] for m in config.methods}
    params: dict[str, list[dict[str, Any]]] = {m: [] for m in config.methods}

    def record(runs: dict[str, list[dict]], sizes: list[dict[str, Any]]) -> dict[str, Any]:
        summary = summarise(runs)
        done = len(runs[config.methods[0]])
        return {
            "date": time.strftime("%Y-%m-%d"),
            "source_state": source,
            "seconds": time.perf_counter() - tic,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "threads": config.threads if config.jobs > 1 else torch.get_num_threads(),
            "config": {
                **config.__dict__,
                "seeds": config.seeds[:done],
                "seeds_planned": config.seeds,
                "settings": {m: config.settings(m) for m in config.methods},
                "trials_per_method": config.check_equal_budgets(),
                "stream": {
                    "order": config.stream,
                    **stream_constants(),
                    # of the rows this run held back (the frozen HELD_BACK_SHA256 on the nouns)
                    "held_back_sha256": held_back_sha256,
                },
            },
            "encoder": corpus.encoder if corpus is not None else "caller's stream",
            "tasks": sizes,
            "selection": {m: v[:done] for m, v in selection.items()},
            "params": {m: v[:done] for m, v in params.items()},
            "summary": summary,
            "targets": targets(summary, timing),
            "per_seed": runs,
            "timing": timing,
        }

    def records() -> dict[str, Any]:
        out = record(per_seed, task_sizes(first))
        if config.final:  # printed only as a record, so that nobody develops against it
            out[HELD_BACK] = {**record(per_seed_held_back, held_back_sizes), "split": HELD_BACK}
        return out

    def seed_stream(seed: int) -> list[Task]:
        if seed not in streams:
            streams[seed] = stream(seed)
        return streams[seed]

    with trainer_pool(config) as pool:
        # Every seed's trials are queued first (workers stay busy); each seed's test-side runs
        # follow as soon as its own choice is known.
        pending = {
            seed: {
                m: submit_selection(m, seed_stream(seed), config, seed, pool)
                for m in config.methods
            }
            for seed in config.seeds
        }

        def submit_seed(seed: int) -> tuple[Sequence[Task] | None, dict[str, Future]]:
            tasks = seed_stream(seed)
            held_back = held_back_stream(seed) if config.final else None
            futures = {}
            for m in config.methods:
                chosen = selection_result(pending[seed][m])
                selection[m].append(chosen)
                params[m].append({**config.base_params, **chosen["chosen"]})
                futures[m] = pool.submit(
                    run_method, m, tasks, params[m][-1], seed, held_back=held_back
                )
            return held_back, futures

        # Worker processes get every seed at once; in this process each seed runs in its turn,
        # so that a checkpoint follows each one.
        submitted = [submit_seed(seed) for seed in config.seeds] if config.jobs > 1 else None
        for i, seed in enumerate(config.seeds):
            held_back, futures = submitted[i] if submitted is not None else submit_seed(seed)
            if held_back is not None and seed == first_seed:
                held_back_sizes = task_sizes(held_back)
            for m in config.methods:
                run = futures[m].result()
                if held_back is not None:
                    per_seed_held_back[m].append(run.pop("held_back"))
                per_seed[m].append(run)
                print(
                    f"seed {seed} {m:9s} "
                    + " | ".join(
                        f"{k}: task-end {v['task_end']:.3f} final {v['final']:.3f} "
                        f"bwt {v['bwt']:+.4f} "
                        f"kept {run['no_backfill'][k]['recorded_rotation']:.3f}"
                        for k, v in run["by_kind"].items()
                    )
                    + f" | {run['train_seconds']:.0f} s",
                    flush=True,
                )
            if checkpoint is not None and i < len(config.seeds) - 1:
                checkpoint(records())  # a long run keeps every finished seed
    # Timed after every training has ended, on a machine no worker shares any more.
    step_params = {m: dict(config.base_params) for m in METHODS}
    if timed is not None:
        timing.update(timed)
    for dim in config.timing_dims if timed is None else ():
        tasks = first
        if dim != first[0].train[GLOSS].shape[1]:
            other = load_corpus(NEW_MODEL)
            tasks = build_tasks(
                other, config.retrieval_items, first_seed, config.per_class, config.stream
            )
        timing[str(dim)] = time_steps(tasks, step_params, config.timing_repeats, first_seed)
        print(f"  timed steps at d = {dim}", flush=True)
    result = records()
    if checkpoint is not None:
        checkpoint(result)
    return result


def timing_only(
    config: Config, command: str, batch_size: int | None, out: Path | None
) -> dict[str, Any]:
    """``time_steps`` alone on the first seed's stream at every width of ``config``."""
    tic = time.perf_counter()
    params = dict(config.base_params)
    if batch_size is not None:
        params["batch_size"] = batch_size
    timing = {}
    for dim in config.timing_dims:
        corpus = load_corpus() if dim == 384 else load_corpus(NEW_MODEL)
        tasks = build_tasks(
            corpus, config.retrieval_items, config.seeds[0], config.per_class, config.stream
        )
        step_params = {m: params for m in METHODS}
        timing[str(dim)] = time_steps(tasks, step_params, config.timing_repeats, config.seeds[0])
    result = {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - tic,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "params": params,
        "timing": timing,
    }
    name = f"continual_timing_b{batch_size}.json" if batch_size else "continual_timing.json"
    path = out or RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print("\n".join(timing_lines(timing)))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, small tasks (< 2 min)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", default=None, choices=METHODS)
    parser.add_argument(
        "--params",
        type=json.loads,
        default={},
        help="JSON overrides of the base settings of every method, e.g. '{\"energy\": 0.6}'",
    )
    parser.add_argument(
        "--stream",
        choices=STREAMS,
        default=INTERLEAVED,
        help="task order: C1 R1 C2 R2 … (interleaved) or R4 C1′ R3 C2′ … (reordered: retrieval "
        "first, other class groups)",
    )
    parser.add_argument(
        "--final",
        action="store_true",
        help="also score every seed's trained versions on the held-back split (once per "
        "release; its results go to their own *_final.json)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="worker processes for the trainings (selection trials, then every seed × method); "
        "the figures do not depend on it, the per-step times are taken after the workers end",
    )
    parser.add_argument("--out", type=Path, default=None, help="results JSON path")
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        default=None,
        help="only print the tables of results JSONs (one per stream and split)",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="with --render: also write them into BENCHMARKS.md's continual section",
    )
    parser.add_argument(
        "--timing-only",
        action="store_true",
        help="only the per-step times (at d = 384 and 768), e.g. with --batch-size",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="mini-batch rows of the timed steps"
    )
    parser.add_argument(
        "--timing-from",
        type=Path,
        default=None,
        help="take the per-step times from an earlier results JSON instead of timing again "
        "(the training code unchanged since; e.g. a run on another machine whose times would "
        "not compare with this one's)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        quick_data_dir("bench.quality.continual")
    if args.render is not None:
        results = [json.loads(path.read_text()) for path in args.render]
        markdown = render_streams(results)
        print(markdown)
        if args.publish:
            replace_section(SECTION, SECTION_TITLE, markdown)
        return results[0]
    torch.set_num_threads(args.threads)
    config = (quick_config if args.quick else full_config)(args.seeds)
    config.base_params = {**config.base_params, **args.params}
    config.stream = args.stream
    config.final = args.final
    config.jobs, config.threads = args.jobs, args.threads
    if args.methods:
        if "finetune" not in args.methods:
            parser.error("--methods must include finetune (the reference of every ratio)")
        config.methods = tuple(args.methods)
    command = command_line("bench.quality.continual", argv)
    if args.timing_only:
        return timing_only(config, command, args.batch_size, args.out)
    corpus = None
    if args.final and not args.quick:
        corpus = load_corpus()
        check_frozen_held_back(corpus)
    stem = "continual_quick" if args.quick else "continual"
    if args.stream != INTERLEAVED:
        stem += f"_{args.stream}"
    out = args.out or RESULTS / f"{stem}.json"
    final_out = out.with_name(f"{out.stem}_final{out.suffix}")
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(result: dict[str, Any]) -> None:
        development = {k: v for k, v in result.items() if k != HELD_BACK}
        record = {"command": command, **development, **timing_from}
        out.write_text(json.dumps(record, indent=1, default=list))
        if HELD_BACK in result:
            record = {"command": command, **result[HELD_BACK]}
            final_out.write_text(json.dumps(record, indent=1, default=list))

    timed, timing_from = None, {}
    if args.timing_from is not None:
        earlier = json.loads(args.timing_from.read_text())
        timed = earlier["timing"]
        timing_from = {"timing_from": timing_provenance(args.timing_from, earlier)}
    result = {
        "command": command,
        **run_benchmark(config, corpus, checkpoint=write, timed=timed),
        **timing_from,
    }
    held_back = result.pop(HELD_BACK, None)
    print(render_markdown(result))
    if held_back is not None:
        print(render_markdown({"command": command, **held_back}))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
