"""Partial backfill, pure: the mixed search of a partly re-embedded gallery (``mixed``: its
calibration and merge), the plan of what to re-embed first (``plan``) and the planner's view of
an upgrade's held-out data (``fit``)."""
