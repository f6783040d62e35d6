"""bench.quality.compat's summaries, targets and BENCHMARKS.md section (the query→document part reuses
``bench.quality.querydoc``'s runs, summaries and targets)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from app.ml.auto import halving, widening
from app.ml.auto.candidates import INSTANCE_FLOOR, NATURAL_BOUNDS
from app.ml.evaluation.retrieval import json_safe
from bench.common.machine import uncommitted_phrase
from bench.common.report import replace_section
from bench.common.stats import t_interval
from bench.quality import compat_grid, querydoc

SECTION = "bench.quality.compat"
TARGET_SCENARIO = "external"
TARGET_P_COM = 0.70
TARGET_P_COM_MAP = 0.60
P_UP_FLOOR = compat_grid.P_UP_FLOOR
REFERENCE_ROWS = ("stay", "reindex", "independent")
CLASS_LABELS = {"cmc1": "CMC@1", "map@100": "mAP@100"}


def _flatten(values: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", float(value)


def mean_sd(values: list[float | None]) -> list[float] | None:
    """[mean, sd (ddof=1), low, high] of the finite values, [low, high] their 95 % interval
    across runs (``bench.common.stats.t_interval``; one value: low = high = it, shown without a
    spread); None when there are none."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None
    if len(v) == 1:
        return [v[0], 0.0, v[0], v[0]]
    mean, low, high = t_interval(v)
    return [mean, float(np.std(v, ddof=1)), low, high]


def summarise(runs: list[dict[str, Any]], key: str = "metrics") -> dict[str, Any]:
    """mean, sd and 95 % interval over seeds (each its own split) of every figure of every row
    of ``run[key]`` (``metrics``: the evaluation part; ``final_metrics``: the held-back items),
    the stronger reference per metric over seeds, and what auto chose per seed."""
    rows: dict[str, dict[str, list[float] | None]] = {}
    for name in runs[0][key]:
        per_seed = [dict(_flatten(r[key][name])) for r in runs]
        keys = sorted({k for d in per_seed for k in d})
        rows[name] = {k: mean_sd([d.get(k) for d in per_seed]) for k in keys}
    reference = {
        m: [r[key]["procrustes"]["reference"][m] for r in runs]
        for m in runs[0][key]["procrustes"].get("reference", {})
    }
    return {
        "rows": rows,
        "reference": reference,
        "auto_chosen": [r["auto"]["chosen"] for r in runs],
        "auto_settings": [r["auto"]["chosen_settings"] for r in runs],
    }


def merge_selections(selections: list[dict[str, Any]], seed: int | None = None) -> dict[str, Any]:
    """One selection from several ``select`` units over parts of the methods of one seed (each
    unit selects the independent head and fits procrustes itself, deterministically: they must
    agree)."""
    merged: dict[str, Any] = {"trials": {}, "chosen": {}, "edge": {}}
    for sel in selections:
        for key in ("trials", "chosen", "edge"):
            for method, value in sel[key].items():
                if method in merged[key] and merged[key][method] != value:
                    raise ValueError(f"select units of seed {seed} disagree on {method}'s {key}")
                merged[key][method] = value
        floor = sel.get("instance_floor")
        if floor is not None:
            if merged.get("instance_floor", floor) != floor:
                raise ValueError(f"select units of seed {seed} disagree on the instance floor")
            merged["instance_floor"] = floor
    return merged


def per_seed(runs: list[dict[str, Any]], row: str, key: str, part: str = "metrics") -> list[float]:
    """One figure (``row``, flattened ``key``) of every run that has it."""
    out = []
    for r in runs:
        value = dict(_flatten(r[part].get(row, {}))).get(key)
        if value is not None and math.isfinite(value):
            out.append(value)
    return out


def _value(summary: dict[str, Any], row: str, key: str) -> float | None:
    pair = summary["rows"].get(row, {}).get(key)
    return None if pair is None else pair[0]


