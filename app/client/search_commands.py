"""The search and download client commands: ``search`` (results printed or written to
``.json``/``.npz``), ``export`` (a model file) and ``report`` (an upgrade's HTML report)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from app.client.client import Client
from app.client.command_io import CommandError, emit, load_npy
from app.client.results import SearchResults


def search(client: Client, args: argparse.Namespace) -> int:
    queries = load_npy(args.queries, "--queries")
    assert queries is not None
    if queries.ndim == 1:
        queries = queries[None, :]
    output = Path(args.output) if args.output else None
    if output is not None and output.suffix not in (".json", ".npz"):
        raise CommandError(f"-o {output}: write .json or .npz")
    old_queries = load_npy(args.old_queries, "--old-queries")
    if old_queries is not None:
        if args.model is None:
            raise CommandError("--old-queries: a transition search needs --model too")
        if old_queries.ndim == 1:
            old_queries = old_queries[None, :]
        if len(old_queries) != len(queries):
            raise CommandError(
                f"--old-queries has {len(old_queries)} rows, --queries {len(queries)}"
            )
    rerank = args.rerank or args.rerank_depth is not None
    if rerank and args.model is None:
        raise CommandError("--rerank: a two-stage search needs --model too")
    if args.rerank_depth is not None and args.rerank_depth < 1:
        raise CommandError("--rerank-depth: at least 1")
    found = client.search(
        args.gallery,
        queries,
        args.k,
        model_id=args.model,
        modality=args.modality,
        old_queries=old_queries,
        rerank_depth=args.rerank_depth,
        rerank=rerank,
    )
    for warning in found.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for report in found.reranks:
        if report.get("degraded"):
            print(
                f"warning: two-stage search degraded ({report['degraded']}): these results are "
                "the single-stage search",
                file=sys.stderr,
            )
    if output is not None:
        write_results(found, output)
    text = "\n".join(
        f"{i}\t" + "  ".join(f"{hit['id']} ({hit['distance']:.4f})" for hit in row)
        for i, row in enumerate(found.rows)
    )
    emit(args, found.to_dict(), text if output is None else f"wrote {output}")
    return 0


def write_results(found: SearchResults, path: Path) -> None:
    if path.suffix == ".json":
        path.write_text(json.dumps(found.to_dict()))
        return
    arrays = {"ids": found.ids, "distances": found.distances, "labels": found.labels}
    if found.scores is not None:
        arrays["scores"] = found.scores
    np.savez(path, **arrays)


def export(client: Client, args: argparse.Namespace) -> int:
    path = client.export_model(args.model, args.format, args.output)
    sys.stdout.write(f"wrote {path} ({Path(path).stat().st_size} bytes)\n")
    return 0


def report(client: Client, args: argparse.Namespace) -> int:
    path = client.report_html(args.upgrade, args.output)
    sys.stdout.write(f"wrote {path} ({Path(path).stat().st_size} bytes)\n")
    return 0
