"""The continual benchmark's targets (issue 13) and its markdown tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.ml.hmcl.metrics import DRIFT_MEASURES

KIND_METRIC = {"retrieval": "recall@5 (symmetric text↔gloss)", "classification": "accuracy"}
# (what, kind, threshold, how the value compares): issue 13's targets for hmcl-ca.
RETENTION_MIN = 0.95
BWT_MIN = -0.02
TASK_END_RATIO_MIN = {"retrieval": 0.98, "classification": 0.95}
STEP_RATIO_MAX = 1.05
STEP_DIM = "768"


def targets(summary: Mapping[str, Any], timing: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Issue 13's targets for ``hmcl-ca`` against the seed means: each with the measured value,
    the threshold, whether it is met and the margin (positive: met by that much)."""
    out: list[dict[str, Any]] = []
    ca, ft = summary.get("hmcl-ca"), summary.get("finetune")
    if ca is None or ft is None:
        return out

    def mean(s: Mapping[str, Any], key: str) -> float | None:
        return s[key]["mean"] if key in s else None

    for kind in ("retrieval", "classification"):
        kept = mean(ca, f"no_backfill.{kind}.recorded_rotation")
        if kept is not None:
            out.append(
                {
                    "target": f"{kind}: no-backfill retention (recorded rotation) ≥ 0.95",
                    "value": kept,
                    "threshold": RETENTION_MIN,
                    "met": kept >= RETENTION_MIN,
                    "margin": kept - RETENTION_MIN,
                }
            )
        bwt, ft_bwt = mean(ca, f"by_kind.{kind}.bwt"), mean(ft, f"by_kind.{kind}.bwt")
        if bwt is not None and ft_bwt is not None:
            floor = max(BWT_MIN, ft_bwt)
            out.append(
                {
                    "target": f"{kind}: backfilled BWT ≥ −0.02 and above fine-tuning's "
                    f"({ft_bwt:+.4f})",
                    "value": bwt,
                    "threshold": floor,
                    "met": bwt >= BWT_MIN and bwt > ft_bwt,
                    "margin": bwt - floor,
                }
            )
        end, ft_end = mean(ca, f"by_kind.{kind}.task_end"), mean(ft, f"by_kind.{kind}.task_end")
        if end is not None and ft_end:
            ratio, need = end / ft_end, TASK_END_RATIO_MIN[kind]
            out.append(
                {
                    "target": f"{kind}: task-end {KIND_METRIC[kind]} ≥ {need} × fine-tuning's",
                    "value": ratio,
                    "threshold": need,
                    "met": ratio >= need,
                    "margin": ratio - need,
                }
            )
    if STEP_DIM in timing:
        ratio = timing[STEP_DIM]["hmcl-ca"]["ratio_median"]
        out.append(
            {
                "target": f"CA step ≤ {STEP_RATIO_MAX} × an AdamW step at d = {STEP_DIM}",
                "value": ratio,
                "threshold": STEP_RATIO_MAX,
                "met": ratio <= STEP_RATIO_MAX,
                "margin": STEP_RATIO_MAX - ratio,
            }
        )
    return out


def _pm(stat: Mapping[str, float], scale: float = 1.0, digits: int = 3) -> str:
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['sd'] * scale:.{digits}f}"


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


def stream_order(config: Mapping[str, Any]) -> str:
    """The task order a run used (runs before ``--stream`` existed: ``interleaved``)."""
    return config.get("stream", {}).get("order", "interleaved")


def render_markdown(result: Mapping[str, Any]) -> str:
    s, cfg = result["summary"], result["config"]
    methods = list(cfg["methods"])
    seeds = list(cfg["seeds"])
    tasks = "; ".join(
        f"{i + 1}. {t['name']} ({t['train']}/{t['test']}"
        + (f", {t['classes']} classes)" if t["classes"] else ")")
        for i, t in enumerate(result["tasks"])
    )
    lines = [
        f"Command: `{result['command']}` ({result['date']}, {result['seconds'] / 60:.1f} min, "
        f"torch {result['torch']}, {result['threads']} thread(s)); seeds {seeds}, mean ± sd "
        f"over seeds. Encoder {result['encoder']} for both modalities (`text`, `gloss`).",
        "",
        f"Stream `{stream_order(cfg)}` (train/test rows of seed {seeds[0]}): "
        f"{tasks}. Classification tasks pair each gloss with its class's name text (the lemmas "
        "of its hypernym ancestor at depth 6; classes disjoint across tasks) and score the "
        "accuracy of each test gloss's nearest class text among the task's classes; retrieval "
        "tasks pair a synset's lemmas with its gloss (synsets of no kept class) and score "
        "symmetric recall@5.",
        "",
        "Settings per method, chosen on validation rows carved from each task's training rows "
        f"(20 %) of seed {seeds[0]}'s stream, {len(cfg['settings'])} trials per method "
        f"(every base setting: {_setting(cfg['base_params'])}); criterion: validation Overall "
        "averaged over the two kinds. The test rows were not used for the choice.",
        "",
        "| method | trials (validation Overall) | chosen |",
        "|---|---|---|",
    ]
    for m in methods:
        sel = result["selection"][m]
        trials = "; ".join(f"{_setting(t['setting'])}: {t['score']:.3f}" for t in sel["trials"])
        lines.append(f"| {m} | {trials} | {_setting(sel['chosen'])} |")
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
    lines += timing_lines(result["timing"])
    if result.get("targets"):
        lines += [
            "",
            "Issue 13's targets for `hmcl-ca` (seed means; margin > 0: met by that much):",
            "",
            "| target | measured | threshold | met | margin |",
            "|---|---|---|---|---|",
        ]
        for t in result["targets"]:
            lines.append(
                f"| {t['target']} | {t['value']:.4f} | {t['threshold']:.4f} | "
                f"{'yes' if t['met'] else 'no'} | {t['margin']:+.4f} |"
            )
    return "\n".join(lines) + "\n"


SECTION = "bench.quality.continual"
SECTION_TITLE = "Continual upgrades (HMCL): classification-style and retrieval tasks"


def render_streams(results: Sequence[Mapping[str, Any]]) -> str:
    """The tables of one run, or of several (one per stream) under a heading each."""
    if len(results) == 1:
        return render_markdown(results[0])
    return "\n".join(
        f"### Stream `{stream_order(r['config'])}`\n\n{render_markdown(r)}" for r in results
    )
