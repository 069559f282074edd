"""The report page's charts, as inline SVG (html.py places them): each candidate's latency,
accuracy against speed for reduced precision, and the tuning time by stage, with their axes.

A traffic plan's histogram of request lengths has one `<rect class="bin">` per bin and one
`<g class="bound" data-candidate="NAME">` per bucket, its line at the bucket's upper bound.
Each measured candidate is one `<g class="mark" data-candidate="NAME">` in its latency chart
(one chart per tuned batch size), the chosen one `class="mark selected"`; each
reduced-precision candidate one `<g class="point" data-candidate="NAME">` in the accuracy
chart. Every number written is the report's own, formatted and never recomputed; only
positions on the axes are computed here, with fixed float formats (`_c`), so that the same
report draws the same bytes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..accuracy import RELATIVE_ERROR
from .format import escape, finite, sig4
from .stages import CANDIDATE_STAGES
from .traffic import bound_position

if TYPE_CHECKING:
    from ..pipeline.timing import LatencyStats
    from . import CandidateResult
    from .traffic import BucketRow

__all__ = ["bars_chart", "frontier_chart", "latency_chart", "stage_legend", "traffic_chart"]

WIDTH = 1040  # every chart's width in SVG units (px at 100%)
NAME_W = 300  # the column of candidate names, left of each plot
NAME_CHARS = 40  # what that column holds in full: a longer name is cut, whole in its tooltip
PLOT_W = 400  # the plot itself; the numbers are written right of it
ROW_H = 24
AXIS_H = 34  # room above the first row for the axis and its labels
# One colour per candidate stage (stages.CANDIDATE_STAGES), and one for any other stage.
STAGE_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948")
OTHER_COLOUR = "#b07aa1"
SHARED_COLOUR = "#7a8699"


# -- latency ----------------------------------------------------------------------------------
def latency_chart(
    caption: str,
    latency: dict[str, LatencyStats],
    chosen: str,
    general: str | None,
    key: str,
) -> str:
    """One row per candidate in `latency`, fastest first, on a log axis: `chosen` highlighted,
    `general` (the choice for every other shape) marked too."""
    rows = sorted(latency.items(), key=lambda item: (item[1].p50, item[0]))
    values = [v for _, s in rows for v in (s.min, s.p50, s.p90, s.p99, s.mean)]
    axis = _LogAxis.over(values, NAME_W, NAME_W + PLOT_W)
    height = AXIS_H + ROW_H * len(rows) + 8
    out = [_svg_open(height, f"latency per call, {caption}", f'data-chart="latency-{key}"')]
    out.extend(axis.draw(AXIS_H - 6, height - 4, "ms"))
    for i, (name, s) in enumerate(rows):
        out.append(_latency_row(name, s, AXIS_H + i * ROW_H, axis, chosen, general))
    out.append("</svg>")
    return f"<h3>{escape(caption)}</h3>\n" + "\n".join(out)


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
        f"{name}: p50 {sig4(s.p50)} ms, p90 {sig4(s.p90)} ms, p99 {sig4(s.p99)} ms, mean "
        f"{sig4(s.mean)} ms, min {sig4(s.min)} ms; {s.n} calls in {s.rounds} rounds, spread "
        f"{sig4(s.spread)} ms" + (f"; left after round {s.left_after}" if s.left_after else "")
    )
    if s.callers > 1:
        tip += f"; {s.callers} callers at once"
    p50, p90 = axis(s.p50), axis(s.p90)
    parts = [
        f'<g class="{" ".join(classes)}" data-candidate="{escape(name)}" data-p50="{sig4(s.p50)}">',
        f"<title>{escape(tip)}</title>",
        f'<rect class="row" x="0" y="{_c(top)}" width="{WIDTH}" height="{ROW_H}"/>',
        f'<text class="name" x="{NAME_W - 10}" y="{_c(mid + 4)}" text-anchor="end">'
        f"{escape(_fit(label))}</text>",
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
        f'<text class="value" x="{NAME_W + PLOT_W + 14}" y="{_c(mid + 4)}">p50 {sig4(s.p50)} · '
        f"p99 {sig4(s.p99)} · spread {s.spread:.2g} ms · n {s.n}</text>"
    )
    parts.append("</g>")
    return "\n".join(parts)


# -- reduced precision ------------------------------------------------------------------------
def frontier_chart(
    points: list[CandidateResult], by_metric: bool, fastest: CandidateResult | None
) -> str:
    """Each judged candidate at its p50 (across) and its drop or error (down); one not timed
    stands in a lane on the right."""
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
                             if finite(v)]  # fmt: skip
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
            f'<text class="tick" x="{_c(x + 4)}" y="{top + plot_h - 6}">'
            f"{escape(fastest.name)}</text>"
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
    tip += f": p50 {sig4(c.p50)} ms" if c.latency is not None else ": not timed"
    if by_metric:
        tip += (
            f"; metric {sig4(c.metric)} against {sig4(c.reference_metric)}, drop "
            f"{sig4(c.metric_drop)}, at most {sig4(c.metric_drop_bound)} (max_drop "
            f"{sig4(c.max_drop)})"
        )
    else:
        tip += f"; relative error {sig4(c.max_rel_err)}"
    parts = [
        f'<g class="point {fate}" data-candidate="{escape(c.name)}" data-number="{number}">',
        f"<title>{escape(tip)}</title>",
    ]
    if by_metric and finite(c.metric_drop_bound):
        parts.append(_line("bound", x, y, x, y_axis(c.metric_drop_bound)))
    parts.append(f'<circle cx="{_c(x)}" cy="{_c(y)}" r="5"/>')
    label = f"{number} {c.name}" if c.latency is not None else str(number)  # the lane: numbers
    parts.append(f'<text x="{_c(x + 7)}" y="{_c(y - 6)}">{escape(label)}</text>')
    parts.append("</g>")
    return "\n".join(parts)


# -- tuning time ------------------------------------------------------------------------------
def _colour(stage: str, shared: bool) -> str:
    if shared:
        return SHARED_COLOUR
    if stage in CANDIDATE_STAGES:
        return STAGE_COLOURS[CANDIDATE_STAGES.index(stage) % len(STAGE_COLOURS)]
    return OTHER_COLOUR


def stage_legend(own: list[tuple[str, list[tuple[str, float]]]]) -> str:
    """The colour of each stage the candidates' bars show, in pipeline order."""
    stages = {stage for _, segments in own for stage, _ in segments}
    seen = [stage for stage in CANDIDATE_STAGES if stage in stages]
    seen += sorted(stages - set(CANDIDATE_STAGES))
    if not seen:
        return ""
    items = " ".join(
        f'<span style="color:{_colour(stage, False)}">■</span> {escape(stage)}' for stage in seen
    )
    return f'<p class="legend">{items}</p>'


