"""LiteRT (TensorFlow Lite) with XNNPACK: a lean interpreter with a low per-call floor.

The model is converted with TensorFlow's TFLite converter from the same flat tf.function
the other TensorFlow candidates use (float32, no quantization), and run by ai-edge-litert's
interpreter, whose default CPU delegate for float models is XNNPACK. Calls at the sample's
shapes run a conversion made at exactly those shapes; every other batch size runs one whose
batch dimension is -1: a new batch size resizes its input tensors once, and calls at an
unchanged shape do no resizing. A model that TFLite converts only at the sample's exact shapes
(a GRU's TensorList ops, a strided slice adding an axis over a free length) is an exact-shape
candidate (`Backend.exact_shapes`): it runs those shapes only, and the callable sends every
other call to the candidate chosen among those that run any shape.

TFLite numbers its tensors in its own order (two outputs may come back swapped), so inputs and
outputs are matched by name: inputs by the in_<i> names the TensorSpecs carry, outputs by the
names of the traced function's output tensors, recorded at conversion. A name that does not
match fails prepare() instead of guessing an order.

Each converted model runs on a pool of interpreters (backends/litert/pool.py); the int8
variants are backends/litert/int8.py's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...export.registry import shared
from ...system.environment import (
    install_hint,
    usable_cores,
)
from ..base import (
    Backend,
    Target,
)
from .convert import (
    Converted,
    converter_error,
)
from .pool import Interpreters, operators

__all__ = ["LiteRT", "litert_variants", "note_rewrites"]

_INSTALL = install_hint("litert")


class LiteRT(Backend):
    """ai-edge-litert's Interpreter on the TFLite conversion of the model.

    `threads` None uses every usable core; LiteRT's own default is one thread, which is
    1.3x faster for a tiny CNN and 1.8x slower for MobileNetV2 on two cores: a variant each.

    Two conversions: one with every input at the sample's exact shape, which runs calls at
    that shape, and one with a free batch dimension for every other batch size. At a fixed
    shape the converter folds shape arithmetic (Flatten's reshape) into constants, so XNNPACK
    takes the whole graph in one partition; on the small demo CNN the free batch leaves four
    ops between two XNNPACK partitions (benchmarks/harness.py `tflite_bytes` converts at the
    sample's shape too). A model whose fixed conversion fails runs every size on the free
    one, and so does one whose two conversions have the same operators (nothing folded: a
    second copy of the weights for nothing, 200 MB more for a model of 100 MB of weights).

    The fixed conversion is not even made where the free model reads no tensor's shape at
    run time (no SHAPE or RANK operator, no control flow whose subgraphs could): all it could
    fold is such shape arithmetic, every shape the free model uses is a constant already, so
    the fixed conversion would have the same operators and the rule above would drop it.
    That saves a whole conversion (6 s of MobileNetV2's tuning on two cores, 11 s of
    ResNet50's), decided from the free model's operator list alone. On ResNet50, MobileNetV2
    and the tests' dense and convolutional models both conversions were made and compared:
    the same operators each time (tests/backends/test_litert.py checks it where this decides).

    Nor is it made for a model past sizes.FIXED_TFLITE_MAX_BYTES (32 MB): the free conversion
    serves the sample's shapes, and a second one would double the conversion's time and
    memory for a saving that matters only on calls of microseconds.

    Where the conversion with free dimensions fails and the one at the sample's exact shapes
    succeeds, the backend runs that one alone: `exact_shapes` is the sample's shapes, and a
    call at any other shape raises (the pipeline never makes one).
    """

    name = "litert"
    conversions = ("tflite",)
    relative_cost = 0.5
    memory_factor = 2.0  # the flatbuffer, and XNNPACK's packed weights
    bucket_memory_factor = 1.0  # a bucket's interpreters pack the weights again
    requires = "litert"
    runtime_packages = ("ai-edge-litert",)
    rehearse_in_child = True
    triton_unsupported = (
        "Triton Inference Server has no official LiteRT/TFLite backend (its backends are "
        "ONNX Runtime, OpenVINO, TensorFlow, TensorRT, PyTorch and Python). Tune again among "
        "onnxruntime-cpu, openvino-cpu or tf-function (backends=[...] in Python, --backends on "
        "the command line) to get a result Triton can serve, or export it for Triton's Python "
        'backend (backend="python" in Python, --backend python on the command line), which '
        "runs it with infertune"
    )

    def __init__(self, threads: int | None = None):
        self.threads = self.threads_variant = threads
        self.name = type(self).name + (f":threads={threads}" if threads else "")
        if threads:  # the same flatbuffer on fewer threads: the default's rehearsal says
            self.rehearsal_twin = type(self).name
        self._bucket_pools: list[Interpreters] = []  # shaped_runner's, one per bucket

    def available(self) -> str | None:
        if importlib.util.find_spec("ai_edge_litert") is None:
            return f"ai-edge-litert is not installed; {_INSTALL}"
        return None

    def convert(self, target: Target) -> None:
        self._fixed: Converted | None = None
        self.exact_shapes, self.exact_reason = None, ""
        free_dimensions = any(None in spec.shape for spec in target.signature.specs)
        try:
            self._converted: Converted | None = shared(target, "tflite")
        except Exception as exc:
            if not free_dimensions:
                raise
            self._convert_exact_only(target, exc)
            return
        note_rewrites(target, self._converted)
        if not free_dimensions:
            return  # the model fixes every dimension: the first conversion is the fixed one
        try:  # None where it would fold nothing (backends/litert/convert.py)
            self._fixed = shared(target, "tflite-fixed")
        except Exception:  # the free-batch model runs the sample's shape too
            self._fixed = None

    def _convert_exact_only(self, target: Target, free_error: Exception) -> None:
        """The conversion with free dimensions failed: the one at the sample's exact shapes
        alone, or both failures if it fails too."""
        try:
            self._fixed = shared(target, "tflite-fixed")  # the only one that converts
        except Exception as exc:
            raise RuntimeError(
                f"{converter_error(free_error)} (with free dimensions; at the sample's exact "
                f"shapes: {converter_error(exc)})"
            ) from free_error
        self._converted = None
        note_rewrites(target, self._fixed)
        self.exact_shapes = target.signature.concrete_shapes()
        self.exact_reason = (
            f"its conversion with free dimensions failed: {converter_error(free_error)}"
        )

    def prepare(self, target: Target) -> None:
        self.convert(target)
        threads = self.threads or usable_cores()
        count, outputs = len(target.signature.specs), len(target.output_dtypes)
        self._free = None
        self._fixed_run = None
        self._fixed_shapes = None
        if self._converted is None:  # the sample's exact shapes only
            shapes = target.signature.concrete_shapes()
            self._fixed_run = Interpreters(self._fixed, threads, count, outputs, shapes)
            self._fixed_shapes = shapes
        else:
            self._free = Interpreters(self._converted, threads, count, outputs)
        if self._fixed is not None and self._free is not None:
            shapes = target.signature.concrete_shapes()
            fixed = Interpreters(self._fixed, threads, count, outputs, shapes)
            if operators(fixed) == operators(self._free):
                # The same graph either way (nothing to fold): it would gain nothing and hold
                # a second copy of the weights (twice the memory of a big model).
                fixed.close()
                self._fixed = None
            else:
                self._fixed_run, self._fixed_shapes = fixed, shapes
        self._fixed_shape0 = self._fixed_shapes[0] if self._fixed_shapes else None
        self._sample_shapes = target.signature.concrete_shapes()
        self._pool_settings = (threads, count, outputs)
        self._one_in_one_out = count == 1 and outputs == 1
        if self._one_in_one_out:
            self.run = self._run_one  # a tiny model's call is ~10 us: skip the loops

    @property
    def _interpreter(self):
        """The interpreter a single-threaded call at the sample's shapes gets, for reading
        its details: its public invoke() and allocate_tensors() raise, as the native calls
        hold its wrapper (see pool.Session)."""
        return (self._fixed_run or self._free).idle[-1].interpreter

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        shapes = [array.shape for array in inputs]
        if shapes == self._fixed_shapes:
            return self._fixed_run.run(inputs, shapes)
        return self._any_shape(shapes).run(inputs, shapes)

    def _run_one(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """`run` for one input and one output."""
        array = inputs[0]
        if array.shape == self._fixed_shape0:
            return self._fixed_run.run_one(array)
        return self._any_shape([array.shape]).run_one(array)

    def _any_shape(self, shapes: list[tuple[int, ...]]) -> Interpreters:
        """The free model's interpreters; an exact-shape backend has none (a ValueError)."""
        if self._free is None:
            raise ValueError(
                f"this LiteRT candidate runs only the input shapes {self.exact_shapes} "
                f"({self.exact_reason}); received shapes {shapes}"
            )
        return self._free

    def shaped_runner(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """Interpreters of the free model of their own, allocated at the first call's shapes
        and kept at them: a bucket's calls never resize the interpreters another bucket's
        use (a resize reallocates every tensor and XNNPACK's plan)."""
        if self._free is None:
            return self.run
        pool = Interpreters(self._converted, *self._pool_settings)
        self._bucket_pools.append(pool)
        return _BucketRun(pool, self._one_in_one_out, self._bucket_pools)

    def single_runner(self, shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray] | None:
        """One array of `shape` in, one out: the fixed-shape model's interpreters at the
        sample's shape, the free-batch model's at any other (none for an exact-shape one)."""
        if not self._one_in_one_out:
            return None
        if shape == self._fixed_shape0:
            return self._fixed_run.single(self._fixed_shape0)
        if self._free is None:
            return None
        return self._free.single(tuple(shape))

    def dict_runner(
        self, inputs: tuple[tuple[Any, np.dtype, frozenset], ...]
    ) -> Callable[[dict], list[np.ndarray] | None] | None:
        """A dict of arrays at the sample's shapes, set straight into an interpreter
        allocated at them (of the model converted at those shapes where there is one, else
        of the free-batch model, resized back to them where another call resized it): the
        interpreter's SetTensor refuses any other rank or dimension (a ValueError, caught:
        the call path then checks the dict and says what is wrong, or runs it at its shape),
        so the only checks here are each value's type and dtype (cast by the signature's
        rule where it casts, never by SetTensor's conversions). On a two-tower model of four
        inputs (3.4 us a call by hand) the signature's check and run() added 1.2 us a call."""
        interpreters = self._fixed_run or self._free
        plan = tuple(
            (key, index, dtype, casts)
            for (key, dtype, casts), index in zip(inputs, interpreters.inputs)
        )
        count, outputs, ndarray = len(plan), interpreters.outputs, np.ndarray
        shapes = list(self._sample_shapes)  # the object sessions at these shapes then hold
        key0, shape0, output0 = inputs[0][0], shapes[0], interpreters.output0
        one_output, resize = len(outputs) == 1, interpreters.resize_session

        def run(x: dict) -> list[np.ndarray] | None:
            first = x.get(key0)
            if len(x) != count or type(first) is not ndarray or first.shape != shape0:
                return None
            idle = interpreters.idle
            try:
                session = idle.pop()
            except IndexError:  # every interpreter is busy in another thread
                session = interpreters.open_session()
            except AttributeError:  # closed: run() says so
                return None
            try:
                if session.shapes is not shapes:
                    if session.shapes != shapes:  # resized by a call at another batch size
                        resize(session, shapes)
                    session.shapes = shapes
                set_tensor = session.set_tensor
                for key, index, dtype, casts in plan:
                    array = x.get(key)
                    if type(array) is not ndarray:
                        return None
                    if array.dtype is not dtype:
                        if array.dtype not in casts:
                            return None
                        array = array.astype(dtype)
                    try:
                        set_tensor(index, array)
                    except ValueError:  # another shape: the full check says which
                        return None
                session.invoke()
                if one_output:  # no comprehension: 0.1 us of a 4 us call
                    return [session.get_tensor(output0)]
                return [session.get_tensor(index) for index in outputs]  # copies
            finally:
                idle.append(session)

        return run

    def trim(self) -> None:
        for interpreters in (self._free, self._fixed_run, *self._bucket_pools):
            if interpreters is not None and interpreters.idle:
                del interpreters.idle[1:]

    def close(self) -> None:
        for interpreters in (self._free, self._fixed_run, *self._bucket_pools):
            if interpreters is not None:
                interpreters.close()
        self._converted = self._fixed = None

    def save_artifact(self, directory: Path) -> dict:
        """model.tflite (free batch) unless the backend runs the exact shapes only,
        model-fixed.tflite (the sample's shapes) if there is one, the thread count and the
        output names that map their tensors; for an exact-shape one, why it is one."""
        settings: dict = {"threads": self.threads}
        if self._converted is not None:
            self._converted.write(directory / "model.tflite")
            settings["file"] = "model.tflite"
        else:
            settings["exact_reason"] = self.exact_reason
        if self._fixed is not None:
            self._fixed.write(directory / "model-fixed.tflite")
            settings["fixed_file"] = "model-fixed.tflite"
        settings["output_names"] = list((self._converted or self._fixed).output_names)
        return settings

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        names = tuple(settings["output_names"])
        file = settings.get("file")  # absent for an exact-shape backend
        if file is not None:
            target.preload("tflite", Converted((directory / file).read_bytes(), names))
        else:
            target.preload_failure("tflite", "the saved result runs the sample's shapes only")
        fixed = settings.get("fixed_file")  # absent in results saved before it existed
        if fixed is not None:
            target.preload("tflite-fixed", Converted((directory / fixed).read_bytes(), names))
        else:
            target.preload_failure("tflite-fixed", "not saved")
        backend = cls(settings["threads"])
        backend.prepare(target)
        if file is None:
            backend.exact_reason = settings.get("exact_reason") or backend.exact_reason
        return backend


def note_rewrites(target: Target, converted: Converted) -> None:
    """The conversion's exact rewrites, in the report's notes once (every variant shares it)."""
    target.notes.extend(note for note in converted.rewrites if note not in target.notes)


def litert_variants() -> dict:
    """All usable cores, then 1, 2, 4, ... threads below that."""
    variants = {LiteRT.name: LiteRT}
    threads = 1
    while threads < usable_cores():
        variants[f"{LiteRT.name}:threads={threads}"] = partial(LiteRT, threads)
        threads *= 2
    return variants


class _BucketRun:
    """A bucket's run on interpreters of its own (LiteRT.shaped_runner); close() releases
    them (a plan that lost its timing gives its buckets' interpreters back)."""

    def __init__(self, pool: Interpreters, one_in_one_out: bool, pools: list[Interpreters]):
        self._pool, self._one, self._pools = pool, one_in_one_out, pools

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self._one:
            return self._pool.run_one(inputs[0])
        return self._pool.run(inputs, [array.shape for array in inputs])

    def close(self) -> None:
        self._pool.close()
        if self._pool in self._pools:
            self._pools.remove(self._pool)
