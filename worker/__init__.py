"""The Celery worker process: receives upgrade jobs and runs ``app.upgrades.executor``."""
