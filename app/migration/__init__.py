"""Migrating a gallery to a new model while the old one serves: re-embedded items beside the old
vectors, the plan of what to re-embed first, progress, and the mixed search over both."""
