"""The reference: the model's own outputs on the sample, and the verification inputs every
candidate must reproduce (fresh random inputs drawn like the sample, at other batch sizes and
at other sizes of the free dimensions), with the model's outputs on each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError, ModelError, OptionError, one_line
from ..inputs import InputSignature
from ..measure import time_once
from ..models import ModelSource
from ..outputs import OutputSignature
from ..progress import Progress
from .diagnosis import trace_and_count
from .planning import Probe

__all__ = [
    "FRESH_INPUTS",
    "OTHER_SIZE_STEP",
    "Check",
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
) -> tuple[list[Check], float]:
    """The sample, fresh random inputs like it, one at each other tuned batch size (one at
    another batch size where none is given and the batch is free), and, where the model has
    free dimensions besides the batch (a sequence length, an image's height and width), one
    at the sample's batch size with each of those dimensions OTHER_SIZE_STEP larger; and the
    model's seconds per call at the sample's shapes, steady (the first call is the sample's).
    An input the model raises on is left out, said in the progress."""
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
            (outputs, _), took = time_once(lambda i=inputs: source.call_flat(signature, i))
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