def bars_chart(
    caption: str, bars: list[tuple[str, list[tuple[str, float]]]], scale: float, key: str
) -> str:
    """One bar per (label, [(stage, seconds)]), its segments coloured by stage, all on one
    `scale` of seconds so that the charts of one page compare."""
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
        out.append(f'<g class="bar" data-stage="{escape(label)}">')
        out.append(f"<title>{escape(f'{label}: {total:.3f} s')}</title>")
        out.append(
            f'<text class="name" x="{NAME_W - 10}" y="{_c(mid + 4)}" text-anchor="end">'
            f"{escape(_fit(label))}</text>"
        )
        x = float(NAME_W)
        for stage, seconds in segments:
            width = axis(seconds) - NAME_W
            out.append(
                f'<rect x="{_c(x)}" y="{_c(mid - 7)}" width="{_c(max(width, 0.0))}" height="14" '
                f'fill="{_colour(stage, shared)}"><title>'
                f"{escape(f'{label}: {stage} {seconds:.3f} s')}</title></rect>"
            )
            x += width
        out.append(f'<text class="value" x="{_c(x + 6)}" y="{_c(mid + 4)}">{total:.2f} s</text>')
        out.append("</g>")
    out.append("</svg>")
    return f"<h3>{escape(caption)}</h3>\n" + "\n".join(out)


