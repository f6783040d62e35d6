"""An upgrade's report as one self-contained HTML page: the verdict in plain words, each view's
metrics for every alternative (stay, the bridges, reindex) as plots and tables, the loss per
epoch, the uncertainty calibration and the backfill curve when the report has them.

Plots are rendered by matplotlib (Agg) to PNG and inlined as data URIs; the page loads nothing
from anywhere (no script, no CDN, no font), so it reads the same offline, attached to a ticket or
archived. Pure: a job's JSON in, a string out.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

# Order of the alternatives on every plot: the old model, the bridges, the new model natively.
FIRST, LAST = ("stay",), ("reindex",)
REFERENCE_ONLY = ("independent",)
VIEW_TITLES = {
    "instance": "Instance search: an item's new features → its own old vector",
    "query": "Query → document: logged queries → the documents they are about",
    "class": "Class level: items → other items of their class",
}
ACTION_WORDS = {
    "bridge": "Bridge: search the old gallery with the new model's queries",
    "stay": "Stay: keep the old model for queries",
    "reindex": "Reindex: re-embed the gallery with the new model",
    "transition": "Transition: re-embed step by step while the old model serves the rest",
    "measure": "Measure: these figures cannot tell yet — upload what is missing",
}
STYLE = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:60em;color:#1a1a1a;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.8em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:right}th:first-child,td:first-child{text-align:left}
.verdict{background:#f4f8ff;border-left:4px solid #3367d6;padding:.8em 1em}
.warning{background:#fff4f2;border-left:4px solid #d93025;padding:.5em 1em;margin:.8em 0}
.verdict.stay{border-color:#999}.verdict.reindex{border-color:#d93025}
.served{font-weight:600}img{max-width:100%}dt{font-weight:600}small{color:#555}
.scroll{overflow-x:auto;max-width:100%}td{overflow-wrap:anywhere}code{overflow-wrap:anywhere}
"""


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int | float):
        return "—" if not math.isfinite(float(value)) else f"{float(value):.3f}"
    return html.escape(str(value))


