"""`tf.function` around the model, traced once for any batch size (None batch dimension)."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from ..model.source import (
    tensor_specs,
    trace,
)
from .base import Backend, Target
from .triton_plan import TritonPlan, TritonTensor, model_names

__all__ = [
    "SAVEDMODEL_DIR",
    "TfFunction",
    "load_flat_savedmodel",
    "save_flat_savedmodel",
    "savedmodel_triton_plan",
    "tensorflow_missing",
]

SAVEDMODEL_DIR = "model.savedmodel"  # Triton's name for a SavedModel in a model version


class TfFunction(Backend):
    """The model as one TensorFlow graph: no per-op Python dispatch, no per-call retracing."""

    name = "tf-function"
    relative_cost = 1.5  # one trace, and its first call
    memory_factor = 0.0  # reads the model's own variables
    jit_compile = False
    runtime_packages = ("tensorflow",)
    triton_serves = True

    def available(self) -> str | None:
        return tensorflow_missing()

    def prepare(self, target: Target) -> None:
        import tensorflow as tf

        if self.jit_compile:
            self._fn = tf.function(
                target.source.graph_function(target.signature),
                input_signature=tensor_specs(target.signature),
                jit_compile=True,
            )
            trace(self._fn)  # now: tracing belongs to prepare_s; models.trace says why
        else:  # the very function the ONNX export and the TFLite conversion start from
            self._fn, _ = target.traced()
        self._owner = target.source.owner  # its variables are what the saved function reads

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [tensor.numpy() for tensor in self._fn(*inputs)]

    def close(self) -> None:
        self._fn = None
        self._owner = None

    def save_artifact(self, directory: Path) -> dict:
        """A SavedModel of the traced function (XLA's jit_compile attribute included)."""
        save_flat_savedmodel(self._fn, self._owner, directory / SAVEDMODEL_DIR)
        return {"dir": SAVEDMODEL_DIR}

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        backend = cls()
        backend._owner = load_flat_savedmodel(directory / settings["dir"])
        backend._fn = backend._owner.fn
        return backend

    @classmethod
    def triton_plan(
        cls, directory: Path, entry: dict, inputs: InputSignature, outputs: OutputSignature
    ) -> TritonPlan:
        """Triton's TensorFlow backend, on the saved function (with XLA where it was tuned)."""
        source = directory / entry["settings"]["dir"]

        def write(version_dir: Path) -> None:
            shutil.copytree(source, version_dir / SAVEDMODEL_DIR)

        plan = savedmodel_triton_plan(source, write, inputs, outputs)
        if cls.jit_compile:
            # Triton's TensorFlow backend maps graph level 1 to XLA's GlobalJitLevel ON_1.
            plan.graph_level = 1
            plan.carried.append("XLA (jit_compile in the saved function; graph level 1)")
        return plan


def tensorflow_missing() -> str | None:
    """Why a candidate that runs in TensorFlow cannot run here (a deploy environment that
    loads ONNX Runtime or LiteRT results without TensorFlow), or None."""
    if importlib.util.find_spec("tensorflow") is None:
        return "tensorflow is not installed (pip install tensorflow)"
    return None


def savedmodel_triton_plan(
    path: Path, write: Callable[[Path], None], inputs: InputSignature, outputs: OutputSignature
) -> TritonPlan:
    """Triton's TensorFlow backend ("tensorflow_savedmodel") for the SavedModel at `path`,
    its tensors read from the serving signature (what Triton serves)."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    _, kwargs = signature.structured_input_signature

    def tensors(specs: dict) -> list[TritonTensor]:
        return [
            TritonTensor(
                key,
                np.dtype(spec.dtype.as_numpy_dtype).name,
                tuple(-1 if d is None else int(d) for d in spec.shape.as_list()),
            )
            for key, spec in sorted(specs.items())
        ]

    triton_inputs, triton_outputs = tensors(kwargs), tensors(signature.structured_outputs)
    plan = TritonPlan(None, "tensorflow_savedmodel", triton_inputs, triton_outputs, write)
    plan.names = model_names(
        inputs,
        outputs,
        [f"in_{i}" for i in range(len(triton_inputs))],  # tensor_specs' names: the keys
        [f"output_{i}" for i in range(len(triton_outputs))],  # tf.saved_model's flat keys
    )
    plan.carried.append("instance_group KIND_CPU")
    plan.notes.append(
        "Triton serves it with its TensorFlow backend: check that your Triton release has one"
    )
    return plan


def save_flat_savedmodel(fn: Any, owner: Any, path: Path) -> None:
    """Save a flat-in/flat-out tf.function (with its input_signature) as a SavedModel.

    The function is kept as `fn` and as the serving_default signature (inputs in_0, in_1, ...;
    outputs output_0, output_1, ...: what TensorFlow Serving and Triton call). `owner` (the
    model) is tracked beside it so that every variable the function reads is saved.
    """
    import tensorflow as tf

    module = tf.Module()
    module.model = owner
    module.fn = fn
    tf.saved_model.save(
        module, str(path), signatures={"serving_default": fn.get_concrete_function()}
    )


def load_flat_savedmodel(path: Path) -> Any:
    """The object `save_flat_savedmodel` wrote; call its `fn` with flat inputs."""
    import tensorflow as tf

    return tf.saved_model.load(str(path))
