"""The order candidates are tried in, and what each is expected to cost: what a time budget
decides from before converting anything.

What is known then (the `Probe`): the model's arithmetic per call and its op types (counted
from one trace of the model at the sample's shapes, the count the diagnosis reports), how
long that trace took (the graph's size times this machine's speed now: conversions and
compiles scale with it), and the model's own call time. What earlier runs on this machine
learned (pipeline/machine.py): how far each estimate was off here, and which candidates were chosen
for models of the same kind.

Order: the candidates most likely to win first, by their family's rank for the kind of model
(backends/__init__.py FAMILIES: a compute-bound model is won by the runtimes with the best
kernels, an overhead-bound one by the lowest per-call floor). Families chosen before on this
machine for models of the same kind come first; variants of one family follow its default,
once its conversion is built they cost little. Estimates: each shared conversion once
(export/registry.py: its cost; an ONNX export serves every ONNX Runtime and OpenVINO
candidate), plus the candidate's own compile, plus its calls.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..backends.base import Backend
from ..backends.registry import (
    family_of,
    family_rank,
)
from ..export.registry import CONVERSIONS
from ..report.stages import StageTimes
from .machine import MachineRecord

__all__ = [
    "Probe",
    "after_candidates_s",
    "candidate_call_s",
    "conversion_estimate_s",
    "estimate_s",
    "learn_from_run",
    "order_candidates",
    "regime",
    "uninterruptible_s",
]

# A model whose call does at least this much arithmetic is compute-bound on CPUs like these
# (MobileNetV2 224: 0.6 GFLOP; the small CNN: 0.5 MFLOP; the 10-50-1 MLP at batch 1000: 1 MFLOP).
COMPUTE_BOUND_FLOPS = 50e6

# Graph ops that LiteRT's builtin converter fails on or runs outside XNNPACK (loops, tensor
# lists): where the graph has them, LiteRT goes last.
_LITERT_HARD = ("While", "StatelessWhile", "If", "StatelessIf", "TensorListReserve")


def uninterruptible_s(
    backend: Backend, probe: Probe, built: set[str], record: MachineRecord | None
) -> float:
    """How far past the budget's end `backend` could run if abandoned during a conversion."""
    return sum(
        CONVERSIONS[key].uninterruptible * conversion_estimate_s(key, probe, record)
        for key in backend.conversions
        if key in CONVERSIONS and key not in built
    )


# The cost of a conversion outside the registry (a key of a user's own backend): (seconds
# whatever the model, seconds per second of one trace of it), the largest registered ones'.
UNREGISTERED_COST = (1.0, 5.0)

# Calls a candidate makes before it is measured: its first call and the verification inputs,
# in this process and in the rehearsal child.
_CALL_FACTOR = 2.5


@dataclass
class Probe:
    """What is known of the model before any candidate converts it."""

    flops: int | None  # per call at the sample's shapes; None: not countable
    flops_note: str
    op_types: Counter = field(default_factory=Counter)
    trace_s: float = 0.0  # one trace of the model at the sample's shapes, here, now
    call_s: float = 0.0  # the model's own call on the sample (steady, not the first)
    checks: int = 1  # verification inputs
    peak_gflops: float | None = None  # the machine's float32 rate, where the record knows it

    @property
    def runtime_call_s(self) -> float:
        """A compiled candidate's likely call: what its verification calls cost. Not the
        model's eager call: ResNet50's takes 0.3 s, ONNX Runtime's 17 ms."""
        return candidate_call_s(self, self.peak_gflops)

    @property
    def regime(self) -> str:
        return regime(self.flops)


def regime(flops: int | None) -> str:
    """'compute' or 'overhead': the kind of model, for the order and for the record of wins."""
    return "compute" if flops is not None and flops >= COMPUTE_BOUND_FLOPS else "overhead"


def order_candidates(
    backends: list[Backend], probe: Probe, record: MachineRecord | None
) -> list[Backend]:
    """`backends` in the order to try them: most promising first (see the module doc)."""
    last = 1 << 30  # after every ranked family
    wins = record.wins(probe.regime) if record is not None else {}
    hard_for_litert = any(probe.op_types.get(op) for op in _LITERT_HARD)

    def key(indexed: tuple[int, Backend]) -> tuple:
        index, backend = indexed
        fam = family_of(backend.name)
        rank = family_rank(backend.name, probe.regime)
        if rank is None or (fam == "litert" and hard_for_litert):
            rank = last
        return (
            backend.precision != "fp32",  # reduced precision after every exact candidate
            -min(wins.get(fam, 0), 3),  # chosen here before for models like this one
            rank,
            index,  # the registry's order: a family's default before its variants
        )

    return [b for _, b in sorted(enumerate(backends), key=key)]


