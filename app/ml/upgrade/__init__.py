"""A backbone upgrade as the service runs it (``run``): its inputs and outcome (``data``), the
training and measuring (``pipeline``) and every alternative measured on one evaluation set
(``alternatives``)."""
