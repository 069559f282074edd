"""The report as one HTML page: the latency of every measured candidate, where the tuning
time went, every candidate's fate, the environment, for reduced precision its accuracy
against its speed, and with optimize(traffic=...) the requests by length with the buckets on
them (`Report.to_html`, `infertune report ... --html`, `infertune demo`).

One self-contained file: inline SVG and CSS, no script and nothing fetched, so that it opens
offline and can be kept as a CI artifact. Every number written on the page is the report's
own, formatted and never recomputed; only positions on the axes are computed (html_charts.py).
The same report gives the same bytes: no time stamp, no random id, fixed float formats, the
environment's keys sorted, so that two renderings compare equal and a diff means the report
changed.

The charts are html_charts.py's. Functions of a Report only: this module imports no part of
infertune that imports report/data.py, so that `Report.to_html` can call it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..accuracy import RELATIVE_ERROR
from .format import escape, finite, sci, sig4
from .html_charts import bars_chart, frontier_chart, latency_chart, stage_legend, traffic_chart
from .stages import CANDIDATE_STAGES
from .traffic import (
    as_number,
    bucket_rows,
    comparison_rows,
    held_out_words,
    longer_candidate,
    padding_words,
    ratio,
    waste_words,
)

if TYPE_CHECKING:
    from pathlib import Path

    from . import (
        CandidateResult,
        Report,
    )
    from .stages import StageTimes

__all__ = ["render", "write_html"]

WHY_CHARS = 160  # a longer reason in the table folds after its first clause (<details>)

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2430;
  margin: 24px auto; max-width: 1080px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px;
  border-bottom: 1px solid #d5dae1; padding-bottom: 4px; } h3 { font-size: 15px; }
dl.summary, dl.env { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; }
dl dt { font-weight: 600; color: #4a5568; } dl dd { margin: 0; }
dl.env dl.env { grid-template-columns: max-content 1fr; margin: 0; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #e6e9ee;
  vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.name { font-family: ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; }
.status { font-weight: 600; } .status-selected { color: #1a7f37; }
.status-ok { color: #3b6ea5; } .status-mismatch, .status-failed, .status-timeout { color: #b42318; }
.status-unavailable, .status-skipped { color: #6b7280; }
p.legend, p.caption { color: #4a5568; font-size: 13px; margin: 4px 0 16px; }
details summary { cursor: pointer; }
pre { background: #f6f8fa; padding: 10px; overflow-x: auto; font-size: 12px; }
svg { max-width: 100%; height: auto; display: block; }
svg text { font: 12px system-ui, -apple-system, "Segoe UI", sans-serif; fill: #1d2430; }
svg text.name { font-family: ui-monospace, Menlo, Consolas, monospace; }
svg text.tick, svg text.value { fill: #4a5568; font-size: 11px; }
svg line.grid { stroke: #e6e9ee; } svg line.axis { stroke: #8a94a3; }
svg .mark line.whisker { stroke: #5b6b80; stroke-width: 1.5; }
svg .mark.left line.whisker { stroke-dasharray: 3 2; }
svg .mark rect.box { fill: #9db7d5; stroke: #3b6ea5; }
svg .mark line.median { stroke: #16325c; stroke-width: 2.5; }
svg .mark line.round { stroke: #16325c; stroke-width: 1; opacity: 0.6; }
svg .mark circle.mean { fill: #ffffff; stroke: #16325c; }
svg .mark rect.row { fill: transparent; }
svg .mark.selected rect.row { fill: #fff2c2; }
svg .mark.selected rect.box { fill: #f2b544; stroke: #9a6400; }
svg .mark.selected text.name { font-weight: 700; }
svg .mark.general rect.row { fill: #eef4e8; }
svg rect.accepted-region { fill: #dff3e4; } svg line.reference { stroke: #1a7f37;
  stroke-dasharray: 5 3; } svg line.fp32 { stroke: #9a6400; stroke-dasharray: 5 3; }
svg .point circle { stroke: #1d2430; stroke-width: 1; } svg .point line { stroke: #1d2430; }
svg .point.accepted circle { fill: #2da44e; } svg .point.rejected circle { fill: #cf222e; }
svg .point.other circle { fill: #8a94a3; }
svg .point.selected circle { stroke-width: 3; } svg rect.lane { fill: #f6f8fa; }
svg rect.bin { fill: #9db7d5; stroke: #3b6ea5; stroke-width: 0.5; }
svg rect.band-even { fill: #fff8e1; } svg rect.band-odd { fill: #eef4e8; }
svg .bound line.bound { stroke: #b42318; stroke-width: 2; stroke-dasharray: 5 3; }
svg .bound text.bound { fill: #b42318; font-family: ui-monospace, Menlo, Consolas, monospace; }
"""


