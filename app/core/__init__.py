"""Foundation of the service: settings, the database session, errors (RFC 9457), limits, uploads,
idempotency, files. Imports no other package of the service."""
