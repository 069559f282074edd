"""The user's data in the forms optimize() takes it: calibration inputs (`calibration=`) and
labelled batches (`Accuracy(data=...)`), each as flat numpy batches checked against the
model's input signature before any long work.

Forms: one batch as the model takes it (an array, a dict or list of arrays), a
`tf.data.Dataset` of batches (of `(x, y)` pairs for labelled data), or any iterable of such
batches; for labelled data also one `(x, y)` pair. A dataset is read to its end or to
`max_samples`, whichever comes first (the data is held in memory: calibration takes hundreds
of samples, not an epoch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError
from ..model.inputs import (
    InputSignature,
    to_numpy,
)

__all__ = [
    "LabelledBatch",
    "arrays_batches",
    "batches_arrays",
    "calibration_batches",
    "first_samples",
    "labelled_batches",
    "numbered",
    "samples",
]

# The most samples read from a dataset or iterable: what calibration and a metric's margin
# need (NNCF's default subset is 300; a bootstrap's margin on 10,000 samples is 0.4 points of
# accuracy at 95%).
MAX_CALIBRATION_SAMPLES = 512
MAX_LABELLED_SAMPLES = 10_000
# Calibration and labelled data are cut into batches of at most this many rows: what the model
# and each candidate run at a time on them, memory bounded whatever the user's batch (256
# MobileNetV2 224 images given as one array were one call of the model and of every candidate
# on the calibration inputs: 23.5 GB resident, benchmarks/calibration_memory.py); the model's
# own first labelled batch is what the metric is checked on before any long work
# (precision/gate.py).
BATCH_ROWS = 32


@dataclass
class LabelledBatch:
    """One batch of labelled data: the model's flat inputs and the labels."""

    inputs: list[np.ndarray]
    labels: np.ndarray


def calibration_batches(
    data: Any, signature: InputSignature, max_samples: int = MAX_CALIBRATION_SAMPLES
) -> list[list[np.ndarray]]:
    """`calibration=` as flat input batches of at most BATCH_ROWS rows checked against the
    signature (InputError naming the input otherwise), at most `max_samples` samples in all."""
    batches, count = [], 0
    for batch in _batches(data, "calibration", len(signature.specs)):
        flat = _flat(signature, batch, "calibration")
        size = _batch_size(flat)
        batches += [flat] if size <= BATCH_ROWS else _in_rows(flat, size)
        count += size
        if count >= max_samples:
            break
    if not batches or count == 0:
        raise OptionError("calibration= holds no samples: give at least one batch of inputs.")
    return first_samples(batches, max_samples)


def labelled_batches(
    data: Any, signature: InputSignature, max_samples: int = MAX_LABELLED_SAMPLES
) -> list[LabelledBatch]:
    """`Accuracy(data=...)` as labelled batches of at most BATCH_ROWS rows, max_samples in
    all: flat inputs checked against the signature, labels with as many rows as the inputs
    (OptionError otherwise)."""
    pairs = [data] if _is_pair(data) else _batches(data, "Accuracy(data=...)", 0)
    batches, count = [], 0
    for pair in pairs:
        if not _is_pair(pair):
            raise OptionError(
                f"Accuracy(data=...) must be (x, y), a tf.data.Dataset of (x, y) batches, or "
                f"an iterable of (x, y) batches. Received an item of type "
                f"{type(pair).__name__}."
            )
        x, y = pair
        flat = _flat(signature, x, "Accuracy(data=...)")
        labels = to_numpy(y)
        size = _batch_size(flat)
        if labels.ndim == 0 or labels.shape[0] != size:
            raise OptionError(
                f"Accuracy(data=...): the labels have shape {labels.shape}, the inputs a batch "
                f"of {size}: give one label (row) per sample."
            )
        take = min(size, max_samples - count)
        batches += [LabelledBatch(rows[:-1], rows[-1]) for rows in _in_rows([*flat, labels], take)]
        count += take
        if count >= max_samples:
            break
    if count == 0:
        raise OptionError("Accuracy(data=...) holds no samples.")
    return batches


