"""Backward-compatibility benchmark on real data: every method and ``auto``, side by side.

    python -m bench.quality.compat                     # class scenarios, 3 seeds, + query→document
    python -m bench.quality.compat --scenarios external,new-architecture
    python -m bench.quality.compat --quick             # the committed 800-synset fixture, seconds

Spread over processes (how the committed results are made, see BENCHMARKS.md): per scenario and
seed ``--unit select --seed K --methods A`` and ``--methods B`` (two groups of methods), ``--unit
auto --seed K`` and ``--unit methods --seed K --methods A|B --selection <that seed's select
files>``, then ``--combine <unit files>``; each unit writes its own JSON file. ``--final`` (on the
methods and auto units, or a whole run) also measures every trained model on the held-back items.
``--combine <--unit auto files> --replace-auto <run.json>`` puts new auto runs in place of an
earlier run's auto rows, keeping every other row (``bench.quality.compat_replace``).

Data: WordNet noun glosses embedded by all-MiniLM-L6-v2 (old backbone, 384-d) and
all-mpnet-base-v2 (new backbone, 768-d); 147 fine classes (lexname + depth-4 ancestor, classes
with ≥ 12 members). Splits (``bench.quality.compat_scenarios``): 15 % of the items are held back
from every development run; each seed draws its own 60/40 train / evaluation split of the rest,
its own validation carve (20 % of the training part) and its own old-head items or classes, so the
95 % intervals across seeds include split sampling. Settings are chosen per seed on that seed's
validation carve and never look at the evaluation part; every method gets the same number of
validation trials, widening included, under the same instance floor as ``auto``
(``bench.quality.compat_grid``). Scenarios, at head level (every "model" is a head on frozen
backbone features):

- ``extended-data``: old head on MiniLM trained on 50 % of the fit items; new on MiniLM.
- ``extended-class``: old head on MiniLM trained on the fit items of 50 % of the classes; new on
  MiniLM.
- ``new-architecture``: old head on MiniLM (all fit items); new on MPNet.
- ``both``: old head on MiniLM with the fit items of 50 % of the classes; new on MPNet.

Old heads are trained on the *fit* part of the training items only: like the evaluation items,
the validation items were never in an old head's training.
- ``external``: old = the raw MiniLM vectors (a gallery nobody trained here, lifted as the
  service lifts it); new on MPNet — the production case.
- query → document (lemma → gloss, with and without a query log): ``bench.quality.querydoc``'s scenario,
  its figures read from ``bench/results/querydoc.json`` or rerun (``--querydoc run``).

Measured on the evaluation part with ``app.ml.upgrade.alternatives`` (what a served upgrade's report
uses): class view (CMC@1, mAP@100 over the evaluation set), instance view (each evaluation item's
new features against the *whole* old gallery: own-item R@1, R@10, MRR@100), P_com / P_up against
the stronger of the raw new backbone and the trained independent head.

What each row is trained on (issue 42 item 2, matched protocols): every single method's row is
its selected setting retrained on the whole training part (fit + validation). The ``auto`` row
is the service's ``auto`` (same candidates and trials, objective ``class``) run with this seed's
own fit / validation carve — the items every method's selection validates on, none of them in an
old head's training — and its chosen candidate then retrained, with the settings it chose, on
the whole training part as well. The model the service itself serves is the chosen candidate's
fit-part model (``run_auto`` keeps no retrain); its figures are recorded beside the row
(``auto.fit_part_model``), not in the table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.auto.candidates import AutoParams
from app.ml.evaluation.retrieval import json_safe
from app.ml.methods.compat import CompatParams
from app.ml.methods.training import NO_HOOKS
from app.ml.upgrade.alternatives import (
    assemble,
    measure_bridge,
    measure_independent,
    measure_reindex,
    measure_stay,
)
from app.ml.upgrade.pipeline import UpgradeContext, run_auto
from bench.common.machine import source_state
from bench.common.wordnet import (
    REPO_ROOT,
)
from bench.common.workers import exit_with_parent
from bench.quality import compat_grid, compat_replace, compat_report, compat_scenarios
from bench.quality.compat_scenarios import (
    QUICK_SCENARIOS,
    SCENARIOS,
    Scenario,
    Split,
    _context,
    calibration,
    load_split,
    old_points_for,
)

RESULTS = REPO_ROOT / "bench/results/compat.json"
EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class RunConfig:
    """What differs between the full run and ``--quick``: training length and trial budget."""

    epochs: int
    trials: int
    auto_params: dict[str, Any]
    extend_rounds: int = compat_grid.EXTEND_ROUNDS


FULL = RunConfig(epochs=CompatParams().epochs, trials=compat_grid.TRIALS, auto_params={})
# Test-sized: 2 epochs, 2 trials per method (each grid's two ends) and at most one beyond an end,
# auto with 2 epochs.
QUICK = RunConfig(epochs=2, trials=2, auto_params={"epochs": 2}, extend_rounds=1)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class ScenarioRun:
    """One scenario on one seed's split, its units of work each runnable alone (``--unit``) and
    combined later: ``select`` (validation trials of every method on this split's validation
    carve), ``methods`` (every method trained on the training part with the selected settings,
    measured on the evaluation part and, for a final run, on the held-back items) and ``auto``
    (the service's auto on this split's own fit / validation carve, needing no selection)."""

    def __init__(self, scenario: Scenario, split: Split, cfg: RunConfig):
        self.scenario, self.split, self.cfg = scenario, split, cfg
        self.old_points = old_points_for(scenario, split, cfg.epochs)
        self.new = split.features[scenario.new_backbone]
        self.common = {"epochs": cfg.epochs}

    @property
    def seed(self) -> int:
        return self.split.seed

    def context(self) -> UpgradeContext:
        return _context(self.split, self.new, self.old_points, self.seed)

    def evaluation_set(self, ctx: UpgradeContext, final: bool = False):
        items = self.split.held_back if final else self.split.evaluation
        return ctx.eval_set(np.arange(len(self.split.labels)), items, EMPTY)

    def validation(self):
        """(train(method, settings) on the fit part, the validation EvalSet): what selection's
        trials are trained and scored with."""
        ctx = self.context()
        val = ctx.eval_set(self.split.train, self.split.validation, EMPTY)

        def fit_trainer(method: str, settings: dict[str, Any]):
            params = CompatParams.from_dict({**self.common, **settings})
            return ctx.train(method, params, self.split.fit, EMPTY, NO_HOOKS)

        return fit_trainer, val

    def select(self, methods: tuple[str, ...] = compat_grid.METHODS) -> dict[str, Any]:
        fit_trainer, val = self.validation()
        selection = compat_grid.select(
            fit_trainer, val, self.cfg.trials, methods, None, self.cfg.extend_rounds
        )
        _log(
            f"{self.scenario.name}: seed {self.seed}, chosen {selection['chosen']}; "
            f"edges {selection['edge']}"
        )
        return selection

    def _evaluation_sets(self, ctx: UpgradeContext, final: bool) -> dict[str, Any]:
        sets = {"evaluation": self.evaluation_set(ctx)}
        if final:
            sets["held_back"] = self.evaluation_set(ctx, final=True)
        return sets

    def methods(
        self,
        selection: dict[str, Any],
        methods: tuple[str, ...] = compat_grid.METHODS,
        final: bool = False,
    ) -> dict[str, Any]:
        ctx = self.context()
        sets = self._evaluation_sets(ctx, final)
        out: dict[str, Any] = {"seed": self.seed, "seconds": {}}
        out.update({part: {"measured": {}} for part in sets})
        for method in methods:
            t0 = time.perf_counter()
            params = CompatParams.from_dict({**self.common, **selection["chosen"][method]})
            model = ctx.train(method, params, self.split.train, EMPTY, NO_HOOKS)
            for part, ev in sets.items():
                if method == "independent":
                    out[part]["independent"] = measure_independent(ev, model)
                else:
                    out[part]["measured"][method] = measure_bridge(ev, model)
            out["seconds"][method] = time.perf_counter() - t0
        _log(f"{self.scenario.name}: seed {self.seed}, every method measured")
        return out

    def auto(self, final: bool = False) -> dict[str, Any]:
        """The service's auto on this split, matched to the single methods' protocol: it is
        given the benchmark's own fit / validation carve (so it validates on the items every
        method's selection validates on, none of them in an old head's training), and its
        choice is then retrained on the whole training part with the settings it chose, as
        every single method's choice is (``methods``). The model the service itself would
        serve, trained on the fit part only, is measured too (``fit_part_model``)."""
        t0 = time.perf_counter()
        ctx = self.context()
        split = self.split
        params = AutoParams.from_dict(self.cfg.auto_params)
        outcome = run_auto(
            ctx,
            params,
            "class",
            split.train,
            split.evaluation,
            EMPTY,
            EMPTY,
            validation=split.validation,
        )
        name = outcome.report["chosen_candidate"]  # the candidate; outcome.method is its method
        chosen = next(c for c in outcome.report["candidates"] if c["name"] == name)
        _log(f"{self.scenario.name}: seed {self.seed}, auto chose {name}")
        # outcome.params are the served method's own parameters (its candidate's settings and
        # auto's shared overrides): the same model an explicit request with them would train.
        model = ctx.train(
            outcome.method,
            CompatParams.from_dict(outcome.params),
            split.train,
            EMPTY,
            NO_HOOKS,
        )
        out: dict[str, Any] = {
            "seed": self.seed,
            "auto": {
                "chosen": name,
                "chosen_settings": chosen["chosen_settings"],
                "method": outcome.method,
                "params": outcome.params,
                "trials": params.trials,
                "extra_trials": params.extra_trials,
                "tried": [t["settings"] for t in chosen["trials"]],
                "validation": {c["name"]: c["validation"] for c in outcome.report["candidates"]},
                "n_fit": outcome.report["auto"]["n_fit"],
                "n_validation": outcome.report["auto"]["n_validation"],
                "trained_on": "training part (fit + validation), as every single method",
                "fit_part_model": {},
            },
        }
        for part, ev in self._evaluation_sets(ctx, final).items():
            out[part] = {"measured": {"auto": measure_bridge(ev, model)}}
            out["auto"]["fit_part_model"][part] = measure_bridge(ev, outcome.model)
        out["seconds"] = {"auto": time.perf_counter() - t0}
        return out

    def finish(self, selection: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
        """This seed's ``methods`` and ``auto`` parts assembled against the same stay and
        reindex measurements (P_com / P_up, ARR): on the evaluation part, and on the held-back
        items where every part measured them."""
        ctx = self.context()
        run: dict[str, Any] = {
            "seed": self.seed,
            "selection": selection,
            "seconds": {k: v for p in parts for k, v in p["seconds"].items()},
            "auto": next(p["auto"] for p in parts if "auto" in p),
            "calibration": calibration(self.split, self.old_points),
        }
        for part in ("evaluation", "held_back"):
            if not all(part in p for p in parts):
                continue
            final = part == "held_back"
            ev = self.evaluation_set(ctx, final=final)
            measured = {k: v for p in parts for k, v in p[part]["measured"].items()}
            independent = next(p[part]["independent"] for p in parts if "independent" in p[part])
            metrics = assemble(measure_stay(ev), measure_reindex(ev), measured, independent)
            run["metrics" if not final else "final_metrics"] = metrics
        return run


def run_seed(
    scenario: Scenario, split: Split, cfg: RunConfig, final: bool = False
) -> dict[str, Any]:
    """One seed of one scenario: select every method's setting on this split's validation
    carve, train each (and ``auto``) on its training part, measure them on its evaluation part
    (and, ``final``, on the held-back items)."""
    run = ScenarioRun(scenario, split, cfg)
    selection = run.select()
    return run.finish(selection, [run.methods(selection, final=final), run.auto(final)])


def _seed_job(
    scenario: Scenario, seed: int, cfg: RunConfig, quick: bool, final: bool, threads: int
) -> dict[str, Any]:
    """One seed's run in a worker process (``--jobs``)."""
    torch.set_num_threads(threads)
    return run_seed(scenario, load_split(quick, seed), cfg, final)


