"""Replacing ``auto``'s rows of a recorded compat run (``bench.quality.compat_replace``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench.quality import compat, compat_replace

RECORDED = Path(__file__).resolve().parents[1] / "bench/results/compat-auto5.json"


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return json.loads(RECORDED.read_text())


def auto_part(run: dict[str, Any], scale: float = 1.0) -> dict[str, Any]:
    """A ``--unit auto`` part for ``run``'s seed whose measurement is the run's own auto entry
    (``measure_bridge``'s views read back), every figure times ``scale``."""

    def views(entry: dict[str, Any]) -> dict[str, Any]:
        measured = {
            "instance": entry["instance"],
            "class": entry["class"],
            "class_new_new": entry["class_own_space"],
        }
        return {
            view: {k: v * scale for k, v in metrics.items()} for view, metrics in measured.items()
        }

    return {
        "seed": run["seed"],
        "auto": {**run["auto"], "chosen": "replaced"},
        "seconds": {"auto": 1.5},
        "evaluation": {"measured": {"auto": views(run["metrics"]["auto"])}},
        "held_back": {"measured": {"auto": views(run["final_metrics"]["auto"])}},
    }


def test_putting_a_runs_own_auto_back_reproduces_its_entries(recorded: dict) -> None:
    for scenario in recorded["scenarios"]:
        for run in scenario["runs"]:
            rebuilt = compat_replace.replace_run_auto(run, auto_part(run))
            assert rebuilt["metrics"] == run["metrics"]
            assert rebuilt["final_metrics"] == run["final_metrics"]
            assert rebuilt["auto"]["chosen"] == "replaced"
            assert rebuilt["seconds"]["auto"] == 1.5
            assert rebuilt["seconds"]["procrustes"] == run["seconds"]["procrustes"]


def test_a_new_measurement_changes_auto_alone(recorded: dict) -> None:
    run = recorded["scenarios"][0]["runs"][0]
    rebuilt = compat_replace.replace_run_auto(run, auto_part(run, scale=0.5))
    old, new = run["metrics"]["auto"], rebuilt["metrics"]["auto"]
    assert new["class"]["cmc1"] == pytest.approx(0.5 * old["class"]["cmc1"])
    # P_com moves with new→old CMC@1 against the same stay and reference.
    assert new["p_com"]["cmc1"] < old["p_com"]["cmc1"]
    assert new["reference"] == old["reference"]
    for name in run["metrics"]:
        if name != "auto":
            assert rebuilt["metrics"][name] == run["metrics"][name]


def test_replacing_recomputes_the_scenarios_summary(recorded: dict) -> None:
    payload = copy.deepcopy(recorded)
    name = payload["scenarios"][0]["scenario"]["name"]
    units = [
        {"unit": "auto", "scenario": name, "seed": r["seed"], "part": auto_part(r, 0.5)}
        for r in payload["scenarios"][0]["runs"]
    ]
    by_name = {s.name: s for s in compat.SCENARIOS}
    out = compat_replace.replace_auto(
        payload, units, lambda n, runs: compat.scenario_result(by_name[n], runs)
    )
    before = recorded["scenarios"][0]["summary"]
    after = out["scenarios"][0]["summary"]
    assert after != before
    assert out["scenarios"][0]["scenario"] == recorded["scenarios"][0]["scenario"]
    assert out["scenarios"][1] == recorded["scenarios"][1]  # untouched scenario
    assert [r["auto"]["chosen"] for r in out["scenarios"][0]["runs"]] == ["replaced"] * len(units)


def test_a_scenario_must_be_replaced_whole_and_units_must_match(recorded: dict) -> None:
    scenario = recorded["scenarios"][0]
    name, runs = scenario["scenario"]["name"], scenario["runs"]
    one = [{"unit": "auto", "scenario": name, "seed": runs[0]["seed"], "part": auto_part(runs[0])}]
    with pytest.raises(ValueError, match="no auto unit for seed"):
        compat_replace.replace_auto(recorded, one, lambda n, r: {})
    stray = [{"unit": "auto", "scenario": name, "seed": 99, "part": auto_part(runs[0])}]
    with pytest.raises(ValueError, match="does not hold"):
        compat_replace.replace_auto(recorded, stray, lambda n, r: {})
    select = [{"unit": "select", "scenario": name, "seed": 0, "selection": {}}]
    with pytest.raises(ValueError, match="only --unit auto"):
        compat_replace.replace_auto(recorded, select, lambda n, r: {})
    with pytest.raises(ValueError, match="seed"):
        compat_replace.replace_run_auto(runs[0], auto_part(runs[1]))


def test_the_command_line_replaces_and_names_both_runs(recorded: dict, tmp_path: Path) -> None:
    scenario = recorded["scenarios"][0]
    name = scenario["scenario"]["name"]
    paths = []
    for run in scenario["runs"]:
        unit = {
            "unit": "auto",
            "scenario": name,
            "seed": run["seed"],
            "part": auto_part(run),
            "elapsed_minutes": 2.0,
        }
        paths.append(tmp_path / f"auto-{run['seed']}.json")
        paths[-1].write_text(json.dumps(unit))
    out = tmp_path / "replaced.json"
    argv = ["--combine", *map(str, paths), "--replace-auto", str(RECORDED)]
    compat.main([*argv, "--querydoc", "skip", "--no-markdown", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["command"].startswith(recorded["command"])
    assert f"--replace-auto {RECORDED}" in payload["command"] and "--final" in payload["command"]
    expected = recorded["elapsed_minutes"] + 2.0 * len(paths)
    assert payload["elapsed_minutes"] == pytest.approx(expected)
    assert payload["scenarios"][0]["runs"][0]["metrics"] == scenario["runs"][0]["metrics"]
    with pytest.raises(SystemExit):
        compat.main(["--replace-auto", str(RECORDED), "--no-markdown"])
