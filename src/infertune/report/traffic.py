"""The traffic plan's figures (`Report.traffic`, optimize(traffic=...)) read for the report's
renderings: the buckets as rows, the padding check's verdict, the expected latency against the
two alternatives, the held-out timing; and the text section `str(report)` prints (text.py
places it), with a histogram of the traffic's lengths in text.

The dict is pipeline/traffic_plan.py's `summary`, as written or read back from JSON: any key
may be absent or None, and a number that was not finite comes back as the string "nan" or
"inf"; every function here takes that as "not known". Numbers are the dict's own, formatted;
only the ratios between its figures are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .format import sci, sig4

__all__ = [
    "BucketRow",
    "bound_position",
    "bucket_rows",
    "comparison_rows",
    "held_out_words",
    "longer_candidate",
    "as_number",
    "padding_words",
    "ratio",
    "traffic_lines",
    "waste_words",
]

HISTOGRAM_ROWS = 5  # the text histogram's height
HISTOGRAM_COLUMNS = 72  # its bars' width at most: with its margins, within 100 columns
_MARGIN = 10  # the column of the largest count, left of the bars


@dataclass
class BucketRow:
    """One bucket: the lengths (low, upper] it serves, by `candidate`, padded to `upper` or at
    each request's own length; its p50 at `upper`, and its share of the traffic."""

    low: int
    upper: int
    candidate: str
    padded: bool
    p50_ms: float | None
    share: float | None

    @property
    def lengths(self) -> str:
        return f"({self.low}, {self.upper}]"

    @property
    def runs_at(self) -> str:
        return f"padded to {self.upper}" if self.padded else "own length"


def as_number(value: object) -> float | None:
    """A finite number, or None for none, a non-finite one, a "nan" string, or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def bucket_rows(traffic: dict) -> list[BucketRow]:
    """The buckets kept, shortest first; none where the requests run at exact shapes."""
    rows, low = [], 0
    for bucket in traffic.get("buckets") or []:
        if as_number(bucket.get("upper")) is None:
            continue
        upper = int(bucket["upper"])
        rows.append(
            BucketRow(
                low, upper, str(bucket.get("candidate")), bool(bucket.get("padded")),
                as_number(bucket.get("p50_ms")), as_number(bucket.get("share")),
            )
        )  # fmt: skip
        low = upper
    return rows


def longer_candidate(traffic: dict) -> str | None:
    """Who runs a request longer than the last bucket (at its own length): the best single
    candidate at exact shapes, as the plan has it; None without buckets."""
    if not traffic.get("buckets"):
        return None
    return (traffic.get("exact_single") or {}).get("candidate")


def padding_words(traffic: dict) -> str | None:
    """The padding check's verdict and reason in words; None where it did not run."""
    padding = traffic.get("padding")
    if not padding:
        return None
    verdict = "exact" if padding.get("exact") else "not exact, requests run at their own lengths"
    reason = padding.get("reason") or ""
    if not reason:
        checked = ", ".join(f"{n}->{to}" for n, to in padding.get("checked") or [])
        reason = f"largest relative change {sci(as_number(padding.get('max_rel_err')))}" + (
            f"; lengths {checked}" if checked else ""
        )
    words = f"{verdict}: {reason}"
    if padding.get("batch_exact") is False:
        words += "; rows of padding added to the batch change the real rows' outputs"
    return words


def comparison_rows(traffic: dict) -> list[tuple[str, str, float | None, float | None]]:
    """(what, candidate, mean ms, p99 ms) a request over the traffic: the plan, the best single
    candidate at exact shapes, every request padded to the longest; [] without the plan."""
    expected = traffic.get("expected")
    if not expected:
        return []
    lengths = traffic.get("lengths") or []
    padded = f"every request padded to {lengths[-1]}" if lengths else "padded to the longest"
    if traffic.get("padding") and not traffic["padding"].get("exact"):
        padded += " (would change outputs)"
    planned = "the planned buckets" + ("" if traffic.get("buckets") else " (not kept)")
    rows = [(planned, "", as_number(expected.get("mean_ms")),
             as_number(expected.get("p99_ms")))]  # fmt: skip
    for what, key in (("best single at exact shapes", "exact_single"), (padded, "padded_to_max")):
        other = traffic.get(key) or {}
        if other.get("candidate") is not None or as_number(other.get("mean_ms")) is not None:
            rows.append(
                (what, str(other.get("candidate") or "-"), as_number(other.get("mean_ms")),
                 as_number(other.get("p99_ms")))
            )  # fmt: skip
    return rows


def ratio(value: float | None, to: float | None) -> str:
    """value / to as '1.82x', '-' where either is unknown or `to` is 0."""
    return "-" if value is None or not to else f"{value / to:.2f}x"


def waste_words(traffic: dict) -> str | None:
    """The share of the padded positions that are padding, in words; None where unknown."""
    waste = as_number(traffic.get("waste"))
    if waste is None:
        return None
    if not traffic.get("buckets"):
        return f"{waste:.1%} of the positions the planned buckets pad to would be padding"
    return f"{waste:.1%} of the positions the buckets pad to are padding"


def held_out_words(traffic: dict) -> str | None:
    """The plan timed against the best single candidate at exact shapes on held-out requests,
    in words; None where that was not timed."""
    held = traffic.get("held_out")
    if not held:
        return None
    plan, exact = as_number(held.get("plan_ms")), as_number(held.get("exact_ms"))
    words = (
        f"the buckets {sig4(plan)} ms a request against {held.get('exact', '-')} at exact "
        f"shapes {sig4(exact)} ms on {held.get('requests', '-')} held-out requests"
    )
    if plan and exact:
        faster = plan < exact
        times = exact / plan if faster else plan / exact
        words += f": {times:.2f}x {'faster' if faster else 'slower'}"
    return words


