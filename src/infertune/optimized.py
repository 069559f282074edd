"""The callable optimize() returns: the chosen backend behind the model's own call form."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .backends.base import Backend
from .inputs import InputSignature
from .report import Report
from .structure import Structure

if TYPE_CHECKING:
    from .triton import TritonExport

__all__ = ["Optimized"]


class Optimized:
    """A drop-in replacement for `model(x)`: same inputs, same output structure, numpy outputs.

    Inputs are checked against the signature the model was tuned for; a wrong rank, dtype
    or feature shape raises `infertune.InputError` (a ValueError) naming the input. Tuned
    at several batch sizes, each call goes to the candidate chosen for the smallest tuned
    batch size at or above the call's (the largest tuned one beyond them).

    Where a candidate that runs only the sample's exact input shapes was faster there than
    every candidate that runs any shape (LiteRT converted at the sample's shapes, when the
    conversion with free dimensions fails), calls at exactly those shapes go to it (`backend`)
    and every other call to the choice among the others (`general_backend`, by batch size:
    `backends_by_batch`).
    """

    def __init__(
        self,
        backend: Backend,
        signature: InputSignature,
        outputs: Structure,
        report: Report,
        *,
        output_dtypes: Sequence[np.dtype] = (),
        options: dict | None = None,
        saved_from: tuple[Path, dict] | None = None,
        by_batch: dict[int, Backend] | None = None,
        exact: Backend | None = None,
    ):
        """`backend`: the choice among the candidates that run any shape (at the sample's batch
        size); `by_batch`: the choice per tuned batch size; `exact`: the candidate that
        serves the calls at exactly the sample's input shapes, if not `backend`."""
        self._backend = backend
        self._by_batch = dict(sorted(by_batch.items())) if by_batch else None
        self._exact = exact
        self.input_signature = signature
        self.output_structure = outputs
        self.output_dtypes = [np.dtype(d) for d in output_dtypes]
        self.report = report
        self._options = options or {}  # optimize()'s tuning options, for save() and the cache
        self._saved_from = saved_from  # (directory, manifest) when restored by load()
        general = (
            _dispatching(self._by_batch, signature, outputs)
            if self._by_batch and len(self._general_backends()) > 1
            else _calling(backend, signature, outputs)
        )
        self._call = (
            general
            if exact is None
            else _exact_first(exact, general, self._general_runner(), signature, outputs)
        )

    def __call__(self, x: Any) -> Any:
        return self._call(x)

    @property
    def backend(self) -> str:
        """Name of the candidate that serves calls at the sample's input shapes, e.g.
        "onnxruntime-cpu": the chosen one, or the exact-shape fast path where there is one."""
        return (self._exact or self._backend).name

    @property
    def general_backend(self) -> str:
        """Name of the candidate chosen among those that run any input shape, at the sample's
        batch size: the one serving every call but the fast path's (`backend` where there is
        no fast path)."""
        return self._backend.name

    @property
    def backends_by_batch(self) -> dict[int, str]:
        """{tuned batch size: chosen candidate}; just the sample's batch size unless
        optimize() was given batch_sizes. These are the choices among the candidates that
        run any shape: calls at exactly the sample's shapes go to `backend`."""
        if self._by_batch is None:
            return {self.input_signature.sample_batch: self._backend.name}
        return {size: backend.name for size, backend in self._by_batch.items()}

    @property
    def backends(self) -> list[Backend]:
        """The distinct prepared backends this result runs: the general choice at the
        sample's batch size first, then those chosen at other batch sizes, then the
        exact-shape fast path if there is one."""
        found = self._general_backends()
        if self._exact is not None:
            found.append(self._exact)
        return found

    def _general_backends(self) -> list[Backend]:
        """The distinct backends chosen among those that run any shape, the sample's first."""
        found = [self._backend]
        for backend in (self._by_batch or {}).values():
            if all(backend is not b for b in found):
                found.append(backend)
        return found

    def _general_runner(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """run(flat inputs) of the general choice: by batch size where that differs."""
        if not self._by_batch or len(self._general_backends()) < 2:
            return self._backend.run
        return _batch_runner(self._by_batch)

    def save(self, path: str | os.PathLike) -> Path:
        """Write this result to the directory `path` (new or empty): the chosen candidate's
        artifact (model.onnx, model.tflite, model.savedmodel/ or model.keras) with its tuned
        settings, the report as JSON, and a manifest with every file's sha256, the input and
        output signature and the environment; the candidates chosen at other batch sizes and
        the exact-shape fast path each in a directory of their own. `infertune.load(path)`
        restores it without tuning or converting again. Raises ExportError for a candidate
        that cannot be saved."""
        from .saving import save

        return save(self, path)

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
        every shape: an exact-shape fast path is left out, said in the notes), with the tuned
        settings (threads, precision, performance hint) carried
        over where that backend has them; a candidate no Triton backend runs (LiteRT) raises
        ExportError saying why. `backend="python"`: Triton's Python backend, in which
        infertune runs the saved result (`model.py` beside a copy of it): any candidate.
        `max_batch_size` 0 leaves batching to the client (the batch dimension is -1 in dims);
        N > 0 lets Triton batch requests up to N (dynamic batching); None: 0, or 32 for the
        Python backend where the model's batch is free. See docs/deploy.md."""
        import tempfile

        from .triton import check_exportable, export_saved

        check_exportable(type(self._backend).name, self.general_backend, backend)
        if self._saved_from is not None:
            saved = self._saved_from[0]
            return export_saved(saved, repository, name, version, max_batch_size, backend)
        with tempfile.TemporaryDirectory(prefix="infertune-triton-") as tmp:
            saved = self.save(Path(tmp) / "saved")
            return export_saved(saved, repository, name, version, max_batch_size, backend)

    def close(self) -> None:
        """Release the runtime's resources; the object cannot be called afterwards."""
        for backend in self.backends:
            backend.close()

    def __repr__(self) -> str:
        general = "" if self._exact is None else f" other shapes={self.general_backend!r}"
        return (
            f"<Optimized backend={self.backend!r}{general} "
            f"inputs=[{self.input_signature.describe()}]>"
        )


