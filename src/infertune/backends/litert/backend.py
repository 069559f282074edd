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
from ...system.quiet import without_xnnpack_banner
from ..base import (
    Backend,
    RunFacts,
    Target,
)
from .convert import (
    Converted,
    convert_int8,
    converter_error,
    input_order,
    tensor_name,
)

__all__ = ["LiteRT", "LiteRTDynamicInt8", "LiteRTInt8", "litert_variants"]

_INSTALL = install_hint("litert")


class LiteRT(Backend):
    """ai-edge-litert's Interpreter on the TFLite conversion of the model.

    `threads` None uses every usable core; LiteRT's own default is one thread, which is
    1.3x faster for a tiny CNN and 1.8x slower for MobileNetV2 on two cores: a variant each.

    Two conversions: one with every input at the sample's exact shape, which runs calls at
    that shape, and one with a free batch dimension for every other batch size. At a fixed
    shape the converter folds shape arithmetic (Flatten's reshape) into constants, so XNNPACK
    takes the whole graph in one partition; on the small demo CNN the free batch leaves four
    ops between two XNNPACK partitions (benchmarks/by_hand.py converts the
    same way). A model whose fixed conversion fails runs every size on the free one, and so
    does one whose two conversions have the same operators (nothing folded: a second copy of
    the weights for nothing, 200 MB more for a model of 100 MB of weights).

    The fixed conversion is not even made where the free model reads no tensor's shape at
    run time (no SHAPE or RANK operator, no control flow whose subgraphs could): all it could
    fold is such shape arithmetic, every shape the free model uses is a constant already, so
    the fixed conversion would have the same operators and the rule above would drop it.
    That saves a whole conversion (6 s of MobileNetV2's tuning on two cores, 11 s of
    ResNet50's), decided from the free model's operator list alone. On ResNet50, MobileNetV2
    and the tests' dense and convolutional models both conversions were made and compared:
    the same operators each time (tests/test_litert.py checks it where this decides).

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
        _note_rewrites(target, self._converted)
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
        _note_rewrites(target, self._fixed)
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
            self._fixed_run = _Interpreters(self._fixed, threads, count, outputs, shapes)
            self._fixed_shapes = shapes
        else:
            self._free = _Interpreters(self._converted, threads, count, outputs)
        if self._fixed is not None and self._free is not None:
            shapes = target.signature.concrete_shapes()
            fixed = _Interpreters(self._fixed, threads, count, outputs, shapes)
            if _ops(fixed) == _ops(self._free):
                # The same graph either way (nothing to fold): it would gain nothing and hold
                # a second copy of the weights (twice the memory of a big model).
                fixed.close()
                self._fixed = None
            else:
                self._fixed_run, self._fixed_shapes = fixed, shapes
        self._fixed_shape0 = self._fixed_shapes[0] if self._fixed_shapes else None
        self._sample_shapes = target.signature.concrete_shapes()
        self._one_in_one_out = count == 1 and outputs == 1
        if self._one_in_one_out:
            self.run = self._run_one  # a tiny model's call is ~10 us: skip the loops

    @property
    def _interpreter(self):
        """The interpreter a single-threaded call at the sample's shapes gets, for reading
        its details: its public invoke() and allocate_tensors() raise, as the native calls
        hold its wrapper (see _Session)."""
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

    def _any_shape(self, shapes: list[tuple[int, ...]]) -> _Interpreters:
        """The free model's interpreters; an exact-shape backend has none (a ValueError)."""
        if self._free is None:
            raise ValueError(
                f"this LiteRT candidate runs only the input shapes {self.exact_shapes} "
                f"({self.exact_reason}); received shapes {shapes}"
            )
        return self._free

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
        for interpreters in (self._free, self._fixed_run):
            if interpreters is not None and interpreters.idle:
                del interpreters.idle[1:]

    def close(self) -> None:
        for interpreters in (self._free, self._fixed_run):
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