# -- the page ---------------------------------------------------------------------------------
def render(report: Report) -> str:
    """The page, as text: the same report gives the same text."""
    title = f"infertune report: {report.model}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8"/>',
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
        f"<title>{escape(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{escape(title)}</h1>",
        _summary(report),
        _latency_section(report),
        _precision_section(report),
        _traffic_section(report.traffic),
        _stages_section(report.stages),
        _candidates_section(report),
        _notes_section(report),
        _environment_section(report.environment),
        "</body>",
        "</html>",
    ]
    return "\n".join(part for part in parts if part) + "\n"


def write_html(report: Report, path: str | Path) -> str:
    """Write the page to `path` (`~` expanded) and return its text."""
    from ..system.paths import user_path

    text = render(report)
    user_path(path).write_bytes(text.encode("utf-8"))
    return text


def _summary(report: Report) -> str:
    items = [
        ("inputs", report.signature),
        ("batch size", report.batch_size),
        ("objective", report.objective),
        ("tolerance", f"rtol={report.rtol:g} atol={report.atol:g}"),
        ("selected", f"{report.selected} ({report.selection_reason})"),
    ]
    if report.general_backend:
        items.append(("every other shape", f"{report.general_backend} ({report.general_reason})"))
    items.extend(("batch sizes", line) for line in report.batch_summary())
    if report.from_cache:
        items.append(("from the tuning cache", "measured earlier, not in this call"))
    items.append(("optimize() took", f"{report.total_s:.1f} s"))
    memory = report.memory or {}
    if memory.get("peak_bytes"):
        words = f"peak {_gb(memory['peak_bytes'])}, {_gb(memory.get('before_bytes') or 0)} before"
        if memory.get("weights_bytes"):
            words += f"; weights {_gb(memory['weights_bytes'])}"
        items.append(("memory", words))
    return _dl(items, "summary")


# -- latency ----------------------------------------------------------------------------------
def _latency_section(report: Report) -> str:
    if len(report.batches) > 1:
        charts = [
            latency_chart(
                f"batch {b.batch_size}: chosen {b.selected} ({b.reason})",
                b.latency,
                b.selected,
                None,
                f"batch-{b.batch_size}",
            )
            for b in report.batches
        ]
    else:
        measured = {c.name: c.latency for c in report.candidates if c.latency is not None}
        if not measured:
            return '<h2 id="latency">Latency</h2>\n<p>No candidate was measured.</p>'
        caption = f"batch {report.batch_size}: chosen {report.selected}"
        general = report.general_backend
        charts = [
            latency_chart(caption, measured, report.selected, general, f"batch-{report.batch_size}")
        ]
    legend = (
        '<p class="legend">Milliseconds per call, log scale, fastest first. Line: min to p99; '
        "box: p50 to p90; thick bar: p50; small ticks: the median of each interleaved round "
        "(their interquartile range is the spread); circle: mean. Highlighted: the chosen "
        "candidate; dashed line: a candidate far behind another that left the rounds early. "
        "Hover a row for all its numbers.</p>"
    )
    return "\n".join(['<h2 id="latency">Latency</h2>', legend, *charts])


