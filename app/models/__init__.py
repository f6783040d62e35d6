"""Trained models: their rows and artifact files, loading, embedding, lineage, ONNX export."""
