"""The prepared problem every backend receives: the model, its input signature and outputs,
and the conversions shared between candidates (conversions.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .conversions import SharedConversions
from .inputs import InputSignature
from .sizes import ModelSize
from .source import ModelSource
from .structure import Structure

__all__ = ["Target"]


@dataclass
class Target:
    """Everything a backend may use to prepare the model, the same for every candidate.

    `source` is None when a saved result is loaded (infertune.load): the conversions the
    backend needs are then preloaded from the saved files (`preload`), so `prepare()` finds
    them built and never reaches for the model.
    """

    source: ModelSource | None
    signature: InputSignature
    output_structure: Structure
    output_dtypes: list[np.dtype]
    objective: str = "latency"  # what optimize() tunes for: backends may set hints from it
    concurrency: int = 1  # callers calling at once: backends may size their pools from it
    # optimize(calibration=...) as flat input batches: what quantizing conversions calibrate
    # activation ranges on (None: none given; static int8 is then skipped).
    calibration: list[list[np.ndarray]] | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list, repr=False)  # for the report
    _traced: tuple[Any, Any] | None = field(default=None, repr=False)
    _weights: int | None = field(default=None, repr=False)
    # Tuning from a package (pipeline/packaging.py): no model, its conversions preloaded,
    # and tuning all the same (a saved result being loaded is the other case of no model).
    from_package: bool = field(default=False, repr=False)
    # Why memory is tight for this model here (pipeline/tournament.py: the verified
    # candidates that copy its weights would pass INFERTUNE_HOLD_ALL_BYTES together), None
    # where it is not: the pipeline then holds few copies of the weights at once.
    memory_tight: str | None = field(default=None, repr=False)
    # The conversions built for this model, each once, shared by every candidate that asks.
    conversions: SharedConversions = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.conversions = SharedConversions(self._watched, self.notes)

    def traced(self) -> tuple[Any, Any]:
        """The model as one tf.function of its flat inputs, batch free, and its concrete
        function: traced once (ResNet50: 0.9-1.2 s) for the tf-function candidate (which runs
        it), the ONNX export and the TFLite conversion (which start from it); the time counts
        in whichever needed it first. `release_traced()` drops this reference once the
        conversions are made (a tf-function candidate keeps its own)."""
        if self._traced is None:
            import tensorflow as tf

            from .source import (
                tensor_specs,
                trace,
            )

            specs = tensor_specs(self.signature)
            function = tf.function(
                self.source.graph_function(self.signature), input_signature=specs
            )
            self._traced = (function, trace(function))
        return self._traced

    def run_traced(self, flat_inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The traced model's outputs on flat arrays: what the tf-function candidate computes,
        the reference with optimize(reference="traced")."""
        function, _ = self.traced()
        return [tensor.numpy() for tensor in function(*flat_inputs)]

    def release_traced(self) -> None:
        self._traced = None

    @property
    def weights_measured(self) -> int | None:
        """weights_bytes() where something measured it already, else None."""
        return self._weights

    def calibration_feeds(self, names: list[str], limit: int) -> list[dict[str, np.ndarray]]:
        """The calibration inputs one sample at a time, as dicts by the given input names (a
        runtime's), at most `limit` samples (the first ones): what the quantizers take."""
        feeds: list[dict[str, np.ndarray]] = []
        for batch in self.calibration or []:
            for i in range(len(batch[0]) if batch[0].ndim else 1):
                feeds.append({n: a[i : i + 1] for n, a in zip(names, batch)})
                if len(feeds) >= limit:
                    return feeds
        return feeds

    @property
    def loading(self) -> bool:
        """Whether a saved result is being loaded (infertune.load): no model, and nothing to
        decide (a candidate loads as it was chosen)."""
        return self.source is None and not self.from_package

    def assume_weights(self, weights: int) -> None:
        """The weights' bytes as measured where the model was (a package's)."""
        self._weights = int(weights)

    def _watched(self) -> bool:
        """Whether the conversions' memory is watched: the weights measured already (a
        conversion measures them first, through the trace) and past the threshold."""
        return self._weights is not None and ModelSize(self._weights).watched

    def size(self) -> ModelSize:
        """The model's size (its weights' bytes) and what follows from it (model/sizes.py)."""
        return ModelSize(self.weights_bytes())

    def weights_bytes(self) -> int:
        """Bytes of the variables the traced function captures (what freezing makes
        constants, what every conversion copies); measured once."""
        if self._weights is None:
            _, concrete = self.traced()
            self._weights = sum(
                (v.shape.num_elements() or 0) * v.dtype.size for v in concrete.graph.variables
            )
        return self._weights

    def shared(self, key: str, build: Callable[[], Any]) -> Any:
        """Build a conversion once and share it (or its failure) between backends
        (conversions.py)."""
        return self.conversions.shared(key, build)

    def preload(self, key: str, value: Any) -> None:
        """Provide a conversion already built (read from a saved artifact) under `key`."""
        self.conversions.preload(key, value)

    def preload_failure(self, key: str, why: str) -> None:
        """Record that the conversion under `key` is not to be built (a saved result without
        it): `shared(key, ...)` raises instead of building it."""
        self.conversions.preload_failure(key, why)
