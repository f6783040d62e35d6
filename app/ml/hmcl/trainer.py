"""One task of continual training (HMCL's CA / MR, fine-tuning, EWC): the loss, the optimizer
steps with the admissible correction and anchoring, the recorded rotation and the report."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from app.ml.geometry.lorentz import entailment_violation, pairwise_lorentz_distance
from app.ml.hmcl.geometry import (
    ProtectedGeometry,
    SkewGenerator,
    anchor_to_task_start,
    closest_admissible_correction,
    minimal_rotation_correction,
    protected_geometry,
)
from app.ml.hmcl.metrics import (
    class_accuracy,
    class_pairing,
    drift_measures,
    paired_recall_at_k,
    symmetric_recall_at_k,
)
from app.ml.hmcl.model import ContinualResult, ContinualState, LorentzLinearHeads
from app.ml.hmcl.params import DEFAULT_ROTATION, METHODS, ContinualParams
from app.ml.hmcl.report_warnings import report_warnings
from app.ml.hmcl.rotations import OutputMoments, map_query_to_ancestor
from app.ml.methods.training import NO_HOOKS, TrainingHooks

# The report's own-task recall uses at most this many pairs (its cost grows with the square).
OWN_RECALL_ROWS = 2000


def contrastive_entailment_loss(
    embeddings: Mapping[str, Tensor],
    curv: float,
    temperature: float,
    entailment_weight: float,
    apex: str,
    labels: Tensor | None = None,
) -> Tensor:
    """Symmetric InfoNCE on −d_L/τ between every pair of modalities (rows paired), averaged over
    pairs, plus ``entailment_weight`` × mean max(0, ext(apex, x) − aper(apex)) for the other
    modalities x (the apex modality's embedding is the cone's apex). With ``labels``, other rows
    of the same label are not used as negatives."""
    names = list(embeddings)
    n = next(iter(embeddings.values())).shape[0]
    target = torch.arange(n)
    same_label = None
    if labels is not None:
        same_label = (labels[:, None] == labels[None, :]) & ~torch.eye(n, dtype=torch.bool)
    contrastive = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            logits = -pairwise_lorentz_distance(embeddings[a], embeddings[b], curv) / temperature
            if same_label is not None:
                logits = logits.masked_fill(same_label, float("-inf"))
            contrastive.append(
                0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
            )
    loss = torch.stack(contrastive).mean()
    if entailment_weight > 0:
        entail = [
            entailment_violation(embeddings[apex], embeddings[m], curv).mean()
            for m in names
            if m != apex
        ]
        loss = loss + entailment_weight * torch.stack(entail).mean()
    return loss


def _validate_task(
    task_features: Mapping[str, np.ndarray], labels: np.ndarray | None
) -> tuple[dict[str, Tensor], Tensor | None]:
    if not isinstance(task_features, Mapping) or len(task_features) < 2:
        raise ValueError("task_features must map at least two modality names to feature arrays")
    tensors: dict[str, Tensor] = {}
    rows = None
    for name, feats in task_features.items():
        arr = np.asarray(feats)
        if arr.ndim != 2 or arr.shape[1] < 1:
            raise ValueError(f"modality {name!r}: features must be a 2-D array (rows × dims)")
        if not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)):
            raise ValueError(f"modality {name!r}: features must be finite numbers")
        if rows is not None and arr.shape[0] != rows:
            raise ValueError("every modality must have the same number of (paired) rows")
        rows = arr.shape[0]
        tensors[name] = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    if rows is None or rows < 2:
        raise ValueError("a task needs at least two paired rows")
    label_tensor = None
    if labels is not None:
        lab = np.asarray(labels)
        if lab.shape != (rows,):
            raise ValueError(f"labels must be a 1-D array of {rows} entries")
        label_tensor = torch.from_numpy(np.unique(lab, return_inverse=True)[1].reshape(-1))
    return tensors, label_tensor


def _new_state(
    features: Mapping[str, Tensor], params: ContinualParams, seed: int
) -> ContinualState:
    input_dims = {name: int(x.shape[1]) for name, x in features.items()}
    dim = params.dim if params.dim is not None else next(iter(input_dims.values()))
    model = LorentzLinearHeads(input_dims, dim, params.curv, params.lift_scale)
    model.init_identity(seed)
    return ContinualState(
        config=model.get_config(),
        heads={k: v.detach().clone() for k, v in model.heads.items()},
        second_moments={
            k: torch.zeros(d + 1, d + 1, dtype=torch.float64) for k, d in input_dims.items()
        },
    )


def _check_compatible(
    state: ContinualState, features: Mapping[str, Tensor], raw_params: Mapping[str, Any]
) -> None:
    dims = state.config["input_dims"]
    if set(features) != set(dims):
        raise ValueError(
            f"task modalities {sorted(features)} differ from the model's {sorted(dims)}"
        )
    for name, x in features.items():
        if x.shape[1] != dims[name]:
            raise ValueError(
                f"modality {name!r}: {x.shape[1]} features, the model takes {dims[name]}"
            )
    for key in ("curv", "lift_scale", "dim"):
        if raw_params.get(key) is not None and raw_params[key] != state.config[key]:
            raise ValueError(f"{key} is fixed at the first task ({state.config[key]})")


class TaskTrainer:
    """One task of continual training, one pass over the task per ``epoch()``.

    Each mini-batch: its loss (plus EWC's penalty), one AdamW step, then — for HMCL with
    protected data — the admissible correction of the realized displacement; the anchoring once
    per epoch. AdamW's moments are never touched by the correction.
    """

    def __init__(
        self,
        method: str,
        state: ContinualState | None,
        task_features: Mapping[str, np.ndarray],
        labels: np.ndarray | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {list(METHODS)}")
        self.method = method
        self.params = ContinualParams.from_dict(params)
        self.features, self.labels = _validate_task(task_features, labels)
        if state is None:
            state = _new_state(self.features, self.params, seed)
        else:
            _check_compatible(state, self.features, dict(params or {}))
            # Same order as the model's modalities, whatever order the caller used.
            self.features = {m: self.features[m] for m in state.config["input_dims"]}
        self.parent = state
        apex = self.params.apex_modality or next(iter(self.features))
        if apex not in self.features:
            raise ValueError(f"apex_modality {apex!r} is not one of {list(self.features)}")
        self.apex = apex
        self.rotation_fit = self.params.rotation or DEFAULT_ROTATION[method]
        self.model = state.model()
        self.model.train()
        self.curv = self.model.curv
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.params.lr, weight_decay=self.params.weight_decay
        )
        self.task_start = {k: v.detach().clone() for k, v in self.model.heads.items()}
        self.has_old_data = state.row_count > 0
        self.geometry: ProtectedGeometry | None = None
        self.generator_sum: SkewGenerator | None = None
        if method in ("hmcl-ca", "hmcl-mr") and self.has_old_data:
            geometry = protected_geometry(
                state.second_moments,
                self.task_start,
                self.params.energy,
                self.params.min_rank,
                residual_weight=self.params.residual_weight if method == "hmcl-ca" else 0.0,
            )
            # Derived in float64; applied in the weights' float32: the correction's rounding
            # (≈1e-7 relative) is far below the AdamW step it corrects.
            self.geometry = geometry.to(torch.float32)
            # Σ Ω over the steps, scaled by (1 − β) at each anchoring: the first-order rotation
            # since the task's start.
            self.generator_sum = SkewGenerator.zeros(geometry.h_vectors)
        self.ewc_active = method == "ewc" and bool(state.fisher) and self.params.ewc_lambda > 0
        self.rows = next(iter(self.features.values())).shape[0]
        self.batches_per_epoch = max(1, math.ceil(self.rows / self.params.batch_size))
        # Small data gets more epochs rather than fewer steps: a task of 200 pairs trained for
        # 20 one-batch epochs stays near chance (20 AdamW steps of 5e-4 barely move a head).
        self.planned_epochs = max(
            self.params.epochs, math.ceil(self.params.min_steps / self.batches_per_epoch)
        )
        self.steps_done = 0
        self.epochs_done = 0
        self.correction_seconds = 0.0
        self.losses: list[float] = []

    def _batches(self) -> list[Tensor]:
        perm = torch.randperm(self.rows, generator=self.generator)
        # Near-equal batches: a tiny last batch would make an easy, noisy InfoNCE term.
        return list(torch.tensor_split(perm, self.batches_per_epoch))

    def task_loss(self, rows: Tensor) -> Tensor:
        emb = {m: self.model(x[rows], m) for m, x in self.features.items()}
        labels = self.labels[rows] if self.labels is not None else None
        return contrastive_entailment_loss(
            emb,
            self.curv,
            self.params.temperature,
            self.params.entailment_weight,
            self.apex,
            labels,
        )

    def ewc_penalty(self) -> Tensor:
        """(λ/2) Σ F ⊙ (W − W_parent)² over all heads."""
        total = torch.zeros(())
        for name, weight in self.model.heads.items():
            diff = weight - self.task_start[name]
            total = total + (self.parent.fisher[name] * diff * diff).sum()
        return 0.5 * self.params.ewc_lambda * total

    def train_step(self, rows: Tensor) -> float:
        """One optimizer step on one mini-batch: AdamW, then (HMCL with protected data) the
        admissible correction of the realized displacement; the batch loss."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.task_loss(rows)
        if self.ewc_active:
            loss = loss + self.ewc_penalty()
        loss.backward()
        if self.geometry is None:
            self.optimizer.step()
        else:
            before = {k: v.detach().clone() for k, v in self.model.heads.items()}
            self.optimizer.step()
            tic = time.perf_counter()
            self._correct(before)
            self.correction_seconds += time.perf_counter() - tic
        self.steps_done += 1
        return float(loss.detach())

    def epoch(self) -> float:
        """One pass over the task in mini-batches, then (HMCL with protected data) the anchoring
        W ← βW_task_start + (1 − β)W; the epoch's mean loss.

        Anchoring once per epoch, not per optimizer step, keeps the paper's bound with the epoch
        as the unit: ‖W − W_task_start‖ ≤ (1 − β)u/β for epochs that move W by at most u. Per
        mini-batch it would cap the whole task at ≈ (1 − β)/β optimizer steps of movement.
        """
        batches = self._batches()
        total = sum(self.train_step(rows) * len(rows) for rows in batches) / self.rows
        if self.geometry is not None:
            self._anchor()
        self.epochs_done += 1
        self.losses.append(total)
        return total

    @torch.no_grad()
    def _correct(self, before: Mapping[str, Tensor]) -> None:
        assert self.geometry is not None and self.generator_sum is not None
        deltas = {k: self.model.heads[k].detach() - before[k] for k in before}
        if self.method == "hmcl-ca":
            corrected, omega = closest_admissible_correction(deltas, self.geometry)
            assert isinstance(omega, SkewGenerator)
            outer = None if omega.outer is None else omega.outer.double()
            omega64 = SkewGenerator(self.generator_sum.basis, omega.inner.double(), outer)
            self.generator_sum = self.generator_sum.scaled_sum(omega64, 1.0)
        else:
            corrected = minimal_rotation_correction(deltas, self.geometry.bases)
        for name, weight in self.model.heads.items():
            weight.copy_(before[name] + corrected[name])

    @torch.no_grad()
    def _anchor(self) -> None:
        beta = self.params.anchor
        for name, weight in self.model.heads.items():
            weight.copy_(anchor_to_task_start(weight, self.task_start[name], beta))
        if self.generator_sum is not None:
            # The anchored sum of Ω: the first-order rotation since the task's start.
            self.generator_sum = self.generator_sum.scaled_sum(
                SkewGenerator.zeros(self.generator_sum.basis), 1.0 - beta
            )

    def fisher_diagonal(self) -> dict[str, Tensor]:
        """Empirical diagonal Fisher of this task at the current weights: mean over batches of
        the squared batch gradient, normalised to mean 1 over all heads (so λ is scale-free)."""
        grads = {k: torch.zeros_like(v) for k, v in self.model.heads.items()}
        n = next(iter(self.features.values())).shape[0]
        perm = torch.randperm(n, generator=self.generator)
        chunks = list(torch.tensor_split(perm, max(1, n // self.params.fisher_batch_size)))
        for rows in chunks:
            self.model.zero_grad(set_to_none=True)
            self.task_loss(rows).backward()
            for k, v in self.model.heads.items():
                grads[k] += v.grad.detach() ** 2 / len(chunks)
        self.model.zero_grad(set_to_none=True)
        mean = torch.cat([g.flatten() for g in grads.values()]).mean()
        # A zero gradient everywhere (a converged toy task) carries no importance at all.
        scale = 1.0 / float(mean) if float(mean) > 0 else 0.0
        return {k: g * scale for k, g in grads.items()}

    def finish(
        self, eval_tasks: Mapping[str, Mapping[str, np.ndarray]] | None = None
    ) -> ContinualResult:
        """Fold this task into the state, record the rotation since the parent, write the report."""
        self.model.eval()
        new_heads = {k: v.detach().clone() for k, v in self.model.heads.items()}
        old_moments = self.parent.second_moments
        candidates: dict[str, Tensor] = {
            "identity": torch.eye(self.model.dim, dtype=torch.float64),
            "generator": torch.eye(self.model.dim, dtype=torch.float64)
            if self.generator_sum is None
            else torch.linalg.matrix_exp(self.generator_sum.dense()),
        }
        residuals: dict[str, float] = {}
        rotation = candidates["identity"]
        if self.has_old_data:
            outputs = OutputMoments.of(self.task_start, new_heads, old_moments)
            candidates["procrustes"] = outputs.procrustes()
            rotation = candidates[self.rotation_fit]
            residuals = {k: outputs.relative_residual(r) for k, r in candidates.items()}
        fisher = dict(self.parent.fisher)
        task_fisher = self.fisher_diagonal()
        for k, v in task_fisher.items():
            fisher[k] = fisher[k] + v if k in fisher else v
        moments = {}
        with torch.no_grad():
            for name, x in self.features.items():
                z = self.model.lifted(x.double(), name)
                moments[name] = old_moments[name] + z.T @ z
        rows = next(iter(self.features.values())).shape[0]
        state = ContinualState(
            config=dict(self.parent.config),
            heads=new_heads,
            second_moments=moments,
            row_count=self.parent.row_count + rows,
            fisher=fisher,
            tasks_seen=self.parent.tasks_seen + 1,
        )
        report = self._report(residuals, eval_tasks, rotation)
        return ContinualResult(state.model(), state, rotation.numpy().copy(), report)

    def _report(
        self,
        residuals: Mapping[str, float],
        eval_tasks: Mapping[str, Mapping[str, np.ndarray]] | None,
        rotation: Tensor,
    ) -> dict[str, Any]:
        params = asdict(self.params)
        params["rotation"] = self.rotation_fit
        params["apex_modality"] = self.apex
        report: dict[str, Any] = {
            "method": self.method,
            "task_index": self.parent.tasks_seen + 1,
            "rows": int(next(iter(self.features.values())).shape[0]),
            "old_rows": int(self.parent.row_count),
            "params": params,
            "epochs": self.epochs_done,
            "steps": self.steps_done,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "correction_seconds": self.correction_seconds,
            # sqrt(Σ‖y_new − R y_parent‖² / Σ‖y_parent‖²) over every old row, exact from moments.
            "old_rows_relative_residual": residuals or None,
        }
        if self.geometry is not None:
            report["protected"] = {
                m: {"rank": int(self.geometry.bases[m].shape[1]), "energy": e}
                for m, e in self.geometry.captured_energy.items()
            }
        if eval_tasks:
            report["eval_tasks"] = self._evaluate_old_tasks(eval_tasks, rotation)
        task_recall, recall_rows = self._own_recall()
        report["task_recall_at_5"] = task_recall
        report["task_class_accuracy"] = self._own_class_accuracy()
        report["warnings"] = report_warnings(report, task_recall, recall_rows)
        return report

    @torch.no_grad()
    def _own_recall(self) -> tuple[float, int]:
        """Symmetric recall@5 on (up to ``OWN_RECALL_ROWS`` of) the task's own pairs."""
        perm = torch.randperm(self.rows, generator=torch.Generator().manual_seed(self.seed))
        rows = perm[:OWN_RECALL_ROWS]
        emb = {m: self.model.embed(x[rows], m) for m, x in self.features.items()}
        return symmetric_recall_at_k(emb, self.curv), len(rows)

    @torch.no_grad()
    def _own_class_accuracy(self) -> dict[str, Any] | None:
        """For a classification-style task (``class_pairing``): the accuracy of every row's
        nearest class text among the task's classes, with the class and row counts."""
        pairing = class_pairing(self.features)
        if pairing is None:
            return None
        emb = {m: self.model.embed(x, m) for m, x in self.features.items()}
        return {
            "accuracy": class_accuracy(emb, pairing, self.curv),
            "classes": pairing.classes,
            "rows": self.rows,
            "class_modality": pairing.class_modality,
        }

    def validate_eval_tasks(
        self, eval_tasks: Mapping[str, Mapping[str, np.ndarray]]
    ) -> dict[str, dict[str, Tensor]]:
        """Earlier tasks' paired features as tensors; ValueError unless they fit the model."""
        out = {}
        for task_name, feats in eval_tasks.items():
            try:
                tensors, _ = _validate_task(feats, None)
            except ValueError as exc:
                raise ValueError(f"eval task {task_name!r}: {exc}") from exc
            if set(tensors) != set(self.features):
                raise ValueError(
                    f"eval task {task_name!r}: modalities {sorted(tensors)}, "
                    f"expected {sorted(self.features)}"
                )
            for name, x in tensors.items():
                if x.shape[1] != self.model.input_dims[name]:
                    raise ValueError(f"eval task {task_name!r}: wrong width for {name!r}")
            out[task_name] = tensors
        return out

    def _evaluate_old_tasks(
        self, eval_tasks: Mapping[str, Mapping[str, np.ndarray]], rotation: Tensor
    ) -> dict[str, Any]:
        parent_model = self.parent.model()
        rot = rotation.numpy()
        out: dict[str, Any] = {}
        for task_name, tensors in self.validate_eval_tasks(eval_tasks).items():
            before = {m: parent_model.embed(tensors[m], m) for m in self.features}
            after = {m: self.model.embed(tensors[m], m) for m in self.features}
            names = list(self.features)
            query, gallery = names[0], names[1]
            r_parent = symmetric_recall_at_k(before, self.curv)
            r_new = symmetric_recall_at_k(after, self.curv)
            compensated = map_query_to_ancestor(after[query], [rot])
            out[task_name] = {
                "rows": int(next(iter(tensors.values())).shape[0]),
                "recall_at_5_parent": r_parent,
                "recall_at_5_new": r_new,
                "retention": r_new / r_parent if r_parent > 0 else None,
                # New queries against the parent's gallery, through the recorded rotation.
                "no_backfill_recall_at_5": paired_recall_at_k(
                    compensated, before[gallery], self.curv
                ),
                "drift": drift_measures(before, after, self.curv),
            }
            pairing = class_pairing(tensors)
            if pairing is not None:  # classification-style: class accuracy before and after
                out[task_name].update(
                    classes=pairing.classes,
                    class_accuracy_parent=class_accuracy(before, pairing, self.curv),
                    class_accuracy_new=class_accuracy(after, pairing, self.curv),
                )
        return out


def run_continual_task(
    method: str,
    base_state: ContinualState | None,
    task_features: Mapping[str, np.ndarray],
    labels: np.ndarray | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    hooks: TrainingHooks = NO_HOOKS,
    eval_tasks: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> ContinualResult:
    """Train one continual task from ``base_state`` (None: a fresh model) and return the version.

    ``task_features[m]`` is an N×D_m array per modality, rows paired across modalities;
    ``labels`` (optional, length N) keeps same-label rows from being each other's negatives.
    ``eval_tasks`` (optional) maps names of earlier tasks to their paired features: the report
    then holds retention, no-backfill recall and the four drift measures on them (the state keeps
    no raw rows, so only the caller can supply them). ``hooks.check()`` is polled before every
    step and ``hooks.report(epoch, epochs, loss)`` called after it. Unknown methods and bad
    parameters raise ``ValueError``.
    """
    trainer = TaskTrainer(method, base_state, task_features, labels, params=params, seed=seed)
    if eval_tasks:
        trainer.validate_eval_tasks(eval_tasks)  # fail before training, not after
    epochs = trainer.planned_epochs
    for epoch in range(epochs):
        hooks.check()
        loss = trainer.epoch()
        hooks.report(epoch + 1, epochs, loss)
    hooks.check()
    return trainer.finish(eval_tasks)
