"""The gate a reduced-precision candidate passes instead of the float32 tolerance (accuracy.py
says the rules): the data it needs, made once per run (`PrecisionData`: the calibration
inputs and the model's outputs on them, the labelled data and the model's predictions on it),
and the verdict on one candidate (`judge`).

The model's predictions on the labelled data are made in two steps: on its first FIRST_ROWS
rows by the model itself, before any long work (the metric is checked on them: a clear error
early); on all of it by a verified float32 candidate that runs every batch size, where it
gives the model's predictions on those first rows within rtol/atol (`PrecisionData.complete`;
the scheduler, preparing.py, has them made in a thread of their own beside the conversions,
`predictions_by`). On ResNet50 224 the model's eager call took 42 s for 435 samples, of an
optimize() of 135 s; OpenVINO in float32 took 11 s.

The calibration inputs are what the quantizing conversions calibrate on; the gate never
judges a candidate by them where labelled data is given (`Accuracy`); without it they are
among the inputs of the agreement rule, with the verification inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..accuracy import Accuracy, Judgement, check_metric, judge_agreement, judge_metric
from ..errors import OptionError
from ..model.outputs import OutputSignature
from ..model.tolerance import compare_outputs
from .data import LabelledBatch

__all__ = ["FIRST_ROWS", "PrecisionData", "judge", "precision_data"]

FIRST_ROWS = 8  # the labelled rows the model predicts before any long work


@dataclass
class PrecisionData:
    """What judging reduced precision needs, made once per run."""

    calibration: list[list[np.ndarray]] = field(default_factory=list)  # flat input batches
    calibration_reference: list[list[np.ndarray]] = field(default_factory=list)
    accuracy: Accuracy | None = None
    labelled: list[LabelledBatch] = field(default_factory=list)
    output: int = 0  # the flat output the metric reads
    predictions: list[np.ndarray] = field(default_factory=list)  # the model's, by batch
    first: np.ndarray | None = None  # the model's on the first FIRST_ROWS rows
    # The model's own call on flat inputs: what made `first`, and the predictions where no
    # float32 candidate does (complete()); who made them, in words.
    reference_call: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None
    predicted_by: str = "the model"
    # The other batch sizes the result will serve (optimize(batch_sizes=...)): a candidate
    # that passes is judged again with the labelled data in batches of each (dynamic
    # quantization computes its ranges per call, so a batch's size can change the outputs).
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def rule(self) -> str:
        """The rule reduced-precision candidates are judged by, in words."""
        if self.accuracy is not None:
            return self.accuracy.describe()
        from ..accuracy import AGREEMENT

        return AGREEMENT

    def complete(
        self,
        call: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None,
        by: str = "",
        tolerance: tuple[float, float] = (1e-3, 1e-5),
        made: list[np.ndarray] | None = None,
    ) -> None:
        """The model's predictions on every labelled batch, made once: by `call` (a verified
        float32 candidate, named `by`), or `made` by it already (`predictions_by`), where it
        gives the model's predictions on the first rows within `tolerance` (rtol, atol),
        else by the model itself."""
        if self.predicted:
            return
        if made is None and call is not None:
            made = self.predictions_by(call)
        first = made[0][:FIRST_ROWS] if made else None
        if first is None or not compare_outputs([first], [self.first], *tolerance):
            by = "the model"
            made = self.outputs_of(self.reference_call)
        self.predictions = made
        self.predicted_by = by

    def predictions_by(
        self, call: Callable[[list[np.ndarray]], list[np.ndarray]]
    ) -> list[np.ndarray] | None:
        """`call`'s predictions on every labelled batch; None where it fails (the model then
        makes them). Safe in a thread of its own: it reads only the labelled data."""
        try:
            return self.outputs_of(call)
        except Exception:
            return None

    def outputs_of(self, call: Callable[[list[np.ndarray]], list[np.ndarray]]) -> list[np.ndarray]:
        """`call`'s output the metric reads, on every labelled batch."""
        return [call(batch.inputs)[self.output] for batch in self.labelled]

    @property
    def predicted(self) -> bool:
        """Whether the model's predictions on every labelled batch are made."""
        return len(self.predictions) >= len(self.labelled)


