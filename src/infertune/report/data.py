"""The report of one optimize() run: every candidate, its fate, its numbers, the environment."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..pipeline.timing import LatencyStats
from ..system.paths import user_path
from .stages import StageTimes

__all__ = [
    "BatchResult",
    "CandidateResult",
    "Diagnosis",
    "PathRate",
    "Report",
    "Retracing",
    "STATUSES",
]

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
    # A candidate that runs only the sample's exact input shapes (Backend.exact_shapes):
    # those shapes, and why it runs no other.
    exact_shapes: list[list[int]] | None = None
    exact_reason: str | None = None
    # A reduced-precision candidate's gate (accuracy.py): the rule it was judged by, and with
    # Accuracy the metric for it and for the float32 model, the drop and the margin's upper
    # end it was accepted or rejected on, against max_drop.
    gate: str | None = None
    metric: float | None = None
    reference_metric: float | None = None
    metric_drop: float | None = None
    metric_drop_bound: float | None = None
    max_drop: float | None = None
    # How it was quantized (calibration method, layers kept in float32), in words, and each
    # layer kept in float32, in the order kept, with the p50 after keeping it (ms, timed
    # against the fastest exact candidate): [{"layer", "p50_ms"}].
    quantization: str | None = None
    kept_fp32: list[dict] | None = None
    # Where it ran, as its runtime reported it (ONNX Runtime's providers, in order).
    runs_on: str | None = None

    @property
    def exact_words(self) -> str:
        """'serves only the sample's shapes ... (why)', or '' for a candidate of any shape."""
        if self.exact_shapes is None:
            return ""
        return f"serves only the sample's shapes {_shapes(self.exact_shapes)} ({self.exact_reason})"

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
            latency = _stats(latency)
        return cls(**fields, latency=latency)

    def to_dict(self) -> dict:
        """Flat fields (p50, p90, p99, mean, n in ms) plus the full `latency_ms` statistics."""
        data = asdict(self)
        data["latency_ms"] = data.pop("latency")
        for key in ("p50", "p90", "p99", "mean", "n"):
            data[key] = getattr(self, key)
        return data


