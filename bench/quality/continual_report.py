"""The continual benchmark's targets (issue 13), judged on 95 % intervals over seeds (issue 26),
and its markdown tables."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.ml.hmcl.metrics import DRIFT_MEASURES
from bench.common.machine import uncommitted_phrase
from bench.common.stats import t_interval
from bench.quality.continual_stream import HELD_BACK

KIND_METRIC = {"retrieval": "recall@5 (symmetric text↔gloss)", "classification": "accuracy"}
# Issue 13's targets for hmcl-ca.
RETENTION_MIN = 0.95
BWT_MIN = -0.02
TASK_END_RATIO_MIN = {"retrieval": 0.98, "classification": 0.95}
STEP_RATIO_MAX = 1.05
STEP_DIM = "768"


def summarise(per_seed: Mapping[str, list[dict]]) -> dict[str, Any]:
    """Every scalar figure per method (keys joined by dots): its per-seed values (in seed order),
    mean, sd and 95 % Student-t interval over seeds (low, high; NaN for one seed)."""

    def flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
        out = {}
        for k, v in d.items():
            if isinstance(v, Mapping):
                out.update(flat(v, f"{prefix}{k}."))
            elif isinstance(v, float | int) and not isinstance(v, bool):
                out[f"{prefix}{k}"] = float(v)
        return out

    summary = {}
    for method, runs in per_seed.items():
        flats = [flat(r) for r in runs]
        summary[method] = {}
        for k in flats[0]:
            values = [f[k] for f in flats]
            mean, low, high = t_interval(values)
            summary[method][k] = {
                "mean": mean,
                "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                "low": low,
                "high": high,
                "values": values,
            }
    return summary


def _at_least(
    name: str, values: Sequence[float], threshold: float, strict: bool = False
) -> dict[str, Any]:
    """A ≥ target judged on the 95 % interval of ``values``: met when its low end clears the
    threshold (``strict``: lies above it); margin = low end − threshold (NaN for one seed)."""
    mean, low, high = t_interval(values)
    met = low > threshold if strict else low >= threshold  # NaN (one seed): never met
    return {
        "target": name,
        "mean": mean,
        "low": low,
        "high": high,
        "seeds": len(values),
        "threshold": threshold,
        "met": bool(met),
        "margin": low - threshold,
    }


def targets(summary: Mapping[str, Any], timing: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Issue 13's targets for ``hmcl-ca``, each met only when the 95 % interval over seeds
    clears its threshold; the margin is the distance of the interval's low end from it
    (positive: met by that much; negative: missed by that much). A comparison with fine-tuning
    is judged on the per-seed comparison (difference or ratio, both runs of a seed on the same
    split), its interval over seeds. The step-time target is one timing measurement (median
    over interleaved rounds), not a figure over seeds."""
    out: list[dict[str, Any]] = []
    ca, ft = summary.get("hmcl-ca"), summary.get("finetune")
    if ca is None or ft is None:
        return out

    def values(s: Mapping[str, Any], key: str) -> list[float] | None:
        return s[key]["values"] if key in s else None

    for kind in ("retrieval", "classification"):
        kept = values(ca, f"no_backfill.{kind}.recorded_rotation")
        if kept is not None:
            name = f"{kind}: no-backfill retention (recorded rotation) ≥ {RETENTION_MIN}"
            out.append(_at_least(name, kept, RETENTION_MIN))
        bwt, ft_bwt = values(ca, f"by_kind.{kind}.bwt"), values(ft, f"by_kind.{kind}.bwt")
        if bwt is not None:
            out.append(_at_least(f"{kind}: backfilled BWT ≥ {BWT_MIN}", bwt, BWT_MIN))
        if bwt is not None and ft_bwt is not None:
            name = (
                f"{kind}: backfilled BWT above fine-tuning's (per-seed difference > 0; "
                f"fine-tuning's mean {np.mean(ft_bwt):+.4f})"
            )
            gain = [a - b for a, b in zip(bwt, ft_bwt, strict=True)]
            out.append(_at_least(name, gain, 0.0, strict=True))
        end, ft_end = values(ca, f"by_kind.{kind}.task_end"), values(ft, f"by_kind.{kind}.task_end")
        if end is not None and ft_end is not None and all(ft_end):
            need = TASK_END_RATIO_MIN[kind]
            name = f"{kind}: task-end {KIND_METRIC[kind]} ≥ {need} × fine-tuning's (per-seed ratio)"
            ratios = [a / b for a, b in zip(end, ft_end, strict=True)]
            out.append(_at_least(name, ratios, need))
    if STEP_DIM in timing:
        ratio = timing[STEP_DIM]["hmcl-ca"]["ratio_median"]
        out.append(
            {
                "target": f"CA step ≤ {STEP_RATIO_MAX} × an AdamW step at d = {STEP_DIM} "
                "(median over timed rounds, not over seeds)",
                "mean": ratio,
                "low": math.nan,
                "high": math.nan,
                "seeds": 1,
                "threshold": STEP_RATIO_MAX,
                "met": ratio <= STEP_RATIO_MAX,
                "margin": STEP_RATIO_MAX - ratio,
            }
        )
    return out


