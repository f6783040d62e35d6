"""Embedders: the new backbone's embedding endpoints a tenant registers, and the client that
calls them (OpenAI-compatible embeddings protocol), guarded by a circuit and a budget."""
