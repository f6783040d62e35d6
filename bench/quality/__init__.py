"""Retrieval quality on real data: compat (+ its grid, report and --widen), querydoc (+ pairs),
backfill and continual (+ its task stream and report)."""
