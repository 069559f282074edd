"""The report of one optimize() run: every candidate, its fate, its numbers, the environment."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .diagnosis import Diagnosis
from .measure import LatencyStats

__all__ = ["CandidateResult", "Report", "STATUSES"]

STATUSES = ("selected", "ok", "mismatch", "failed", "unavailable", "timeout", "skipped")


@dataclass
class CandidateResult:
    """One candidate backend: what happened to it and what was measured."""

    name: str
    status: str
    reason: str = ""
    precision: str = "fp32"
    prepare_s: float | None = None
    first_call_ms: float | None = None
    latency: LatencyStats | None = None
    throughput: float | None = None  # samples per second at the sample's batch size
    max_abs_err: float | None = None
    max_rel_err: float | None = None

    @property
    def p50(self) -> float | None:
        return self.latency.p50 if self.latency else None

    @property
    def p90(self) -> float | None:
        return self.latency.p90 if self.latency else None

    @property
    def p99(self) -> float | None:
        return self.latency.p99 if self.latency else None

    @property
    def mean(self) -> float | None:
        return self.latency.mean if self.latency else None

    @property
    def n(self) -> int | None:
        return self.latency.n if self.latency else None

    @classmethod
    def from_dict(cls, data: dict) -> CandidateResult:
        fields = {k: _unfinite(data.get(k)) for k in cls.__dataclass_fields__ if k != "latency"}
        latency = data.get("latency_ms")
        if latency is not None:
            latency = dict(latency)
            for key in ("round_medians", "round_means"):
                latency[key] = tuple(latency.get(key, ()))
            latency = LatencyStats(**latency)
        return cls(**fields, latency=latency)

    def to_dict(self) -> dict:
        """Flat fields (p50, p90, p99, mean, n in ms) plus the full `latency_ms` statistics."""
        data = asdict(self)
        data["latency_ms"] = data.pop("latency")
        for key in ("p50", "p90", "p99", "mean", "n"):
            data[key] = getattr(self, key)
        return data


@dataclass
class Report:
    """What optimize() tried and why it chose what it chose.

    `str(report)` is a table; `candidates` the per-candidate results; `to_dict()` and
    `to_json(path)` give everything, the environment included.
    """

    model: str
    signature: str
    batch_size: int | None
    objective: str
    rtol: float
    atol: float
    candidates: list[CandidateResult]
    environment: dict
    selected: str
    selection_reason: str
    total_s: float
    notes: list[str] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    from_cache: bool = False  # returned by optimize(cache=...) from an earlier tuning run

    def candidate(self, name: str) -> CandidateResult:
        for result in self.candidates:
            if result.name == name:
                return result
        raise KeyError(
            f"No candidate named {name!r}; candidates: {[c.name for c in self.candidates]}"
        )

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "signature": self.signature,
            "batch_size": self.batch_size,
            "objective": self.objective,
            "rtol": self.rtol,
            "atol": self.atol,
            "selected": self.selected,
            "selection_reason": self.selection_reason,
            "total_s": self.total_s,
            "candidates": [c.to_dict() for c in self.candidates],
            "environment": self.environment,
            "notes": list(self.notes),
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis else None,
            "from_cache": self.from_cache,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        """A report read back from `to_dict()` output (for example a saved JSON file)."""
        skip = ("candidates", "diagnosis")
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k not in skip}
        candidates = [CandidateResult.from_dict(c) for c in data.get("candidates", [])]
        diagnosis = Diagnosis.from_dict(data["diagnosis"]) if data.get("diagnosis") else None
        return cls(**fields, candidates=candidates, diagnosis=diagnosis)

    @classmethod
    def from_json(cls, path: str | Path) -> Report:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_json(self, path: str | Path | None = None) -> str:
        """The report as JSON; written to `path` too when one is given."""
        text = json.dumps(_finite(self.to_dict()), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    def __str__(self) -> str:
        return self.table()

    def table(self) -> str:
        header = (
            "candidate", "status", "p50 ms", "p90 ms", "p99 ms", "samples/s",
            "1st call ms", "prepare s", "rel err", "n",
        )  # fmt: skip
        rows = [header]
        for c in self.candidates:
            lat = c.latency
            rows.append(
                (
                    c.name,
                    c.status,
                    _num(lat.p50 if lat else None),
                    _num(lat.p90 if lat else None),
                    _num(lat.p99 if lat else None),
                    _num(c.throughput),
                    _num(c.first_call_ms),
                    _num(c.prepare_s),
                    _err(c.max_rel_err),
                    str(lat.n) if lat else "-",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        cached = " (from the tuning cache: measured earlier, not in this call)"
        lines = [
            f"infertune report: {self.model}{cached if self.from_cache else ''}",
            f"inputs: {self.signature}   batch: {self.batch_size}   objective: {self.objective}"
            f"   tolerance: rtol={self.rtol:g} atol={self.atol:g}",
            "",
        ]
        for i, row in enumerate(rows):
            cells = [
                cell.ljust(w) if j < 2 else cell.rjust(w)
                for j, (cell, w) in enumerate(zip(row, widths))
            ]
            lines.append("  ".join(cells).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("")
        for c in self.candidates:
            if c.reason:
                lines.append(f"  {c.name}: {c.reason}")
        lines.append("")
        lines.append(f"selected: {self.selected} ({self.selection_reason})")
        for note in self.notes:
            lines.append(f"note: {note}")
        lines.append(f"optimize() took {self.total_s:.1f} s")
        if self.diagnosis is not None:
            lines.extend(["", str(self.diagnosis)])
        return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}" if value >= 0.01 else f"{value:.4f}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _unfinite(value):
    """Inverse of `_finite` for one value: "inf" and "nan" strings back to floats."""
    return float(value) if value in ("inf", "-inf", "nan") else value


def _finite(value):
    """JSON has no Infinity/NaN: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