@dataclass
class BatchResult:
    """The candidates measured at one tuned batch size (optimize(batch_sizes=...)), the one
    chosen there and why; `reasons` says why each other one was not."""

    batch_size: int
    selected: str
    reason: str
    latency: dict[str, LatencyStats]  # ms, per candidate that ran at this batch size
    reasons: dict[str, str] = field(default_factory=dict)

    def samples_per_s(self, name: str) -> float:
        return self.latency[name].samples_per_s(self.batch_size)

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "selected": self.selected,
            "reason": self.reason,
            "latency_ms": {name: asdict(stats) for name, stats in self.latency.items()},
            "samples_per_s": {name: self.samples_per_s(name) for name in self.latency},
            "reasons": dict(self.reasons),
        }

    @classmethod
    def from_dict(cls, data: dict) -> BatchResult:
        return cls(
            batch_size=int(data["batch_size"]),
            selected=data["selected"],
            reason=data["reason"],
            latency={name: _stats(d) for name, d in data["latency_ms"].items()},
            reasons=dict(data.get("reasons", {})),
        )


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
    batches: list[BatchResult] = field(default_factory=list)  # one per tuned batch size
    latency_budget_ms: float | None = None
    stages: StageTimes | None = None  # where total_s went, stage by stage
    # Where `selected` is the exact-shape path (it runs only the sample's exact shapes): the
    # candidate chosen among those that run any shape, which serves every other call, and why.
    general_backend: str | None = None
    general_reason: str = ""
    # Resident memory of optimize()'s process and its children (the rehearsal child, a worker
    # process), sampled every 0.5 s: "before_bytes" when tuning began, "peak_bytes", and the
    # model's "weights_bytes". None where it could not be read.
    memory: dict | None = None

    @property
    def backends_by_batch(self) -> dict[int, str]:
        """{batch size: chosen candidate}; just the sample's where one batch size was tuned.
        Where the exact-shape path serves the sample's shapes, the choice among those that
        run any shape (what every other call at that batch size gets)."""
        if not self.batches:
            return {self.batch_size: self.general_backend or self.selected}
        return {b.batch_size: b.selected for b in self.batches}

    @property
    def max_batch_size_within_budget(self) -> int | None:
        """The largest tuned batch size at which some candidate's p99 met latency_budget_ms
        (what a server's max batch size should be here); None without a budget, or where
        nothing met it."""
        if self.latency_budget_ms is None:
            return None
        sizes = [
            b.batch_size
            for b in self._batches()
            if b.latency[b.selected].p99 <= self.latency_budget_ms
        ]
        return max(sizes, default=None)

    def _batches(self) -> list[BatchResult]:
        """The per-batch results; one built from the candidates where one size was tuned."""
        if self.batches:
            return self.batches
        latency = {
            c.name: c.latency
            for c in self.candidates
            if c.latency and c.status in ("ok", "selected")
        }
        if self.selected not in latency:
            return []
        return [BatchResult(self.batch_size or 1, self.selected, self.selection_reason, latency)]

    def batch_summary(self) -> list[str]:
        """Lines on the choice per batch size and the latency budget; none for one batch size
        without a budget."""
        lines = []
        if len(self.batches) > 1:
            lines.append(
                "choice per batch size: "
                + ", ".join(f"{b.batch_size}: {b.selected}" for b in self.batches)
            )
        if self.latency_budget_ms is not None:
            lines.append(self._budget_line())
        return lines

    def _budget_line(self) -> str:
        budget = self.latency_budget_ms
        pairs = [(b, name, s) for b in self._batches() for name, s in b.latency.items()]
        within = [(b, name, s) for b, name, s in pairs if s.p99 <= budget]
        if not within:
            b, name, s = min(pairs, key=lambda t: t[2].p99)
            return (
                f"latency budget {budget:g} ms: met by no batch size and candidate; the lowest "
                f"p99 was {s.p99:.4g} ms ({name} at batch {b.batch_size})"
            )
        b, name, s = max(within, key=lambda t: t[0].samples_per_s(t[1]))
        return (
            f"latency budget {budget:g} ms: largest batch size within it "
            f"{self.max_batch_size_within_budget}; most samples/s within it: {name} at batch "
            f"{b.batch_size} ({b.samples_per_s(name):,.0f} samples/s, p99 {s.p99:.4g} ms)"
        )

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
            "batches": [b.to_dict() for b in self.batches],
            "backends_by_batch": {str(k): v for k, v in self.backends_by_batch.items()},
            "latency_budget_ms": self.latency_budget_ms,
            "max_batch_size_within_budget": self.max_batch_size_within_budget,
            "stages": self.stages.to_dict() if self.stages else None,
            "general_backend": self.general_backend,
            "general_reason": self.general_reason,
            "memory": self.memory,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        """A report read back from `to_dict()` output (for example a saved JSON file)."""
        skip = ("candidates", "diagnosis", "batches", "stages")
        if "other_shapes" in data:  # written before the exact-shape path had one name
            data = {**data, "general_backend": data["other_shapes"]}
            data["general_reason"] = data.get("other_shapes_reason", "")
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k not in skip}
        candidates = [CandidateResult.from_dict(c) for c in data.get("candidates", [])]
        diagnosis = Diagnosis.from_dict(data["diagnosis"]) if data.get("diagnosis") else None
        batches = [BatchResult.from_dict(b) for b in data.get("batches", [])]
        stages = StageTimes.from_dict(data["stages"]) if data.get("stages") else None
        return cls(
            **fields, candidates=candidates, diagnosis=diagnosis, batches=batches, stages=stages
        )

    @classmethod
    def from_json(cls, path: str | Path) -> Report:
        return cls.from_dict(json.loads(user_path(path).read_text(encoding="utf-8")))

    def to_json(self, path: str | Path | None = None) -> str:
        """The report as JSON; written to `path` too when one is given (`~` expanded)."""
        text = json.dumps(_finite(self.to_dict()), indent=2)
        if path is not None:
            user_path(path).write_text(text + "\n", encoding="utf-8")
        return text

    def to_html(self, path: str | Path | None = None) -> str:
        """The report as one self-contained HTML page (inline SVG, no script, opens offline):
        each measured candidate's latency, the tuning time by stage, every candidate's fate,
        the environment and, with reduced precision, accuracy against speed; written to
        `path` too when one is given (`~` expanded). The same report gives the same bytes."""
        from .html import (
            render,
            write_html,
        )

        return render(self) if path is None else write_html(self, path)

    def __str__(self) -> str:
        return self.table()

    def table(self) -> str:
        header = (
            "candidate", "status", "p50 ms", "p90 ms", "p99 ms", "samples/s",
            "1st call ms", "prepare s", "rel err", "n",
        )  # fmt: skip
        rows = [header]
        grouped = self._unavailable_groups()
        hidden = {name for names in grouped.values() for name in names}
        for c in self.candidates:
            if c.name in hidden:
                continue
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
        if self.memory and self.memory.get("peak_bytes"):
            lines.append(memory_line(self.memory))
        lines.extend(self._reason_lines(hidden))
        lines.extend(self._precision_lines())
        for clause, names in grouped.items():
            lines.append(
                f"  unavailable here ({len(names)}): {', '.join(names)}: {clause} (each one's "
                f"whole reason: report.to_dict(), or verbose=True)"
            )
        lines.extend(self._batch_table())
        lines.append("")
        lines.append(f"selected: {self.selected} ({self.selection_reason})")
        if self.general_backend:
            lines.append(f"every other shape: {self.general_backend} ({self.general_reason})")
        lines.extend(self.batch_summary())
        for note in self.notes:
            lines.append(f"note: {note}")
        lines.append(f"optimize() took {self.total_s:.1f} s")
        if self.stages is not None:
            lines.extend("  " + line for line in self.stages.summary().splitlines())
        if self.diagnosis is not None:
            lines.extend(["", str(self.diagnosis)])
        return "\n".join(lines)

    def _precision_lines(self) -> list[str]:
        """What each reduced-precision candidate the gate judged kept of the task (or of its
        agreement with the model), and the rule."""
        judged = [c for c in self.candidates if c.gate]
        if not judged:
            return []
        lines = [f"  reduced precision, judged by {judged[0].gate}:"]
        for c in judged:
            if c.metric is not None:
                words = (
                    f"{c.metric:.4g} against the model's {c.reference_metric:.4g}: drop "
                    f"{c.metric_drop:.4g}, at most {c.metric_drop_bound:.4g} (max_drop "
                    f"{c.max_drop:g})"
                )
            else:
                words = c.reason if c.status != "mismatch" else c.reason.split(" (")[0]
            if c.quantization:
                words += f"; {c.quantization}"
            for kept in c.kept_fp32 or []:
                words += f"; kept {kept['layer']} in float32: p50 {kept['p50_ms']:.4g} ms"
            lines.append(f"    {c.name} ({c.status}): {words}")
        return lines

    def _unavailable_groups(self) -> dict[str, list[str]]:
        """{first clause of the reason: names} for candidates unavailable for the same first
        reason (the GPU candidates on a machine without a GPU): one line in the table's
        place instead of one row and one reason each."""
        groups: dict[str, list[str]] = {}
        for c in self.candidates:
            if c.status == "unavailable" and c.reason:
                groups.setdefault(c.reason.split("; ")[0], []).append(c.name)
        return {clause: names for clause, names in groups.items() if len(names) > 1}

    def _reason_lines(self, hidden: set[str]) -> list[str]:
        """Why each candidate has its status, a clause that several candidates' reasons share
        said once for all of them, after theirs."""
        clauses = {
            c.name: [part for part in (c.exact_words, *c.reason.split("; ")) if part]
            for c in self.candidates
            if c.name not in hidden
        }
        counts = Counter(clause for parts in clauses.values() for clause in set(parts))
        shared = [clause for clause, n in counts.items() if n > 1]
        lines = []
        for name, parts in clauses.items():
            own = [part for part in parts if part not in shared]
            if own:
                lines.append(f"  {name}: {'; '.join(own)}")
        for clause in shared:
            names = [name for name, parts in clauses.items() if clause in parts]
            lines.append(f"  {', '.join(names)}: {clause}")
        return lines

    def _batch_table(self) -> list[str]:
        """Batch size x candidate (p50, p90, p99, samples/s), the choice starred, with why
        each choice was made; nothing where one batch size was tuned."""
        if len(self.batches) < 2:
            return []
        header = ("batch", "candidate", "p50 ms", "p90 ms", "p99 ms", "samples/s")
        rows = [header]
        for b in self.batches:
            for name, s in sorted(b.latency.items(), key=lambda item: item[1].p50):
                star = "* " if name == b.selected else "  "
                rows.append(
                    (str(b.batch_size), star + name, _num(s.p50), _num(s.p90), _num(s.p99),
                     _num(b.samples_per_s(name)))
                )  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["", "per batch size (* = chosen there):"]
        for i, row in enumerate(rows):
            cells = [
                c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))
            ]
            lines.append("  " + "  ".join(cells).rstrip())
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        lines.extend(f"  batch {b.batch_size}: {b.selected} ({b.reason})" for b in self.batches)
        return lines


