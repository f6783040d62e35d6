"""Qdrant: a collection of its owner's attached read-only as a gallery (``source`` says where,
``storage`` reads and searches it, ``texts`` reads its document texts), and an in-place
migration's named vector of its points (``named``). Imports only the shared core of
``app.vectors``."""
