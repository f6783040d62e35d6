"""Partial backfill on real text: quality against the share of the gallery re-embedded, for the
plan, random order and an oracle order.

    python -m bench.quality.backfill                  # all 24,000 WordNet nouns, seeds 0,1,2
    python -m bench.quality.backfill --quick          # the committed 800-synset fixture, one seed, < 1 min
    python -m bench.quality.backfill --validation --merge native,max,mean   # choose on training data

Per seed: the README's 60/40 split of the synsets. The upgrade's dataset is the 60 % (new gloss
features paired with the old gloss vectors, and a query log of their lemmas by both models with
the synset as relevant); ``run_backbone_upgrade`` trains ``--method`` on it — by default what
POST /v1/upgrades serves by default (``auto`` with that query log, its default held-out share) —
and the planner is fitted on that held-out part only (``app.ml.upgrade.fit_view``). The gallery is
every synset's old gloss vector; the evaluation uses the other 40 %, which neither the upgrade
nor the planner saw: query→document (lemma → gloss, R@1, R@10), instance (the gloss's new
features → its own item, R@1) and class (the same queries, relevant = same fine class, the item
itself excluded, CMC@1). A mixed gallery is searched as the service does (``app.ml.backfill``:
native cosine for re-embedded items, bridged for the rest, merged by the per-query tail
calibration; ``--merge`` picks how a re-embedded item is scored). ``--validation`` reruns the
whole protocol inside one seed's 60 % (80/20), so a setting is chosen without the 40 %.

Orders: ``plan`` (what POST /backfill-plan returns: the planner's chosen estimator),
``expected_gain`` and ``uncertainty (knn)`` (the share of an item's 10 nearest old neighbours
with another fine class, computed over the whole gallery: the calibrated HBCT uncertainty) for
the comparison, ``random`` and ``oracle`` (items by their true gain on the evaluation queries —
unknowable in practice, the ceiling). Also times planning a 1M-item gallery.
JSON to ``bench/results/backfill.json`` (``backfill-quick.json``, ``backfill-validation.json``),
a PNG beside it, markdown out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.ml.backfill.mixed import (
    CALIBRATION,
    CALIBRATIONS,
    MERGE_RULE,
    MERGE_RULES,
    NO_MAPS,
    calibrated_pair,
    mixed,
    pick_reference,
    ranks_of,
    unit_rows,
)
from app.ml.backfill.plan import (
    CURVE_FRACTIONS,
    discount,
    fit_planner,
    plan_order,
    plan_priority,
    relevance_maps,
)
from app.ml.geometry.lorentz import uncertainty as norm_uncertainty
from app.ml.methods.uncertainty import knn_uncertainty
from app.ml.upgrade.fit_view import (
    bridged_reference_fit,
    cosine_scores,
    lorentz_scores,
    native_reference_fit,
)
from app.upgrades.schemas import UpgradeCreate
from bench.common.partial import upgrade_on
from bench.common.report import replace_section
from bench.common.wordnet import REPO_ROOT, encode_labels, fine_labels, load_wordnet
from bench.common.workers import exit_with_parent
from bench.quality.backfill_report import plot, render_markdown, render_validation, summarise
from bench.quality.querydoc import FIXTURE, load_arrays

RESULTS = REPO_ROOT / "bench/results/backfill.json"
SECTION = "bench.quality.backfill"
TRAIN_FRACTION = 0.6
# Validation (--validation): inside the training synsets, this share trains the upgrade and the
# rest are the queries.
VALIDATION_TRAIN_FRACTION = 0.8
# The bridge measured is the one the service serves by default: POST /v1/upgrades's default
# method (``auto``, trained with the query log), with its default held-out share (bench.common.partial).
SERVED_METHOD = UpgradeCreate.model_fields["method"].default


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
        native_reference_fit(queries_new, arrays["doc_new"][reference]),
        bridged_reference_fit(bridged_q, gallery_points[reference], curv),
    )
    return (
        cosine_scores(queries_new, arrays["doc_new"]),
        lorentz_scores(bridged_q, gallery_points, curv),
        fits,
    )


def run_seed(
    arrays,
    labels,
    seed: int,
    method: str,
    params: dict,
    n_queries: int,
    rules,
    train_fraction,
    calibration: str = CALIBRATION,
) -> dict:
    started = time.perf_counter()
    n = arrays["doc_new"].shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    cut = round(train_fraction * n)
    train, test = np.sort(perm[:cut]), np.sort(perm[cut:])
    outcome, lift, fit_view = upgrade_on(arrays, train, method, seed, params)
    model = outcome.model
    curv = float(model.curv)
    trained_seconds = time.perf_counter() - started
    gallery = lift(torch.as_tensor(arrays["doc_old"], dtype=torch.float64)).numpy()
    gallery_points = gallery.astype(np.float32)
    # Evaluation queries: a seeded sample of the held-out synsets.
    rng = np.random.default_rng([seed, 7])
    sample = np.sort(rng.choice(test, min(n_queries, len(test)), replace=False))
    # The reference documents: a sample of the upgrade's paired items (what the service keeps).
    reference = train[pick_reference(len(train), seed)]
    qd = scores_for(model, arrays, gallery_points, arrays["query_new"][sample], curv, reference)
    inst = scores_for(model, arrays, gallery_points, arrays["doc_new"][sample], curv, reference)
    rel = [np.array([i]) for i in sample]
    # Class view: the item itself is not a candidate.
    with_class = [q for q, i in enumerate(sample) if labels[i] >= 0]
    class_rel = [np.flatnonzero(labels == labels[sample[q]]) for q in with_class]
    class_rel = [r[r != sample[q]] for q, r in zip(with_class, class_rel, strict=True)]
    keep = [j for j, r in enumerate(class_rel) if r.size]
    rows = [with_class[j] for j in keep]
    class_relevant = [class_rel[j] for j in keep]
    # Calibrated once per view (the order within each list never changes; a mask only picks).
    relevance = relevance_maps(fit_view)
    maps = (relevance["native"], relevance["bridged"]) if calibration == "relevance" else NO_MAPS
    views = {"query": calibrated_pair(*qd, maps), "instance": calibrated_pair(*inst, maps)}
    del qd
    views["class"] = tuple(v[rows].copy() for v in views["instance"])
    for v in views["class"]:
        v[np.arange(len(rows)), sample[rows]] = -np.inf
    del inst
    # Orders over the whole gallery that do not depend on the merge rule.
    uncertainty = norm_uncertainty(torch.as_tensor(gallery), curv)
    known = labels >= 0
    knn = np.zeros(n)
    sub = np.flatnonzero(known)
    knn[sub] = knn_uncertainty(torch.as_tensor(gallery[sub]), labels[sub], curv).numpy()
    tie_break = rng.random(n) * 1e-9
    random_order = rng.permutation(n)
    none, every = np.zeros(n, bool), np.ones(n, bool)
    reindex = ranks_of(views["query"][0], rel)
    by_rule: dict[str, Any] = {}
    for rule in rules:
        fit_started = time.perf_counter()
        fit = fit_planner(fit_view, seed, rule=rule, calibration=calibration)
        fit_seconds = time.perf_counter() - fit_started
        r_new = ranks_of(mixed(*views["query"], every, rule), rel)
        r_old = ranks_of(mixed(*views["query"], none, rule), rel)
        true_gain = np.zeros(n)
        true_gain[sample] = discount(r_new) - discount(r_old)
        orders = {
            "plan": plan_order(plan_priority(fit, gallery_points, uncertainty)),
            "expected_gain": plan_order(fit.gain_model.predict(gallery_points)),
            "uncertainty (knn)": plan_order(knn + tie_break),
            "random": random_order,
            "oracle": plan_order(true_gain + tie_break),
        }
        results: dict[str, Any] = {}
        for name, order in orders.items():
            per = {}
            for fraction in CURVE_FRACTIONS:
                mask = np.zeros(n, dtype=bool)
                mask[order[: round(fraction * n)]] = True
                rq = ranks_of(mixed(*views["query"], mask, rule), rel)
                ri = ranks_of(mixed(*views["instance"], mask, rule), rel)
                rc = ranks_of(mixed(*views["class"], mask, rule), class_relevant) if rows else None
                per[str(fraction)] = {
                    "query R@10": float((rq < 10).mean()),
                    "query R@1": float((rq < 1).mean()),
                    "instance R@1": float((ri < 1).mean()),
                    "class CMC@1": float((rc < 1).mean()) if rc is not None else None,
                }
            results[name] = per
        by_rule[rule] = {
            "planner_fit_seconds": fit_seconds,
            "planner": {k: v for k, v in fit.to_dict().items() if k != "gain_model"},
            "results": results,
        }
    main_rule = by_rule[rules[0]]
    return {
        "seed": seed,
        "method": outcome.method,
        "merge_rule": rules[0],
        "calibration": calibration,
        "queries": len(sample),
        "class_queries": len(rows),
        "seconds": time.perf_counter() - started,
        "upgrade_seconds": trained_seconds,
        "reindex_r10": float((reindex < 10).mean()),
        "planner_fit_seconds": main_rule["planner_fit_seconds"],
        "planner": main_rule["planner"],
        "results": main_rule["results"],
        "by_rule": {r: v["results"] for r, v in by_rule.items()} if len(rules) > 1 else None,
    }


def time_planning(n_items: int, dim: int, reembedded: float = 0.1) -> float:
    """Seconds to plan a gallery of ``n_items`` points: predict every item's gain, drop the
    re-embedded ones, order the rest (median of 3)."""
    from app.ml.backfill.plan import GainModel

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


def validation_arrays(arrays, labels, seed: int):
    """The training synsets of ``seed``'s split alone (the evaluation synsets never enter a
    choice): the protocol is rerun inside them, ``VALIDATION_TRAIN_FRACTION`` for the upgrade."""
    n = arrays["doc_new"].shape[0]
    train = np.sort(np.random.default_rng(seed).permutation(n)[: round(TRAIN_FRACTION * n)])
    return {k: v[train] for k, v in arrays.items()}, labels[train]


def seed_job(
    seed,
    quick,
    validation,
    method,
    params,
    n_queries,
    rules,
    calibration,
    threads,
    arrays=None,
    labels=None,
) -> dict:
    """One seed's run (in a worker process with ``--jobs``: it loads the data itself)."""
    torch.set_num_threads(threads)
    if arrays is None:
        arrays = load_arrays(quick)
        labels = load_labels(quick, arrays["doc_new"].shape[0])
    fraction = TRAIN_FRACTION
    if validation:
        arrays, labels = validation_arrays(arrays, labels, seed)
        fraction = VALIDATION_TRAIN_FRACTION
    run = run_seed(arrays, labels, seed, method, params, n_queries, rules, fraction, calibration)
    run["n_items"] = len(arrays["doc_new"])
    print(
        f"[{time.strftime('%H:%M:%S')}] seed {seed}: {run['seconds']:.0f} s "
        f"(upgrade {run['method']} {run['upgrade_seconds']:.0f} s), planner "
        f"{run['planner']['estimator']} ({run['planner_fit_seconds']:.1f} s to fit)",
        flush=True,
    )
    return run