# -- the diagnosis' values (pipeline/diagnosis.py measures them) ------------------------
# Share of the machine's float32 rate below which a path is overhead-bound, from which it
# is compute-bound. Under 10%, at least 90% of the time goes to something other than
# arithmetic. A third is what TensorFlow's and ONNX Runtime's kernels reach on a plain
# large matrix product even on a busy shared machine (46-100% measured here).
OVERHEAD_BOUND_BELOW = 0.10
COMPUTE_BOUND_ABOVE = 1 / 3


@dataclass
class PathRate:
    """One way of running the model: first call, steady state, and the arithmetic rate."""

    name: str
    first_call_ms: float | None
    p50_ms: float | None
    gflops: float | None = None  # achieved: arithmetic of one call / median time
    share_of_peak: float | None = None  # gflops / the machine's measured float32 rate

    @property
    def bound(self) -> str:
        if self.share_of_peak is None:
            return "unknown"
        if self.share_of_peak < OVERHEAD_BOUND_BELOW:
            return "overhead-bound"
        return "compute-bound" if self.share_of_peak >= COMPUTE_BOUND_ABOVE else "mixed"


@dataclass
class Retracing:
    """How often a plain tf.function of the model traces over the batch sizes tried."""

    batch_sizes: list[int]
    traces_plain: int
    trace_ms_plain: float  # first-call time summed over the batch sizes that traced
    traces_with_signature: int
    steady_ms: float  # a call on an already-traced shape, for scale


