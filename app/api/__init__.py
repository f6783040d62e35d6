"""HTTP: one router per resource (thin: parsing and status codes), their dependencies, metrics."""
