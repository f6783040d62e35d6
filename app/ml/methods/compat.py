"""Training a compatible new model against a fixed old embedding space (HBCT and the baselines).

``train_compatible_model(method, new_features, old_points, labels, curv, params, seed, hooks)``
returns an ``EmbeddingModel`` whose outputs live in the old space's Lorentz frame, so new queries
search the stored old gallery directly. The old side is given as points in that frame: an external
gallery lifted by its ``EuclideanLift``, or the outputs of an old head trained here.

Methods (all share the head, optimiser, schedule, data and L_base; only the compatibility terms
differ):
- ``independent``: L_base only — the reference "new model without compatibility" (P_com, P_up).
- ``hbct``: L_base + λ·(L_entail + L_align) (+ ``old_proto_weight``·CE to the lifted old class
  means, our measured extension; 0 gives the paper's loss); ``hbct-noentail`` drops L_entail.
- ``l2``, ``bct`` (influence loss through the old classifier = old class means), ``contrastive``
  (Hot-Refresh n→o and n→n negatives): Euclidean terms on tangent vectors log₀(h).
- ``procrustes`` (closed form), ``affine`` (low rank 64) and ``mlp-adapter`` (residual, 256
  hidden): query-side adapters fitted to the old tangent vectors.
- ``instance-map``: a full linear map started at the Procrustes solution and trained with
  instance InfoNCE on tangent directions (each item's own old vector the positive, the batch's
  other old vectors the negatives). It also trains on ``extra_pairs``: logged queries embedded by
  both models, the lever measured to help instance search most (docs/algorithms.md §6).
- ``class-map`` (labels): ``instance-map``'s map and instance term plus ``class_weight`` × two
  class terms: BCT's influence loss (cosine logits toward the old space's class means) and
  L_base's prototype cross-entropy in the map's own space. The instance term keeps each item's
  own old vector first; the class terms move a query toward where its class's old items gather
  (new→old class retrieval) and keep its own space's classes apart (P_up). Measured on the
  ``external`` validation split: the class gain of ``hbct`` without its instance collapse.
  ``map_hidden`` > 0 makes either map non-linear: the fixed Procrustes map plus a residual MLP;
  ``map_experts`` > 0 makes it class-conditional: the fixed Procrustes map plus low-rank experts
  gated by the item's class group (``class_conditional``). ``extra_dims`` > 0 (BT²-style,
  Zhou et al. 2023) gives L_base's prototype term that many extra dimensions, kept out of the
  old space: the compatible part is served, the extra part only relieves it during training.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from app.ml.geometry.lorentz import exp_map0, log_map0
from app.ml.methods import losses
from app.ml.methods.class_conditional import fit_class_conditional_map
from app.ml.methods.heads import (
    AdapterHead,
    LorentzHead,
    _TangentHead,
    centred_orthogonal_procrustes,
    orthogonal_procrustes,
)
from app.ml.methods.models import EmbeddingModel
from app.ml.methods.training import NO_HOOKS, TrainingHooks
from app.ml.methods.uncertainty import UNCERTAINTY_SOURCES, old_uncertainty

HYPERBOLIC_METHODS = ("hbct", "hbct-noentail")
EUCLIDEAN_METHODS = ("l2", "bct", "contrastive")
ADAPTER_METHODS = ("procrustes", "affine", "mlp-adapter", "instance-map", "class-map")
# Methods that learn from extra (query features, old point) pairs beyond the paired items.
PAIR_METHODS = ("instance-map", "class-map")
BACKBONE_METHODS: tuple[str, ...] = (
    "hbct",
    "hbct-noentail",
    "independent",
    *EUCLIDEAN_METHODS,
    *ADAPTER_METHODS,
)
LABELLED_ONLY_METHODS = ("bct", "class-map")


# Served defaults of an explicitly requested method, over CompatParams' own (issue 26: a served
# model must not silently lose to the old model; issue 42: compared with old→old itself). Chosen
# by ``bench.quality.served_defaults`` on the validation carves of the recorded per-seed compat
# runs (5 scenarios × 3 seeds, ``bench/results/served_defaults.json``): the setting that beats
# old→old on class CMC@1 *and* keeps the instance floor (own-item R@1 ≥ 0.95 × procrustes's) on
# the most carves (the counts: BENCHMARKS' served-defaults section). hbct: the paper's loss
# (prototype weight 0), above old→old on all carves but one and short of the floor on external
# (weight 10 was served before, read off new→old ÷ *reindex*, and keeps the floor on a third of
# the carves); l2: weight 10; procrustes: centred (issue 42 item 2) — both fits pass the same
# external carves, centred with the larger mean class gain (the rule's tie-break; both lose to
# old→old on every head scenario). Rechosen on the runs under the frozen held-back draw (issue
# 42 item 3): the same three. ``tests/test_method_defaults`` applies the rule to the results
# file. ``auto`` tunes its own grids and does not use these: its procrustes candidate (the
# instance floor) and the procrustes reference trained beside other methods stay uncentred.
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "hbct": {"base_temperature": 0.1, "old_proto_weight": 0.0},
    "l2": {"base_temperature": 0.1, "compat_weight": 10.0},
    "procrustes": {"centred": True},
}
# Settings only these methods read: a request for any other method that sets one (away from its
# default) is refused rather than silently ignored. The map's and the adapters' own structure;
# generic settings (epochs, lr, hidden_dim, …) stay shared, as auto's overrides are.
METHOD_ONLY_PARAMS: dict[str, tuple[str, ...]] = {
    "map_hidden": PAIR_METHODS,
    "map_experts": PAIR_METHODS,
    "map_expert_rank": PAIR_METHODS,
    "extra_dims": ("class-map",),
    "adapter_rank": ("affine",),
    "adapter_hidden": ("mlp-adapter",),
    "centred": ("procrustes",),
}


@dataclass
class CompatParams:
    """Hyper-parameters. Where each served default comes from (validation splits only):

    - ``epochs`` 15, ``hidden_dim`` 0 (a linear head), ``base_temperature`` 0.05,
      ``old_proto_temperature`` 0.05, ``compat_weight`` 1.0: what the earlier ``bench.quality.compat``
      protocol (commit 7acf9f5, five scenarios, a 2×2 base grid) chose on its validation split
      for the ``external`` scenario; the previous 40 / 1024 / 0.1 had never been measured. The
      fixed-split protocol (3 trials per method, ``bench/results/compat-fixed-split.json``, "selection") chose
      ``base_temperature`` 0.1 from (0.02, 0.1, 0.5) for the independent head; 0.05 was not among
      its trials, so the default is kept and ``auto`` re-tunes per upgrade.
    - ``old_proto_weight`` 0.0 (the paper's loss): the prototype term collapses instances within
      a class (own-item R@1 0.61 vs Procrustes 0.97, docs/algorithms.md §5); ``auto`` tunes it per
      upgrade over (0, 1, 3) under an own-item floor, and ``bench.quality.querydoc`` records the
      validation figures of each value (``bench/results/querydoc.json``, "candidates"). An
      explicit ``hbct`` (and ``l2``) request starts from ``METHOD_DEFAULTS`` instead.
    - ``class_weight`` 0.3: the first of ``auto``'s trials (0.3 / 1.0 / 3.0), which re-tunes it per
      upgrade under the instance floor; on ``bench.quality.compat``'s external scenario auto chose 1.0 on
      every seed (``bench/results/compat-fixed-split.json``, "auto").
    - ``instance_temperature`` 0.05: best on the lemma → gloss validation split with a query log
      (R@10 0.476 / 0.523 / 0.522 at τ 0.02 / 0.05 / 0.1); auto re-tunes it per upgrade.
    - ``centred`` False here (through the origin, no bias: what auto's procrustes candidate and
      the reference beside other methods fit); an explicit ``procrustes`` request serves True
      (``METHOD_DEFAULTS``), the rule's choice on validation (issue 42 item 2,
      ``bench/results/served_defaults.json``).
    - the rest are unchanged from the first implementation (RINCE λ 0.01 and row normalisation as
      measured in ``bench.quality.compat``'s ablations; adapters' rank 64 / hidden 256 as in Drift-Adapter).
    """

    epochs: int = 15
    # A small dataset still gets this many optimiser steps per epoch: the batch shrinks to
    # n // min_batches_per_epoch when that is below batch_size.
    min_batches_per_epoch: int = 8
    batch_size: int = 512
    lr: float = 1e-3
    weight_decay: float = 1e-4
    hidden_dim: int = 0
    dropout: float = 0.1
    # L_base: prototype CE (labels) or neighbourhood distillation (no labels), temperature τ.
    base_temperature: float = 0.05
    # λ: weight of the compatibility terms of every method.
    compat_weight: float = 1.0
    # HBCT
    align_temperature: float = 0.1
    rince_lambda: float = 0.01
    rince_normalise_rows: bool = True
    q_min: float = 0.0
    uncertainty: str = "auto"
    knn_k: int = 10
    cone_min_radius: float = 0.1
    old_proto_weight: float = 0.0
    old_proto_temperature: float = 0.05
    # Euclidean baselines
    influence_temperature: float = 0.05
    contrastive_temperature: float = 0.05
    # instance-map: InfoNCE temperature on cosine similarities of tangent vectors
    instance_temperature: float = 0.05
    # class-map: weight of its class terms (toward the old class means; L_base in its own space)
    class_weight: float = 0.3
    # instance-map / class-map: 0 = a trainable linear map from the Procrustes start; > 0 = the
    # fixed Procrustes map plus a trainable residual GELU MLP this wide (output zero at the start)
    map_hidden: int = 0
    # instance-map / class-map: > 0 = a class-conditional map instead (``class_conditional``): the
    # fixed Procrustes map plus this many rank-``map_expert_rank`` experts gated by class group
    map_experts: int = 0
    map_expert_rank: int = 32
    # class-map: > 0 = BT²-style extra dimensions for L_base's prototype term only (a trained
    # linear branch from the new features); the served model is the compatible part alone
    extra_dims: int = 0
    # Adapters
    adapter_rank: int = 64
    adapter_hidden: int = 256
    # procrustes: True = centred with a bias (s·(x W) + b, ``centred_orthogonal_procrustes``);
    # False = through the origin, no bias (the map every other adapter and map starts from).
    centred: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> CompatParams:
        """Validated construction: unknown names and out-of-range values raise ``ValueError``."""
        values = dict(values or {})
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown}; known: {sorted(names)}")
        defaults = cls()
        typed: dict[str, Any] = {}
        for name, value in values.items():
            expected = type(getattr(defaults, name))
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, expected) or (
                isinstance(value, bool) and expected is not bool
            ):
                raise ValueError(f"parameter {name!r} must be {expected.__name__}")
            typed[name] = value
        params = cls(**typed)
        params.validate()
        return params

    @classmethod
    def for_method(cls, method: str, values: dict[str, Any] | None) -> CompatParams:
        """``from_dict`` over the method's served defaults (``METHOD_DEFAULTS``): what the
        request names wins. A setting only another method reads is refused, not ignored."""
        params = cls.from_dict({**METHOD_DEFAULTS.get(method, {}), **(values or {})})
        _check_method_only(method, params)
        return params

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            # JSON bodies may carry NaN/Infinity, which every comparison below would let through.
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"parameter {f.name!r} must be a finite number")
        positive = ["epochs", "batch_size", "lr", "base_temperature", "align_temperature"]
        positive += ["rince_lambda", "knn_k", "cone_min_radius", "old_proto_temperature"]
        positive += ["influence_temperature", "contrastive_temperature", "instance_temperature"]
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"parameter {name!r} must be > 0")
        for name in (
            "weight_decay",
            "compat_weight",
            "old_proto_weight",
            "class_weight",
            "hidden_dim",
            "map_hidden",
            "map_experts",
            "extra_dims",
            "min_batches_per_epoch",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"parameter {name!r} must be ≥ 0")
        if not 0.0 <= self.q_min <= 1.0:
            raise ValueError("parameter 'q_min' must lie in [0, 1]")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("parameter 'dropout' must lie in [0, 1)")
        if self.uncertainty not in UNCERTAINTY_SOURCES:
            raise ValueError(f"parameter 'uncertainty' must be one of {list(UNCERTAINTY_SOURCES)}")
        if self.epochs > 10_000 or self.min_batches_per_epoch > 10_000:
            raise ValueError("epochs ≤ 10000 and min_batches_per_epoch ≤ 10000")
        if self.batch_size > 65_536 or self.hidden_dim > 65_536 or self.map_hidden > 65_536:
            raise ValueError("batch_size, hidden_dim and map_hidden must be ≤ 65536")
        if self.adapter_rank < 1 or self.adapter_hidden < 1:
            raise ValueError("adapter_rank and adapter_hidden must be ≥ 1")
        if self.extra_dims > 4096:
            raise ValueError("parameter 'extra_dims' must be ≤ 4096")
        if self.map_experts > 1024 or not 1 <= self.map_expert_rank <= 4096:
            raise ValueError("map_experts must be ≤ 1024 and map_expert_rank in [1, 4096]")
        if self.map_experts > 0 and self.map_hidden > 0:
            raise ValueError(
                "parameters 'map_hidden' and 'map_experts' choose two different maps: set one"
            )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("extra")
        return out


def class_means(vectors: Tensor, labels: Tensor, n_classes: int) -> Tensor:
    """Mean vector per class (rows 0..K−1)."""
    sums = torch.zeros(n_classes, vectors.shape[1], dtype=vectors.dtype, device=vectors.device)
    sums.index_add_(0, labels, vectors)
    counts = torch.bincount(labels, minlength=n_classes).clamp(min=1).to(vectors.dtype)
    return sums / counts[:, None]


def _check_method_only(method: str, params: CompatParams) -> None:
    defaults = CompatParams()
    for name, methods in METHOD_ONLY_PARAMS.items():
        if getattr(params, name) != getattr(defaults, name) and method not in methods:
            raise ValueError(f"parameter {name!r} applies to method(s) {list(methods)} only")


def settings_read_by(method: str, params: CompatParams) -> CompatParams:
    """``params`` with every setting only other methods read (``METHOD_ONLY_PARAMS``) back at its
    default: what an alternative trained beside the requested method (procrustes, the
    independent head, auto's other candidates) is given of that request."""
    defaults = CompatParams()
    reset = {
        name: getattr(defaults, name)
        for name, methods in METHOD_ONLY_PARAMS.items()
        if method not in methods
    }
    return dataclasses.replace(params, **reset)


def _check_inputs(
    method: str, new_features: Tensor, old_points: Tensor, labels: Tensor | None
) -> None:
    if method not in BACKBONE_METHODS:
        raise ValueError(f"unknown method {method!r}, expected one of {list(BACKBONE_METHODS)}")
    if new_features.ndim != 2 or old_points.ndim != 2:
        raise ValueError("new_features and old_points must be 2-d")
    if new_features.shape[0] != old_points.shape[0]:
        raise ValueError("new_features and old_points must have the same number of rows")
    if new_features.shape[0] < 2:
        raise ValueError("need at least 2 training items")
    if labels is not None and labels.shape[0] != new_features.shape[0]:
        raise ValueError("labels must have one entry per training item")
    if labels is None and method in LABELLED_ONLY_METHODS:
        raise ValueError(f"method {method!r} needs labels")
    for name, t in (("new_features", new_features), ("old_points", old_points)):
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} contains NaN or Inf")