def _calling(backend: Backend, signature: InputSignature, outputs: Structure) -> Callable:
    """The call path: check and flatten the input, run, rebuild the output structure.

    One array in and one out (most models) takes a path that checks the input in a few
    comparisons: on a 15-microsecond model, each 0.1 us here is 0.7%. An array of the shape
    it was tuned at needs one shape comparison (about 0.09 us less than checking the rank
    and the feature shape apart, as another batch size needs), and goes to the backend's
    `single_runner` for that shape where it has one: no lists, no dispatch on the shape.
    """
    run = backend.run
    flatten, pack = signature.flatten, outputs.packer()
    fast = signature.fast_check  # (dtype, feature shape) when one comparison suffices
    if outputs.kind == "leaf" and fast is not None:
        dtype, features = fast
        rank = len(features) + 1
        tuned = (signature.sample_batch, *features)
        ndarray = np.ndarray
        single = backend.single_runner(tuned) or (lambda array: run([array])[0])

        def call_one(x: Any) -> Any:
            if type(x) is ndarray and x.shape == tuned and x.dtype is dtype:
                return single(x)
            fits = type(x) is ndarray and x.dtype is dtype and x.ndim == rank
            if fits and x.shape[1:] == features:
                return run([x])[0]
            return run(flatten(x))[0]

        return call_one
    if outputs.kind == "leaf" and signature.free_check is not None:
        return _calling_free(run, flatten, *signature.free_check)
    return lambda x: pack(run(flatten(x)))


def _calling_free(
    run: Callable, flatten: Callable, dtype: np.dtype, rank: int, fixed: tuple
) -> Callable:
    """The call path of one array in and one out whose non-batch dimensions are partly free
    (an image of any size, a sequence of any length): its dtype, rank and fixed dimensions
    checked inline. Through signature.flatten, a free-size CNN's 160 us calls took 2.5 us
    more, measured interleaved (each layer of Python costs 2-3 times more right after a
    runtime's call has cooled the caches than in a loop alone: 0.9 us for the whole path
    there); anything that does not fit goes through signature.flatten as before."""
    ndarray = np.ndarray
    # The usual case, channels or features fixed and the rest free, without the generator of
    # the general check: 0.27 us a call against 0.76 us, in a loop, with a no-op run.
    if len(fixed) == 1:
        ((axis, size),) = fixed

        def call_one(x: Any) -> Any:
            if type(x) is ndarray and x.dtype is dtype and x.ndim == rank and x.shape[axis] == size:
                return run([x])[0]
            return run(flatten(x))[0]

        return call_one

    def call_any(x: Any) -> Any:
        fits = type(x) is ndarray and x.dtype is dtype and x.ndim == rank
        if fits and all(x.shape[axis] == size for axis, size in fixed):
            return run([x])[0]
        return run(flatten(x))[0]

    return call_any


