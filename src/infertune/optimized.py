"""The callable optimize() and load() return: a choice behind the model's own call form, with
its report, and the ways to keep it (save, the Triton export)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .backends.base import Backend
from .deploy.triton import TritonExport, check_exportable, export_saved
from .errors import ClosedError, closed_call
from .model.inputs import InputSignature
from .model.outputs import OutputSignature
from .model.structure import Structure
from .report import Report
from .result import saved
from .result.calling import call_path
from .result.choice import Choice
from .system.paths import user_path

__all__ = ["Optimized"]

_CLOSED = (
    "This Optimized was closed (opt.close() or the end of its `with` block): its runtimes are "
    "released. Call infertune.optimize(...) or infertune.load(...) again for a new one."
)


class Optimized:
    """A drop-in replacement for `model(x)`: same inputs, same output structure, numpy outputs.

    Inputs are checked against the signature the model was tuned for; a wrong rank, dtype
    or feature shape raises `infertune.InputError` (a ValueError) naming the input. Tuned
    at several batch sizes, each call goes to the candidate chosen for the smallest tuned
    batch size at or above the call's (the largest tuned one beyond them).

    Where a candidate that runs only the sample's exact input shapes was faster there than
    every candidate that runs any shape (LiteRT converted at the sample's shapes, when the
    conversion with free dimensions fails), calls at exactly those shapes take that
    exact-shape path (`backend`) and every other call goes to the choice among the others
    (`general_backend`, by batch size: `backends_by_batch`).

    It holds native runtime sessions until `close()` (or the end of a `with` block) releases
    them; a closed one raises `infertune.ClosedError` when called, saved or exported.
    """

    def __init__(
        self,
        choice: Choice,
        report: Report,
        options: dict,
        saved_from: saved.Saved | None = None,
    ):
        """`options`: optimize()'s saved options (Options.saved()); `saved_from`: the saved
        result this one was loaded from, whose files save() copies."""
        self._choice = choice
        self.report = report
        self._options = options
        self._saved_from = saved_from
        self._call = call_path(choice)
        self._closed = False

    def __call__(self, x: Any) -> Any:
        return self._call(x)  # close() replaces it: no check of its own on each call

    def __enter__(self) -> Optimized:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def input_signature(self) -> InputSignature:
        return self._choice.inputs

    @property
    def output_signature(self) -> OutputSignature:
        """The flat outputs' names, dtypes and shapes (None where they change)."""
        return self._choice.outputs

    @property
    def output_structure(self) -> Structure:
        return self._choice.outputs.structure

    @property
    def output_dtypes(self) -> list[np.dtype]:
        return self._choice.outputs.dtypes

    @property
    def backend(self) -> str:
        """Name of the selected candidate (the report's `selected`), e.g. "onnxruntime-cpu":
        the one that serves calls at the sample's input shapes (the exact-shape path where
        there is one)."""
        return self._choice.selected.name

    @property
    def general_backend(self) -> str:
        """Name of the candidate chosen among those that run any input shape, at the sample's
        batch size: the one serving every call but the exact-shape path's (`backend` where
        there is no exact-shape path)."""
        return self._choice.general.name

    @property
    def backends_by_batch(self) -> dict[int, str]:
        """{tuned batch size: chosen candidate}; just the sample's batch size unless
        optimize() was given batch_sizes. These are the choices among the candidates that
        run any shape: calls at exactly the sample's shapes go to `backend`."""
        return self._choice.backends_by_batch

    @property
    def backends(self) -> list[Backend]:
        """The distinct prepared backends this result runs: the general choice at the
        sample's batch size first, then those chosen at other batch sizes, then the
        exact-shape path if there is one."""
        return self._choice.backends

    def save(self, path: str | os.PathLike) -> Path:
        """Write this result to the directory `path` (new or empty; `~` is expanded): the
        chosen candidate's artifact (model.onnx, model.tflite, model.savedmodel/ or
        model.keras) with its tuned settings, the report as JSON, and a manifest with every
        file's sha256, the input and output signatures and the environment; the candidates
        chosen at other batch sizes and the exact-shape path each in a directory of their
        own. `infertune.load(path)` restores it without tuning or converting again. Raises
        ExportError for a candidate that cannot be saved."""
        self._check_open()
        return saved.save(
            self._choice, self.report, self._options, user_path(path), copy_of=self._saved_from
        )

    def export_triton(
        self,
        repository: str | os.PathLike,
        name: str,
        *,
        version: int = 1,
        max_batch_size: int | None = None,
        backend: str | None = None,
    ) -> TritonExport:
        """Write this result into a Triton Inference Server model repository:
        `repository/name/config.pbtxt` and `repository/name/<version>/model.*`.

        `backend` None: the candidate's own Triton backend (ONNX Runtime, OpenVINO,
        TensorFlow) for `general_backend` (a Triton model runs one artifact, which must take
        every shape: an exact-shape path is left out, said in the notes), with the tuned
        settings (threads, precision, performance hint) carried over where that backend has
        them; a candidate no Triton backend runs (LiteRT) raises ExportError saying why.
        `backend="python"`: Triton's Python backend, in which infertune runs the saved result
        (`model.py` beside a copy of it): any candidate. `max_batch_size` 0 leaves batching
        to the client (the batch dimension is -1 in dims); N > 0 lets Triton batch requests
        up to N (dynamic batching); None: 0, or 32 for the Python backend where the model's
        batch is free. See docs/deploy.md."""
        self._check_open()
        check_exportable(type(self._choice.general), self.general_backend, backend)
        repository = user_path(repository)
        if self._saved_from is not None:
            path = self._saved_from.path
            return export_saved(path, repository, name, version, max_batch_size, backend)
        with tempfile.TemporaryDirectory(prefix="infertune-triton-") as tmp:
            path = self.save(Path(tmp) / "saved")
            return export_saved(path, repository, name, version, max_batch_size, backend)

    def close(self) -> None:
        """Release every runtime this result holds (the sessions, interpreters and compiled
        models of each candidate it runs: every batch size's and the exact-shape path's).
        Calling, saving or exporting it afterwards raises ClosedError; the report and the
        signatures stay. Closing again does nothing; the end of a `with` block closes it."""
        if self._closed:
            return
        self._closed = True
        # The call path first: it is what holds the runtimes' calls (and, through them, the
        # native sessions) besides the backends themselves.
        self._call = closed_call(_CLOSED)
        self._choice.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(_CLOSED)

    def __repr__(self) -> str:
        general = "" if self._choice.exact_shape is None else f" general={self.general_backend!r}"
        closed = " closed" if self._closed else ""
        return (
            f"<Optimized backend={self.backend!r}{general} "
            f"inputs=[{self.input_signature.describe()}]{closed}>"
        )