def _interval_text(interval: tuple[float, float, float], signed: bool = False) -> str:
    mean, low, high = interval
    f = "{:+.3f}" if signed else "{:.3f}"
    if math.isnan(low):
        return f.format(mean) + " (one seed: no interval)"
    return f"{f.format(mean)} [95 % {f.format(low)}, {f.format(high)}]"


def _at_least(values: list[float], target: float, signed: bool = False) -> tuple[str, str] | None:
    """(the figure with its interval, the verdict): met only when the interval's low end
    clears ``target``; else missed by how far that end falls short (one value: no interval, so
    never met)."""
    if not values:
        return None
    interval = t_interval(values)
    if math.isnan(interval[1]):
        return _interval_text(interval, signed), "not met: one seed has no interval"
    gap = interval[1] - target
    verdict = "met" if gap >= 0 else f"missed by {abs(gap):.3f}"
    return _interval_text(interval, signed), verdict


def edge_lines(scenario: dict[str, Any]) -> list[str]:
    """Per scenario: the methods whose chosen value sat on an edge of what was tried, in how
    many seeds."""
    name = scenario["scenario"]["name"]
    runs = scenario["runs"]
    counts: dict[str, int] = {}
    for r in runs:
        for m, e in r["selection"]["edge"].items():
            if e:
                counts[m] = counts.get(m, 0) + 1
    if not counts:
        return [f"- {name}: no chosen value on an edge of its grid in any seed — met"]
    shown = ", ".join(f"{m} ({c}/{len(runs)} seeds)" for m, c in counts.items())
    tuned = sum(1 for m in runs[0]["selection"]["edge"] if compat_grid.GRIDS[m].axis)
    return [
        f"- {name}: chosen value on an edge of what was tried for {shown} — missed for "
        f"{len(counts)} of {tuned} tuned methods"
    ]


def target_lines(payload: dict[str, Any], part: str = "metrics") -> list[str]:
    """The issue's targets, each met only when its 95 % interval across seeds (each seed its
    own split) clears it; comparisons and shares are taken per seed first (auto − the best
    single method by mean, auto / procrustes). ``part``: ``metrics`` (the evaluation parts) or
    ``final_metrics`` (the held-back items)."""
    lines = []
    for sc in payload["scenarios"]:
        runs = [r for r in sc["runs"] if part in r]
        if not runs:
            continue
        name = sc["scenario"]["name"]
        auto_r1 = per_seed(runs, "auto", "instance.recall@1", part)
        proc_r1 = per_seed(runs, "procrustes", "instance.recall@1", part)
        if auto_r1 and len(auto_r1) == len(proc_r1) and all(proc_r1):
            shares = [a / p for a, p in zip(auto_r1, proc_r1, strict=True)]
            shown, verdict = _at_least(shares, INSTANCE_FLOOR) or ("—", "")
            lines.append(
                f"- {name}: auto own-item R@1 / procrustes's (per seed) {shown} "
                f"(target ≥ {INSTANCE_FLOOR}) — {verdict}"
            )
        if name != TARGET_SCENARIO:
            continue
        for key, target, label, signed in (
            ("p_com.cmc1", TARGET_P_COM, "P_com(CMC@1)", False),
            ("p_com.map@100", TARGET_P_COM_MAP, "P_com(mAP@100)", False),
            ("p_up.cmc1", P_UP_FLOOR, "P_up(CMC@1)", True),
        ):
            checked = _at_least(per_seed(runs, "auto", key, part), target, signed)
            if checked:
                lines.append(
                    f"- {name}: auto {label} {checked[0]} (target ≥ {target}) — {checked[1]}"
                )
        auto_pc = per_seed(runs, "auto", "p_com.cmc1", part)
        if len(auto_pc) != len(runs):
            continue
        rivals = {
            m: v
            for m in compat_grid.BRIDGES
            if len(v := per_seed(runs, m, "p_com.cmc1", part)) == len(runs)
        }
        kept = {
            m: v
            for m, v in rivals.items()
            if len(r1 := per_seed(runs, m, "instance.recall@1", part)) == len(runs)
            and all(a >= INSTANCE_FLOOR * p for a, p in zip(r1, proc_r1, strict=True))
        }
        for group, words in (
            (rivals, "every single method"),
            (
                kept,
                f"every single method that keeps own-item R@1 ≥ {INSTANCE_FLOOR} × procrustes's",
            ),
        ):
            if not group:
                continue
            who = max(group, key=lambda m: float(np.mean(group[m])))
            diff = [a - b for a, b in zip(auto_pc, group[who], strict=True)]
            checked = _at_least(diff, 0.0, signed=True)
            assert checked is not None
            lines.append(
                f"- {name}: auto P_com(CMC@1) above {words} (best {who}; auto − {who} per seed "
                f"{checked[0]}) — {checked[1]}"
            )
    if part == "metrics":
        for sc in payload["scenarios"]:
            lines += edge_lines(sc)
        if payload.get("querydoc"):
            lines += [f"- query → document, {line[2:]}" for line in payload["querydoc"]["targets"]]
    return lines


