"""The report of one optimize() run as values: every candidate, its fate, its numbers, the
environment, and their dicts and JSON. Its renderings are apart: text.py (`str(report)`,
which the methods here call) and html.py (`to_html`)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..pipeline.timing import LatencyStats
from ..system.paths import user_path
from .stages import StageTimes
from .text import batch_lines, diagnosis_text, exact_shapes_words, report_text

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
        return exact_shapes_words(self)

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
    # optimize(traffic=...): the traffic, the padding check, the lengths each candidate was
    # timed at, the buckets and what they are expected to cost against padding to the longest
    # and the best single candidate at exact shapes, and their held-out timing (pipeline/
    # traffic_plan.py writes it); None without traffic.
    traffic: dict | None = None

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
            for b in self.batch_results()
            if b.latency[b.selected].p99 <= self.latency_budget_ms
        ]
        return max(sizes, default=None)

    def batch_results(self) -> list[BatchResult]:
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
        return batch_lines(self)

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
            "traffic": self.traffic,
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
        return report_text(self)

    def table(self) -> str:
        return report_text(self)


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
        return diagnosis_text(self)


def _stats(data: dict) -> LatencyStats:
    data = dict(data)
    for key in ("round_medians", "round_means"):
        data[key] = tuple(data.get(key, ()))
    return LatencyStats(**data)


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
