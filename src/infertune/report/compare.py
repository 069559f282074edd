"""Two reports of one model side by side, and a verdict a CI job can gate on
(`infertune compare OLD NEW`).

What is compared: each candidate measured in both runs (its p50 and p99, with both runs'
spreads), the chosen candidate (what serves the sample's shapes, whatever its name in each
run) and, where both runs tuned several batch sizes, the choice at each batch size in both;
the metric of each reduced-precision candidate judged in both; the candidates that appeared,
vanished or changed fate; the relative error of each candidate verified in both.

The rule. A slowdown is a regression only where both hold:

- the new p50 over the old one exceeds `max_slowdown` (1.10: 10% slower), and
- the new p50 exceeds the old one by more than the larger of the two runs' spreads
  (`LatencyStats.spread`: the interquartile range of the per-round medians, in ms): a change
  within what one run's own rounds varied by is noise, not a regression.

It is judged on the p50 (the statistic the rounds make stable and selection uses); the p99
is shown. Only the chosen candidate's latency, and the choice at each batch size, decide the
verdict: another candidate that got slower is reported, not gated. A metric regresses where a
candidate's drop against the float32 model (`metric_drop`) grew by more than `max_drop`
(absolute): each reduced-precision candidate judged by a metric in both runs, but one the
accuracy gate rejected in both (it could serve in neither: reported, not gated), and the
chosen one (a float32 candidate's drop counts as 0), so that a choice that moved from
float32 to a quantized candidate which loses more than `max_drop` fails too.

`load_report` reads a report as `Report.to_json()` / `--json` writes it, or the `report.json`
of a directory written by `Optimized.save()`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..errors import (
    InfertuneError,
    OptionError,
)
from ..pipeline.timing import LatencyStats
from ..system.paths import user_path
from . import Report

__all__ = [
    "LatencyChange",
    "MetricChange",
    "ReportComparison",
    "compare",
    "compare_files",
    "load_report",
]

MAX_SLOWDOWN = 1.10  # default: 10% slower, beyond the spread, fails
MAX_DROP = 0.005  # default: half a point of accuracy more lost to reduced precision fails
SAVED_REPORT = "report.json"  # the report inside a saved result (result/saved.py REPORT)


def load_report(path: str | os.PathLike) -> Report:
    """A report from a JSON file (`Report.to_json`, `--json`) or a saved result's directory.

    Raises InfertuneError saying what was found instead of a report.
    """
    source = user_path(path)
    if source.is_dir():
        if not (source / SAVED_REPORT).is_file():
            raise InfertuneError(
                f"{path} is a directory without {SAVED_REPORT}: expected a result directory "
                f"written by Optimized.save() or `infertune optimize --save`, or a report's JSON "
                f"file."
            )
        source = source / SAVED_REPORT
    elif not source.exists():
        raise InfertuneError(f"{path} does not exist: expected a report's JSON file or a saved "
                             f"result's directory.")  # fmt: skip
    try:
        return Report.from_dict(json.loads(source.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InfertuneError(f"{source} is not an infertune report: {exc}") from exc


@dataclass(frozen=True)
class LatencyChange:
    """One latency in both runs: `old_name` and `new_name` differ only where the choice
    moved. `regression` applies the module's rule."""

    label: str
    old_name: str
    new_name: str
    old: LatencyStats
    new: LatencyStats
    max_slowdown: float

    @property
    def p50_ratio(self) -> float:
        return self.new.p50 / self.old.p50

    @property
    def p99_ratio(self) -> float:
        return self.new.p99 / self.old.p99

    @property
    def spread_ms(self) -> float:
        """The larger of the two runs' spreads: what a change must exceed to count."""
        return max(self.old.spread, self.new.spread)

    @property
    def beyond_spread(self) -> bool:
        return abs(self.new.p50 - self.old.p50) > self.spread_ms

    @property
    def regression(self) -> bool:
        return self.p50_ratio > self.max_slowdown and self.new.p50 - self.old.p50 > self.spread_ms

    @property
    def verdict(self) -> str:
        if self.regression:
            return f"slower: {self.p50_ratio:.2f}x > {self.max_slowdown:g}x, beyond the spread"
        if not self.beyond_spread:
            return "within the spread"
        if self.new.p50 < self.old.p50:
            return "faster"
        return f"slower, within {self.max_slowdown:g}x"

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "old_name": self.old_name,
            "new_name": self.new_name,
            "old_p50_ms": self.old.p50,
            "new_p50_ms": self.new.p50,
            "p50_ratio": self.p50_ratio,
            "old_p99_ms": self.old.p99,
            "new_p99_ms": self.new.p99,
            "p99_ratio": self.p99_ratio,
            "old_spread_ms": self.old.spread,
            "new_spread_ms": self.new.spread,
            "regression": self.regression,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class MetricChange:
    """A drop against the float32 model in both runs (`metric_drop`; 0 for a float32
    choice), and the metrics themselves where there are. `gated`: False for a candidate the
    accuracy gate rejected in both runs (nothing that could serve changed)."""

    label: str
    old_drop: float
    new_drop: float
    old_metric: float | None
    new_metric: float | None
    max_drop: float
    gated: bool = True

    @property
    def change(self) -> float:
        return self.new_drop - self.old_drop

    @property
    def worse(self) -> bool:
        # Drops are means over the same samples: 0.02 - 0.015 must not exceed 0.005 by float
        # rounding (by 4e-18), hence an allowance of 1e-12.
        return self.change > self.max_drop + 1e-12

    @property
    def regression(self) -> bool:
        return self.gated and self.worse

    @property
    def verdict(self) -> str:
        if not self.worse:
            return "ok"
        worse = f"worse by more than {self.max_drop:g}"
        return worse if self.gated else f"{worse} (rejected in both runs: not gated)"

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "old_drop": self.old_drop,
            "new_drop": self.new_drop,
            "drop_change": self.change,
            "old_metric": self.old_metric,
            "new_metric": self.new_metric,
            "gated": self.gated,
            "regression": self.regression,
        }


