"""The verdict an upgrade report ends with: stay, bridge, transition, reindex, or measure.

Rule, on the held-out figures of the objective's primary metric (``PRIMARY_METRIC``):
1. **measure** when those figures cannot answer the user's question: the instance view (an
   item's new features finding its own old vector) is a fidelity figure — "stay" is 1 there by
   construction — never evidence for or against the old model, and with the old model still
   running a query view without the old model's query vectors cannot measure staying. The best
   bridge found is still served; ``missing`` names what to upload.
2. With the old model available (the default):
   - **bridge** only when the served bridge beats the old model on held-out data and keeps
     ``REINDEX_BELOW_ARR`` of the new model's quality (ARR = bridged / reindex);
   - **transition** when the new model beats the old one but the bridge does not (or keeps too
     little of it): re-embed part of the gallery while the old model serves the rest (transition
     search sends both models' query vectors) and switch at 100 %;
   - **stay** when neither the bridge nor the new model beats the old one.
3. With the old model gone (``old_model_available`` false) there is no stay and no transition:
   **reindex** when the bridge keeps less than ``REINDEX_BELOW_ARR`` of the reindex, else
   **bridge**.
4. **two-stage** first, on the query view, when the upgrade measured it (``two_stage``, the
   report's depth curve, at ``DEFAULT_DEPTH``): candidates from the old index ranked by the new
   model beat the single-stage search they stand for — stay's (old model running) or the
   bridge's (old model gone) — and reach the bridge's recall@10 (old model running) or
   ``REINDEX_BELOW_ARR`` of the reindex's (old model gone). Its cost is an embedder the service
   calls for the candidates it has no new vector of; what it embeds is kept.

Every comparison above is one rule (issue 42 item 5): the paired per-query difference of the two
alternatives on the same held-out queries (``paired``: the report's ``paired_gains``, built by
``app.ml.upgrade.paired_gains``; the two-stage curve carries its own). A verdict moves to the
costlier option — stay → bridge → transition or reindex — only on evidence: "beats" means the
mean difference is above ``SIGNIFICANCE`` standard errors, and a share or a level the option must
keep ("keeps ``REINDEX_BELOW_ARR``", "reaches the bridge's recall@10") is missed only when the
shortfall is above ``SIGNIFICANCE`` standard errors. Without per-query figures (a caller that
passes bare metrics) every standard error is taken as 0, i.e. the point figures decide, and the
verdict says so (``evidence``: "point").
"""

from __future__ import annotations

import math
from typing import Any

from app.ml.auto.candidates import PRIMARY_METRIC

# Below this ARR on the objective's metric a bridge keeps too little of what re-embedding the
# gallery would give. A policy fixed a priori, not a fit: "three quarters of the new model's
# quality" is what this project calls keeping most of it, whatever any dataset measures. (An
# earlier comment justified 0.75 by a measured Procrustes ARR on the public nouns; that was a
# look at evaluation figures and is no part of the reason. Issue 42 item 5.)
REINDEX_BELOW_ARR = 0.75
# Standard errors of the paired per-query difference every comparison of the verdict needs,
# fixed a priori, never fitted to a report: 2 ≈ a 95 % two-sided paired interval (the transition
# outlook's rule, ``app.ml.upgrade.outlook.SIGNIFICANCE``). Below it a user's own measurement on
# queries like these could not tell the difference from noise.
SIGNIFICANCE = 2.0
RULE = (
    "measure when the objective's view cannot compare the options (own-item recall, or no old "
    "query vectors while the old model runs); with the old model: bridge when the bridge beats "
    f"it and keeps {REINDEX_BELOW_ARR} of reindex, transition when the new model beats it "
    f"otherwise, else stay; without it: reindex when the bridge keeps less than "
    f"{REINDEX_BELOW_ARR} of reindex, else bridge; before these, two-stage when reranking the old "
    "index's candidates by the new model beats stay's search (or, the old model gone, the "
    "bridge's) and reaches the bridge's recall@10 (or, the old model gone, "
    f"{REINDEX_BELOW_ARR} of reindex). Every comparison is paired per held-out query: 'beats' "
    f"means a mean difference above {SIGNIFICANCE:g} standard errors, and a share or level to "
    f"keep is missed only by a shortfall above {SIGNIFICANCE:g} standard errors"
)
# What to upload so that the next upgrade can answer, by the view that was missing.
MISSING = {
    "instance": (
        "logged queries with both models' vectors and the ids each query should find "
        "(POST /v1/datasets/{id}/queries: features, old_vectors, relevant_ids; a few hundred "
        "at least) — or labels, for class-level search"
    ),
    "query": (
        "the old model's vectors of the logged queries (old_vectors), so that staying with the "
        "old model is measured on the same queries"
    ),
}


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"