def _fmt(stat: list[float] | None, signed: bool = False) -> str:
    """mean ± the 95 % interval's half-width ([mean, sd, low, high]; the t interval is
    symmetric), or mean ± sd for a two-element [mean, sd]."""
    if stat is None:
        return "—"
    value = f"{stat[0]:+.3f}" if signed else f"{stat[0]:.3f}"
    half = (stat[3] - stat[2]) / 2 if len(stat) >= 4 else stat[1] if len(stat) > 1 else 0.0
    return value if half == 0 else f"{value} ± {half:.3f}"


COLUMNS = (
    ("new→old CMC@1", "class.cmc1", False),
    ("new→old mAP@100", "class.map@100", False),
    ("own space CMC@1", "class_own_space.cmc1", False),
    ("P_com CMC@1", "p_com.cmc1", True),
    ("P_com mAP@100", "p_com.map@100", True),
    ("P_up CMC@1", "p_up.cmc1", True),
    ("P_up mAP@100", "p_up.map@100", True),
    ("own-item R@1", "instance.recall@1", False),
    ("own-item R@10", "instance.recall@10", False),
    ("own-item MRR@100", "instance.mrr@100", False),
)
OLD_SIDES = {
    "all": "an old head trained on every training item",
    "half-items": "an old head trained on half the training items",
    "half-classes": "an old head trained on the items of half the classes",
    None: "the raw old vectors, lifted as the service lifts them",
}
# Runs that record ``old_head_items`` "fit": old heads drawn from the fit part only.
OLD_SIDES_FIT = {
    "all": "an old head trained on every fit item (the training items less the validation carve)",
    "half-items": "an old head trained on half the fit items",
    "half-classes": "an old head trained on the fit items of half the classes",
}
ROW_LABELS = {
    "stay": "stay (old→old)",
    "reindex": "reindex (raw new backbone, cosine)",
    "independent": "independent (new head, own space)",
}


def _chosen_cell(sc: dict[str, Any], row: str) -> tuple[str, str]:
    """(trials per seed, each seed's chosen value with its edge flag)."""
    selections = [r["selection"] for r in sc["runs"]]
    if any(row not in sel["trials"] for sel in selections):
        return "—", "—"
    grid = compat_grid.GRIDS[row]
    if grid.axis is None:
        return "1", "closed form"
    counts = sorted({len(sel["trials"][row]) for sel in selections})
    picks = []
    for sel in selections:
        edge = sel["edge"].get(row)
        picks.append(f"{sel['chosen'][row][grid.axis]}" + (f" (**{edge} edge**)" if edge else ""))
    return "/".join(map(str, counts)), f"{grid.axis} " + " / ".join(picks)


def auto_trials_cell(runs: list[dict[str, Any]]) -> str:
    """Trials per tuned candidate of auto: its grid trials plus extra trials where the run
    recorded them, else the most any seed's chosen candidate tried (runs before the record)."""
    recorded = {
        (r["auto"]["trials"], r["auto"]["extra_trials"])
        for r in runs
        if "extra_trials" in r["auto"]
    }
    if recorded:
        return " / ".join(f"{t} + {e}" for t, e in sorted(recorded)) + " per candidate"
    tried = max(len(r["auto"].get("tried", [])) for r in runs)
    return f"{tried} per candidate" if tried else "auto's own"


