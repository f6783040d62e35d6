"""Serialisation of embedding models and the Euclidean lift of external galleries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from app.ml.geometry.lorentz import distance_to_origin, pairwise_lorentz_distance
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.models import EmbeddingModel, model_from_bytes, model_to_bytes


class _Scaled(EmbeddingModel):
    """A minimal real model used to exercise the base class."""

    kind = "test-scaled"

    def __init__(self, dim: int, curv: float = 1.0) -> None:
        super().__init__()
        self.dim, self.curv = dim, curv
        self.weight = nn.Parameter(torch.ones(dim))

    def get_config(self) -> dict:
        return {"dim": self.dim, "curv": self.curv}

    def input_dim(self, modality: str | None = None) -> int:
        self.resolve_modality(modality)
        return self.dim

    @property
    def output_dim(self) -> int:
        return self.dim

    def forward(self, features: Tensor, modality: str | None = None) -> Tensor:
        self.resolve_modality(modality)
        return features * self.weight


def test_model_round_trips_through_bytes(wordnet_small: dict) -> None:
    x = wordnet_small["gloss.all-MiniLM-L6-v2"][:10]
    model = _Scaled(384, curv=0.5)
    with torch.no_grad():
        model.weight.mul_(torch.linspace(0.5, 2.0, 384))
    restored = model_from_bytes(model_to_bytes(model))
    assert isinstance(restored, _Scaled) and restored.curv == 0.5
    np.testing.assert_array_equal(restored.embed(x), model.embed(x))
    assert model.embed(np.zeros((0, 384), np.float32)).shape == (0, 384)


def test_artifact_loading_refuses_garbage() -> None:
    with pytest.raises(Exception):  # noqa: B017 - torch raises several types for non-archives
        model_from_bytes(b"not a model")
    with pytest.raises(KeyError, match="unknown modality"):
        _Scaled(4).embed(np.zeros((1, 4), np.float32), modality="image")


def test_cosine_lift_keeps_old_rankings(wordnet_small: dict) -> None:
    old = torch.from_numpy(wordnet_small["gloss.all-MiniLM-L6-v2"]).double()
    lift = EuclideanLift(curv=1.0, scale=1.0)
    h = lift(old * torch.rand(len(old), 1, dtype=torch.float64) * 3)  # norms must not matter
    assert torch.allclose(distance_to_origin(h), torch.ones(len(old), dtype=torch.float64))
    unit = old / old.norm(dim=-1, keepdim=True)
    cos_rank = torch.argsort(-(unit[:20] @ unit.T), dim=1)[:, :10]
    lor_rank = torch.argsort(pairwise_lorentz_distance(h[:20], h), dim=1)[:, :10]
    assert torch.equal(cos_rank, lor_rank)


def test_lift_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        EuclideanLift(curv=0.0)
    with pytest.raises(ValueError):
        EuclideanLift(metric="l1")  # type: ignore[arg-type]
