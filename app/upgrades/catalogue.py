"""The method catalogue of ``GET /v1/upgrades/methods``, derived from the trainers' own code.

Method names come from the trainers' method tuples, so a method added there appears here. Each
parameter's name, type and default come from the parameter dataclass (``CompatParams`` for
backbone methods, ``ContinualParams`` for continual ones); a field is listed when the dataclass's
own ``from_dict`` accepts it. Ranges are not copied from ``validate()``: they are found by asking
``from_dict`` itself, by bisection over the integers or the ordered float64 values, where the
interval of accepted values ends. So the catalogue cannot drift from what ``POST /v1/upgrades``
accepts. This assumes each numeric rule bounds one parameter to an interval (true of every rule
today; ``tests/service/test_methods_api.py`` checks the endpoints of each stated range).
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

from app.ml.hmcl import METHODS as CONTINUAL_METHODS
from app.ml.hmcl import ROTATION_FITS, ContinualParams
from app.ml.methods.compat import (
    LABELLED_ONLY_METHODS,
    METHOD_DEFAULTS,
    METHOD_ONLY_PARAMS,
    CompatParams,
)
from app.ml.methods.uncertainty import UNCERTAINTY_SOURCES
from app.ml.upgrade.run import BACKBONE_METHODS

BACKBONE, CONTINUAL = "backbone", "continual"

DESCRIPTIONS: dict[str, str] = {
    "auto": (
        "Trains several candidate methods on the same split and keeps the one whose queries "
        "retrieve best from the old gallery on the held-out items."
    ),
    "hbct": (
        "Hyperbolic backward-compatible training: new outputs on the Lorentz hyperboloid, inside "
        "the entailment cone of their old vectors and aligned to them by an uncertainty-weighted "
        "robust contrastive loss (plus old class prototypes when labels are given)."
    ),
    "hbct-noentail": "HBCT without the entailment-cone term (alignment only).",
    "independent": (
        "The new model trained without any compatibility term: the reference that shows what "
        "compatibility costs and gains."
    ),
    "l2": "Pulls each new embedding toward its old vector by Euclidean distance in tangent space.",
    "bct": (
        "Backward-compatible training: an influence loss through the old classifier (the old "
        "space's class means), so it needs labels."
    ),
    "contrastive": (
        "Hot-Refresh-style contrastive alignment with new-to-old and new-to-new negatives."
    ),
    "procrustes": (
        "A closed-form orthogonal map from new features to the old space (no training, seconds)."
    ),
    "affine": "The Procrustes map plus a trained low-rank (adapter_rank) correction.",
    "mlp-adapter": (
        "The Procrustes map plus a trained residual MLP (adapter_hidden units) on the query side."
    ),
    "instance-map": (
        "The Procrustes map trained further with instance InfoNCE (each item's own old vector "
        "first), on logged queries too: the map for query → document search."
    ),
    "class-map": (
        "instance-map plus class terms (toward the old space's class means, and classes kept "
        "apart in its own space), weighted by class_weight: class gains without losing the item "
        "itself. Needs labels."
    ),
    "hmcl-ca": (
        "Continual HMCL with a shared rotation: each update moves old embeddings by at most one "
        "rotation, recorded so new queries still reach every earlier version's gallery."
    ),
    "hmcl-mr": (
        "Continual HMCL that leaves old embeddings in place by updating only directions the old "
        "data does not use."
    ),
    "finetune": "Plain fine-tuning of the previous version (no protection of old embeddings).",
    "ewc": "Fine-tuning with an elastic-weight-consolidation penalty (diagonal Fisher).",
}

# String parameters with a closed set of values: the trainers' own tuples where they export one.
# Every choice is checked against ``from_dict`` when the catalogue is built (``_choices``).
STRING_CHOICES: dict[str, tuple[str, ...]] = {
    "uncertainty": UNCERTAINTY_SOURCES,
    "rotation": ROTATION_FITS,
    "least_squares_map": ("full", "protected"),
}

_FLOAT_MAX = 1.7976931348623157e308
_INT_LIMIT = 2**62


def describe(method: str, kind: str) -> str:
    """One sentence per method; a method added to a trainer before its sentence gets a pointer."""
    fallback = f"A {kind} upgrade method; see the README's Methods section."
    return DESCRIPTIONS.get(method, fallback)


def _accepts(params_cls: type, name: str, value: Any) -> bool:
    try:
        params_cls.from_dict({name: value})
    except ValueError:
        return False
    return True


def _json_type(hint: Any) -> tuple[str, bool]:
    """JSON type of a field annotation and whether it admits None."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    nullable = type(None) in args
    base = next((a for a in args if a is not type(None)), type(None))
    base = typing.get_origin(base) or base
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
    return names.get(base, "object"), nullable


# Float64 values in order as integers: bisection over them ends on two adjacent floats.
def _float_key(value: float) -> int:
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    return -(bits & (2**63 - 1)) if bits >> 63 else bits


