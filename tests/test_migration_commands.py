"""``nobackfill backfill plan``'s summary for people, without a server: it reads whatever the plan
answers (``signals`` and ``warning`` when the server sends them, nothing when it does not), and
the ids file it writes is a ``.npy`` of strings under exactly the name given."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.client.migration_commands import backfill_plan, describe_plan, write_ids

PLAN: dict[str, Any] = {
    "model_id": "mdl_x",
    "ids": ["a", "b", "c"],
    "estimator": "expected_gain",
    "view": "query",
    "reembedded": 10,
    "total": 100,
    "fraction_after": 0.13,
    "expected": [
        {"fraction": f, "metric": m, "value": v}
        for m, base in (("recall@1", 0.5), ("recall@10", 0.8))
        for f, v in ((0.0, base), (0.1, base + 0.01), (0.13, base + 0.02), (1.0, base + 0.1))
    ],
    "validation": {"view": "query", "gain_correlation": 0.0123, "area": 0.51, "chosen": None},
}


def test_summary_of_a_plan_without_signals() -> None:
    text = describe_plan(PLAN, "gal_x", "plan.npy")
    lines = text.splitlines()
    assert lines[0] == "3 items to re-embed for mdl_x, most valuable first → plan.npy"
    assert lines[1] == "gallery gal_x: 10/100 re-embedded now, 13/100 (13%) once these are"
    label = "(bridged search, features only)"
    assert lines[2] == f"expected recall@1 {label}: 0.510 at 10% → 0.520 at 13% → 0.600 at 100%"
    assert lines[3] == f"expected recall@10 {label}: 0.810 at 10% → 0.820 at 13% → 0.900 at 100%"
    assert "gain_correlation 0.0123" in lines[4] and "area 0.51" in lines[4]
    assert "signals" not in text and "warning" not in text
    assert "give -o FILE" in describe_plan(PLAN | {"expected": None}, "gal_x", None)


def test_the_plan_prints_the_transition_curve_gallery_get_quotes() -> None:
    """With the old model running the README's search is the transition search: the plan prints
    its curve, labelled, at the same shares and by the same interpolation as ``gallery get``'s
    "now" (app.migration.progress.expected_quality)."""
    from app.migration.progress import expected_quality
    from app.ml.backfill.plan import PlannerFit

    transition = [
        {"fraction": f, "metric": "recall@10", "value": v}
        for f, v in ((0.0, 0.49), (0.25, 0.51), (0.5, 0.53), (1.0, 0.57))
    ]
    text = describe_plan(PLAN | {"transition_expected": transition}, "gal_x", None)
    line = next(x for x in text.splitlines() if x.startswith("expected recall@10"))
    assert line.startswith("expected recall@10 (transition search): ")
    fit = PlannerFit("random", None, "query", "recall@10", [], {}, {}, transition)
    now = expected_quality(fit, 0.10)
    after = expected_quality(fit, 0.13)
    assert line.endswith(f"{now['now']:.3f} at 10% → {after['now']:.3f} at 13% → 0.570 at 100%"), (
        line
    )
    assert "bridged" not in text


@pytest.mark.parametrize(
    "signals",
    [["access", "learned_gain"], {"access": 0.7, "learned_gain": 0.3}, "access"],
    ids=["list", "weights", "text"],
)
def test_summary_shows_signals_and_the_warning(signals: Any) -> None:
    warning = "no better than random on validation (area 0.50 vs 0.50)"
    text = describe_plan(PLAN | {"signals": signals, "warning": warning}, "gal_x", None)
    assert "signals: access" in text
    assert f"warning: {warning}" in text.splitlines()
    note = "recall@1 dips at 25 %: too few held-out queries to tell"
    assert f"({note})" in describe_plan(PLAN | {"expected_note": note}, "gal_x", None)


def test_json_output_and_the_ids_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    class FakeClient:
        def backfill_plan(self, gallery_id: str, model_id: str, **size: Any) -> dict[str, Any]:
            assert (gallery_id, model_id, size) == (
                "gal_x",
                "mdl_x",
                {"fraction": 0.13, "count": None},
            )
            return PLAN | {"warning": "no better than random"}

    target = tmp_path / "planned"  # no .npy suffix: written under this name all the same
    args = argparse.Namespace(
        gallery="gal_x", model="mdl_x", fraction=0.13, count=None, output=str(target), json=True
    )
    assert backfill_plan(FakeClient(), args) == 0  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert json.loads(out)["ids"] == PLAN["ids"]
    assert err == "warning: no better than random\n"  # seen even when stdout goes to jq
    saved = np.load(target, allow_pickle=False)
    assert saved.dtype.kind == "U" and saved.tolist() == PLAN["ids"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["planned"]

    write_ids(str(target), [])
    assert np.load(target, allow_pickle=False).shape == (0,)


def test_methods_are_listed_once_each_under_their_kind(capsys: pytest.CaptureFixture) -> None:
    """``nobackfill methods`` printed the answer's name lists and then the described entries:
    every method twice."""
    from app.client.commands import methods

    class FakeClient:
        def methods(self) -> dict[str, Any]:
            return {
                "backbone": ["procrustes", "hbct"],
                "continual": ["hmcl-ca"],
                "methods": [
                    {"name": "procrustes", "kind": "backbone", "description": "an orthogonal map"},
                    {
                        "name": "hbct",
                        "kind": "backbone",
                        "description": "cones",
                        "needs_labels": True,
                    },
                    {"name": "hmcl-ca", "kind": "continual", "description": "admissible updates"},
                ],
            }

    assert methods(FakeClient(), argparse.Namespace(json=False)) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert [out.count(name) for name in ("procrustes", "hbct", "hmcl-ca")] == [1, 1, 1]
    assert out.splitlines() == [
        "backbone:",
        "  procrustes  an orthogonal map",
        "  hbct (needs labels)  cones",
        "continual:",
        "  hmcl-ca  admissible updates",
    ]
