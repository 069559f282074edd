"""What earlier optimize() runs learned about this machine, kept between runs.

Two things, both costly or impossible to know at the start of a run: the machine's float32
peak (a matrix product timed for about a second: the diagnosis needs it, and it does not
change while the machine and its libraries stay the same), and what tuning costs and chooses
here (how far each stage's estimate was off, which candidates won): what a time budget's
order and skips are planned from (planning.py).

One small JSON file per user: $INFERTUNE_MACHINE_FILE, else
$XDG_CACHE_HOME/infertune/machine.json (~/.cache/infertune/machine.json). Entries are keyed by
the environment fingerprint (CPU, cores, Python, package versions, thread variables), so a
new TensorFlow or another CPU starts afresh. INFERTUNE_MACHINE_FILE=off keeps nothing. A file
that cannot be read or written is ignored: it only ever saves time.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..system.settings import machine_file

__all__ = ["MEMORY_RUNS", "PEAK_EVERY", "MachineRecord"]

# 2: a candidate's estimate counts its calls at the runtime's likely speed, not the model's
# eager call (planning.Probe.runtime_call_s): corrections learned before would misapply.
# 3: a calibrated conversion's estimate counts its calibration samples at the model's
# arithmetic (planning.raw_conversion_s); NNCF's learned 3x of the old estimate would misapply.
# 4: TFLite's full int8 quantizes the shared float32 conversion (its cost no longer holds one).
_VERSION = 4
_EMA = 0.5  # weight of the newest run in a learned correction: follows a changed load fast
PEAK_EVERY = 10  # runs between two measurements of the peak
MEMORY_RUNS = 8  # a conversion's measured peaks kept, the newest


class MachineRecord:
    """This machine's entry (for one environment fingerprint): read once, written on save()."""

    def __init__(self, fingerprint: str, path: Path | None = None):
        self.fingerprint = fingerprint
        self.path = machine_file() if path is None else path
        self.data: dict[str, Any] = self._read().get(fingerprint, {})

    def _read(self) -> dict:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return {}
        entries = data.get("machines")
        return entries if isinstance(entries, dict) else {}

    # -- the float32 peak ------------------------------------------------------------------
    @property
    def peak_gflops(self) -> float | None:
        """The peak measured before, or None when it is (again) time to measure it: every
        PEAK_EVERY-th run measures anew, and the highest measurement is kept, so that one
        measurement on a busy machine does not stand for good."""
        value = self.data.get("peak_gflops")
        if not (isinstance(value, int | float) and value > 0):
            return None
        if self.data.get("peak_uses", 0) >= PEAK_EVERY:
            return None
        return float(value)

    def use_peak(self) -> None:
        """Count a run that used the recorded peak."""
        self.data["peak_uses"] = self.data.get("peak_uses", 0) + 1

    def set_peak(self, gflops: float) -> None:
        """Record a measurement: the highest so far stands."""
        old = self.data.get("peak_gflops")
        best = max(float(gflops), float(old)) if isinstance(old, int | float) else float(gflops)
        self.data["peak_gflops"] = best
        self.data["peak_uses"] = 0

    # -- what tuning costs here ------------------------------------------------------------
    def correction(self, kind: str) -> float | None:
        """How much longer (>1) or shorter than estimated `kind` took here, learned from
        earlier runs; None before any run measured it."""
        value = self.data.get("corrections", {}).get(kind)
        return float(value) if isinstance(value, int | float) and value > 0 else None

    def learn_cost(self, kind: str, estimated_s: float, actual_s: float) -> None:
        """Fold one run's actual/estimated ratio into `kind`'s correction."""
        if estimated_s <= 0 or actual_s < 0:
            return
        ratio = max(0.05, min(20.0, actual_s / estimated_s))
        corrections = self.data.setdefault("corrections", {})
        old = corrections.get(kind)
        corrections[kind] = ratio if old is None else (1 - _EMA) * old + _EMA * ratio

    def memory_runs(self, conversion: str) -> list[tuple[int, int]]:
        """(weights, peak) in bytes of `conversion`'s last MEMORY_RUNS runs here: its peak
        above what the process held when it began, for a model of that many bytes of weights
        (pipeline/memory.py estimates from them)."""
        runs = self.data.get("memory_runs", {}).get(conversion, [])
        return [
            (int(w), int(p))
            for w, p in runs
            if isinstance(w, int | float) and isinstance(p, int | float) and w > 0 and p >= 0
        ]

    def learn_memory(self, conversion: str, weights: int, peak: int) -> None:
        """Keep one run's measured peak (bytes above what was held) for its weights."""
        if not (weights > 0 and peak >= 0):
            return
        # Factors learned before 2026-11-26 ("memory"), one number whatever the size: small
        # models' fixed costs over their tiny weights (15x) skipped a 2.56 GB model's best
        # candidates. They say nothing of the size they came from: dropped.
        self.data.pop("memory", None)
        runs = self.data.setdefault("memory_runs", {}).setdefault(conversion, [])
        runs.append([int(weights), int(peak)])
        del runs[:-MEMORY_RUNS]

    def wins(self, regime: str) -> dict[str, int]:
        """{candidate family: runs it was chosen in} for models of this regime."""
        return dict(self.data.get("wins", {}).get(regime, {}))

    def learn_win(self, regime: str, family: str) -> None:
        by_regime = self.data.setdefault("wins", {}).setdefault(regime, {})
        by_regime[family] = by_regime.get(family, 0) + 1

    def save(self) -> None:
        """Write this entry back, keeping the others; atomic (a rename), errors ignored."""
        if self.path is None:
            return
        entries = self._read()
        entries[self.fingerprint] = self.data
        text = json.dumps({"version": _VERSION, "machines": entries}, indent=1, sort_keys=True)
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".machine-")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(tmp, self.path)
        except OSError:  # a read-only home: the record only ever saves time
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