@dataclass
class ReportComparison:
    """OLD against NEW: truthy when the gate passed (`passed`); `regressions` says why not,
    `text()` is the table `infertune compare` prints, `to_dict()` the same as data."""

    old: Report
    new: Report
    max_slowdown: float
    max_drop: float
    chosen: list[LatencyChange] = field(default_factory=list)
    candidates: list[LatencyChange] = field(default_factory=list)
    metrics: list[MetricChange] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    fates: list[tuple[str, str, str]] = field(default_factory=list)  # (name, old, new)
    errors: list[tuple[str, float, float]] = field(default_factory=list)  # max_rel_err
    old_source: str = "old"
    new_source: str = "new"

    @property
    def regressions(self) -> list[str]:
        found = [
            f"{c.label}: p50 {c.old.p50:.4g} -> {c.new.p50:.4g} ms ({c.p50_ratio:.2f}x > "
            f"{self.max_slowdown:g}x; +{c.new.p50 - c.old.p50:.4g} ms > spread "
            f"{c.spread_ms:.4g} ms)"
            for c in self.chosen
            if c.regression
        ]
        found += [
            f"{m.label}: drop against float32 {m.old_drop:.4g} -> {m.new_drop:.4g} "
            f"(+{m.change:.4g} > max_drop {self.max_drop:g})"
            for m in self.metrics
            if m.regression
        ]
        return found

    @property
    def passed(self) -> bool:
        return not self.regressions

    def __bool__(self) -> bool:
        return self.passed

    def exit_code(self) -> int:
        """0 when the gate passed, 1 on a regression (what `infertune compare` exits with)."""
        return 0 if self.passed else 1

    def to_dict(self) -> dict:
        return {
            "old": self.old_source,
            "new": self.new_source,
            "max_slowdown": self.max_slowdown,
            "max_drop": self.max_drop,
            "passed": self.passed,
            "regressions": self.regressions,
            "chosen": [c.to_dict() for c in self.chosen],
            "candidates": [c.to_dict() for c in self.candidates],
            "metrics": [m.to_dict() for m in self.metrics],
            "appeared": list(self.appeared),
            "vanished": list(self.vanished),
            "changed_fate": [{"name": n, "old": o, "new": s} for n, o, s in self.fates],
            "max_rel_err": [{"name": n, "old": o, "new": s} for n, o, s in self.errors],
        }

    def text(self) -> str:
        old, new = self.old, self.new
        lines = [f"infertune compare: {self.old_source} -> {self.new_source}"]
        if old.model != new.model or old.signature != new.signature:
            lines.append(f"note: different models or inputs: {old.model} ({old.signature}) -> "
                         f"{new.model} ({new.signature})")  # fmt: skip
        for report, which in ((old, "old"), (new, "new")):
            if report.from_cache:
                lines.append(f"note: the {which} report came from the tuning cache")
        lines.append(
            f"gate: the chosen candidate's p50 may grow by at most {self.max_slowdown:g}x, "
            f"unless by no more than the larger spread of the two runs; a drop against "
            f"float32 may grow by at most {self.max_drop:g}"
        )
        lines += ["", *self._latency_table("chosen", self.chosen)]
        if self.candidates:
            lines += ["", *self._latency_table("candidate", self.candidates)]
        if self.metrics:
            lines += ["", *self._metric_table()]
        if self.errors:
            moved = [f"{n} {o:.1e} -> {s:.1e}" for n, o, s in self.errors if o != s]
            if moved:
                lines += ["", "relative error against the model: " + ", ".join(moved)]
        for words, names in (("appeared", self.appeared), ("vanished", self.vanished)):
            if names:
                lines.append(f"{words}: {', '.join(names)}")
        for name, was, now in self.fates:
            reason = new.candidate(name).reason.split("; ")[0]
            lines.append(
                f"changed fate: {name}: {was} -> {now}" + (f" ({reason})" if reason else "")
            )
        lines.append("")
        if self.passed:
            lines.append("PASSED: no regression beyond the gate")
        else:
            lines.append("FAILED:")
            lines += [f"  {line}" for line in self.regressions]
        return "\n".join(lines)

    def _latency_table(self, title: str, changes: list[LatencyChange]) -> list[str]:
        """p50 and p99 in ms, old and new, and both spreads (IQR of the round medians)."""
        header = (title, "p50 old ms", "p50 new ms", "p50", "p99 old ms", "p99 new ms", "p99",
                  "spread old/new ms", "verdict")  # fmt: skip
        rows = [header]
        for c in changes:
            name = c.label
            if c.old_name != c.label:
                name += f": {_moved(c.old_name, c.new_name)}"
            rows.append((
                name, f"{c.old.p50:.4g}", f"{c.new.p50:.4g}", f"{c.p50_ratio:.2f}x",
                f"{c.old.p99:.4g}", f"{c.new.p99:.4g}", f"{c.p99_ratio:.2f}x",
                f"{c.old.spread:.2g}/{c.new.spread:.2g}", c.verdict,
            ))  # fmt: skip
        return _aligned(rows, left=(0, 8))

    def _metric_table(self) -> list[str]:
        rows = [("drop against float32", "old", "new", "change", "metric old", "metric new",
                 "verdict")]  # fmt: skip
        for m in self.metrics:
            rows.append((
                m.label, f"{m.old_drop:.4g}", f"{m.new_drop:.4g}", f"{m.change:+.4g}",
                _num(m.old_metric), _num(m.new_metric),
                m.verdict,
            ))  # fmt: skip
        return _aligned(rows, left=(0, 6))


