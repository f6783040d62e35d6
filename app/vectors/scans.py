"""Scan kernels of a flat gallery: the rows with the largest inner products with each query,
by torch's (blocked) matrix product or by FAISS's flat scan over rows read in place. Pure."""

from __future__ import annotations

import faiss
import numpy as np
import torch

# Float32 scores the exact scan holds at once (queries × gallery rows): 64 MiB.
SCAN_BUDGET = 2**24


def top_inner_products(
    gallery: torch.Tensor, queries: torch.Tensor, m: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Row positions of the ``m`` largest inner products per query, best first (nq × m, int64).
    ``bias`` (N float32, 0 or −inf): added to every query's scores inside the product (addmm:
    no extra pass over the score matrix, which a mask would cost), so rows at −inf are never
    among the best (``m`` must not exceed the rows at 0).

    ``gallery`` (N × D) and ``queries`` (nq × D) are float32 on one device. The gallery is
    scanned in blocks so that the score matrix stays within ``SCAN_BUDGET`` values: one query
    is a single matrix-vector pass (bound by memory bandwidth), a batch a blocked matrix product
    (bound by the FLOP rate) whose per-block best are merged at the end.
    """
    n = gallery.shape[0]
    nq = queries.shape[0]
    block = max(m, SCAN_BUDGET // max(nq, 1))
    if n <= block:
        scores = queries @ gallery.T if bias is None else torch.addmm(bias, queries, gallery.T)
        return torch.topk(scores, m, dim=1, sorted=True).indices
    best_scores, best_positions = [], []
    for start in range(0, n, block):
        part = gallery[start : start + block]
        scores = (
            queries @ part.T
            if bias is None
            else torch.addmm(bias[start : start + block], queries, part.T)
        )
        top = torch.topk(scores, min(m, scores.shape[1]), dim=1, sorted=False)
        best_scores.append(top.values)
        best_positions.append(top.indices + start)
    merged = torch.topk(torch.cat(best_scores, dim=1), m, dim=1, sorted=True).indices
    return torch.gather(torch.cat(best_positions, dim=1), 1, merged)


def flat_scan(
    rows: np.ndarray, queries: np.ndarray, m: int, bitmap: np.ndarray | None = None
) -> np.ndarray:
    """Row positions of the ``m`` largest inner products per query, best first (nq × m, −1
    padded): FAISS's flat scan (``knn_inner_product``, the kernel of ``IndexFlatIP.search``) over
    ``rows`` (N × D float32) read in place. ``bitmap`` (FAISS's little-endian bit per row): rows
    whose bit is 0 are skipped by the scan itself."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    n, dim = rows.shape
    nq = len(queries)
    scores = np.empty((nq, m), dtype=np.float32)
    labels = np.empty((nq, m), dtype=np.int64)
    selector = None if bitmap is None else faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap))
    faiss.knn_inner_product(
        faiss.swig_ptr(queries),
        faiss.swig_ptr(rows),
        dim,
        nq,
        n,
        m,
        faiss.swig_ptr(scores),
        faiss.swig_ptr(labels),
        selector,
    )
    return labels
