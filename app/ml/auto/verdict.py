"""The verdict an upgrade report ends with: bridge, stay with the old model, or reindex.

Rule, on the held-out figures of the objective's primary metric (``PRIMARY_METRIC``):
1. **stay** when the old model is measurable on that metric (old query vectors for the query
   view; the old gallery's own class metrics for the class view) and the served bridge does not
   beat it;
2. else **reindex** when the bridge keeps less than ``REINDEX_BELOW_ARR`` of the new model's
   native quality (ARR = bridged / reindex on that metric);
3. else **bridge**.
The instance view has no measurable "stay": there the old model's query is the stored vector
itself.
"""

from __future__ import annotations

import math
from typing import Any

from app.ml.auto.candidates import PRIMARY_METRIC

# Below this ARR on the objective's metric a bridge keeps too little of what re-embedding the
# gallery would give: the measured Procrustes bridge keeps 0.77 of R@10 on public text search
# (data README), a level users accept as "most of the gain"; 0.75 leaves that just inside.
REINDEX_BELOW_ARR = 0.75
RULE = (
    "stay when the old model is measurable on the objective's metric and the served bridge does "
    f"not beat it; else reindex when the bridge's ARR on that metric is below {REINDEX_BELOW_ARR}; "
    "else bridge"
)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _worse_than_stay(metrics: dict[str, dict[str, Any]], served: str, view: str) -> str:
    """The view's other metrics on which the old model beats the served bridge, as a sentence
    ('' when none): the verdict follows one metric, and a bridge can win it and lose another
    (on public lemma → gloss search with a query log: R@10 above stay, R@1 below)."""
    bridge, stay = metrics[served].get(view, {}), metrics["stay"].get(view, {})
    worse = [
        f"{view} {name}: bridge {_fmt(value)}, stay {_fmt(stay[name])}"
        for name, value in bridge.items()
        if stay.get(name) is not None and value is not None and stay[name] > value
    ]
    return f" It is below the old model on {'; '.join(worse)}." if worse else ""


def recommend(
    metrics: dict[str, dict[str, Any]], served: str, objective: str, view: str | None = None
) -> dict[str, Any]:
    """``metrics`` as ``alternatives.assemble`` returns it; ``served`` the bridge's name there.
    ``view`` overrides the objective's view when that view was not measurable."""
    pview, metric = PRIMARY_METRIC[objective]
    view = view or pview
    if view != pview:
        metric = PRIMARY_METRIC["instance"][1] if view == "instance" else metric
    label = f"{view} {metric}"
    bridge = metrics[served].get(view, {}).get(metric)
    reindex = metrics["reindex"].get(view, {}).get(metric)
    stay = metrics["stay"].get(view, {}).get(metric) if view != "instance" else None
    ratio = metrics[served].get("arr", {}).get(view, {}).get(metric)
    numbers = (
        f"on held-out data, {label}: bridge ({served}) {_fmt(bridge)}, "
        f"stay {_fmt(stay)}, reindex {_fmt(reindex)}, ARR {_fmt(ratio)}"
    )
    if bridge is not None and stay is not None and not bridge > stay:
        action = "stay"
        why = f"No bridge beats the old model: {numbers}. Keep using the old model for queries."
    elif ratio is not None and math.isfinite(ratio) and ratio < REINDEX_BELOW_ARR:
        action = "reindex"
        why = (
            f"The bridge keeps only {_fmt(ratio)} of the new model's quality (below "
            f"{REINDEX_BELOW_ARR}): {numbers}. Re-embedding the gallery is worth its cost."
        )
    else:
        action = "bridge"
        why = f"The bridge is the best cheap option: {numbers}." + _worse_than_stay(
            metrics, served, view
        )
    return {
        "action": action,
        "method": served,
        "objective": objective,
        "metric": {"view": view, "metric": metric},
        "why": why,
        "rule": RULE,
    }
