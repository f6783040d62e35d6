"""bench.quality.compat's summaries, targets and BENCHMARKS.md section (the query→document part reuses
``bench.quality.querydoc``'s runs, summaries and targets)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from app.ml.auto.candidates import INSTANCE_FLOOR
from app.ml.evaluation.retrieval import json_safe
from bench.common.report import replace_section
from bench.quality import compat_grid, querydoc

SECTION = "bench.quality.compat"
TARGET_SCENARIO = "external"
TARGET_P_COM = 0.70
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
    """[mean, sd (ddof=1)] of the finite values, None when there are none."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None
    return [float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0]


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """mean ± sd over seeds of every figure of every row, the stronger reference per metric
    over seeds, and what auto chose per seed."""
    rows: dict[str, dict[str, list[float] | None]] = {}
    for name in runs[0]["metrics"]:
        per_seed = [dict(_flatten(r["metrics"][name])) for r in runs]
        keys = sorted({k for d in per_seed for k in d})
        rows[name] = {k: mean_sd([d.get(k) for d in per_seed]) for k in keys}
    reference = {
        m: [r["metrics"]["procrustes"]["reference"][m] for r in runs]
        for m in runs[0]["metrics"]["procrustes"].get("reference", {})
    }
    return {
        "rows": rows,
        "reference": reference,
        "auto_chosen": [r["auto"]["chosen"] for r in runs],
        "auto_settings": [r["auto"]["chosen_settings"] for r in runs],
    }


def merge_selections(selections: list[dict[str, Any]]) -> dict[str, Any]:
    """One selection from several ``select`` units over parts of the methods (each unit
    selects the independent head itself, deterministically: they must agree)."""
    merged: dict[str, Any] = {"trials": {}, "chosen": {}, "edge": {}}
    for sel in selections:
        for key in merged:
            for method, value in sel[key].items():
                if method in merged[key] and merged[key][method] != value:
                    raise ValueError(f"select units disagree on {method}'s {key}")
                merged[key][method] = value
    return merged


def _value(summary: dict[str, Any], row: str, key: str) -> float | None:
    pair = summary["rows"].get(row, {}).get(key)
    return None if pair is None else pair[0]


def _verdict(ok: bool, gap: float) -> str:
    return "met" if ok else f"missed by {abs(gap):.3f}"


def edge_lines(scenario: dict[str, Any]) -> list[str]:
    edges = {m: e for m, e in scenario["selection"]["edge"].items() if e}
    name = scenario["scenario"]["name"]
    if not edges:
        return [f"- {name}: no chosen value on an edge of its grid — met"]
    shown = ", ".join(f"{m} ({e} end)" for m, e in edges.items())
    tuned = sum(1 for m in scenario["selection"]["edge"] if compat_grid.GRIDS[m].axis)
    return [
        f"- {name}: chosen value on an edge of its grid for {shown} — missed for "
        f"{len(edges)} of {tuned} tuned methods"
    ]


def target_lines(payload: dict[str, Any]) -> list[str]:
    """The issue's targets, checked on the measured means: met, or missed by how much."""
    lines = []
    for sc in payload["scenarios"]:
        s, name = sc["summary"], sc["scenario"]["name"]
        auto = _value(s, "auto", "instance.recall@1")
        proc = _value(s, "procrustes", "instance.recall@1")
        if auto is not None and proc:
            share = auto / proc
            lines.append(
                f"- {name}: auto own-item R@1 {auto:.3f} = {share:.3f} × procrustes's {proc:.3f} "
                f"(target ≥ {INSTANCE_FLOOR}) — {_verdict(share >= INSTANCE_FLOOR, share - INSTANCE_FLOOR)}"
            )
        if name == TARGET_SCENARIO:
            pc = _value(s, "auto", "p_com.cmc1")
            pu = _value(s, "auto", "p_up.cmc1")
            if pc is not None:
                lines.append(
                    f"- {name}: auto P_com(CMC@1) {pc:.3f} (target ≥ {TARGET_P_COM}) — "
                    + _verdict(pc >= TARGET_P_COM, pc - TARGET_P_COM)
                )
            if pu is not None:
                lines.append(
                    f"- {name}: auto P_up(CMC@1) {pu:+.3f} (target ≥ {P_UP_FLOOR}) — "
                    + _verdict(pu >= P_UP_FLOOR, pu - P_UP_FLOOR)
                )
            rivals = [
                (v, m) for m in compat_grid.BRIDGES if (v := _value(s, m, "p_com.cmc1")) is not None
            ]
            if pc is not None and rivals:
                best, who = max(rivals)
                lines.append(
                    f"- {name}: auto P_com(CMC@1) {pc:.3f} above every single method's (best "
                    f"{who} {best:.3f}) — {_verdict(pc > best, pc - best)}"
                )
                # The same comparison among the methods that keep what auto must keep: own-item
                # R@1 ≥ the floor × procrustes's (a method tuned for class alone need not).
                kept = [
                    (v, m)
                    for v, m in rivals
                    if proc
                    and (r1 := _value(s, m, "instance.recall@1")) is not None
                    and r1 >= INSTANCE_FLOOR * proc
                ]
                if kept:
                    best, who = max(kept)
                    lines.append(
                        f"- {name}: auto P_com(CMC@1) {pc:.3f} above every single method that "
                        f"keeps own-item R@1 ≥ {INSTANCE_FLOOR} × procrustes's (best {who} "
                        f"{best:.3f}) — {_verdict(pc > best, pc - best)}"
                    )
    for sc in payload["scenarios"]:
        lines += edge_lines(sc)
    if payload.get("querydoc"):
        lines += [f"- query → document, {line[2:]}" for line in payload["querydoc"]["targets"]]
    return lines