def _dispatching(
    by_batch: dict[int, Backend], signature: InputSignature, outputs: Structure
) -> Callable:
    """The call path when candidates differ by batch size: the call's batch size picks the
    candidate from a list indexed by batch size (one index, no search). One array goes on
    through that candidate's own call path (`_calling`); other inputs are flattened once."""
    top, chosen = _per_batch(by_batch)
    paths = {id(b): _calling(b, signature, outputs) for b in by_batch.values()}
    path_at = [paths[id(b)] for b in chosen]  # batch size -> call path taking x
    run_flat = _batch_runner(by_batch)
    ndarray = np.ndarray
    single = signature.structure.kind == "leaf"
    flatten, pack = signature.flatten, outputs.packer()

    def call(x: Any) -> Any:
        if single and type(x) is ndarray and x.ndim:
            n = x.shape[0]
            return path_at[n if n <= top else top](x)
        return pack(run_flat(flatten(x)))

    return call


def _batch_runner(by_batch: dict[int, Backend]) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """run(flat inputs) by the inputs' batch size: the run of the candidate chosen for it."""
    top, chosen = _per_batch(by_batch)
    run_at = [backend.run for backend in chosen]  # batch size -> run taking flat arrays

    def run(flat: list[np.ndarray]) -> list[np.ndarray]:
        n = len(flat[0])
        return run_at[n if n <= top else top](flat)

    return run


def _per_batch(by_batch: dict[int, Backend]) -> tuple[int, list[Backend]]:
    """The largest tuned batch size, and the backend for each batch size up to it: that of
    the smallest tuned batch size at or above it."""
    sizes = sorted(by_batch)
    top = sizes[-1]
    return top, [by_batch[next(s for s in sizes if s >= n)] for n in range(top + 1)]


def _exact_first(
    exact: Backend,
    general: Callable[[Any], Any],
    general_run: Callable[[list[np.ndarray]], list[np.ndarray]],
    signature: InputSignature,
    outputs: Structure,
) -> Callable:
    """The call path with an exact-shape fast path: a call whose inputs have exactly the
    sample's shapes goes to `exact`, every other to the general call path (`general`, taking
    x; `general_run`, taking flat arrays, for inputs already flattened).

    One array in: an ndarray of the signature's dtype costs one shape comparison more than
    the general path (a tuple comparison, about 0.05 us) and, at the sample's shape, goes
    straight to `exact`'s single_runner where it has one. Anything else is flattened (and
    checked) once, and its shapes compared as a list."""
    shapes = [tuple(shape) for shape in signature.sample_shapes]
    flatten, pack = signature.flatten, outputs.packer()
    exact_run = exact.run
    if signature.structure.kind != "leaf":

        def call(x: Any) -> Any:
            flat = flatten(x)
            if [array.shape for array in flat] == shapes:
                return pack(exact_run(flat))
            return pack(general_run(flat))

        return call
    shape0, dtype, ndarray = shapes[0], signature.specs[0].dtype, np.ndarray
    if outputs.kind == "leaf":
        single = exact.single_runner(shape0) or (lambda array: exact_run([array])[0])
    else:
        single = lambda array: pack(exact_run([array]))  # noqa: E731

    def call_one(x: Any) -> Any:
        if type(x) is ndarray and x.dtype is dtype:
            if x.shape == shape0:
                return single(x)
            return general(x)
        array = flatten(x)[0]  # checked and cast: a tf.Tensor, a float64 array
        if array.shape == shape0:
            return single(array)
        return general(array)

    return call_one