def verdict(target: Mapping[str, Any]) -> str:
    """ "met by X" / "missed by X" (X: the interval bound's distance from the threshold)."""
    margin = target["margin"]
    if math.isnan(margin):
        return f"not judged: no interval from {target['seeds']} seed"
    return f"met by {margin:.4f}" if target["met"] else f"missed by {-margin:.4f}"


def _pm(stat: Mapping[str, float], scale: float = 1.0, digits: int = 3) -> str:
    """The mean and its 95 % interval over seeds (the mean alone for one seed)."""
    mean = f"{stat['mean'] * scale:.{digits}f}"
    if math.isnan(stat["low"]):
        return mean
    return f"{mean} [{stat['low'] * scale:.{digits}f}, {stat['high'] * scale:.{digits}f}]"


def _setting(setting: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in setting.items()
    )


def timing_lines(timing: Mapping[str, Any]) -> list[str]:
    """One table per width: each method's step time and its ratio to plain AdamW."""
    lines: list[str] = []
    for dim, t in timing.items():
        lines += [
            "",
            f"Per-step time at d = {dim} (one AdamW step on a mini-batch of {t['rows']} of task "
            f"2's training pairs, task 1 protected; {t['repeats']} interleaved rounds in a fresh "
            "random order; ratio = median over rounds of method / plain AdamW in the same round):",
            "",
            "| method | step ms (median) | correction ms (median) | ratio to AdamW (median, IQR) |",
            "|---|---|---|---|",
        ]
        for m in t:
            if not isinstance(t[m], Mapping):
                continue
            r = t[m]
            lines.append(
                f"| {m} | {r['step_ms_median']:.1f} | {r['correction_ms_median']:.2f} | "
                f"{r['ratio_median']:.3f} ({r['ratio_iqr'][0]:.3f}–{r['ratio_iqr'][1]:.3f}) |"
            )
    return lines


def selection_lines(
    result: Mapping[str, Any], methods: Sequence[str], seeds: Sequence[int]
) -> list[str]:
    """How the settings were chosen and what each method chose (per seed where it was)."""
    cfg = result["config"]
    base = f"every base setting: {_setting(cfg['base_params'])}"
    if all(isinstance(result["selection"][m], Mapping) for m in methods):  # before issue 42
        # One grid for every method: the trials of a method that ignores a setting repeat.
        distinct = ", ".join(
            f"{m} {len({json.dumps(t['by_kind'], sort_keys=True) for t in result['selection'][m]['trials']})}"
            for m in methods
        )
        lines = [
            "Settings per method, chosen on validation rows carved from each task's training "
            f"rows (20 %) of seed {seeds[0]}'s stream only, and used for every seed; "
            f"{len(cfg['settings'])} settings per method ({base}), one grid for all, so a method "
            f"that ignores a setting repeats trials (distinct validation outcomes: {distinct}); "
            "criterion: validation Overall averaged over the two kinds. The test rows were not "
            "used for the choice.",
            "",
            "| method | trials (validation Overall) | chosen |",
            "|---|---|---|",
        ]
        for m in methods:
            sel = result["selection"][m]
            trials = "; ".join(f"{_setting(t['setting'])}: {t['score']:.3f}" for t in sel["trials"])
            lines.append(f"| {m} | {trials} | {_setting(sel['chosen'])} |")
        return lines
    counts = sorted(set(cfg["trials_per_method"].values()))
    lines = [
        "Settings per method **and seed**: each seed chooses on validation rows carved from its "
        "own stream's training rows (20 % of each task's), and its test-side figures below use "
        f"its own choice; {' / '.join(map(str, counts))} distinct trials per method and seed "
        f"({base}); criterion: validation Overall averaged over the two kinds. The test rows "
        "were not used for the choice. Trials: validation Overall, mean over the seeds; chosen: "
        "each setting with the seeds that chose it.",
        "",
        "| method | trials (validation Overall, mean over seeds) | chosen (seeds) |",
        "|---|---|---|",
    ]
    for m in methods:
        entries = result["selection"][m]
        settings = [t["setting"] for t in entries[0]["trials"]]
        mean_score = [
            float(np.mean([e["trials"][j]["score"] for e in entries])) for j in range(len(settings))
        ]
        trials = "; ".join(
            f"{_setting(x)}: {v:.3f}" for x, v in zip(settings, mean_score, strict=True)
        )
        by_choice: dict[str, list[str]] = {}
        for seed, e in zip(seeds, entries, strict=True):
            by_choice.setdefault(_setting(e["chosen"]), []).append(str(e.get("seed", seed)))
        chosen = "; ".join(f"{k} ({', '.join(v)})" for k, v in by_choice.items())
        lines.append(f"| {m} | {trials} | {chosen} |")
    return lines


