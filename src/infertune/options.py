"""optimize()'s tuning options: one typed value, checked once at the front door.

The pipeline reads them from here; save() and the tuning cache keep the part that decides
the result (`saved()`), and a re-tune starts from that part again (`from_saved()`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .accuracy import Accuracy
from .backends import Backend
from .backends.registry import BACKENDS
from .errors import OptionError
from .model.traffic import Traffic
from .system import settings

__all__ = [
    "DEFAULTS",
    "ISOLATIONS",
    "OBJECTIVES",
    "PRECISIONS",
    "REFERENCES",
    "OPTION_NAMES",
    "REFERENCE_NAMES",
    "Options",
    "known_backends",
]

# Every option's choices and default are here, once: optimize(), Options.checked and the
# command line (cli/options.py) read them from this module.
OBJECTIVES = ("latency", "throughput")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
ISOLATIONS = ("process", "thread", "off")
# What candidates are verified against: the model's eager call model(x), or its traced graph
# (tf.function(model): what model.predict() and model.export() compute).
REFERENCES = ("eager", "traced")
# The model's own call: always measured, as the reference, whatever `backends` names.
REFERENCE_NAMES = ("keras-eager", "original")
MAX_CONCURRENCY = 256  # threads measuring one candidate at once: far past a 2-core machine


def known_backends() -> list[str]:
    """Names of the candidate backends infertune knows (whether or not they can run here)."""
    return ["keras-eager", *BACKENDS]


@dataclass(frozen=True)
class Options:
    """What optimize() was asked for, checked. Build it with `Options.checked(...)`."""

    rtol: float = 1e-3
    atol: float = 1e-5
    objective: str = "latency"
    time_budget_s: float | None = None
    precision: tuple[str, ...] = ("fp32",)
    # The candidates asked for besides the reference (names or Backend instances), in order;
    # None: every registered one.
    backends: tuple[str | Backend, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None  # sorted, unique; None: the sample's only
    latency_budget_ms: float | None = None
    concurrency: int = 1  # callers calling the result at once, as a service's threads do
    isolation: str = "process"
    candidate_timeout_s: float | None = 300.0  # a TensorRT engine build can take minutes
    reference: str = "eager"
    # Reduced precision: representative inputs the quantizers calibrate on (arrays, a dict of
    # arrays, a tf.data.Dataset or an iterable of batches; precision/data.py), and the task it is
    # judged by (accuracy.Accuracy; None: the agreement rule).
    calibration: Any = field(default=None, compare=False)
    accuracy: Accuracy | None = field(default=None, compare=False)
    started: float = field(default_factory=time.perf_counter)  # when the budget started
    # A digest of the calibration and labelled data, once read (pipeline/tune.py): part of
    # what decides the result (the tuning cache's key).
    data_digest: str | None = None
    # A sample of real requests (model/traffic.py), the value padding writes (one for every
    # input, or by input name) and the free dimensions named by the user (None: found).
    traffic: Any = field(default=None, compare=False)
    pad_value: Any = 0
    free_dims: Any = None
    # The traffic's digest once read: its dimensions and the distribution of their sizes.
    traffic_digest: str | None = None

    @classmethod
    def checked(cls, **given: Any) -> Options:
        """The options as optimize() takes them (by name; any left out takes its default,
        the field's above), checked; OptionError says what is wrong."""
        unknown = sorted(set(given) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; the options are {list(OPTION_NAMES)}")
        values = {name: getattr(DEFAULTS, name) for name in OPTION_NAMES} | given
        rtol, atol, objective = values["rtol"], values["atol"], values["objective"]
        time_budget_s, precision = values["time_budget_s"], values["precision"]
        latency_budget_ms, concurrency = values["latency_budget_ms"], values["concurrency"]
        isolation, reference = values["isolation"], values["reference"]
        candidate_timeout_s = values["candidate_timeout_s"]
        _check_reduced(values["precision"], values["calibration"], values["accuracy"])
        _check_traffic(values["traffic"], values["pad_value"], values["free_dims"])
        numbers = isinstance(rtol, int | float) and isinstance(atol, int | float)
        if not (numbers and rtol >= 0 and atol >= 0):
            raise OptionError(
                f"rtol and atol must be numbers >= 0. Received: rtol={rtol!r}, atol={atol!r}."
            )
        _check_choice("objective", objective, OBJECTIVES)
        _check_positive_or_none("time_budget_s", time_budget_s)
        allowed = (precision,) if isinstance(precision, str) else tuple(precision)
        if not allowed or any(p not in PRECISIONS for p in allowed):
            raise OptionError(
                f"precision must be a subset of {PRECISIONS}. Received: {precision!r}."
            )
        _check_choice("isolation", isolation, ISOLATIONS)
        _check_choice("reference", reference, REFERENCES)
        _check_positive_or_none("candidate_timeout_s", candidate_timeout_s)
        _check_positive_or_none("latency_budget_ms", latency_budget_ms)
        if latency_budget_ms is not None and objective != "throughput":
            raise OptionError(
                f"latency_budget_ms applies to objective='throughput' (the most samples/s "
                f"whose p99 stays within the budget); objective={objective!r} already chooses "
                f"the lowest latency. Received: latency_budget_ms={latency_budget_ms!r}."
            )
        whole = isinstance(concurrency, int | np.integer) and not isinstance(concurrency, bool)
        if not (whole and 1 <= concurrency <= MAX_CONCURRENCY):
            raise OptionError(
                f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}: how many callers "
                f"call the result at once (a service's worker threads). Received: "
                f"concurrency={concurrency!r}."
            )
        return cls(
            rtol=rtol,
            atol=atol,
            objective=objective,
            time_budget_s=time_budget_s,
            precision=allowed,
            backends=_checked_backends(values["backends"]),
            batch_sizes=_checked_batch_sizes(values["batch_sizes"]),
            latency_budget_ms=latency_budget_ms,
            concurrency=int(concurrency),
            isolation=isolation,
            candidate_timeout_s=candidate_timeout_s,
            reference=reference,
            calibration=values["calibration"],
            accuracy=values["accuracy"],
            traffic=values["traffic"],
            pad_value=values["pad_value"],
            free_dims=values["free_dims"],
        )

    @property
    def requested(self) -> list[str] | None:
        """The names of the candidates asked for (None: all), as save() and the cache keep them."""
        if self.backends is None:
            return None
        return [b.name if isinstance(b, Backend) else b for b in self.backends]

    def saved(self) -> dict:
        """The options that decide the tuned result, as JSON (for save() and the cache key);
        the time budget only decides how long it may take. `reference` only where it is not
        the default, so that the keys of results tuned before it existed stay the same."""
        saved = {
            "rtol": self.rtol,
            "atol": self.atol,
            "objective": self.objective,
            "precision": sorted(self.precision),
            "batch_sizes": list(self.batch_sizes) if self.batch_sizes else None,
            "latency_budget_ms": self.latency_budget_ms,
            "concurrency": self.concurrency,
            "backends": self.requested,
        }
        if self.reference != "eager":
            saved["reference"] = self.reference
        if self.accuracy is not None:
            saved["accuracy"] = self.accuracy.settings()
        if self.data_digest is not None:
            saved["data"] = self.data_digest
        if self.traffic_digest is not None:
            saved["traffic"] = self.traffic_digest
            saved["pad_value"] = self.pad_value
            saved["free_dims"] = self.free_dims
            if isinstance(self.traffic, Traffic):  # its sizes: a re-tune reads them again
                saved["traffic_sizes"] = self.traffic.to_dict()
        return saved

    @classmethod
    def from_saved(cls, saved: dict) -> Options:
        """The options `saved()` wrote (a saved result's, a cache entry's), checked again."""
        return cls.checked(
            backends=saved.get("backends"),
            rtol=saved["rtol"],
            atol=saved["atol"],
            objective=saved["objective"],
            precision=tuple(saved["precision"]),
            batch_sizes=saved.get("batch_sizes"),
            latency_budget_ms=saved.get("latency_budget_ms"),
            concurrency=saved.get("concurrency", 1),
            reference=saved.get("reference", "eager"),
            traffic=Traffic.from_dict(saved["traffic_sizes"]) if "traffic_sizes" in saved else None,
            pad_value=saved.get("pad_value", 0),
            free_dims=saved.get("free_dims"),
        )

    @property
    def deadline(self) -> float:
        """perf_counter() at which time_budget_s runs out (inf without one)."""
        return math.inf if self.time_budget_s is None else self.started + self.time_budget_s

    def measure_budget(
        self, batch_sizes_left: int = 1, deadline: float | None = None, after_s: float = 0.0
    ) -> float:
        """Seconds to measure one batch size: INFERTUNE_MEASURE_S (5) each, or an equal share
        of what remains of time_budget_s (until `deadline`, less `after_s` for what follows)."""
        if self.time_budget_s is None:
            return settings.measure_s()
        end = self.deadline if deadline is None else deadline
        return max(0.2, (end - after_s - time.perf_counter()) / batch_sizes_left)


# optimize()'s options, by the names it takes them under (the fields above, but the two the
# pipeline sets).
OPTION_NAMES = tuple(
    f.name for f in fields(Options) if f.name not in ("started", "data_digest", "traffic_digest")
)
# Every option's default: the fields' (optimize()'s signature and the command line show these).
DEFAULTS = Options()


def _check_reduced(precision: Any, calibration: Any, accuracy: Any) -> None:
    """calibration= and accuracy= apply to reduced precision: given without it, they would
    be ignored silently."""
    if accuracy is not None and not isinstance(accuracy, Accuracy):
        raise OptionError(
            f"accuracy must be an infertune.Accuracy(data=(x, y), metric=..., max_drop=...) or "
            f"None. Received: accuracy of type {type(accuracy).__name__}."
        )
    allowed = (precision,) if isinstance(precision, str) else tuple(precision or ())
    if (calibration is not None or accuracy is not None) and set(allowed) <= {"fp32"}:
        given = "calibration=" if calibration is not None else "accuracy="
        raise OptionError(
            f"{given} applies to reduced-precision candidates: allow them with "
            f"precision=('fp32', 'bf16', 'int8'), or leave {given} out."
        )


def _check_traffic(traffic: Any, pad_value: Any, free_dims: Any) -> None:
    """pad_value= and free_dims= apply to traffic=; their form (model/traffic.py reads the
    traffic itself, against the model's inputs)."""
    if traffic is None and (free_dims is not None or pad_value != 0):
        given = "free_dims=" if free_dims is not None else "pad_value="
        raise OptionError(
            f"{given} applies to traffic= (the requests padded into buckets): give a sample "
            f"of real requests as traffic=, or leave {given} out."
        )
    scalar = isinstance(pad_value, int | float | bool | np.generic)
    if not scalar and not (
        isinstance(pad_value, dict)
        and all(isinstance(v, int | float | bool | np.generic) for v in pad_value.values())
    ):
        raise OptionError(
            f"pad_value must be a number, or a dict of numbers by input name. Received: "
            f"pad_value={pad_value!r}."
        )
    if free_dims is not None and not isinstance(free_dims, dict):
        raise OptionError(
            f"free_dims must be a dict {{name: ['input:axis', ...]}}. Received: "
            f"free_dims={free_dims!r}."
        )


def _checked_backends(backends: Any) -> tuple[str | Backend, ...] | None:
    """The candidates asked for, the reference's names left out (it is always measured);
    OptionError for an unknown name, a repeated one, or something that is neither."""
    if backends is None:
        return None
    items = [backends] if isinstance(backends, str | Backend) else backends
    if not isinstance(items, Iterable):
        raise OptionError(
            f"backends must be a list of candidate names or Backend instances, or None. "
            f"Received: backends={backends!r}."
        )
    chosen: list[str | Backend] = []
    for item in items:
        if isinstance(item, Backend):
            chosen.append(item)
        elif item in REFERENCE_NAMES:
            continue
        elif isinstance(item, str) and item in BACKENDS:
            chosen.append(item)
        else:
            raise OptionError(f"Unknown backend {item!r}. Known backends: {known_backends()}.")
    names = [b.name if isinstance(b, Backend) else b for b in chosen]
    repeated = sorted({n for n in names if names.count(n) > 1 or n in REFERENCE_NAMES})
    if repeated:
        raise OptionError(f"Backend names must be unique; repeated: {repeated}.")
    return tuple(chosen)


def _checked_batch_sizes(batch_sizes: Any) -> tuple[int, ...] | None:
    if batch_sizes is None:
        return None
    sizes = [batch_sizes] if isinstance(batch_sizes, int) else batch_sizes
    if isinstance(sizes, str | bytes) or not isinstance(sizes, Iterable):
        sizes = None
    else:
        sizes = list(sizes)
    valid = bool(sizes) and all(
        isinstance(n, int | np.integer) and not isinstance(n, bool) and n > 0 for n in sizes
    )
    if not valid:
        raise OptionError(
            f"batch_sizes must be a list of positive integers, e.g. [1, 8, 64], or None. "
            f"Received: batch_sizes={batch_sizes!r}."
        )
    return tuple(sorted({int(n) for n in sizes}))


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(f"{name} must be one of {choices}. Received: {name}={value!r}.")


def _check_positive_or_none(name: str, value: Any) -> None:
    if value is not None and not (isinstance(value, int | float) and value > 0):
        raise OptionError(f"{name} must be a positive number or None. Received: {value!r}.")