CLASS_ONLY = (
    "This was judged on class search (an item's neighbours sharing its label): query → "
    "document search through the bridge is not measured. For queries that look for their own "
    "documents, send the old model's vectors of the same queries too (old_vectors, the CLI's "
    "--old-queries: a transition search, exactly the old model's own hits while nothing is "
    "re-embedded) until a query log (queries, both models' vectors, relevant items) shows the "
    "bridge beats it."
)


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


def below_old_model(metrics: dict[str, dict[str, Any]], served: str) -> list[dict[str, Any]]:
    """Every measured view where the old model beats the served bridge on that view's primary
    metric (query R@10, class CMC@1): whatever the verdict follows, a served model that is
    worse than not upgrading somewhere must say so. Own-item recall is left out: staying is 1
    there by construction, so every bridge is 'below' it and that says nothing about search."""
    out = []
    for view in ("query", "class"):
        metric = PRIMARY_METRIC[view][1]
        bridge = metrics.get(served, {}).get(view, {}).get(metric)
        stay = metrics.get("stay", {}).get(view, {}).get(metric)
        if bridge is None or stay is None or not (math.isfinite(bridge) and math.isfinite(stay)):
            continue
        if bridge < stay:
            out.append({"view": view, "metric": metric, "bridge": bridge, "stay": stay})
    return out


def _below_sentence(below: list[dict[str, Any]], served: str) -> str:
    if not below:
        return ""
    figures = "; ".join(
        f"{b['view']} {b['metric']}: bridge ({served}) {_fmt(b['bridge'])}, stay {_fmt(b['stay'])}"
        for b in below
    )
    return (
        f" Searching the old gallery with this model is worse than not upgrading on held-out "
        f"data: {figures}."
    )


def clears(gain: dict[str, Any] | None) -> bool:
    """The paired rule: a mean per-query difference above ``SIGNIFICANCE`` standard errors (a
    finite one; 0 for point figures). None — nothing measured — clears nothing."""
    if gain is None:
        return False
    mean, se = gain.get("mean"), gain.get("se")
    if mean is None or se is None or not (math.isfinite(mean) and math.isfinite(se)):
        return False
    return mean > SIGNIFICANCE * se


def falls_short(gain: dict[str, Any] | None) -> bool:
    """A level to keep is missed: the difference (option − level) is below 0 by more than
    ``SIGNIFICANCE`` standard errors."""
    if gain is None:
        return False
    mean = gain.get("mean")
    return mean is not None and clears({**gain, "mean": -mean})


def _point(a: float | None, b: float | None) -> dict[str, Any] | None:
    """A point difference a − b as a gain with standard error 0 (no per-query figures)."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return {"mean": a - b, "se": 0.0}


def _given(
    paired: dict[str, Any] | None, key: str, point: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The paired difference ``key`` when per-query figures were given, else the point one."""
    return point if paired is None else paired.get(key)


def _fmt_gain(gain: dict[str, Any] | None) -> str:
    if gain is None or not math.isfinite(gain["mean"]):
        return "n/a"
    return f"{gain['mean']:+.3f} ± {gain['se']:.3f}"