def fit_procrustes_adapter(
    new_features: Tensor,
    old_points: Tensor,
    curv: float,
    rank: int = 0,
    hidden: int = 0,
    centred: bool = False,
) -> AdapterHead:
    """Adapter whose fixed projection is orthogonal Procrustes from new features to old tangents;
    ``centred``: fitted between the centred rows, the offset b in the head's bias (as b / α, the
    head computing α·(x P + bias)), else through the origin with a zero bias."""
    old_tangent = log_map0(old_points, curv)
    offset = None
    if centred:
        projection, scale, offset = centred_orthogonal_procrustes(new_features, old_tangent)
    else:
        projection, scale = orthogonal_procrustes(new_features, old_tangent)
    head = AdapterHead(
        new_features.shape[1],
        old_points.shape[1],
        rank=rank,
        residual_hidden=hidden,
        curv=curv,
        init_scale=max(scale, 1e-6),
    )
    with torch.no_grad():
        head.projection.copy_(projection)
        if offset is not None:
            # Divided by the α the head applies (its log-scale clamped), so the offset is exact.
            head.bias.copy_(offset / head.scale)
    return head


def train_compatible_model(
    method: str,
    new_features: np.ndarray | Tensor,
    old_points: np.ndarray | Tensor,
    labels: np.ndarray | Tensor | None,
    curv: float,
    params: CompatParams | dict[str, Any] | None = None,
    seed: int = 0,
    hooks: TrainingHooks = NO_HOOKS,
    device: str | torch.device | None = None,
    extra_pairs: tuple[np.ndarray, np.ndarray] | None = None,
) -> EmbeddingModel:
    """Train ``method``'s new model on paired (new feature, old point) rows. Deterministic in seed
    (on one device). ``device=None`` uses CUDA when torch sees a GPU, else the CPU; the returned
    model is on the CPU. ``extra_pairs`` = (features, old points) of further unlabelled pairs
    (logged queries by both models); the ``PAIR_METHODS`` train on them, the others ignore them."""
    p = params if isinstance(params, CompatParams) else CompatParams.from_dict(params)
    dev = resolve_device(device)
    x = torch.as_tensor(np.asarray(new_features, dtype=np.float32))
    old = torch.as_tensor(np.asarray(old_points, dtype=np.float32))
    y = None if labels is None else torch.as_tensor(np.asarray(labels, dtype=np.int64))
    _check_inputs(method, x, old, y)
    _check_method_only(method, p)
    torch.manual_seed(seed)

    if method in PAIR_METHODS:
        class_labels = y if method == "class-map" else None
        return _train_pair_map(x, old, class_labels, extra_pairs, curv, p, seed, hooks, dev)

    if method == "procrustes":
        head = fit_procrustes_adapter(x, old, curv, centred=p.centred)
        hooks.report(0, 0, float("nan"))
        return head.eval()
    # The closed-form fits above run on the CPU in float64; training runs on ``dev``.
    x, old = x.to(dev), old.to(dev)
    y = None if y is None else y.to(dev)
    if method in ("affine", "mlp-adapter"):
        head = fit_procrustes_adapter(
            x.cpu(),
            old.cpu(),
            curv,
            rank=p.adapter_rank if method == "affine" else 0,
            hidden=p.adapter_hidden if method == "mlp-adapter" else 0,
        ).to(dev)
        old_tangent = log_map0(old, curv)

        def adapter_loss(idx: Tensor, model: _TangentHead) -> Tensor:
            return losses.l2_alignment_loss(model.tangent(x[idx]), old_tangent[idx])

        return _optimise(head, adapter_loss, [], x.shape[0], p, seed, hooks).cpu().eval()

    head = LorentzHead(
        x.shape[1], old.shape[1], hidden_dim=p.hidden_dim, curv=curv, dropout=p.dropout
    ).to(dev)
    extra_params: list[torch.nn.Parameter] = []
    n_classes = int(y.max().item()) + 1 if y is not None else 0
    if y is not None:
        init = torch.randn(n_classes, old.shape[1]) * old.shape[1] ** -0.5
        prototypes = torch.nn.Parameter(init.to(dev))
        extra_params.append(prototypes)

    def base_loss(idx: Tensor, points: Tensor) -> Tensor:
        if y is not None:
            return losses.prototype_cross_entropy(
                points, prototypes, y[idx], curv, p.base_temperature
            )
        return losses.neighbourhood_distillation(points, x[idx], curv, p.base_temperature)

    compat = _compatibility_term(method, old, y, n_classes, curv, p)

    def total_loss(idx: Tensor, model: _TangentHead) -> Tensor:
        points = model(x[idx])
        loss = base_loss(idx, points)
        if compat is not None:
            loss = loss + compat(idx, points)
        return loss

    return _optimise(head, total_loss, extra_params, x.shape[0], p, seed, hooks).cpu().eval()