def compare(
    old: Report,
    new: Report,
    *,
    max_slowdown: float = MAX_SLOWDOWN,
    max_drop: float = MAX_DROP,
) -> ReportComparison:
    """Compare two reports (see the module's docstring for the rule)."""
    if not max_slowdown >= 1.0:
        raise OptionError(
            f"max_slowdown must be >= 1.0 (1.10: 10% slower). Received: {max_slowdown!r}."
        )
    if not max_drop >= 0.0:
        raise OptionError(f"max_drop must be >= 0. Received: {max_drop!r}.")
    result = ReportComparison(old, new, max_slowdown, max_drop)
    result.chosen = _chosen(old, new, max_slowdown)
    old_by_name = {c.name: c for c in old.candidates}
    new_by_name = {c.name: c for c in new.candidates}
    result.appeared = [name for name in new_by_name if name not in old_by_name]
    result.vanished = [name for name in old_by_name if name not in new_by_name]
    for name, now in new_by_name.items():
        was = old_by_name.get(name)
        if was is None:
            continue
        if was.status != now.status:
            result.fates.append((name, was.status, now.status))
        if was.latency is not None and now.latency is not None:
            result.candidates.append(
                LatencyChange(name, name, name, was.latency, now.latency, max_slowdown)
            )
        if was.metric_drop is not None and now.metric_drop is not None:
            rejected = was.status == now.status == "mismatch"
            result.metrics.append(MetricChange(name, was.metric_drop, now.metric_drop,
                                               was.metric, now.metric, max_drop,
                                               gated=not rejected))  # fmt: skip
        if was.max_rel_err is not None and now.max_rel_err is not None:
            result.errors.append((name, was.max_rel_err, now.max_rel_err))
    was, now = _chosen_drop(old), _chosen_drop(new)
    if was is not None and now is not None and (was[1] is not None or now[1] is not None):
        label = f"chosen: {_moved(old.selected, new.selected)}"
        result.metrics.insert(0, MetricChange(label, was[0], now[0], was[1], now[1], max_drop))
    return result


