"""The migration's client commands (parsed in ``app.cli``): ``backfill plan`` (the next items to
re-embed, written to a ``.npy``), ``backfill upload`` (their new-backbone features, batched and
resumable) and ``upgrade list``. Run by ``app.client.commands.run`` like the other commands."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.client.client import Client
from app.client.commands import CommandError, emit, load_npy, upload_summary
from app.client.gallery_commands import upload_reembedded_rows


# -- backfill plan --------------------------------------------------------------------------------
def write_ids(path: str, ids: list[str]) -> None:
    """``ids`` as a 1-D ``.npy`` of strings at exactly ``path`` (``np.save`` given a name would
    add ``.npy`` to it), written whole or not at all (a temporary file renamed)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.save(handle, np.array(ids, dtype=str), allow_pickle=False)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def words(value: Any) -> str:
    """A response field the server may shape in several ways (``signals``: names, or a mapping
    of name to weight or details), in one line."""
    if isinstance(value, dict):
        return ", ".join(
            str(k) if v is None or v is True else f"{k} {words(v)}" for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return ", ".join(words(v) for v in value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def percent(fraction: float) -> str:
    """10%, 10.4%, 0.125%: as many digits as tell neighbouring shares apart."""
    return f"{100 * fraction:.3g}%"


def expected_lines(plan: dict[str, Any]) -> list[str]:
    """The expected curve of the search the user runs, per metric and labelled: the transition
    search's (both models' query vectors) where the plan has one — the README's workflow while
    the old model runs, and the figure ``gallery get`` quotes, interpolated the same way — else
    the bridged search's (features only). ``expected recall@10 (transition search): 0.610 at 10%
    → 0.640 at 13% → 0.700 at 100%``: now, once the planned items are re-embedded, and with
    everything re-embedded."""
    keys = {"metric", "fraction", "value"}
    transition = plan.get("transition_expected") or []
    source, label = (
        (transition, "transition search")
        if transition
        else (plan.get("expected") or [], "bridged search, features only")
    )
    points = [p for p in source if isinstance(p, dict) and keys <= p.keys()]
    if not points:
        return []
    now = plan.get("reembedded", 0) / plan["total"] if plan.get("total") else 0.0
    after = plan.get("fraction_after", now)
    parts = []
    for metric in dict.fromkeys(p["metric"] for p in points):
        curve = sorted((p["fraction"], p["value"]) for p in points if p["metric"] == metric)
        if transition:
            # Measured at a random share: read at the shares themselves, as gallery get does.
            xs, ys = zip(*curve, strict=True)
            shown = dict.fromkeys(
                (f, float(np.interp(f, xs, ys))) for f in (now, after, curve[-1][0])
            )
        else:

            def at(
                fraction: float, curve: list[tuple[float, float]] = curve
            ) -> tuple[float, float]:
                return min(curve, key=lambda point: abs(point[0] - fraction))

            shown = dict.fromkeys([at(now), at(after), curve[-1]])
        steps = [f"{value:.3f} at {percent(fraction)}" for fraction, value in shown]
        parts.append(f"expected {metric} ({label}): " + " → ".join(steps))
    return parts


def describe_plan(plan: dict[str, Any], gallery_id: str, output: str | None) -> str:
    ids = plan.get("ids") or []
    where = f" → {output}" if output else " (give -o FILE to write them)"
    model = plan.get("model_id", "?")
    lines = [f"{len(ids)} items to re-embed for {model}, most valuable first{where}"]
    total = plan.get("total")
    if total:
        done = plan.get("reembedded", 0)
        lines.append(
            f"gallery {gallery_id}: {done}/{total} re-embedded now, "
            f"{done + len(ids)}/{total} ({percent(plan.get('fraction_after', 0))}) once these are"
        )
    lines += expected_lines(plan)
    if plan.get("expected_note"):  # why the curve is not monotone, when it is not
        lines.append(f"  ({words(plan['expected_note'])})")
    how = [f"{k} {plan[k]}" for k in ("estimator", "view") if plan.get(k)]
    validation = {
        k: v
        for k, v in (plan.get("validation") or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    if validation:
        how.append(f"validation: {words(validation)}")
    if how:
        lines.append("planned by " + "; ".join(how))
    if plan.get("signals"):
        lines.append(f"signals: {words(plan['signals'])}")
    if plan.get("warning"):
        lines.append(f"warning: {words(plan['warning'])}")
    return "\n".join(lines)


def backfill_plan(client: Client, args: argparse.Namespace) -> int:
    plan = client.backfill_plan(args.gallery, args.model, fraction=args.fraction, count=args.count)
    if args.output:
        write_ids(args.output, [str(i) for i in plan.get("ids") or []])
    if args.json and plan.get("warning"):
        # Not lost when stdout goes to jq: the plan may be no better than a random order.
        sys.stderr.write(f"warning: {words(plan['warning'])}\n")
    emit(args, plan, describe_plan(plan, args.gallery, args.output))
    return 0


# -- backfill upload ------------------------------------------------------------------------------
def backfill_upload(client: Client, args: argparse.Namespace) -> int:
    ids = load_npy(args.ids, "--ids")
    features = load_npy(args.features, "--features")
    assert ids is not None and features is not None
    if len(ids) != len(features):
        raise CommandError(
            f"--ids {args.ids} holds {len(ids)} ids but --features {args.features} holds "
            f"{len(features)} rows: they must be the same items, in the same order "
            "(nothing was sent)"
        )
    result = upload_reembedded_rows(client, args, ids, features)
    progress_now = next(
        (
            p
            for p in client.get_gallery(args.gallery).get("reembedded") or []
            if p.get("model_id") == args.model
        ),
        None,
    )
    text = upload_summary(result, "re-embedded items")
    if progress_now is not None:
        text += (
            f"\nre-embedded for {args.model}: {progress_now['reembedded']}/"
            f"{progress_now['total']} ({progress_now['fraction']:.0%})"
        )
    emit(args, result | {"reembedded": progress_now}, text)
    return 0


# -- upgrade list ---------------------------------------------------------------------------------
def describe_upgrade_row(job: dict[str, Any]) -> str:
    fields = [job["id"], job["method"], job["status"], job.get("model_id") or "-"]
    fields += [f"dataset {job.get('dataset_id') or '-'}", f"created {job['created_at']}"]
    return "\t".join(fields)


def upgrade_list(client: Client, args: argparse.Namespace) -> int:
    jobs = sorted(client.upgrades(status=args.status), key=lambda job: str(job["created_at"]))
    text = "\n".join(describe_upgrade_row(job) for job in jobs)
    emit(args, {"items": jobs}, text or "no upgrades")
    return 0


# -- migrate GALLERY ------------------------------------------------------------------------------
def auto_fraction(report: dict[str, Any] | None) -> float:
    """The share ``--auto`` re-embeds, from the model's verdict: a transition's suggested share,
    a reindex's whole gallery; any other verdict advises no re-embed job (CommandError)."""
    verdict = (report or {}).get("recommendation") or {}
    action = verdict.get("action")
    if action == "transition" and isinstance(verdict.get("suggested_fraction"), int | float):
        return float(verdict["suggested_fraction"])
    if action == "reindex":
        return 1.0
    why = verdict.get("why") or "the upgrade has no verdict"
    advice = {
        "two-stage": "search with rerank: the migration then advances with traffic",
        "bridge": "search the old gallery with the bridge: nothing needs re-embedding",
        "stay": "keep the old model",
        "measure": "measure first: upload held-out queries and run the upgrade again",
    }.get(str(action), "see the upgrade's report")
    raise CommandError(
        f"--auto: the verdict is {action or 'missing'} ({why}); it advises no re-embed job "
        f"({advice}). Give --fraction to migrate anyway."
    )


def migrate_gallery(client: Client, args: argparse.Namespace) -> int:
    from app.client.commands import follow

    fraction = args.fraction
    if args.auto and fraction is None:
        model = client.get_model(args.model)
        report = (
            client.get_upgrade(model["upgrade_id"])["report"] if model.get("upgrade_id") else None
        )
        fraction = auto_fraction(report)
    job = client.reembed(
        args.gallery,
        args.model,
        fraction=fraction,
        order=args.order,
        batch_size=args.batch_size,
        items_per_minute=args.items_per_minute,
        idempotency_key=args.idempotency_key,
    )
    if args.no_wait:
        emit(args, job, f"{job['id']}\treembed {args.gallery} → {args.model}: {job['status']}")
        return 0
    return follow(client, args, job["id"], label="re-embed")


HANDLERS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "migrate_gallery": migrate_gallery,
    "backfill_plan": backfill_plan,
    "backfill_upload": backfill_upload,
    "upgrade_list": upgrade_list,
}
