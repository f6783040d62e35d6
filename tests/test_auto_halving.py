"""Successive halving of ``auto``'s trials (issue 44 item 4): the budget rule, the orchestration
that applies it to every candidate alike, and the whole job's progress and ETA."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from app.ml.auto import halving
from app.ml.auto.candidates import INSTANCE_FLOOR, AutoParams
from app.ml.methods.compat import CompatParams
from app.ml.methods.training import TrainingHooks
from app.ml.upgrade.progress import Progress
from app.ml.upgrade.tuning import settings_key, tune

DIMS = (768, 384)


def test_screening_takes_a_third_of_the_epochs_and_only_where_trials_compete() -> None:
    assert halving.screen_epochs(15, 5) == 5
    assert halving.screen_epochs(3, 5) == 1
    assert halving.screen_epochs(2, 5) == 1
    assert halving.screen_epochs(1, 5) is None  # nothing shorter than one epoch
    assert halving.screen_epochs(15, 1) is None  # a single trial: nothing to compare
    assert halving.screen_epochs(0, 5) is None  # a closed form
    assert halving.screen_epochs(15, 5, enabled=False) is None
    assert halving.budget_epochs(15, 5, 5) == 5 * 5 + halving.FINALISTS * 15
    assert halving.budget_epochs(15, 5, None) == 75


def test_finalists_are_the_best_keys_and_the_earlier_on_ties() -> None:
    keys = [(True, 0.5), (False, 0.9), (True, 0.7), (True, 0.7)]
    assert halving.finalists(keys, 1) == [2]  # eligible first, then the metric, earlier on ties
    assert halving.finalists(keys, 2) == [2, 3]
    assert halving.finalists(keys, 9) == [0, 1, 2, 3]


class Model:
    """What the fake trainer returns: the method and parameters it was trained with."""

    def __init__(self, method: str, params: CompatParams) -> None:
        self.method, self.params = method, params


def _fake(scores: dict[tuple[str, Any, int], tuple[float, float]]):
    """A trainer and a validation scorer with figures from ``scores``: (method, the tuned
    value, epochs) → (primary, own-item R@1); unknown values score low."""
    trained: list[tuple[str, dict[str, Any]]] = []

    def train(method: str, params: CompatParams, hooks: TrainingHooks) -> Model:
        trained.append((method, params.to_dict()))
        for epoch in range(1, max(1, params.epochs if method != "procrustes" else 0) + 1):
            hooks.report(epoch, params.epochs, 1.0 / epoch)
        if method == "procrustes":
            hooks.report(0, 0, math.nan)
        return Model(method, params)

    def value(model: Model) -> Any:
        p = model.params
        return {"contrastive": p.compat_weight, "affine": p.adapter_rank}.get(model.method)

    def score(model: Model) -> dict[str, Any]:
        epochs = 0 if model.method == "procrustes" else model.params.epochs
        primary, r1 = scores.get((model.method, value(model), epochs), (0.1, 0.99))
        return {"instance": {"recall@1": r1, "mrr@100": primary}}

    return train, score, trained


def _tune(auto: AutoParams, scores, progress: Progress | None = None):
    train, score, trained = _fake(scores)
    names = auto.applicable(labelled=False)
    progress = progress or Progress(TrainingHooks())
    tuned = tune(auto, names, False, progress, train, score, ("instance", "mrr@100"), DIMS)  # type: ignore[arg-type]
    return tuned, trained


SCORES = {
    ("procrustes", None, 0): (0.5, 0.9),
    # contrastive screened at 5 epochs: 3.0 best, then past the top edge (9.0), then between
    # 3 and 9 (5.2) best of all but below the instance floor (0.95 × 0.9): not a finalist.
    ("contrastive", 1.0, 5): (0.60, 0.9),
    ("contrastive", 0.3, 5): (0.55, 0.9),
    ("contrastive", 3.0, 5): (0.70, 0.9),
    ("contrastive", 9.0, 5): (0.65, 0.9),
    ("contrastive", 5.2, 5): (0.90, 0.5),
    # At full length 1.0 would have been best: screening does not see it.
    ("contrastive", 1.0, 15): (0.95, 0.9),
    ("contrastive", 3.0, 15): (0.80, 0.9),
    ("affine", 64, 5): (0.60, 0.9),
    ("affine", 16, 5): (0.62, 0.9),
    ("affine", 256, 5): (0.58, 0.9),
    ("affine", 16, 15): (0.75, 0.9),
}


def test_every_tuned_candidate_is_screened_short_and_its_best_trained_again_in_full() -> None:
    auto = AutoParams.from_dict({"candidates": ["contrastive", "affine"]})
    tuned, trained = _tune(auto, SCORES)
    assert tuned.floor == pytest.approx(INSTANCE_FLOOR * 0.9)
    for name, axis in (("contrastive", "compat_weight"), ("affine", "adapter_rank")):
        assert tuned.screen[name] == 5
        assert [t.epochs for t in tuned.tried[name]] == [5] * 5
        (final,) = tuned.final[name]
        assert final.epochs == 15 and tuned.models[name][0].params.epochs == 15
        # The finalist's settings are the screened trial's, unchanged.
        assert final.settings == tuned.tried[name][tuned.final_of[name][0]].settings
        # The same budget for every tuned candidate.
        assert tuned.epochs_trained(name) == halving.budget_epochs(15, 5, 5)
        assert len({t.settings[axis] for t in tuned.tried[name]}) == 5
    # Widening followed the screened scores: past 3.0 (the top edge), then between 3 and 9.
    weights = [t.settings["compat_weight"] for t in tuned.tried["contrastive"]]
    assert weights == [1.0, 0.3, 3.0, 9.0, 5.2]
    # 5.2 screened best but below the floor: the eligible 3.0 is the finalist, as pick would rank.
    assert tuned.final_of["contrastive"] == [2]
    assert not tuned.tried["contrastive"][4].eligible
    assert tuned.final["contrastive"][0].primary == pytest.approx(0.80)
    assert tuned.final_of["affine"] == [1]  # rank 16
    # procrustes: one closed-form fit, not screened.
    assert tuned.screen["procrustes"] is None and len(tuned.final["procrustes"]) == 1
    # Trials ran round by round: every candidate's first grid value before any second one.
    order = [
        (m, p["compat_weight"] if m == "contrastive" else p["adapter_rank"]) for m, p in trained
    ]
    assert order[1:5] == [
        ("contrastive", 1.0),
        ("affine", 64),
        ("contrastive", 0.3),
        ("affine", 16),
    ]


def test_without_halving_every_trial_trains_in_full_and_competes_as_it_is() -> None:
    auto = AutoParams.from_dict({"candidates": ["contrastive"], "halving": False})
    full = {(m, v, 15): s for (m, v, e), s in SCORES.items() if e == 5}
    full[("procrustes", None, 0)] = SCORES[("procrustes", None, 0)]
    tuned, trained = _tune(auto, full)
    assert tuned.screen["contrastive"] is None
    assert [t.epochs for t in tuned.tried["contrastive"]] == [15] * 5
    assert tuned.final["contrastive"] is tuned.tried["contrastive"]
    assert len(tuned.models["contrastive"]) == 5
    assert sum(1 for m, _ in trained if m == "contrastive") == 5


def test_a_candidate_with_one_trial_is_not_screened() -> None:
    auto = AutoParams.from_dict({"candidates": ["contrastive"], "trials": 1})
    tuned, trained = _tune(auto, SCORES)
    assert tuned.screen["contrastive"] is None
    assert [t.epochs for t in tuned.final["contrastive"]] == [15]
    assert [m for m, _ in trained] == ["procrustes", "contrastive"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_prices_each_candidate_by_its_own_epochs() -> None:
    clock = Clock()
    events: list[dict[str, Any]] = []
    progress = Progress(TrainingHooks(progress=events.append), clock)
    slow = [progress.add_training("hbct", 2, "a") for _ in range(3)]
    fast = [progress.add_training("affine", 2, "b") for _ in range(3)]
    evaluation = progress.add_evaluation(weight=2.0)
    assert progress.eta() is None
    # One hbct training at 10 s an epoch, one affine training at 1 s an epoch.
    for handle, seconds in ((slow[0], 10.0), (fast[0], 1.0)):
        hooks = progress.start_training(handle, [], None)
        for epoch in (1, 2):
            clock.now += seconds
            hooks.report(epoch, 2, 0.5)
    # Left: 2 hbct trainings × 2 epochs × 10 s, 2 affine × 2 × 1 s, and the evaluation at the
    # mean epoch (5.5 s) per unit of weight, none being timed yet.
    assert progress.eta() == pytest.approx(40 + 4 + 2 * 5.5)
    progress.evaluating(evaluation, 2, 2, 0.5)
    clock.now += 3.0
    progress.evaluated()
    assert progress.eta() == pytest.approx(44)
    # An unseen setting of a measured candidate takes the candidate's mean.
    other = progress.add_training("hbct", 1, "c")
    assert progress.eta() == pytest.approx(54)
    progress.drop(other)
    assert progress.eta() == pytest.approx(44)
    assert progress.planned == 6


def test_an_unmeasured_candidate_takes_the_mean_of_the_candidates_measured() -> None:
    clock = Clock()
    progress = Progress(TrainingHooks(), clock)
    handles = {n: progress.add_training(n, 1) for n in ("a", "b", "b2", "c")}
    for name, seconds in (("a", 10.0), ("b", 1.0)):
        hooks = progress.start_training(handles[name], [])
        clock.now += seconds
        hooks.report(1, 1, 0.0)
    # c and b2 are priced at the mean of a's and b's own means, 5.5 s.
    assert progress.eta() == pytest.approx(11.0)


def test_the_job_fraction_never_goes_back_and_counts_the_whole_plan() -> None:
    clock = Clock()
    events: list[dict[str, Any]] = []
    progress = Progress(TrainingHooks(progress=events.append), clock)
    first = progress.add_training("a", 3)
    second = progress.add_training("b", 3)
    for handle, seconds in ((first, 1.0), (second, 9.0)):
        hooks = progress.start_training(handle, [], trial=1, trials=1, stage="screening")
        for epoch in (1, 2, 3):
            clock.now += seconds
            hooks.report(epoch, 3, 0.1)
    shares = [e["job_fraction"] for e in events]
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)
    # b's first epoch costs 9 s, not a's 1 s: the ETA went up, the share did not go back.
    assert events[3]["eta_s"] > events[2]["eta_s"]
    assert events[3]["job_fraction"] >= events[2]["job_fraction"]
    # Epochs restart per training; the whole job's share does not.
    assert [e["epoch"] for e in events] == [1, 2, 3, 1, 2, 3]
    assert events[-1]["candidate_index"] == events[-1]["candidates"] == 2
    assert {e["stage"] for e in events} == {"screening"}


def test_settings_key_ignores_the_epochs() -> None:
    assert settings_key({"epochs": 5, "lr": 0.1}) == settings_key({"lr": 0.1, "epochs": 15})
    assert settings_key({"lr": 0.1}) != settings_key({"lr": 0.2})


def test_auto_params_take_halving() -> None:
    assert AutoParams.from_dict({}).halving is True
    assert AutoParams.from_dict({"halving": False}).to_dict()["halving"] is False
    with pytest.raises(ValueError, match="halving"):
        AutoParams.from_dict({"halving": "no"})
    assert np.isclose(halving.SCREEN_FRACTION, 1 / 3)


def _fixture_data(wordnet_small: dict):
    from app.ml.upgrade.run import UpgradeData
    from bench.common.wordnet import NEW_MODEL, OLD_MODEL

    return UpgradeData(wordnet_small[f"gloss.{NEW_MODEL}"], wordnet_small[f"gloss.{OLD_MODEL}"])


def test_the_served_finalist_is_the_full_length_training_of_its_screened_settings(
    wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Screening changes which settings reach full length, never what a full-length trial is:
    the served model equals the candidate trained at full length with the finalist's settings
    on the fit part, parameter for parameter."""
    import app.ml.upgrade.pipeline as pipeline
    from app.ml.auto.candidates import split_for_validation
    from app.ml.geometry.space import EuclideanLift
    from app.ml.methods.training import NO_HOOKS
    from app.ml.upgrade.data import split_for_evaluation
    from app.ml.upgrade.run import run_backbone_upgrade

    real_pick = pipeline.pick

    def pick_contrastive(trials: Any, primary_of: Any) -> tuple[str, dict[str, int]]:
        return "contrastive", real_pick(trials, primary_of)[1]

    monkeypatch.setattr(pipeline, "pick", pick_contrastive)
    data = _fixture_data(wordnet_small)
    params = {"epochs": 3, "candidates": ["contrastive"], "trials": 2, "extra_trials": 0}
    events: list[dict[str, Any]] = []
    out = run_backbone_upgrade(
        "auto", data, EuclideanLift(), params=params, hooks=TrainingHooks(events.append)
    )
    (entry,) = [c for c in out.report["candidates"] if c["name"] == "contrastive"]
    assert entry["screen_epochs"] == 1 and [t["epochs"] for t in entry["trials"]] == [1, 1]
    finals = [t for t in entry["trials"] if "final" in t]
    assert len(finals) == 1 and finals[0]["final"]["epochs"] == 3
    assert entry["validation"] == finals[0]["final"]["validation"]
    assert entry["epochs_trained"] == 2 * 1 + 3
    assert len(out.report["history"]) == 3
    assert out.report["auto"]["validation_given"] is False
    # The same training, explicitly, at full length on the fit part.
    ctx = pipeline.UpgradeContext.build(data, EuclideanLift(), 0, NO_HOOKS)
    train_idx, _ = split_for_evaluation(len(data), 0.2, 0)
    split = split_for_validation(train_idx, 0)
    assert split is not None
    settings = {**finals[0]["settings"], "epochs": 3}
    again = ctx.train(
        "contrastive",
        CompatParams.from_dict(settings),
        split[0],
        np.zeros(0, dtype=np.int64),
        NO_HOOKS,
    )
    served, explicit = out.model.state_dict(), again.state_dict()
    assert served.keys() == explicit.keys()
    for key in served:
        assert np.array_equal(served[key].numpy(), explicit[key].numpy()), key
    # One whole-job share, rising to the end while the epochs restart with each training.
    shares = [e["job_fraction"] for e in events if e.get("job_fraction") is not None]
    assert shares == sorted(shares) and len(shares) > 4
    stages = {(e.get("candidate"), e.get("stage")) for e in events if e["phase"] == "training"}
    assert ("contrastive", "screening") in stages and ("contrastive", "final") in stages


