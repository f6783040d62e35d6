"""Centred orthogonal Procrustes with a bias (issue 42 item 2): on real embedding rows mapped by a
known rotation × scale + offset, the centred fit recovers the map and the uncentred one (through
the origin, no bias) does not; the procrustes adapter serves it under ``centred``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.geometry.lorentz import exp_map0
from app.ml.methods.compat import CompatParams, fit_procrustes_adapter, train_compatible_model
from app.ml.methods.heads import centred_orthogonal_procrustes, orthogonal_procrustes
from bench.common.wordnet import OLD_MODEL

SCALE = 0.7


@pytest.fixture(scope="module")
def known_map(wordnet_small: dict) -> dict[str, torch.Tensor]:
    """Source: the fixture's 800 real 384-d gloss vectors; target = SCALE · source · Q + offset,
    Q a seeded random orthogonal matrix, the offset a seeded random vector of norm 0.5 (each
    target row's norm is about 0.7)."""
    source = torch.as_tensor(wordnet_small[f"gloss.{OLD_MODEL}"], dtype=torch.float64)
    generator = torch.Generator().manual_seed(42)
    dim = source.shape[1]
    rotation, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    offset = torch.randn(dim, generator=generator, dtype=torch.float64)
    offset = 0.5 * offset / offset.norm()
    target = SCALE * source @ rotation + offset
    return {"source": source, "target": target, "rotation": rotation, "offset": offset}


def _relative_residual(fitted: torch.Tensor, target: torch.Tensor) -> float:
    return float((fitted - target).norm() / target.norm())


def test_the_centred_fit_recovers_rotation_scale_and_offset(known_map: dict) -> None:
    source, target = known_map["source"], known_map["target"]
    w, scale, bias = centred_orthogonal_procrustes(source, target)
    # The centred rows span 381 of the 384 dimensions: W is Q on that span (elsewhere it is not
    # determined by the data and maps nothing).
    centred = source - source.mean(dim=0)
    assert torch.allclose(centred @ w, centred @ known_map["rotation"], atol=1e-8)
    assert scale == pytest.approx(SCALE, rel=1e-10)
    assert torch.allclose(bias, known_map["offset"], atol=1e-8)
    assert _relative_residual(scale * source @ w + bias, target) < 1e-6


def test_the_uncentred_fit_does_not(known_map: dict) -> None:
    """Through the origin, the offset is left in the residual and bends W and s."""
    source, target = known_map["source"], known_map["target"]
    w, scale = orthogonal_procrustes(source, target)
    assert _relative_residual(scale * source @ w, target) > 0.3
    assert abs(scale - SCALE) > 0.05


def test_the_adapter_serves_the_centred_map(known_map: dict) -> None:
    """``fit_procrustes_adapter(centred=True)``: the head's tangent α·(x P + bias) is the target
    (float32); the uncentred adapter keeps a zero bias and misses it."""
    source = known_map["source"].float()
    target = known_map["target"].float()
    old_points = exp_map0(target, 1.0)
    centred = fit_procrustes_adapter(source, old_points, 1.0, centred=True)
    with torch.no_grad():
        assert _relative_residual(centred.tangent(source), target) < 1e-4
        plain = fit_procrustes_adapter(source, old_points, 1.0)
        assert torch.count_nonzero(plain.bias) == 0
        assert _relative_residual(plain.tangent(source), target) > 0.3


def test_the_procrustes_method_reads_centred(known_map: dict) -> None:
    source = known_map["source"].numpy().astype(np.float32)
    old_points = exp_map0(known_map["target"].float(), 1.0).numpy()
    params = CompatParams.for_method("procrustes", {"centred": True})
    model = train_compatible_model("procrustes", source, old_points, None, 1.0, params)
    default = train_compatible_model("procrustes", source, old_points, None, 1.0, None)
    assert torch.count_nonzero(model.bias) > 0
    assert torch.count_nonzero(default.bias) == 0
    with pytest.raises(ValueError, match="centred"):
        CompatParams.for_method("affine", {"centred": True})
    with pytest.raises(ValueError, match="centred"):
        CompatParams.from_dict({"centred": 1})
