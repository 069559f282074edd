"""What the preparation of every candidate shares (`Preparation`), and one candidate on its way
through its stages (`Candidate`): the values the parts of the preparing stage pass between
them (preparing.py the scheduler, verifying.py, budget.py, memory.py, tournament.py,
offload.py), so that each takes one argument instead of a list of them.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..backends import Backend
from ..backends.base import RunFacts
from ..report import CandidateResult
from .exclusive import Exclusive

if TYPE_CHECKING:  # the values it carries; the modules that use them import them
    import numpy as np

    from ..model.target import Target
    from ..options import Options
    from ..precision.gate import PrecisionData
    from ..report.progress import Progress
    from .budget import Budget
    from .isolation import Isolation, Rehearsal
    from .machine import MachineRecord
    from .planning import Probe
    from .reference import Check
    from .verifying import Mismatch

__all__ = ["Candidate", "Preparation", "skip"]


@dataclass
class Candidate:
    """A candidate on its way through its stages."""

    backend: Backend
    result: CandidateResult
    stage: str = "conversion"
    deadline: float = math.inf  # of its current phase (candidate_timeout_s, the budget)
    rehearsal: Rehearsal | None = None
    future: Future | None = None  # what the background thread does for it
    seconds: dict[str, float] = field(default_factory=dict)  # its own, by stage
    estimate: tuple[float, str] | None = None
    holds_memory: bool = False  # admitted by memory: it counts against those after it
    dropped: bool = False  # verified, then closed before the measurement (tight memory)
    # A quantized candidate whose first quantization failed the gate: the verdict its search
    # for one that passes starts from (precision.py), once every candidate has had its first.
    failed_gate: Mismatch | None = None
    # A reduced-precision candidate's (outputs, the model's) on each check: what the
    # agreement rule judges, kept from its verification to its gate.
    checked: list[tuple[list[np.ndarray], list[np.ndarray]]] | None = None

    @property
    def name(self) -> str:
        return self.backend.name


@dataclass
class Preparation:
    """What every candidate's preparation shares: given by tune.py, filled in as it goes."""

    target: Target
    checks: list[Check]
    options: Options
    progress: Progress
    isolation: Isolation
    budget: Budget
    probe: Probe | None = None
    record: MachineRecord | None = None
    facts: RunFacts = field(default_factory=RunFacts)  # what not_worth_trying weighs
    contenders: dict[str, Backend] = field(default_factory=dict)  # verified, by name
    call_estimates: dict[str, float] = field(default_factory=dict)  # s per call, sample batch
    estimates: dict[str, float] = field(default_factory=dict)  # planned seconds, by name
    started: int = 0  # candidates started besides the reference
    memory_budget: int | None = None  # bytes the candidates may hold in all (None: unknown)
    # Where memory is tight: the verified candidates that copy the weights, still held for
    # the measurement (tournament.py).
    alive: list[Candidate] = field(default_factory=list)
    # What the tournament times them on: with traffic=, requests at lengths spread over the
    # traffic (traffic_plan.py `tournament_requests`); None: the sample.
    tournament_requests: list[list[np.ndarray]] | None = None
    # With traffic= served by batch size alone (no buckets), where only the fastest few are
    # timed at the tuned batch sizes besides the sample's: those sizes. A candidate that
    # compiles for each shape (XLA) leaves its checks at them to the measurement, which runs
    # them where it times the candidate there (measuring.py), in `deferred_checks`.
    deferred_batches: frozenset[int] = frozenset()
    deferred_checks: dict[str, list[Check]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set once this thread has made every conversion: a tournament waits for it, so that no
    # conversion competes for the cores with the candidates it times.
    converted: threading.Event = field(default_factory=threading.Event)
    states: list[Candidate] = field(default_factory=list)  # every candidate but the reference
    # What reduced-precision candidates are judged by (precision/gate.py); None: no data was given.
    precision: PrecisionData | None = None
    # The reduced-precision candidates verified, whose gate waits for every candidate's
    # first verdict; the quantized ones whose search waits for every gate's verdict.
    to_judge: list[Candidate] = field(default_factory=list)
    to_search: list[Candidate] = field(default_factory=list)
    # p50 ms on the sample of those to judge and the fastest float32 candidates, timed
    # together before the gates: the order of the gates and the searches (a candidate that
    # passes its search with layers kept in float32: its p50 with them, precision.py).
    sample_p50: dict[str, float] = field(default_factory=dict)
    # The model's predictions on the labelled data being made in a thread of their own by a
    # verified float32 candidate (preparing.py `_predict_early`): its name, their future.
    predicting: tuple[str, Future] | None = None
    # The error each quantized layer adds (precision.py `_layer_errors`): ranked for the
    # first search that keeps layers in float32, read by the next (the same export, the same
    # calibration: 6 s each on the BERT-sized encoder, three searches).
    layer_errors: dict[str, float] | None = None
    # The turns of work and timing (exclusive.py): no work of the run beside a timing.
    exclusive: Exclusive = field(default_factory=Exclusive)

    @property
    def memory_tight(self) -> str | None:
        """Why memory is tight for this model here (Target.memory_tight), None where not."""
        return self.target.memory_tight

    def contenders_at_most(self) -> int:
        """How many candidates the measurement will have, at most, as far as is known now."""
        return self.started + 1  # the reference among them

    def deadline(self) -> float:
        """The deadline of a phase that starts now: candidate_timeout_s's, or the budget's end
        where sooner (stages in a worker thread can be abandoned; with isolation 'off', none)."""
        deadline = self.isolation.deadline()
        if self.budget.limited and self.isolation.mode != "off":
            deadline = min(deadline, self.budget.candidates_end(self.contenders_at_most()))
        return deadline


def skip(state: Candidate, run: Preparation, reason: str) -> bool:
    """The candidate is `skipped` for `reason`, said in the progress; False (not admitted)."""
    state.result.status, state.result.reason = "skipped", reason
    run.progress.say(f"{state.name}: skipped, {reason}")
    return False