def _key_float(key: int) -> float:
    bits = (-key) | 2**63 if key < 0 else key
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _boundary(accepts: Callable[[int], bool], inside: int, outside: int) -> tuple[int, int]:
    """Adjacent (last accepted, first refused) keys between an accepted and a refused key."""
    while abs(outside - inside) > 1:
        middle = (inside + outside) // 2
        if accepts(middle):
            inside = middle
        else:
            outside = middle
    return inside, outside


def _shorter(a: float, b: float) -> bool:
    """Is ``a`` the rounder number of the two (the one a rule would be written with)?"""
    return len(repr(a)) <= len(repr(b))


def _numeric_range(params_cls: type, name: str, json_type: str, start: Any) -> dict[str, Any]:
    """minimum / exclusive_minimum / maximum / exclusive_maximum where from_dict stops accepting
    (absent: no bound). ``start`` is an accepted value. Integers are bisected as themselves,
    floats through their order-preserving integer keys."""
    integer = json_type == "integer"
    to_value: Callable[[int], Any] = int if integer else _key_float
    limit_key = _INT_LIMIT if integer else _float_key(_FLOAT_MAX)
    start_key = int(start) if integer else _float_key(float(start))

    def accepts(key: int) -> bool:
        return _accepts(params_cls, name, to_value(key))

    out: dict[str, Any] = {}
    for side, limit in (("minimum", -limit_key), ("maximum", limit_key)):
        if accepts(limit):
            continue
        inside, outside = _boundary(accepts, start_key, limit)
        accepted, refused = to_value(inside), to_value(outside)
        # An integer rule "> 0" and "≥ 1" are the same; floats keep the rule's own form.
        if integer or _shorter(accepted, refused):
            out[side] = accepted
        else:
            out[f"exclusive_{side}"] = refused
    return out


def _choices(params_cls: type, name: str) -> list[str] | None:
    listed = STRING_CHOICES.get(name)
    if listed is None:
        return None
    accepted = [c for c in listed if _accepts(params_cls, name, c)]
    if not accepted or _accepts(params_cls, name, "\x00not-a-choice"):
        return None  # the trainer does not restrict this parameter to the listed values
    return accepted


def _start_value(params_cls: type, name: str, default: Any) -> Any:
    for candidate in (default, 1, 0, 1.0, 0.5):
        if candidate is not None and _accepts(params_cls, name, candidate):
            return candidate
    return None


def parameter_specs(params_cls: type) -> list[dict[str, Any]]:
    """Every parameter ``params_cls.from_dict`` accepts: name, JSON type, nullable, default and
    range or choices."""
    return [dict(spec) for spec in _parameter_specs(params_cls)]


@cache
def _parameter_specs(params_cls: type) -> tuple[dict[str, Any], ...]:
    hints = typing.get_type_hints(params_cls)
    defaults = params_cls()
    specs = []
    for field in dataclasses.fields(params_cls):
        default = getattr(defaults, field.name)
        if not _accepts(params_cls, field.name, default):
            continue  # not a user parameter (e.g. CompatParams.extra)
        json_type, _ = _json_type(hints[field.name])
        spec: dict[str, Any] = {
            "name": field.name,
            "type": json_type,
            "nullable": _accepts(params_cls, field.name, None),
            "default": default,
        }
        if json_type in ("integer", "number"):
            start = _start_value(params_cls, field.name, default)
            if start is not None:
                spec.update(_numeric_range(params_cls, field.name, json_type, start))
        elif json_type == "string":
            choices = _choices(params_cls, field.name)
            if choices is not None:
                spec["choices"] = choices
        specs.append(spec)
    return tuple(specs)


def _entries(methods: Iterable[str], kind: str, params_cls: type) -> list[dict[str, Any]]:
    return [
        {
            "name": method,
            "kind": kind,
            "description": describe(method, kind),
            # Continual trainers use labels only to keep same-label rows from being negatives.
            "needs_labels": kind == BACKBONE and method in LABELLED_ONLY_METHODS,
            "params": _with_method_defaults(method, parameter_specs(params_cls)),
        }
        for method in methods
    ]


def _with_method_defaults(method: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The method's own served defaults (``METHOD_DEFAULTS``) in place of the dataclass's,
    without the settings only other methods accept (``METHOD_ONLY_PARAMS``)."""
    own = METHOD_DEFAULTS.get(method, {})
    specs = [s for s in specs if method in METHOD_ONLY_PARAMS.get(s["name"], (method,))]
    return [
        {**spec, "default": own[spec["name"]]} if spec["name"] in own else spec for spec in specs
    ]


def catalogue() -> dict[str, Any]:
    """The response of ``GET /v1/upgrades/methods``: the name lists (kept for older clients) and
    one entry per method."""
    return {
        BACKBONE: list(BACKBONE_METHODS),
        CONTINUAL: list(CONTINUAL_METHODS),
        "methods": [
            *_entries(BACKBONE_METHODS, BACKBONE, CompatParams),
            *_entries(CONTINUAL_METHODS, CONTINUAL, ContinualParams),
        ],
    }