@dataclass
class Diagnosis:
    """The measured answer to "why is my inference slow?"; str() is the plain-words version."""

    model: str
    batch_size: int | None
    flops: int | None  # per call at the sample's batch size; None: could not be counted
    flops_note: str
    peak_gflops: float | None  # the machine's float32 rate, measured on a matrix product
    paths: list[PathRate]
    selected: str
    threads: dict
    cpu_features: list[str]
    gpu: str
    predict_ms: float | None = None
    model_call_ms: float | None = None
    retracing: Retracing | None = None
    advice: list[str] = field(default_factory=list)

    def path(self, name: str) -> PathRate | None:
        return next((p for p in self.paths if p.name == name), None)

    @property
    def reference(self) -> PathRate:
        return self.paths[0]

    @property
    def verdict(self) -> str:
        """overhead-bound / mixed / compute-bound for the model's own call, as measured."""
        return self.reference.bound

    def to_dict(self) -> dict:
        data = asdict(self)
        data["verdict"] = self.verdict
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Diagnosis:
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["paths"] = [PathRate(**p) for p in data.get("paths", [])]
        if data.get("retracing") is not None:
            data["retracing"] = Retracing(**data["retracing"])
        return cls(**data)

    def __str__(self) -> str:
        ref = self.reference
        lines = [f"diagnosis: {self.model}, batch {self.batch_size}"]
        if self.flops is not None and self.peak_gflops:
            lines.append(
                f"  work: {self.flops / 1e6:,.2f} MFLOP per call ({self.flops_note}); this "
                f"machine's measured float32 rate: {self.peak_gflops:,.0f} GFLOP/s"
            )
        else:
            lines.append(f"  work: unknown ({self.flops_note})")
        for p in self.paths:
            rate = (
                f"{p.gflops:,.2f} GFLOP/s = {p.share_of_peak:.1%} of peak ({p.bound})"
                if p.gflops is not None
                else "rate unknown"
            )
            first = "-" if p.first_call_ms is None else f"{p.first_call_ms:,.1f} ms"
            steady = "-" if p.p50_ms is None else f"{p.p50_ms:,.4g} ms"
            lines.append(f"  {p.name:<26} first call {first:>10}   steady {steady:>10}   {rate}")
        if self.model_call_ms is not None and self.predict_ms is not None:
            lines.append(
                f"  model.predict(x): {self.predict_ms:,.2f} ms per call vs model(x) "
                f"{self.model_call_ms:,.3f} ms ({self.predict_ms / self.model_call_ms:,.1f}x)"
            )
        if self.retracing is not None:
            r = self.retracing
            lines.append(
                f"  retracing: a plain tf.function traced {r.traces_plain} times over batch sizes "
                f"{r.batch_sizes} ({r.trace_ms_plain:,.0f} ms of tracing, vs {r.steady_ms:.3f} ms "
                f"per traced call); with a None batch dimension in input_signature: "
                f"{r.traces_with_signature} trace"
            )
        lines.append(f"  threads: {_words(self.threads)}")
        lines.append(f"  CPU features: {', '.join(self.cpu_features) or 'none detected'}")
        lines.append(f"  GPU: {self.gpu}")
        lines.append(f"  verdict: model(x) is {self.verdict} ({_share(ref)} of peak)")
        for i, line in enumerate(self.advice, 1):
            lines.append(f"  {i}. {line}")
        return "\n".join(lines)


