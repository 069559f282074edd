"""optimize()'s time budget: its deadline, and whether a candidate's estimated cost still fits.

With a time budget, a candidate is started only when its estimated cost (planning.py) fits in
what is left after the measurement and the diagnosis have their share; one that does not is
`skipped`, and the report and the progress lines say how much it needed and how much was
left. A stage still running at the budget's end is abandoned (as at candidate_timeout_s) and
the candidate is `skipped`, said so (`BudgetOver`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .context import skip
from .planning import estimate_s, uninterruptible_s

if TYPE_CHECKING:
    from .context import Candidate, Preparation

__all__ = ["ESTIMATE_MARGIN", "Budget", "BudgetOver", "fits_time"]


@dataclass
class Budget:
    """optimize()'s time budget: its deadline (the model's own first call excluded) and what
    the work after the candidates needs (`after_s(contenders)`: measurement and diagnosis)."""

    time_budget_s: float | None
    deadline: float = math.inf
    after_s: Callable[[int], float] = lambda contenders: 0.0
    after_measurement_s: float = 0.0  # the diagnosis and the report, after the measurement

    @property
    def limited(self) -> bool:
        return self.time_budget_s is not None

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def candidates_end(self, contenders: int) -> float:
        """When the candidates' stages must be done, so that the measurement and the
        diagnosis of `contenders` candidates still fit before the deadline."""
        return self.deadline - self.after_s(contenders)


class BudgetOver(Exception):
    """The time budget ran out during (or before) a stage: the candidate is skipped."""


# A candidate starts only when its estimate times this fits: estimates made from one trace
# are off by 20-30% on a busy machine, and a candidate stopped at the budget's end has cost
# its time for nothing (its abandoned conversion even runs on beside the measurement). A
# conversion whose native step holds the GIL also needs room to overrun the budget's end by
# that step (export/registry.py `uninterruptible`): it cannot be abandoned before it returns.
ESTIMATE_MARGIN = 1.3


def fits_time(state: Candidate, run: Preparation, pending: list[Candidate]) -> bool:
    """Under a time budget: whether the candidate's estimated cost fits in what is left once
    the candidates already started and the work after them have their share; if not, it is
    `skipped` with the estimate."""
    budget = run.budget
    if not budget.limited:
        return True
    name = state.name
    if run.probe is None:  # nothing to estimate from: only the budget's end stops it
        if budget.left_s() > budget.after_s(len(run.contenders) + 1):
            return True
        return skip(state, run, f"not reached within time_budget_s={budget.time_budget_s:g}")
    built = run.target.conversions.built() | {k for s in pending for k in s.backend.conversions}
    seconds, how = estimate_s(state.backend, run.probe, built, run.record)
    state.estimate = (seconds, how)
    run.estimates[name] = seconds
    owed = sum(run.estimates.get(s.name, 0.0) for s in pending) * 0.3  # here, after
    after = budget.after_s(len(run.contenders) + len(pending) + 1)
    left = budget.left_s() - after - owed
    tail = uninterruptible_s(state.backend, run.probe, built, run.record)
    if seconds * ESTIMATE_MARGIN + tail <= left:
        return True
    unstoppable = f" and {tail:.1f} s its conversion cannot be stopped in" if tail else ""
    return skip(
        state,
        run,
        f"needs about {seconds:.1f} s ({how}; {seconds * ESTIMATE_MARGIN + tail:.1f} s with "
        f"the margin for estimates{unstoppable}); {max(0.0, left):.1f} s of time_budget_s="
        f"{budget.time_budget_s:g} were left for it (the measurement and the diagnosis keep "
        f"{after:.1f} s)",
    )
