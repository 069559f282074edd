"""The user's model, loaded and wrapped so that every backend sees the same thing.

A `ModelSource` knows how to call the original model (the reference), what inputs it declares,
and gives a flat-in/flat-out graph function that tf.function, XLA and the ONNX export trace.
Loading happens here: a Keras 3 model (or tf_keras), a tf.Module or tf.function, a SavedModel
directory, or a .keras / .h5 file.

A Keras model is called in inference mode, `model(x, training=False)`: what `model.predict(x)`
and the `serve` endpoint of `model.export()` compute, and how a model is served. Called as
`model(x)`, a layer whose call defaults to `training=True` (Keras' RandomRotation, RandomZoom
and the other augmentation layers) is active: two calls differ, and no result could match
either (`inference_note` names such layers for the report).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    ModelError,
    one_line,
)
from ..system.paths import user_path
from ..system.quiet import import_tensorflow
from .inputs import (
    DeclaredInput,
    InputSignature,
    to_numpy,
)
from .structure import (
    Structure,
    flatten,
)

__all__ = [
    "ModelSource",
    "inference_call",
    "load_model",
    "tensor_specs",
    "trace",
    "training_layers",
]


class ModelSource:
    """A callable model with its declared inputs; `is_keras` says if it is a Keras model."""

    def __init__(
        self,
        call: Callable[[Any], Any],
        description: str,
        *,
        is_keras: bool,
        declared_inputs: Any | None = None,
        default_float: np.dtype | None = None,
        owner: Any | None = None,
        inference_note: str | None = None,
    ):
        self._call = call
        self.description = description
        self.is_keras = is_keras
        self.declared_inputs = declared_inputs
        self.default_float = default_float
        self.owner = owner  # the loaded object: its variables must outlive `call`
        # For a Keras model: the call reproduced (inference mode) and the layers whose
        # behaviour differs under model(x) with its default, for the report.
        self.inference_note = inference_note

    def __call__(self, structured_inputs: Any) -> Any:
        return self._call(structured_inputs)

    def call_flat(
        self, signature: InputSignature, flat_inputs: list[np.ndarray]
    ) -> tuple[list[np.ndarray], Structure]:
        """Call the original model on flat arrays; return flat numpy outputs and their structure."""
        outputs = self._call(signature.structure.pack(flat_inputs))
        leaves, structure = flatten(outputs)
        return [to_numpy(leaf) for leaf in leaves], structure

    def graph_function(self, signature: InputSignature) -> Callable[..., list]:
        """A Python function of flat tensors returning flat tensors, for tf.function to trace."""
        structure = signature.structure
        call = self._call

        def flat_model(*flat_inputs):
            leaves, _ = flatten(call(structure.pack(list(flat_inputs))))
            return leaves

        return flat_model


def load_model(model: Any) -> ModelSource:
    """Wrap what the user passed to optimize() as a ModelSource, or raise ModelError."""
    if isinstance(model, ModelSource):  # already loaded (the command line loads it first)
        return model
    import_tensorflow()  # where infertune imports it first: without its start-up lines
    if isinstance(model, str | os.PathLike):
        return _load_path(user_path(model))
    if _is_keras_model(model):
        return _from_keras(model)
    import tensorflow as tf

    if isinstance(model, tf.Module) or _is_tf_function(model):
        return _from_tf_callable(model, description=_describe(model))
    raise ModelError(
        "The model must be a keras.Model, a tf.Module or tf.function, or the path of a "
        f"SavedModel directory or a .keras file. Received: model={_short_repr(model)} of type "
        f"{type(model).__module__}.{type(model).__qualname__}."
    )


# -- Keras ---------------------------------------------------------------------------------
def _is_keras_model(model: Any) -> bool:
    """True for Keras 3 and tf_keras models, checked without importing either."""
    for cls in type(model).__mro__:
        if cls.__name__ == "Model" and cls.__module__.split(".")[0] in ("keras", "tf_keras"):
            return True
    return False


def _from_keras(model: Any) -> ModelSource:
    declared = _keras_declared_inputs(model)
    floatx = _keras_floatx(model)
    name = getattr(model, "name", "model")
    kind = type(model).__name__
    return ModelSource(
        inference_call(model),
        f"Keras model '{name}' ({kind})",
        is_keras=True,
        declared_inputs=declared,
        default_float=floatx,
        owner=model,
        inference_note=_inference_note(model),
    )


def inference_call(model: Any) -> Callable[[Any], Any]:
    """A Keras model's call in inference mode: model(x, training=False), what predict() and
    an exported model's `serve` compute."""

    def call(x: Any) -> Any:
        return model(x, training=False)

    return call


