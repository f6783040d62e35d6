"""Continual upgrades (HMCL and baselines): one task per job, each a new model version in a
lineage. A version's gallery stays searchable by every later version through the accumulated
rotation recorded per version; nothing in the gallery is re-embedded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.errors import invalid
from app.core.files import read_verified
from app.core.settings import Settings
from app.datasets.models import Dataset
from app.datasets.service import load_items
from app.jobs.models import UpgradeJob
from app.ml.hmcl import (
    METHODS as HMCL_METHODS,
)
from app.ml.hmcl import (
    ContinualParams,
    ContinualState,
    run_continual_task,
)
from app.ml.methods.training import TrainingHooks
from app.models.models import TrainedModel
from app.models.service import CONTINUAL, artifact_file, lineage
from app.upgrades.backbone import label_codes
from app.upgrades.trained import TrainedOutput

METHODS: tuple[str, ...] = tuple(HMCL_METHODS)
MIN_ITEMS = 2


def check_params(params: dict[str, Any]) -> None:
    try:
        ContinualParams.from_dict(params)
    except ValueError as exc:
        raise invalid("params", str(exc)) from exc


def validate(session: Session, base: TrainedModel | None, dataset: Dataset, params: dict) -> None:
    """Everything a continual job needs, checked before it is queued (422 naming the field)."""
    if dataset.gallery_id is not None:
        raise invalid("dataset_id", "continual upgrades take a dataset without a gallery")
    if len(dataset.modalities) < 2:
        raise invalid("dataset_id", "continual upgrades need paired rows of ≥ 2 modalities")
    if dataset.count < MIN_ITEMS:
        raise invalid("dataset_id", f"{dataset.count} items; at least {MIN_ITEMS} needed")
    check_params(params)
    if base is None:
        return
    if base.kind != CONTINUAL or base.state_path is None:
        raise invalid("base_model_id", f"model {base.id} is not a continual model version")
    if sorted(base.modalities) != sorted(dataset.modalities):
        raise invalid(
            "dataset_id",
            f"modalities {dataset.modalities} differ from the base model's {base.modalities}",
        )
    wrong = {m: d for m, d in dataset.dims.items() if int(base.input_dims[m]) != int(d)}
    if wrong:
        raise invalid("dataset_id", f"feature dims {wrong} differ from {base.input_dims}")


def _task_features(session: Session, dataset: Dataset) -> tuple[dict[str, np.ndarray], list]:
    _, arrays, labels = load_items(session, dataset)
    return {m: np.array(arrays[m]) for m in dataset.modalities}, labels


def _earlier_tasks(session: Session, base: TrainedModel) -> dict[str, dict[str, np.ndarray]]:
    """The paired features of every task in the base's lineage (the report's protected data)."""
    tasks: dict[str, dict[str, np.ndarray]] = {}
    for version in reversed(lineage(session, base)):
        job = session.get(UpgradeJob, version.upgrade_id) if version.upgrade_id else None
        dataset = session.get(Dataset, job.dataset_id) if job and job.dataset_id else None
        if dataset is not None:
            tasks[f"{dataset.name} ({version.id})"] = _task_features(session, dataset)[0]
    return tasks


@dataclass
class ContinualInputs:
    dataset_name: str
    features: dict[str, np.ndarray]
    labels: np.ndarray | None
    base_id: str | None = None
    root_id: str | None = None
    depth: int = 0
    base_state: ContinualState | None = None
    eval_tasks: dict[str, dict[str, np.ndarray]] | None = None


def load_inputs(session: Session, settings: Settings, job: UpgradeJob) -> ContinualInputs:
    """Read everything the task needs, so training holds no database session."""
    dataset = session.get(Dataset, job.dataset_id) if job.dataset_id else None
    if dataset is None:
        raise ValueError("the dataset of this upgrade was deleted")
    features, labels = _task_features(session, dataset)
    inputs = ContinualInputs(dataset.name, features, label_codes(labels))
    if job.base_model_id is None:
        return inputs
    base = session.get(TrainedModel, job.base_model_id)
    if base is None:
        raise ValueError("the base model of this upgrade was deleted")
    blob = read_verified(artifact_file(settings, base.state_path), base.state_sha256)
    inputs.base_state = ContinualState.from_bytes(blob)
    inputs.base_id, inputs.root_id, inputs.depth = base.id, base.root_id, base.depth + 1
    inputs.eval_tasks = _earlier_tasks(session, base)
    return inputs


def train(job: UpgradeJob, inputs: ContinualInputs, hooks: TrainingHooks) -> TrainedOutput:
    result = run_continual_task(
        job.method,
        inputs.base_state,
        inputs.features,
        inputs.labels,
        params=job.params,
        seed=job.seed,
        hooks=hooks,
        eval_tasks=inputs.eval_tasks,
    )
    return TrainedOutput(
        model=result.model,
        report={"dataset": inputs.dataset_name, **result.report},
        params=dict(result.report.get("params") or {}),
        kind=CONTINUAL,
        parent_id=inputs.base_id,
        root_id=inputs.root_id,
        depth=inputs.depth,
        rotation=np.asarray(result.rotation, dtype=np.float64),
        state=result.state.to_bytes(),
    )
