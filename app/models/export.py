"""A trained model as a self-describing ONNX bundle for the user's own vector database.

Pure conversion (no HTTP, no database): a loaded ``EmbeddingModel`` and what the service knows
about it (``ExportTarget``) → the bytes of a zip holding ``model.onnx`` (its external data file
beside it when the weights are too large to inline), for an old space searched by the Lorentz
inner product also ``gallery.onnx`` (raw old vectors → the vectors to index), and
``manifest.json`` saying exactly what goes in, what comes out and how to search with it.

Why these outputs reproduce the service's ranking (app/vectors/faiss/index.py ranks by the exact
Lorentz distance d(q, x) = acosh(−c⟨q,x⟩_L)/√c, ⟨q,x⟩_L = q·x − q₀x₀):

- cosine gallery: every stored vector f is lifted to x = exp₀(s·f/‖f‖), so ‖x‖ = R =
  sinh(√c·s)/√c and x₀ = cosh(√c·s)/√c are the same for all of them. For one query q,
  −c⟨q,x⟩_L = c(q₀x₀ − ‖q‖R·cos(q, f)) is decreasing in cos(q, f) alone: nearest by distance ==
  largest cosine between the model's point q and the *raw* stored vector f. The graph outputs
  q/‖q‖ (any positive multiple ranks the same).
- otherwise (dot galleries, model-bound galleries): d is increasing in −⟨q,x⟩_L, and
  ⟨q,x⟩_L = q̃·x̃ with q̃ = (−q₀, q) and x̃ = (x₀, x): the graph outputs q̃, the gallery side x̃.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from app.core.files import sha256_hex
from app.ml.geometry.lorentz import lift_for_index, lift_query
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.models import EmbeddingModel

EXPORT_FORMATS: tuple[str, ...] = ("onnx",)
MANIFEST_VERSION = 1
# Default opset of torch's dynamo exporter in torch 2.13 (Sinh/Cosh/Asinh and every op the heads
# use are in the standard domain since opset 9): onnxruntime ≥ 1.14 runs it.
OPSET = 18
INPUT_NAME = "features"
GALLERY_INPUT_NAME = "vectors"
# Weights above this size go to an external data file (protobuf refuses messages over 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30
# torch.export traces through global state: one export at a time per process.
_EXPORT_LOCK = threading.Lock()

# How a search with the exported outputs reproduces the service's ranking.
COSINE, LORENTZ_INNER = "cosine", "lorentz-inner-product"


@dataclass(frozen=True)
class ExportTarget:
    """What the service knows about the model being exported (from its database row)."""

    model_id: str
    kind: str  # backbone | continual
    method: str
    modality: str
    input_dim: int
    output_dim: int
    curv: float
    # Backbone models: the old space (its model_name, dim and lift {curv, scale, metric}).
    space_model_name: str | None = None
    space_dim: int | None = None
    lift: dict[str, Any] | None = None

    @property
    def search_kind(self) -> str:
        if self.lift is not None and self.lift.get("metric") == "cosine":
            return COSINE
        return LORENTZ_INNER


class _QueryGraph(nn.Module):
    """features → (query, point[, item]) for one modality of the model."""

    def __init__(self, model: EmbeddingModel, modality: str, search_kind: str, own_frame: bool):
        super().__init__()
        self.model, self.modality = model, modality
        self.search_kind, self.own_frame = search_kind, own_frame
        self.curv = float(model.curv)

    def forward(self, features: Tensor) -> tuple[Tensor, ...]:
        point = self.model(features, self.modality)
        if self.search_kind == COSINE:
            # A point at the origin has no direction; the clamp keeps it at 0 instead of NaN.
            norm = torch.linalg.vector_norm(point, dim=-1, keepdim=True)
            return point / torch.clamp(norm, min=1e-12), point
        query = lift_query(point, self.curv)
        if self.own_frame:
            return query, point, lift_for_index(point, self.curv)
        return query, point


class _GalleryGraph(nn.Module):
    """Raw old vectors f → x̃ = (x₀, x) with x = exp₀(s·f) (the service's lift of the space)."""

    def __init__(self, lift: EuclideanLift) -> None:
        super().__init__()
        self.lift = lift

    def forward(self, vectors: Tensor) -> Tensor:
        return lift_for_index(self.lift(vectors), self.lift.curv)


def _export(
    module: nn.Module,
    input_dim: int,
    input_name: str,
    output_names: list[str],
    directory: Path,
    filename: str,
    external_data_bytes: int,
) -> list[Path]:
    """Export with a dynamic batch axis into ``directory``; returns the files written."""
    module.eval()
    weights = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    sample = torch.zeros(3, input_dim, dtype=torch.float32)
    with _EXPORT_LOCK, torch.no_grad():
        program = torch.onnx.export(
            module,
            (sample,),
            dynamo=True,
            input_names=[input_name],
            output_names=output_names,
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            opset_version=OPSET,
            verbose=False,
        )
    before = set(directory.iterdir())
    program.save(directory / filename, external_data=weights > external_data_bytes)
    return sorted(set(directory.iterdir()) - before)


def _lift_text(lift: dict[str, Any]) -> str:
    c, s = lift["curv"], lift["scale"]
    v = "s*f/|f|" if lift["metric"] == "cosine" else "s*f"
    return (
        f"x = exp0(v) = sinh(sqrt(c)*|v|) * v / (sqrt(c)*|v|) with v = {v}, c = {c}, s = {s}; "
        "x0 = sqrt(1/c + |x|^2) = cosh(sqrt(c)*|v|)/sqrt(c)"
    )


def _search_section(target: ExportTarget, own_frame: bool) -> dict[str, Any]:
    c = target.curv
    if target.search_kind == COSINE:
        radius = math.sinh(math.sqrt(c) * target.lift["scale"]) / math.sqrt(c)
        return {
            "kind": COSINE,
            "query_output": "query",
            "index": "the old vectors exactly as stored in the gallery (raw; any norm)",
            "similarity": "cosine(query, old_vector); larger is nearer",
            "reproduces": "the service's ranking (POST /v1/galleries/{id}/search with this "
            "model_id) and its hit `score`, which is this cosine",
            "why": "the service lifts a cosine gallery's vector f to x = exp0(s*f/|f|): every "
            f"stored point has |x| = R = sinh(sqrt(c)*s)/sqrt(c) = {radius!r}, so the Lorentz "
            "distance to the model's point q, acosh(c*(q0*x0 - |q|*R*cos(q, f)))/sqrt(c), is "
            "decreasing in cos(q, f) alone",
            "distance_from_score": "d = acosh(c*(q0*x0 - |point|*R*score))/sqrt(c) with "
            "q0 = sqrt(1/c + |point|^2), x0 = sqrt(1/c + R^2) (`point` output)",
        }
    if own_frame:
        index = (
            "the `item` output of this same graph for each gallery item's features: "
            "(x0, x) with x the model's point, x0 = sqrt(1/c + |x|^2) (a model-bound gallery "
            "of this model stores x; GET /v1/galleries/{id}/vectors returns it)"
        )
    else:
        index = (
            "(x0, x) per old vector f: the output `item` of gallery.onnx, or computed as "
            + _lift_text(target.lift)
        )
    return {
        "kind": LORENTZ_INNER,
        "query_output": "query",
        "index": index,
        "similarity": "inner product query·item = <q,x>_L = q·x - q0*x0 (≤ -1/c); larger is nearer",
        "reproduces": "the service's ranking and its hit `score`, which is this inner product",
        "distance_from_score": "d = acosh(-c*score)/sqrt(c)",
        "precision": "float32 inner products cancel far from the origin; the service re-ranks "
        "an over-fetched candidate list in float64 with d above, do the same if radii exceed ~8",
    }


def build_manifest(target: ExportTarget, files: dict[str, str]) -> dict[str, Any]:
    own_frame = target.kind != "backbone"
    d = target.output_dim
    query_dim = d if target.search_kind == COSINE else d + 1
    query_text = (
        "point/|point|: the direction of the model's point (unit norm)"
        if target.search_kind == COSINE
        else "(-x0, point) with x0 = sqrt(1/c + |point|^2): the lifted query, time coordinate "
        "first and negated"
    )
    outputs = [
        {"name": "query", "dim": query_dim, "description": query_text},
        {
            "name": "point",
            "dim": d,
            "description": "space components of the model's point on the hyperboloid "
            "(what POST /v1/models/{id}/embed returns as `embeddings`)",
        },
    ]
    if own_frame:
        outputs.append(
            {
                "name": "item",
                "dim": d + 1,
                "description": "(x0, point): the vector to index for items embedded by this model",
            }
        )
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "format": "onnx",
        "opset": OPSET,
        "model_id": target.model_id,
        "kind": target.kind,
        "method": target.method,
        "modality": target.modality,
        "graph": "model.onnx",
        "input": {
            "name": INPUT_NAME,
            "dim": target.input_dim,
            "dtype": "float32",
            "shape": ["batch", target.input_dim],
            "description": "the NEW backbone's features (what POST /v1/models/{id}/embed takes "
            "as `features`)",
        },
        "output": outputs[0],
        "outputs": outputs,
        "curv": target.curv,
        "space": None,
        "search": _search_section(target, own_frame),
        "files": files,
    }
    if target.kind == "backbone":
        manifest["space"] = {
            "model_name": target.space_model_name,
            "dim": target.space_dim,
            "metric": target.lift["metric"],
            "lift": dict(target.lift),
        }
        manifest["compatible_with"] = (
            "every external gallery of the old space (same model_name, dim, metric and lift)"
        )
    else:
        manifest["compatible_with"] = (
            f"items embedded by this model version ({target.model_id}, modality "
            f"{target.modality!r}); galleries bound to older versions need the service "
            "(queries enter their frames through the recorded rotations)"
        )
    if target.search_kind == LORENTZ_INNER and not own_frame:
        manifest["gallery_graph"] = {
            "file": "gallery.onnx",
            "input": {"name": GALLERY_INPUT_NAME, "dim": target.space_dim, "dtype": "float32"},
            "output": {"name": "item", "dim": d + 1},
            "description": "raw old vectors → the vectors to index: " + _lift_text(target.lift),
        }
    return manifest


