"""Embedding models: backbone features → points on the Lorentz hyperboloid, and their serialisation.

Every model this project trains maps a backbone's features (per modality) to **space components**
of points on the hyperboloid of curvature ``-curv``; the gallery it is compatible with is stored in
the same frame, so search is Lorentz nearest-neighbour search. Serialisation is to bytes (the
service decides where they live) and loads with ``weights_only=True``: an artifact is data, never
code.
"""

from __future__ import annotations

import io
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

ARTIFACT_FORMAT = 1
MODEL_KINDS: dict[str, type[EmbeddingModel]] = {}
DEFAULT_MODALITY = "default"


class EmbeddingModel(nn.Module):
    """Base class: subclasses set ``kind``, take JSON-able constructor kwargs and return them from
    ``get_config``, and implement ``forward(features, modality)`` → space components."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            if cls.kind in MODEL_KINDS:
                raise ValueError(f"duplicate model kind {cls.kind!r}")
            MODEL_KINDS[cls.kind] = cls

    curv: float

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def modalities(self) -> tuple[str, ...]:
        return (DEFAULT_MODALITY,)

    def input_dim(self, modality: str | None = None) -> int:
        raise NotImplementedError

    @property
    def output_dim(self) -> int:
        raise NotImplementedError

    def resolve_modality(self, modality: str | None) -> str:
        """``None`` means the only modality; an unknown name is a ``KeyError`` naming the choices."""
        if modality is None:
            if len(self.modalities) != 1:
                raise KeyError(f"modality required, one of {list(self.modalities)}")
            return self.modalities[0]
        if modality not in self.modalities:
            raise KeyError(
                f"unknown modality {modality!r}, expected one of {list(self.modalities)}"
            )
        return modality

    def forward(self, features: Tensor, modality: str | None = None) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def embed(
        self, features: np.ndarray | Tensor, modality: str | None = None, batch_size: int = 16384
    ) -> np.ndarray:
        """Inference in eval mode, in batches, float32 in and out (numpy)."""
        was_training = self.training
        self.eval()
        try:
            x = torch.as_tensor(np.asarray(features, dtype=np.float32))
            device = next(self.parameters(), torch.empty(0)).device
            out = [
                self(x[i : i + batch_size].to(device), modality).float().cpu()
                for i in range(0, x.shape[0], batch_size)
            ]
            dim = self.output_dim
            return torch.cat(out).numpy() if out else np.zeros((0, dim), dtype=np.float32)
        finally:
            self.train(was_training)


def model_to_bytes(model: EmbeddingModel) -> bytes:
    """Serialise kind, config and weights (CPU tensors) into one ``torch.save`` blob."""
    buf = io.BytesIO()
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(
        {
            "format": ARTIFACT_FORMAT,
            "kind": model.kind,
            "config": model.get_config(),
            "state_dict": state,
        },
        buf,
    )
    return buf.getvalue()


def model_from_bytes(blob: bytes, map_location: str | torch.device = "cpu") -> EmbeddingModel:
    """Inverse of ``model_to_bytes``; refuses unknown formats and kinds."""
    payload = torch.load(io.BytesIO(blob), map_location=map_location, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != ARTIFACT_FORMAT:
        raise ValueError("not a nobackfill model artifact (unknown format)")
    kind = payload["kind"]
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}")
    model = MODEL_KINDS[kind](**payload["config"])
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model
