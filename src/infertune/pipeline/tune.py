"""optimize() on a model: the model loaded and its data read, then the pipeline's two halves,
its frame (frame.py: the reference, the split, the Target, the checks) and the contest between
the candidates on it (contest.py: prepare, verify, measure, choose, report).

inputs -> reference -> candidates -> prepare -> verify -> measure -> select -> choice + report
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from ..model.inputs import build_signature
from ..model.source import load_model
from ..model.traffic import Traffic, read_traffic
from ..options import Options
from ..precision.data import calibration_batches, labelled_batches
from ..report import Report
from ..report.progress import Progress
from ..result.choice import Choice
from ..system.gpu import enable_tf_memory_growth
from .contest import contest
from .frame import Model, frame_model
from .padding import pad_values_for
from .selection import Forced

__all__ = ["Model", "load_for_tuning", "read_data", "tune"]


def tune(
    model: Model, options: Options, progress: Progress, forced: Forced | None = None
) -> tuple[Choice, Report]:
    """Every stage of optimize() after the model is loaded: the choice and its report
    (`forced`: the choice given instead of measured, selection.Forced)."""
    return contest(frame_model(model, options, progress), options, progress, forced)


def load_for_tuning(model: Any, sample_input: Any, progress: Progress) -> Model:
    """The model loaded and its sample checked against it: the pipeline's input."""
    with progress.timed("model load", text="loading the model"):
        # Before TensorFlow runs anything on a GPU: candidates after it must still find memory.
        growth = enable_tf_memory_growth()
        source = load_model(model)
        signature, sample = build_signature(
            sample_input, source.declared_inputs, source.default_float
        )
        progress.say(f"{source.description}; inputs {signature.describe()}")
    return Model(source, signature, sample, growth)


def read_data(model: Model, options: Options, progress: Progress) -> Options:
    """optimize(calibration=..., accuracy=..., traffic=...) read into flat batches (the
    traffic into its sizes) and checked against the model's inputs (InputError, OptionError:
    before any long work); the options with a digest of the data (it decides the result: the
    tuning cache's key)."""
    if options.traffic is not None:
        with progress.timed("reading the traffic"):
            model.traffic = read_traffic(options.traffic, model.signature, options.free_dims)
            model.pad_values = pad_values_for(options.pad_value, model.signature)
        progress.say(f"traffic: {model.traffic.describe()}")
        digest = model.traffic.digest()
        options = dataclasses.replace(options, traffic=model.traffic, traffic_digest=digest)
        sizes = traffic_batch_sizes(model.traffic, model.signature.sample_batch)
        if options.batch_sizes is None and sizes and model.signature.batch_is_dynamic:
            progress.say(f"batch sizes from the traffic: {list(sizes)}")
            options = dataclasses.replace(options, batch_sizes=sizes)
    if options.calibration is None and options.accuracy is None:
        return options
    digest = hashlib.sha256()
    with progress.timed("reading the calibration and accuracy data"):
        if options.calibration is not None:
            model.calibration = calibration_batches(options.calibration, model.signature)
            for batch in model.calibration:
                _digest(digest, batch)
        if options.accuracy is not None:
            model.labelled = labelled_batches(options.accuracy.data, model.signature)
            for labelled in model.labelled:
                _digest(digest, [*labelled.inputs, labelled.labels])
    return dataclasses.replace(options, data_digest=digest.hexdigest()[:32])


# The batch sizes tuned where the traffic's requests come in several: each distinct one, or
# where there are more, these quantiles of them (the largest always among them: a call goes
# to the choice for the smallest tuned batch size at or above its own). A size with a larger
# tuned one (the sample's among them) within CLOSE_BATCH of it is left to that one.
BATCH_QUANTILES = (0.0, 0.5, 0.9, 1.0)
MAX_TRAFFIC_BATCH_SIZES = 4
CLOSE_BATCH = 1.25


def traffic_batch_sizes(traffic: Traffic, sample_batch: int | None) -> tuple[int, ...] | None:
    """The batch sizes to tune at for the traffic's requests; None where they are one."""
    distinct = sorted({int(n) for n in traffic.batches})
    if len(distinct) < 2:
        return None
    if len(distinct) > MAX_TRAFFIC_BATCH_SIZES:
        distinct = sorted(
            {int(n) for n in np.quantile(traffic.batches, BATCH_QUANTILES, method="higher")}
        )
    tuned = {*distinct, *([sample_batch] if sample_batch else [])}
    kept = [n for n in distinct if not any(n < m <= n * CLOSE_BATCH for m in tuned)]
    return tuple(kept) if len({*kept, *([sample_batch] if sample_batch else [])}) > 1 else None


def _digest(digest: Any, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes() if array.dtype != object else
                      repr(array.tolist()).encode())  # fmt: skip
