"""Where a gallery's vectors live: one interface (``engine``), a small shared core (rows and scans,
the exact re-rank and its tie rule by id, the rules, id map and read-only base of attached
sources, SQL rows), one subpackage per engine (``faiss``, ``milvus``, ``qdrant``, ``pgvector``)
importing only the core, and ``storage``, the one module that picks a gallery's engine."""
