"""The model's inputs as the command line gives them: read from an .npz (--sample,
--calibration), or drawn at random from --input NAME=DIMS:DTYPE and the model's declared
inputs, so that a model can be tuned without writing any Python."""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..system.paths import user_path

__all__ = ["calibration_inputs", "sample_inputs", "traffic_shapes"]

_DTYPES = ("float32", "float16", "float64", "int32", "int64", "uint8", "int8", "bool")


class _UsageError(Exception):
    pass


def _parse_input(text: str) -> tuple[str | None, tuple[int, ...], str]:
    name, _, rest = text.rpartition("=")
    dims, _, dtype = rest.partition(":")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x") if d)
    except ValueError:
        raise _UsageError(f"--input {text!r}: dimensions must be integers like 1x28x28x1") from None
    dtype = dtype or "float32"
    if dtype not in _DTYPES:
        raise _UsageError(f"--input {text!r}: dtype must be one of {', '.join(_DTYPES)}")
    return name or None, shape, dtype


def _arrays(path: str, declared):
    """The inputs an .npz holds: its one array, or a dict by input name."""
    import numpy as np

    with np.load(user_path(path)) as data:
        arrays = {key: data[key] for key in data.files}
    if list(arrays) == ["arr_0"]:
        return arrays["arr_0"]
    if declared is not None and not isinstance(declared, dict) and len(arrays) == 1:
        return next(iter(arrays.values()))
    return arrays


def calibration_inputs(path: str | None):
    """--calibration's inputs: the .npz's one array (or its one named array), else a dict by
    input name."""
    if path is None:
        return None
    arrays = _arrays(path, None)
    if isinstance(arrays, dict) and len(arrays) == 1:
        return next(iter(arrays.values()))
    return arrays


def traffic_shapes(path: str | None):
    """--traffic's requests, as shapes: a JSON list of shapes (lists of ints) for a model of
    one input, or of lists or objects (by input name) of them; tuples, as optimize() reads
    shapes."""
    if path is None:
        return None
    import json

    from ..errors import OptionError

    try:
        listed = json.loads(user_path(path).read_text())
    except (OSError, ValueError) as exc:
        raise OptionError(f"--traffic {path}: not a JSON file of shapes ({exc})") from None
    if not isinstance(listed, list):
        raise OptionError(f"--traffic {path}: expected a JSON list of requests' shapes.")

    def shape(value):
        if isinstance(value, dict):
            return {name: tuple(dims) for name, dims in value.items()}
        if value and all(isinstance(v, list) for v in value):
            return [tuple(dims) for dims in value]
        return tuple(value)

    return [shape(request) for request in listed]


def sample_inputs(args: argparse.Namespace, declared):
    """The sample: from --sample, else drawn from --input and the model's declared inputs."""
    import numpy as np

    from ..model.structure import flatten

    if args.sample:
        return _arrays(args.sample, declared)
    try:
        given = [_parse_input(text) for text in args.input]
        low, high = (int(v) for v in args.int_range.split(","))
    except _UsageError as exc:
        raise InputError(str(exc)) from None
    except ValueError:
        raise InputError(f"--int-range {args.int_range!r}: expected LOW,HIGH integers") from None
    rng = np.random.default_rng(0)

    def draw(shape, dtype):
        if np.dtype(dtype).kind in "iub":
            return rng.integers(low, high, size=shape).astype(dtype)
        return rng.random(shape).astype(dtype)

    if declared is None:
        if not given:
            raise InputError(
                "The model does not declare its inputs: give them with --input "
                "NAME=DIMS:DTYPE (e.g. --input 1x28x28x1:float32) or --sample FILE.npz."
            )
        if len(given) == 1 and given[0][0] is None:
            return draw(given[0][1], given[0][2])
        return {name: draw(shape, dtype) for name, shape, dtype in given}
    by_name = {name: (shape, dtype) for name, shape, dtype in given}
    leaves, structure = flatten(declared)
    names = ["x"] if structure.kind == "leaf" else structure.leaf_names()
    arrays = []
    for name, decl in zip(names, leaves):
        if name in by_name or (len(leaves) == 1 and None in by_name):
            shape, dtype = by_name.get(name) or by_name[None]
        else:
            dims = list(decl.shape)
            if dims and dims[0] is None:
                dims[0] = args.batch
            if any(d is None for d in dims):
                raise InputError(
                    f"Input '{name}' has open dimensions {decl.shape}: give its shape with "
                    f"--input {name}=DIMS:DTYPE."
                )
            shape, dtype = tuple(dims), (decl.dtype.name if decl.dtype is not None else "float32")
        arrays.append(draw(shape, dtype))
    return structure.pack(arrays)
