"""Padding proven exact, per model, before any bucket is used.

A bucket runs a request padded to its length (pad_value in the new positions) and slices the
outputs that follow the length back to the request's. That is exact only where the padding
reaches nothing the real positions read: an attention layer and a pooling that honour a
padding mask. Keras 3 loses an implicit mask (Embedding(mask_zero=True)) within a functional
encoder's first blocks; padding 37 tokens to 64 then changed its outputs by 39-85% relative.
So before buckets are planned, the model itself runs requests of lengths from the traffic
unpadded and padded, and the outputs are compared with the verification rule of every
candidate (model/tolerance.py); the batch is padded and checked the same way. A model whose
outputs change is served at exact shapes only, and the report says by how much and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import one_line
from ..model.inputs import InputSignature
from ..model.tolerance import compare_outputs
from ..model.traffic import Traffic, shapes_at
from ..result.buckets import padded, sliced_back

__all__ = ["PaddingCheck", "check_padding", "pad_values_for"]

# Where the padding likely leaks when a model's outputs change under it, in the report's words.
LIKELY_CAUSE = (
    "likely cause: the padding reaches an attention layer or a pooling without a padding "
    "mask (Keras 3 drops an Embedding(mask_zero=True) mask within a functional encoder's "
    "first blocks); give the model an explicit padding-mask input and pass it to every "
    "attention layer and to the pooling, as keras-hub models take one"
)


@dataclass
class PaddingCheck:
    """Whether padding the dimension is exact for this model, and what was checked."""

    exact: bool
    sliced: tuple[tuple[int, int], ...] = ()  # (flat output, axis) that follow the length
    max_rel_err: float = 0.0  # the largest relative change padding made to an output
    reason: str = ""  # what was checked, or why padding is not exact
    checked: list[tuple[int, int]] = field(default_factory=list)  # (length, padded to)
    batch_exact: bool | None = None  # padding the batch with rows changed nothing

    def to_dict(self) -> dict:
        return {
            "exact": self.exact,
            "sliced": [list(s) for s in self.sliced],
            "max_rel_err": self.max_rel_err,
            "reason": self.reason,
            "checked": [list(c) for c in self.checked],
            "batch_exact": self.batch_exact,
        }

    @classmethod
    def from_dict(cls, data: dict) -> PaddingCheck:
        return cls(
            bool(data["exact"]),
            tuple((int(o), int(a)) for o, a in data["sliced"]),
            float(data["max_rel_err"]),
            data["reason"],
            [(int(a), int(b)) for a, b in data["checked"]],
            data.get("batch_exact"),
        )


def pad_values_for(pad_value: object, signature: InputSignature) -> tuple:
    """Each flat input's pad value: `pad_value` for all (default 0: a padding mask padded
    with 0/False), or {input name: value} with 0 for those not named."""
    if isinstance(pad_value, dict):
        names = [spec.name for spec in signature.specs]
        unknown = sorted(set(pad_value) - set(names))
        if unknown:
            from ..errors import OptionError

            raise OptionError(f"pad_value names {unknown}; the model's inputs are {names}.")
        return tuple(pad_value.get(name, 0) for name in names)
    return tuple(pad_value for _ in signature.specs)


def check_padding(
    call: Callable[[list[np.ndarray]], list[np.ndarray]],
    signature: InputSignature,
    traffic: Traffic,
    dim_index: int,
    pad_values: Sequence[object],
    rtol: float,
    atol: float,
) -> PaddingCheck:
    """Run the model (`call`, on flat inputs) on requests of lengths from the traffic, as they
    are and padded, and compare (see the module's doc)."""
    dim = traffic.dims[dim_index]
    lengths = traffic.lengths(dim_index)
    rng = np.random.default_rng(7)
    picks = sorted({int(v) for v in np.percentile(lengths, [10, 50, 90])})
    top = int(lengths.max())
    pairs = [(n, top if top > n else n + max(1, n // 2)) for n in picks]
    pairs.append((picks[0], picks[0] + max(1, picks[0] // 2)))
    batch = int(np.median(traffic.batches))

    def request(n: int) -> list[np.ndarray]:
        sizes = [n if d is dim else int(np.median(traffic.lengths(j)))
                 for j, d in enumerate(traffic.dims)]  # fmt: skip
        return signature.random_inputs(rng, shapes=shapes_at(signature, traffic.dims, batch, sizes))

    try:
        first, second = request(pairs[0][0]), request(pairs[0][1])
        sliced = _following(call(first), call(second), pairs[0][0], pairs[0][1])
    except Exception as exc:  # the model itself raised: nothing can be padded
        return PaddingCheck(False, reason=f"the model raised on a request: {one_line(exc)}")
    if isinstance(sliced, str):
        return PaddingCheck(False, reason=sliced)
    check = PaddingCheck(True, sliced)
    for n, to in dict.fromkeys(pairs):  # in order, once each
        x = request(n)
        expected = call(x)
        got = sliced_back(call(padded(x, dim, to, pad_values)), sliced, n)
        comparison = compare_outputs(got, expected, rtol, atol)
        check.checked.append((n, to))
        check.max_rel_err = max(check.max_rel_err, comparison.max_rel_err)
        if not comparison:
            check.exact = False
            check.reason = (
                f"padding {n} to {to} along {dim.words(signature)} changed the outputs "
                f"({comparison.reason}); {LIKELY_CAUSE}"
            )
            return check
    check.batch_exact = _batch_padding_exact(call, request(picks[0]), pad_values, rtol, atol)
    check.reason = (
        f"padding along {dim.words(signature)} changed no output beyond rtol/atol "
        f"(largest relative change {check.max_rel_err:.1e}; lengths "
        + ", ".join(f"{n}->{to}" for n, to in check.checked)
        + ")"
    )
    return check


def _following(
    short: list[np.ndarray], long: list[np.ndarray], n: int, m: int
) -> tuple[tuple[int, int], ...] | str:
    """The (output, axis) whose size is the request's length at both lengths `n` and `m`;
    or why an output cannot be sliced back (an axis that grows otherwise)."""
    found = []
    for o, (a, b) in enumerate(zip(short, long)):
        if a.ndim != b.ndim:
            return f"output {o} has rank {a.ndim} at length {n} and {b.ndim} at {m}"
        for axis in range(1, a.ndim):
            if a.shape[axis] == n and b.shape[axis] == m:
                found.append((o, axis))
            elif a.shape[axis] != b.shape[axis]:
                return (
                    f"output {o}'s axis {axis} changes with the length ({a.shape[axis]} at "
                    f"{n}, {b.shape[axis]} at {m}) but not as it: it cannot be cut back"
                )
    return tuple(found)


def _batch_padding_exact(
    call: Callable, x: list[np.ndarray], pad_values: Sequence[object], rtol: float, atol: float
) -> bool:
    """Whether rows of pad values added to the batch change the real rows' outputs."""
    rows = len(x[0])
    bigger = [
        np.concatenate([a, np.full((3, *a.shape[1:]), pad, a.dtype)])
        for a, pad in zip(x, pad_values)
    ]
    got = [out[:rows] for out in call(bigger)]
    return bool(compare_outputs(got, call(x), rtol, atol))
