"""bench.quality.querydoc_pairs: the logged-query pair ablation reads only the training synsets."""

import numpy as np

from bench.quality import querydoc, querydoc_pairs


def test_validation_synsets_come_from_the_training_part_only() -> None:
    n, seed = 1000, 3
    fit, val = querydoc_pairs.split(n, seed)
    perm = np.random.default_rng(seed).permutation(n)
    held_out = perm[n - int(np.floor(n * querydoc.EVAL_FRACTION)) :]
    assert not set(fit) & set(val)
    assert not (set(fit) | set(val)) & set(held_out)
    assert len(fit) + len(val) + len(held_out) == n


def test_quick_run_scores_every_variant() -> None:
    rows = querydoc_pairs.main(["--quick", "--seeds", "0"])
    assert [r["variant"] for r in rows] == list(querydoc_pairs.VARIANTS)
    assert all(0.0 <= r["recall@1"] <= r["recall@10"] <= 1.0 for r in rows)
    # The log changes what is learned: a map trained on both pairs is not the one without.
    assert len({(r["recall@1"], r["recall@10"]) for r in rows}) > 1
