"""pgvector: a PostgreSQL table with a ``vector`` or ``halfvec`` column attached read-only as a
gallery (``source`` says where, ``storage`` reads it and searches it). Imports only the shared
core of ``app.vectors``; needs any PostgreSQL with pgvector reachable by DSN, nothing else."""