def _inference_note(model: Any) -> str:
    """What the reference is, and the layers whose call defaults to training=True (active
    under model(x), inactive in inference mode), by class and name."""
    note = "the reference is model(x, training=False): inference mode, as model.predict(x) and "
    note += "model.export()'s serve endpoint compute it"
    differ = training_layers(model)
    if differ:
        note += (
            f"; under model(x) with its default, these layers would be active (their call "
            f"defaults to training=True): {', '.join(differ)}"
        )
    return note


def training_layers(model: Any) -> list[str]:
    """'Class name' of each layer of `model` (nested) whose call defaults to training=True."""
    import inspect

    flatten_layers = getattr(model, "_flatten_layers", None)
    layers = list(flatten_layers(include_self=False, recursive=True)) if flatten_layers else []
    found = []
    for layer in layers:
        try:
            parameter = inspect.signature(type(layer).call).parameters.get("training")
        except (TypeError, ValueError):
            continue
        if parameter is not None and parameter.default is True:
            found.append(f"{type(layer).__name__} '{layer.name}'")
    return found


def _keras_declared_inputs(model: Any) -> Any | None:
    """The structure of `model.input` as DeclaredInput leaves; None for subclassed models."""
    try:
        symbolic = model.input
    except (AttributeError, ValueError):
        # A Sequential model loaded from a file has `inputs` but "was never called".
        symbolic = getattr(model, "inputs", None)
        if not symbolic:
            return None
        symbolic = symbolic[0] if len(symbolic) == 1 else list(symbolic)
    leaves, structure = flatten(symbolic)
    declared = []
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is None:
            return None
        shape = tuple(None if d is None else int(d) for d in shape)
        declared.append(DeclaredInput(shape, _np_dtype(dtype), getattr(leaf, "name", None)))
    return structure.pack(declared)


def _keras_floatx(model: Any) -> np.dtype:
    module = type(model).__module__.split(".")[0]
    try:
        if module == "tf_keras":
            import tf_keras as keras_module
        else:
            import keras as keras_module
        return np.dtype(keras_module.backend.floatx())
    except (ImportError, AttributeError, TypeError):
        return np.dtype("float32")


# -- TensorFlow callables ------------------------------------------------------------------
def _is_tf_function(obj: Any) -> bool:
    return callable(obj) and hasattr(obj, "get_concrete_function")


def _from_tf_callable(obj: Any, description: str) -> ModelSource:
    import tensorflow as tf

    if _is_tf_function(obj):
        fn = obj
    elif isinstance(obj, tf.Module) and callable(getattr(obj, "__call__", None)):  # noqa: B004
        fn = obj.__call__
        if not _is_tf_function(fn):
            # A plain __call__ still works eagerly; its inputs come from the sample alone.
            return ModelSource(obj, description, is_keras=False, owner=obj)
    else:
        raise ModelError(
            f"{description} has no __call__ to run. Pass the tf.function to optimize, "
            f"for example optimize(module.serve, x)."
        )
    declared = _declared_from_fn(fn)
    return ModelSource(fn, description, is_keras=False, declared_inputs=declared, owner=obj)


def _declared_from_fn(fn: Any) -> Any | None:
    """The input signature of a tf.function (given, or of its single traced function)."""
    signature = getattr(fn, "input_signature", None)
    if signature is None:
        concrete = getattr(fn, "concrete_functions", None)  # functions restored from SavedModel
        traced = {repr(c.structured_input_signature) for c in concrete or ()}
        if len(traced) == 1:  # several traced signatures: the sample decides, not one of them
            args, kwargs = concrete[0].structured_input_signature
            signature = args if not kwargs else None
    if not signature or len(signature) != 1:
        return None
    leaves, structure = flatten(signature[0])
    declared = []
    for spec in leaves:
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank is None:
            return None
        dims = tuple(None if d is None else int(d) for d in shape.as_list())
        declared.append(DeclaredInput(dims, _np_dtype(spec.dtype), getattr(spec, "name", None)))
    return structure.pack(declared)


def _np_dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    if dtype == "string":  # a Keras input's dtype name for tf.string
        return np.dtype(object)
    as_numpy = getattr(dtype, "as_numpy_dtype", None)  # tf.DType
    try:
        return np.dtype(as_numpy if as_numpy is not None else dtype)
    except TypeError:
        return None


