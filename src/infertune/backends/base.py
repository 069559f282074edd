"""What every candidate backend is: a way to prepare and run one model on one runtime.

A backend knows how to prepare and run the model, and nothing about selection. The
pipeline (pipeline/preparing.py) calls, in order: `available()` (cheap: no conversion, no
heavy import where avoidable), `prepare(target)` (convert, compile, build sessions), then
`run(inputs)` many times, then `close()` for candidates not chosen.

`run` takes and returns flat lists of numpy arrays on the host: returning host arrays is the
synchronization point that keeps asynchronous device work inside the timed call.

Saving (opt.save, the tuning cache) goes through two more methods: `save_artifact(directory)`
writes the files the prepared backend runs (an ONNX file, a SavedModel) and returns its
settings as JSON-able values; the classmethod `load_artifact(directory, settings, target)`
returns a prepared backend from them, without TensorFlow where the runtime does not need it.
The manifest stores the class's `name` (the part before any `:variant`), which picks the
class back from the registry (backends/registry.py `backend_class`). A backend that does not
write them cannot be saved, and says so.

Isolation (pipeline/isolation.py): a native runtime that segfaults or hangs while it compiles
or first runs the model must not take optimize() down. A backend that sets
`rehearse_in_child` splits prepare() in two: `convert(target)` builds, in this process, what
needs TensorFlow (the ONNX export, the TFLite conversion), after which `save_artifact` already
works; the pipeline then rebuilds the backend from those files with `load_artifact` in a
child process without TensorFlow and runs the verification inputs there first. Only when the
child survives does prepare() compile the same files here.

Triton: a backend whose artifact one of Triton's own backends serves sets `triton_serves`
(read from the class itself, like `rehearse_in_child`) and writes its `triton_plan`: the
Triton backend, the tensors, the version directory's files and the settings carried over
(backends/triton_plan.py). One that no Triton backend serves says why in `triton_unsupported`.

Exact shapes: a backend that can run only the sample's exact input shapes sets
`exact_shapes` (in convert() or prepare()). The pipeline then verifies and measures it at
those shapes only, and the callable sends it only calls of those shapes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from ..model.target import Target
from .triton_plan import TritonPlan

__all__ = ["Backend", "NotApplicable", "RunFacts", "Target"]


@dataclass(frozen=True)
class RunFacts:
    """What a candidate may weigh before any conversion (`Backend.not_worth_trying`): the
    other candidates of the run, whether calibration data was given, and the model's traced
    graph (its arithmetic per call at the sample's shapes, None where not countable; its op
    types, counted)."""

    candidates: frozenset[str] = frozenset()
    calibrated: bool = False
    flops: int | None = None
    op_types: Mapping[str, int] = field(default_factory=dict)


class NotApplicable(Exception):
    """Raised by convert() or prepare() while tuning where the candidate does not apply to
    this model or these options (an execution mode for parallel branches on a graph that has
    none): the candidate is `skipped`, with the exception's text as its reason. Never raised
    when a saved result is loaded (`target.source` is None): it loads as it was chosen."""


class Backend(ABC):
    """One candidate way of running the model. Subclass it and register it in backends/__init__.

    Set `name` (as users pass it in `backends=`), `precision` ("fp32", "fp16", "bf16",
    "int8") and `requires` (the pip extra that installs its runtime, if optional).
    """

    name: ClassVar[str]
    precision: ClassVar[str] = "fp32"
    precision_note: ClassVar[str] = ""  # how a reduced-precision candidate reduces it, in words
    requires: ClassVar[str | None] = None
    # Distribution names whose versions decide how a saved artifact loads and how fast it
    # runs: infertune.load() says when they differ from the versions it was saved with.
    runtime_packages: ClassVar[tuple[str, ...]] = ()
    # Seconds its runtime keeps cores busy after a call returns (threads spinning for more
    # work). The measurement waits that long before timing another candidate, which would
    # otherwise run on fewer cores than it has in production.
    cooldown_s: float = 0.0
    # Whether the compile and first run can be rehearsed in a child process (see above):
    # convert() then save_artifact() work before prepare(), and load_artifact() needs no
    # TensorFlow. Read from the class itself, never inherited: a subclass may build itself
    # differently from what its files carry, so it says so on its own.
    rehearse_in_child: ClassVar[bool] = False
    # For the order and the time budget (pipeline/planning.py): the shared conversions (Target keys)
    # its prepare() builds, counted once for every candidate that needs them, and what its
    # own conversion, compile and rehearsal cost, in units of one trace of the model (the
    # trace's time grows with the graph and the machine's speed as theirs do).
    conversions: ClassVar[tuple[str, ...]] = ()
    relative_cost: ClassVar[float] = 1.0
    # For admission by memory (pipeline/memory.py): the copies of the model's weights the
    # prepared candidate holds in this process (a session's initializers and their packed
    # form, an interpreter's flatbuffer and XNNPACK's packed weights), beyond the model
    # itself. Its shared conversions' transient copies are counted apart (export/registry.py).
    memory_factor: ClassVar[float] = 1.0
    # Copies of the weights it makes only while it compiles (XLA's buffers for a gather on an
    # embedding table), beyond memory_factor: counted while it is admitted, not after.
    compile_memory_factor: ClassVar[float] = 0.0
    # Copies of the weights each `shaped_runner()` holds beyond the backend's own (LiteRT's
    # interpreters pack the weights again; a CUDA-graph session holds them on the GPU): what
    # each bucket padded for it costs (pipeline/traffic_plan.py bounds the buckets by it).
    bucket_memory_factor: ClassVar[float] = 0.0
    # Whether run() takes only the lengths prepare() built for (a TensorRT engine's
    # optimization profile: the sample's, any batch size up to its bound) and each
    # shaped_runner() builds for the shapes of its first call: optimize(traffic=...) then
    # measures the traffic's lengths through shaped runners and serves them in padded
    # buckets only, never at each request's own length.
    builds_per_shape: ClassVar[bool] = False
    # Whether its first call at each new shape compiles (XLA): with optimize(traffic=...),
    # where only the fastest few are timed at the other batch sizes, it is verified at a
    # batch size other than the sample's only where it is timed there (pipeline/measuring.py),
    # and it serves the traffic's lengths in padded buckets only, never at each request's own.
    compiles_per_shape: ClassVar[bool] = False
    # Where the candidate differs from another of its class only in a session option that
    # seldom decides the choice (ONNX Runtime's spinning, optimization level, execution mode):
    # that option, in words. Such a variant is not tried where memory is tight
    # (pipeline/tournament.py): each one holds its own copy of the weights.
    session_variant: str | None = None
    # Where the candidate runs on fewer threads than the cores (`:threads=N`): for one caller
    # on a large model it is not tried either (pipeline/tournament.py): a call's work there is
    # large enough for every core (BERT-base-sized, 2 cores: 1 thread lost 1.8-2.1x).
    threads_variant: int | None = None
    # Where the candidate runs the very artifact of another, in the same runtime, differing
    # only in how many threads serve a call (`:threads=N`, `:nospin`): that candidate's name.
    # Its rehearsal in the child process answers for this one too (pipeline/preparing.py):
    # the same model compiled and run by the same runtime.
    rehearsal_twin: str | None = None
    # The input shapes this prepared backend can run, where it runs only those (known once
    # convert() or prepare() has run): the sample's, as LiteRT when TFLite converts the model
    # at the sample's exact shapes but not with its free dimensions. None: any shape the
    # model takes. Such a candidate is verified on the inputs of those shapes only and can
    # serve only calls of exactly those shapes (the callable's fast path, see
    # docs/how-it-works.md); `exact_reason` says why, in one line.
    exact_shapes: list[tuple[int, ...]] | None = None
    exact_reason: str = ""
    # Where the prepared candidate really runs, as its runtime reports it (ONNX Runtime's
    # session.get_providers()): a GPU candidate that fell back to the CPU shows it here.
    runs_on: str = ""
    # A variant worth trying only where several callers call at once (OpenVINO's THROUGHPUT
    # hint: streams one caller cannot fill): with optimize(concurrency=1) it is skipped.
    callers_only: bool = False
    # A quantizing candidate whose conversion calibrates on optimize(calibration=...): without
    # calibration data it is `skipped`, saying so.
    needs_calibration: ClassVar[bool] = False
    # Its calibration methods, the first its default: the pipeline tries the others where its
    # own (`method`) does not pass the gate (`variant(method=...)`); empty: one way only.
    calibration_methods: ClassVar[tuple[str, ...]] = ()
    method: str | None = None
    # Whether it can leave chosen layers in float32 (`variant(keep=...)`): where the gate
    # rejects it, the layers that lose most are kept, one group at a time.
    keeps_layers: ClassVar[bool] = False
    # Whether `triton_plan` serves this class's artifact in one of Triton's own backends.
    # Read from the class itself, never inherited (a GPU subclass of a CPU backend is not
    # served by the CPU plan): a subclass that the same plan serves says so on its own.
    triton_serves: ClassVar[bool] = False
    # Why no Triton backend serves it, and what to do instead (export_triton's refusal).
    triton_unsupported: ClassVar[str] = ""

    def available(self) -> str | None:
        """None if this backend can run here, else a one-line reason why not."""
        return None

    def tuning_unavailable(self) -> str | None:
        """None if this backend can be made here, else why not: what its conversion needs
        beyond what runs its saved artifact (NNCF, to quantize for OpenVINO). Asked while
        tuning only; a saved result loads where `available()` says it runs."""
        return None

    def not_worth_trying(self, run: RunFacts) -> str | None:
        """None, or why this candidate cannot pay on this machine or against the others of
        the run and is `skipped` (bf16 where the CPU has no bf16 units: emulated, slower than
        float32). Cheap: asked before any conversion."""
        return None

    def variant(self, method: str | None = None, keep: tuple[str, ...] | None = None) -> Backend:
        """A reduced-precision candidate quantized another way: with another calibration
        method (one of `calibration_methods`), or with the layers (name scopes) `keep` left
        in float32 (pipeline/precision.py). Only where `calibration_methods` or `keeps_layers`."""
        raise NotImplementedError(f"the {self.name} candidate has no variants")

    def convert(self, target: Target) -> None:
        """Build what prepare() needs from TensorFlow (exports, conversions), without loading it
        into the runtime. Backends that set `rehearse_in_child` implement it; prepare() calls
        it again (shared conversions are built once)."""

    @abstractmethod
    def prepare(self, target: Target) -> None:
        """Convert, compile and load the model; raise on failure (the pipeline reports it)."""

    @abstractmethod
    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run one batch: flat numpy inputs in signature order, flat numpy outputs on the host."""

    def rehearsed_part(self) -> Backend:
        """The backend the rehearsal child rebuilds and runs for this candidate, whose class
        decides whether there is a rehearsal (`rehearse_in_child`): itself, or for a split
        model's chain (backends/tf_head.py) its body's backend (the child has no TensorFlow
        for the head)."""
        return self

    def rehearsal(
        self, target: Target, inputs: list[list[np.ndarray]]
    ) -> tuple[Backend, Target, list[list[np.ndarray]]]:
        """After convert(): the `rehearsed_part()`, its target and the inputs it runs there
        (the verification inputs; a chain's body gets the head's outputs on them)."""
        return self, target, inputs

    def single_runner(self, shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray] | None:
        """Optional, for a model with one input and one output: a function that runs one input
        array of exactly `shape` (the tuned one) and returns the output array, with less
        per-call work than run(). None (the default): the call path uses run()."""
        return None

    def shaped_runner(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """A run of its own for calls that share their shapes (one bucket's, where
        optimize(traffic=...) pads requests into buckets): a runtime that prepares per shape
        (LiteRT's interpreters allocated at a shape, a CUDA graph captured at one) keeps that
        state apart for them, so that calls at another bucket's shapes do not undo it; where
        the runner holds such state it has a close() that releases it. The default: run()
        itself, for a runtime whose calls at any shape share everything."""
        return self.run

    def dict_runner(
        self, inputs: tuple[tuple[Any, np.dtype, frozenset], ...]
    ) -> Callable[[dict], list[np.ndarray] | None] | None:
        """Optional, for a model whose input is a flat dict (`inputs`: key, dtype and the
        dtypes the signature casts to it, per input in signature order): a function that
        runs a dict of numpy arrays with less per-call work than the signature's check and
        run(), leaving to the runtime the checks it makes itself (LiteRT's interpreter
        allocated at the sample's shapes refuses any other dimension; ONNX Runtime's session
        a wrong rank or fixed dimension), and returns the flat outputs; or None for any dict
        it does not run, or that the runtime refused (the call path then checks it in full,
        says what is wrong, or calls run()). It must accept only what the signature's check
        accepts, cast as it casts, and be safe to call from several threads as run() is.
        None (the default): the call path checks every dict."""
        return None

    def trim(self) -> None:
        """Drop what calls from several threads at once made beyond one call's needs (idle
        interpreters, infer requests): after optimize()'s check under several callers, a
        result for one caller keeps one."""

    def close(self) -> None:
        """Release what prepare() built (sessions, compiled functions)."""

    def save_artifact(self, directory: Path) -> dict:
        """Write the files this prepared backend runs into `directory` (which exists and is
        empty) and return the settings `load_artifact` needs, as JSON-able values. Nothing
        written may execute code when loaded (no pickle)."""
        raise NotImplementedError(f"the {self.name} candidate does not support saving yet")

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        """A prepared backend from the files `save_artifact` wrote and the settings it returned.

        `target` has the saved signature, output structure and dtypes and the objective, and
        no model (`target.source` is None): preload the conversions `prepare()` would build
        (`target.preload(key, value)`) and call `prepare(target)`, or set the backend up
        directly. Import TensorFlow only where the runtime itself needs it. The class must
        construct with no arguments (load() asks such an instance whether it is `available()`).
        """
        raise NotImplementedError(f"the {cls.name} candidate does not support loading yet")

    @classmethod
    def triton_plan(
        cls, directory: Path, entry: dict, inputs: InputSignature, outputs: OutputSignature
    ) -> TritonPlan:
        """How Triton serves the artifact `save_artifact` wrote into `directory`; `entry` is
        its manifest entry (name, precision, settings). Only where `triton_serves`."""
        raise NotImplementedError(f"no Triton backend is known for the {cls.name!r} candidate")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
