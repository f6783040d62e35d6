"""Widening a finished ``bench.quality.compat`` run's selection without rerunning what it measured.

``widen_scenario(run, previous)`` applies the current selection rule (``bench.quality.compat_grid``: the
base trials, then trials one grid step past an end the best sits on) to a scenario of an earlier
results file: the trials it already holds are reused (training is seeded, so retraining them
would give the same figures; ``check_reuse`` verifies one first), only the new ones are trained,
and a method whose choice moved is retrained on the training part for every seed and measured
again. ``auto`` needs no selection: its measurements are kept, assembled again with the rest.
"""

from __future__ import annotations

from typing import Any

from app.ml.evaluation.retrieval import json_safe
from app.ml.upgrade.alternatives import assemble, measure_bridge, measure_reindex, measure_stay
from bench.quality import compat_grid, compat_report

# Keys ``assemble`` adds to a bridge's measured views (everything else is ``measure_bridge``'s).
_ASSEMBLED = ("arr", "class_own_space", "p_com", "p_up", "reference")


def measured_views(entry: dict[str, Any]) -> dict[str, Any]:
    """``measure_bridge``'s output back from an assembled entry (its own space is stored as
    ``class_own_space``), to assemble it again against another reference."""
    views = {k: v for k, v in entry.items() if k not in _ASSEMBLED}
    if "class_own_space" in entry:
        views["class_new_new"] = entry["class_own_space"]
    return views


# The stored trial retrained before any is reused: a trained method, and a quick one.
CHECKED_METHOD = "affine"
TOLERANCE = 1e-4


def check_reuse(run: Any, previous: dict[str, Any]) -> None:
    """Retrain ``CHECKED_METHOD``'s first stored trial and compare its validation figures with
    the stored ones: reusing trials is only sound when the current code reproduces them. Raises
    ``ValueError`` naming the first figure that differs by more than ``TOLERANCE``."""
    trial = previous["selection"]["trials"][CHECKED_METHOD][0]
    train, val = run.validation()
    fresh = measure_bridge(val, train(CHECKED_METHOD, trial["settings"]))
    for view in ("instance", "class"):
        for metric, stored in trial["val"].get(view, {}).items():
            now = fresh.get(view, {}).get(metric)
            if stored is None or now is None or abs(now - stored) > TOLERANCE:
                raise ValueError(
                    f"{run.scenario.name}: {CHECKED_METHOD} {trial['settings']} {view} {metric} "
                    f"was {stored}, retrained {now}: the stored trials do not reproduce under "
                    "the current code; run the selection again instead of widening"
                )


def widen_scenario(run: Any, previous: dict[str, Any]) -> dict[str, Any]:
    """``previous`` (a scenario of an earlier results file) with its selection widened by the
    current rule: its trials are reused, only the new ones trained (``ScenarioRun.select``).
    Methods whose choice moved are retrained per seed and every row is assembled again; ``auto``
    needs no selection and keeps its measurements. ``check_reuse`` comes first."""
    check_reuse(run, previous)
    selection = run.select(reuse=previous["selection"]["trials"])
    before = previous["selection"]["chosen"]
    moved = tuple(m for m in compat_grid.METHODS if selection["chosen"][m] != before.get(m))
    if "independent" in moved:  # its temperature and its reference reach every method
        moved = compat_grid.METHODS
    print(f"{run.scenario.name}: choice moved for {list(moved) or 'no method'}", flush=True)
    ev = run.evaluation_set(run.context(0))
    stay, reindex = measure_stay(ev), measure_reindex(ev)
    runs = []
    for old_run in previous["runs"]:
        metrics = old_run["metrics"]
        independent = {k: v for k, v in metrics["independent"].items() if k != "role"}
        seconds = dict(old_run["seconds"])
        bridges = {
            name: measured_views(entry)
            for name, entry in metrics.items()
            if name not in ("stay", "reindex", "independent")
        }
        if moved:
            part = run.methods(old_run["seed"], selection, moved)
            bridges.update(part["measured"])
            independent = part.get("independent", independent)
            seconds.update(part["seconds"])
        new_metrics = assemble(stay, reindex, bridges, independent)
        runs.append({**old_run, "metrics": new_metrics, "seconds": seconds})
    return json_safe(
        {
            **previous,
            "selection": selection,
            "runs": runs,
            "summary": compat_report.summarise(runs),
        }
    )