def samples(batches: list[list[np.ndarray]]) -> int:
    """How many samples flat batches hold."""
    return sum(_batch_size(batch) for batch in batches)


def _is_pair(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2


def _batches(data: Any, what: str, inputs: int) -> Iterable[Any]:
    """The batches of a dataset or iterable; one batch where `data` is one. A list of
    arrays is one batch of a model of that many inputs (`inputs`), else a list of batches
    (of a single-input model: what a calibration set split in batches is)."""
    if data is None:
        raise OptionError(f"{what} is None.")
    if _is_dataset(data):
        return (_numpy_tree(item) for item in data)
    if isinstance(data, np.ndarray | dict) or callable(getattr(data, "numpy", None)):
        return [data]
    arrays = isinstance(data, list) and data and not isinstance(data[0], list | tuple | dict)
    if arrays and inputs > 1 and len(data) == inputs:
        return [data]  # one batch of a list-input model
    if isinstance(data, Iterable) and not isinstance(data, str | bytes):
        return data
    raise OptionError(
        f"{what} must be arrays, a dict of arrays, a tf.data.Dataset or an iterable of "
        f"batches. Received: {type(data).__name__}."
    )


def _is_dataset(data: Any) -> bool:
    return any(cls.__name__ in ("DatasetV2", "DatasetV1") for cls in type(data).__mro__)


def _numpy_tree(item: Any) -> Any:
    """A dataset element with its tensors as numpy arrays."""
    if isinstance(item, dict):
        return {key: _numpy_tree(value) for key, value in item.items()}
    if isinstance(item, tuple):
        return tuple(_numpy_tree(value) for value in item)
    if isinstance(item, list):
        return [_numpy_tree(value) for value in item]
    return to_numpy(item)


def _flat(signature: InputSignature, batch: Any, what: str) -> list[np.ndarray]:
    from ..errors import InputError

    try:
        return signature.flatten(batch)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None


def _batch_size(flat: list[np.ndarray]) -> int:
    return int(flat[0].shape[0]) if flat and flat[0].ndim else 1


def _in_rows(arrays: list[np.ndarray], size: int) -> list[list[np.ndarray]]:
    """The first `size` rows of `arrays` (as many rows each) in parts of at most BATCH_ROWS."""
    return [[a[i : min(i + BATCH_ROWS, size)] for a in arrays] for i in range(0, size, BATCH_ROWS)]


def batches_arrays(prefix: str, batches: list[list[np.ndarray]]) -> dict[str, np.ndarray]:
    """Flat batches as named arrays for an .npz file: `{prefix}_{batch}_{input}`."""
    return {f"{prefix}_{i}_{j}": a for i, batch in enumerate(batches) for j, a in enumerate(batch)}


def arrays_batches(arrays: dict[str, np.ndarray], prefix: str) -> list[list[np.ndarray]]:
    """The flat batches `batches_arrays` named `prefix`, in order."""
    batches = []
    while f"{prefix}_{len(batches)}_0" in arrays:
        batches.append(numbered(arrays, f"{prefix}_{len(batches)}"))
    return batches


def numbered(arrays: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    """`{prefix}_0`, `{prefix}_1`, ... of `arrays`, up to the first missing."""
    found = []
    while f"{prefix}_{len(found)}" in arrays:
        found.append(arrays[f"{prefix}_{len(found)}"])
    return found


def first_samples(batches: list[list[np.ndarray]], max_samples: int) -> list[list[np.ndarray]]:
    """The batches with the last one cut so that they hold at most `max_samples`."""
    kept, count = [], 0
    for batch in batches:
        size = _batch_size(batch)
        if count + size > max_samples:
            batch = [array[: max_samples - count] for array in batch]
            size = max_samples - count
        if size > 0:
            kept.append(batch)
        count += size
        if count >= max_samples:
            break
    return kept