# -- traffic ----------------------------------------------------------------------------------
def traffic_chart(counts: list[float], edges: list[float], buckets: list[BucketRow]) -> str:
    """The traffic's requests by length, a bar per bin, each bucket's upper bound a line
    labelled by its candidate, the buckets shaded in turn."""
    x0, x1 = 130, WIDTH - 40
    labels_h, plot_h = 14 * 3 + 6, 200
    top, bottom = labels_h, labels_h + plot_h
    lo, hi = edges[0], (edges[-1] if edges[-1] > edges[0] else edges[0] + 1)
    x_axis = _LinearAxis(lo, hi, x0, x1)
    most = max(max(counts, default=0), 1)
    y_axis = _LinearAxis(0.0, most, bottom, top)
    height = bottom + 44
    out = [_svg_open(height, "requests by length", 'data-chart="traffic"')]

    def x(value: float) -> float:
        return x_axis(min(max(value, lo), hi))

    low = lo
    for i, b in enumerate(buckets):
        upper = bound_position(b.upper)
        band = "odd" if i % 2 else "even"
        out.append(f'<rect class="band band-{band}" x="{_c(x(low))}" y="{top}" '
                   f'width="{_c(max(x(upper) - x(low), 0.0))}" height="{plot_h}"/>')  # fmt: skip
        low = upper
    for value in y_axis.ticks():
        if value == int(value):
            y = y_axis(value)
            out.append(_line("grid", x0, y, x1, y))
            out.append(f'<text class="tick" x="{x0 - 6}" y="{_c(y + 4)}" text-anchor="end">'
                       f"{_tick(value)}</text>")  # fmt: skip
    out.append(f'<text class="tick" x="{x0 - 40}" y="{_c((top + bottom) / 2)}" '
               'text-anchor="end">requests</text>')  # fmt: skip
    for i, count in enumerate(counts):
        left, right = x(edges[i]), x(edges[i + 1])
        many = "request" if count == 1 else "requests"
        tip = f"lengths {sig4(edges[i])} to {sig4(edges[i + 1])}: {count:g} {many}"
        out.append(
            f'<rect class="bin" data-count="{count:g}" x="{_c(left + 0.5)}" '
            f'y="{_c(y_axis(count))}" width="{_c(max(right - left - 1, 0.5))}" '
            f'height="{_c(bottom - y_axis(count))}"><title>{escape(tip)}</title></rect>'
        )
    out.append(_line("axis", x0, bottom, x1, bottom))
    for value in x_axis.ticks():
        out.append(_tick_label(x_axis(value), bottom + 16, _tick(value)))
    out.append(_tick_label((x0 + x1) / 2, bottom + 34, "length"))
    for i, b in enumerate(buckets):
        out.append(_bound(b, x(bound_position(b.upper)), 14 * (i % 3 + 1), top, bottom))
    out.append("</svg>")
    return "\n".join(out)


def _bound(b: BucketRow, x: float, label_y: float, top: float, bottom: float) -> str:
    how = f"padded to {b.upper}" if b.padded else "at their own lengths"
    share = "" if b.share is None else f", {b.share:.0%} of the requests"
    tip = f"lengths {b.lengths}: {b.candidate}, {how}; p50 {sig4(b.p50_ms)} ms at {b.upper}{share}"
    return "\n".join(
        [
            f'<g class="bound" data-candidate="{escape(b.candidate)}" data-upper="{b.upper}">',
            f"<title>{escape(tip)}</title>",
            _line("bound", x, label_y + 3, x, bottom),
            f'<text class="bound" x="{_c(x - 3)}" y="{_c(label_y)}" text-anchor="end">'
            f"{escape(_fit(f'{b.candidate} ≤{b.upper}'))}</text>",
            "</g>",
        ]
    )


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
            f"{escape(label)}</text>"
        )
        return out


# -- small pieces -----------------------------------------------------------------------------
def _svg_open(height: float, label: str, extra: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {_c(height)}" '
        f'width="{WIDTH}" height="{_c(height)}" role="img" aria-label="{escape(label)}" {extra}>'
    )


def _tick_label(x: float, y: float, text: str) -> str:
    return f'<text class="tick" x="{_c(x)}" y="{_c(y)}" text-anchor="middle">{escape(text)}</text>'


def _line(cls: str, x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line class="{cls}" x1="{_c(x1)}" y1="{_c(y1)}" x2="{_c(x2)}" y2="{_c(y2)}"/>'


def _c(value: float) -> str:
    """A coordinate: one decimal, always the same text for the same value."""
    return f"{value:.1f}"


def _tick(value: float) -> str:
    return f"{value:.10g}"


def _fit(label: str) -> str:
    return label if len(label) <= NAME_CHARS else label[: NAME_CHARS - 1] + "…"
