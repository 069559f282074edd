"""The pipeline's frame: everything the contest between candidates needs to know of the model,
made once, from the model itself (`frame_model`, with TensorFlow) or from a package's files
(packaging.py `Package.frame`, without it).

A frame holds the Target the candidates are prepared on, the verification inputs with the
model's outputs on each (the checks), the output signature, what planning knows of the model
(the probe), the data reduced precision is judged by, and the candidates themselves; the
contest (contest.py) runs on it whichever way it was made, so that a tuned package and a tuned
model go through the same stages and get the same report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import Backend
from ..backends.keras_eager import KerasEager
from ..backends.registry import BACKENDS
from ..backends.tf_function import TfFunction
from ..backends.tf_head import TensorFlowOnly, TfHeadChain
from ..errors import ModelError
from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from ..model.source import ModelSource
from ..model.splitting import Split, find_split
from ..model.target import Target
from ..model.tolerance import compare_outputs
from ..model.traffic import Traffic
from ..options import Options
from ..precision.data import LabelledBatch
from ..precision.gate import FIRST_ROWS, PrecisionData, precision_data
from ..report.progress import Progress
from .planning import Probe
from .reference import (
    Check,
    EagerVsTraced,
    compare_traced,
    output_signature,
    probe,
    reference_outputs,
    tuned_batch_sizes,
    verification_inputs,
)
from .traffic_plan import TrafficFrame, frame_traffic

__all__ = ["Frame", "Model", "candidates", "frame_model", "reference_kind"]


@dataclass
class Model:
    """The model as the pipeline takes it: loaded, its input signature, the sample flat, and
    the user's data for reduced precision, read and checked (tune.read_data)."""

    source: ModelSource
    signature: InputSignature
    sample: list[np.ndarray]
    gpu_growth: dict  # what enable_tf_memory_growth() did, for the report
    calibration: list[list[np.ndarray]] | None = None  # flat input batches
    labelled: list[LabelledBatch] | None = None
    traffic: Traffic | None = None  # optimize(traffic=...) read: the requests' sizes
    pad_values: tuple = ()  # per flat input, what padding writes


@dataclass
class Frame:
    """What the contest needs of the model."""

    description: str  # the model, in the report's words
    signature: InputSignature
    sample: list[np.ndarray]
    target: Target
    checks: list[Check]  # the sample first, then the other verification inputs
    outputs: OutputSignature
    probe: Probe  # the model's arithmetic, op types, trace and call times
    candidates: list[Backend]  # the model's own call first
    batch_sizes: list[int] | None  # the tuned batch sizes (the sample's among them), or None
    precision: PrecisionData | None = None  # what reduced precision is judged by
    source: ModelSource | None = None  # None where the frame was made from a package
    first_call_s: float = 0.0  # the model's own first call (no candidate can save it)
    traced_differs: bool = False  # the model's traced graph differs from model(x)
    split: Split | None = None  # the preprocessing run apart in TensorFlow, where there is
    traffic: TrafficFrame | None = None  # optimize(traffic=...): padding checked, lengths
    notes: list[str] = field(default_factory=list)  # what the frame found, for the report

    @property
    def has_model(self) -> bool:
        """Whether the model itself is here (its own call is the first candidate)."""
        return self.source is not None


def frame_model(model: Model, options: Options, progress: Progress) -> Frame:
    """The frame of a loaded model: its reference outputs, the split of preprocessing no
    converter takes, the Target, the reference kind (eager or traced), the verification
    inputs, the output signature, the reduced-precision data and one trace for planning."""
    source, signature, sample = model.source, model.signature, model.sample
    batch_sizes = tuned_batch_sizes(options.batch_sizes, signature)
    with progress.timed("reference", text="computing reference outputs"):
        reference, structure, first_call_s = reference_outputs(source, signature, sample)
    with progress.timed("split", text="looking for preprocessing to run apart"):
        split, unsplit = find_split(source, signature, sample)
    if split is not None:
        progress.say(f"the model is {split.describe()}")
    dtypes = [ref.dtype for ref in reference]
    target = Target(source, signature, structure, dtypes, options.objective, options.concurrency)
    reference, versus, call = reference_kind(target, sample, reference, options, progress)
    target.output_dtypes = [ref.dtype for ref in reference]
    with progress.timed("verification inputs"):
        checks, call_s = verification_inputs(
            source, signature, sample, reference, progress, batch_sizes, call
        )
    outputs = output_signature(structure, signature, checks)
    precision = None
    if model.calibration or model.labelled:
        with progress.timed("calibration", text="the model on the calibration and accuracy data"):
            reference_call = call or (lambda flat: source.call_flat(signature, flat)[0])
            precision = precision_data(
                model.calibration, options.accuracy, model.labelled, outputs, reference_call,
                references=False,
            )  # fmt: skip
            precision.batch_sizes = [n for n in batch_sizes or [] if n != signature.sample_batch]
        target.calibration = precision.calibration or None
    with progress.timed("FLOP count", text="counting the model's arithmetic (one trace of it)"):
        planned = probe(source, signature, sample, checks, call_s, None)
    traffic = None
    if model.traffic is not None:
        reference_call = call or (lambda flat: source.call_flat(signature, flat)[0])
        traffic = frame_traffic(
            model.traffic, signature, reference_call, model.pad_values, options.rtol,
            options.atol, progress,
        )  # fmt: skip
    # Without strings, a model that cannot be split still goes whole to every converter.
    backends = candidates(source, options, split, unsplit if signature.strings else None)
    notes = (
        [versus.note()]
        + ([source.inference_note] if source.inference_note else [])
        + _split_notes(split, unsplit, signature.strings)
        + _gpu_notes(model.gpu_growth)
    )
    return Frame(
        source.description, signature, sample, target, checks, outputs, planned, backends,
        batch_sizes, precision, source, first_call_s, versus.differs, split, traffic, notes,
    )  # fmt: skip


