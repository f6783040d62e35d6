"""Measuring retrieval as users meet it (``retrieval``: instance, query→document, class views),
compatibility metrics (``metrics``) and the uncertainty calibration of a report (``calibration``)."""