def _fmt(pair: list[float] | None, signed: bool = False) -> str:
    if pair is None:
        return "—"
    value = f"{pair[0]:+.3f}" if signed else f"{pair[0]:.3f}"
    return value if len(pair) < 2 or pair[1] == 0 else f"{value} ± {pair[1]:.3f}"


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
ROW_LABELS = {
    "stay": "stay (old→old)",
    "reindex": "reindex (raw new backbone, cosine)",
    "independent": "independent (new head, own space)",
}


def _chosen_cell(sc: dict[str, Any], row: str) -> tuple[str, str]:
    sel = sc["selection"]
    if row not in sel["trials"]:
        return "—", "—"
    grid = compat_grid.GRIDS[row]
    if grid.axis is None:
        return "1", "closed form"
    value = sel["chosen"][row][grid.axis]
    edge = sel["edge"].get(row)
    return str(len(sel["trials"][row])), f"{grid.axis} {value}" + (
        f" (**{edge} edge**)" if edge else ""
    )


def scenario_markdown(sc: dict[str, Any]) -> list[str]:
    s, name = sc["summary"], sc["scenario"]["name"]
    refs = []
    for m, label in CLASS_LABELS.items():
        raw = _value(s, "reindex", f"class.{m}")
        ind = _value(s, "independent", f"class.{m}")
        names = sorted(set(s["reference"].get(m, [])))
        refs.append(
            f"{label}: raw new {raw:.3f}, independent {ind:.3f} → stronger: {', '.join(names)}"
        )
    temp = sc["selection"]["chosen"]["independent"].get("base_temperature")
    picks = "; ".join(
        f"seed {i}: {c} {json.dumps(st)}"
        for i, (c, st) in enumerate(zip(s["auto_chosen"], s["auto_settings"], strict=True))
    )
    old = OLD_SIDES[sc["scenario"]["old_training"]]
    lines = [
        f"### {name}",
        f"Old side: {old}. Reference for P_com / P_up (per metric, over seeds) — "
        + "; ".join(refs)
        + ".",
        f"L_base temperature (independent head's validation choice) {temp}. auto chose — {picks}.",
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
            trials, chosen = "auto's own", "see above"
        label = ROW_LABELS.get(row, f"**{row}**" if row == "auto" else row)
        cells = [_fmt(s["rows"][row].get(key), signed) for _, key, signed in COLUMNS]
        rows.append([label, trials, chosen, *cells])
    columns = ["method", "trials", "chosen on validation", *(c for c, _, _ in COLUMNS)]
    lines += _table(columns, rows)
    columns = ["auto candidate", "validation new→old CMC@1", "validation own-item R@1"]
    columns += [f"≥ {INSTANCE_FLOOR} × procrustes's R@1 (seeds)", "chosen (seeds)"]
    lines += ["", *_table(columns, auto_candidates(sc["runs"]))]
    cal = sc["calibration"]

    def rho(entry: dict) -> str:
        if entry.get("spearman") is None:
            return "n/a (constant)"
        return f"{entry['spearman']:+.3f} (shuffled {entry['spearman_shuffled']:+.3f})"

    lines += [
        "",
        f"Uncertainty calibration (Spearman with old→old top-1 failure, rate "
        f"{cal['old_old_failure_rate']:.3f}): norm {rho(cal['norm'])}; knn {rho(cal['knn'])}.",
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
        "targets": querydoc.targets(summary),
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


def render_markdown(payload: dict[str, Any]) -> str:
    run = [sc["scenario"]["name"] for sc in payload["scenarios"]]
    lines = [
        f"Command: `{payload['command']}` — {payload['seeds']} seeds, mean ± sd; "
        f"{payload['n_train']} training ({payload['n_fit']} fit + {payload['n_validation']} "
        f"validation) / {payload['n_eval']} evaluation items, {payload['n_classes']} classes; "
        f"{payload['epochs']} epochs; {payload['elapsed_minutes']:.0f} min"
        + (f" summed over {payload['units']} processes" if payload.get("units") else "")
        + f" on {payload['machine']}.",
        f"Class scenarios run: {', '.join(run)}."
        + (f" {payload['note']}" if payload.get("note") else ""),
        f"Every method: {payload['trials_per_method']} validation trials on its own knob "
        + (
            f"and, while the best sits at an end of what was tried, one more a grid step beyond "
            f"it, at most {payload['extend_rounds']} "
            if payload.get("extend_rounds")
            else ""
        )
        + "(procrustes: closed form, one fit), the same grids in every scenario "
        "(`bench/quality/compat_grid.py`); a chosen value still at an end of what was tried is marked "
        "as an edge. "
        "`auto` is the service's (`app/ml/auto/candidates.py`: same candidates and trials, objective "
        f"`class`, params {json.dumps(payload['auto_params'])}), trained on the training part.",
        "Class view on the evaluation set (query and gallery, self excluded): CMC@1 and mAP@100 "
        "divided by min(relevant, 100). Instance view: each evaluation item's new features "
        "against the whole old gallery (every item a distractor): own-item R@1, R@10, MRR@100. "
        "P_com = (M(new→old) − M(old→old)) / (M(ref) − M(old→old)), P_up = (M(own space) − "
        "M(ref)) / M(ref), ref = the stronger of the raw new backbone and the independent head.",
        "",
        "Targets (issue 10), checked on the means below:",
        "",
        *target_lines(payload),
        "",
    ]
    for sc in payload["scenarios"]:
        lines += scenario_markdown(sc)
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