def _png(fig: Any) -> str:
    """The figure as an inline <img> (PNG data URI); the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img class="plot" alt="plot" src="data:image/png;base64,{data}">'


def _figure(width: float = 8.0, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def _alternatives(metrics: dict[str, Any], view: str) -> list[str]:
    """Alternatives measured in ``view``: stay first, reindex last, bridges between."""
    names = [n for n, m in metrics.items() if isinstance(m.get(view), dict) and m[view]]
    middle = [n for n in names if n not in FIRST + LAST + REFERENCE_ONLY]
    return [n for n in FIRST if n in names] + middle + [n for n in LAST if n in names]


def _view_metrics(metrics: dict[str, Any], view: str, names: list[str]) -> list[str]:
    keys: list[str] = []
    for name in names:
        for key, value in metrics[name][view].items():
            if isinstance(value, int | float) and key not in keys:
                keys.append(key)
    return keys


def _value_axis(metrics: dict, names: list[str], keys: list[str], view: str) -> tuple[float, float]:
    """The value axis from 0 (issue 44: an axis from 0.95 made a 2-point gap look like 20) to
    a little above the largest figure shown, at least 1.05 for recalls and shares."""
    values = [
        v
        for name in names
        for k in keys
        if isinstance(v := metrics[name][view].get(k), int | float) and math.isfinite(v)
    ]
    top = max(values, default=1.0)
    return 0.0, max(1.05, top * 1.05)


def _bars(title: str, names: list[str], keys: list[str], metrics: dict, view: str, served: str):
    fig, ax = _figure()
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [metrics[name][view].get(k) for k in keys]
        heights = [v if isinstance(v, int | float) and math.isfinite(v) else 0.0 for v in values]
        positions = [j + (i - (len(names) - 1) / 2) * width for j in range(len(keys))]
        bars = ax.bar(positions, heights, width, label=name)
        if name == served:
            for bar in bars:
                bar.set_edgecolor("black")
                bar.set_linewidth(1.5)
    ax.set_xticks(range(len(keys)), keys)
    ax.set_ylim(*_value_axis(metrics, names, keys, view))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncols=min(4, len(names)), loc="upper left", bbox_to_anchor=(0, -0.12))
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _table(names: list[str], keys: list[str], metrics: dict, view: str, served: str) -> str:
    header = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    arr_keys = keys if any(metrics[n].get("arr", {}).get(view) for n in names) else []
    header += "".join(f"<th>ARR {html.escape(k)}</th>" for k in arr_keys)
    rows = []
    for name in names:
        cells = "".join(f"<td>{_number(metrics[name][view].get(k))}</td>" for k in keys)
        ratios = metrics[name].get("arr", {}).get(view) or {}
        cells += "".join(f"<td>{_number(ratios.get(k))}</td>" for k in arr_keys)
        css = ' class="served"' if name == served else ""
        rows.append(f"<tr{css}><td>{html.escape(name)}</td>{cells}</tr>")
    return f"<table><tr><th>alternative</th>{header}</tr>{''.join(rows)}</table>"


def _compatibility_table(metrics: dict[str, Any]) -> str:
    rows = []
    for name, entry in metrics.items():
        for key in ("p_com", "p_up"):
            values = entry.get(key)
            if isinstance(values, dict):
                cells = "".join(
                    f"<td>{html.escape(str(k))} {_number(v)}</td>"
                    for k, v in values.items()
                    if not isinstance(v, dict)
                )
                rows.append(f"<tr><td>{html.escape(name)}</td><td>{key}</td>{cells}</tr>")
    if not rows:
        return ""
    reference = next(
        (e.get("reference") for e in metrics.values() if isinstance(e.get("reference"), str)), None
    )
    note = f"<p><small>reference: {html.escape(reference)}</small></p>" if reference else ""
    return f"<h3>Compatibility (class view)</h3><table>{''.join(rows)}</table>{note}"


def _history(history: list[dict[str, Any]]) -> str:
    points = [
        (h["epoch"], h["loss"])
        for h in history
        if isinstance(h.get("loss"), int | float) and math.isfinite(h["loss"])
    ]
    if not points:
        return "<p>The served method has no training loss (a closed-form fit).</p>"
    fig, ax = _figure(height=3.0)
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    return _png(fig)


# Below this spread of the bins' mean uncertainty the items are indistinguishable by it: a plot
# would only draw float noise (one report's bins spanned 1e-8).
MIN_UNCERTAINTY_SPREAD = 1e-3


def _calibration(calibration: dict[str, Any]) -> str:
    bins = calibration.get("bins") or []
    if not bins:
        return ""
    rho = calibration.get("spearman")
    shuffled = calibration.get("spearman_shuffled")
    words = (
        f"Spearman ρ between uncertainty and failure {_number(rho)} "
        f"(shuffled control {_number(shuffled)})."
    )
    spread = max(b["uncertainty"] for b in bins) - min(b["uncertainty"] for b in bins)
    if not spread >= MIN_UNCERTAINTY_SPREAD:
        return (
            f"<h2>Uncertainty calibration</h2><p>The old embeddings' uncertainty barely varies "
            f"(bins span {spread:.2g}): it cannot rank items, so there is no plot. {words}</p>"
        )
    fig, ax = _figure(height=3.0)
    ax.plot(
        [b["uncertainty"] for b in bins],
        [b["failure_rate"] for b in bins],
        marker="o",
        label="items",
    )
    ax.set_xlabel("old embedding's uncertainty (bin mean)")
    ax.set_ylabel("old→old top-1 failure rate")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    return f"<h2>Uncertainty calibration</h2>{_png(fig)}<p>{words}</p>"


def _backfill(curve: dict[str, Any]) -> str:
    points = curve.get("points") or []
    if not points:
        return ""
    fig, ax = _figure(height=3.0)
    ax.plot([p["fraction"] for p in points], [p["value"] for p in points], marker="o", label="plan")
    ax.set_xlabel("fraction of the gallery re-embedded")
    ax.set_ylabel(str(curve.get("metric", "quality")))
    ax.grid(alpha=0.3)
    return f"<h2>Partial backfill</h2>{_png(fig)}"


def _two_stage(curve: dict[str, Any] | None, metrics: dict[str, Any]) -> str:
    """The depth curve of a two-stage search on the held-out queries (``two_stage`` of the
    report), beside stay's and the reindex's recall@10."""
    if not curve:
        return ""
    sources = [
        (s, label)
        for s, label in (("old", "old query vectors"), ("bridge", "bridged"))
        if s in curve
    ]
    head = "".join(f"<th>R@10, candidates by {html.escape(label)}</th>" for _, label in sources)
    rows = "".join(
        f"<tr><td>{d}</td>"
        + "".join(f"<td>{_number(curve[s][str(d)]['recall@10'])}</td>" for s, _ in sources)
        + f"<td>{_number(curve[sources[0][0]][str(d)]['embedded_per_query'])}</td></tr>"
        for d in curve.get("depths", [])
    )
    query = {
        name: metrics.get(name, {}).get("query", {}).get("recall@10")
        for name in ("stay", "reindex")
    }
    return (
        "<h2>Two-stage search</h2><p>Candidates from the old index, ranked by the new model "
        f"(the dataset's new features standing in for the embedder), on {curve.get('queries')} "
        f"held-out queries: stay {_number(query['stay'])}, reindex {_number(query['reindex'])} "
        "recall@10. Documents embedded per query: the distinct candidates over these queries, "
        f"each embedded once.</p><table><tr><th>depth</th>{head}<th>embedded per query</th></tr>"
        f"{rows}</table>"
    )


def _validation_figures(validation: dict[str, Any]) -> dict[str, float]:
    """A candidate's validation figures, ``{view: {metric: value}}`` flattened to
    ``"view metric"`` (a flat ``{metric: value}`` is kept as it is)."""
    out: dict[str, float] = {}
    for key, value in validation.items():
        if isinstance(value, dict):
            for metric, v in value.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    out[f"{key} {metric}"] = v
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
    return out


def _candidates(candidates: list[dict[str, Any]], chosen: str | None) -> str:
    if not candidates:
        return ""
    figures = [_validation_figures(c.get("validation") or {}) for c in candidates]
    keys: list[str] = []
    for f in figures:
        keys += [k for k in f if k not in keys]
    header = "".join(f"<th>validation {html.escape(k)}</th>" for k in keys)
    rows = []
    for c, f in zip(candidates, figures, strict=True):
        name = str(c.get("name"))
        cells = "".join(f"<td>{_number(f.get(k))}</td>" for k in keys)
        settings = ", ".join(f"{k}={v}" for k, v in (c.get("chosen_settings") or {}).items())
        css = ' class="served"' if name == chosen else ""
        rows.append(
            f"<tr{css}><td>{html.escape(name)}</td>{cells}"
            f"<td>{html.escape(settings)}</td><td>{_number(c.get('eligible'))}</td></tr>"
        )
    return (
        "<h2>Candidates (chosen on a validation split of the training data)</h2>"
        f"<table><tr><th>candidate</th>{header}<th>settings</th><th>eligible</th></tr>"
        f"{''.join(rows)}</table>"
    )


def measured_meanings(meanings: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """The glossary restricted to what the report measured: a view's entries only for a view some
    alternative has figures in, and only its metrics that have a figure."""
    measured: dict[str, set[str]] = {}
    for entry in metrics.values():
        for view, values in entry.items() if isinstance(entry, dict) else ():
            if isinstance(values, dict):
                measured.setdefault(view, set()).update(values)
    out: dict[str, Any] = {}
    for key, value in meanings.items():
        if isinstance(value, dict) and key in VIEW_TITLES:
            kept = {m: text for m, text in value.items() if m in measured.get(key, ())}
            if kept:
                out[key] = kept
        else:
            out[key] = value
    return out


def _meanings(meanings: dict[str, Any]) -> str:
    """``{view: {metric: meaning}}`` (or a flat ``{metric: meaning}``) as definition lists."""
    if not meanings:
        return ""
    parts = ["<h2>What the metrics mean</h2>"]
    flat = {k: v for k, v in meanings.items() if not isinstance(v, dict)}
    groups = {k: v for k, v in meanings.items() if isinstance(v, dict)}
    for title, entries in ([("", flat)] if flat else []) + list(groups.items()):
        if title:
            parts.append(f"<h3>{html.escape(VIEW_TITLES.get(title, title))}</h3>")
        items = "".join(
            f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>"
            for k, v in entries.items()
        )
        parts.append(f"<dl>{items}</dl>")
    return "".join(parts)


def _flat_rows(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Numeric leaves of a nested report (continual reports have their own shape)."""
    if isinstance(value, dict):
        rows: list[tuple[str, Any]] = []
        for k, v in value.items():
            rows += _flat_rows(v, f"{prefix}.{k}" if prefix else str(k))
        return rows
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [(prefix, value)]
    return []


