"""LiteRT's interpreter pool: the interpreters of one converted model, taken by a call and
put back, never shared by two calls at once (`Interpreters`), each holding the native calls
it runs and the shapes its inputs are allocated at (`Session`). The backend
(backends/litert/backend.py) keeps one pool per converted model it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from ...system.quiet import without_xnnpack_banner
from .convert import (
    Converted,
    input_order,
    tensor_name,
)

__all__ = ["Interpreters", "Session", "operators", "output_order"]


class Interpreters:
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
        self.outputs = output_order(first.interpreter.get_output_details(), converted.output_names)
        if len(self.outputs) != outputs:
            raise RuntimeError(f"TFLite model has {len(self.outputs)} outputs, the model {outputs}")
        self.input0, self.output0 = self.inputs[0], self.outputs[0]
        self.idle = [first]

    def open_session(self) -> Session:
        """One more interpreter of this model, for a call that finds none idle."""
        return self._session()

    def resize_session(self, session: Session, shapes: list[tuple[int, ...]]) -> None:
        """Allocate `session`'s inputs at `shapes` (the free-batch model's)."""
        self._resize(session, shapes)

    def _session(self) -> Session:
        if self._open is None:
            raise RuntimeError("this LiteRT backend is closed")
        session = without_xnnpack_banner(lambda: Session(self._open()))
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

    def _resize(self, session: Session, shapes: list[tuple[int, ...]]) -> None:
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


class Session:
    """One Interpreter, the calls that run it, and the input shapes its tensors are allocated
    for (none yet: the first call resizes from the converted batch of 1).

    The calls go to the interpreter's native wrapper (`Interpreter._interpreter`, the pybind
    object its public methods call) where it has them: the public set_tensor, invoke and
    get_tensor add five Python frames, invoke's among them a check that no numpy view of the
    interpreter's buffers (from `tensor()`) is alive. Nothing here takes such a view, and the
    native calls make a small CNN's call 1-3% faster (benchmarks/studies/litert_calls.py).
    Holding the wrapper's methods is itself what that check counts as a view, so once they
    are held every call, resizing included, goes through them. A wrapper without them (another
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


def output_order(details: list[dict], names: tuple[str, ...]) -> list[int]:
    """Tensor indices of the outputs named `names` (the traced function's, in its order)."""
    by_name = {tensor_name(detail["name"]): detail["index"] for detail in details}
    if sorted(by_name) != sorted(names) or len(details) != len(names):
        got = sorted(d["name"] for d in details)
        raise RuntimeError(f"TFLite outputs {got} are not the function's outputs {list(names)}")
    return [by_name[name] for name in names]


def operators(interpreters: Interpreters) -> list[str] | None:
    """The operators of a converted model, delegate partitions included (the interpreter's
    execution plan: a private but stable listing); None if it cannot be read."""
    try:
        return [op["op_name"] for op in interpreters.idle[0].interpreter._get_ops_details()]
    except Exception:
        return None
