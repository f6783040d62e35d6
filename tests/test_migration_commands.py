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
    assert lines[2] == "expected recall@1: 0.510 at 10% → 0.520 at 13% → 0.600 at 100%"
    assert lines[3] == "expected recall@10: 0.810 at 10% → 0.820 at 13% → 0.900 at 100%"
    assert "gain_correlation 0.0123" in lines[4] and "area 0.51" in lines[4]
    assert "signals" not in text and "warning" not in text
    assert "give -o FILE" in describe_plan(PLAN | {"expected": None}, "gal_x", None)


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