# -- reduced precision ------------------------------------------------------------------------
def _precision_section(report: Report) -> str:
    """Speed against accuracy for every candidate the reduced-precision gate judged."""
    judged = [c for c in report.candidates if c.gate]
    if not judged:
        return ""
    by_metric = any(c.metric_drop is not None for c in judged)
    points = [c for c in judged if finite(c.metric_drop if by_metric else c.max_rel_err)]
    fp32 = [
        c
        for c in report.candidates
        if c.precision == "fp32" and c.latency is not None and c.status in ("ok", "selected")
    ]
    fastest = min(fp32, key=lambda c: (c.p50, c.name)) if fp32 else None
    if by_metric:
        first = next(c for c in points if c.metric_drop is not None)
        what = (
            f"down, its drop against the float32 model (metric {sig4(first.reference_metric)}; "
            f"the dot as measured, the line to the upper end of its 95% interval, which the "
            f"gate holds against max_drop {sig4(first.max_drop)}: the shaded band passes)"
        )
    else:
        what = (
            f"down, its largest relative error against the model (the shaded band: within "
            f"{RELATIVE_ERROR:g}; a classifier must also keep the top-1 class, not drawn)"
        )
    caption = (
        f'<p class="caption">Judged by: {escape(judged[0].gate)}. Each candidate the gate judged: '
        f"across, its p50 (ms, log scale); {escape(what)}. Up and left is better. Dashed: "
        + (
            f"the fastest float32 candidate, {escape(fastest.name)} (p50 {sig4(fastest.p50)} ms): "
            "a reduced-precision candidate pays for its error only left of it. "
            if fastest
            else ""
        )
        + "A candidate the gate rejected is not timed: it stands in the lane on the right.</p>"
    )
    chart = frontier_chart(points, by_metric, fastest)
    return "\n".join(
        ['<h2 id="precision">Reduced precision: accuracy against speed</h2>', caption, chart,
         _precision_table(points, by_metric)]
    )  # fmt: skip


def _precision_table(points: list[CandidateResult], by_metric: bool) -> str:
    head = ["#", "candidate", "status", "precision", "p50 ms"]
    head += ["metric", "float32", "drop", "at most (95%)", "max_drop"] if by_metric else ["rel err"]
    head.append("how")
    rows = []
    for number, c in enumerate(points, 1):
        cells = [str(number), c.name, c.status, c.precision, sig4(c.p50)]
        if by_metric:
            cells += [sig4(c.metric), sig4(c.reference_metric), sig4(c.metric_drop),
                      sig4(c.metric_drop_bound), sig4(c.max_drop)]  # fmt: skip
        else:
            cells.append(sci(c.max_rel_err))
        how = c.quantization or ""
        for kept in c.kept_fp32 or []:
            how += f"; kept {kept.get('layer')} in float32: p50 {sig4(kept.get('p50_ms'))} ms"
        cells.append(how)
        rows.append((c.status, cells))
    return _table(head, rows, numeric={0, 4, 5, 6, 7, 8, 9} if by_metric else {0, 4, 5})


# -- every candidate --------------------------------------------------------------------------
def _candidates_section(report: Report) -> str:
    head = ["candidate", "status", "precision", "p50 ms", "p99 ms", "n", "rel err", "prepare s",
            "why"]  # fmt: skip
    rows = []
    for c in report.candidates:
        why = _folded("; ".join(p for p in (c.exact_words, c.reason, c.quantization or "") if p))
        n = "-" if c.n is None else str(c.n)
        cells = [c.name, c.status, c.precision, sig4(c.p50), sig4(c.p99), n, sci(c.max_rel_err),
                 sig4(c.prepare_s), why]  # fmt: skip
        rows.append((c.status, cells))
    return '<h2 id="candidates">Every candidate</h2>\n' + _table(
        head, rows, numeric={3, 4, 5, 6, 7}
    )


