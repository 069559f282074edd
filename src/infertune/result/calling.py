"""The call paths of a choice, built once: what `opt(x)` and a served request run.

`call_path(choice)` takes the model's own input form (an array, a list, a dict) and returns
its output form; `flat_runner(choice)` takes flat arrays already checked (a served request)
and returns flat arrays; `warm_up(choice)` runs every path once before the first request.
Each adds as little as it can over calling the chosen runtime: the common forms are checked
in a few comparisons, and nothing is converted the runtime does not need.

Nothing here checks whether the result was closed: Optimized.close() swaps its call path for
one that raises, and each backend's close() cuts what its runners hold of the runtime, so a
path built here and kept past close() holds no session and fails instead of running.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends.base import Backend
from ..errors import one_line
from ..model.inputs import InputSignature
from ..model.structure import Structure
from ..model.traffic import shapes_at
from .choice import Choice

__all__ = ["call_path", "flat_runner", "warm_up"]


def call_path(choice: Choice) -> Callable[[Any], Any]:
    """opt(x): the input checked against the signature (InputError naming what is wrong),
    sent to the candidate the choice has for it, the output in the model's own form."""
    signature, outputs = choice.inputs, choice.outputs.structure
    if choice.buckets is not None:
        return _through_buckets(choice.buckets.run, signature, outputs)
    by_batch = choice.by_batch
    general = (
        _dispatching(by_batch, signature, outputs)
        if by_batch and len(choice.general_backends) > 1
        else _calling(choice.general, signature, outputs)
    )
    if choice.exact_shape is None:
        return general
    return _exact_first(choice.exact_shape, general, _general_run(choice), signature, outputs)


def flat_runner(choice: Choice) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """run(flat inputs, already checked) -> flat outputs, through the same choice: the
    exact-shape path for the sample's shapes, else the candidate for the batch size; the
    buckets, where the choice has them."""
    if choice.buckets is not None:
        return choice.buckets.run
    general = _general_run(choice)
    if choice.exact_shape is None:
        return general
    exact, shapes = choice.exact_shape.run, choice.exact_shapes

    def run(flat: list[np.ndarray]) -> list[np.ndarray]:
        if [array.shape for array in flat] == shapes:
            return exact(flat)
        return general(flat)

    return run


def warm_up(choice: Choice) -> str:
    """Every way a call can go, run once on inputs drawn like the sample, so that no request
    pays a runtime's first call: a session's allocations, a trace, an XLA compile, and with
    buckets each bucket's own state at its bound (LiteRT interpreters, CUDA graphs, a
    TensorRT engine, read from the engine cache or built here). What load(), a tuning-cache
    hit and a served model do before they answer; optimize()'s own result has run every path
    already. Returns the note the report keeps. A path whose call fails is named there and
    warned about (its requests may fail too); the result is returned all the same."""
    signature = choice.inputs
    rng = np.random.default_rng(0)
    sample = signature.random_inputs(rng)
    calls: list[tuple[str, Callable[[list[np.ndarray]], list[np.ndarray]], list]] = []
    buckets = choice.buckets
    if buckets is not None:
        for bucket in buckets.buckets:
            shapes = shapes_at(signature, [buckets.dim], None, [bucket.upper])
            x = signature.random_inputs(rng, shapes=shapes)
            calls.append((f"the bucket up to {bucket.upper}", buckets.run, x))
        label = "longer requests" if buckets.buckets else "the sample's shapes"
        calls.append((label, buckets.beyond.run, sample))
    else:
        calls.append(("the sample's shapes", flat_runner(choice), sample))
        if choice.exact_shape is not None:
            calls.append(("other shapes", _general_run(choice), sample))
        for size, backend in (choice.by_batch or {}).items():
            calls.append((f"batch {size}", backend.run, signature.random_inputs(rng, size)))
    start = time.perf_counter()
    failed = []
    for label, run, x in calls:
        try:
            run(x)
        except Exception as exc:
            failed.append(f"{label}: {one_line(exc)}")
    words = (
        f"warmed up before the first call: {len(calls)} call "
        f"{'path' if len(calls) == 1 else 'paths'} in {time.perf_counter() - start:.2f} s"
    )
    if failed:
        problem = f"the warm-up call failed for {'; '.join(failed)}"
        warnings.warn(f"{problem}: the first such request pays the runtime's first call, or "
                      f"fails as it did.", UserWarning, stacklevel=3)  # fmt: skip
        words += f" ({problem})"
    return words


def _through_buckets(
    run: Callable[[list[np.ndarray]], list[np.ndarray]],
    signature: InputSignature,
    outputs: Structure,
) -> Callable:
    """The call path through buckets (buckets.py `bucketed`, on flat inputs): one array in
    (its dtype, rank and fixed dimensions checked inline, as `_calling_free` does) or the
    input flattened and checked once; one output as it is, several packed."""
    flatten, pack = signature.flatten, outputs.packer()
    if signature.free_check is not None and outputs.kind == "leaf":
        return _calling_free(run, flatten, *signature.free_check)
    if outputs.kind == "leaf":
        return lambda x: run(flatten(x))[0]
    return lambda x: pack(run(flatten(x)))


def _general_run(choice: Choice) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """run(flat inputs) of the general choice: by batch size where that differs."""
    if not choice.by_batch or len(choice.general_backends) < 2:
        return choice.general.run
    return _batch_runner(choice.by_batch)


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
    if signature.dict_fast is not None:
        direct = backend.dict_runner(signature.dict_inputs)
        return _calling_dict(
            run, flatten, signature.dict_fast, pack, outputs.kind == "leaf", direct
        )
    return lambda x: pack(run(flatten(x)))


def _calling_dict(
    run: Callable,
    flatten: Callable,
    dict_fast: Callable,
    pack: Callable,
    one_output: bool,
    direct: Callable | None = None,
) -> Callable:
    """The call path of a flat dict of inputs (a recommender's ids and features): the
    signature's one-loop check of a dict of arrays, called here without going through
    `flatten` first; anything it does not take goes through `flatten`. The output dict is
    packed from the output keys kept once (`pack`), one output taken as it is. Where the
    backend runs a dict at the tuned shapes itself, checking them natively (`direct`, its
    `dict_runner`), a dict goes there first, and to the check only where it declines."""
    if direct is not None and one_output:

        def call_direct_one(x: Any) -> Any:
            if type(x) is dict:
                flat = direct(x)
                if flat is not None:
                    return flat[0]
                arrays = dict_fast(x)
                if arrays is not None:
                    return run(arrays)[0]
            return run(flatten(x))[0]

        return call_direct_one
    if direct is not None:

        def call_direct(x: Any) -> Any:
            if type(x) is dict:
                flat = direct(x)
                if flat is not None:
                    return pack(flat)
                arrays = dict_fast(x)
                if arrays is not None:
                    return pack(run(arrays))
            return pack(run(flatten(x)))

        return call_direct
    if one_output:

        def call_one(x: Any) -> Any:
            arrays = dict_fast(x) if type(x) is dict else None
            return run(flatten(x) if arrays is None else arrays)[0]

        return call_one

    def call(x: Any) -> Any:
        arrays = dict_fast(x) if type(x) is dict else None
        return pack(run(flatten(x) if arrays is None else arrays))

    return call


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
    direct = None
    if signature.dict_fast is not None:
        direct = exact.dict_runner(signature.dict_inputs)
    if signature.structure.kind != "leaf":

        def call(x: Any) -> Any:
            if direct is not None and type(x) is dict:
                out = direct(x)  # at exactly the sample's shapes, checked by the runtime
                if out is not None:
                    return pack(out)
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
