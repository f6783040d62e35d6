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