# -- traffic ----------------------------------------------------------------------------------
def _traffic_section(traffic: dict | None) -> str:
    """optimize(traffic=...): the padding check, what was kept, the requests by length with
    the buckets on them, each bucket, the expected latency against the alternatives, and
    what each candidate was measured at."""
    if not traffic:
        return ""
    items = [("traffic", traffic.get("traffic") or traffic.get("requests") or "-")]
    padding = padding_words(traffic)
    if padding:
        items.append(("padding check", padding))
    if traffic.get("exact_only") and (padding is None or "not exact" not in padding):
        items.append(("padding not used", traffic["exact_only"]))
    for key, words in (("kept", traffic.get("kept")), ("padding waste", waste_words(traffic)),
                       ("held-out timing", held_out_words(traffic))):  # fmt: skip
        if words:
            items.append((key, words))
    parts = ['<h2 id="traffic">Traffic: buckets over the requests\' lengths</h2>',
             _dl(items, "summary")]  # fmt: skip
    histogram = traffic.get("histogram") or {}
    counts = [as_number(c) or 0.0 for c in histogram.get("counts") or []]
    edges = [as_number(e) for e in histogram.get("edges") or []]
    buckets = bucket_rows(traffic)
    if counts and len(edges) == len(counts) + 1 and None not in edges:
        parts.append(
            '<p class="caption">The traffic\'s requests by length'
            + (": each dashed line a bucket's upper bound, labelled by the candidate that runs "
               "it (hover for its figures)." if buckets else "; no buckets kept.")
            + "</p>"
        )  # fmt: skip
        parts.append(traffic_chart(counts, edges, buckets))
    parts.append(_buckets_table(traffic))
    parts.append(_comparison_table(traffic))
    parts.append(_lengths_table(traffic))
    return "\n".join(part for part in parts if part)


def _buckets_table(traffic: dict) -> str:
    buckets = bucket_rows(traffic)
    if not buckets:
        return ""
    rows = [
        ("ok", [b.lengths, b.candidate, b.runs_at, sig4(b.p50_ms),
                "-" if b.share is None else f"{b.share:.1%}"])
        for b in buckets
    ]  # fmt: skip
    longer = longer_candidate(traffic)
    if longer:
        rows.append(("ok", [f"> {buckets[-1].upper}", longer, "own length", "-", "-"]))
    head = ["lengths", "candidate", "runs at", "p50 ms at its bound", "requests"]
    return "<h3>Buckets</h3>\n" + _table(head, rows, numeric={3, 4})


def _comparison_table(traffic: dict) -> str:
    compared = comparison_rows(traffic)
    if not compared:
        return ""
    plan_mean = compared[0][2]
    rows = [
        ("ok", [what, candidate or "-", sig4(mean), sig4(p99),
                ratio(mean, plan_mean) if i else "-"])
        for i, (what, candidate, mean, p99) in enumerate(compared)
    ]  # fmt: skip
    head = ["expected a request over the traffic", "candidate", "mean ms", "p99 ms",
            "mean against the buckets'"]  # fmt: skip
    return "<h3>Expected latency</h3>\n" + _table(head, rows, numeric={2, 3, 4})


def _lengths_table(traffic: dict) -> str:
    """Each candidate's p50 at each length it was timed at, and what switching lengths from
    call to call cost it: what the buckets were planned from."""
    lengths, p50 = traffic.get("lengths") or [], traffic.get("p50_ms") or {}
    if not lengths or not p50:
        return ""
    switch = traffic.get("switch_ms") or {}
    rows = [
        ("ok", [name, *(sig4(as_number(v)) for v in values), sig4(as_number(switch.get(name)))])
        for name, values in p50.items()
    ]
    head = ["candidate", *(f"p50 ms at {n}" for n in lengths), "switching ms"]
    return (
        "<h3>What the buckets were planned from</h3>\n"
        '<p class="caption">Each candidate\'s p50 at each length it was timed at, and the '
        "time a call costs it beyond that where the lengths change from call to call.</p>\n"
        + _table(head, rows, numeric=set(range(1, len(lengths) + 2)))
    )


# -- tuning time ------------------------------------------------------------------------------
def _stages_section(stages: StageTimes | None) -> str:
    if stages is None:
        return ""
    shared = sorted(stages.shared.items(), key=lambda kv: (-kv[1], kv[0]))
    bars = [(stage, [(stage, s)]) for stage, s in shared]
    candidates = sorted(stages.candidates, key=lambda name: (-stages.candidate_s(name), name))
    own = [(name, _ordered(stages.candidates[name])) for name in candidates]
    other = [("other (between stages)", [("other", stages.other_s)])]
    scale = max([sum(s for _, s in segments) for _, segments in [*bars, *own, *other]] or [0])
    first_line = stages.summary().splitlines()[0]
    parts = [
        '<h2 id="time">Tuning time</h2>',
        f'<p class="caption">{escape(first_line)}. Shared stages, then each candidate\'s own '
        "(one colour per stage: hover for its seconds), on one scale.</p>",
        bars_chart("shared stages", bars, scale, "shared"),
        stage_legend(own),
        bars_chart("candidates", own, scale, "candidates"),
        bars_chart("other", other, scale, "other"),
    ]
    if stages.background:
        rows = [
            ("ok", [name, stage, f"{s:.2f}"])
            for name in sorted(stages.background)
            for stage, s in _ordered(stages.background[name])
        ]
        parts.append(
            '<p class="caption">Meanwhile, overlapped with the stages above and not part of '
            "their sum (the rehearsal child process, the background thread):</p>"
        )
        parts.append(_table(["candidate", "stage", "seconds"], rows, numeric={2}))
    return "\n".join(parts)