def _two_stage_pick(
    two_stage: dict[str, Any] | None,
    view: str,
    old_model_available: bool,
    bridge: float | None,
    reindex: float | None,
) -> dict[str, Any] | None:
    """The two-stage option the rule allows (rule 4 of the module docstring), or None. Its
    floors (the bridge's recall@10; ``REINDEX_BELOW_ARR`` of the reindex's) are judged on the
    curve's paired differences (``vs_bridge``, ``vs_reindex_share``) where it carries them, as
    point figures otherwise."""
    if two_stage is None or view != "query":
        return None
    source = "old" if old_model_available else "bridge"
    depth = two_stage.get("default_depth")
    entry = two_stage.get(source, {}).get(str(depth))
    if entry is None:
        return None
    gain = entry["gain"]
    if not clears(gain):
        return None
    value = entry["recall@10"]
    if (
        old_model_available
        and bridge is not None
        and falls_short(entry.get("vs_bridge", _point(value, bridge)))
    ):
        return None
    if not old_model_available:
        share = None if reindex is None else REINDEX_BELOW_ARR * reindex
        floor = entry.get("vs_reindex_share", _point(value, share))
        if floor is None or falls_short(floor):
            return None
    return {
        "depth": int(depth),
        "candidates_from": "the old model's query vectors" if source == "old" else "the bridge",
        "expected_recall@10": value,
        "gain": gain,
        "against": two_stage.get("gain_against", {}).get(source, source),
        "queries": two_stage.get("queries"),
        "embedded_per_query": entry.get("embedded_per_query"),
    }


