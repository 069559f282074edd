"""Output comparison: does a candidate compute what the original model computes?

A candidate passes when, for every output, structure, shape and dtype match, it has NaN/Inf
only where the reference does, and the error is within tolerance in a scale-aware way:

* element-wise, an element fails only when |out - ref| > atol + rtol * max(|ref|, scale),
  where `scale` is the root mean square of |ref| over the element's batch row (its
  non-batch elements: one example's output; the whole output where a row holds one value);
* the relative norm ||out - ref|| / ||ref|| must not exceed rtol.

Why the row's scale and not the element's own magnitude: float32 round-off in a deep network
grows with the magnitude of the whole computation, so an element that happens to sit near
zero carries the same absolute round-off as its large neighbours. Comparing it with its own
magnitude rejected every exact runtime on NASNetMobile (one element in 3000, at a relative
error of 5e-7 over the output). The RMS, not the max, so that one large element does not
widen the tolerance of the rest; per batch row, so that one example of large outputs does
not widen it for another example of small ones.

The second rule stops a model whose outputs are all tiny (1e-12) from letting any garbage
through `atol`. The result is a value (`Comparison`) that says why, so the report can too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Comparison", "compare_outputs", "ELEMENT_RULE", "row_scale"]

# How an element is judged, in words, for reports and reasons.
ELEMENT_RULE = (
    "|out-ref| > atol + rtol*max(|ref|, scale), scale = RMS of |ref| over the element's batch "
    "row (one example's output)"
)


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing a candidate's outputs with the reference; truthy when it passed."""

    passed: bool
    reason: str
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0  # largest ||out - ref|| / ||ref|| over the outputs

    def __bool__(self) -> bool:
        return self.passed

    def merged(self, other: Comparison) -> Comparison:
        """Combine two comparisons (several inputs): worst errors, first failure's reason."""
        first_failure = self if not self.passed else other
        return Comparison(
            self.passed and other.passed,
            first_failure.reason if not (self.passed and other.passed) else "",
            max(self.max_abs_err, other.max_abs_err),
            max(self.max_rel_err, other.max_rel_err),
        )


def compare_outputs(
    outputs: Sequence[np.ndarray],
    reference: Sequence[np.ndarray],
    rtol: float,
    atol: float,
    names: Sequence[str] | None = None,
) -> Comparison:
    """Compare flat lists of output arrays with the reference under (rtol, atol)."""
    if len(outputs) != len(reference):
        return Comparison(
            False, f"returned {len(outputs)} output(s), the model returns {len(reference)}"
        )
    names = names or [f"output {i}" for i in range(len(reference))]
    result = Comparison(True, "")
    for name, out, ref in zip(names, outputs, reference):
        result = result.merged(_compare_one(name, np.asarray(out), np.asarray(ref), rtol, atol))
    return result


def _compare_one(name: str, out: np.ndarray, ref: np.ndarray, rtol: float, atol: float):
    if out.shape != ref.shape:
        return Comparison(False, f"{name} has shape {out.shape}, the model's has {ref.shape}")
    if out.dtype != ref.dtype:
        return Comparison(False, f"{name} has dtype {out.dtype}, the model's has {ref.dtype}")
    if out.size == 0:
        return Comparison(True, "")
    if out.dtype.kind not in "fc":
        # bool and integer outputs (argmax, masks) must match exactly.
        wrong = int(np.count_nonzero(out != ref))
        abs_err = float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64))))
        if wrong:
            return Comparison(False, f"{name}: {wrong} of {out.size} values differ", abs_err, 1.0)
        return Comparison(True, "")

    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    ref_finite, out_finite = np.isfinite(ref64), np.isfinite(out64)
    if np.any(ref_finite & ~out_finite):
        count = int(np.count_nonzero(ref_finite & ~out_finite))
        return Comparison(False, f"{name} has {count} NaN/Inf value(s) where the model has none")
    same_special = ~ref_finite & ((out64 == ref64) | (np.isnan(out64) & np.isnan(ref64)))
    if np.any(~ref_finite & ~same_special):
        return Comparison(False, f"{name} differs from the model at its NaN/Inf positions")

    diff = np.where(ref_finite, np.abs(out64 - ref64), 0.0)
    ref_abs = np.where(ref_finite, np.abs(ref64), 0.0)
    max_abs = float(diff.max())
    ref_norm = float(np.linalg.norm(ref_abs))
    diff_norm = float(np.linalg.norm(diff))
    rel = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else float("inf"))

    scale = row_scale(ref_abs)
    allowed = atol + rtol * np.maximum(ref_abs, scale)
    failing = diff > allowed
    if np.any(failing):
        count = int(np.count_nonzero(failing))
        worst = float(np.max(diff / allowed))
        return Comparison(
            False,
            f"{name}: {count} of {out.size} values off by more than atol + rtol*max(|ref|, "
            f"scale) (atol={atol:g}, rtol={rtol:g}, scale = RMS of its batch row: "
            f"{float(np.min(scale)):.1e}..{float(np.max(scale)):.1e}; worst {worst:.3g}x the "
            f"allowed error; max abs err {max_abs:.2e}, relative error {rel:.2e})",
            max_abs,
            rel,
        )
    if ref_norm > 0 and rel > rtol:  # an all-zero reference is judged element-wise alone
        return Comparison(
            False,
            f"{name}: relative error {rel:.2e} exceeds rtol={rtol:g} "
            f"(outputs are of scale {ref_norm / np.sqrt(out.size):.1e})",
            max_abs,
            rel,
        )
    return Comparison(True, "", max_abs, rel)


def row_scale(ref_abs: np.ndarray) -> np.ndarray:
    """RMS of |ref| over each batch row's non-batch elements, shaped to broadcast against
    `ref_abs`. One number where a row holds a single value (a scalar or 1-D output, or
    shape (batch, 1) as a regression head gives): a lone value is no magnitude of a
    computation, so the whole output's RMS stands for it."""
    if ref_abs.ndim < 2 or ref_abs[0].size == 1:
        return np.sqrt(np.mean(np.square(ref_abs))) if ref_abs.size else np.float64(0.0)
    axes = tuple(range(1, ref_abs.ndim))
    return np.sqrt(np.mean(np.square(ref_abs), axis=axes, keepdims=True))