def stream_order(config: Mapping[str, Any]) -> str:
    """The task order a run used (runs before ``--stream`` existed: ``interleaved``)."""
    return config.get("stream", {}).get("order", "interleaved")


def render_markdown(result: Mapping[str, Any]) -> str:
    """The tables of one results record (development or held-back split). The figures and the
    targets are computed here from the record's per-seed values."""
    cfg = result["config"]
    s = summarise(result["per_seed"])
    methods = list(cfg["methods"])
    seeds = list(cfg["seeds"])
    held_back = result.get("split") == HELD_BACK
    tasks = "; ".join(
        f"{i + 1}. {t['name']} ({t['train']}/{t['test']}"
        + (f", {t['classes']} classes)" if t["classes"] else ")")
        for i, t in enumerate(result["tasks"])
    )
    constants = cfg["stream"]
    if held_back:
        split = (
            f"Held-back split: every seed trains on its own development training rows with the "
            "development run's settings (below) and is tested on held-back rows: "
            f"{constants['held_back_fraction'] * 100:g} % of every class's members and of every "
            f"retrieval group's rows, drawn once (seed {constants['held_back_seed']}"
            + (
                f", SHA-256 of its synset ids {constants['held_back_sha256'][:16]}…"
                if constants.get("held_back_sha256")
                else ""
            )
            + "), the same "
            "for every seed, in no seed's train, test or validation rows; per task at most as "
            "many as a development test split holds, fewer where the held-back rows run short "
            "(sizes below). A smaller gallery makes recall@5 easier, so compare these figures "
            "with fine-tuning's on the same rows (the targets do), not with the development "
            "tables. The interval spans the seeds' training rows and runs, not the sampling of "
            "the (one) held-back set."
        )
        rows = f"train/held-back test rows of seed {seeds[0]}"
    else:
        split = (
            "Every seed draws its own items and train/test split (a fresh random split per "
            "seed); the held-back rows "
            + (
                f"({constants['held_back_fraction'] * 100:g} % of every class and retrieval group, "
                f"seed {constants['held_back_seed']}) are in none of them."
                if "held_back_fraction" in constants
                else "did not exist yet in this run."
            )
        )
        rows = f"train/test rows of seed {seeds[0]}"
    interval = (
        "mean [95 % interval: mean ± t(0.975, n−1)·sd/√n over the n seeds]"
        if len(seeds) > 1
        else "one seed: no interval"
    )
    jobs = cfg.get("jobs", 1)
    workers = f" in each of {jobs} worker processes" if jobs > 1 else ""
    machine = f", {result['machine']}" if result.get("machine") else ""
    lines = [
        f"Command: `{result['command']}` ({result['date']}, {result['seconds'] / 60:.1f} min, "
        f"torch {result['torch']}, {result['threads']} thread(s){workers}{machine}); "
        f"seeds {seeds}, {interval}. "
        f"Encoder {result['encoder']} for both modalities (`text`, `gloss`).",
        "",
        split,
        "",
        f"Stream `{stream_order(cfg)}` ({rows}): "
        f"{tasks}. Classification tasks pair each gloss with its class's name text (the lemmas "
        "of its hypernym ancestor at depth 6; classes disjoint across tasks) and score the "
        "accuracy of each test gloss's nearest class text among the task's classes; retrieval "
        "tasks pair a synset's lemmas with its gloss (synsets of no kept class) and score "
        "symmetric recall@5.",
        "",
    ]
    lines += selection_lines(result, methods, seeds)
    for kind in ("classification", "retrieval"):
        key = f"by_kind.{kind}"
        if f"{key}.task_end" not in s[methods[0]]:
            continue
        lines += [
            "",
            f"**{kind.capitalize()} tasks** ({KIND_METRIC[kind]}); no-backfill = the final model's "
            "text embeddings against the old glosses as embedded at the task's end, as a fraction "
            "of the task-end figure (`recorded`: through the recorded rotations; `backfilled`: "
            "glosses re-embedded by the final model):",
            "",
            "| method | task-end | final | BWT (backfilled) | no-backfill plain | "
            "no-backfill recorded | backfilled |",
            "|---|---|---|---|---|---|---|",
        ]
        for m in methods:
            nb = f"no_backfill.{kind}"
            lines.append(
                f"| {m} | {_pm(s[m][f'{key}.task_end'])} | {_pm(s[m][f'{key}.final'])} | "
                f"{_pm(s[m][f'{key}.bwt'], digits=4)} | {_pm(s[m][f'{nb}.plain'])} | "
                f"{_pm(s[m][f'{nb}.recorded_rotation'])} | {_pm(s[m][f'{nb}.backfilled'])} |"
            )
    lines += [
        "",
        "Drift (×10⁻³) of old tasks' test rows (the first 300 per task; version at the task's "
        "end → final version, mean over tasks 1…n−1): radial = mean |Δx₀|, angular = mean |Δ| of "
        "the within-modality cosine Gram matrix, cross-modal = the same for the text–gloss block, "
        "paired distance = mean |Δd(text_i, gloss_i)|:",
        "",
        "| method | radial | angular | cross-modal | paired distance |",
        "|---|---|---|---|---|",
    ]
    for m in methods:
        lines.append(
            f"| {m} | "
            + " | ".join(_pm(s[m][f"drift.{k}"], scale=1e3, digits=2) for k in DRIFT_MEASURES)
            + " |"
        )
    if not held_back:  # the same timing record as the development run's
        earlier = result.get("timing_from")
        if earlier:  # the training code unchanged since; another machine's times would not compare
            lines += [
                "",
                f"The per-step times below are those of the run of {earlier['date']} "
                f"(`{earlier['path']}`), taken with `--timing-from`; this run did not time steps.",
            ]
        lines += timing_lines(result["timing"])
    judged = targets(s, result["timing"])
    if judged:
        lines += [
            "",
            "Issue 13's targets for `hmcl-ca`, each met only when its 95 % interval over seeds "
            "clears the threshold; comparisons with fine-tuning are per seed (difference or "
            "ratio of the two runs on the seed's split), then the interval; met / missed by = "
            "the distance of the interval's low end from the threshold:",
            "",
            "| target | mean | 95 % interval | threshold | verdict |",
            "|---|---|---|---|---|",
        ]
        for t in judged:
            bounds = "—" if math.isnan(t["low"]) else f"[{t['low']:.4f}, {t['high']:.4f}]"
            lines.append(
                f"| {t['target']} | {t['mean']:.4f} | {bounds} | {t['threshold']:.4f} | "
                f"{verdict(t)} |"
            )
    return "\n".join(lines) + "\n"


