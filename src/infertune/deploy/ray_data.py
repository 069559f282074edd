"""Batch inference with Ray Data: a callable class for `Dataset.map_batches`.

    ds.map_batches(infertune.ray.Predictor, fn_constructor_kwargs={"path": "tuned/"},
                   batch_size=256, compute=ray.data.ActorPoolStrategy(size=4))

Ray's own idiom: each actor builds the class once (loading the saved result, without
TensorFlow where its runtime does not need it) and calls it on many batches, each a dict of
numpy columns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ..errors import InputError
from .served import ServedModel

__all__ = ["FROM_NUMPY_COLUMN", "Predictor"]

FROM_NUMPY_COLUMN = "data"  # the column ray.data.from_numpy makes


class Predictor:
    """Runs the result saved in `path` on batches of a Ray Dataset.

    Input columns are named after the model's inputs (`x` for a model that takes one array,
    its dict keys, `input[0]` ... for a list); a one-input model also takes the column `data`
    that `ray.data.from_numpy` makes. Columns are cast as the model's own call would
    (float64 to float32). The returned batch has one column per output, named after the
    model's outputs (`output` for a single array, its dict keys, `output[0]` ...), and keeps
    the batch's other columns (ids, labels) beside them; the input columns are dropped.
    """

    def __init__(self, path: str | os.PathLike):
        self._model = ServedModel(path)
        self._input_names = {spec.name for spec in self._model.inputs}
        if len(self._model.inputs) == 1:
            self._input_names.add(FROM_NUMPY_COLUMN)
        self._output_names = [spec.name for spec in self._model.outputs]

    @property
    def backend(self) -> str:
        """The candidate that runs the model, e.g. "onnxruntime-cpu"."""
        return self._model.backend

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"Predictor takes a batch as a dict of numpy columns (map_batches' default "
                f"batch_format). Received a {type(batch).__name__}; pass batch_format='numpy'."
            )
        outputs = self._model.run(self._model.check(self._columns(batch), cast=True, kind="column"))
        kept = {name: column for name, column in batch.items() if name not in self._input_names}
        clash = [name for name in self._output_names if name in kept]
        if clash:
            raise InputError(
                f"The batch already has column(s) {clash}, named like the model's outputs "
                f"{self._output_names}; rename them before map_batches."
            )
        return {**kept, **dict(zip(self._output_names, outputs))}

    def _columns(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """The batch's columns, with `data` standing for a one-input model's input."""
        inputs = self._model.inputs
        if len(inputs) != 1 or FROM_NUMPY_COLUMN not in batch or inputs[0].name == "data":
            return batch
        name = inputs[0].name
        if name in batch:
            raise InputError(
                f"The batch has both a '{name}' and a '{FROM_NUMPY_COLUMN}' column; the model "
                f"takes one input ({inputs[0].describe()}): keep one of them."
            )
        return {name: batch[FROM_NUMPY_COLUMN]}
