"""``auto``'s rows of an earlier ``bench.quality.compat`` run replaced by new ``--unit auto`` runs.

Why: ``auto`` is the service's own rule, and when its budget changes (issue 26 item 3: 3 + 1
trials per candidate became 3 + 2) only its rows are out of date. Every other row (each single
method's selection and measurement, old→old, reindex, the independent head) depends only on the
seed's split, which the unit's ``--seed`` reproduces, so retraining them would cost the whole run
(over two hours here) to reproduce figures already recorded.

The replacement is exact bookkeeping, no training: a run's stored ``stay``, ``reindex`` and
``independent`` entries are ``alternatives.assemble``'s output, whose inputs they hold verbatim
(``stay``/``reindex`` plus ``arr``, ``independent`` plus ``role``), so the new ``auto`` entry is
``assemble`` of those inputs with the unit's measurement, the entry a full run would have written.
``tests/test_compat_replace.py`` checks the round trip: putting a run's own ``auto`` part back
reproduces its entry.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.ml.upgrade.alternatives import assemble

AUTO = "auto"


def _inputs(metrics: Mapping[str, Any]) -> tuple[dict, dict, dict | None]:
    """``assemble``'s stay, reindex and independent inputs, read back from its output."""
    stay = {k: v for k, v in metrics["stay"].items() if k != "arr"}
    reindex = {k: v for k, v in metrics["reindex"].items() if k != "arr"}
    independent = metrics.get("independent")
    if independent is not None:
        independent = {k: v for k, v in independent.items() if k != "role"}
    return stay, reindex, independent


def auto_entry(metrics: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any]:
    """The ``auto`` entry ``assemble`` writes for ``measured`` (``measure_bridge``'s output)
    beside the alternatives already in ``metrics``."""
    stay, reindex, independent = _inputs(metrics)
    return assemble(stay, reindex, {AUTO: dict(measured)}, independent)[AUTO]


def replace_run_auto(run: Mapping[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    """One seed's run with ``auto``'s choice, time and entries taken from a ``--unit auto``
    part of the same seed (ValueError for another seed, or a part missing a measured set)."""
    if part["seed"] != run["seed"]:
        raise ValueError(f"auto part of seed {part['seed']} for the run of seed {run['seed']}")
    out = copy.deepcopy(dict(run))
    out["auto"] = copy.deepcopy(part["auto"])
    out["seconds"] = {**run["seconds"], AUTO: part["seconds"][AUTO]}
    for key, measured_set in (("metrics", "evaluation"), ("final_metrics", "held_back")):
        if key not in run:
            continue
        if measured_set not in part:
            raise ValueError(f"the auto part of seed {part['seed']} has no {measured_set!r} set")
        measured = part[measured_set]["measured"][AUTO]
        out[key] = {**run[key], AUTO: auto_entry(run[key], measured)}
    return out


def replace_auto(
    payload: Mapping[str, Any],
    units: Sequence[Mapping[str, Any]],
    summarise_scenario: Callable[[str, list[dict[str, Any]]], dict[str, Any]],
) -> dict[str, Any]:
    """``payload`` with every run that a ``--unit auto`` file covers (same scenario and seed)
    rebuilt by ``replace_run_auto``, and those scenarios' summaries recomputed by
    ``summarise_scenario(name, runs)``. Every unit must match a run of the payload, and every
    run of a scenario a unit touches must have its unit: a scenario half old, half new would
    mix budgets in one row."""
    parts = {(u["scenario"], u["seed"]): u["part"] for u in units if u["unit"] == AUTO}
    if len(parts) != len(units):
        raise ValueError("only --unit auto files (one per scenario and seed) replace auto's rows")
    runs_present = {
        (sc["scenario"]["name"], r["seed"]) for sc in payload["scenarios"] for r in sc["runs"]
    }
    unknown = sorted(set(parts) - runs_present)
    if unknown:
        raise ValueError(f"auto units for runs the payload does not hold: {unknown}")
    out = dict(payload)
    scenarios = []
    for sc in payload["scenarios"]:
        name = sc["scenario"]["name"]
        covered = [(name, r["seed"]) in parts for r in sc["runs"]]
        if not any(covered):
            scenarios.append(sc)
            continue
        if not all(covered):
            missing = [r["seed"] for r, c in zip(sc["runs"], covered, strict=True) if not c]
            raise ValueError(f"{name}: no auto unit for seed(s) {missing}")
        runs = [replace_run_auto(r, parts[(name, r["seed"])]) for r in sc["runs"]]
        scenarios.append({**summarise_scenario(name, runs), "scenario": sc["scenario"]})
    out["scenarios"] = scenarios
    return out
