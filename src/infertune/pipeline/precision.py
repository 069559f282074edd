"""Where a quantized candidate fails the gate: find a quantization of it that passes and is
still faster, or say why there is none.

First the candidate, quantized throughout, is timed against the fastest candidates verified so
far (`race`): none of what follows can make it faster, so it is not searched where its p50 is
not at most SEARCH_FASTER times theirs (`_cannot_win`). Then the other calibration methods it
has (`Backend.calibration_methods`: percentile, entropy after min-max), each quantized anew and
judged (OpenVINO's int8 on an attention model: NNCF's transformer rules without SmoothQuant).
Then, for a candidate that can leave layers in float32 (`Backend.keeps_layers`), quantized
with the method that came closest to passing (the least bound of the drop), the layers are
ranked by the error each adds (precision/layers.py `layer_errors`: the float32
export and its static int8 form run side by side on the calibration inputs, each quantized
layer's output compared, less what its inputs already carried), and the worst are kept in
float32 one at a time: after each, the candidate is quantized again, verified, timed against
the fastest candidates verified so far (`rivals`: float32, bf16, or another quantized one that
passed; interleaved, a second or so: `race`), and judged. The search stops when one passes (the
report names the layers kept and what each cost); when keeping one more leaves it no faster
than the fastest of them (the step's gate is then not run, 3 s on ResNet50 224, unless the run
chooses at several batch sizes or callers: `serves_several`); or after MAX_KEPT layers. A step
that leaves the gate's verdict where it was is no sign that the next will too: a layer kept in
float32 still has its output quantized where the layer after it reads it (QDQ, NNCF's ignored
scope). On the tests' MLP with one huge-range layer, ONNX Runtime's accuracy stayed at 0.10
with that layer kept and came back only with the layer after it kept as well.
preparing.py runs the searches once every gate has its verdict (where memory is tight, each at
once), the fastest first, and none for a candidate whose p50 quantized throughout, timed with
the others before the gates, is not at most SEARCH_FASTER times the fastest verified one's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..accuracy import Judgement
from ..errors import one_line
from ..export.registry import export_onnx, shared, static_int8
from ..precision.layers import layer_errors
from ..report import CandidateResult
from .context import Candidate
from .timing import measure_interleaved
from .verifying import Mismatch, first_call_and_verify, judge_candidate

if TYPE_CHECKING:
    import numpy as np

    from ..model.target import Target
    from .context import Preparation
    from .isolation import Isolation

__all__ = [
    "MAX_KEPT", "SEARCH_FASTER", "race", "raced", "ranking_inputs", "rivals", "search",
    "serves_several", "time_together",
]  # fmt: skip

MAX_KEPT = 6  # layers kept in float32 at most, one more each step
DIVERGES = 0.05  # relative error a layer adds that counts as diverging from float32
RANKING_SAMPLES = 32  # calibration samples the layers are ranked on
TIMING_S = 1.0  # the interleaved timing of a variant against the fastest verified candidates
RIVALS_WITHIN = 3.0  # verified candidates timed against it: calls within 3x the fastest's
# A candidate that failed the gate is searched only where, quantized throughout, its p50 is
# at most this times the fastest verified one's: each layer kept in float32 slows it, and
# two candidates timed together for a second differ by 5-10% from one run to the next.
SEARCH_FASTER = 0.9


def search(
    state: Candidate, run: Preparation, isolation: Isolation, stage: Callable, failed: Mismatch
) -> None:
    """Replace `state.backend` with a variant that passes the gate, or raise Mismatch saying
    what was tried. `stage` runs and times each step (this thread's or the background's)."""
    backend = state.backend
    others = rivals(run)
    why_not = _cannot_win(state, run, stage, others)
    if why_not is not None:
        raise Mismatch(f"{failed}; not searched further: {why_not}", failed.judgement)
    tried = [f"{_settings(backend)}: {failed.judgement.reason}"]
    methods = backend.calibration_methods
    best_method = backend.method if backend.method in methods else None
    closest = _shortfall(failed.judgement)
    for method in [m for m in methods if m != best_method]:
        variant = backend.variant(method=method)
        verdict = _attempt(state, run, isolation, stage, variant)
        if verdict is None:
            return
        tried.append(f"{_settings(variant)}: {_reason(verdict)}")
        if _shortfall(verdict) < closest:  # the layers are kept from the closest method's
            best_method, closest = method, _shortfall(verdict)
    if not backend.keeps_layers or run.target.loading:
        raise Mismatch(_summary(tried), failed.judgement)
    errors = stage(
        state, run, "layer sensitivity", f"{state.name}: ranking its layers",
        lambda: _layer_errors(run),
    )  # fmt: skip
    ranking = sorted(errors, key=lambda scope: -errors[scope])
    tried.append(_diverging(errors))
    kept: list[str] = []
    costs: list[dict] = []
    for scope in ranking[:MAX_KEPT]:
        kept.append(scope)
        variant = backend.variant(method=best_method, keep=tuple(kept))
        steps = f"{len(kept)} layer(s) kept in float32"
        trial = _verified(state, run, isolation, stage, variant, f"{steps} ({scope} added)")
        if isinstance(trial, str):
            tried.append(f"{steps}: {trial}")
            break
        mine, rival, theirs = raced(state, run, stage, variant, others)
        costs.append({"layer": scope, "p50_ms": mine})
        slower = rival is not None and mine is not None and mine >= theirs
        if slower and not serves_several(run):  # it cannot be chosen: its gate is not run
            _close(variant)
            tried.append(f"{_no_faster(kept, mine, rival, theirs)}, so it was not judged")
            break
        verdict = _judged(state, run, isolation, stage, trial)
        if verdict is None:  # it passes: the measurement decides whether it is chosen
            _accept(state, variant)
            state.result.kept_fp32 = costs
            if mine is not None:  # slower than quantized throughout: what later searches beat
                run.sample_p50[state.name] = mine
            run.progress.say(f"{state.name}: passes with {', '.join(kept)} in float32")
            return
        _close(variant)
        tried.append(f"{steps}: {_reason(verdict)}")
        if slower:  # it cannot win
            tried.append(_no_faster(kept, mine, rival, theirs))
            break
        if isinstance(verdict, str):  # the gate itself failed
            break
    raise Mismatch(_summary(tried), failed.judgement)


def _cannot_win(
    state: Candidate, run: Preparation, stage: Callable, others: list[Any]
) -> str | None:
    """Why the candidate cannot win whatever its search finds, None where it may: quantized
    throughout, timed against the fastest verified candidates (`race`), its p50 is not at most
    SEARCH_FASTER times theirs (another calibration method leaves its speed as it is, a layer
    kept in float32 slows it). preparing.py's `_why_not` compares the p50s the candidates
    had when timed together before the gates; where memory is tight they were never timed
    together (each is judged and searched as it comes), and on the BERT-sized encoder the
    searches of ONNX Runtime's static int8 and LiteRT's int8 took 71 and 30 s of 307 there,
    after OpenVINO's int8 passed."""
    if not others:
        return None
    mine, rival, theirs = raced(state, run, stage, state.backend, others)
    if rival is None or mine is None or mine < SEARCH_FASTER * theirs:
        return None
    return (
        f"{rival.name} is verified, its p50 {theirs:.4g} ms against this one's {mine:.4g} ms "
        f"quantized throughout, timed together (layers kept in float32 only slow it, another "
        f"calibration leaves it as fast: searched where at most {SEARCH_FASTER:g}x)"
    )


