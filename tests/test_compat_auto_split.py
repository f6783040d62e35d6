"""Issue 42 item 2 ("matched protocols"): in ``bench.quality.compat`` auto validates on exactly the
benchmark's own validation carve — never on the items the old heads were trained on — and its
row is a model trained on the same items as every single method's row.

Before the fix auto carved its own validation from the *sorted* training list with the same seed
as the benchmark's carve of the *unsorted* one: different items, most of them (65 of 81 on the
fixture's seed 0) in the fit part the old heads are trained on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.ml.auto.candidates import AutoParams, split_for_validation
from app.ml.upgrade import pipeline
from app.ml.upgrade.data import UpgradeData
from app.ml.upgrade.pipeline import UpgradeContext, run_auto
from bench.quality import compat, compat_scenarios

# One trained candidate beside procrustes, one trial, one epoch: the rows each training and each
# validation set use are what is checked, not the figures.
TINY = compat.RunConfig(
    epochs=1,
    trials=1,
    auto_params={"epochs": 1, "candidates": ["affine"], "trials": 1, "extra_trials": 0},
    extend_rounds=0,
)
EMPTY = np.zeros(0, dtype=np.int64)


class Spy:
    """Records the rows every ``UpgradeContext.train`` trains on and the measured items of every
    ``UpgradeContext.eval_set``, in call order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trained: list[tuple[str, np.ndarray]] = []
        self.measured: list[np.ndarray] = []
        train, eval_set = UpgradeContext.train, UpgradeContext.eval_set

        def spy_train(ctx, method, params, rows, query_rows, hooks):
            self.trained.append((method, np.asarray(rows).copy()))
            return train(ctx, method, params, rows, query_rows, hooks)

        def spy_eval_set(ctx, gallery, items, query_rows):
            self.measured.append(np.asarray(items).copy())
            return eval_set(ctx, gallery, items, query_rows)

        monkeypatch.setattr(pipeline.UpgradeContext, "train", spy_train)
        monkeypatch.setattr(pipeline.UpgradeContext, "eval_set", spy_eval_set)


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_validates_on_the_benchmarks_carve_and_never_on_old_head_items(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    split = compat_scenarios.load_split(quick=True, seed=seed)
    (scenario,) = [s for s in compat_scenarios.SCENARIOS if s.name == "new-architecture"]
    run = compat.ScenarioRun(scenario, split, TINY)
    spy = Spy(monkeypatch)
    part = run.auto()
    # The first set auto builds is its validation set (the held-out one comes after training).
    validated = spy.measured[0]
    assert np.array_equal(np.sort(validated), split.validation)
    old_head = compat_scenarios._old_training_items(split, scenario.old_training or "all")
    for mode in ("all", "half-items", "half-classes"):
        items = compat_scenarios._old_training_items(split, mode)
        assert np.intersect1d(validated, items).size == 0, mode
    assert np.intersect1d(validated, old_head).size == 0
    # Every validation trial is trained on the benchmark's fit part, as the single methods'
    # selection trials are (``ScenarioRun.validation``); the last training is the chosen
    # candidate retrained on the whole training part (the next test).
    *trials, _ = [rows for method, rows in spy.trained if method in ("procrustes", "affine")]
    assert len(trials) == 2
    assert all(np.array_equal(np.sort(rows), split.fit) for rows in trials)
    assert part["auto"]["n_validation"] == split.validation.size


def test_auto_row_is_trained_on_the_rows_every_single_method_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Single methods are retrained on the whole training part with their chosen settings
    (``ScenarioRun.methods``); auto's measured row must be too, not its fit-part model."""
    split = compat_scenarios.load_split(quick=True, seed=0)
    (scenario,) = [s for s in compat_scenarios.SCENARIOS if s.name == "external"]
    run = compat.ScenarioRun(scenario, split, TINY)
    spy = Spy(monkeypatch)
    part = run.auto()
    method, rows = spy.trained[-1]
    assert np.array_equal(np.sort(rows), split.train)
    assert method == part["auto"]["method"]
    # The settings the retrained row used are the ones auto chose.
    assert part["auto"]["params"]["epochs"] == 1
    # The fit-part model the service would serve is still measured, beside it.
    assert "recall@1" in part["auto"]["fit_part_model"]["evaluation"]["instance"]

    spy.trained.clear()
    selection = {"chosen": {"procrustes": {}}}
    run.methods(selection, ("procrustes",))
    ((_, single_rows),) = spy.trained
    assert np.array_equal(single_rows, rows)


def _data(wordnet_small: dict[str, Any]) -> UpgradeData:
    rows = np.arange(0, len(wordnet_small["label"]), 4)
    labels = np.unique(wordnet_small["label"][rows], return_inverse=True)[1]
    return UpgradeData(
        wordnet_small[f"gloss.{compat_scenarios.NEW_MODEL}"][rows],
        wordnet_small[f"gloss.{compat_scenarios.OLD_MODEL}"][rows],
        labels,
    )


def test_run_auto_takes_a_given_validation_carve_and_carves_its_own_without_one(
    wordnet_small: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ml.geometry.space import EuclideanLift
    from app.ml.methods.training import NO_HOOKS

    data = _data(wordnet_small)
    n = len(data)
    train, evaluation = np.arange(0, n - 40), np.arange(n - 40, n)
    ctx = UpgradeContext.build(data, EuclideanLift(), 0, NO_HOOKS)
    params = AutoParams.from_dict({"epochs": 1, "candidates": [], "trials": 1})
    spy = Spy(monkeypatch)
    # Without a carve: the service's own, as before.
    run_auto(ctx, params, "class", train, evaluation, EMPTY, EMPTY)
    own = split_for_validation(train, 0)
    assert own is not None
    assert np.array_equal(spy.measured[0], own[1])
    # With one: exactly it.
    spy.measured.clear()
    validation = train[::5]
    fit = np.setdiff1d(train, validation)
    out = run_auto(ctx, params, "class", train, evaluation, EMPTY, EMPTY, validation=validation)
    assert np.array_equal(spy.measured[0], validation)
    assert out.report["auto"]["n_validation"] == validation.size
    assert out.report["auto"]["n_fit"] == fit.size
    assert out.report["auto"]["validation_given"] is True
    # Items outside the training part, or too few to fit, are refused.
    for bad in (np.array([*validation, evaluation[0]]), train[: train.size - 5]):
        with pytest.raises(ValueError, match="validation"):
            run_auto(ctx, params, "class", train, evaluation, EMPTY, EMPTY, validation=bad)
