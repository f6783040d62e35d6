"""Search: one entry for every query of a gallery (FAISS or Milvus, a model's frame map, mixed
search over re-embedded items when a gallery holds them)."""