SECTION = "bench.quality.continual"
SECTION_TITLE = "Continual upgrades (HMCL): classification-style and retrieval tasks"


def look_line(result: dict[str, Any]) -> str:
    """When a held-back run looked at its split, at which commit (issue 42 item 3: every look is
    stated); empty for a run that did not record its commit."""
    source = result.get("source_state") or {}
    if not source.get("commit"):
        return ""
    changed = source.get("app_changed") or []
    return (
        f"Stream `{stream_order(result['config'])}`: the held-back split (seed "
        f"{result['config']['stream']['held_back_seed']}) looked at on {result['date']}, "
        f"commit `{source['commit'][:10]}`" + uncommitted_phrase(changed) + "."
    )


def render_streams(results: Sequence[Mapping[str, Any]]) -> str:
    """The tables of one run, or of several (one per stream and split): the development runs
    under a heading per stream, then the held-back runs under their own heading."""
    if len(results) == 1:
        return render_markdown(results[0])
    development = [r for r in results if r.get("split") != HELD_BACK]
    held_back = [r for r in results if r.get("split") == HELD_BACK]
    parts = [
        f"### Stream `{stream_order(r['config'])}`\n\n{render_markdown(r)}" for r in development
    ]
    if held_back:
        parts.append(
            "### Held-back split\n\nScored only with `--final`, once per release, after the "
            "code and the settings were fixed; never looked at while developing. The `--final` "
            "runs also wrote the development figures above: they score the same trained "
            "versions on the held-back rows as well, which leaves the development figures as "
            "a run without `--final` gives them (`tests/test_hmcl_bench.py`).\n"
            + "".join(f"\n{look_line(r)}" for r in held_back if look_line(r))
        )
        parts += [
            f"#### Stream `{stream_order(r['config'])}`, held-back split\n\n{render_markdown(r)}"
            for r in held_back
        ]
    return "\n".join(parts)
