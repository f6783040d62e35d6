"""HTTP shapes of upgrade jobs."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.core.schemas import Page, StrictModel


class UpgradeCreate(StrictModel):
    dataset_id: str = Field(min_length=1, max_length=40)
    method: str = Field(
        default="auto",
        min_length=1,
        max_length=32,
        description=(
            "see GET /v1/upgrades/methods; `auto` (backbone upgrades) trains the candidates and "
            "serves the best on validation for the objective"
        ),
    )
    objective: Literal["query", "class", "instance"] | None = Field(
        default=None,
        description=(
            "backbone upgrades: what the model must be good at. `query`: logged queries find "
            "their relevant items; `class`: same-label neighbours; `instance`: each item's own "
            "old vector. Default: `query` when queries carry relevance, else `class` with "
            "labels, else `instance`"
        ),
    )
    old_model_available: bool = Field(
        default=True,
        description=(
            "backbone upgrades: whether the old model can still embed queries. False removes "
            "`stay` and `transition` (both need the old model's query vectors) from the verdict"
        ),
    )
    gallery_id: str | None = Field(
        default=None, min_length=1, max_length=40, description="backbone upgrades: the old gallery"
    )
    base_model_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=40,
        description="continual upgrades: the version to continue from (absent for the first task)",
    )
    params: dict[str, Any] | None = Field(default=None, description="trainer parameters")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    eval_fraction: float = Field(
        default=0.2, gt=0, lt=1, description="share of the dataset held out for the report"
    )


class UpgradeOut(BaseModel):
    id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    method: str
    dataset_id: str | None
    gallery_id: str | None
    base_model_id: str | None
    params: dict[str, Any]
    seed: int
    eval_fraction: float
    progress: dict[str, Any] = Field(description="epoch, epochs, loss, … (latest report)")
    phase: str | None = Field(
        default=None,
        description="what the job is doing now, as the trainer last reported it (training a "
        "candidate, evaluating, storing); `done` once it succeeded; null before the first report "
        "and after a failure or cancellation",
    )
    eta_s: float | None = Field(
        default=None,
        description="the trainer's estimate of the seconds left; null when it has none",
    )
    candidate: str | None = Field(
        default=None,
        description="the method being trained when a job tries several (`auto`); else null",
    )
    model_id: str | None
    report: dict[str, Any] | None
    error: str | None
    attempts: int
    cancel_requested: bool
    heartbeat_at: datetime | None = Field(
        default=None, description="the worker's last sign of life while the job runs"
    )
    stale: bool = Field(
        default=False,
        description="running, but no heartbeat for NOBACKFILL_JOB_STALE_AFTER_S: the worker is "
        "probably gone; the sweeper re-queues the job (or fails it after its last attempt)",
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @model_validator(mode="before")
    @classmethod
    def _from_progress(cls, data: Any) -> Any:
        """``phase``, ``eta_s`` and ``candidate`` are read from ``progress``, where the trainer
        reports them; a value of the wrong shape reads as absent rather than failing the read."""
        if not isinstance(data, dict):
            return data
        progress = data.get("progress") or {}
        status = data.get("status")
        if status in ("succeeded", "failed", "cancelled"):
            # A finished job's last progress event is history: no phase or ETA is in flight.
            done = {"phase": "done" if status == "succeeded" else None, "eta_s": None}
            return {**done, "candidate": None, **data}
        eta = progress.get("eta_s")
        finite = isinstance(eta, int | float) and not isinstance(eta, bool) and math.isfinite(eta)
        derived = {
            "phase": progress.get("phase") if isinstance(progress.get("phase"), str) else None,
            "eta_s": max(float(eta), 0.0) if finite else None,
            "candidate": (
                progress.get("candidate") if isinstance(progress.get("candidate"), str) else None
            ),
        }
        return {**derived, **data}


class UpgradeList(Page):
    items: list[UpgradeOut]


class MethodParam(BaseModel):
    """One trainer parameter, as the trainer's own validation accepts it."""

    name: str
    type: Literal["integer", "number", "boolean", "string", "array", "object"]
    nullable: bool = Field(description="null is accepted (the trainer then picks the value)")
    default: Any = Field(description="the value used when `params` omits this name")
    minimum: int | float | None = Field(default=None, description="smallest accepted value")
    exclusive_minimum: int | float | None = Field(
        default=None, description="values must be greater than this"
    )
    maximum: int | float | None = Field(default=None, description="largest accepted value")
    exclusive_maximum: int | float | None = Field(
        default=None, description="values must be smaller than this"
    )
    choices: list[str] | None = Field(default=None, description="the accepted strings")


class MethodOut(BaseModel):
    name: str = Field(description="the `method` of POST /v1/upgrades")
    kind: Literal["backbone", "continual"] = Field(
        description="backbone: a new model for an old gallery (`gallery_id`); continual: the "
        "next version of a model lineage (`base_model_id`)"
    )
    description: str
    needs_labels: bool = Field(description="refused unless the dataset or gallery has labels")
    params: list[MethodParam] = Field(description="what `params` of POST /v1/upgrades accepts")


class MethodsOut(BaseModel):
    backbone: list[str] = Field(description="names of the backbone methods")
    continual: list[str] = Field(description="names of the continual methods")
    methods: list[MethodOut]
