"""The reference: the model's own outputs on the sample, and the verification inputs every
candidate must reproduce (fresh random inputs drawn like the sample, at other batch sizes and
at other sizes of the free dimensions), with the model's outputs on each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError, ModelError, OptionError, one_line
from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from ..model.source import ModelSource
from ..model.target import Target
from ..model.tolerance import (
    Comparison,
    compare_outputs,
)
from ..report.progress import Progress
from .diagnosis import trace_and_count
from .planning import Probe
from .timing import time_once

__all__ = [
    "FRESH_INPUTS",
    "OTHER_SIZE_STEP",
    "Check",
    "EagerVsTraced",
    "compare_traced",
    "output_signature",
    "probe",
    "reference_outputs",
    "tuned_batch_sizes",
    "verification_inputs",
]

FRESH_INPUTS = 2  # random inputs at the sample's batch size, besides the sample itself
# How much larger each free non-batch dimension is in the verification input at other sizes:
# a sequence a bit longer, and an image side with the sample's remainder modulo 32, so that
# a network of stride 32 (most CNNs) that took the sample takes it too.
OTHER_SIZE_STEP = 32


@dataclass
class Check:
    """One verification input and the reference outputs for it."""

    label: str
    inputs: list[np.ndarray]
    reference: list[np.ndarray]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [array.shape for array in self.inputs]

    @property
    def batch(self) -> int | None:
        """The batch size all its inputs share; None where they differ or have none."""
        sizes = {shape[0] if shape else None for shape in self.shapes}
        return sizes.pop() if len(sizes) == 1 else None


def reference_outputs(
    source: ModelSource, signature: InputSignature, sample: list[np.ndarray]
) -> tuple[list[np.ndarray], Any, float]:
    """The model's own outputs on the sample, their structure, and the first call's time."""
    try:
        (flat, structure), seconds = time_once(lambda: source.call_flat(signature, sample))
    except Exception as exc:
        raise InputError(
            f"The model rejected the sample: {one_line(exc)}. Expected inputs: "
            f"{signature.describe()}."
        ) from exc
    for i, array in enumerate(flat):
        if array.dtype == object or array.dtype.kind not in "biufc":
            raise ModelError(
                f"Output {i} of the model has dtype {array.dtype}; infertune handles numeric "
                f"outputs."
            )
    return flat, structure, seconds


def verification_inputs(
    source: ModelSource,
    signature: InputSignature,
    sample: list[np.ndarray],
    reference: list[np.ndarray],
    progress: Progress,
    batch_sizes: list[int] | None = None,
    call: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None,
) -> tuple[list[Check], float]:
    """The sample, fresh random inputs like it, one at each other tuned batch size (one at
    another batch size where none is given and the batch is free), and, where the model has
    free dimensions besides the batch (a sequence length, an image's height and width), one
    at the sample's batch size with each of those dimensions OTHER_SIZE_STEP larger; and the
    model's seconds per call at the sample's shapes, steady (the first call is the sample's).
    An input the model raises on is left out, said in the progress. `call` computes the
    reference outputs (`Target.run_traced` with reference="traced"); None: the model's own."""
    if call is None:

        def call(inputs: list[np.ndarray]) -> list[np.ndarray]:
            return source.call_flat(signature, inputs)[0]

    rng = np.random.default_rng(0)
    batch = signature.sample_batch
    at_sample = signature.concrete_shapes()
    wanted = [(f"random input {i + 1}", at_sample) for i in range(FRESH_INPUTS)]
    if batch_sizes:
        others = [size for size in batch_sizes if size != batch]
    elif batch is not None and signature.batch_is_dynamic:
        others = [1 if batch > 1 else 3]
    else:
        others = []
    wanted += [
        (f"random input at batch {other}", signature.concrete_shapes(other)) for other in others
    ]
    other_sizes = signature.other_sizes(OTHER_SIZE_STEP)
    if other_sizes is not None:
        words = ", ".join(str(shape) for shape in other_sizes)
        wanted.append((f"random input at other sizes of the free dimensions {words}", other_sizes))
    checks = [Check("the sample", sample, reference)]
    seconds = []
    for label, shapes in wanted:
        inputs = signature.random_inputs(rng, shapes=shapes)
        try:
            outputs, took = time_once(lambda i=inputs: call(i))
        except Exception as exc:
            progress.say(f"the model raised on {label}, verifying without it: {one_line(exc)}")
            continue
        if shapes == at_sample:
            seconds.append(took)
        checks.append(Check(label, inputs, outputs))
    return checks, min(seconds, default=0.0)


def probe(
    source: ModelSource,
    signature: InputSignature,
    sample: list[np.ndarray],
    checks: list[Check],
    call_s: float,
    peak_gflops: float | None,
) -> Probe:
    """What the candidates' order and the budget are planned from: one trace of the model at
    the sample's shapes gives its arithmetic (the diagnosis' count too), its op types and the
    trace's time; the model's own call time comes from the verification inputs."""
    flops, note, op_types, trace_s = trace_and_count(source.graph_function(signature), sample)
    return Probe(flops, note, op_types, trace_s, call_s, len(checks), peak_gflops)


def tuned_batch_sizes(batch_sizes: tuple[int, ...] | None, signature: InputSignature):
    """The batch sizes to tune at (the sample's among them), or None for the sample's only."""
    if batch_sizes is None:
        return None
    if not signature.batch_is_dynamic or signature.sample_batch is None:
        raise OptionError(
            f"batch_sizes={list(batch_sizes)} needs a model whose batch dimension is free, "
            f"and a sample whose inputs share one batch size; this model's inputs are "
            f"{signature.describe()} and the sample's shapes {list(signature.sample_shapes)}. "
            f"Leave batch_sizes=None to tune at the sample's batch size."
        )
    return sorted({*batch_sizes, signature.sample_batch})


def output_signature(
    structure: Any, signature: InputSignature, checks: list[Check]
) -> OutputSignature:
    """The outputs' names, dtypes and shapes, from the reference outputs of every check (a
    dimension that differs between them is None): what save() records for servers."""
    free_features = any(None in spec.shape[1:] for spec in signature.specs)
    return OutputSignature.observed(structure, [c.reference for c in checks], free_features)


# What the traced graph is, in the report's words.
TRACED_WORDS = (
    "its traced graph (tf.function(model): what model.predict() and model.export() compute, "
    "what tf-function runs and every converter starts from)"
)


@dataclass(frozen=True)
class EagerVsTraced:
    """The model's traced graph against its eager call on the sample: the comparison (under
    optimize()'s rtol/atol, the traced outputs judged against the eager ones), where they
    first part (a layer, where infertune can tell), and which of them is the reference."""

    comparison: Comparison
    reference: str  # "eager" or "traced"
    where: str = ""
    failed: bool = False  # the traced graph could not be made or run

    @property
    def agree(self) -> bool:
        return self.comparison.passed

    @property
    def differs(self) -> bool:
        """The traced graph ran, and computes something else than the eager call."""
        return not (self.comparison.passed or self.failed)

    def note(self) -> str:
        """The report's note: which reference was used and how far the other one is."""
        c = self.comparison
        if self.reference == "eager":
            used, other = "the model's eager call model(x) (reference='eager')", TRACED_WORDS
        else:
            used = (
                "the model's traced graph (reference='traced': tf.function(model), what "
                "model.predict() and model.export() compute), not its eager call model(x)"
            )
            other = "model(x)"
        if self.agree:
            return (
                f"reference: {used}; {other} agrees with it on the sample (max abs diff "
                f"{c.max_abs_err:.1e}, relative {c.max_rel_err:.1e})"
            )
        how = f"max abs diff {c.max_abs_err:.2e}, relative {c.max_rel_err:.2e}"
        if not (c.max_abs_err or c.max_rel_err):  # another dtype or shape
            how = c.reason
        where = f"; {self.where}" if self.where else ""
        note = (
            f"reference: {used}. WARNING: {other} differs from it on the sample beyond "
            f"rtol/atol ({how}){where}."
        )
        if self.failed:  # only with reference="eager": "traced" raises instead
            return (
                f"reference: {used}. WARNING: {other} failed on the sample ({c.reason}): "
                f"every candidate that runs it or a conversion of it fails too"
            )
        if self.reference == "eager":
            return (
                f"{note} Every candidate that runs the traced graph or a conversion of it "
                f"fails verification against model(x). If your production call is "
                f"model.predict() or an exported model, optimize(..., reference='traced') "
                f"verifies against the traced graph instead"
            )
        return f"{note} The result computes the traced graph's outputs, not model(x)'s"


def compare_traced(
    target: Target,
    sample: list[np.ndarray],
    eager: list[np.ndarray],
    reference: str,
    rtol: float,
    atol: float,
) -> tuple[EagerVsTraced, list[np.ndarray] | None]:
    """The traced graph's outputs on the sample against the eager call's, and those outputs
    (None where the model cannot be traced). One call of the shared trace: the trace itself
    is what the tf-function candidate and every conversion use. Only where they differ is the
    model searched for the first layer that differs. A model that cannot be traced: with
    reference="traced", a ModelError; else a note (its traced candidates fail and say why)."""
    try:
        traced = target.run_traced(sample)
    except Exception as exc:
        if reference == "traced":
            raise ModelError(
                f"reference='traced' needs the model's traced graph, and tracing or calling "
                f"it failed: {one_line(exc)}. Use reference='eager'."
            ) from exc
        failure = Comparison(False, one_line(exc))
        return EagerVsTraced(failure, reference, failed=True), None
    comparison = compare_outputs(traced, eager, rtol, atol)
    if comparison.passed:
        return EagerVsTraced(comparison, reference), traced
    where = first_differing_layer(target.source, target.signature, sample, rtol, atol)
    return EagerVsTraced(comparison, reference, where), traced


def first_differing_layer(
    source: ModelSource, signature: InputSignature, sample: list[np.ndarray], rtol: float,
    atol: float,
) -> str:  # fmt: skip
    """Where a Keras Functional or Sequential model's eager and traced outputs first part: the
    first layer (in the model's order) whose outputs differ, with how; "" where that cannot be
    told (a subclassed model, a layer used twice). Runs the model once more each way, with every
    layer's output as an output: only called where the model's outputs differ."""
    model = source.owner
    try:
        import keras
        import tensorflow as tf

        layers = [x for x in model.layers if not isinstance(x, keras.layers.InputLayer)]
        probe_model = keras.Model(model.input, [layer.output for layer in layers])
        inputs = signature.structure.pack(list(sample))
        eager = probe_model(inputs)
        traced = tf.function(probe_model)(inputs)
    except Exception:  # no layer-by-layer view of this model: the note says what differs only
        return ""
    for layer, eager_out, traced_out in zip(layers, eager, traced):
        for e, t in zip(tf.nest.flatten(eager_out), tf.nest.flatten(traced_out)):
            e, t = np.asarray(e), np.asarray(t)
            if compare_outputs([t], [e], rtol, atol):
                continue
            kind = type(layer).__name__
            diff = np.max(np.abs(e.astype(np.float64) - t.astype(np.float64)), initial=0.0)
            if e.dtype == t.dtype:
                return (
                    f"the first layer whose outputs differ is {layer.name!r} ({kind}), by up "
                    f"to {diff:.2e}"
                )
            why = ""
            if any(c.__name__ in ("DataLayer", "TFDataLayer") for c in type(layer).__mro__):
                why = (
                    f": Keras' preprocessing layers convert their inputs to their compute "
                    f"dtype ({layer.compute_dtype}) inside a traced graph, as in a tf.data "
                    f"pipeline, and keep them as given when called eagerly"
                )
            return (
                f"the first layer whose outputs differ is {layer.name!r} ({kind}): it returns "
                f"{e.dtype} called eagerly and {t.dtype} traced (values up to {diff:.2e} "
                f"apart){why}"
            )
    return ""