def _share(path: PathRate) -> str:
    return "unknown share" if path.share_of_peak is None else f"{path.share_of_peak:.2%}"


def _words(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _stats(data: dict) -> LatencyStats:
    data = dict(data)
    for key in ("round_medians", "round_means"):
        data[key] = tuple(data.get(key, ()))
    return LatencyStats(**data)


def _shapes(shapes: list) -> str:
    """[[2, 25, 4]] -> (2, 25, 4); several inputs' shapes joined by commas."""
    return ", ".join("(" + ", ".join(map(str, shape)) + ")" for shape in shapes)


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


def memory_line(memory: dict) -> str:
    """The report's line on memory: the peak, what was held before, against the weights."""
    gb = 1e9
    peak, before = memory["peak_bytes"], memory.get("before_bytes") or 0
    line = (
        f"memory: peak {peak / gb:.2f} GB resident (this process and its children), "
        f"{before / gb:.2f} GB before tuning"
    )
    weights = memory.get("weights_bytes")
    if weights:
        line += f"; {(peak - before) / weights:.1f}x the weights' {weights / gb:.2f} GB above that"
        # (a conversion that reuses another's result holds next to nothing: not said)
        conversions = [
            f"{stage} {above / weights:.1f}x"
            for stage, above in (memory.get("conversions_bytes") or {}).items()
            if above >= 0.05 * weights
        ]
        if conversions:
            line += f" (conversions at their peaks: {', '.join(conversions)})"
    return line
