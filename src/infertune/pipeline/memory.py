"""Admission by memory: a candidate is tried only where it, its conversions not built yet and
its rehearsal fit in the memory left; else it is `skipped` with the estimate, never left to
be killed for memory.

Estimates are the weights times each runtime's `Backend.memory_factor`, and each conversion's
peak: what earlier runs on this machine measured (pipeline/machine.py), else the registry's copies
of
the weights (export/registry.py `memory`, measured on a BERT-base-sized model).

What was measured is split in two, so that small models do not decide for large ones: a run
on a model of at least LEARN_PER_BYTE_MIN_BYTES of weights says how many copies of the weights
the conversion makes (per byte: the most seen), a run on a smaller one only what it costs
whatever the weights (a fixed cost: its peak less the copies). The estimate for W bytes is
fixed + copies x W. Learned as one factor, thirty small and mid-sized models had taught
"14.9 copies" (their fixed costs over their tiny weights) and a 2.56 GB embedding model had
its ONNX Runtime and OpenVINO skipped for 39.5 GB, where its export peaked at 1.1x.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..export.registry import CONVERSIONS
from ..model.sizes import (
    LEAN_CONVERSION_MIN_BYTES,
    MEMORY_RESERVE_BYTES,
    ModelSize,
)
from ..model.target import Target
from ..system.resources import available_bytes
from ..system.settings import memory_limit_bytes
from .context import skip
from .machine import MachineRecord
from .tournament import KEEP_AT_ONCE

if TYPE_CHECKING:
    from .context import Candidate, Preparation

__all__ = [
    "LEARN_PER_BYTE_MIN_BYTES",
    "conversion_bytes",
    "conversion_memory_learned",
    "fits_memory",
    "memory_budget",
    "memory_key",
]


# Weights from which a run's peak teaches the copies of the weights a conversion makes: below
# it its fixed costs (the converter's own structures, its libraries' first allocations) weigh
# more than the weights do. The conversions' large-model paths start there too.
LEARN_PER_BYTE_MIN_BYTES = LEAN_CONVERSION_MIN_BYTES


def memory_budget() -> int | None:
    """Bytes the candidates may hold in all: what the machine has free now (Linux's
    MemAvailable; at most INFERTUNE_MEMORY_BYTES), less MEMORY_RESERVE_BYTES; None where
    neither is known."""
    free = available_bytes()
    limit = memory_limit_bytes()  # INFERTUNE_MEMORY_BYTES
    if limit is not None:
        free = limit if free is None else min(free, limit)
    return None if free is None else max(0, free - MEMORY_RESERVE_BYTES)


def memory_key(key: str, weights: int) -> str:
    """The name the conversion `key`'s memory is learned and estimated under: key + "-child"
    where it runs in a child process of its own at this size, whose peak says nothing of one
    in this process, nor the other way round (learned as one, a BERT-base-sized model's 4.2x
    in this process had a 2.46 GB recommender's LiteRT skipped for 14 GB it would not have
    needed)."""
    conversion = CONVERSIONS.get(key)
    if conversion is not None and conversion.in_child and conversion.in_child(ModelSize(weights)):
        return f"{key}-child"
    return key


def conversion_memory_learned(target: Target) -> dict[str, tuple[int, int]]:
    """This run's conversions' (weights, peak) in bytes, under memory_key's names."""
    weights = target.weights_measured or 0
    if not weights:
        return {}
    peaks = target.conversions.memory_peaks
    return {memory_key(key, weights): (weights, peak) for key, peak in peaks.items()}


def conversion_bytes(key: str, record: MachineRecord | None, weights: int) -> tuple[float, str]:
    """Bytes the conversion `key` holds at its peak for `weights` bytes of weights, and where
    the figure comes from, in words: fixed + copies x weights, as learned on this machine
    (see the module's doc), else the registry's copies."""
    name = memory_key(key, weights)
    conversion = CONVERSIONS.get(key)
    if conversion is None:  # a key of a user's own backend
        copies = 1.0
    elif name != key and conversion.memory_in_child is not None:
        copies = conversion.memory_in_child
    else:
        copies = conversion.memory
    runs = record.memory_runs(name) if record is not None else []
    large = [peak / w for w, peak in runs if w >= LEARN_PER_BYTE_MIN_BYTES]
    learned = bool(large)
    if large:
        copies = max(large)
    small = [peak - copies * w for w, peak in runs if w < LEARN_PER_BYTE_MIN_BYTES]
    fixed = max([0.0, *small])
    how = f"{copies:.1f}x the weights"
    if learned or fixed:
        learned_from = len(large) + len(small)
        how += f" + {fixed / 1e9:.2f} GB" if fixed else ""
        how += f", learned from {learned_from} earlier run(s) here"
    return fixed + copies * weights, how


def fits_memory(state: Candidate, run: Preparation, states: list[Candidate]) -> bool:
    """Whether the candidate, its conversions not built yet, and its rehearsal (the child
    holds it once more while this process holds the others) fit in the memory left once the
    candidates admitted before it hold theirs; if not, it is `skipped` with the estimate."""
    budget, target = run.memory_budget, run.target
    if budget is None or (target.source is None and target.weights_measured is None):
        return True
    try:
        weights = target.weights_bytes()
    except Exception:  # the trace fails: the candidate's own stages will say why
        return True
    backend = state.backend
    holding = sorted(
        (
            s.backend.memory_factor * weights
            for s in states
            if s is not state and s.result.status == "ok" and s.holds_memory
        ),
        reverse=True,
    )
    # Where memory is tight, KEEP_AT_ONCE verified candidates are held at a time
    # (tournament.py).
    tight = run.memory_tight is not None
    held = sum(holding[:KEEP_AT_ONCE] if tight else holding)
    own = backend.memory_factor * weights
    conversions = [k for k in backend.conversions if k not in target.conversions.built()]
    compiling = backend.compile_memory_factor * weights
    estimates = [conversion_bytes(k, run.record, weights) for k in conversions]
    converting = sum(need for need, _ in estimates)
    transient = max([converting, compiling] + ([own] if run.isolation.rehearses(backend) else []))
    need = held + own + transient
    if tight:
        # No session or XLA compile in this process while the conversions run (only one
        # candidate, in the rehearsal child, may hold its copy meanwhile); after them, the
        # one kept, this one, and its compile.
        need = max(converting + (holding[0] if holding else 0.0), held + own + compiling)
    if need <= budget:
        state.holds_memory = True  # from here on its memory counts for those after it
        return True
    parts = [f"{backend.memory_factor:g}x the weights' {weights / 1e9:.2f} GB for its runtime"]
    if conversions:
        during = f"while the {', '.join(conversions)} conversion runs"
        basis = "; ".join(f"{k}: {how}" for k, (_, how) in zip(conversions, estimates))
        parts.append(f"{transient / weights:.1f}x {during} ({basis})")
    elif transient == compiling and compiling:
        parts.append(f"{backend.compile_memory_factor:g}x more while it compiles")
    elif transient:
        parts.append("once more while it is rehearsed in the child process")
    if held or (tight and holding):
        parts.append("what the candidates before it hold beside it")
    learned = any("learned" in how for _, how in estimates)
    ignore = "; INFERTUNE_MACHINE_FILE=off ignores what was learned" if learned else ""
    return skip(
        state,
        run,
        f"needs about {need / 1e9:.1f} GB of memory at its peak ({'; '.join(parts)}); "
        f"the candidates may have {budget / 1e9:.1f} GB of what was free when tuning "
        f"began{ignore}",
    )
