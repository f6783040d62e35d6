"""Upgrade jobs: validation, the method catalogue, training executors, runners (inline, thread,
Celery) and the report page."""
