"""FAISS: a gallery's exact hyperbolic index in this process (``index``), its cached files beside
the database (``index_store``), and the append-only segment files that hold the vectors of new
galleries (``segments``, their bytes in ``segment_format``). Imports only the shared core of
``app.vectors``."""
