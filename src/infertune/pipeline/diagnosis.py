"""Where the time goes: a measured diagnosis of why inference is slow, in plain words.

Every figure comes from a measurement made in this process: the optimize() run's own
timings (first call vs steady state per path, eager vs graph), the arithmetic of one call
counted from the TensorFlow graph, the machine's float32 rate measured on a matrix product,
and, for `infertune.explain()`, `model.predict` timed against `model(x)` and the traces a
plain tf.function makes over several batch sizes. What could not be measured says unknown.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import one_line
from ..report import Diagnosis, PathRate, Retracing
from ..system.environment import usable_cores
from .timing import (
    measure_interleaved,
    warm_up,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from ..model.inputs import InputSignature
    from ..model.source import ModelSource
    from ..report import CandidateResult
    from .machine import MachineRecord

__all__ = [
    "count_flops",
    "diagnose",
    "machine_peak",
    "measure_float32_ceiling",
    "measure_retracing",
    "predict_vs_call",
    "trace_and_count",
]

# -- measurements --------------------------------------------------------------------------
_PEAK_CACHE: dict[int, float] = {}


def measure_float32_ceiling(size: int = 1024, seconds: float = 0.25) -> float:
    """GFLOP/s of a float32 matrix product: this machine's practical peak, measured once.

    The best of numpy's BLAS and TensorFlow's kernels: numpy alone can understate the peak
    (an OpenBLAS pinned to older kernels by OPENBLAS_CORETYPE, as on some shared machines).
    """
    if size not in _PEAK_CACHE:
        rng = np.random.default_rng(0)
        a = rng.random((size, size), dtype=np.float32)
        b = rng.random((size, size), dtype=np.float32)
        best = _best_time(lambda: a @ b, seconds)
        tf = _tensorflow()
        if tf is not None:
            ta, tb = tf.constant(a), tf.constant(b)
            best = min(best, _best_time(lambda: tf.linalg.matmul(ta, tb).numpy(), seconds))
        _PEAK_CACHE[size] = 2 * size**3 / best / 1e9
    return _PEAK_CACHE[size]


def _tensorflow() -> Any:
    """TensorFlow where this process has it loaded already (a model is being tuned), else
    None: tuning a package never imports it, even where it is installed."""
    return sys.modules.get("tensorflow")


def _best_time(fn, seconds: float) -> float:
    fn()  # warm-up: thread pool start, page faults
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# Ops that call other graph functions: the profiler does not look inside them, so a graph
# that has any is counted after freezing (which inlines the calls).
_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile", "If",
             "StatelessIf", "Case", "StatelessCase")  # fmt: skip


def count_flops(graph_function: Any, sample: list[np.ndarray]) -> tuple[int | None, str]:
    """Floating-point operations of one call at the sample's shapes, from the TF graph."""
    flops, note, _, _ = trace_and_count(graph_function, sample)
    return flops, note


def trace_and_count(
    graph_function: Any, sample: list[np.ndarray]
) -> tuple[int | None, str, Counter, float]:
    """Trace the model at the sample's shapes and count its floating-point operations with
    TensorFlow's profiler. Returns the count (None if it cannot be counted), how it was
    counted, the graph's op types and the trace's seconds.

    The profiler counts from op types and static shapes only. A graph without function
    calls is counted as traced: freezing it (variables into constants of the same shapes)
    gives the same count, and costs several times the trace on a large model (the frozen
    graph is copied op by op with its weights: 9 s of 11 s for ResNet50 here). A graph with
    calls is frozen first, which inlines them."""
    import tensorflow as tf

    specs = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in sample]
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # the v1 profiler warns that it is v1
    op_types: Counter = Counter()
    trace_s = 0.0
    try:
        start = time.perf_counter()
        concrete = tf.function(graph_function).get_concrete_function(*specs)
        trace_s = time.perf_counter() - start
        op_types = Counter(op.type for op in concrete.graph.get_operations())
        graph = concrete.graph
        if any(op_types.get(op) for op in _CALL_OPS):
            from tensorflow.python.framework.convert_to_constants import (
                convert_variables_to_constants_v2,
            )

            graph = convert_variables_to_constants_v2(concrete).graph
        builder = tf.compat.v1.profiler.ProfileOptionBuilder
        options = builder(builder.float_operation()).with_empty_output().build()
        profile = tf.compat.v1.profiler.profile(
            graph=graph, run_meta=tf.compat.v1.RunMetadata(), cmd="op", options=options
        )
    except Exception as exc:  # an op the profiler cannot walk: the work stays unknown
        note = f"TensorFlow's profiler could not count it: {one_line(exc)}"
        return None, note, op_types, trace_s
    finally:
        tf_logger.setLevel(level)
    note = "counted by TensorFlow's profiler from the graph"
    return int(profile.total_float_ops), note, op_types, trace_s


