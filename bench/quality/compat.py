"""Backward-compatibility benchmark on real data: every method and ``auto``, side by side.

    python -m bench.quality.compat                     # class scenarios, 3 seeds, + query→document
    python -m bench.quality.compat --scenarios external,new-architecture
    python -m bench.quality.compat --quick             # the committed 800-synset fixture, seconds

Spread over processes (how the committed results were made, see BENCHMARKS.md): per scenario
``--unit select --methods A`` and ``--methods B`` (two groups of methods), per seed ``--unit auto
--seed K`` and ``--unit methods --seed K --methods A|B --selection <select files>``, then
``--combine <unit files>``; each unit writes its own JSON file. ``--widen FILE --scenarios A,B``
applies the current selection rule to a finished results file (its trials reused, only new ones
trained, moved choices retrained per seed; ``bench.quality.compat_widen``) and writes the widened
scenarios alone, for ``--merge FILE <widened files>``.

Data: WordNet noun glosses embedded by all-MiniLM-L6-v2 (old backbone, 384-d) and
all-mpnet-base-v2 (new backbone, 768-d); 147 fine classes (lexname + depth-4 ancestor, classes
with ≥ 12 members); the data README's 60/40 split (train / evaluation). Settings are chosen on a
validation split carved from the training part (20 %, seed 1) and never look at the evaluation
part; every method gets the same validation trials rule (``bench.quality.compat_grid``). Scenarios,
at head level (every "model" is a head on frozen backbone features):

- ``extended-data``: old head on MiniLM trained on 50 % of the training items; new on MiniLM.
- ``extended-class``: old head on MiniLM trained on the items of 50 % of the classes; new on MiniLM.
- ``new-architecture``: old head on MiniLM (all training items); new on MPNet.
- ``both``: old head on MiniLM with 50 % of the classes; new on MPNet.
- ``external``: old = the raw MiniLM vectors (a gallery nobody trained here, lifted as the
  service lifts it); new on MPNet — the production case.
- query → document (lemma → gloss, with and without a query log): ``bench.quality.querydoc``'s scenario,
  its figures read from ``bench/results/querydoc.json`` or rerun (``--querydoc run``).

Measured on the evaluation part with ``app.ml.upgrade.alternatives`` (what a served upgrade's report
uses): class view (CMC@1, mAP@100 over the evaluation set), instance view (each evaluation item's
new features against the *whole* old gallery: own-item R@1, R@10, MRR@100), P_com / P_up against
the stronger of the raw new backbone and the trained independent head. The ``auto`` row is the
service's ``auto`` (same candidates and trials, objective ``class``) trained on the training part.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
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
from bench.common.wordnet import (
    REPO_ROOT,
)
from bench.quality import compat_grid, compat_report
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
from bench.quality.compat_widen import widen_scenario

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
    """One scenario's units of work, each runnable alone (``--unit``) and combined later:
    ``select`` (validation trials of every method), ``methods`` (every method trained on the
    training part for one seed with the selected settings, measured on the evaluation part),
    ``auto`` (the service's auto for one seed, needing no selection) and ``finish``."""

    def __init__(self, scenario: Scenario, split: Split, cfg: RunConfig):
        self.scenario, self.split, self.cfg = scenario, split, cfg
        self.old_points = old_points_for(scenario, split, cfg.epochs)
        self.new = split.features[scenario.new_backbone]
        self.common = {"epochs": cfg.epochs}

    def context(self, seed: int) -> UpgradeContext:
        return _context(self.split, self.new, self.old_points, seed)

    def evaluation_set(self, ctx: UpgradeContext):
        return ctx.eval_set(np.arange(len(self.split.labels)), self.split.evaluation, EMPTY)

    def validation(self):
        """(train(method, settings) on the fit part, the validation EvalSet): what selection's
        trials are trained and scored with."""
        ctx0 = self.context(0)
        val = ctx0.eval_set(self.split.train, self.split.validation, EMPTY)

        def fit_trainer(method: str, settings: dict[str, Any]):
            params = CompatParams.from_dict({**self.common, **settings})
            return ctx0.train(method, params, self.split.fit, EMPTY, NO_HOOKS)

        return fit_trainer, val

    def select(
        self,
        methods: tuple[str, ...] = compat_grid.METHODS,
        reuse: dict[str, list[dict[str, Any]]] | None = None,
    ) -> dict[str, Any]:
        fit_trainer, val = self.validation()
        selection = compat_grid.select(
            fit_trainer, val, self.cfg.trials, methods, reuse, self.cfg.extend_rounds
        )
        _log(f"{self.scenario.name}: chosen {selection['chosen']}; edges {selection['edge']}")
        return selection

    def methods(
        self, seed: int, selection: dict[str, Any], methods: tuple[str, ...] = compat_grid.METHODS
    ) -> dict[str, Any]:
        ctx = self.context(seed)
        ev = self.evaluation_set(ctx)
        out: dict[str, Any] = {"seed": seed, "measured": {}, "seconds": {}}
        for method in methods:
            t0 = time.perf_counter()
            params = CompatParams.from_dict({**self.common, **selection["chosen"][method]})
            model = ctx.train(method, params, self.split.train, EMPTY, NO_HOOKS)
            if method == "independent":
                out["independent"] = measure_independent(ev, model)
            else:
                out["measured"][method] = measure_bridge(ev, model)
            out["seconds"][method] = time.perf_counter() - t0
        _log(f"{self.scenario.name}: seed {seed}, every method measured")
        return out

    def auto(self, seed: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        ctx = self.context(seed)
        split = self.split
        outcome = run_auto(
            ctx,
            AutoParams.from_dict(self.cfg.auto_params),
            "class",
            split.train,
            split.evaluation,
            EMPTY,
            EMPTY,
        )
        measured = measure_bridge(self.evaluation_set(ctx), outcome.model)
        chosen = next(c for c in outcome.report["candidates"] if c["name"] == outcome.method)
        _log(f"{self.scenario.name}: seed {seed}, auto chose {outcome.method}")
        return {
            "seed": seed,
            "measured": {"auto": measured},
            "seconds": {"auto": time.perf_counter() - t0},
            "auto": {
                "chosen": outcome.method,
                "chosen_settings": chosen["chosen_settings"],
                "validation": {c["name"]: c["validation"] for c in outcome.report["candidates"]},
            },
        }

    def finish(self, selection: dict[str, Any], parts: list[dict[str, Any]]) -> dict[str, Any]:
        """Every seed's ``methods`` and ``auto`` parts assembled against the same stay and
        reindex measurements (P_com / P_up, ARR), summarised over seeds."""
        ev = self.evaluation_set(self.context(0))
        stay, reindex = measure_stay(ev), measure_reindex(ev)
        runs = []
        for seed in sorted({p["seed"] for p in parts}):
            mine = [p for p in parts if p["seed"] == seed]
            measured = {k: v for p in mine for k, v in p["measured"].items()}
            independent = next(p["independent"] for p in mine if "independent" in p)
            auto = next(p["auto"] for p in mine if "auto" in p)
            seconds = {k: v for p in mine for k, v in p["seconds"].items()}
            metrics = assemble(stay, reindex, measured, independent)
            runs.append({"seed": seed, "metrics": metrics, "seconds": seconds, "auto": auto})
        return json_safe(
            {
                "scenario": self.scenario.__dict__,
                "selection": selection,
                "runs": runs,
                "summary": compat_report.summarise(runs),
                "calibration": calibration(self.split, self.old_points),
            }
        )


def run_scenario(
    scenario: Scenario, split: Split, seeds: list[int], cfg: RunConfig
) -> dict[str, Any]:
    """Select every method's setting on validation, then train each (and ``auto``) on the
    training part per seed and measure all of them on the evaluation part."""
    run = ScenarioRun(scenario, split, cfg)
    selection = run.select()
    parts = [part for seed in seeds for part in (run.methods(seed, selection), run.auto(seed))]
    return run.finish(selection, parts)


def _payload(
    split: Split, cfg: RunConfig, quick: bool, seeds: int, scenarios: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "quick": quick,
        "seeds": seeds,
        "trials_per_method": cfg.trials,
        "extend_rounds": cfg.extend_rounds,
        "epochs": cfg.epochs,
        "auto_params": cfg.auto_params,
        "n_train": len(split.train),
        "n_fit": len(split.fit),
        "n_validation": len(split.validation),
        "n_eval": len(split.evaluation),
        "n_classes": len(np.unique(split.labels)),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
        "scenarios": scenarios,
    }


def run_unit(args: argparse.Namespace, split: Split, cfg: RunConfig) -> dict[str, Any]:
    """One unit of one scenario (``--unit``), for runs spread over processes."""
    (scenario,) = [s for s in SCENARIOS if s.name == args.scenarios]
    run = ScenarioRun(scenario, split, cfg)
    out: dict[str, Any] = {"unit": args.unit, "scenario": scenario.name, "seed": args.seed}
    if args.unit == "select":
        out["selection"] = run.select(args.methods)
    elif args.unit == "methods":
        selection = compat_report.merge_selections(
            [json.loads(p.read_text())["selection"] for p in args.selection]
        )
        out["part"] = run.methods(args.seed, selection, args.methods)
    else:
        out["part"] = run.auto(args.seed)
    return out


def combine_units(paths: list[Path], split: Split, cfg: RunConfig, quick: bool) -> dict[str, Any]:
    """Scenarios from ``--unit`` files: a ``select`` file and every seed's ``methods`` and
    ``auto`` files per scenario; the elapsed time is the units' sum."""
    units = [json.loads(p.read_text()) for p in paths]
    scenarios, seeds = [], set()
    for scenario in SCENARIOS:
        mine = [u for u in units if u["scenario"] == scenario.name]
        if not mine:
            continue
        selection = compat_report.merge_selections(
            [u["selection"] for u in mine if u["unit"] == "select"]
        )
        parts = [u["part"] for u in mine if u["unit"] != "select"]
        seeds.add(len({p["seed"] for p in parts}))
        scenarios.append(ScenarioRun(scenario, split, cfg).finish(selection, parts))
    if len(seeds) != 1:
        raise ValueError(f"scenarios have different numbers of seeds: {sorted(seeds)}")
    payload = _payload(split, cfg, quick, seeds.pop(), scenarios)
    payload["elapsed_minutes"] = sum(u["elapsed_minutes"] for u in units)
    payload["units"] = len(units)
    return payload


def widen(args: argparse.Namespace, split: Split, cfg: RunConfig) -> Path:
    """``--widen FILE``: its scenarios (or ``--scenarios``) widened, written alone to ``--out``
    for ``--merge`` after the file they came from."""
    started = time.time()
    previous = json.loads(args.widen.read_text())
    names = args.scenarios.split(",") if args.scenarios else None
    widened = [
        widen_scenario(ScenarioRun(s, split, cfg), sc)
        for s in SCENARIOS
        for sc in previous["scenarios"]
        if sc["scenario"]["name"] == s.name and (names is None or s.name in names)
    ]
    if not widened:
        raise SystemExit(f"no scenario of {names} in {args.widen}")
    payload = {
        **previous,
        "extend_rounds": cfg.extend_rounds,
        "scenarios": widened,
        "command": f"python -m bench.quality.compat --widen {args.widen.name}"
        + (f" --scenarios {args.scenarios}" if args.scenarios else ""),
        "elapsed_minutes": (time.time() - started) / 60,
        "units": 1,
    }
    label = args.scenarios.replace(",", "+") if args.scenarios else "all"
    out = args.out or args.widen.with_name(f"compat-widen-{label}.json")
    out.write_text(json.dumps(json_safe(payload)))
    print(out)
    return out


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
        "--widen",
        type=Path,
        default=None,
        help="a results file whose scenarios (--scenarios, default all) get the current "
        "widening rule: only new trials are trained, moved choices retrained; writes --out",
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
    torch.set_num_threads(args.threads)
    started = time.time()
    split = load_split(args.quick)
    cfg = QUICK if args.quick else FULL
    default_out = RESULTS.with_name("compat-quick.json") if args.quick else RESULTS
    if args.widen:
        return widen(args, split, cfg)
    if args.unit:
        unit = run_unit(args, split, cfg)
        unit["elapsed_minutes"] = (time.time() - started) / 60
        out = args.out or RESULTS.with_name(f"compat-unit-{args.scenarios}-{args.unit}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(json_safe(unit)))
        print(out)
        return out
    if args.combine:
        payload = combine_units(args.combine, split, cfg, args.quick)
        payload["command"] = (
            f"python -m bench.quality.compat --unit … ({payload['units']} units: per scenario one "
            "select, and per seed one methods and one auto), then --combine"
        )
    else:
        names = args.scenarios.split(",") if args.scenarios else None
        if args.quick and names is None:
            names = list(QUICK_SCENARIOS)
        chosen = [s for s in SCENARIOS if names is None or s.name in names]
        if names and len(chosen) != len(names):
            parser.error(f"unknown scenario in {names}")
        seeds = list(range(args.seeds))
        scenarios = []
        for sc in chosen:
            _log(f"scenario {sc.name}")
            scenarios.append(run_scenario(sc, split, seeds, cfg))
        payload = _payload(split, cfg, args.quick, len(seeds), scenarios)
        payload["elapsed_minutes"] = (time.time() - started) / 60
        payload["command"] = "python -m bench.quality.compat" + (" --quick" if args.quick else "")
        for flag, value, default in (
            ("--scenarios", args.scenarios, None),
            ("--seeds", args.seeds, 3),
            ("--querydoc", args.querydoc, "reuse"),
        ):
            if value != default:
                payload["command"] += f" {flag} {value}"
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