def recommend(
    metrics: dict[str, dict[str, Any]],
    served: str,
    objective: str,
    view: str | None = None,
    old_model_available: bool = True,
    outlook: dict[str, Any] | None = None,
    two_stage: dict[str, Any] | None = None,
    paired: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``metrics`` as ``alternatives.assemble`` returns it; ``served`` the bridge's name there.
    ``view`` overrides the objective's view when that view was not measurable. ``outlook``: the
    transition search's measured curve (``app.ml.upgrade.outlook``), which a transition verdict
    quotes: the suggested share re-embedded and the figure expected there. ``paired``: the
    paired per-query differences on the same view and metric (``app.ml.upgrade.paired_gains``);
    None compares the point figures (standard error 0) and says so."""
    pview, metric = PRIMARY_METRIC[objective]
    view = view or pview
    if view != pview:
        metric = PRIMARY_METRIC["instance"][1] if view == "instance" else metric
    if paired is not None and (paired.get("view"), paired.get("metric")) != (view, metric):
        raise ValueError(
            f"paired differences on {paired.get('view')} {paired.get('metric')} cannot judge "
            f"a verdict on {view} {metric}"
        )
    label = f"{view} {metric}"
    bridge = metrics[served].get(view, {}).get(metric)
    reindex = metrics["reindex"].get(view, {}).get(metric)
    # Own-item recall's "stay" is 1 by construction: not a figure, so it is shown as n/a.
    stay = metrics["stay"].get(view, {}).get(metric) if view != "instance" else None
    ratio = metrics[served].get("arr", {}).get(view, {}).get(metric)
    # The three comparisons of rules 2 and 3, paired per query where the report measured them.
    beats = _given(paired, "bridge_vs_stay", _point(bridge, stay))
    new_beats = _given(paired, "reindex_vs_stay", _point(reindex, stay))
    # ARR ≥ REINDEX_BELOW_ARR ⇔ bridge − REINDEX_BELOW_ARR × reindex ≥ 0 (reindex > 0).
    share = _given(
        paired,
        "bridge_vs_reindex_share",
        None if ratio is None else _point(ratio, REINDEX_BELOW_ARR),
    )
    keeps_enough = share is not None and not falls_short(share)
    numbers = (
        f"on held-out data, {label}: bridge ({served}) {_fmt(bridge)}, "
        f"stay {_fmt(stay) if old_model_available else 'not an option'}, "
        f"reindex {_fmt(reindex)}, ARR {_fmt(ratio)}"
    )
    if paired is None:
        evidence = " (point figures: no per-query differences were given)"
    else:
        # With the old model gone staying is no option: only the share the bridge keeps counts.
        compared = (
            [("bridge − stay", beats), ("reindex − stay", new_beats)] if old_model_available else []
        )
        compared.append((f"bridge − {REINDEX_BELOW_ARR} × reindex", share))
        evidence = (
            f"; paired per query over {paired.get('queries')} held-out "
            f"{'queries' if view == 'query' else 'items'}: "
            + ", ".join(f"{name} {_fmt_gain(gain)}" for name, gain in compared)
            + f" (mean ± standard error; a difference counts beyond {SIGNIFICANCE:g} standard "
            "errors)"
        )
    numbers += evidence
    out: dict[str, Any] = {}
    if view == "instance" or (old_model_available and stay is None):
        action = "measure"
        missing = MISSING["instance" if view == "instance" else "query"]
        why = (
            f"These figures cannot tell whether switching pays off: {numbers}. "
            + (
                "Own-item recall measures how faithfully the bridge maps items, not whether "
                "queries find what users want. "
                if view == "instance"
                else "Without the old model's vectors of the same queries, staying is not "
                "measured. "
            )
            + f"Meanwhile a search with new features alone goes through the bridge ({served}), "
            "which is not shown to beat the old model: send the old model's vectors of the same "
            "queries too (old_vectors, the CLI's --old-queries: a transition search, exactly the "
            f"old model's own hits while nothing is re-embedded), or keep the old model. Upload "
            f"{missing}, then train again."
        )
        out["missing"] = [missing]
        next_step = (
            "nobackfill dataset queries DATASET --ids q_ids.npy --features new_q.npy "
            "--old-vectors old_q.npy --relevant relevant.json, then nobackfill upgrade "
            f"--dataset DATASET --wait (upload {missing})"
        )
        curl = "POST /v1/datasets/DATASET/queries (ids, features, old_vectors, relevant_ids)"
    elif (
        pick := _two_stage_pick(two_stage, view, old_model_available, bridge, reindex)
    ) is not None:
        action = "two-stage"
        gain = pick["gain"]
        why = (
            f"Two stages beat {pick['against']}: {numbers}. Candidates from the old index "
            f"(by {pick['candidates_from']}, depth {pick['depth']}) ranked by the new model: "
            f"recall@10 {_fmt(pick['expected_recall@10'])}, {gain['mean']:+.3f} per query over "
            f"{pick['against']} (± {gain['se']:.3f} standard error, paired, {pick['queries']} "
            "held-out queries; the dataset's new features stood in for the embedder)."
        )
        next_step = (
            "nobackfill search GALLERY --model MODEL --queries new_q.npy"
            + (" --old-queries old_q.npy" if old_model_available else "")
            + f" --rerank-depth {pick['depth']} (first register the new backbone's embedding "
            "endpoint, give it to the model and upload the items' texts: README, two-stage "
            "search) — the candidates it embeds are kept, so the migration advances with traffic"
        )
        curl = (
            'POST /v1/galleries/GALLERY/search {"model_id": "MODEL", "features": [...]'
            + (', "old_vectors": [...]' if old_model_available else "")
            + f', "rerank": {{"depth": {pick["depth"]}}}}}'
        )
        out["two_stage"] = pick
    elif not old_model_available:
        if keeps_enough:
            action = "bridge"
            why = f"The old model is gone; the bridge keeps enough of a reindex: {numbers}."
            next_step = "nobackfill search GALLERY --model MODEL --queries new_q.npy"
            curl = 'POST /v1/galleries/GALLERY/search {"model_id": "MODEL", "features": [...]}'
        else:
            action = "reindex"
            why = (
                f"The old model is gone and the bridge keeps only {_fmt(ratio)} of the new "
                f"model's quality (below {REINDEX_BELOW_ARR}): {numbers}. Re-embed the gallery."
            )
            next_step = (
                "nobackfill migrate GALLERY --model MODEL --fraction 1 (the server embeds the "
                "stored texts with the model's embedder), or nobackfill backfill upload GALLERY "
                "--model MODEL --ids ids.npy --features new.npy"
            )
            curl = 'POST /v1/galleries/GALLERY/reembed {"model_id": "MODEL", "fraction": 1.0}'
    elif clears(beats) and (keeps_enough or not clears(new_beats)):
        # A bridge that beats staying but keeps too little of the reindex gives way to a
        # transition only where the new model's own gain over staying is measurable too.
        action = "bridge"
        why = f"The bridge beats the old model on held-out data: {numbers}." + _worse_than_stay(
            metrics, served, view
        )
        next_step = "nobackfill search GALLERY --model MODEL --queries new_q.npy"
        curl = 'POST /v1/galleries/GALLERY/search {"model_id": "MODEL", "features": [...]}'
    elif clears(new_beats):
        action = "transition"
        why = (
            "The new model beats the old one, the bridge "
            + ("does not" if not clears(beats) else "keeps too little of it")
            + f": {numbers}. Re-embed the gallery step by step while the old model serves the "
            "rest: a transition search (both models' query vectors) is exactly the old model's "
            "search at 0 % and exactly a reindex at 100 %."
        )
        first = ""
        if outlook is not None:
            share = outlook["suggested_fraction"]
            first = (
                f" (first {share:.0%} of the gallery: held-out recall@10 "
                f"{outlook['expected_at_suggested']:.3f} expected there, stay {_fmt(stay)})"
            )
            why += (
                f" Measured on {outlook['queries']} held-out queries with a random share "
                f"re-embedded, {outlook['rule']}: {share:.0%}."
            )
            split = outlook.get("split")
            if split is not None:
                why += (
                    f" The share was chosen on {split['chosen_on']} of those queries and its "
                    f"figure measured on the other {split['reported_on']}."
                )
            out.update(
                suggested_fraction=share,
                expected_at_suggested=outlook["expected_at_suggested"],
                expected=outlook["expected"],
            )
            if split is not None:
                out.update(gain_at_suggested=outlook["gain_at_suggested"], split=split)
        share_arg = f"{out['suggested_fraction']:g}" if "suggested_fraction" in out else "0.1"
        next_step = (
            f"nobackfill backfill plan GALLERY --model MODEL --fraction {share_arg} -o ids.npy"
            + first
            + ", then nobackfill backfill upload GALLERY --model MODEL --ids ids.npy --features "
            "new.npy (or nobackfill migrate GALLERY --model MODEL --auto, with an embedder); "
            "search with --queries new_q.npy --old-queries old_q.npy (old_vectors) and switch "
            "at 100 %"
        )
        curl = (
            f'POST /v1/galleries/GALLERY/backfill-plan {{"model_id": "MODEL", "fraction": '
            f"{share_arg}}}"
        )
        out["endpoints"] = {"at_0": stay, "at_100": reindex}
    else:
        action = "stay"
        why = f"Neither a bridge nor the new model beats the old one: {numbers}. Keep it."
        if paired is not None and any(
            g is not None and g["mean"] > 0 and not clears(g) for g in (beats, new_beats)
        ):
            why += (
                f" A higher figure within {SIGNIFICANCE:g} standard errors of the paired "
                "difference is not evidence that switching pays off."
            )
        next_step = "keep searching with the old model"
        curl = None
    if action == "bridge" and view == "class":
        # Labels, no query log: the evidence is class search alone. Through a bridge that wins
        # it, queries can still find their own documents less often than the old model's (the
        # public nouns' lemma → gloss search does), so query search is named as unmeasured.
        why += " " + CLASS_ONLY
        out["unmeasured"] = ["query"]
    below = below_old_model(metrics, served)
    if action != "bridge":  # a bridge's own shortfalls are named by ``_worse_than_stay``
        why += _below_sentence(below, served)
    return {
        "action": action,
        "method": served,
        "objective": objective,
        "metric": {"view": view, "metric": metric},
        "old_model_available": old_model_available,
        "why": why,
        "next_step": next_step,
        "next_step_http": curl,
        **out,
        "below_old_model": below,
        "evidence": "point" if paired is None else "paired",
        **({} if paired is None else {"paired": paired}),
        "rule": RULE,
    }