# -- paths ---------------------------------------------------------------------------------
def _load_path(path: Path) -> ModelSource:
    if not path.exists():
        raise ModelError(f"No model at '{path}': the path does not exist.")
    if path.is_dir():
        if not (path / "saved_model.pb").exists():
            raise ModelError(
                f"'{path}' is a directory without saved_model.pb; infertune loads SavedModel "
                f"directories and .keras/.h5 files."
            )
        return _load_saved_model(path)
    if path.suffix in (".keras", ".h5", ".hdf5"):
        import keras

        try:
            model = keras.models.load_model(path, compile=False)
        except Exception as exc:  # a corrupt or foreign file: say which and why
            raise ModelError(f"Keras could not load '{path}': {one_line(exc)}") from exc
        return _from_keras(model)
    raise ModelError(
        f"'{path}' is a {path.suffix or 'file without extension'}; infertune loads SavedModel "
        f"directories and .keras/.h5 files."
    )


def _load_saved_model(path: Path) -> ModelSource:
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise ModelError(
            f"TensorFlow could not load the SavedModel '{path}': {one_line(exc)}"
        ) from exc
    description = f"SavedModel '{path}'"
    # Keras' model.export() writes `serve`; a saved tf.Module keeps its traced `__call__`.
    for attr in ("serve", "__call__"):
        fn = getattr(loaded, attr, None)
        if fn is not None and getattr(fn, "concrete_functions", None):
            return ModelSource(
                fn,
                description,
                is_keras=False,
                declared_inputs=_declared_from_fn(fn),
                owner=loaded,
            )
    signatures = getattr(loaded, "signatures", {})
    if "serving_default" in signatures:
        return _from_serving_signature(signatures["serving_default"], description, loaded)
    raise ModelError(
        f"{description} has no `serve` or `__call__` function and no serving_default signature."
    )


def _from_serving_signature(fn: Any, description: str, loaded: Any) -> ModelSource:
    """A signature function takes keyword tensors and returns a dict of outputs."""
    _, kwargs = fn.structured_input_signature
    names = sorted(kwargs)
    declared = {
        name: DeclaredInput(
            tuple(None if d is None else int(d) for d in kwargs[name].shape.as_list()),
            _np_dtype(kwargs[name].dtype),
            name,
        )
        for name in names
    }

    if len(names) == 1:
        only = names[0]

        def call(x):
            return fn(**(x if isinstance(x, dict) else {only: x}))

        declared_inputs: Any = declared[only]
    else:

        def call(x):
            return fn(**x)

        declared_inputs = declared
    return ModelSource(
        call,
        f"{description} (serving_default)",
        is_keras=False,
        declared_inputs=declared_inputs,
        owner=loaded,
    )


def _describe(model: Any) -> str:
    name = getattr(model, "name", None) or getattr(model, "__name__", None)
    kind = type(model).__name__
    return f"{kind} '{name}'" if name else kind


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def tensor_specs(signature: InputSignature) -> list:
    """tf.TensorSpec for each flat input, named in_0, in_1, ... (the ONNX input names too)."""
    import tensorflow as tf

    return [
        tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype), name=f"in_{i}")
        for i, spec in enumerate(signature.specs)
    ]


def trace(function: Any) -> Any:
    """`function.get_concrete_function()` (a tf.function with its input signature), with the
    stack trace of every op in its graph, and in the graphs it calls, worked out now, in this
    thread, before another thread can run or convert it.

    TensorFlow (2.21) works out an op's stack trace on first use, under a lock of the trace's
    own and then Python's: XLA's compile asks without holding Python's lock, the TFLite
    converter (its debug info) while holding it, so the two on one op at once deadlock. They
    meet on a tf.function model, whose graph every trace calls: XLA compiling in the
    background thread while the TFLite conversion of the traced model read the same ops hung
    optimize() (a CI run; a loop of optimize() with tf-xla and litert, at its 7th). Worked
    out, a trace is kept, and neither lock is taken in turn again (ResNet50's 1831 ops: 75 ms,
    which the TFLite converter then does not spend)."""
    concrete = function.get_concrete_function()
    graphs, seen = [concrete.graph], set()
    while graphs:
        graph = graphs.pop()
        if id(graph) in seen:
            continue
        seen.add(id(graph))
        for op in graph.get_operations():
            stack = op.traceback
            if stack is not None:
                len(stack)  # computes the trace and keeps it
        for called in getattr(graph, "_functions", {}).values():  # private: the called graphs
            if getattr(called, "graph", None) is not None:
                graphs.append(called.graph)
    return concrete
