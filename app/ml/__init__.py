"""Pure math and training, no I/O: Lorentz geometry, the compatibility methods (HBCT, HMCL and
the baselines), evaluation, backfill planning and the verdicts."""