def auto_edges(runs: list[dict[str, Any]]) -> list[str | None]:
    """Per seed: ``"low"`` / ``"high"`` when auto's chosen candidate's value is an end of the
    values it tried, its extra trials included (a better one may lie beyond), else None (inside,
    untuned, or the axis's natural end: a prototype weight of 0 is the paper's loss)."""
    out: list[str | None] = []
    for r in runs:
        settings, tried = r["auto"]["chosen_settings"], r["auto"].get("tried", [])
        # The tuned axis is the one whose value varies (a candidate's fixed settings do not).
        axis = next(
            (a for a in settings if all(a in t for t in tried) and len({t[a] for t in tried}) > 1),
            None,
        )
        if axis is None or len(tried) < 2:
            out.append(None)
            continue
        values = [t[axis] for t in tried]
        best = values.index(settings[axis])
        out.append(widening.edge(values, best, NATURAL_BOUNDS.get(axis)))
    return out


def scenario_markdown(sc: dict[str, Any], key: str = "summary") -> list[str]:
    """A scenario's table: ``summary`` (the evaluation parts) or ``final_summary`` (the
    held-back items)."""
    s, name = sc[key], sc["scenario"]["name"]
    refs = []
    for m, label in CLASS_LABELS.items():
        raw = _value(s, "reindex", f"class.{m}")
        ind = _value(s, "independent", f"class.{m}")
        names = sorted(set(s["reference"].get(m, [])))
        refs.append(
            f"{label}: raw new {raw:.3f}, independent {ind:.3f} → stronger: {', '.join(names)}"
        )
    temps = " / ".join(
        str(r["selection"]["chosen"]["independent"].get("base_temperature")) for r in sc["runs"]
    )
    edges = auto_edges(sc["runs"])
    picks = "; ".join(
        f"seed {r['seed']}: {c} {json.dumps(st)}" + (f" (**{e} edge**)" if e else "")
        for r, c, st, e in zip(sc["runs"], s["auto_chosen"], s["auto_settings"], edges, strict=True)
    )
    old = OLD_SIDES[sc["scenario"]["old_training"]]
    if sc["scenario"].get("old_head_items") == "fit":
        old = OLD_SIDES_FIT[sc["scenario"]["old_training"]]
    lines = [
        f"### {name}" + (" — held-back items" if key == "final_summary" else ""),
        f"Old side: {old}. Reference for P_com / P_up (per metric, over seeds) — "
        + "; ".join(refs)
        + ".",
        f"L_base temperature (independent head's validation choice, per seed) {temps}. "
        f"auto chose — {picks}.",
        "",
    ]
    order = [r for r in REFERENCE_ROWS if r in s["rows"]]
    # Every single method, then auto last, whatever order the units' parts arrived in.
    order += [r for r in s["rows"] if r not in REFERENCE_ROWS and r != "auto"]
    order += ["auto"] if "auto" in s["rows"] else []
    rows = []
    for row in order:
        trials, chosen = _chosen_cell(sc, row)
        if row == "auto":
            trials, chosen = auto_trials_cell(sc["runs"]), "see above"
        label = ROW_LABELS.get(row, f"**{row}**" if row == "auto" else row)
        cells = [_fmt(s["rows"][row].get(k), signed) for _, k, signed in COLUMNS]
        rows.append([label, trials, chosen, *cells])
    columns = ["method", "trials", "chosen on validation (per seed)", *(c for c, _, _ in COLUMNS)]
    lines += _table(columns, rows)
    if key == "final_summary":
        return [*lines, ""]
    columns = ["auto candidate", "validation new→old CMC@1", "validation own-item R@1"]
    columns += [f"≥ {INSTANCE_FLOOR} × procrustes's R@1 (seeds)", "chosen (seeds)"]
    lines += ["", *_table(columns, auto_candidates(sc["runs"]))]

    def rho(source: str) -> str:
        values = [r["calibration"][source].get("spearman") for r in sc["runs"]]
        shuffled = [r["calibration"][source].get("spearman_shuffled") for r in sc["runs"]]
        if any(v is None for v in values):
            return "n/a (constant)"
        return f"{np.mean(values):+.3f} (shuffled {np.mean(shuffled):+.3f})"

    rate = np.mean([r["calibration"]["old_old_failure_rate"] for r in sc["runs"]])
    lines += [
        "",
        f"Uncertainty calibration (Spearman with old→old top-1 failure, rate {rate:.3f}; "
        f"means over seeds): norm {rho('norm')}; knn {rho('knn')}.",
        "",
    ]
    return lines