def candidates(
    source: ModelSource,
    options: Options,
    split: Split | None = None,
    unsplit: str | None = None,
) -> list[Backend]:
    """The reference (the model's own call) first, then the requested (or all registered)
    backends, each a new instance.

    Where the model is split (`split`), each candidate that converts the model is replaced by
    a chain (TfHeadChain: the TensorFlow head, then the body on that candidate): what goes in
    the head is what no converter takes (model/splitting.py), so the whole model would only
    fail its conversion. Where the model takes strings and cannot be split (`unsplit` says
    why), the converting candidates are skipped with that reason."""
    reference = KerasEager("keras-eager" if source.is_keras else "original")
    wanted = list(BACKENDS) if options.backends is None else list(options.backends)
    chosen = [b if isinstance(b, Backend) else BACKENDS[b]() for b in wanted]
    if split is not None:
        chosen = [b if _runs_in_tensorflow(b) else TfHeadChain(b, split) for b in chosen]
    if unsplit is not None:
        chosen = [b if _runs_in_tensorflow(b) else TensorFlowOnly(b, unsplit) for b in chosen]
    return [reference, *chosen]


def _runs_in_tensorflow(backend: Backend) -> bool:
    """A candidate that runs the whole model as TensorFlow runs it (strings, lookup tables
    and all): the model's own call, and tf.function without XLA."""
    if isinstance(backend, KerasEager | TfHeadChain | TensorFlowOnly):
        return True
    return type(backend) is TfFunction


def reference_kind(
    target: Target,
    sample: list[np.ndarray],
    eager: list[np.ndarray],
    options: Options,
    progress: Progress,
) -> tuple[list[np.ndarray], EagerVsTraced, Any]:
    """The traced graph against the eager call on the sample (one call of the trace the
    candidates share); with reference="traced", the traced outputs as the reference, the call
    that computes the others, and the model's own check that it reproduces them."""
    with progress.timed("traced graph", text="tracing the model and comparing with its call"):
        versus, traced = compare_traced(
            target, sample, eager, options.reference, options.rtol, options.atol
        )
        if not versus.agree:
            progress.say(versus.note())
        if options.reference == "eager":
            return eager, versus, None
        call = target.run_traced
        again = compare_outputs(call(sample), traced, options.rtol, options.atol)
    if not again:
        raise ModelError(
            f"The model's traced graph does not reproduce its own outputs on the same input "
            f"({again.reason}); a model with randomness at inference cannot be verified."
        )
    return traced, versus, call


def predicted_by_note(precision: PrecisionData | None) -> list[str]:
    """Where the model's predictions on the labelled data were made by a verified candidate,
    which and how that was checked."""
    if precision is None or precision.predicted_by == "the model":
        return []
    return [
        f"the model's predictions on the labelled data by {precision.predicted_by} (verified, "
        f"and within rtol/atol of the model's own on the first {FIRST_ROWS} rows)"
    ]


def _split_notes(split: Split | None, unsplit: str | None, strings: list[str]) -> list[str]:
    """Where the model was split and why, or why a model that needs a split was not."""
    if split is not None:
        return [f"the model is {split.describe()}"]
    if unsplit is not None and strings:
        return [f"only TensorFlow candidates run this model: {unsplit}"]
    if unsplit is not None:
        return [f"the model was not split (every candidate converts it whole): {unsplit}"]
    return []


def _gpu_notes(growth: dict) -> list[str]:
    """What enable_tf_memory_growth() did, where TensorFlow sees a GPU."""
    if not growth["gpus"]:
        return []
    note = f"TensorFlow GPU memory growth: enabled on {growth['enabled'] or 'none'}"
    if growth["too_late"]:
        note += (
            f"; not on {growth['too_late']}, already initialized by the caller (TensorFlow "
            f"may hold most of that GPU's memory: call tf.config.experimental."
            f"set_memory_growth before first use)"
        )
    return [note]