def publish_section(payload: dict) -> None:
    """Print the markdown and put it in BENCHMARKS.md (with the validation run, when saved)."""
    validation_path = RESULTS.with_name("backfill-validation.json")
    validation = json.loads(validation_path.read_text()) if validation_path.exists() else None
    markdown = render_markdown(payload, validation)
    print(markdown)
    replace_section(SECTION, "Partial backfill (bench.quality.backfill)", markdown)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="quality against the share re-embedded")
    parser.add_argument("--quick", action="store_true", help="the 800-synset fixture, < 1 min")
    parser.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; quick 0)")
    parser.add_argument(
        "--method", default=SERVED_METHOD, help="the upgrade's method (default: the service's)"
    )
    parser.add_argument(
        "--merge",
        default=MERGE_RULE,
        help=f"comma-separated merge rules of {list(MERGE_RULES)}; the first is reported",
    )
    parser.add_argument(
        "--calibration",
        default=CALIBRATION,
        choices=CALIBRATIONS,
        help="what the two lists are merged on (default: what the service serves)",
    )
    parser.add_argument(
        "--validation",
        action="store_true",
        help="rerun the protocol inside the training synsets only (to choose a setting)",
    )
    parser.add_argument("--queries", type=int, default=4000, help="evaluation queries per seed")
    parser.add_argument("--plan-items", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per seed")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once (processes)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--render",
        action="store_true",
        help="rewrite the BENCHMARKS.md section and the PNG from the saved full-run JSON",
    )
    args = parser.parse_args(argv)
    if args.render:
        payload = json.loads(RESULTS.read_text())
        plot(payload, RESULTS.with_suffix(".png"))
        publish_section(payload)
        return RESULTS
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    rules = args.merge.split(",")
    if unknown := [r for r in rules if r not in MERGE_RULES]:
        parser.error(f"unknown merge rules {unknown}, expected some of {list(MERGE_RULES)}")
    arrays = load_arrays(args.quick)
    n = arrays["doc_new"].shape[0]
    labels = load_labels(args.quick, n)
    params = {"epochs": 5} if args.quick and args.method != "procrustes" else {}
    started = time.time()
    settings = (
        args.quick,
        args.validation,
        args.method,
        params,
        args.queries,
        rules,
        args.calibration,
    )
    if args.jobs > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(
            min(args.jobs, len(seeds)), initializer=exit_with_parent, initargs=(os.getpid(),)
        ) as pool:
            runs = pool.starmap(seed_job, [(seed, *settings, args.threads) for seed in seeds])
    else:
        runs = [seed_job(seed, *settings, args.threads, arrays, labels) for seed in seeds]
    plan_items = 20_000 if args.quick else args.plan_items
    command = "python -m bench.quality.backfill" + (" --quick" if args.quick else "")
    command += " --validation" if args.validation else ""
    if args.seeds:
        command += f" --seeds {args.seeds}"
    if args.method != SERVED_METHOD:
        command += f" --method {args.method}"
    if args.merge != MERGE_RULE:
        command += f" --merge {args.merge}"
    if args.calibration != CALIBRATION:
        command += f" --calibration {args.calibration}"
    if args.queries != 4000:
        command += f" --queries {args.queries}"
    if args.jobs > 1:
        command += f" --jobs {args.jobs}"
    payload = {
        "command": command,
        "quick": args.quick,
        "validation": args.validation,
        "method": args.method,
        "chosen_methods": [r["method"] for r in runs],
        "rules": rules,
        "seeds": seeds,
        "n_items": runs[0]["n_items"],
        "queries_per_seed": runs[0]["queries"],
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
        "plan_items": plan_items,
        "plan_seconds_1m": time_planning(plan_items, arrays["doc_old"].shape[1]),
        "elapsed_minutes": (time.time() - started) / 60,
        "summary": summarise(runs),
        "runs": runs,
    }
    name = "backfill-quick" if args.quick else "backfill"
    name += "-validation" if args.validation else ""
    out = args.out or RESULTS.with_name(f"{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1))
    plot(payload, out.with_suffix(".png"))
    if args.validation:
        print(render_validation(payload))
    elif not args.quick and args.out is None:
        publish_section(payload)
    else:
        print(render_markdown(payload))
    print(out)
    return out


if __name__ == "__main__":
    main()