def estimate_s(
    backend: Backend,
    probe: Probe,
    built: set[str],
    record: MachineRecord | None,
) -> tuple[float, str]:
    """Seconds `backend` would take from now to verified (shared conversions in `built` are
    free), and how that was estimated, in words."""
    parts = []
    total = 0.0
    for key in backend.conversions:
        if key in built:
            continue
        seconds = conversion_estimate_s(key, probe, record)
        parts.append(f"{key} conversion ~{seconds:.1f} s")
        total += seconds
    own = _raw_candidate_s(backend, probe)
    own = _corrected(f"candidate {family_of(backend.name)}", own, record)
    parts.append(f"compile and verification ~{own:.1f} s")
    total += own
    return total, " + ".join(parts)


def _raw_candidate_s(backend: Backend | type[Backend], probe: Probe) -> float:
    """A candidate's own work before corrections: its compile (scaled by the trace) and its
    calls before it is measured. A candidate with no compile (relative_cost 0: keras-eager,
    the model's own call) calls at the model's own speed."""
    call_s = probe.call_s if backend.relative_cost == 0 else probe.runtime_call_s
    return backend.relative_cost * probe.trace_s + _CALL_FACTOR * probe.checks * call_s


def conversion_estimate_s(key: str, probe: Probe, record: MachineRecord | None) -> float:
    """Seconds the shared conversion `key` is expected to take here."""
    return _corrected(f"conversion {key}", raw_conversion_s(key, probe), record)


def raw_conversion_s(key: str, probe: Probe) -> float:
    """Seconds the conversion `key` takes on the 2-core machine, before this machine's
    correction: its fixed cost, its cost per second of the trace, and where it calibrates,
    the model's arithmetic on each calibration sample at its calibration's rate (the
    calibration runs the model; the graph's size does not tell how long a call takes: the
    BERT-sized encoder traces in a third of ResNet50's time for the same arithmetic)."""
    conversion = CONVERSIONS.get(key)
    fixed, per_trace = conversion.cost if conversion is not None else UNREGISTERED_COST
    seconds = fixed + per_trace * probe.trace_s
    if conversion is not None and conversion.samples and probe.flops:
        seconds += conversion.samples * probe.flops / (conversion.calibration_gflops * 1e9)
    return seconds


def _corrected(kind: str, seconds: float, record: MachineRecord | None) -> float:
    factor = record.correction(kind) if record is not None else None
    return seconds * (factor if factor is not None else 1.0)


def candidate_call_s(probe: Probe, peak_gflops: float | None) -> float:
    """A candidate's likely seconds per call: the model's own (eager) call bounds it; a
    compiled runtime runs the arithmetic at a quarter of the machine's peak or better, plus
    a millisecond of overhead."""
    if probe.flops is None:
        return probe.call_s
    rate = (peak_gflops or 100.0) * 1e9 * 0.25
    return min(probe.call_s, probe.flops / rate + 1e-3) if probe.call_s else probe.flops / rate


def after_candidates_s(
    probe: Probe, contenders: int, peak_known: bool, peak_gflops: float | None
) -> float:
    """Seconds the work after the candidates needs at least: two interleaved rounds of
    measurement (each candidate's block is an untimed call and a timed one, the model's own
    among them), the machine's peak where not known yet, and the selection and report."""
    call = candidate_call_s(probe, peak_gflops)
    rounds = 2 * (2 * probe.call_s + contenders * (2 * call + 0.07))
    return rounds + (0.0 if peak_known else 1.5) + 0.5


def learn_from_run(
    record: MachineRecord,
    probe: Probe,
    candidates: list[tuple[type[Backend], str]],
    statuses: dict[str, str],
    times: StageTimes,
    chosen: str,
    conversion_memory: dict[str, tuple[int, int]] | None = None,
) -> None:
    """Fold this run's costs (actual against estimated, before corrections), its
    conversions' measured memory ((weights, peak) in bytes, by memory key) and its choice into
    the machine's record, and save it."""
    for key, (weights, peak) in (conversion_memory or {}).items():
        record.learn_memory(key, weights, peak)
    in_workers = times.background.get("(shared)", {})
    for stage, seconds in times.shared.items():
        key = next((k for k, c in CONVERSIONS.items() if c.stage == stage), None)
        if key is not None:
            # Made in a worker process: its time there, not this process's wait for it
            # (learned as the cost, the wait would keep the next run's from the worker).
            seconds = in_workers.get(f"{stage} in a worker process", seconds)
            record.learn_cost(f"conversion {key}", raw_conversion_s(key, probe), seconds)
    for cls, name in candidates:
        if statuses.get(name) not in ("ok", "selected", "mismatch") or name not in times.candidates:
            continue
        raw = _raw_candidate_s(cls, probe)
        # Its work wherever it ran (this thread, the background thread, the rehearsal
        # child), not this thread's wall time alone: how much overlapped depends on what
        # else the run had to do, and under a budget it may be little.
        own = {k: v for k, v in times.candidates[name].items() if k != "waiting"}
        work = sum(own.values()) + sum(times.background.get(name, {}).values())
        if raw > 0:
            record.learn_cost(f"candidate {family_of(name)}", raw, work)
    record.learn_win(probe.regime, family_of(chosen))
    record.save()
