"""How a reduced-precision candidate is judged: by the user's task, or without one by its
agreement with the model; never by the float32 tolerance (rtol/atol), which no int8 model
meets and which says nothing of the task.

With `Accuracy(data=(x, y), metric=..., max_drop=...)`: the metric on the user's labelled
data for the model (float32) and for the candidate, sample by sample; the candidate passes
when the drop (how much worse it is: lower accuracy, higher error) is within `max_drop` with
a margin: the upper end of a one-sided 95% paired bootstrap interval of the drop (2,000
resamples of the samples, the same ones for both; a metric that returns one number is
bootstrapped by calling it on 200 resampled sets). `relative=True` takes the drop as a
fraction of the model's own metric.

Without it (`AGREEMENT`): on the verification inputs and the calibration inputs, every float
output must stay within a relative error ||out - ref|| / ||ref|| of 5% (int8 on trained
networks: 1-2%; bfloat16: under 1%), and one shaped like a classifier's (float, rank 2, at
least 2 classes) must give the model's top-1 class on at least 99% of the rows the model
decides clearly: where its top class leads the next by more than twice the candidate's
RMS error on that output (a near-tie flipped by that error is noise, a clear decision
flipped is not; random verification inputs on an untrained model are mostly near-ties).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import OptionError

__all__ = ["AGREEMENT", "METRICS", "Accuracy", "Judgement", "judge_agreement", "judge_metric"]

# Named metrics: per-sample scores, and whether higher is better.
METRICS = ("accuracy", "top5", "mse", "mae", "cosine")
_LOWER_IS_BETTER = ("mse", "mae")
CONFIDENCE = 0.95
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_CALLS = 200  # for a metric that returns one number: it is called this many times
TOP1_AGREEMENT = 0.99
RELATIVE_ERROR = 0.05
AGREEMENT = (
    f"agreement with the model on the verification and calibration inputs: relative error "
    f"within {RELATIVE_ERROR:g}, and for a classifier-shaped output the model's top-1 class "
    f"on {TOP1_AGREEMENT:.0%} of the rows it decides clearly"
)


@dataclass(frozen=True)
class Accuracy:
    """What a reduced-precision candidate must keep: `metric` on labelled `data` may drop
    by at most `max_drop` (absolute: 0.01 is one point of accuracy; `relative=True`: a
    fraction of the model's own metric) against the float32 model, with a statistical margin.

    data: `(x, y)` (x as the model takes it, y one label row per sample), a tf.data.Dataset
        of `(x, y)` batches, or an iterable of them. Never the calibration data.
    metric: "accuracy" (top-1; labels as class indices or one-hot), "top5", "mse", "mae",
        "cosine" (each sample's cosine similarity to its label row), or a function
        `fn(y_true, y_pred)` returning one score per sample (best) or one number.
    higher_is_better: for a function (a named metric knows its own); False for an error.
    output: which output the metric reads, by name or index, for a model of several.
    """

    data: Any
    metric: str | Callable[[np.ndarray, np.ndarray], Any] = "accuracy"
    max_drop: float = 0.01
    relative: bool = False
    higher_is_better: bool | None = None
    output: str | int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.metric, str):
            if self.metric not in METRICS:
                raise OptionError(
                    f"Accuracy(metric=...) must be one of {METRICS} or a function "
                    f"fn(y_true, y_pred). Received: {self.metric!r}."
                )
        elif not callable(self.metric):
            raise OptionError(f"Accuracy(metric=...) is not callable: {self.metric!r}.")
        if not (isinstance(self.max_drop, int | float) and self.max_drop >= 0):
            raise OptionError(
                f"Accuracy(max_drop=...) must be a number >= 0. Received: {self.max_drop!r}."
            )

    @property
    def name(self) -> str:
        """The metric's name, for the report."""
        if isinstance(self.metric, str):
            return self.metric
        return getattr(self.metric, "__name__", "metric")

    @property
    def higher(self) -> bool:
        if isinstance(self.metric, str):
            return self.metric not in _LOWER_IS_BETTER
        return True if self.higher_is_better is None else bool(self.higher_is_better)

    def describe(self) -> str:
        kind = "relative " if self.relative else ""
        return f"{self.name} on the user's data, {kind}drop at most {self.max_drop:g}"

    def settings(self) -> dict:
        """What decides the result, for save() and the tuning cache (the data is hashed
        apart)."""
        return {
            "metric": self.name,
            "max_drop": self.max_drop,
            "relative": self.relative,
            "higher_is_better": self.higher,
            "output": self.output,
        }


@dataclass
class Judgement:
    """A reduced-precision candidate's verdict: truthy when it passed."""

    passed: bool
    rule: str  # which rule judged it, in words
    reason: str = ""  # why it failed (or what it measured)
    metric: float | None = None  # the candidate's metric (with Accuracy)
    reference_metric: float | None = None  # the float32 model's
    drop: float | None = None  # how much worse, as measured
    drop_bound: float | None = None  # the margin's upper end, compared with max_drop
    max_drop: float | None = None
    details: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.passed


def scores(accuracy: Accuracy, labels: np.ndarray, predictions: np.ndarray) -> np.ndarray | float:
    """The metric on one batch: per-sample scores (or one number from a user's function)."""
    metric = accuracy.metric
    if callable(metric):
        value = metric(labels, predictions)
        array = np.asarray(value, dtype=np.float64)
        if array.ndim == 0:
            return float(array)
        return array.reshape(len(array), -1).mean(axis=1) if array.ndim > 1 else array
    predictions = np.asarray(predictions, dtype=np.float64)
    if metric in ("accuracy", "top5"):
        classes = _class_indices(labels, predictions)
        if metric == "accuracy":
            return (predictions.argmax(axis=-1) == classes).astype(np.float64)
        k = min(5, predictions.shape[-1])
        top = np.argpartition(-predictions, k - 1, axis=-1)[..., :k]
        return (top == classes[..., None]).any(axis=-1).astype(np.float64)
    target = np.asarray(labels, dtype=np.float64).reshape(predictions.shape)
    flat_pred = predictions.reshape(len(predictions), -1)
    flat_true = target.reshape(len(target), -1)
    if metric == "mse":
        return ((flat_pred - flat_true) ** 2).mean(axis=1)
    if metric == "mae":
        return np.abs(flat_pred - flat_true).mean(axis=1)
    norms = np.linalg.norm(flat_pred, axis=1) * np.linalg.norm(flat_true, axis=1)
    return (flat_pred * flat_true).sum(axis=1) / np.maximum(norms, 1e-30)


def _class_indices(labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Class indices from labels given as indices (shape (n,) or (n, 1)) or one-hot rows."""
    labels = np.asarray(labels)
    if labels.ndim == predictions.ndim and labels.shape[-1] == predictions.shape[-1] > 1:
        return labels.argmax(axis=-1)
    if labels.ndim == predictions.ndim and labels.shape[-1] == 1:
        labels = labels[..., 0]
    if labels.shape != predictions.shape[:-1]:
        raise OptionError(
            f"Accuracy: labels of shape {labels.shape} do not match predictions of shape "
            f"{predictions.shape} (class indices of shape {predictions.shape[:-1]}, or "
            f"one-hot rows, expected)."
        )
    return labels.astype(np.int64)


def check_metric(accuracy: Accuracy, labels: np.ndarray, predictions: np.ndarray) -> None:
    """Before any long work: the metric on the model's own outputs for one batch is a
    finite number per sample (or one number); OptionError saying what is wrong otherwise."""
    try:
        value = scores(accuracy, labels, predictions)
    except OptionError:
        raise
    except Exception as exc:
        raise OptionError(
            f"Accuracy: the metric {accuracy.name!r} failed on the model's outputs (shape "
            f"{np.shape(predictions)}) and the labels (shape {np.shape(labels)}): {exc}"
        ) from exc
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 1 and len(array) != len(labels):
        raise OptionError(
            f"Accuracy: the metric {accuracy.name!r} returned {len(array)} scores for a batch "
            f"of {len(labels)} samples: return one score per sample, or one number."
        )
    if not np.all(np.isfinite(array)):
        raise OptionError(
            f"Accuracy: the metric {accuracy.name!r} returned NaN or infinity on the model's "
            f"own outputs: it cannot judge a candidate."
        )


def judge_metric(
    accuracy: Accuracy,
    labels: list[np.ndarray],
    reference: list[np.ndarray],
    candidate: list[np.ndarray],
    seed: int = 0,
) -> Judgement:
    """The candidate's metric against the float32 model's on the same labelled batches
    (predictions by batch), with the paired bootstrap's upper bound of the drop."""
    rule = f"{accuracy.describe()}, {CONFIDENCE:.0%} paired bootstrap upper bound"
    y = np.concatenate([np.asarray(b) for b in labels])
    ref = np.concatenate([np.asarray(b) for b in reference])
    cand = np.concatenate([np.asarray(b) for b in candidate])
    if not np.all(np.isfinite(cand)):
        return Judgement(False, rule, "the candidate's outputs hold NaN or infinity")
    sign = 1.0 if accuracy.higher else -1.0  # scores oriented so that higher is better
    rng = np.random.default_rng(seed)
    per_ref = scores(accuracy, y, ref)
    if np.ndim(per_ref) == 1:
        per_cand = np.asarray(scores(accuracy, y, cand))
        ref_metric, cand_metric = float(np.mean(per_ref)), float(np.mean(per_cand))
        n = len(per_ref)
        picks = rng.integers(0, n, (BOOTSTRAP_SAMPLES, n))
        ref_b = per_ref[picks].mean(axis=1)
        cand_b = per_cand[picks].mean(axis=1)
    else:  # one number per call: called on resampled sets
        ref_metric = float(per_ref)
        cand_metric = float(scores(accuracy, y, cand))
        n = len(y)
        picks = rng.integers(0, n, (BOOTSTRAP_CALLS, n))
        ref_b = np.array([float(scores(accuracy, y[p], ref[p])) for p in picks])
        cand_b = np.array([float(scores(accuracy, y[p], cand[p])) for p in picks])
    drops_b = sign * (ref_b - cand_b)
    drop = sign * (ref_metric - cand_metric)
    if accuracy.relative:
        scale = abs(ref_metric) or 1.0
        drops_b, drop = drops_b / np.maximum(np.abs(ref_b), 1e-30), drop / scale
    bound = float(np.quantile(drops_b, CONFIDENCE))
    # Drops are multiples of 1/n, summed in float64: a bound exactly at max_drop must pass.
    passed = math.isfinite(bound) and bound <= accuracy.max_drop + 1e-12
    words = (
        f"{accuracy.name} {cand_metric:.4g} against the model's {ref_metric:.4g} on "
        f"{n} samples: drop {drop:.4g}, at most {bound:.4g} at {CONFIDENCE:.0%}"
    )
    reason = words if passed else f"{words}, beyond max_drop={accuracy.max_drop:g}"
    return Judgement(
        passed, rule, reason, cand_metric, ref_metric, float(drop), bound, accuracy.max_drop
    )


def judge_agreement(
    reference: list[list[np.ndarray]], candidate: list[list[np.ndarray]]
) -> Judgement:
    """The candidate's flat outputs against the model's, over every input given (see
    AGREEMENT): the top-1 agreement pooled over all their rows, the worst relative error."""
    agree: dict[int, list[int]] = {}  # output -> [rows that agree, rows]
    worst_error = 0.0
    for ref_outputs, cand_outputs in zip(reference, candidate):
        for i, (ref, cand) in enumerate(zip(ref_outputs, cand_outputs)):
            ref, cand = np.asarray(ref), np.asarray(cand)
            if ref.shape != cand.shape:
                why = f"output {i}: shape {cand.shape}, not {ref.shape}"
                return Judgement(False, AGREEMENT, why)
            if not np.all(np.isfinite(cand)) and np.all(np.isfinite(ref)):
                return Judgement(False, AGREEMENT, f"output {i}: NaN or infinity")
            if ref.dtype.kind != "f":
                if not np.array_equal(ref, cand):
                    return Judgement(False, AGREEMENT, f"output {i}: integer values differ")
                continue
            norm = float(np.linalg.norm(ref))
            error = float(np.linalg.norm(cand - ref)) / norm if norm else 0.0
            worst_error = max(worst_error, error)
            if _classifier_shaped(ref):
                counts = agree.setdefault(i, [0, 0])
                rms = float(np.sqrt(np.mean((cand.astype(np.float64) - ref) ** 2)))
                ordered = np.sort(ref, axis=-1)
                clear = ordered[:, -1] - ordered[:, -2] > 2 * rms
                same = ref.argmax(axis=-1) == cand.argmax(axis=-1)
                counts[0] += int(same[clear].sum())
                counts[1] += int(clear.sum())
    top1 = min((same / rows for same, rows in agree.values() if rows), default=1.0)
    passed = top1 >= TOP1_AGREEMENT and worst_error <= RELATIVE_ERROR
    parts = []
    if agree:
        rows = sum(r for _, r in agree.values())
        parts.append(f"top-1 agreement {top1:.4f} on the {rows} rows decided clearly")
    parts.append(f"relative error {worst_error:.3g}")
    words = ", ".join(parts)
    reason = words if passed else f"{words}: beyond the agreement rule"
    details = {"top1": top1, "relative_error": worst_error}
    return Judgement(passed, AGREEMENT, reason, details=details)


def _classifier_shaped(output: np.ndarray) -> bool:
    """A float output of rank 2 with at least 2 columns: class scores, one row per sample."""
    return output.dtype.kind == "f" and output.ndim == 2 and output.shape[1] >= 2
