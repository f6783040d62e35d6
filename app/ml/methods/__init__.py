"""The trainable bridges from a new backbone to an old embedding space: HBCT and the baselines
(``compat``), their heads, losses, uncertainty weights, the model format and trainer hooks."""