def precision_data(
    calibration: list[list[np.ndarray]] | None,
    accuracy: Accuracy | None,
    labelled: list[LabelledBatch] | None,
    outputs: OutputSignature,
    call: Callable[[list[np.ndarray]], list[np.ndarray]],
    references: bool = True,
) -> PrecisionData:
    """The model's outputs on the calibration inputs and its predictions on the first labelled
    rows (`call`: the reference's call on flat inputs; all of them: `PrecisionData.complete`),
    the metric checked on them (OptionError saying what is wrong, before any long work).
    `references` False: not the outputs on the calibration inputs where the labelled data
    judges (only the agreement rule reads them)."""
    data = PrecisionData(accuracy=accuracy, reference_call=call)
    if calibration:
        data.calibration = calibration
        if references or accuracy is None:
            data.calibration_reference = [call(batch) for batch in calibration]
    if accuracy is not None and labelled:
        data.labelled = labelled
        data.output = _output_index(accuracy, outputs)
        data.first = call(_first_rows(labelled))[data.output]
        check_metric(accuracy, labelled[0].labels[:FIRST_ROWS], data.first)
    return data


def _first_rows(labelled: list[LabelledBatch]) -> list[np.ndarray]:
    return [array[:FIRST_ROWS] for array in labelled[0].inputs]


def _output_index(accuracy: Accuracy, outputs: OutputSignature) -> int:
    """The flat output the metric reads: the only one, or the one `accuracy.output` names."""
    names = list(outputs.names)
    if accuracy.output is None:
        if len(names) != 1:
            raise OptionError(
                f"Accuracy(output=...): the model has {len(names)} outputs ({names}); name "
                f"the one the metric reads."
            )
        return 0
    if isinstance(accuracy.output, int) and 0 <= accuracy.output < len(names):
        return accuracy.output
    if accuracy.output in names:
        return names.index(accuracy.output)
    raise OptionError(f"Accuracy(output={accuracy.output!r}): the model's outputs are {names}.")


def judge(
    run: Callable[[list[np.ndarray]], list[np.ndarray]],
    data: PrecisionData,
    checked: list[tuple[list[np.ndarray], list[np.ndarray]]],
) -> Judgement:
    """A reduced-precision candidate's verdict: with Accuracy, its metric on the labelled data
    against the model's; else its agreement with the model on the verification inputs
    (`checked`: (its outputs, the model's) for each) and the calibration inputs."""
    if data.accuracy is not None:
        data.complete()  # where no float32 candidate made them (memory tight: judged at once)
        predictions = data.outputs_of(run)
        labels = [batch.labels for batch in data.labelled]
        verdict = judge_metric(data.accuracy, labels, data.predictions, predictions)
        for size in data.batch_sizes if verdict else ():
            again = _rebatched(run, data, size)
            if not again:
                again.reason = f"at batch size {size}: {again.reason}"
                return again
            verdict.reason += f"; at batch size {size} too (at most {again.drop_bound:.4g})"
        return verdict
    ours = [outputs for outputs, _ in checked]
    theirs = [reference for _, reference in checked]
    for batch, reference in zip(data.calibration, data.calibration_reference):
        ours.append(run(batch))
        theirs.append(reference)
    return judge_agreement(theirs, ours)


def _rebatched(
    run: Callable[[list[np.ndarray]], list[np.ndarray]], data: PrecisionData, size: int
) -> Judgement:
    """The metric with the labelled data in batches of `size` (the last one shorter)."""
    inputs = [np.concatenate(arrays) for arrays in zip(*(b.inputs for b in data.labelled))]
    labels = np.concatenate([b.labels for b in data.labelled])
    count = len(labels)
    predictions = [
        run([array[start : start + size] for array in inputs])[data.output]
        for start in range(0, count, size)
    ]
    reference = [np.concatenate(data.predictions)]
    return judge_metric(data.accuracy, [labels], reference, [np.concatenate(predictions)])


def describe(judgement: Judgement) -> str:
    """A verdict in one line, for the progress and the report's reason."""
    return f"{judgement.reason} ({judgement.rule})"