def _no_faster(kept: list[str], mine: float, rival: Any, theirs: float) -> str:
    return (
        f"no further: with {', '.join(kept)} in float32 its p50 {mine:.4g} ms is no faster "
        f"than {rival.name}'s {theirs:.4g} ms"
    )


def serves_several(run: Preparation) -> bool:
    """Whether the run chooses at several batch sizes or callers (optimize(batch_sizes=...),
    concurrency > 1): a candidate slower on the sample may still win at another."""
    several = run.precision is not None and run.precision.batch_sizes
    return bool(several) or run.options.concurrency > 1


def _attempt(
    state: Candidate, run: Preparation, isolation: Isolation, stage: Callable, variant: Any
) -> Judgement | str | None:
    """Prepare, verify and judge `variant` in the candidate's place; None where it passed (it
    then replaces the candidate's backend), else the gate's verdict, or why it was not judged
    in one line."""
    trial = _verified(state, run, isolation, stage, variant)
    if isinstance(trial, str):
        return trial
    verdict = _judged(state, run, isolation, stage, trial)
    if verdict is None:
        _accept(state, variant)
        return None
    _close(variant)
    return verdict


def _reason(verdict: Judgement | str) -> str:
    return verdict if isinstance(verdict, str) else verdict.reason


def _shortfall(verdict: Judgement | str | None) -> float:
    """How far a failed verdict is from passing, to compare two methods' on one gate: the
    bound of the metric's drop (accuracy=), else the relative error (the agreement rule);
    infinite where it was not judged."""
    if not isinstance(verdict, Judgement):
        return math.inf
    if verdict.drop_bound is not None:
        return verdict.drop_bound
    return verdict.details.get("relative_error", math.inf)


