"""A job's estimated optimiser steps (``app.upgrades.cost``) for ``auto``: its trials priced as
``app.ml.upgrade.tuning`` trains them, short screening runs and one full run per candidate under
successive halving (issue 42: the estimate priced every trial at full length)."""

from __future__ import annotations

from app.ml.auto import halving
from app.ml.auto.candidates import METHOD_OF, AutoParams
from app.ml.methods.compat import CompatParams
from app.upgrades.cost import REFERENCE, estimated_steps, training_steps

ITEMS = 12_000


def by_hand(halving_on: bool) -> int:
    """The budget rule (``halving.budget_epochs``) times each candidate's steps per epoch."""
    auto = AutoParams.from_dict({"halving": halving_on})
    total = training_steps(REFERENCE, CompatParams.from_dict(auto.shared), ITEMS)
    for name in auto.applicable(labelled=True):
        trials = auto.settings(name, labelled=True)
        count = len(trials) + auto.extra_for(name, labelled=True)
        params = CompatParams.from_dict(trials[0])
        per_epoch = training_steps(
            METHOD_OF[name], CompatParams.from_dict({**trials[0], "epochs": 1}), ITEMS
        )
        screen = halving.screen_epochs(params.epochs, count, halving_on)
        total += halving.budget_epochs(params.epochs, count, screen) * per_epoch
    return total


def test_auto_is_priced_by_the_halving_budget() -> None:
    halved = estimated_steps("auto", {}, ITEMS, 0.0)
    full = estimated_steps("auto", {"halving": False}, ITEMS, 0.0)
    assert halved == by_hand(True)
    assert full == by_hand(False)
    # The defaults: 3 grid and 2 extra trials of 15 epochs, screened at 5: 40 epochs, not 75.
    assert halved < full
