"""``auto``: a small set of candidates, each tuned on validation, picked by the objective
(``candidates``), and the verdict an upgrade report ends with (``verdict``)."""