def _verified(
    state: Candidate,
    run: Preparation,
    isolation: Isolation,
    stage: Callable,
    variant: Any,
    what: str | None = None,
) -> Candidate | str:
    """`variant` prepared and verified in the candidate's place, its gate not yet run: the
    trial, or why not in one line (the variant then closed). `what`: the variant in words
    for the progress line (its settings where None)."""
    trial = Candidate(variant, CandidateResult(variant.name, "ok", precision=variant.precision))
    trial.deadline = state.deadline
    run.progress.say(f"{state.name}: trying {what or _settings(variant)}")
    try:
        stage(
            trial, run, "quantization", f"{state.name}: quantizing again",
            lambda: isolation.call(lambda: variant.prepare(run.target), state.deadline,
                                   "prepare"),
        )  # fmt: skip
        first_call_and_verify(trial, run, isolation, stage)
    except Mismatch as exc:  # its outputs' structure: no gate can pass it
        _copy_errors(state.result, trial.result)
        _close(variant)
        return str(exc)
    except Exception as exc:  # a variant that fails is one more thing tried
        _close(variant)
        return f"failed: {one_line(exc)}"
    return trial


def _judged(
    state: Candidate, run: Preparation, isolation: Isolation, stage: Callable, trial: Candidate
) -> Judgement | str | None:
    """The gate on a verified variant (`_verified`): None where it passed, else its verdict
    (a string where the gate itself failed). Its errors and verdict are the candidate's."""
    try:
        judge_candidate(trial, run, isolation, stage)
    except Mismatch as exc:
        _copy_errors(state.result, trial.result)
        return exc.judgement if exc.judgement is not None else str(exc)  # falsy: failed
    except Exception as exc:
        return f"failed: {one_line(exc)}"
    _copy_errors(state.result, trial.result)
    return None


def _close(variant: Any) -> None:
    with contextlib.suppress(Exception):
        variant.close()


def _accept(state: Candidate, variant: Any) -> None:
    """`variant` is the candidate now: the default it replaces is closed."""
    _close(state.backend)
    state.backend = variant


def _copy_errors(result: CandidateResult, trial: CandidateResult) -> None:
    """The last variant's verdict and errors are the candidate's."""
    for key in (
        "max_abs_err", "max_rel_err", "gate", "metric", "reference_metric", "metric_drop",
        "metric_drop_bound", "max_drop", "quantization", "first_call_ms", "reason",
    ):  # fmt: skip
        setattr(result, key, getattr(trial, key))


