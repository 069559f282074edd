"""The report as one HTML page: the latency of every measured candidate, where the tuning
time went, every candidate's fate, the environment, and for reduced precision its accuracy
against its speed (`Report.to_html`, `infertune report ... --html`, `infertune demo`).

One self-contained file: inline SVG and CSS, no script and nothing fetched, so that it opens
offline and can be kept as a CI artifact. Every number written on the page is the report's
own, formatted and never recomputed; only positions on the axes are computed here. The same
report gives the same bytes: no time stamp, no random id, fixed float formats, the
environment's keys sorted, so that two renderings compare equal and a diff means the report
changed.

Each measured candidate is one `<g class="mark" data-candidate="NAME">` in its latency chart
(one chart per tuned batch size), the chosen one `class="mark selected"`; each
reduced-precision candidate one `<g class="point" data-candidate="NAME">` in the accuracy
chart. Functions of a Report only: this module imports no part of infertune that imports
report/data.py, so that `Report.to_html` can call it.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

from ..accuracy import RELATIVE_ERROR
from .stages import CANDIDATE_STAGES

if TYPE_CHECKING:
    from pathlib import Path

    from ..pipeline.timing import LatencyStats
    from . import (
        CandidateResult,
        Report,
    )
    from .stages import StageTimes

__all__ = ["render", "write_html"]

WIDTH = 1040  # every chart's width in SVG units (px at 100%)
NAME_W = 300  # the column of candidate names, left of each plot
NAME_CHARS = 40  # what that column holds in full: a longer name is cut, whole in its tooltip
WHY_CHARS = 160  # a longer reason in the table folds after its first clause (<details>)
PLOT_W = 400  # the plot itself; the numbers are written right of it
ROW_H = 24
AXIS_H = 34  # room above the first row for the axis and its labels
# One colour per candidate stage (stages.CANDIDATE_STAGES), and one for any other stage.
STAGE_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948")
OTHER_COLOUR = "#b07aa1"
SHARED_COLOUR = "#7a8699"

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
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{_e(title)}</h1>",
        _summary(report),
        _latency_section(report),
        _precision_section(report),
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
            _latency_chart(
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
            _latency_chart(
                caption, measured, report.selected, general, f"batch-{report.batch_size}"
            )
        ]
    legend = (
        '<p class="legend">Milliseconds per call, log scale, fastest first. Line: min to p99; '
        "box: p50 to p90; thick bar: p50; small ticks: the median of each interleaved round "
        "(their interquartile range is the spread); circle: mean. Highlighted: the chosen "
        "candidate; dashed line: a candidate far behind another that left the rounds early. "
        "Hover a row for all its numbers.</p>"
    )
    return "\n".join(['<h2 id="latency">Latency</h2>', legend, *charts])


def _latency_chart(
    caption: str,
    latency: dict[str, LatencyStats],
    chosen: str,
    general: str | None,
    key: str,
) -> str:
    rows = sorted(latency.items(), key=lambda item: (item[1].p50, item[0]))
    values = [v for _, s in rows for v in (s.min, s.p50, s.p90, s.p99, s.mean)]
    axis = _LogAxis.over(values, NAME_W, NAME_W + PLOT_W)
    height = AXIS_H + ROW_H * len(rows) + 8
    out = [_svg_open(height, f"latency per call, {caption}", f'data-chart="latency-{key}"')]
    out.extend(axis.draw(AXIS_H - 6, height - 4, "ms"))
    for i, (name, s) in enumerate(rows):
        out.append(_latency_row(name, s, AXIS_H + i * ROW_H, axis, chosen, general))
    out.append("</svg>")
    return f"<h3>{_e(caption)}</h3>\n" + "\n".join(out)


def _latency_row(
    name: str, s: LatencyStats, top: float, axis: _LogAxis, chosen: str, general: str | None
) -> str:
    mid = top + ROW_H / 2
    classes = ["mark"]
    if name == chosen:
        classes.append("selected")
    elif name == general:
        classes.append("general")
    if s.left_after is not None:
        classes.append("left")
    label = name + (" (chosen)" if name == chosen else "")
    if name == general and name != chosen:
        label += " (every other shape)"
    tip = (
        f"{name}: p50 {_n(s.p50)} ms, p90 {_n(s.p90)} ms, p99 {_n(s.p99)} ms, mean "
        f"{_n(s.mean)} ms, min {_n(s.min)} ms; {s.n} calls in {s.rounds} rounds, spread "
        f"{_n(s.spread)} ms" + (f"; left after round {s.left_after}" if s.left_after else "")
    )
    if s.callers > 1:
        tip += f"; {s.callers} callers at once"
    p50, p90 = axis(s.p50), axis(s.p90)
    parts = [
        f'<g class="{" ".join(classes)}" data-candidate="{_e(name)}" data-p50="{_n(s.p50)}">',
        f"<title>{_e(tip)}</title>",
        f'<rect class="row" x="0" y="{_c(top)}" width="{WIDTH}" height="{ROW_H}"/>',
        f'<text class="name" x="{NAME_W - 10}" y="{_c(mid + 4)}" text-anchor="end">'
        f"{_e(_fit(label))}</text>",
        _line("whisker", axis(s.min), mid, axis(s.p99), mid),
        _line("whisker", axis(s.min), mid - 4, axis(s.min), mid + 4),
        _line("whisker", axis(s.p99), mid - 4, axis(s.p99), mid + 4),
        f'<rect class="box" x="{_c(p50)}" y="{_c(mid - 5)}" width="{_c(max(p90 - p50, 0.5))}" '
        f'height="10"/>',
    ]
    parts.extend(_line("round", axis(r), mid - 9, axis(r), mid - 6) for r in s.round_medians)
    parts.append(_line("median", p50, mid - 6, p50, mid + 6))
    parts.append(f'<circle class="mean" cx="{_c(axis(s.mean))}" cy="{_c(mid)}" r="2.5"/>')
    parts.append(
        f'<text class="value" x="{NAME_W + PLOT_W + 14}" y="{_c(mid + 4)}">p50 {_n(s.p50)} · '
        f"p99 {_n(s.p99)} · spread {s.spread:.2g} ms · n {s.n}</text>"
    )
    parts.append("</g>")
    return "\n".join(parts)


# -- reduced precision ------------------------------------------------------------------------
def _precision_section(report: Report) -> str:
    """Speed against accuracy for every candidate the reduced-precision gate judged."""
    judged = [c for c in report.candidates if c.gate]
    if not judged:
        return ""
    by_metric = any(c.metric_drop is not None for c in judged)
    points = [c for c in judged if _finite(c.metric_drop if by_metric else c.max_rel_err)]
    fp32 = [
        c
        for c in report.candidates
        if c.precision == "fp32" and c.latency is not None and c.status in ("ok", "selected")
    ]
    fastest = min(fp32, key=lambda c: (c.p50, c.name)) if fp32 else None
    if by_metric:
        first = next(c for c in points if c.metric_drop is not None)
        what = (
            f"down, its drop against the float32 model (metric {_n(first.reference_metric)}; "
            f"the dot as measured, the line to the upper end of its 95% interval, which the "
            f"gate holds against max_drop {_n(first.max_drop)}: the shaded band passes)"
        )
    else:
        what = (
            f"down, its largest relative error against the model (the shaded band: within "
            f"{RELATIVE_ERROR:g}; a classifier must also keep the top-1 class, not drawn)"
        )
    caption = (
        f'<p class="caption">Judged by: {_e(judged[0].gate)}. Each candidate the gate judged: '
        f"across, its p50 (ms, log scale); {_e(what)}. Up and left is better. Dashed: "
        + (
            f"the fastest float32 candidate, {_e(fastest.name)} (p50 {_n(fastest.p50)} ms): "
            "a reduced-precision candidate pays for its error only left of it. "
            if fastest
            else ""
        )
        + "A candidate the gate rejected is not timed: it stands in the lane on the right.</p>"
    )
    chart = _frontier_chart(points, by_metric, fastest)
    return "\n".join(
        ['<h2 id="precision">Reduced precision: accuracy against speed</h2>', caption, chart,
         _precision_table(points, by_metric)]
    )  # fmt: skip


def _frontier_chart(
    points: list[CandidateResult], by_metric: bool, fastest: CandidateResult | None
) -> str:
    top, plot_h = 24, 260
    lane_x0 = NAME_W + PLOT_W + 40
    lane_w = 120
    height = top + plot_h + 40
    timed = [c for c in points if c.latency is not None]
    xs = [c.p50 for c in timed] + ([fastest.p50] if fastest else [])
    axis = _LogAxis.over(xs or [1.0], NAME_W, NAME_W + PLOT_W)
    if by_metric:
        limit = next((c.max_drop for c in points if c.max_drop is not None), 0.0)
        ys = [0.0, limit] + [v for c in points for v in (c.metric_drop, c.metric_drop_bound)
                             if _finite(v)]  # fmt: skip
        label = "drop against float32"
    else:
        limit = RELATIVE_ERROR
        ys = [0.0, limit] + [c.max_rel_err for c in points]
        label = "relative error"
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.08 or 0.01
    y_axis = _LinearAxis(lo - pad if lo < 0 else lo, hi + pad, top, top + plot_h)
    out = [_svg_open(height, "accuracy against speed", 'data-chart="precision"')]
    out.append(
        f'<rect class="accepted-region" x="{NAME_W}" y="{_c(y_axis(y_axis.lo))}" '
        f'width="{PLOT_W + 40 + lane_w}" height="{_c(y_axis(limit) - y_axis(y_axis.lo))}"/>'
    )
    out.append(f'<rect class="lane" x="{lane_x0}" y="{top}" width="{lane_w}" height="{plot_h}" '
               'opacity="0.6"/>')  # fmt: skip
    out.append(
        f'<text class="tick" x="{lane_x0 + lane_w / 2:.1f}" y="{top - 6}" '
        'text-anchor="middle">not timed</text>'
    )
    out.extend(axis.draw(top - 6, top + plot_h, "ms", below=top + plot_h + 16))
    out.extend(y_axis.draw(NAME_W, NAME_W + PLOT_W, label))
    out.append(_line("reference", NAME_W, y_axis(0.0), lane_x0 + lane_w, y_axis(0.0)))
    if fastest is not None:
        x = axis(fastest.p50)
        out.append(_line("fp32", x, top, x, top + plot_h))
        out.append(
            f'<text class="tick" x="{_c(x + 4)}" y="{top + plot_h - 6}">{_e(fastest.name)}</text>'
        )
    untimed = 0
    for number, c in enumerate(points, 1):
        value = c.metric_drop if by_metric else c.max_rel_err
        if c.latency is not None:
            x = axis(c.p50)
        else:
            x = lane_x0 + 20 + (untimed % 4) * 26
            untimed += 1
        out.append(_frontier_point(number, c, x, y_axis, value, by_metric))
    out.append("</svg>")
    return "\n".join(out)


def _frontier_point(
    number: int, c: CandidateResult, x: float, y_axis: _LinearAxis, value: float, by_metric: bool
) -> str:
    fate = {"ok": "accepted", "selected": "accepted selected", "mismatch": "rejected"}.get(
        c.status, "other"
    )
    y = y_axis(value)
    tip = f"{number}. {c.name} ({c.status}, {c.precision})"
    tip += f": p50 {_n(c.p50)} ms" if c.latency is not None else ": not timed"
    if by_metric:
        tip += (
            f"; metric {_n(c.metric)} against {_n(c.reference_metric)}, drop "
            f"{_n(c.metric_drop)}, at most {_n(c.metric_drop_bound)} (max_drop {_n(c.max_drop)})"
        )
    else:
        tip += f"; relative error {_n(c.max_rel_err)}"
    parts = [
        f'<g class="point {fate}" data-candidate="{_e(c.name)}" data-number="{number}">',
        f"<title>{_e(tip)}</title>",
    ]
    if by_metric and _finite(c.metric_drop_bound):
        parts.append(_line("bound", x, y, x, y_axis(c.metric_drop_bound)))
    parts.append(f'<circle cx="{_c(x)}" cy="{_c(y)}" r="5"/>')
    label = f"{number} {c.name}" if c.latency is not None else str(number)  # the lane: numbers
    parts.append(f'<text x="{_c(x + 7)}" y="{_c(y - 6)}">{_e(label)}</text>')
    parts.append("</g>")
    return "\n".join(parts)


def _precision_table(points: list[CandidateResult], by_metric: bool) -> str:
    head = ["#", "candidate", "status", "precision", "p50 ms"]
    head += ["metric", "float32", "drop", "at most (95%)", "max_drop"] if by_metric else ["rel err"]
    head.append("how")
    rows = []
    for number, c in enumerate(points, 1):
        cells = [str(number), c.name, c.status, c.precision, _n(c.p50)]
        if by_metric:
            cells += [_n(c.metric), _n(c.reference_metric), _n(c.metric_drop),
                      _n(c.metric_drop_bound), _n(c.max_drop)]  # fmt: skip
        else:
            cells.append(_err(c.max_rel_err))
        how = c.quantization or ""
        for kept in c.kept_fp32 or []:
            how += f"; kept {kept.get('layer')} in float32: p50 {_n(kept.get('p50_ms'))} ms"
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
        cells = [c.name, c.status, c.precision, _n(c.p50), _n(c.p99), n, _err(c.max_rel_err),
                 _n(c.prepare_s), why]  # fmt: skip
        rows.append((c.status, cells))
    return '<h2 id="candidates">Every candidate</h2>\n' + _table(
        head, rows, numeric={3, 4, 5, 6, 7}
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
        f'<p class="caption">{_e(first_line)}. Shared stages, then each candidate\'s own '
        "(one colour per stage: hover for its seconds), on one scale.</p>",
        _bars_chart("shared stages", bars, scale, "shared"),
        _stage_legend(own),
        _bars_chart("candidates", own, scale, "candidates"),
        _bars_chart("other", other, scale, "other"),
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


def _colour(stage: str, shared: bool) -> str:
    if shared:
        return SHARED_COLOUR
    if stage in CANDIDATE_STAGES:
        return STAGE_COLOURS[CANDIDATE_STAGES.index(stage) % len(STAGE_COLOURS)]
    return OTHER_COLOUR


def _stage_legend(own: list[tuple[str, list[tuple[str, float]]]]) -> str:
    stages = {stage for _, segments in own for stage, _ in segments}
    seen = [stage for stage in CANDIDATE_STAGES if stage in stages]
    seen += sorted(stages - set(CANDIDATE_STAGES))
    if not seen:
        return ""
    items = " ".join(
        f'<span style="color:{_colour(stage, False)}">■</span> {_e(stage)}' for stage in seen
    )
    return f'<p class="legend">{items}</p>'


def _bars_chart(
    caption: str, bars: list[tuple[str, list[tuple[str, float]]]], scale: float, key: str
) -> str:
    if not bars:
        return ""
    height = AXIS_H + ROW_H * len(bars) + 8
    axis = _LinearAxis(0.0, scale or 1.0, NAME_W, NAME_W + PLOT_W)
    out = [_svg_open(height, f"tuning time, {caption}", f'data-chart="stages-{key}"')]
    out.extend(axis.draw_x(AXIS_H - 6, height - 4, "s"))
    shared = key == "shared"
    for i, (label, segments) in enumerate(bars):
        top = AXIS_H + i * ROW_H
        mid = top + ROW_H / 2
        total = sum(s for _, s in segments)
        out.append(f'<g class="bar" data-stage="{_e(label)}">')
        out.append(f"<title>{_e(f'{label}: {total:.3f} s')}</title>")
        out.append(
            f'<text class="name" x="{NAME_W - 10}" y="{_c(mid + 4)}" text-anchor="end">'
            f"{_e(_fit(label))}</text>"
        )
        x = float(NAME_W)
        for stage, seconds in segments:
            width = axis(seconds) - NAME_W
            out.append(
                f'<rect x="{_c(x)}" y="{_c(mid - 7)}" width="{_c(max(width, 0.0))}" height="14" '
                f'fill="{_colour(stage, shared)}"><title>{_e(f"{label}: {stage} {seconds:.3f} s")}'
                "</title></rect>"
            )
            x += width
        out.append(f'<text class="value" x="{_c(x + 6)}" y="{_c(mid + 4)}">{total:.2f} s</text>')
        out.append("</g>")
    out.append("</svg>")
    return f"<h3>{_e(caption)}</h3>\n" + "\n".join(out)


# -- notes and environment --------------------------------------------------------------------
def _notes_section(report: Report) -> str:
    parts = []
    if report.notes:
        items = "\n".join(f"<li>{_e(note)}</li>" for note in report.notes)
        parts.append(f'<h2 id="notes">Notes</h2>\n<ul>\n{items}\n</ul>')
    if report.diagnosis is not None:
        parts.append(f'<h2 id="diagnosis">Diagnosis</h2>\n<pre>{_e(str(report.diagnosis))}</pre>')
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
            shown = _e(", ".join(_plain(v) for v in value) or "-")
        else:
            shown = _e(_plain(value))
        items.append(f"<dt>{_e(key)}</dt><dd>{shown}</dd>")
    return '<dl class="env">' + "".join(items) + "</dl>"


def _plain(value) -> str:
    if value is None or value == {}:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in sorted(value.items(), key=str))
    return str(value)


# -- axes -------------------------------------------------------------------------------------
class _LogAxis:
    """A log10 axis over whole decades, from pixel x0 to x1."""

    def __init__(self, lo: int, hi: int, x0: float, x1: float):
        self.lo, self.hi, self.x0, self.x1 = lo, hi, x0, x1

    @classmethod
    def over(cls, values: list[float], x0: float, x1: float) -> _LogAxis:
        positive = [v for v in values if v is not None and v > 0 and math.isfinite(v)] or [1.0]
        lo = math.floor(math.log10(min(positive)))
        hi = math.ceil(math.log10(max(positive)))
        return cls(lo, hi if hi > lo else lo + 1, x0, x1)

    def __call__(self, value: float) -> float:
        value = min(max(value, 10.0**self.lo), 10.0**self.hi) if value > 0 else 10.0**self.lo
        return self.x0 + (math.log10(value) - self.lo) / (self.hi - self.lo) * (self.x1 - self.x0)

    def ticks(self) -> list[tuple[float, bool]]:
        """(value, labelled) at 1, 2 and 5 of each decade; 2 and 5 unlabelled past 3 decades."""
        many = self.hi - self.lo > 3
        found = []
        for exponent in range(self.lo, self.hi + 1):
            for step in (1, 2, 5):
                value = step * 10.0**exponent
                if value <= 10.0**self.hi * 1.0001:
                    found.append((value, step == 1 or not many))
        return found

    def draw(self, label_y: float, bottom: float, unit: str, below: float | None = None) -> list:
        """Grid lines from label_y to bottom, their labels at label_y (or `below`), the last
        one with the unit."""
        ticks = self.ticks()
        last = max(i for i, (_, labelled) in enumerate(ticks) if labelled)
        out = []
        for i, (value, labelled) in enumerate(ticks):
            x = self(value)
            out.append(_line("grid", x, label_y + 4, x, bottom))
            if labelled:
                text = _tick(value) + (f" {unit}" if i == last else "")
                out.append(_tick_label(x, label_y if below is None else below, text))
        return out


class _LinearAxis:
    """A linear axis from value lo at pixel p0 to hi at pixel p1 (either direction)."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float):
        self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1

    def __call__(self, value: float) -> float:
        return self.p0 + (value - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

    def ticks(self) -> list[float]:
        span = self.hi - self.lo
        raw = span / 5
        magnitude = 10.0 ** math.floor(math.log10(raw))
        step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
        first = math.ceil(self.lo / step - 1e-9)
        return [k * step for k in range(first, int(math.floor(self.hi / step + 1e-9)) + 1)]

    def draw_x(self, label_y: float, bottom: float, unit: str) -> list:
        """As a horizontal axis, as _LogAxis.draw."""
        ticks = self.ticks()
        out = []
        for i, value in enumerate(ticks):
            x = self(value)
            out.append(_line("grid", x, label_y + 4, x, bottom))
            text = _tick(value) + (f" {unit}" if i == len(ticks) - 1 else "")
            out.append(_tick_label(x, label_y, text))
        return out

    def draw(self, x0: float, x1: float, label: str) -> list:
        """As a vertical axis: grid lines across x0..x1, labels left of x0."""
        out = []
        for value in self.ticks():
            y = self(value)
            out.append(_line("grid", x0, y, x1, y))
            out.append(f'<text class="tick" x="{_c(x0 - 6)}" y="{_c(y + 4)}" text-anchor="end">'
                       f"{_tick(value)}</text>")  # fmt: skip
        mid = (self.p0 + self.p1) / 2
        out.append(
            f'<text class="tick" x="{_c(x0 - 60)}" y="{_c(mid)}" text-anchor="end">'
            f"{_e(label)}</text>"
        )
        return out


# -- small pieces -----------------------------------------------------------------------------
def _svg_open(height: float, label: str, extra: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {_c(height)}" '
        f'width="{WIDTH}" height="{_c(height)}" role="img" aria-label="{_e(label)}" {extra}>'
    )


def _tick_label(x: float, y: float, text: str) -> str:
    return f'<text class="tick" x="{_c(x)}" y="{_c(y)}" text-anchor="middle">{_e(text)}</text>'


def _line(cls: str, x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line class="{cls}" x1="{_c(x1)}" y1="{_c(y1)}" x2="{_c(x2)}" y2="{_c(y2)}"/>'


def _table(head: list[str], rows: list[tuple[str, list[str]]], numeric: set[int]) -> str:
    """A table; `rows` are (status, cells): the status column is coloured by it."""

    def cell(tag: str, i: int, text: str, status: str) -> str:
        shown = text if isinstance(text, _Markup) else _e(text)
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
    return _Markup(f"<details><summary>{_e(first)}</summary>{_e(rest)}</details>")


def _fit(label: str) -> str:
    return label if len(label) <= NAME_CHARS else label[: NAME_CHARS - 1] + "…"


def _dl(items: list[tuple[str, object]], cls: str) -> str:
    body = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_plain(v))}</dd>" for k, v in items)
    return f'<dl class="{cls}">{body}</dl>'


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _n(value: float | None) -> str:
    """A number as the page writes it: four significant digits, '-' for none."""
    if value is None:
        return "-"
    return f"{value:.4g}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _c(value: float) -> str:
    """A coordinate: one decimal, always the same text for the same value."""
    return f"{value:.1f}"


def _tick(value: float) -> str:
    return f"{value:.10g}"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
