"""Input signatures: what a model takes, checked on every call, and fresh inputs like the sample.

The signature is built once from the user's sample and what the model declares (a Keras
`model.input`, a tf.function's `input_signature`). The batch dimension (axis 0) is free
unless the model fixes it. Calls are checked against the signature so that a wrong rank,
dtype or feature shape fails with a message naming the input, not deep inside a runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from .structure import (
    Structure,
    flatten,
)

__all__ = ["InputSpec", "InputSignature", "build_signature", "to_numpy"]


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: its name, shape (None = any size), dtype and the sample's value range.

    A string input (dtype object: what TensorFlow gives for tf.string) keeps, as its range,
    the fewest and most whitespace-separated tokens in one of the sample's strings, and in
    `tokens` the sample's distinct tokens: fresh inputs recombine them, so that they reach
    the model's vocabulary (random bytes would all map to the out-of-vocabulary index and
    verify nothing). The tokens are the user's data: they are never written to a saved
    result (`to_dict` leaves them out); a loaded signature draws strings of "tokens" alone.
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype
    low: float = 0.0
    high: float = 1.0
    tokens: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def is_string(self) -> bool:
        return self.dtype.kind == "O"

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        kind = "string" if self.is_string else self.dtype.name
        return f"{self.name}: shape ({dims}{',' if len(self.shape) == 1 else ''}) {kind}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype.name,
            "low": self.low,
            "high": self.high,
        }

    @classmethod
    def from_dict(cls, data: dict) -> InputSpec:
        """Inverse of `to_dict` (JSON's null dimensions back to None)."""
        shape = tuple(None if d is None else int(d) for d in data["shape"])
        return cls(data["name"], shape, np.dtype(data["dtype"]), data["low"], data["high"])


def to_numpy(value: Any) -> np.ndarray:
    """A numpy array from an array, a tf.Tensor or anything with `__array__`."""
    if type(value) is np.ndarray:
        return value
    numpy_method = getattr(value, "numpy", None)
    if callable(numpy_method):  # tf.Tensor, without importing TensorFlow
        return np.asarray(numpy_method())
    return np.asarray(value)


def _is_array_like(value: Any) -> bool:
    return isinstance(value, np.ndarray | np.generic) or callable(getattr(value, "numpy", None))


class InputSignature:
    """The model's inputs as a flat list of `InputSpec`, plus the structure the user passes."""

    def __init__(
        self,
        specs: Sequence[InputSpec],
        structure: Structure,
        sample_shapes: Sequence[tuple[int, ...]],
    ):
        self.specs = tuple(specs)
        self.structure = structure
        self.sample_shapes = tuple(tuple(shape) for shape in sample_shapes)
        batches = {shape[0] for shape in self.sample_shapes if shape}
        self.sample_batch = batches.pop() if len(batches) == 1 else None
        # The fixed dimensions of each input, precomputed once for the per-call check.
        self._fixed = [
            tuple((axis, size) for axis, size in enumerate(spec.shape) if size is not None)
            for spec in self.specs
        ]
        self._single = structure.kind == "leaf"
        # The common case checked in one comparison: one input, free batch, fixed features.
        first = self.specs[0]
        self.fast_check = (
            (first.dtype, first.shape[1:])
            if self._single
            and first.shape
            and first.shape[0] is None
            and None not in first.shape[1:]
            else None
        )
        # A flat dict of arrays (the form services pass): (key, dtype, rank, fixed dims, the
        # dtypes cast to `dtype` on the way) per input in the model's order, checked in one
        # loop without rebuilding the structure. The casts are those `_cast` accepts (int64
        # ids into an int32 input, float64 into float32), found once here: through the full
        # check, four such inputs cost 7.6 us a call (the structure rebuilt and compared,
        # np.can_cast for each), here 0.3 us an astype.
        # Where the batch is free and every other dimension fixed (ids, features), those
        # are one tuple (`tail`), compared at once: 0.1 us a call less on four inputs than
        # a loop over the fixed dimensions.
        flat_dict = structure.kind == "dict" and structure.is_flat
        self._dict_plan = (
            tuple(
                (key, spec.dtype, len(spec.shape), _tail(spec), fixed, _accepted_casts(spec))
                for key, spec, fixed in zip(structure.keys, self.specs, self._fixed)
            )
            if flat_dict
            else None
        )
        # The check of a flat dict of arrays alone, for the call path: the arrays, or None
        # where `flatten` must say what is wrong (or cast what the fast check does not).
        self.dict_fast = self._dict_fast if self._dict_plan is not None else None
        # (key, dtype, the dtypes cast to it) per input of a flat dict, in the model's order:
        # what a backend's dict_runner checks, and casts by the same rule, itself.
        self.dict_inputs = (
            tuple((key, dtype, casts) for key, dtype, _, _, _, casts in self._dict_plan)
            if self._dict_plan is not None
            else None
        )
        # One input with a free batch and other free dimensions too (an image of any size,
        # a sequence of any length): (dtype, rank, its fixed (axis, size) pairs).
        self.free_check = (
            (first.dtype, len(first.shape), self._fixed[0])
            if self._single and first.shape and first.shape[0] is None and self.fast_check is None
            else None
        )

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    @property
    def strings(self) -> list[str]:
        """The names of the string inputs (which only TensorFlow runs)."""
        return [spec.name for spec in self.specs if spec.is_string]

    @property
    def batch_is_dynamic(self) -> bool:
        return all(spec.shape and spec.shape[0] is None for spec in self.specs)

    def describe(self) -> str:
        return "; ".join(spec.describe() for spec in self.specs)

    def to_dict(self) -> dict:
        return {
            "inputs": [spec.to_dict() for spec in self.specs],
            "structure": self.structure.to_dict(),
            "sample_shapes": [list(shape) for shape in self.sample_shapes],
        }

    @classmethod
    def from_dict(cls, data: dict) -> InputSignature:
        """The signature back from `to_dict()` output (a saved manifest), without TensorFlow."""
        return cls(
            [InputSpec.from_dict(spec) for spec in data["inputs"]],
            Structure.from_dict(data["structure"]),
            [tuple(shape) for shape in data["sample_shapes"]],
        )

    # -- calls ---------------------------------------------------------------------------
    def flatten(self, x: Any) -> list[np.ndarray]:
        """Check a call's input against the signature and return it as a flat list of arrays."""
        if self._single:
            if self.fits_fast(x):
                return [x]
            if isinstance(x, list | tuple | dict):
                raise InputError(
                    f"The model takes a single array. Received a {type(x).__name__}. "
                    f"Expected: {self.describe()}."
                )
            return [self._check(0, x)]
        if type(x) is dict and self._dict_plan is not None:
            arrays = self._dict_fast(x)
            if arrays is not None:
                return arrays
        if isinstance(x, dict) != (self.structure.kind == "dict") or not isinstance(
            x, list | tuple | dict
        ):
            raise InputError(
                f"The model takes a {self.structure.kind} of {len(self.specs)} inputs. "
                f"Received a {type(x).__name__}. Expected: {self.describe()}."
            )
        leaves, structure = flatten(x)
        if structure != self.structure:
            raise InputError(
                f"The input's structure does not match the model's: received "
                f"{_structure_words(structure)}, expected {_structure_words(self.structure)} "
                f"({self.describe()})."
            )
        arrays = [self._check(i, leaf) for i, leaf in enumerate(leaves)]
        batch = arrays[0].shape[0] if arrays[0].ndim else None
        for spec, array in zip(self.specs, arrays):
            if array.ndim and array.shape[0] != batch:
                raise InputError(
                    f"All inputs must have the same batch size: '{self.specs[0].name}' has "
                    f"{batch}, '{spec.name}' has {array.shape[0]}."
                )
        return arrays

    def _dict_fast(self, x: dict) -> list[np.ndarray] | None:
        """The arrays of a flat dict whose every value is a numpy array of the right dtype,
        rank, fixed dimensions and one batch size, with exactly the model's keys; None for
        anything else (the full check then says what is wrong, or casts)."""
        if len(x) != len(self._dict_plan):
            return None
        arrays = []
        ndarray = np.ndarray
        batch = -1  # the first batched input's size, once seen
        for key, dtype, rank, tail, fixed, casts in self._dict_plan:
            array = x.get(key)
            if type(array) is not ndarray:
                return None
            shape = array.shape
            if len(shape) != rank:
                return None
            if array.dtype is not dtype:
                if array.dtype not in casts:
                    return None
                array = array.astype(dtype)
            if tail is not None:
                if shape[1:] != tail:
                    return None
            else:
                for axis, size in fixed:
                    if shape[axis] != size:
                        return None
            if rank:
                if batch < 0:
                    batch = shape[0]
                elif shape[0] != batch:
                    return None
            arrays.append(array)
        return arrays

    def fits_fast(self, x: Any) -> bool:
        """True when `x` is a numpy array that needs no check beyond this one comparison."""
        fast = self.fast_check
        return (
            fast is not None
            and type(x) is np.ndarray
            and x.dtype is fast[0]
            and x.ndim == len(fast[1]) + 1
            and x.shape[1:] == fast[1]
        )

    def _check(self, i: int, value: Any) -> np.ndarray:
        spec = self.specs[i]
        array = value if type(value) is np.ndarray else to_numpy(value)
        if array.dtype != spec.dtype:
            array = _cast(array, spec)
        if array.ndim != len(spec.shape):
            raise InputError(
                f"Input '{spec.name}' has rank {array.ndim} (shape {array.shape}); expected rank "
                f"{len(spec.shape)}: {self.describe()}."
            )
        shape = array.shape
        for axis, size in self._fixed[i]:
            if shape[axis] != size:
                raise InputError(
                    f"Input '{spec.name}' has shape {shape}; dimension {axis} must be {size}: "
                    f"{self.describe()}."
                )
        return array

    # -- fresh inputs --------------------------------------------------------------------
    def random_inputs(
        self,
        rng: np.random.Generator,
        batch: int | None = None,
        shapes: Sequence[tuple[int, ...]] | None = None,
    ) -> list[np.ndarray]:
        """Inputs drawn like the sample: its dtypes, values in its range, and its shapes (at
        `batch` where given, or exactly `shapes`)."""
        shapes = self.concrete_shapes(batch) if shapes is None else shapes
        return [_draw(rng, spec, tuple(shape)) for spec, shape in zip(self.specs, shapes)]

    def other_sizes(self, step: int) -> list[tuple[int, ...]] | None:
        """The sample's shapes with every free dimension but the batch `step` larger (equal
        sizes stay equal: a token ids input and its mask keep one length), or None where the
        model fixes every dimension but the batch."""
        if not any(None in spec.shape[1:] for spec in self.specs):
            return None
        return [
            tuple(
                size + step if axis and spec.shape[axis] is None else size
                for axis, size in enumerate(shape)
            )
            for spec, shape in zip(self.specs, self.sample_shapes)
        ]

    def concrete_shapes(self, batch: int | None = None) -> list[tuple[int, ...]]:
        shapes = []
        for sample_shape in self.sample_shapes:
            shape = list(sample_shape)
            if batch is not None and shape:
                shape[0] = batch
            shapes.append(tuple(shape))
        return shapes


def _structure_words(structure: Structure) -> str:
    if structure.kind == "dict":
        return f"a dict with keys {list(structure.keys)}"
    if structure.kind == "leaf":
        return "a single array"
    return f"a {structure.kind} of {len(structure.children)} items"


def _cast(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    """Cast as Keras would (float64 -> float32, int64 -> int32); refuse a change of kind.
    Strings (numpy str or bytes) become an object array, as a tf.string tensor's numpy()."""
    if spec.is_string or array.dtype.kind in "USO":
        if spec.is_string and array.dtype.kind in "US":
            return array.astype(object)
        expected = "string" if spec.is_string else spec.dtype.name
        raise InputError(
            f"Input '{spec.name}' has dtype {_kind_words(array.dtype)}; expected {expected}."
        )
    if np.can_cast(array.dtype, spec.dtype, casting="same_kind") and not (
        array.dtype.kind == "b" and spec.dtype.kind != "b"
    ):
        return array.astype(spec.dtype)
    raise InputError(
        f"Input '{spec.name}' has dtype {array.dtype.name}; expected {spec.dtype.name} "
        f"(a {array.dtype.name} array cannot be cast to {spec.dtype.name} without changing "
        f"its values' kind)."
    )


def _kind_words(dtype: np.dtype) -> str:
    if dtype.kind in "US":
        return f"{dtype} (strings)"
    return dtype.name


def _tail(spec: InputSpec) -> tuple[int, ...] | None:
    """The dimensions after the batch where the batch is free and they are all fixed."""
    shape = spec.shape
    if not shape or shape[0] is not None or None in shape[1:]:
        return None
    return tuple(shape[1:])


# The dtypes an input may be given in and cast from: every numeric one `_cast` accepts.
_NUMERIC_DTYPES = tuple(
    np.dtype(name)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64")
)  # fmt: skip


def _accepted_casts(spec: InputSpec) -> frozenset:
    """The dtypes other than the spec's that `_cast` turns into it (asked of `_cast` itself,
    on empty arrays, so that the fast check and the full one accept the same)."""
    accepted = set()
    for dtype in _NUMERIC_DTYPES:
        if dtype == spec.dtype:
            continue
        try:
            _cast(np.empty(0, dtype), spec)
        except (ValueError, TypeError):  # InputError is a ValueError
            continue
        accepted.add(dtype)
    return frozenset(accepted)


def _draw(rng: np.random.Generator, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    dtype = spec.dtype
    if spec.is_string:
        return _draw_strings(rng, spec, shape)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        # The range was stored as floats: clip back into the dtype (2**63 - 1 rounds up to 2**63).
        info = np.iinfo(dtype)
        low, high = (int(min(max(v, info.min), info.max)) for v in (spec.low, spec.high))
        if info.max > np.iinfo(np.int64).max:  # uint64: draw below int64's limit
            low, high = min(low, np.iinfo(np.int64).max), min(high, np.iinfo(np.int64).max)
        return rng.integers(low, high, size=shape, dtype=np.int64, endpoint=True).astype(dtype)
    low, high = spec.low, spec.high
    if high <= low:  # a constant sample: vary around it so that inputs still differ
        low, high = low - 1.0, high + 1.0
    return rng.uniform(low, high, size=shape).astype(dtype)


def _draw_strings(rng: np.random.Generator, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    """Strings of the sample's own tokens, shuffled and recombined, as many per string as
    in the sample's strings (one, for a categorical input such as a StringLookup's)."""
    pool = spec.tokens or ("tokens",)
    low, high = int(spec.low), max(int(spec.low), int(spec.high))
    out = np.empty(shape, dtype=object)
    flat = out.reshape(-1)
    for i in range(flat.size):
        count = int(rng.integers(low, high, endpoint=True))
        flat[i] = " ".join(pool[j] for j in rng.integers(0, len(pool), size=count))
    return out


# -- building the signature --------------------------------------------------------------
@dataclass(frozen=True)
class DeclaredInput:
    """What the model itself says about one input (shape with None, dtype), if anything."""

    shape: tuple[int | None, ...] | None
    dtype: np.dtype | None
    name: str | None = None


def build_signature(
    sample: Any,
    declared: Any | None,
    default_float: np.dtype | None = None,
) -> tuple[InputSignature, list[np.ndarray]]:
    """Normalize the user's sample into (signature, flat arrays), checked against `declared`.

    `declared` is the model's own input description: a structure of `DeclaredInput` leaves
    (or None when the model declares nothing, as a subclassed Keras model). `default_float`
    is the float dtype to use for undeclared float inputs (Keras' floatx).
    """
    if sample is None:
        raise InputError("sample_input is None; pass one batch exactly as model(x) takes it.")
    leaves, structure = flatten(sample)
    if not leaves:
        raise InputError(f"sample_input {type(sample).__name__} holds no arrays.")
    names = structure.leaf_names()
    if structure.kind == "leaf":
        names = ["x"]
    declared_leaves = _match_declared(structure, names, declared)
    specs, arrays = [], []
    for name, leaf, decl in zip(names, leaves, declared_leaves):
        if not _is_array_like(leaf):
            raise InputError(
                f"Input '{name}' of the sample is a {type(leaf).__name__}; expected a numpy "
                f"array or a tf.Tensor."
            )
        array = to_numpy(leaf)
        spec = _spec_for(name, array, decl, default_float)
        if array.dtype != spec.dtype:
            array = _cast(array, spec)
        _check_sample_values(name, array)
        specs.append(spec)
        arrays.append(array)
    batches = {a.shape[0] for a in arrays if a.ndim}
    if len(batches) > 1:
        raise InputError(
            f"The sample's inputs have different batch sizes {sorted(batches)}; axis 0 is the "
            f"batch and must agree across inputs."
        )
    if 0 in batches:
        raise InputError("The sample has an empty batch (size 0); pass at least one example.")
    return InputSignature(specs, structure, [a.shape for a in arrays]), arrays


def _match_declared(structure: Structure, names: list[str], declared: Any | None) -> list:
    if declared is None:
        return [None] * len(names)
    declared_leaves, declared_structure = flatten(declared)
    if len(declared_leaves) != len(names):
        raise InputError(
            f"The model takes {len(declared_leaves)} input(s) "
            f"({_structure_words(declared_structure)}); the sample has {len(names)} "
            f"({_structure_words(structure)})."
        )
    both_dicts = structure.kind == "dict" and declared_structure.kind == "dict"
    if both_dicts and set(structure.keys) != set(declared_structure.keys):
        raise InputError(
            f"The sample's keys {sorted(map(str, structure.keys))} do not match the model's "
            f"inputs {sorted(map(str, declared_structure.keys))}."
        )
    return declared_leaves


def _spec_for(
    name: str, array: np.ndarray, decl: DeclaredInput | None, default_float: np.dtype | None
) -> InputSpec:
    if array.dtype.kind not in "biufUSO" or (array.dtype.kind == "O" and not _all_strings(array)):
        raise InputError(
            f"Input '{name}' has dtype {array.dtype}"
            f"{' holding values that are not strings' if array.dtype.kind == 'O' else ''}; "
            f"infertune handles bool, integer, float and string inputs (numpy str, bytes or "
            f"object arrays of str/bytes, tf.string tensors)."
        )
    if decl is not None and decl.shape is not None:
        if len(decl.shape) != array.ndim:
            raise InputError(
                f"Input '{name}' of the sample has shape {array.shape}; the model expects rank "
                f"{len(decl.shape)}: {_dims(decl.shape)}."
            )
        for axis, (want, got) in enumerate(zip(decl.shape, array.shape)):
            if want is not None and want != got:
                raise InputError(
                    f"Input '{name}' of the sample has shape {array.shape}; the model expects "
                    f"{_dims(decl.shape)} (dimension {axis} must be {want})."
                )
        shape = tuple(decl.shape)
    else:
        shape = (None, *array.shape[1:]) if array.ndim else ()
    if decl is not None and decl.dtype is not None:
        dtype = np.dtype(decl.dtype)
    elif array.dtype.kind in "USO":
        dtype = np.dtype(object)  # what a tf.string tensor gives
    elif array.dtype.kind == "f" and default_float is not None:
        dtype = np.dtype(default_float)
    else:
        dtype = array.dtype
    if dtype.kind == "O" and array.dtype.kind in "USO":
        low, high, tokens = _token_range(array)
        return InputSpec(name, shape, dtype, low, high, tokens)
    low, high = _value_range(array)
    return InputSpec(name, shape, dtype, low, high)


def _dims(shape: tuple) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def _all_strings(array: np.ndarray) -> bool:
    return all(isinstance(value, str | bytes) for value in array.reshape(-1))


# Distinct tokens kept from the sample's strings for fresh inputs: enough to recombine, and a
# bound on the memory a large text sample can take.
MAX_TOKENS = 10_000


def _token_range(array: np.ndarray) -> tuple[float, float, tuple[str, ...]]:
    """The fewest and most whitespace-separated tokens in one string, and the distinct tokens
    (bytes decoded as UTF-8), in the order met."""
    counts, tokens = [], {}
    for value in array.reshape(-1):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        words = text.split()
        counts.append(len(words))
        for word in words:
            if len(tokens) < MAX_TOKENS:
                tokens.setdefault(word, None)
    if not counts:
        return 0.0, 1.0, ()
    return float(min(counts)), float(max(counts)), tuple(tokens)


def _value_range(array: np.ndarray) -> tuple[float, float]:
    if array.size == 0:
        return 0.0, 1.0
    if array.dtype.kind in "bUSO":  # strings where the model takes numbers: refused later
        return 0.0, 1.0
    return float(array.min()), float(array.max())


def _check_sample_values(name: str, array: np.ndarray) -> None:
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise InputError(
            f"Input '{name}' of the sample contains NaN or Inf; verification compares outputs "
            f"on finite inputs, so pass a sample of real data."
        )