def _ordered(stages: dict[str, float]) -> list[tuple[str, float]]:
    """A candidate's stages in pipeline order, any other after them by name."""
    known = [(stage, stages[stage]) for stage in CANDIDATE_STAGES if stage in stages]
    return known + sorted((k, v) for k, v in stages.items() if k not in CANDIDATE_STAGES)


# -- notes and environment --------------------------------------------------------------------
def _notes_section(report: Report) -> str:
    parts = []
    if report.notes:
        items = "\n".join(f"<li>{escape(note)}</li>" for note in report.notes)
        parts.append(f'<h2 id="notes">Notes</h2>\n<ul>\n{items}\n</ul>')
    if report.diagnosis is not None:
        diagnosis = escape(str(report.diagnosis))
        parts.append(f'<h2 id="diagnosis">Diagnosis</h2>\n<pre>{diagnosis}</pre>')
    return "\n".join(parts)


def _environment_section(environment: dict) -> str:
    return '<h2 id="environment">Environment</h2>\n' + _env_dl(environment or {})


def _env_dl(values: dict) -> str:
    items = []
    for key in sorted(values, key=str):
        value = values[key]
        if isinstance(value, dict) and value:
            shown = _env_dl(value)
        elif isinstance(value, list | tuple):
            shown = escape(", ".join(_plain(v) for v in value) or "-")
        else:
            shown = escape(_plain(value))
        items.append(f"<dt>{escape(key)}</dt><dd>{shown}</dd>")
    return '<dl class="env">' + "".join(items) + "</dl>"


def _plain(value) -> str:
    if value is None or value == {}:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in sorted(value.items(), key=str))
    return str(value)


# -- small pieces -----------------------------------------------------------------------------
def _table(head: list[str], rows: list[tuple[str, list[str]]], numeric: set[int]) -> str:
    """A table; `rows` are (status, cells): the status column is coloured by it."""

    def cell(tag: str, i: int, text: str, status: str) -> str:
        shown = text if isinstance(text, _Markup) else escape(text)
        classes = ["num"] if i in numeric else []
        if tag == "td" and head[i] == "candidate":
            classes.append("name")
        if tag == "td" and head[i] == "status":
            classes += ["status", f"status-{status}"]
        attr = f' class="{" ".join(classes)}"' if classes else ""
        return f"<{tag}{attr}>{shown}</{tag}>"

    lines = [
        "<table>",
        "<tr>" + "".join(cell("th", i, h, "") for i, h in enumerate(head)) + "</tr>",
    ]
    for status, cells in rows:
        lines.append(
            "<tr>" + "".join(cell("td", i, text, status) for i, text in enumerate(cells)) + "</tr>"
        )
    lines.append("</table>")
    return "\n".join(lines)


class _Markup(str):
    """Text already written as HTML (escaped where it holds the report's words)."""


def _folded(why: str) -> str:
    """A long reason as its first clause, the rest folded under it (no script: <details>)."""
    if len(why) <= WHY_CHARS:
        return why
    first, sep, rest = why.partition("; ")
    if not sep or len(first) > WHY_CHARS:
        first, rest = why[:WHY_CHARS], why[WHY_CHARS:]
    return _Markup(f"<details><summary>{escape(first)}</summary>{escape(rest)}</details>")


def _dl(items: list[tuple[str, object]], cls: str) -> str:
    body = "".join(f"<dt>{escape(k)}</dt><dd>{escape(_plain(v))}</dd>" for k, v in items)
    return f'<dl class="{cls}">{body}</dl>'


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