def auto_candidates(runs: list[dict[str, Any]]) -> list[list[str]]:
    """auto's candidates on their validation split (each one's best trial), over seeds: CMC@1,
    own-item R@1, in how many seeds it passed the instance floor (≥ ``INSTANCE_FLOOR`` ×
    procrustes's own-item R@1 on validation; procrustes always does) and was chosen."""
    rows = []
    for name in runs[0]["auto"]["validation"]:
        cmc, r1, eligible, chosen = [], [], 0, 0
        for r in runs:
            val = r["auto"]["validation"]
            own = val[name].get("instance", {}).get("recall@1")
            floor = INSTANCE_FLOOR * val["procrustes"]["instance"]["recall@1"]
            cmc.append(val[name].get("class", {}).get("cmc1"))
            r1.append(own)
            eligible += name == "procrustes" or (own is not None and own >= floor)
            chosen += r["auto"]["chosen"] == name
        n = len(runs)
        rows.append(
            [name, _fmt(mean_sd(cmc)), _fmt(mean_sd(r1)), f"{eligible}/{n}", f"{chosen}/{n}"]
        )
    return rows


def querydoc_instance(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Instance view (own-item R@1, R@10, MRR@100) of every query→document row, mean ± sd."""
    out: dict[str, dict[str, Any]] = {}
    for variant in querydoc.VARIANTS:
        vr = [r for r in runs if r["variant"] == variant]
        if vr:
            out[variant] = {
                name: {
                    m: mean_sd([(r["rows"][name]["instance"] or {}).get(m) for r in vr])
                    for m in ("recall@1", "recall@10", "mrr@100")
                }
                for name in vr[0]["rows"]
            }
    return out


def querydoc_part(run: bool, quick: bool, seeds: list[int]) -> dict[str, Any]:
    """The query→document scenario through ``bench.quality.querydoc``: rerun (``run``) or read from its
    results file."""
    if run:
        arrays = querydoc.load_arrays(quick)
        params = querydoc.QUICK_PARAMS if quick else {}
        runs = [
            querydoc.run_once(arrays, with_log, seed, params)
            for seed in seeds
            for with_log in (False, True)
        ]
        source = {"command": "run by this command", "seeds": seeds, "params": params}
    else:
        path = querydoc.RESULTS.with_name("querydoc-quick.json") if quick else querydoc.RESULTS
        saved = json.loads(path.read_text())
        runs = saved["runs"]
        source = {
            "command": saved["command"],
            "seeds": saved["seeds"],
            "params": saved["params"],
            "file": str(path.relative_to(querydoc.REPO_ROOT)),
        }
    summary = querydoc.summarise(runs)
    return {
        **source,
        "trials_per_candidate": runs[0]["auto"]["trials"],
        "summary": summary,
        "instance": querydoc_instance(runs),
        "targets": querydoc.targets(summary, runs),
        "runs": runs if run else None,
    }


def querydoc_markdown(part: dict[str, Any]) -> list[str]:
    where = f"`{part['command']}`" + (f" ({part['file']})" if part.get("file") else "")
    lines = [
        "### query → document (lemma → gloss)",
        f"Figures from {where}, seeds {part['seeds']}: every candidate tuned by `auto` with "
        f"{part['trials_per_candidate']} validation trials, objective `query`; own-item = the "
        "gloss's new features against every old gloss vector.",
        "",
    ]
    columns = ["search", "R@1", "R@10", "ARR(R@10)"]
    columns += ["own-item R@1", "own-item R@10", "own-item MRR@100"]
    for variant, table in part["summary"].items():
        inst = part["instance"][variant]
        rows = []
        for name, e in table.items():
            label = name if name != "auto" else f"**auto** (chose {', '.join(e['chosen'])})"
            cells = [e["recall@1"], e["recall@10"], e["arr@10"]]
            cells += [inst[name][m] for m in ("recall@1", "recall@10", "mrr@100")]
            rows.append([label, *(_fmt(c) for c in cells)])
        lines += [f"#### {variant}", "", *_table(columns, rows), ""]
    return lines


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: a header, its rule and one line per row of cells."""
    return [
        "| " + " | ".join(columns) + " |",
        "|---" * len(columns) + "|",
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]


def halving_text(auto_params: dict[str, Any]) -> str:
    """How ``auto``'s trials were trained beside the single methods' (issue 42 item 2: every
    difference in protocol is stated): screened by successive halving unless its params turned
    that off. Ends the sentence."""
    if auto_params.get("halving", True) is False:
        return "; its trials train at full length, as the single methods' do."
    return (
        f"; {halving.RULE} (`app/ml/auto/halving.py`). The single methods here train every trial "
        "at full length: the same number of trials, more epochs than `auto`'s."
    )


def look_lines(scenarios: list[dict[str, Any]]) -> list[str]:
    """When each scenario's run looked at the held-back items, at which commit (issue 42 item 3:
    every look is stated), one line each and a blank line after; a scenario whose run did not
    record it says so rather than being left out."""
    lines = []
    for sc in scenarios:
        look = sc.get("held_back_look") or {}
        name = sc["scenario"]["name"]
        if not look.get("commit"):
            lines.append(f"- {name}: its run recorded neither the day nor the commit.")
            continue
        changed = look.get("app_changed") or []
        lines.append(
            f"- {name}: held-back items looked at on {look['date']}, commit "
            f"`{look['commit'][:10]}`"
            + uncommitted_phrase(changed)
            + (
                f" (recorded by hand afterwards, {look['by_hand']})."
                if look.get("by_hand")
                else "."
            )
        )
    return [*lines, ""] if lines else []


def render_markdown(payload: dict[str, Any]) -> str:
    run = [sc["scenario"]["name"] for sc in payload["scenarios"]]
    extra = payload["extend_rounds"]
    held = payload.get("held_back", {})
    lines = [
        f"Command: `{payload['command']}` — {payload['seeds']} seeds (split seeds "
        f"{payload.get('split_seeds')}), each its own split; mean ± half-width of the 95 % "
        f"interval across seeds (Student t), so it includes split sampling; "
        f"{payload['n_train']} training ({payload['n_fit']} fit + {payload['n_validation']} "
        f"validation) / {payload['n_eval']} evaluation items per seed, "
        f"{payload.get('n_held_back', 0)} held-back items (a {held.get('fraction')} share drawn "
        f"once by seed {held.get('seed')}, in no development split), {payload['n_classes']} "
        f"classes; {payload['epochs']} epochs; {payload['elapsed_minutes']:.0f} min"
        + (f" summed over {payload['units']} processes" if payload.get("units") else "")
        + (f" (wall clock, {payload['jobs']} seeds at once)" if payload.get("jobs", 1) > 1 else "")
        + f" on {payload['machine']}.",
        f"Class scenarios run: {', '.join(run)}."
        + (f" {payload['note']}" if payload.get("note") else ""),
        f"Every method, per seed on that seed's validation carve: {payload['trials_per_method']} "
        f"validation trials on its own knob, then {extra} more (a grid step past the end the "
        "best sits on, else between the best and its better neighbour): "
        f"{payload['trials_per_method'] + extra} trials for every tuned method, widening "
        "included (procrustes: closed form, one fit), the same grids in every scenario "
        "(`bench/quality/compat_grid.py`), each bridge tuned under auto's instance floor "
        f"(validation own-item R@1 ≥ {INSTANCE_FLOOR} × procrustes's; P_up is a reported "
        "target, not a selection floor, as in auto), ranked by the gain of new→old over "
        "old→old; a chosen value at an end of what was tried is marked as an edge. "
        "`auto` is the service's (`app/ml/auto/candidates.py`: its own candidates, grids and "
        f"trials, objective `class`, params {json.dumps(payload['auto_params'])}), trained on the "
        "training part" + halving_text(payload["auto_params"]),
        "Class view on the evaluation set (query and gallery, self excluded): CMC@1 and mAP@100 "
        "divided by min(relevant, 100). Instance view: each evaluation item's new features "
        "against the whole old gallery (every item a distractor): own-item R@1, R@10, MRR@100. "
        "P_com = (M(new→old) − M(old→old)) / (M(ref) − M(old→old)), P_up = (M(own space) − "
        "M(ref)) / M(ref), ref = the stronger of the raw new backbone and the independent head.",
        "",
        "Targets (issues 10 and 26): met only when the 95 % interval across seeds clears the "
        "target (comparisons and shares per seed first):",
        "",
        *target_lines(payload),
        "",
    ]
    for sc in payload["scenarios"]:
        lines += scenario_markdown(sc)
    finals = [sc for sc in payload["scenarios"] if sc.get("final_summary")]
    if finals:
        lines += [
            "### Held-back items (`--final`: evaluated once, reported apart)",
            "",
            "The same trained models (each seed's selection and training) measured on the "
            "held-back items instead of the seed's evaluation part. Targets on these figures:",
            "",
            *target_lines(payload, part="final_metrics"),
            "",
            *look_lines(finals),
        ]
        for sc in finals:
            lines += scenario_markdown(sc, key="final_summary")
    if payload.get("querydoc"):
        lines += querydoc_markdown(payload["querydoc"])
    return "\n".join(lines)


def write_outputs(payload: dict[str, Any], out: Path, markdown: bool) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(json_safe(payload), indent=1))
    if markdown:
        quick = payload["quick"]
        title = "Backward compatibility (`bench.quality.compat`" + (", quick)" if quick else ")")
        replace_section(SECTION + (".quick" if quick else ""), title, render_markdown(payload))
    return out