def _diverging(errors: dict[str, float]) -> str:
    """Where quantization first diverges from float32, in words: the first layer (in the
    graph's order) adding more than DIVERGES relative error, and the one adding the most."""
    first = next((scope for scope, e in errors.items() if e > DIVERGES), None)
    worst = max(errors, key=errors.get) if errors else None
    if worst is None:
        return "no quantized layer found to rank"
    words = f"the layer adding the most error is {worst} ({errors[worst]:.2g} relative)"
    if first is not None and first != worst:
        words = f"the first layer whose int8 output diverges is {first}; " + words
    return words


def _layer_errors(run: Preparation) -> dict[str, float]:
    """The error each quantized layer (name scope) adds, in the graph's order: ranked once
    per run, for the first search (the searches run one after another)."""
    if run.layer_errors is None:
        inputs = ranking_inputs(run.target)
        try:
            run.layer_errors = layer_errors(*inputs)
        except Exception as exc:  # no ranking: no layer is kept (said in the reason)
            run.progress.say(f"its layers could not be ranked: {one_line(exc)}")
            run.layer_errors = {}
    return run.layer_errors


def ranking_inputs(target: Target) -> tuple[Any, Any, list[dict[str, np.ndarray]]]:
    """What the layers are ranked on (precision/layers.py `layer_errors`): the float32
    export,
    its static int8 form, and the first RANKING_SAMPLES calibration samples."""
    exported = export_onnx(target)
    try:
        quantized = shared(target, "onnx-int8-static")
    except Exception:  # its own quantization failed: one made here for the ranking
        quantized = static_int8(target)
    return exported, quantized, target.calibration_feeds(exported.input_names, RANKING_SAMPLES)


def rivals(run: Preparation) -> list[Any]:
    """The candidates verified so far (any precision: a quantized one passed its gate) that
    may be the fastest: those whose verification calls took at most RIVALS_WITHIN times the
    fastest's (a few calls each, some of them cold: a ranking too loose to pick one by)."""
    estimates = {
        name: seconds for name, seconds in run.call_estimates.items() if name in run.contenders
    }
    if not estimates:
        return []
    fastest = min(estimates.values())
    return [run.contenders[n] for n, s in estimates.items() if s <= RIVALS_WITHIN * fastest]


def raced(
    state: Candidate, run: Preparation, stage: Callable, variant: Any, rivals: list[Any]
) -> tuple[float | None, Any, float]:
    """`race` run as the candidate's "timing" stage (`stage`: this thread's or the
    background's), what its search and a gate where memory is tight do before they judge."""
    return stage(
        state, run, "timing", f"{state.name}: timing it against the fastest verified ones",
        lambda: race(variant, rivals, run),
    )  # fmt: skip


def race(variant: Any, rivals: list[Any], run: Preparation) -> tuple[float | None, Any, float]:
    """`variant` timed interleaved with `rivals` on the sample: its p50 ms, the fastest
    rival, and that one's p50 ms (None and inf without rivals)."""
    p50 = time_together([variant, *rivals], run)
    timed = [b for b in rivals if p50.get(b.name) is not None]
    if not timed:
        return p50.get(variant.name), None, math.inf
    best = min(timed, key=lambda b: p50[b.name])
    return p50.get(variant.name), best, p50[best.name]


def time_together(backends: list[Any], run: Preparation) -> dict[str, float]:
    """Each backend's p50 ms on the sample, all timed interleaved (TIMING_S, 3 rounds at
    least); none for one whose calls failed."""
    sample = run.checks[0].inputs
    with run.exclusive.timing():
        measured = measure_interleaved(
            {b.name: (lambda b=b: b.run(sample)) for b in backends},
            budget_s=TIMING_S,
            min_rounds=3,
            cooldown_s={b.name: b.cooldown_s for b in backends},
        )
    return {name: s.p50 for name, s in measured.stats.items() if s.p50 is not None}


def _settings(backend: Any) -> str:
    return backend.precision_note or backend.name


def _summary(tried: list[str]) -> str:
    return "no quantization passed the gate: " + "; ".join(tried)
