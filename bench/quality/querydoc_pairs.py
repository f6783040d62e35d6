"""Which logged-query pairs should train the map: a validation-only ablation on lemma → gloss.

    python -m bench.quality.querydoc_pairs                # seeds 0 and 1, about 2 min per seed
    python -m bench.quality.querydoc_pairs --seeds 0 --quick

The split is ``bench.quality.querydoc``'s (40 % of synsets held out by the seed's permutation) and the
held-out part is never read: the training synsets are carved again by ``auto``'s own
``split_for_validation`` into fit and validation parts. ``instance-map`` (served defaults) is
trained on the fit glosses plus, per variant, the fit synsets' logged lemmas paired with

- ``none``: nothing (no query log);
- ``old vectors``: the lemma's old-model vector (the old query distribution);
- ``relevance``: the old vector of the relevant gloss (the search itself);
- ``both``: both pairs per query (what ``UpgradeContext.extra_pairs`` gives a log with both).

Scored: the validation synsets' lemmas (new model) against every old gloss vector, R@1 and R@10,
by cosine of tangent directions (the gallery is lifted at one radius, where that is the served
Lorentz ranking). Prints one JSON line per (seed, variant) and a mean table.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F

from app.ml.auto.candidates import split_for_validation
from app.ml.geometry.lorentz import log_map0
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.compat import train_compatible_model
from bench.quality.querydoc import EVAL_FRACTION, QUICK_PARAMS, load_arrays

VARIANTS = ("none", "old vectors", "relevance", "both")


def recall_at(model, queries: np.ndarray, relevant: np.ndarray, gallery: torch.Tensor) -> dict:
    with torch.no_grad():
        t = F.normalize(model.tangent(torch.from_numpy(queries)), dim=-1)
        top = torch.topk(t @ gallery.T, 10, dim=1).indices.numpy()
    hit = top == relevant[:, None]
    return {"recall@1": float(hit[:, 0].mean()), "recall@10": float(hit.any(1).mean())}


def split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit, validation) synsets: ``bench.quality.querydoc``'s training part, carved as ``auto`` does."""
    perm = np.random.default_rng(seed).permutation(n)
    train_idx = np.sort(perm[: n - int(np.floor(n * EVAL_FRACTION))])
    parts = split_for_validation(train_idx, seed)
    assert parts is not None
    return parts


def run_seed(arrays: dict[str, np.ndarray], seed: int, params: dict) -> list[dict]:
    fit, val = split(arrays["doc_new"].shape[0], seed)
    lift = EuclideanLift()
    doc_old = lift(torch.from_numpy(arrays["doc_old"])).numpy()
    query_old = lift(torch.from_numpy(arrays["query_old"])).numpy()
    gallery = F.normalize(log_map0(torch.from_numpy(doc_old), lift.curv), dim=-1)
    q_new = arrays["query_new"]
    pairs = {
        "old vectors": (q_new[fit], query_old[fit]),
        "relevance": (q_new[fit], doc_old[fit]),
    }
    pairs["both"] = tuple(np.concatenate([a, b]) for a, b in zip(*pairs.values(), strict=True))
    out = []
    for variant in VARIANTS:
        model = train_compatible_model(
            "instance-map",
            arrays["doc_new"][fit],
            doc_old[fit],
            None,
            lift.curv,
            params,
            seed=seed,
            extra_pairs=pairs.get(variant),
        )
        row = {"seed": seed, "variant": variant, **recall_at(model, q_new[val], val, gallery)}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--quick", action="store_true", help="the 800-synset fixture")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    arrays = load_arrays(args.quick)
    params = QUICK_PARAMS if args.quick else {}
    rows = [r for s in args.seeds.split(",") for r in run_seed(arrays, int(s), params)]
    print("\n| logged-query pairs | validation R@1 | validation R@10 |\n|---|---|---|")
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        r1, r10 = (np.mean([r[k] for r in mine]) for k in ("recall@1", "recall@10"))
        print(f"| {variant} | {r1:.3f} | {r10:.3f} |")
    return rows


if __name__ == "__main__":
    main()