def measure_retracing(
    graph_function: Any, signature: Any, batch_sizes: list[int], rng: np.random.Generator
) -> Retracing:
    """Call a plain tf.function on each batch size and count its traces; then with a signature."""
    import tensorflow as tf

    plain = tf.function(graph_function)
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # TensorFlow warns about the retracing we provoke
    try:
        return _count_traces(plain, graph_function, signature, batch_sizes, rng)
    finally:
        tf_logger.setLevel(level)


def _count_traces(plain, graph_function, signature, batch_sizes, rng) -> Retracing:
    import tensorflow as tf

    from ..model.source import tensor_specs

    trace_ms = 0.0
    for batch in batch_sizes:
        inputs = signature.random_inputs(rng, batch)
        before = plain.experimental_get_tracing_count()
        t0 = time.perf_counter()
        plain(*inputs)
        if plain.experimental_get_tracing_count() > before:
            trace_ms += (time.perf_counter() - t0) * 1e3
    inputs = signature.random_inputs(rng, batch_sizes[-1])
    steady_ms = _best_time(lambda: plain(*inputs), seconds=0.05) * 1e3
    with_signature = tf.function(graph_function, input_signature=tensor_specs(signature))
    for batch in batch_sizes:
        with_signature(*signature.random_inputs(rng, batch))
    return Retracing(
        batch_sizes=list(batch_sizes),
        traces_plain=plain.experimental_get_tracing_count(),
        trace_ms_plain=trace_ms,
        traces_with_signature=with_signature.experimental_get_tracing_count(),
        steady_ms=steady_ms,
    )


def rate_of(name: str, first_ms, p50_ms, flops, peak_gflops) -> PathRate:
    if flops is None or not p50_ms or not peak_gflops:
        return PathRate(name, first_ms, p50_ms)
    gflops = flops / (p50_ms / 1e3) / 1e9
    return PathRate(name, first_ms, p50_ms, gflops, gflops / peak_gflops)


def advise(diagnosis: Diagnosis) -> list[str]:
    """The changes that would help most, each with the gain measured here, largest first."""
    ref = diagnosis.reference
    tips: list[tuple[float, str]] = []
    best = diagnosis.path(diagnosis.selected)
    if best is not None and best is not ref and ref.p50_ms and best.p50_ms:
        gain = ref.p50_ms / best.p50_ms
        tips.append(
            (
                gain,
                f"Run it with {best.name} (what infertune.optimize() returns): "
                f"{ref.p50_ms:.4g} -> {best.p50_ms:.4g} ms per call, {gain:.1f}x.",
            )
        )
    graph = diagnosis.path("tf-function")
    if graph is not None and graph is not best and ref.p50_ms and graph.p50_ms:
        gain = ref.p50_ms / graph.p50_ms
        if gain > 1.2:
            tips.append(
                (
                    gain,
                    f"Staying in TensorFlow, wrap the model in tf.function with an "
                    f"input_signature: {ref.p50_ms:.4g} -> {graph.p50_ms:.4g} ms, {gain:.1f}x "
                    f"(eager per-op overhead is {ref.p50_ms - graph.p50_ms:.3g} ms per call).",
                )
            )
    if diagnosis.predict_ms and diagnosis.model_call_ms:
        gain = diagnosis.predict_ms / diagnosis.model_call_ms
        if gain > 1.5:
            tips.append(
                (
                    gain,
                    f"Do not use model.predict(x) for single batches: "
                    f"{diagnosis.predict_ms:.3g} ms vs {diagnosis.model_call_ms:.3g} ms for "
                    f"model(x), {gain:.0f}x (predict builds a data pipeline and a step "
                    f"function on every call).",
                )
            )
    r = diagnosis.retracing
    if r is not None and r.traces_plain > r.traces_with_signature and r.steady_ms > 0:
        per_trace = r.trace_ms_plain / r.traces_plain
        tips.append(
            (
                per_trace / r.steady_ms,  # how much slower a call on a new batch size is
                f"A plain tf.function traced {r.traces_plain} times for {len(r.batch_sizes)} "
                f"batch sizes, {per_trace:,.0f} ms each ({per_trace / r.steady_ms:.0f}x a traced "
                f"call): give it an input_signature with a None batch dimension (1 trace), or "
                f"reduce_retracing=True.",
            )
        )
    tips.sort(key=lambda t: -t[0])
    return [text for _, text in tips[:3]]