def with_ids(step: Any, job: dict[str, Any]) -> str | None:
    """A verdict's next step with this job's ids in place of GALLERY, MODEL and DATASET (the
    verdict is written without them), so the command can be pasted as it is."""
    if not step:
        return None
    text = str(step)
    for placeholder, key in (
        ("GALLERY", "gallery_id"),
        ("MODEL", "model_id"),
        ("DATASET", "dataset_id"),
    ):
        if job.get(key):
            text = text.replace(placeholder, str(job[key]))
    return text


def render_report_html(job: dict[str, Any]) -> str:
    """The page for an upgrade job as ``GET /v1/upgrades/{id}`` returns it (a finished one)."""
    report = job.get("report") or {}
    metrics: dict[str, Any] = report.get("metrics") or {}
    served = report.get("chosen_method") or job.get("method") or ""
    title = f"Upgrade {job.get('id', '')}"
    parts = [f"<h1>{html.escape(title)}</h1>"]
    # The verdict first: what to do, why, and the next step; the facts and figures follow.
    verdict = report.get("recommendation")
    if isinstance(verdict, dict):
        action = str(verdict.get("action", ""))
        next_step = with_ids(verdict.get("next_step"), job)
        over_http = with_ids(verdict.get("next_step_http"), job)
        parts.append(
            f'<div class="verdict {html.escape(action)}"><h2>Verdict: '
            f"{html.escape(ACTION_WORDS.get(action, action))}</h2>"
            f"<p>{html.escape(str(verdict.get('why', '')))}</p>"
            + (
                f"<p><b>Next step:</b> <code>{html.escape(next_step)}</code></p>"
                if next_step
                else ""
            )
            + (
                f"<p><small>over HTTP: <code>{html.escape(over_http)}</code></small></p>"
                if over_http
                else ""
            )
            + f"<p><small>Rule: {html.escape(str(verdict.get('rule', '')))}</small></p></div>"
        )
        below = verdict.get("below_old_model") or []
        if below:
            # Apart from the verdict's text: a served model worse than not upgrading must not
            # be missed by a reader who skims the verdict.
            items = "".join(
                f"<li>{html.escape(str(b['view']))} {html.escape(str(b['metric']))}: "
                f"bridge {_number(b['bridge'])}, stay {_number(b['stay'])}</li>"
                for b in below
            )
            parts.append(
                '<div class="warning"><b>The served model is below the old model</b> on '
                f"held-out data:<ul>{items}</ul></div>"
            )
    facts = {
        "method requested": job.get("method"),
        "method served": served,
        "model": job.get("model_id"),
        "objective": report.get("objective"),
        "items (train / held out)": f"{report.get('n_train', '—')} / {report.get('n_eval', '—')}",
        "logged queries": report.get("n_queries"),
        "finished": job.get("finished_at"),
    }
    parts.append(
        "<table>"
        + "".join(
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
            for k, v in facts.items()
            if v is not None
        )
        + "</table>"
    )
    for view in report.get("views") or [
        v for v in VIEW_TITLES if any(v in m for m in metrics.values())
    ]:
        names = _alternatives(metrics, view)
        if view == "instance":
            # Staying finds each item's own old vector by construction: the verdict calls its
            # own-item figure n/a, and no bar or row stands for it.
            names = [n for n in names if n != "stay"]
        keys = _view_metrics(metrics, view, names)
        if not names or not keys:
            continue
        heading = VIEW_TITLES.get(view, view)
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(_bars(heading, names, keys, metrics, view, served))
        parts.append(_table(names, keys, metrics, view, served))
        if view == "class":
            parts.append(_compatibility_table(metrics))
    if not metrics:
        rows = _flat_rows(report)
        if rows:
            parts.append(
                "<h2>Figures</h2><table>"
                + "".join(
                    f"<tr><td>{html.escape(k)}</td><td>{_number(v)}</td></tr>" for k, v in rows
                )
                + "</table>"
            )
    parts.append(_candidates(report.get("candidates") or [], served))
    parts.append("<h2>Training loss of the served model</h2>")
    parts.append(_history(report.get("history") or []))
    parts.append(_calibration(report.get("calibration") or {}))
    parts.append(_backfill(report.get("backfill") or {}))
    parts.append(_two_stage(report.get("two_stage"), metrics))
    parts.append(_meanings(measured_meanings(report.get("metric_meanings") or {}, metrics)))
    body = "\n".join(p for p in parts if p)
    # Every table scrolls inside its own box: a wide one (the candidates' settings) never
    # widens the page past the window (it overflowed at 1,280 px).
    body = body.replace("<table>", '<div class="scroll"><table>').replace(
        "</table>", "</table></div>"
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )
