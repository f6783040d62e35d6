"""Job records: the upgrade job row, the truth for status and progress (queues are transport)."""
