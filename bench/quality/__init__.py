"""Retrieval quality on real data: compat (+ its grid, scenarios and report), querydoc (+ pairs),
backfill and continual (+ its task stream and report)."""
