"""bench.compat's --quick path reuses the full run's validation choices."""

import json
from pathlib import Path

import pytest

from bench import compat


def _write_results(path: Path, lift_scale: float, hbct: dict) -> None:
    params = {"epochs": 15, "hidden_dim": 0}
    methods = {m: dict(params) for m in compat.QUICK_METHODS}
    methods["hbct"] = {**params, **hbct}
    payload = {
        "scenarios": [
            {
                "scenario": {"name": "external"},
                "selection": {"base": params, "lift_scale": lift_scale, "methods": methods},
            }
        ]
    }
    path.write_text(json.dumps(payload))


def test_quick_reuses_the_full_runs_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "compat.json"
    _write_results(results, 0.3, {"old_proto_temperature": 0.05, "compat_weight": 0.3})
    monkeypatch.setattr(compat, "RESULTS", results)
    sel = compat.quick_selection("external")
    assert sel["lift_scale"] == 0.3
    assert sel["methods"]["hbct"]["old_proto_temperature"] == 0.05
    assert sel["methods"]["hbct"]["compat_weight"] == 0.3
    assert {p["epochs"] for p in sel["methods"].values()} == {5}
    assert "compat_weight 0.3" in compat._chosen(sel["methods"])


def test_quick_without_a_full_run_uses_fixed_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "RESULTS", tmp_path / "absent.json")
    sel = compat.quick_selection("external")
    assert sel["lift_scale"] == 1.0
    assert set(sel["methods"]) == set(compat.QUICK_METHODS)
    assert {p["epochs"] for p in sel["methods"].values()} == {5}


def _summary(p_com: float, p_up: float) -> dict:
    return {
        "summary": {
            "p_com": {k: [p_com, 0.0] for k in compat.METRICS},
            "p_up": {k: [p_up, 0.0] for k in compat.METRICS},
        }
    }


def test_bar_needs_a_win_over_every_baseline_and_the_p_up_floor() -> None:
    def payload(hbct: tuple[float, float], bct: float) -> dict:
        results = {"hbct": _summary(*hbct), "bct": _summary(bct, 0.0)}
        return {"scenarios": [{"scenario": {"name": "external"}, "results": results}]}

    met = compat.bar_lines(payload((0.75, 0.0), 0.5))
    assert all(line.endswith("— met") for line in met) and len(met) == 4
    behind = compat.bar_lines(payload((0.75, 0.0), 0.8))
    assert sum(line.endswith("— missed") for line in behind) == 2
    costly = compat.bar_lines(payload((0.75, -0.02), 0.5))
    assert sum(line.endswith("— missed") for line in costly) == 2
    short = compat.bar_lines(payload((0.65, 0.0), 0.5))
    assert [line.endswith("— missed") for line in short] == [False, True, False, False]


def test_selection_needs_the_p_up_floor_on_each_metric() -> None:
    old_old = {"cmc1": 0.5, "map": 0.4}
    ind = {"cmc1": 0.7, "map": 0.6}

    def result(new_new_cmc: float, new_new_map: float) -> dict:
        return {
            "new_old": {"cmc1": 0.6, "map": 0.5},
            "new_new": {"cmc1": new_new_cmc, "map": new_new_map},
        }

    assert compat._selection_score(result(0.7, 0.6), old_old, ind)[0]
    # Mean P_up is above the floor, but CMC@1's is below it.
    assert not compat._selection_score(result(0.69, 0.62), old_old, ind)[0]
    assert compat._selection_score(result(0.7, 0.6), old_old, ind)[1] == pytest.approx(0.5)
