"""Where optimize()'s own time went: every stage, shared or one candidate's, in seconds.

Tuning is a wait a user feels each time the model changes, so the report says what it was
spent on. Stages are intervals of the calling thread's wall clock and do not overlap: a
shared conversion built while a candidate was being converted (the ONNX export inside the
first ONNX Runtime candidate) counts as the shared stage, not as that candidate's. Work done
meanwhile in the rehearsal child process is not on that clock: the parent's wait for it is
the candidate's `rehearsal` stage, and the child's own seconds are kept apart
(`background`). So the stages add up to the run's total, and `other_s` is the rest (the
bookkeeping between stages).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CANDIDATE_STAGES", "StageTimes"]

# A candidate's own stages, in pipeline order. "conversion": what convert() builds for it
# alone (shared conversions are stages of their own); "rehearsal": the wait for the child
# process that compiled and ran it first; "compile": prepare() in this process; "first
# call": its first call, on the sample; "verification": its calls on the other
# verification inputs and the comparisons; "waiting": the wait for its first call and
# verification done in the background thread.
CANDIDATE_STAGES = (
    "conversion",
    "rehearsal",
    "compile",
    "first call",
    "verification",
    "waiting",
)


@dataclass
class StageTimes:
    """Seconds per stage: `shared` (model load, reference, verification inputs, each shared
    conversion, warm-up, measurement, diagnosis, ...) and `candidates` (name -> stage ->
    seconds). `background`: name -> stage -> seconds of work done off the calling thread's
    clock (the rehearsal child process, the background thread), overlapped with the stages
    above and not part of their sum."""

    shared: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, dict[str, float]] = field(default_factory=dict)
    background: dict[str, dict[str, float]] = field(default_factory=dict)
    total_s: float = 0.0

    def add(self, stage: str, seconds: float, candidate: str | None = None) -> None:
        """Add `seconds` to a stage (a stage met again accumulates)."""
        seconds = max(0.0, seconds)  # a clock never runs backwards; rounding may
        where = self.shared if candidate is None else self.candidates.setdefault(candidate, {})
        where[stage] = where.get(stage, 0.0) + seconds

    def add_background(self, candidate: str, seconds: float, stage: str) -> None:
        where = self.background.setdefault(candidate, {})
        where[stage] = where.get(stage, 0.0) + max(0.0, seconds)

    def candidate_s(self, name: str) -> float:
        return sum(self.candidates.get(name, {}).values())

    @property
    def shared_s(self) -> float:
        return sum(self.shared.values())

    @property
    def candidates_s(self) -> float:
        return sum(self.candidate_s(name) for name in self.candidates)

    @property
    def accounted_s(self) -> float:
        return self.shared_s + self.candidates_s

    @property
    def other_s(self) -> float:
        """The part of the total that no stage holds (bookkeeping between stages)."""
        return max(0.0, self.total_s - self.accounted_s)

    def summary(self, items: int = 6) -> str:
        """Two lines: the largest shared stages and the costliest candidates."""
        shared = sorted(self.shared.items(), key=lambda kv: -kv[1])
        listed = ", ".join(f"{stage} {s:.1f}" for stage, s in shared[:items])
        if len(shared) > items:
            listed += f", {len(shared) - items} more {sum(s for _, s in shared[items:]):.1f}"
        costly = sorted(self.candidates, key=lambda name: -self.candidate_s(name))
        parts = []
        for name in costly[:items]:
            stages = self.candidates[name]
            top, top_s = max(stages.items(), key=lambda kv: kv[1])
            parts.append(f"{name} {self.candidate_s(name):.1f} ({top} {top_s:.1f})")
        if len(costly) > items:
            rest = sum(self.candidate_s(name) for name in costly[items:])
            parts.append(f"{len(costly) - items} more {rest:.1f}")
        lines = [
            f"time: {self.total_s:.1f} s in all = shared {self.shared_s:.1f} s + candidates "
            f"{self.candidates_s:.1f} s + other {self.other_s:.1f} s",
            f"  shared (s): {listed or 'none'}",
            f"  candidates (s): {', '.join(parts) or 'none'}",
        ]
        if self.background:
            by_stage: dict[str, float] = {}
            for stages in self.background.values():
                for stage, seconds in stages.items():
                    by_stage[stage] = by_stage.get(stage, 0.0) + seconds
            listed = ", ".join(f"{stage} {s:.1f}" for stage, s in by_stage.items())
            lines.append(f"  meanwhile, overlapped, not in the sum (s): {listed}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "total_s": self.total_s,
            "shared_s": dict(self.shared),
            "candidates_s": {name: dict(stages) for name, stages in self.candidates.items()},
            "background_s": {name: dict(stages) for name, stages in self.background.items()},
            "other_s": self.other_s,
        }

    @classmethod
    def from_dict(cls, data: dict) -> StageTimes:
        return cls(
            shared=dict(data.get("shared_s", {})),
            candidates={k: dict(v) for k, v in data.get("candidates_s", {}).items()},
            background={k: dict(v) for k, v in data.get("background_s", {}).items()},
            total_s=float(data.get("total_s", 0.0)),
        )