def merge_runs(
    paths: list[Path],
    out: Path,
    order: list[str],
    markdown: bool,
    note: str | None = None,
    querydoc_part: dict[str, Any] | None = None,
) -> Path:
    """One payload from several: scenarios in the benchmark's order, ``querydoc_part`` (else the
    first query→document part found), elapsed times summed, every command named; ``note``
    replaces the runs' notes (which describe what each run left out)."""
    payloads = [json.loads(p.read_text()) for p in paths]
    draws = {json.dumps(p.get("held_back"), sort_keys=True) for p in payloads}
    if len(draws) > 1:
        # One table, one held-back set: runs under different draws are not comparable there.
        raise SystemExit(f"the runs were made with different held-back draws: {sorted(draws)}")
    by_name = {sc["scenario"]["name"]: sc for p in payloads for sc in p["scenarios"]}
    merged = {
        **payloads[0],
        "command": " and ".join(p["command"] for p in payloads),
        "elapsed_minutes": sum(p["elapsed_minutes"] for p in payloads),
        # A run without units was one process.
        "units": sum(p.get("units") or 1 for p in payloads),
        "extend_rounds": max(p.get("extend_rounds", 0) for p in payloads),
        "scenarios": [by_name[n] for n in order if n in by_name],
        "querydoc": querydoc_part
        or next((p["querydoc"] for p in payloads if p.get("querydoc")), None),
        "note": note
        if note is not None
        else next((p["note"] for p in payloads if p.get("note")), None),
    }
    return write_outputs(merged, out, markdown)
