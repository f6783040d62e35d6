"""Check the metric code against the reference figures of the WordNet-noun data's README.

    python -m bench.data.reference_figures          # needs the full data (make data, or ../shared)

The data README gives figures computed outside this project: class-level CMC@1 / mAP@100 (both
normalisations) and lemma → gloss R@1 / R@10 for stay, reindex and a Procrustes bridge. This
command recomputes each with the service's metric code and exits 1 if any differs. It is a check
of the data and the metrics at full size, so it lives with the benchmarks: the tests run the same
metric code on the committed fixtures and never read the full data. ``.ci/run`` runs it when the
data is beside the checkout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from app.ml.evaluation.metrics import retrieval_metrics
from app.ml.evaluation.retrieval import class_metrics, query_metrics, top_k
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.heads import orthogonal_procrustes
from bench.common.wordnet import (
    NEW_MODEL,
    OLD_MODEL,
    encode_labels,
    fine_labels,
    load_wordnet,
    split_indices,
)

# (what, figure computed here, the README's figure, tolerance). The README ranked in float32: a
# tie-level difference moves a lemma → gloss R@1 by a query or two (1.5e-3); rounded to 3 places
# everywhere else.
Check = tuple[str, float, float, float]
ROUNDED = 5e-4


def class_checks(data_dir: Path | None) -> list[Check]:
    """The README's class-level protocol: fine labels, 60/40 split, the test set as query and
    gallery, the query itself excluded."""
    data = load_wordnet(data_dir, fields=("gloss",))
    keep, names = fine_labels(data.meta)
    labels, classes = encode_labels(names)
    train, test = split_indices(len(keep))
    old = data.get("gloss", OLD_MODEL)[keep]
    new = data.get("gloss", NEW_MODEL)[keep]
    lift = EuclideanLift()
    old_points = lift(torch.from_numpy(old[test])).numpy()
    found = retrieval_metrics(old_points, old_points, labels[test], 1.0)
    w, _ = orthogonal_procrustes(torch.from_numpy(new[train]), torch.from_numpy(old[train]))
    mapped = lift(torch.from_numpy(new[test]) @ w).numpy()
    bridged = retrieval_metrics(mapped, old_points, labels[test], 1.0)
    old_min = class_metrics(old_points, old_points, labels[test])["map@100"]
    raw_min = class_metrics(new[test], new[test], labels[test], space="cosine")["map@100"]
    return [
        ("items kept", len(keep), 21836, 0),
        ("classes kept", len(classes), 147, 0),
        ("old→old CMC@1", found.cmc1, 0.599, ROUNDED),
        ("old→old mAP@100 (found)", found.map_at_k, 0.489, ROUNDED),
        ("Procrustes new→old CMC@1", bridged.cmc1, 0.636, ROUNDED),
        ("Procrustes new→old mAP@100 (found)", bridged.map_at_k, 0.519, ROUNDED),
        ("old→old mAP@100 (min(relevant, 100))", old_min, 0.265, ROUNDED),
        ("raw new→new mAP@100 (min(relevant, 100))", raw_min, 0.323, ROUNDED),
    ]


def query_checks(data_dir: Path | None) -> list[Check]:
    """Lemma → gloss over all synsets: held-out lemmas against every gloss."""
    data = load_wordnet(data_dir, fields=("gloss", "lemma"))
    lift = EuclideanLift()
    gloss_old, gloss_new = data.get("gloss", OLD_MODEL), data.get("gloss", NEW_MODEL)
    lemma_old, lemma_new = data.get("lemma", OLD_MODEL), data.get("lemma", NEW_MODEL)
    train, test = split_indices(len(gloss_old))
    gallery = lift(torch.from_numpy(gloss_old)).numpy()
    relevant = [np.array([i]) for i in test]
    stay = query_metrics(
        top_k(lift(torch.from_numpy(lemma_old[test])).numpy(), gallery, 100), relevant
    )
    reindex = query_metrics(top_k(lemma_new[test], gloss_new, 100, space="cosine"), relevant)
    w, _ = orthogonal_procrustes(
        torch.from_numpy(gloss_new[train]), torch.from_numpy(gloss_old[train])
    )
    bridged = lift(torch.from_numpy(lemma_new[test]) @ w).numpy()
    procrustes = query_metrics(top_k(bridged, gallery, 100), relevant)
    tie = 1.5e-3
    return [
        ("stay R@1", stay["recall@1"], 0.260, ROUNDED),
        ("stay R@10", stay["recall@10"], 0.492, ROUNDED),
        ("reindex R@1", reindex["recall@1"], 0.305, tie),
        ("reindex R@10", reindex["recall@10"], 0.571, tie),
        ("Procrustes R@1", procrustes["recall@1"], 0.198, tie),
        ("Procrustes R@10", procrustes["recall@10"], 0.440, tie),
    ]


CHECKS: dict[str, Callable[[Path | None], list[Check]]] = {
    "class": class_checks,
    "query": query_checks,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    failed = 0
    for group, run in CHECKS.items():
        for what, got, want, tol in run(args.data_dir):
            ok = abs(got - want) <= tol
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {group}: {what} = {got:.4f} (README {want})")
    print(f"{failed} of the data README's figures differ" if failed else "all figures agree")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
