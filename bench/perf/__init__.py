"""Speed and memory: search, indexes, ingest, engines, load, api_memory, training, profile,
milvus_layouts (figures in BENCHMARKS.md with their commands, machines and load averages)."""