def export_onnx(
    model: EmbeddingModel, target: ExportTarget, *, external_data_bytes: int = EXTERNAL_DATA_BYTES
) -> bytes:
    """The zip (bytes) described in the module docstring."""
    own_frame = target.kind != "backbone"
    if target.kind == "backbone" and (target.lift is None or target.space_dim is None):
        raise ValueError("a backbone model needs the lift and dimension of its old space")
    outputs = ["query", "point"] + (["item"] if own_frame and target.search_kind != COSINE else [])
    graph = _QueryGraph(model, target.modality, target.search_kind, own_frame)
    with tempfile.TemporaryDirectory(prefix="nobackfill-export-") as tmp:
        directory = Path(tmp)
        written = _export(
            graph,
            target.input_dim,
            INPUT_NAME,
            outputs,
            directory,
            "model.onnx",
            external_data_bytes,
        )
        if target.search_kind == LORENTZ_INNER and not own_frame:
            lift = EuclideanLift.from_dict(target.lift)
            written += _export(
                _GalleryGraph(lift),
                target.space_dim,
                GALLERY_INPUT_NAME,
                ["item"],
                directory,
                "gallery.onnx",
                external_data_bytes,
            )
        blobs = {path.name: path.read_bytes() for path in written}
    manifest = build_manifest(target, {name: sha256_hex(b) for name, b in sorted(blobs.items())})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", json.dumps(manifest, indent=2) + "\n")
        for name, blob in sorted(blobs.items()):
            archive.writestr(name, blob)
    return buf.getvalue()