def bound_position(upper: int) -> float:
    """Where a bucket's upper bound is drawn on the lengths' axis: between the last length in
    it and the first one past it."""
    return upper + 0.5


# -- the text section --------------------------------------------------------------------------
def traffic_lines(traffic: dict | None) -> list[str]:
    """The report's traffic section: nothing without traffic."""
    if not traffic:
        return []
    lines = ["", f"traffic: {traffic.get('traffic') or str(traffic.get('requests', '?'))}"]
    padding = padding_words(traffic)
    if padding:
        lines.append(f"  padding: {padding}")
    if traffic.get("exact_only") and (padding is None or "not exact" not in padding):
        lines.append(f"  padding not used: {traffic['exact_only']}")
    if traffic.get("kept"):
        lines.append(f"  kept: {traffic['kept']}")
    lines.extend(_bucket_table(traffic))
    lines.extend(_comparison_table(traffic))
    waste = waste_words(traffic)
    if waste:
        lines.append(f"  padding waste: {waste}")
    held = held_out_words(traffic)
    if held:
        lines.append(f"  held-out timing: {held}")
    lines.extend(histogram_lines(traffic))
    return lines


def _bucket_table(traffic: dict) -> list[str]:
    rows = bucket_rows(traffic)
    if not rows:
        return []
    table = [("lengths", "candidate", "runs at", "p50 ms at bound", "requests")]
    for row in rows:
        share = "-" if row.share is None else f"{row.share:.0%}"
        table.append((row.lengths, row.candidate, row.runs_at, sig4(row.p50_ms), share))
    longer = longer_candidate(traffic)
    if longer:
        table.append((f"> {rows[-1].upper}", longer, "own length", "-", "-"))
    return ["  buckets:", *_aligned(table, left=3)]


def _comparison_table(traffic: dict) -> list[str]:
    rows = comparison_rows(traffic)
    if not rows:
        return []
    plan_mean = rows[0][2]
    table = [("expected a request over the traffic", "candidate", "mean ms", "p99 ms",
              "vs the buckets")]  # fmt: skip
    for i, (what, candidate, mean, p99) in enumerate(rows):
        against = ratio(mean, plan_mean) if i else "-"
        table.append((what, candidate or "-", sig4(mean), sig4(p99), against))
    return _aligned(table, left=2)


def _aligned(table: list[tuple[str, ...]], left: int) -> list[str]:
    """Rows under a header and a rule, the first `left` columns to the left, the rest to the
    right, indented by two."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for i, row in enumerate(table):
        cells = [
            c.ljust(w) if j < left else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))
        ]
        lines.append("    " + "  ".join(cells).rstrip())
        if i == 0:
            lines.append("    " + "  ".join("-" * w for w in widths))
    return lines


def histogram_lines(traffic: dict) -> list[str]:
    """The traffic's lengths as a few rows of bars, each bucket's upper bound marked under
    them; nothing where the histogram is missing or has too many bins to stay readable."""
    histogram = traffic.get("histogram") or {}
    counts = [as_number(c) or 0 for c in histogram.get("counts") or []]
    edges = [as_number(e) for e in histogram.get("edges") or []]
    if not counts or len(edges) != len(counts) + 1 or None in edges:
        return []
    if len(counts) > HISTOGRAM_COLUMNS:
        return []
    cell = min(3, HISTOGRAM_COLUMNS // len(counts))
    bar = "#" * max(1, cell - 1)
    width = cell * len(counts)
    top = max(counts) or 1
    heights = [math.ceil(c / top * HISTOGRAM_ROWS) if c > 0 else 0 for c in counts]
    lo, hi = edges[0], edges[-1]
    bounds = [row.upper for row in bucket_rows(traffic)]
    marked = " (^: each bucket's upper bound)" if bounds else ""
    lines = [f"  requests by length, {len(counts)} bins from {lo:g} to {hi:g}{marked}:"]
    for level in range(HISTOGRAM_ROWS, 0, -1):
        label = f"{top:g}" if level == HISTOGRAM_ROWS else ""
        bars = "".join((bar if h >= level else " " * len(bar)).ljust(cell) for h in heights)
        lines.append(f"{label:>{_MARGIN - 2}} |{bars}".rstrip())
    axis = ["-"] * width
    labels = [(0, f"{lo:g}")]
    for bound in bounds:
        col = _column(bound_position(bound), lo, hi, width)
        axis[col] = "^"
        labels.append((col, str(bound)))
    labels.append((width - 1, f"{hi:g}"))
    lines.append(" " * (_MARGIN - 1) + "+" + "".join(axis))
    lines.append(" " * _MARGIN + _placed(labels))
    return lines


def _column(value: float, lo: float, hi: float, width: int) -> int:
    """The column of `value` on the bars' axis, within it."""
    if hi <= lo:
        return 0
    return min(width - 1, max(0, round((value - lo) / (hi - lo) * width)))


def _placed(labels: list[tuple[int, str]]) -> str:
    """Each (column, text) written from its column, left to right, one that would touch the
    one before left out."""
    line = ""
    for col, text in sorted(labels, key=lambda item: item[0]):
        if line and col <= len(line):
            continue
        line = line.ljust(col) + text
    return line