def run_seeds(
    scenario: Scenario, seeds: list[int], cfg: RunConfig, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every seed's ``run_seed``: in this process, or (``--jobs`` > 1) one worker process per
    seed, ``--jobs`` at a time; the results do not depend on which (each seed is seeded)."""
    if args.jobs <= 1:
        return [_seed_job(scenario, s, cfg, args.quick, args.final, args.threads) for s in seeds]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=args.jobs,
        mp_context=context,
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
    ) as pool:
        futures = [
            pool.submit(_seed_job, scenario, s, cfg, args.quick, args.final, args.threads)
            for s in seeds
        ]
        return [f.result() for f in futures]


def scenario_result(scenario: Scenario, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A scenario's per-seed runs and their summaries over seeds (held-back apart)."""
    runs = sorted(runs, key=lambda r: r["seed"])
    recorded = dict(scenario.__dict__)
    if scenario.old_training is not None:
        recorded["old_head_items"] = compat_scenarios.OLD_HEAD_ITEMS
    out = {
        "scenario": recorded,
        "runs": runs,
        "summary": compat_report.summarise(runs),
    }
    if all("final_metrics" in r for r in runs):
        out["final_summary"] = compat_report.summarise(runs, key="final_metrics")
    return json_safe(out)


def _payload(
    split: Split, cfg: RunConfig, quick: bool, seeds: list[int], scenarios: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "quick": quick,
        "seeds": len(seeds),
        "split_seeds": seeds,
        "trials_per_method": cfg.trials,
        "extend_rounds": cfg.extend_rounds,
        "epochs": cfg.epochs,
        "auto_params": cfg.auto_params,
        "n_train": len(split.train),
        "n_fit": len(split.fit),
        "n_validation": len(split.validation),
        "n_eval": len(split.evaluation),
        "n_held_back": len(split.held_back),
        "held_back": {
            "fraction": compat_scenarios.HELD_BACK_FRACTION,
            "seed": compat_scenarios.HELD_BACK_SEED,
            # The frozen draw's digest (full data only; the fixture's draw is not frozen).
            "sha256": None if quick else compat_scenarios.HELD_BACK_SHA256,
        },
        "n_classes": len(np.unique(split.labels)),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
        "scenarios": scenarios,
    }


def run_unit(args: argparse.Namespace, cfg: RunConfig) -> dict[str, Any]:
    """One unit of one scenario on one seed's split (``--unit``), for runs spread over
    processes."""
    (scenario,) = [s for s in SCENARIOS if s.name == args.scenarios]
    run = ScenarioRun(scenario, load_split(args.quick, args.seed), cfg)
    out: dict[str, Any] = {"unit": args.unit, "scenario": scenario.name, "seed": args.seed}
    if args.unit == "select":
        out["selection"] = run.select(args.methods)
    elif args.unit == "methods":
        selection = compat_report.merge_selections(
            [json.loads(p.read_text())["selection"] for p in args.selection], seed=args.seed
        )
        out["part"] = run.methods(selection, args.methods, final=args.final)
    else:
        out["part"] = run.auto(final=args.final)
    return out


def combine_units(paths: list[Path], cfg: RunConfig, quick: bool) -> dict[str, Any]:
    """Scenarios from ``--unit`` files: per scenario and seed, its ``select`` files and its
    ``methods`` and ``auto`` files; the elapsed time is the units' sum."""
    units = [json.loads(p.read_text()) for p in paths]
    scenarios, seed_sets = [], set()
    for scenario in SCENARIOS:
        mine = [u for u in units if u["scenario"] == scenario.name]
        if not mine:
            continue
        seeds = sorted({u["seed"] for u in mine})
        seed_sets.add(tuple(seeds))
        runs = []
        for seed in seeds:
            these = [u for u in mine if u["seed"] == seed]
            selection = compat_report.merge_selections(
                [u["selection"] for u in these if u["unit"] == "select"], seed=seed
            )
            parts = [u["part"] for u in these if u["unit"] != "select"]
            run = ScenarioRun(scenario, load_split(quick, seed), cfg)
            runs.append(run.finish(selection, parts))
        scenarios.append(scenario_result(scenario, runs))
    if len(seed_sets) != 1:
        raise ValueError(f"scenarios have different seeds: {sorted(seed_sets)}")
    payload = _payload(load_split(quick, 0), cfg, quick, list(seed_sets.pop()), scenarios)
    payload["elapsed_minutes"] = sum(u["elapsed_minutes"] for u in units)
    payload["units"] = len(units)
    return payload


def replace_auto_rows(base: Path, paths: list[Path]) -> dict[str, Any]:
    """``base``'s payload with its auto rows replaced by ``--unit auto`` files (``--combine …
    --replace-auto base``); the command and the elapsed time name both runs."""
    payload = json.loads(base.read_text())
    units = [json.loads(p.read_text()) for p in paths]
    by_name = {s.name: s for s in SCENARIOS}
    replaced = compat_replace.replace_auto(
        payload, units, lambda name, runs: scenario_result(by_name[name], runs)
    )
    final = " --final" if all("held_back" in u["part"] for u in units) else ""
    replaced["command"] = (
        f"{payload['command']}; auto's rows then replaced: python -m bench.quality.compat "
        f"--unit auto{final} ({len(units)} units: per scenario and seed), then --combine … "
        f"--replace-auto {base}"
    )
    replaced["elapsed_minutes"] = payload["elapsed_minutes"] + sum(
        u["elapsed_minutes"] for u in units
    )
    replaced["units"] = (payload.get("units") or 1) + len(units)
    return replaced


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="every method and auto on WordNet nouns")
    parser.add_argument("--quick", action="store_true", help="the committed fixture, seconds")
    parser.add_argument("--scenarios", default=None, help="comma-separated subset")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--querydoc",
        choices=("reuse", "run", "skip"),
        default="reuse",
        help="query→document figures: read bench.quality.querydoc's results (reuse), rerun them with "
        "bench.quality.querydoc's functions (run; about 22 min a seed on the full data), or leave out "
        "(skip); with --merge, reuse reads them again and skip keeps the merged files' own",
    )
    parser.add_argument("--note", default=None, help="why scenarios were left out (shown)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--jobs", type=int, default=1, help="seeds run at once, one process each (whole runs)"
    )
    parser.add_argument("--no-markdown", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument(
        "--unit",
        choices=("select", "methods", "auto"),
        default=None,
        help="run one unit of one scenario (--scenarios NAME) and write it to --out: the "
        "validation selection, or for --seed K every method (needs --selection FILE) or auto",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of a --unit run")
    parser.add_argument(
        "--selection", nargs="+", type=Path, default=None, help="select units' files"
    )
    parser.add_argument(
        "--methods",
        type=lambda s: tuple(s.split(",")),
        default=compat_grid.METHODS,
        help="the methods of a --unit select or methods run (default: all)",
    )
    parser.add_argument(
        "--combine", nargs="+", type=Path, default=None, help="--unit files to combine"
    )
    parser.add_argument(
        "--replace-auto",
        type=Path,
        default=None,
        help="with --combine of --unit auto files: an earlier run's JSON whose auto rows they "
        "replace (every other row kept; see bench.quality.compat_replace)",
    )
    parser.add_argument(
        "--final",
        action="store_true",
        help="also measure every trained model on the held-back items (once per release; "
        "reported apart from the development figures)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        help="combine the scenarios of JSON files from earlier runs (e.g. parallel --scenarios "
        "runs) into one JSON file and table, training nothing",
    )
    args = parser.parse_args(argv)
    if args.replace_auto and not args.combine:
        parser.error("--replace-auto needs --combine with the --unit auto files")
    if args.merge:
        if args.querydoc == "run":
            parser.error("--merge trains nothing: --querydoc reuse or skip")
        out = args.out or RESULTS
        order = [s.name for s in SCENARIOS]
        part = None
        if args.querydoc == "reuse":
            first = json.loads(args.merge[0].read_text())
            part = compat_report.querydoc_part(False, bool(first.get("quick")), [])
        merged = compat_report.merge_runs(
            args.merge,
            out,
            order,
            markdown=not args.no_markdown,
            note=args.note,
            querydoc_part=part,
        )
        print(merged)
        return out
    if args.final and not args.quick and not args.combine:
        compat_scenarios.check_frozen_held_back()  # before any training: scores only those items
    torch.set_num_threads(args.threads)
    started = time.time()
    cfg = QUICK if args.quick else FULL
    default_out = RESULTS.with_name("compat-quick.json") if args.quick else RESULTS
    if args.unit:
        unit = run_unit(args, cfg)
        unit["elapsed_minutes"] = (time.time() - started) / 60
        out = args.out or RESULTS.with_name(f"compat-unit-{args.scenarios}-{args.unit}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(json_safe(unit)))
        print(out)
        return out
    if args.combine and args.replace_auto:
        payload = replace_auto_rows(args.replace_auto, args.combine)
    elif args.combine:
        payload = combine_units(args.combine, cfg, args.quick)
        payload["command"] = (
            f"python -m bench.quality.compat --unit …{' --final' if args.final else ''} "
            f"({payload['units']} units: per scenario and seed, select, methods and auto), "
            "then --combine"
        )
    else:
        names = args.scenarios.split(",") if args.scenarios else None
        if args.quick and names is None:
            names = list(QUICK_SCENARIOS)
        chosen = [s for s in SCENARIOS if names is None or s.name in names]
        if names and len(chosen) != len(names):
            parser.error(f"unknown scenario in {names}")
        seeds = list(range(args.seeds))
        # The code measured, taken once at the start (a commit made while the run trains is not
        # the one it measured), and the day: each scenario's look at the held-back items is
        # stated with both (issue 42 item 3).
        measured = {"date": time.strftime("%Y-%m-%d"), **source_state("app", "bench/quality")}
        scenarios = []
        for sc in chosen:
            _log(f"scenario {sc.name}")
            result = scenario_result(sc, run_seeds(sc, seeds, cfg, args))
            if args.final:
                result["held_back_look"] = measured
            scenarios.append(result)
        payload = _payload(load_split(args.quick, 0), cfg, args.quick, seeds, scenarios)
        payload["elapsed_minutes"] = (time.time() - started) / 60
        payload["jobs"] = args.jobs
        payload["command"] = "python -m bench.quality.compat" + (" --quick" if args.quick else "")
        for flag, value, default in (
            ("--scenarios", args.scenarios, None),
            ("--seeds", args.seeds, 3),
            ("--querydoc", args.querydoc, "reuse"),
            ("--final", args.final or None, None),
        ):
            if value != default:
                payload["command"] += f" {flag}" + ("" if value is True else f" {value}")
    if args.querydoc != "skip":
        seeds_run = list(range(payload["seeds"]))
        payload["querydoc"] = compat_report.querydoc_part(
            args.querydoc == "run", args.quick, seeds_run
        )
    payload["note"] = args.note
    out = args.out or default_out
    print(compat_report.write_outputs(payload, out, markdown=not args.no_markdown))
    return out


if __name__ == "__main__":
    main()
