"""NEW backbone features → query vectors for your OLD cosine gallery, from a `nobackfill export`."""

import json
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort


def query_vectors(model_zip: str, features: np.ndarray) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(model_zip) as bundle:
        bundle.extractall(tmp)  # manifest.json, model.onnx (+ model.onnx.data when large)
        manifest = json.loads(Path(tmp, "manifest.json").read_text())
        if manifest["search"]["kind"] != "cosine":
            raise ValueError(
                f"{manifest['model_id']} searches by {manifest['search']['kind']}, not by cosine "
                "on your untouched old vectors: see manifest.json's `search`"
            )
        graph = str(Path(tmp, manifest["graph"]))
        session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    features = np.asarray(features, dtype=np.float32).reshape(-1, manifest["input"]["dim"])
    output = manifest["search"]["query_output"]  # unit vectors: cosine-search them
    return session.run([output], {manifest["input"]["name"]: features})[0]