# -- the diagnosis of an optimize() run --------------------------------------------------
def diagnose(
    source: ModelSource | None,
    signature: InputSignature,
    sample: list[np.ndarray],
    results: list[CandidateResult],
    selected: str,
    environment: dict,
    *,
    flops: tuple[int | None, str] | None = None,
    record: MachineRecord | None = None,
    timed: Callable[[str], AbstractContextManager] | None = None,
    description: str | None = None,
) -> Diagnosis:
    """The diagnosis part every report carries: rates of the measured paths against the peak.

    `source`: the model, None where the run has only its package (then `flops` and
    `description` are given); `flops`: the count and its note where the run already has them
    (planning counts them before the candidates); `record`: this machine's record, whose peak
    is used where one was measured before (and stored once measured); `timed(stage)`: a
    context manager timing each part (optimize()'s stage record)."""

    def stage(name: str) -> AbstractContextManager:
        return timed(name) if timed is not None else nullcontext()

    if flops is None:
        with stage("diagnosis: FLOP count"):
            flops = count_flops(source.graph_function(signature), sample)
    flops, flops_note = flops
    with stage("diagnosis: machine peak"):
        peak = machine_peak(record)
    by_name = {r.name: r for r in results}
    names = [results[0].name, "tf-function", "tf-xla", "onnxruntime-cpu", selected]
    paths = []
    for name in dict.fromkeys(names):  # in order, without repeats
        r = by_name.get(name)
        if r is not None and r.latency is not None:
            paths.append(rate_of(r.name, r.first_call_ms, r.latency.p50, flops, peak))
    diagnosis = Diagnosis(
        model=description or source.description,
        batch_size=signature.sample_batch,
        flops=flops,
        flops_note=flops_note,
        peak_gflops=peak,
        paths=paths,
        selected=selected,
        threads=_threads_in_use(by_name.get(selected)),
        cpu_features=environment["cpu"]["features"],
        gpu=", ".join(environment["gpus"])
        or "none: TensorFlow sees no GPU, host-device copies do not apply",
    )
    diagnosis.advice = advise(diagnosis)
    return diagnosis


def machine_peak(record: MachineRecord | None) -> float:
    """The machine's float32 GFLOP/s: from its record where measured before, else measured
    now (about a second) and recorded. A peak does not change while the CPU and the
    libraries (part of the record's key) stay the same; it is measured again every
    PEAK_EVERY runs, and the highest measurement stands (pipeline/machine.py)."""
    recorded = record.peak_gflops if record is not None else None
    if recorded is not None:
        record.use_peak()
        return recorded
    peak = measure_float32_ceiling()
    if record is not None:
        record.set_peak(peak)
        peak = record.peak_gflops or peak  # the highest measured here
    return peak


def _threads_in_use(selected: CandidateResult | None) -> dict:
    cores = usable_cores()
    threads: dict = {"usable_cores": cores}
    tf = _tensorflow()
    if tf is not None:
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        inter = tf.config.threading.get_inter_op_parallelism_threads()
        threads = {
            "tensorflow_intra_op": intra or f"default ({cores} cores)",
            "tensorflow_inter_op": inter or "default",
            **threads,
        }
    if selected is not None and selected.name.startswith("onnxruntime-cpu"):
        marker = ":threads="
        chosen = selected.name.split(marker)[1].split(":")[0] if marker in selected.name else None
        threads["onnxruntime_intra_op"] = chosen or "default (one per physical core)"
    return threads


def predict_vs_call(source, signature, sample) -> tuple[float, float]:
    """Median ms of model(x) and model.predict(x) on the sample, interleaved."""
    x = signature.structure.pack(sample)
    keras_model = source.owner
    runners = {
        "call": lambda: source.call_flat(signature, sample),
        "predict": lambda: keras_model.predict(x, verbose=0),
    }
    estimates = {name: warm_up(run, min_calls=2, min_s=0.05) for name, run in runners.items()}
    measured = measure_interleaved(
        runners, budget_s=2.0, min_rounds=3, per_call_estimate_s=estimates
    )
    return measured.stats["call"].p50, measured.stats["predict"].p50