def compare_files(
    old: str | os.PathLike,
    new: str | os.PathLike,
    *,
    max_slowdown: float = MAX_SLOWDOWN,
    max_drop: float = MAX_DROP,
) -> ReportComparison:
    """`compare` on two reports read by `load_report` (JSON files or saved results)."""
    result = compare(load_report(old), load_report(new), max_slowdown=max_slowdown,
                     max_drop=max_drop)  # fmt: skip
    result.old_source, result.new_source = str(old), str(new)
    return result


def _chosen(old: Report, new: Report, max_slowdown: float) -> list[LatencyChange]:
    """The choice at the sample's shapes, then at each batch size both runs tuned."""
    found = []
    was, now = _measured(old, old.selected), _measured(new, new.selected)
    if was is not None and now is not None:
        found.append(LatencyChange("chosen", old.selected, new.selected, was, now, max_slowdown))
    if len(old.batches) > 1 and len(new.batches) > 1:
        new_batches = {b.batch_size: b for b in new.batches}
        for b in old.batches:
            other = new_batches.get(b.batch_size)
            if other is None or b.batch_size == old.batch_size == new.batch_size:
                continue  # the sample's batch size is the choice above
            found.append(LatencyChange(
                f"chosen at batch {b.batch_size}", b.selected, other.selected,
                b.latency[b.selected], other.latency[other.selected], max_slowdown,
            ))  # fmt: skip
    return found


def _measured(report: Report, name: str) -> LatencyStats | None:
    try:
        return report.candidate(name).latency
    except KeyError:
        return None


def _chosen_drop(report: Report) -> tuple[float, float | None] | None:
    """The chosen candidate's drop against float32 and its metric: (0, None) for a float32
    choice, None where a reduced-precision choice has no metric (judged by agreement)."""
    chosen = next((c for c in report.candidates if c.name == report.selected), None)
    if chosen is None:
        return None
    if chosen.metric_drop is not None:
        return chosen.metric_drop, chosen.metric
    return (0.0, None) if chosen.precision == "fp32" else None


def _moved(old: str, new: str) -> str:
    return old if old == new else f"{old} -> {new}"


def _aligned(rows: list[tuple[str, ...]], left: tuple[int, ...]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        cells = [
            c.ljust(w) if j in left else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
