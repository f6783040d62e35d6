"""Partial backfill on real text: quality against the share of the gallery re-embedded, for the
plan, random order and an oracle order.

    python -m bench.backfill                  # all 24,000 WordNet nouns, seeds 0,1,2
    python -m bench.backfill --quick          # the committed 800-synset fixture, one seed, < 1 min

Per seed: the README's 60/40 split of the synsets. The upgrade's dataset is the 60 % (new gloss
features paired with the old gloss vectors, and a query log of their lemmas by both models with
the synset as relevant); ``run_backbone_upgrade`` trains ``--method`` on it with 25 % held out,
and the planner is fitted on that held-out part only (``app.ml.backfill_fit``). The gallery is
every synset's old gloss vector; the evaluation uses the other 40 %, which neither the upgrade
nor the planner saw: query→document (lemma → gloss, R@1, R@10), instance (the gloss's new
features → its own item, R@1) and class (the same queries, relevant = same fine class, the item
itself excluded, CMC@1). A mixed gallery is searched as the service does (``app.ml.backfill``:
native cosine for re-embedded items, bridged for the rest, merged by the per-query tail
calibration).

Orders: ``plan`` (what POST /backfill-plan returns: the planner's chosen estimator),
``expected_gain`` and ``uncertainty (knn)`` (the share of an item's 10 nearest old neighbours
with another fine class, computed over the whole gallery: the calibrated HBCT uncertainty) for
the comparison, ``random`` and ``oracle`` (items by their true gain on the evaluation queries —
unknowable in practice, the ceiling). Also times planning a 1M-item gallery.
JSON to ``bench/results/backfill.json`` (``backfill-quick.json``), a PNG beside it, markdown out.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.backfill import (
    CURVE_FRACTIONS,
    discount,
    fit_planner,
    merged_ranks,
    pick_reference,
    plan_order,
    plan_priority,
    reference_fit,
    unit_rows,
)
from app.ml.backfill_fit import build_fit_view, cosine_scores, lorentz_scores
from app.ml.lorentz import uncertainty as norm_uncertainty
from app.ml.space import EuclideanLift
from app.ml.uncertainty import knn_uncertainty
from app.ml.upgrade import (
    QueryLog,
    UpgradeData,
    run_backbone_upgrade,
    split_for_evaluation,
    split_queries,
)
from bench.querydoc import FIXTURE, load_arrays
from bench.wordnet import REPO_ROOT, encode_labels, fine_labels, load_wordnet

RESULTS = REPO_ROOT / "bench/results/backfill.json"
TRAIN_FRACTION = 0.6
UPGRADE_EVAL_FRACTION = 0.25
ORDERS = ("plan", "expected_gain", "uncertainty (knn)", "random", "oracle")
METRICS = ("query R@10", "query R@1", "instance R@1", "class CMC@1")
TARGET_SHARE_AT_25 = 0.90
TARGET_AT_100 = 0.01
TARGET_PLAN_SECONDS = 10.0


def load_labels(quick: bool, n: int) -> np.ndarray:
    """Fine classes (the data README's: lexname + ancestor at depth 4, ≥ 12 members); −1 for
    synsets whose class is too small (they stay in the gallery as distractors)."""
    if quick:
        with np.load(FIXTURE) as f:
            codes, _ = encode_labels([str(s) for s in f["label"]])
        return codes
    keep, labels = fine_labels(load_wordnet(fields=()).meta)
    codes, _ = encode_labels(labels)
    out = np.full(n, -1, dtype=np.int64)
    out[keep] = codes
    return out


def scores_for(model, arrays, gallery_points, queries_new, curv, reference):
    """(native, bridged) scores over the gallery and the two reference tails."""
    bridged_q = model.embed(queries_new)
    fits = (
        reference_fit(cosine_scores(queries_new, arrays["doc_new"][reference])),
        reference_fit(lorentz_scores(bridged_q, gallery_points[reference], curv)),
    )
    return (
        cosine_scores(queries_new, arrays["doc_new"]),
        lorentz_scores(bridged_q, gallery_points, curv),
        fits,
    )


def run_seed(arrays, labels, seed: int, method: str, params: dict, n_queries: int) -> dict:
    started = time.perf_counter()
    n = arrays["doc_new"].shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    cut = round(TRAIN_FRACTION * n)
    train, test = np.sort(perm[:cut]), np.sort(perm[cut:])
    log = QueryLog(
        features=arrays["query_new"][train],
        old_vectors=arrays["query_old"][train],
        relevant=[np.array([i]) for i in range(len(train))],
    )
    data = UpgradeData(arrays["doc_new"][train], arrays["doc_old"][train], None, log)
    lift = EuclideanLift()
    outcome = run_backbone_upgrade(
        method, data, lift, params=params, seed=seed, eval_fraction=UPGRADE_EVAL_FRACTION
    )
    model = outcome.model
    curv = float(model.curv)
    _, eval_idx = split_for_evaluation(len(data), UPGRADE_EVAL_FRACTION, seed)
    _, eval_q = split_queries(data.queries, eval_idx, UPGRADE_EVAL_FRACTION, seed)
    fit_started = time.perf_counter()
    fit = fit_planner(build_fit_view(model, data, lift, eval_idx, eval_q, seed), seed)
    fit_seconds = time.perf_counter() - fit_started
    gallery = lift(torch.as_tensor(arrays["doc_old"], dtype=torch.float64)).numpy()
    gallery_points = gallery.astype(np.float32)
    # Evaluation queries: a seeded sample of the 40 % (memory: 4 score matrices of q × n).
    rng = np.random.default_rng([seed, 7])
    sample = np.sort(rng.choice(test, min(n_queries, len(test)), replace=False))
    # The reference documents: a sample of the upgrade's paired items (what the service keeps).
    reference = train[pick_reference(len(train), seed)]
    qd = scores_for(model, arrays, gallery_points, arrays["query_new"][sample], curv, reference)
    inst = scores_for(model, arrays, gallery_points, arrays["doc_new"][sample], curv, reference)
    rel = [np.array([i]) for i in sample]
    # Class view: the item itself is not a candidate.
    cls_native, cls_bridged = inst[0].copy(), inst[1].copy()
    cls_native[np.arange(len(sample)), sample] = -np.inf
    cls_bridged[np.arange(len(sample)), sample] = -np.inf
    with_class = [q for q, i in enumerate(sample) if labels[i] >= 0]
    class_rel = [np.flatnonzero(labels == labels[sample[q]]) for q in with_class]
    class_rel = [r[r != sample[q]] for q, r in zip(with_class, class_rel, strict=True)]
    keep = [j for j, r in enumerate(class_rel) if r.size]
    rows = [with_class[j] for j in keep]
    cls = (
        cls_native[rows],
        cls_bridged[rows],
        tuple(tuple(a[rows] for a in fit) for fit in inst[2]),
    )
    class_pack = (None, [class_rel[j] for j in keep])

    # Orders over the whole gallery.
    gain_full = plan_priority(fit, gallery_points, norm_uncertainty(torch.as_tensor(gallery), curv))
    known = labels >= 0
    knn = np.zeros(n)
    sub = np.flatnonzero(known)
    knn[sub] = knn_uncertainty(torch.as_tensor(gallery[sub]), labels[sub], curv).numpy()
    none, every = np.zeros(n, bool), np.ones(n, bool)
    r_new = merged_ranks(*qd[:2], every, rel, qd[2])
    r_old = merged_ranks(*qd[:2], none, rel, qd[2])
    true_gain = np.zeros(n)
    true_gain[sample] = discount(r_new) - discount(r_old)
    tie_break = rng.random(n) * 1e-9
    orders = {
        "plan": plan_order(gain_full),
        "expected_gain": plan_order(fit.gain_model.predict(gallery_points)),
        "uncertainty (knn)": plan_order(knn + tie_break),
        "random": rng.permutation(n),
        "oracle": plan_order(true_gain + tie_break),
    }
    results: dict[str, Any] = {}
    for name, order in orders.items():
        masks = {}
        for fraction in CURVE_FRACTIONS:
            mask = np.zeros(n, dtype=bool)
            mask[order[: round(fraction * n)]] = True
            masks[fraction] = mask
        per = {}
        for fraction, mask in masks.items():
            rq = merged_ranks(*qd[:2], mask, rel, qd[2])
            ri = merged_ranks(*inst[:2], mask, rel, inst[2])
            rc = merged_ranks(*cls[:2], mask, class_pack[1], cls[2]) if class_pack[1] else None
            per[str(fraction)] = {
                "query R@10": float((rq < 10).mean()),
                "query R@1": float((rq < 1).mean()),
                "instance R@1": float((ri < 1).mean()),
                "class CMC@1": float((rc < 1).mean()) if rc is not None else None,
            }
        results[name] = per
    return {
        "seed": seed,
        "method": outcome.method,
        "queries": len(sample),
        "class_queries": len(keep),
        "seconds": time.perf_counter() - started,
        "planner_fit_seconds": fit_seconds,
        "planner": {k: v for k, v in fit.to_dict().items() if k != "gain_model"},
        "results": results,
    }


def time_planning(n_items: int, dim: int, reembedded: float = 0.1) -> float:
    """Seconds to plan a gallery of ``n_items`` points: predict every item's gain, drop the
    re-embedded ones, order the rest (median of 3)."""
    from app.ml.backfill import GainModel

    rng = np.random.default_rng(0)
    points = unit_rows(rng.standard_normal((n_items, dim), dtype=np.float32))
    model = GainModel(rng.standard_normal(dim + 2), unit_rows(rng.standard_normal((1, dim)))[0])
    exclude = rng.random(n_items) < reembedded
    times = []
    for _ in range(3):
        t = time.perf_counter()
        plan_order(model.predict(points), exclude)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def summarise(runs: list[dict]) -> dict[str, dict[str, dict[str, tuple[float, float] | None]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for order in ORDERS:
        out[order] = {}
        for fraction in CURVE_FRACTIONS:
            cell = {}
            for metric in METRICS:
                vals = [r["results"][order][str(fraction)][metric] for r in runs]
                vals = [v for v in vals if v is not None]
                cell[metric] = (
                    (float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0)
                    if vals
                    else None
                )
            out[order][str(fraction)] = cell
    return out


def _fmt(pair) -> str:
    if pair is None:
        return "—"
    return f"{pair[0]:.3f}" if pair[1] == 0 else f"{pair[0]:.3f} ± {pair[1]:.3f}"


def targets(payload: dict) -> list[str]:
    s = payload["summary"]
    reindex = s["plan"]["1.0"]["query R@10"][0]
    at25 = s["plan"]["0.25"]["query R@10"][0]
    lines = [
        f"- R@10 at 25 % by the plan {at25:.3f} = {at25 / reindex:.2f} × reindex {reindex:.3f} "
        f"(target ≥ {TARGET_SHARE_AT_25}) — "
        + ("met" if at25 >= TARGET_SHARE_AT_25 * reindex else "missed")
    ]
    beats = [
        f
        for f in CURVE_FRACTIONS
        if 0 < f < 1 and s["plan"][str(f)]["query R@10"][0] <= s["random"][str(f)]["query R@10"][0]
    ]
    lines.append(
        "- plan beats random (R@10) at every fraction in (0, 1): "
        + ("met" if not beats else f"missed at {beats}")
    )
    gap = max(
        abs(r["results"]["plan"]["1.0"]["query R@10"] - r["reindex_r10"]) for r in payload["runs"]
    )
    lines.append(
        f"- at 100 %: largest |R@10 − reindex| over seeds {gap:.4f} (target ≤ {TARGET_AT_100}) — "
        + ("met" if gap <= TARGET_AT_100 else "missed")
    )
    secs = payload["plan_seconds_1m"]
    lines.append(
        f"- planning 1M items: {secs:.2f} s (target < {TARGET_PLAN_SECONDS}) — "
        + ("met" if secs < TARGET_PLAN_SECONDS else "missed")
    )
    return lines


def render_markdown(payload: dict) -> str:
    s = payload["summary"]
    chosen = sorted({r["planner"]["estimator"] for r in payload["runs"]})
    lines = [
        f"Command: `{payload['command']}` — method `{payload['method']}`, seeds "
        f"{payload['seeds']}, {payload['n_items']} synsets in the gallery, "
        f"{payload['queries_per_seed']} evaluation queries per seed (a seeded sample of the 40 % "
        f"the upgrade never saw); {payload['elapsed_minutes']:.1f} min on {payload['machine']}. "
        f"The plan used the `{', '.join(chosen)}` estimator (chosen on the upgrade's held-out "
        "data by cross-fitting).",
        "",
        *targets(payload),
        "",
        "| order | metric | " + " | ".join(f"{f:.0%}" for f in CURVE_FRACTIONS) + " |",
        "|---|---|" + "---|" * len(CURVE_FRACTIONS),
    ]
    for order in ORDERS:
        for metric in METRICS:
            cells = [_fmt(s[order][str(f)][metric]) for f in CURVE_FRACTIONS]
            lines.append(f"| {order} | {metric} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Planner validation (held-out data of the upgrade, cross-fitted; area under R@10 over "
        "the re-embedded fraction): "
        + "; ".join(
            f"seed {r['seed']}: "
            + ", ".join(f"{k} {v:.4f}" for k, v in r["planner"]["validation"]["area"].items())
            + f", gain correlation {r['planner']['validation']['gain_correlation']:.2f}"
            for r in payload["runs"]
        )
    )
    return "\n".join(lines)


def plot(payload: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = payload["summary"]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.6))
    xs = [100 * f for f in CURVE_FRACTIONS]
    for ax, metric in zip(axes, METRICS, strict=True):
        for order in ORDERS:
            ys = [s[order][str(f)][metric] for f in CURVE_FRACTIONS]
            if any(y is None for y in ys):
                continue
            ax.errorbar(xs, [y[0] for y in ys], yerr=[y[1] for y in ys], label=order, marker="o")
        ax.set_title(metric)
        ax.set_xlabel("gallery re-embedded (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Partial backfill, lemma→gloss, method {payload['method']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="quality against the share re-embedded")
    parser.add_argument("--quick", action="store_true", help="the 800-synset fixture, < 1 min")
    parser.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; quick 0)")
    parser.add_argument("--method", default="procrustes", help="the upgrade's method")
    parser.add_argument("--queries", type=int, default=4000, help="evaluation queries per seed")
    parser.add_argument("--plan-items", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    arrays = load_arrays(args.quick)
    n = arrays["doc_new"].shape[0]
    labels = load_labels(args.quick, n)
    params = {"epochs": 5} if args.quick and args.method != "procrustes" else {}
    started = time.time()
    runs = []
    for seed in seeds:
        run = run_seed(arrays, labels, seed, args.method, params, args.queries)
        run["reindex_r10"] = run["results"]["random"]["1.0"]["query R@10"]
        print(
            f"[{time.strftime('%H:%M:%S')}] seed {seed}: {run['seconds']:.0f} s, planner "
            f"{run['planner']['estimator']} ({run['planner_fit_seconds']:.1f} s to fit)",
            flush=True,
        )
        runs.append(run)
    plan_items = 20_000 if args.quick else args.plan_items
    command = "python -m bench.backfill" + (" --quick" if args.quick else "")
    if args.seeds:
        command += f" --seeds {args.seeds}"
    if args.method != "procrustes":
        command += f" --method {args.method}"
    payload = {
        "command": command,
        "quick": args.quick,
        "method": args.method,
        "seeds": seeds,
        "n_items": n,
        "queries_per_seed": runs[0]["queries"],
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
        "plan_items": plan_items,
        "plan_seconds_1m": time_planning(plan_items, arrays["doc_old"].shape[1]),
        "elapsed_minutes": (time.time() - started) / 60,
        "summary": summarise(runs),
        "runs": runs,
    }
    out = args.out or (RESULTS.with_name("backfill-quick.json") if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    plot(payload, out.with_suffix(".png"))
    print(render_markdown(payload))
    print(out)
    return out


if __name__ == "__main__":
    main()
