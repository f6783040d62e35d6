"""What every trainer shares: progress reporting and cooperative cancellation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class TrainingCancelled(Exception):
    """Raised between steps when the caller asked the trainer to stop."""


@dataclass
class TrainingHooks:
    """``progress`` receives ``{"epoch", "epochs", "loss", ...}`` after each epoch; ``should_stop``
    is polled before every optimiser step (the service reads a cancel flag from its database
    there, at most once a second, and checks the job's time limit)."""

    progress: Callable[[dict[str, Any]], None] | None = None
    should_stop: Callable[[], bool] | None = None

    def report(self, epoch: int, epochs: int, loss: float, **extra: Any) -> None:
        if self.progress is not None:
            self.progress({"epoch": epoch, "epochs": epochs, "loss": float(loss), **extra})

    def check(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise TrainingCancelled("cancelled")


NO_HOOKS = TrainingHooks()