class _Interpreters:
    """The interpreters of one converted model: the idle ones, and the tensor indices (the
    model's, the same in each).

    An Interpreter runs one call at a time. A call takes an idle one from the list and puts
    it back; a call that finds none idle (the others busy in other threads) opens one more,
    which stays for later calls. A list's pop and append are atomic, so no lock is taken: one
    costs 0.15-0.3 us, 1-2% of a small CNN's call. Each interpreter holds XNNPACK's own packed
    copy of the weights, so memory grows with the number of calls ever run at once.
    """

    def __init__(
        self,
        converted: Converted,
        threads: int,
        inputs: int,
        outputs: int,
        shapes: list[tuple[int, ...]] | None = None,
    ):
        # The default op resolver (AUTO) applies XNNPACK, LiteRT's default CPU delegate, to
        # the float ops it supports; the rest run on the builtin kernels. (The partial holds
        # `converted`: a flatbuffer in a file of its own lives as long as these sessions.)
        self._open = partial(converted.interpreter, num_threads=threads)
        self._shapes = shapes  # fixed: allocated at these shapes, never resized
        first = self._session()
        self.inputs = input_order(first.interpreter.get_input_details(), inputs)
        self.outputs = _output_order(first.interpreter.get_output_details(), converted.output_names)
        if len(self.outputs) != outputs:
            raise RuntimeError(f"TFLite model has {len(self.outputs)} outputs, the model {outputs}")
        self.input0, self.output0 = self.inputs[0], self.outputs[0]
        self.idle = [first]

    def open_session(self) -> _Session:
        """One more interpreter of this model, for a call that finds none idle."""
        return self._session()

    def resize_session(self, session: _Session, shapes: list[tuple[int, ...]]) -> None:
        """Allocate `session`'s inputs at `shapes` (the free-batch model's)."""
        self._resize(session, shapes)

    def _session(self) -> _Session:
        if self._open is None:
            raise RuntimeError("this LiteRT backend is closed")
        session = without_xnnpack_banner(lambda: _Session(self._open()))
        if self._shapes is not None:
            session.shapes, session.shape0 = list(self._shapes), self._shapes[0]
        return session

    def run(self, inputs: list[np.ndarray], shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        idle = self.idle  # close() replaces it: the session goes back to this list
        try:
            session = idle.pop()
        except IndexError:  # every interpreter is busy in another thread
            session = self._session()
        except AttributeError:  # close() set it to None
            raise RuntimeError("this LiteRT backend is closed") from None
        try:
            if shapes != session.shapes:
                self._resize(session, shapes)
            set_tensor = session.set_tensor
            for index, array in zip(self.inputs, inputs):
                set_tensor(index, array)
            session.invoke()
            return [session.get_tensor(index) for index in self.outputs]  # copies
        finally:
            idle.append(session)

    def run_one(self, array: np.ndarray) -> list[np.ndarray]:
        """`run` for one input and one output."""
        idle = self.idle
        try:
            session = idle.pop()
        except IndexError:
            session = self._session()
        except AttributeError:
            raise RuntimeError("this LiteRT backend is closed") from None
        try:
            if array.shape != session.shape0:
                self._resize(session, [array.shape])
            session.set_tensor(self.input0, array)
            session.invoke()
            return [session.get_tensor(self.output0)]
        finally:
            idle.append(session)

    def single(self, shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
        """`run_one` for arrays of exactly `shape`, with no dispatch and no lists.

        A session this runner has run holds `shape` itself as its shape0, and the sessions of
        a model converted at `shape` hold the same object (`_session`), so one identity
        comparison finds the sessions that need no resizing; a session another call resized
        to some other batch size is resized back once."""
        if self._shapes is not None and shape == self._shapes[0]:
            shape = self._shapes[0]  # the very object its sessions hold
        idle, new_session, resize = self.idle, self._session, self._resize
        first_input, first_output, shapes = self.input0, self.output0, [shape]

        def run(array: np.ndarray) -> np.ndarray:
            try:
                session = idle.pop()
            except IndexError:
                session = new_session()
            try:
                if session.shape0 is not shape:
                    if session.shape0 != shape:
                        resize(session, shapes)
                    session.shapes, session.shape0 = shapes, shape
                session.set_tensor(first_input, array)
                session.invoke()
                return session.get_tensor(first_output)  # a copy
            finally:
                idle.append(session)

        return run

    def _resize(self, session: _Session, shapes: list[tuple[int, ...]]) -> None:
        """A new batch size: resize the inputs once; later calls at this shape reuse it."""
        for index, shape in zip(self.inputs, shapes):
            session.resize(index, shape)
        session.allocate()
        session.shapes = list(shapes)
        session.shape0 = session.shapes[0]

    def close(self) -> None:
        if self.idle is not None:
            self.idle.clear()  # single() runners share this list: they open no new one either
        self.idle = None  # a later call fails instead of opening a new interpreter
        self._open = None


class _Session:
    """One Interpreter, the calls that run it, and the input shapes its tensors are allocated
    for (none yet: the first call resizes from the converted batch of 1).

    The calls go to the interpreter's native wrapper (`Interpreter._interpreter`, the pybind
    object its public methods call) where it has them: the public set_tensor, invoke and
    get_tensor add five Python frames, invoke's among them a check that no numpy view of the
    interpreter's buffers (from `tensor()`) is alive. Nothing here takes such a view, and the
    native calls make a small CNN's call 1-3% faster (benchmarks/litert_calls.py). Holding
    the wrapper's methods is itself what that check counts as a view, so once they are held
    every call, resizing included, goes through them. A wrapper without them (another
    ai-edge-litert) gets the public methods.
    """

    __slots__ = (
        "allocate",
        "get_tensor",
        "interpreter",
        "invoke",
        "resize",
        "set_tensor",
        "shape0",
        "shapes",
    )

    def __init__(self, interpreter):
        interpreter.allocate_tensors()
        self.interpreter = interpreter
        self.shapes: list[tuple[int, ...]] = []
        self.shape0: tuple[int, ...] | None = None
        native = getattr(interpreter, "_interpreter", None)
        if all(hasattr(native, name) for name in _NATIVE_CALLS):
            self.set_tensor, self.invoke, self.get_tensor = (
                native.SetTensor,
                native.Invoke,
                native.GetTensor,
            )
            self.allocate = native.AllocateTensors
            self.resize = lambda index, shape: native.ResizeInputTensor(
                index, np.array(shape, dtype=np.int32), True
            )
        else:
            self.set_tensor, self.invoke, self.get_tensor = (
                interpreter.set_tensor,
                interpreter.invoke,
                interpreter.get_tensor,
            )
            self.allocate = interpreter.allocate_tensors
            self.resize = partial(interpreter.resize_tensor_input, strict=True)


_NATIVE_CALLS = ("SetTensor", "Invoke", "GetTensor", "ResizeInputTensor", "AllocateTensors")


class LiteRTInt8(LiteRT):
    """LiteRT on the model converted to full int8 (backends/litert/convert.py `convert_int8`:
    weights
    and activations int8, activation ranges calibrated on the user's calibration inputs,
    float32 inputs and outputs quantized and dequantized inside the model), one conversion
    with the sample's free dimensions. `keep`: layers left in float32 (the converter's deny
    list), a `variant` the pipeline makes where the gate rejects the default."""

    name = "litert-int8"
    conversions = ("tflite-int8",)
    precision = "int8"
    needs_calibration = True
    keeps_layers = True
    memory_factor = 1.0  # int8 weights: a quarter, and XNNPACK's packed copy
    rehearse_in_child = True
    conversion = "tflite-int8"  # the registry's key of its conversion

    def __init__(self, threads: int | None = None, keep: tuple[str, ...] = ()):
        super().__init__(threads)
        self.keep = tuple(keep)
        self._own: Converted | None = None
        self.precision_note = "full int8 (calibrated activations, float32 inputs and outputs)"
        if self.keep:
            self.precision_note += f"; kept in float32: {', '.join(self.keep)}"

    def variant(self, method: str | None = None, keep: tuple[str, ...] | None = None) -> Backend:
        return type(self)(self.threads, keep or ())

    def convert(self, target: Target) -> None:
        self._fixed = None
        self.exact_shapes, self.exact_reason = None, ""
        if self.keep and not target.loading:
            if target.source is None:
                raise RuntimeError("keeping TFLite layers in float32 needs the model (TensorFlow)")
            if self._own is None:
                self._own = convert_int8(target, target.calibration, self.keep)
            self._converted = self._own
        else:
            self._converted = shared(target, self.conversion)
        _note_rewrites(target, self._converted)

    def close(self) -> None:
        super().close()
        self._own = None

    def save_artifact(self, directory: Path) -> dict:
        return {**super().save_artifact(directory), "keep": list(self.keep)}

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        names = tuple(settings["output_names"])
        converted = Converted((directory / settings["file"]).read_bytes(), names)
        target.preload(cls.conversion, converted)
        backend = cls(settings["threads"], tuple(settings.get("keep", ())))
        backend.prepare(target)
        return backend


# Dynamic-range int8 is not tried beside full int8 on convolutional models of at least this
# arithmetic a call (LiteRTDynamicInt8.not_worth_trying). benchmarks/litert_dynamic_range.py,
# p50 at batch 1, dynamic-range over full int8, two runs: ResNet50 224 (7.8 GFLOP) 1.48x and
# 1.63x, MobileNetV2 224 (0.62) 2.84x and 3.14x, a MobileNetV2-style 64x64 classifier (0.015)
# 2.44x and 1.82x; faster on the digits CNN (0.011) 0.70x both times and a small transformer
# 0.28x and 0.41x. Below this the conversion takes a second.
LARGE_FLOPS = 100e6
_CONVOLUTIONS = ("Conv2D", "DepthwiseConv2dNative", "Conv3D", "Conv1D")
_BATCHED_PRODUCTS = ("BatchMatMulV2", "BatchMatMulV3", "BatchMatMul", "Einsum")


class LiteRTDynamicInt8(LiteRTInt8):
    """LiteRT on the model converted with dynamic-range int8: int8 weights, float32
    activations (the kernels quantize them per call); no calibration needed."""

    name = "litert-dynamic-int8"
    conversions = ("tflite-dynamic-int8",)
    needs_calibration = False
    keeps_layers = False
    rehearse_in_child = True
    conversion = "tflite-dynamic-int8"

    def __init__(self, threads: int | None = None, keep: tuple[str, ...] = ()):
        super().__init__(threads, keep)
        self.precision_note = "dynamic-range int8 (int8 weights, float32 activations)"

    def not_worth_trying(self, run: RunFacts) -> str | None:
        """Not tried beside full int8 on a convolutional model without attention of at least
        LARGE_FLOPS a call: its convolutions quantize their float32 inputs at every call,
        slower than full int8 on every such model measured, and its conversion takes seconds
        there (ResNet50 224: 8 s of an optimize() of 93)."""
        if LiteRTInt8.name not in run.candidates or not run.calibrated or run.flops is None:
            return None
        ops = run.op_types
        convolutional = any(ops.get(op) for op in _CONVOLUTIONS)
        attention = ops.get("Softmax") and any(ops.get(op) for op in _BATCHED_PRODUCTS)
        if run.flops < LARGE_FLOPS or not convolutional or attention:
            return None
        return (
            f"a convolutional model of {run.flops / 1e9:.2g} GFLOP a call: dynamic-range int8 "
            f"quantizes each convolution's float32 input at every call, slower than full int8 "
            f"({LiteRTInt8.name}, tried here) on every such model measured (ResNet50 224 "
            f"1.5-1.6x, MobileNetV2 224 2.8-3.1x: benchmarks/litert_dynamic_range.py)"
        )


def _note_rewrites(target: Target, converted: Converted) -> None:
    """The conversion's exact rewrites, in the report's notes once (every variant shares it)."""
    target.notes.extend(note for note in converted.rewrites if note not in target.notes)


def _ops(interpreters: _Interpreters) -> list[str] | None:
    """The operators of a converted model, delegate partitions included (the interpreter's
    execution plan: a private but stable listing); None if it cannot be read."""
    try:
        return [op["op_name"] for op in interpreters.idle[0].interpreter._get_ops_details()]
    except Exception:
        return None


def litert_variants() -> dict:
    """All usable cores, then 1, 2, 4, ... threads below that."""
    variants = {LiteRT.name: LiteRT}
    threads = 1
    while threads < usable_cores():
        variants[f"{LiteRT.name}:threads={threads}"] = partial(LiteRT, threads)
        threads *= 2
    return variants


def _output_order(details: list[dict], names: tuple[str, ...]) -> list[int]:
    """Tensor indices of the outputs named `names` (the traced function's, in its order)."""
    by_name = {tensor_name(detail["name"]): detail["index"] for detail in details}
    if sorted(by_name) != sorted(names) or len(details) != len(names):
        got = sorted(d["name"] for d in details)
        raise RuntimeError(f"TFLite outputs {got} are not the function's outputs {list(names)}")
    return [by_name[name] for name in names]