def test_a_run_without_a_given_validation_carve_says_so() -> None:
    """``validation_given`` read the loop's last validation dict (never None), so it said True
    on every run (seen on the public nouns' default upgrade)."""
    from app.ml.geometry.space import EuclideanLift
    from app.ml.upgrade.run import UpgradeData, run_backbone_upgrade

    rng = np.random.default_rng(0)
    old = rng.normal(size=(200, 8)).astype(np.float32)
    new = np.concatenate([old, rng.normal(size=(200, 4))], axis=1).astype(np.float32)
    params = {"candidates": [], "trials": 1}
    out = run_backbone_upgrade("auto", UpgradeData(new, old), EuclideanLift(), params=params)
    assert out.report["auto"]["validation_given"] is False


def test_the_eta_follows_the_machine_when_its_speed_changes() -> None:
    """Other jobs share the cores: when epochs start taking half as long, the ETA follows within
    its window (``RECENT_SHARE`` of the elapsed time, at least ``RECENT_MIN_S``) instead of
    pricing the rest at the whole run's mean."""
    from app.ml.upgrade import progress as progress_module

    clock = Clock()
    events: list[dict[str, Any]] = []
    progress = Progress(TrainingHooks(progress=events.append), clock)
    hooks = progress.start_training(progress.add_training("a", 100), [])
    for epoch in range(1, 81):
        clock.now += 2.0 if epoch <= 50 else 1.0
        hooks.report(epoch, 100, 0.1)
    assert progress_module.RECENT_MIN_S == 30.0
    # 20 epochs left at 1 s: the whole run's mean (1.625 s) would say 32.5 s.
    assert events[-1]["eta_s"] == pytest.approx(20.0, rel=0.05)
    assert events[49]["eta_s"] == pytest.approx(100.0, rel=0.05)  # steady: 50 left at 2 s
    # The window reaches back 30 s: the last 30 fast epochs and the slow one ending at its edge,
    # priced at the mean of the epochs after the first (49 at 2 s, 30 at 1 s).
    assert progress.speed() == pytest.approx(32.0 / (31 * 128 / 79))


def test_a_small_host_runs_an_upgrade_on_one_intra_op_thread() -> None:
    import torch

    from app.ml.upgrade.run import default_threads, intra_op_threads

    assert default_threads(2) == 1 and default_threads(1) == 1
    assert default_threads(16) is None
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with intra_op_threads(None):
        assert torch.get_num_threads() == before


def test_an_upgrade_refuses_zero_threads() -> None:
    from app.ml.geometry.space import EuclideanLift
    from app.ml.upgrade.run import UpgradeData, run_backbone_upgrade

    rng = np.random.default_rng(0)
    old = rng.normal(size=(60, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="threads"):
        run_backbone_upgrade("procrustes", UpgradeData(old, old), EuclideanLift(), threads=0)