def procrustes_linear_head(new_features: Tensor, old_points: Tensor, curv: float) -> LorentzHead:
    """A linear ``LorentzHead`` (trainable weight and bias) equal to the Procrustes adapter."""
    adapter = fit_procrustes_adapter(new_features, old_points, curv)
    head = LorentzHead(
        new_features.shape[1],
        old_points.shape[1],
        hidden_dim=0,
        curv=curv,
        init_scale=adapter.init_scale,
    )
    linear = head.net
    assert isinstance(linear, torch.nn.Linear)
    with torch.no_grad():
        linear.weight.copy_(adapter.projection.T)
        linear.bias.zero_()
    return head


def _train_pair_map(
    x: Tensor,
    old: Tensor,
    y: Tensor | None,
    extra_pairs: tuple[np.ndarray, np.ndarray] | None,
    curv: float,
    p: CompatParams,
    seed: int,
    hooks: TrainingHooks,
    dev: torch.device,
) -> EmbeddingModel:
    """Instance InfoNCE on the paired items plus ``extra_pairs``, from the Procrustes start (fitted
    on the paired items alone, so the start is the ``procrustes`` candidate itself). With labels
    ``y`` (``class-map``), ``class_weight`` × (influence loss toward the old class means + L_base's
    prototype cross-entropy) on the paired items: logged queries carry no label. ``map_hidden``
    > 0: the map is the fixed Procrustes projection plus a residual MLP (``AdapterHead``), the
    same start, non-linear; ``map_experts`` > 0: plus experts gated by class group
    (``class_conditional``), the same start too. ``extra_dims`` > 0 (with labels): the prototype
    term scores [the map's tangent, a linear branch's ``extra_dims`` outputs]; the branch is
    dropped after training, so the served model is the map alone (BT²'s extra dimensions kept out
    of the old space; its learned basis change adds nothing here, since the map is already a
    trained full-rank map of the new features)."""
    n_paired = x.shape[0]
    head: _TangentHead
    if p.map_experts > 0:
        head = fit_class_conditional_map(x, old, y, curv, p.map_experts, p.map_expert_rank, seed)
    elif p.map_hidden > 0:
        head = fit_procrustes_adapter(x, old, curv, hidden=p.map_hidden)
    else:
        head = procrustes_linear_head(x, old, curv)
    extra_params: list[torch.nn.Parameter] = []
    classes = None
    extra_branch: torch.nn.Linear | None = None
    if y is not None:
        n_classes = int(y.max().item()) + 1
        means = class_means(log_map0(old, curv), y, n_classes).to(dev)
        own_dim = old.shape[1] + p.extra_dims
        init = torch.randn(n_classes, own_dim) * own_dim**-0.5
        prototypes = torch.nn.Parameter(init.to(dev))
        extra_params.append(prototypes)
        classes = (y.to(dev), means, prototypes)
        if p.extra_dims > 0:
            # BT²: the prototype term also sees these dimensions, the old-space terms never do,
            # so class separation the old space cannot hold need not bend the served map.
            extra_branch = torch.nn.Linear(x.shape[1], p.extra_dims, bias=False).to(dev)
            extra_params.extend(extra_branch.parameters())
    if extra_pairs is not None and len(extra_pairs[0]):
        ex = torch.as_tensor(np.asarray(extra_pairs[0], dtype=np.float32))
        eo = torch.as_tensor(np.asarray(extra_pairs[1], dtype=np.float32))
        if ex.shape[1] != x.shape[1] or eo.shape[1] != old.shape[1] or ex.shape[0] != eo.shape[0]:
            raise ValueError("extra_pairs must match the paired rows' widths, one old row each")
        if not (torch.isfinite(ex).all() and torch.isfinite(eo).all()):
            raise ValueError("extra_pairs contain NaN or Inf")
        x, old = torch.cat([x, ex]), torch.cat([old, eo])
    head = head.to(dev)
    x, old_tangent = x.to(dev), log_map0(old, curv).to(dev)

    def loss(idx: Tensor, model: _TangentHead) -> Tensor:
        tangent = model.tangent(x[idx])
        out = losses.instance_info_nce(tangent, old_tangent[idx], p.instance_temperature)
        if classes is None:
            return out
        labels, means, prototypes = classes
        paired = idx < n_paired
        if not paired.any():
            return out
        y_batch = labels[idx[paired]]
        influence = losses.influence_loss(tangent[paired], means, y_batch, p.instance_temperature)
        own = tangent[paired]
        if extra_branch is not None:
            own = torch.cat([own, extra_branch(x[idx[paired]])], dim=1)
        base = losses.prototype_cross_entropy(
            exp_map0(own, curv), prototypes, y_batch, curv, p.base_temperature
        )
        return out + p.class_weight * (influence + base)

    return _optimise(head, loss, extra_params, x.shape[0], p, seed, hooks).cpu().eval()


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` → CUDA when torch sees a GPU, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _compatibility_term(
    method: str, old: Tensor, y: Tensor | None, n_classes: int, curv: float, p: CompatParams
):
    """The method's compatibility loss as a function of (batch indices, new points), or None."""
    if method == "independent":
        return None
    old_tangent = log_map0(old, curv)
    lam = p.compat_weight

    if method in HYPERBOLIC_METHODS:
        u = old_uncertainty(
            p.uncertainty, old, curv, None if y is None else y.cpu().numpy(), p.knn_k
        )
        q = torch.clamp(u.to(old.device), min=p.q_min, max=1.0)
        with_entailment = method == "hbct"
        proto = None
        if p.old_proto_weight > 0 and y is not None:
            # Lifted class means of the old space: where each class's old gallery items gather.
            proto = exp_map0(class_means(old_tangent, y, n_classes), curv)

        def hbct_term(idx: Tensor, points: Tensor) -> Tensor:
            o = old[idx]
            labels = None if y is None else y[idx]
            term = losses.rince_alignment_loss(
                points,
                o,
                curv,
                p.align_temperature,
                q[idx],
                p.rince_lambda,
                labels,
                p.rince_normalise_rows,
            )
            if with_entailment:
                term = term + losses.entailment_cone_loss(o, points, curv, p.cone_min_radius)
            out = lam * term
            if proto is not None and labels is not None:
                out = out + p.old_proto_weight * losses.prototype_cross_entropy(
                    points, proto, labels, curv, p.old_proto_temperature
                )
            return out

        return hbct_term

    if method == "l2":
        return lambda idx, points: (
            lam * losses.l2_alignment_loss(log_map0(points, curv), old_tangent[idx])
        )
    if method == "bct":
        assert y is not None
        means = class_means(old_tangent, y, n_classes)
        return lambda idx, points: (
            lam
            * losses.influence_loss(log_map0(points, curv), means, y[idx], p.influence_temperature)
        )
    if method == "contrastive":
        return lambda idx, points: (
            lam
            * losses.hot_refresh_contrastive_loss(
                log_map0(points, curv),
                old_tangent[idx],
                p.contrastive_temperature,
                None if y is None else y[idx],
            )
        )
    raise AssertionError(method)


def _optimise(
    model: _TangentHead,
    loss_fn,
    extra_params: list[torch.nn.Parameter],
    n: int,
    p: CompatParams,
    seed: int,
    hooks: TrainingHooks,
) -> _TangentHead:
    """AdamW with a cosine schedule over ``p.epochs`` of shuffled mini-batches."""
    params = [q for q in model.parameters() if q.requires_grad] + extra_params
    optimiser = torch.optim.AdamW(params, lr=p.lr, weight_decay=p.weight_decay)
    batch = max(2, min(p.batch_size, n // max(1, p.min_batches_per_epoch)))
    # Drop the ragged tail: in-batch negatives need a full batch.
    steps_per_epoch = max(1, n // batch)
    epochs = p.epochs
    total = epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(1, epochs + 1):
        hooks.check()
        order = torch.randperm(n, generator=generator).to(next(model.parameters()).device)
        running = 0.0
        for step in range(steps_per_epoch):
            # Every step, not every epoch: the caller chooses how long an epoch is, and cancel
            # and the time limit must stop within one step (should_stop is cheap: it reads the
            # database at most once a second).
            hooks.check()
            idx = order[step * batch : (step + 1) * batch]
            loss = loss_fn(idx, model)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss became {loss.item()} at epoch {epoch}")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            running += loss.item()
        hooks.report(epoch, epochs, running / steps_per_epoch)
    return model
