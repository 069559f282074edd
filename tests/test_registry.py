"""The registries a newcomer adds to: conversions (export/registry.py) and backends
(backends/__init__.py FAMILIES), and the one place each option's default and choices live."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import infertune
from infertune.backends.registry import (
    BACKENDS,
    FAMILIES,
    backend_class,
    family_of,
    family_rank,
)
from infertune.cli.options import build_parser
from infertune.export import patching
from infertune.export.registry import CONVERSIONS, shared, stage_name
from infertune.options import DEFAULTS, OBJECTIVES, OPTION_NAMES, Options
from infertune.pipeline.planning import Probe, order_candidates


def test_every_conversion_a_backend_names_is_registered():
    # A key missing from the registry would get made-up costs and memory (as "onnx-fp16" did).
    for name, factory in BACKENDS.items():
        backend = factory()
        for key in backend.conversions:
            assert key in CONVERSIONS, f"{name} uses the unregistered conversion {key!r}"
    for key, conversion in CONVERSIONS.items():
        assert conversion.key == key and conversion.stage and conversion.produces
        assert conversion.cost[0] > 0 and conversion.cost[1] > 0 and conversion.memory > 0
        assert stage_name(key) == conversion.stage


def test_every_candidate_belongs_to_one_family_and_ranks_are_distinct():
    names = [name for family in FAMILIES for name in family.variants]
    assert names == list(BACKENDS)  # BACKENDS is the families' lines, in order
    for family in FAMILIES:
        assert all(family_of(name) == family.name for name in family.variants)
        assert backend_class(family.name) is not None
    for regime in ("compute", "overhead"):
        ranks = [getattr(f, regime) for f in FAMILIES if getattr(f, regime) is not None]
        assert len(ranks) == len(set(ranks)), f"two families share a rank for {regime}"


def test_the_order_follows_the_families_ranks():
    names = ("tf-function", "litert", "openvino-cpu", "onnxruntime-cpu", "onnxruntime-cpu-int8")
    backends = [BACKENDS[name]() for name in names]
    for regime, flops in (("compute", 10**9), ("overhead", 10)):
        ordered = [b.name for b in order_candidates(backends, Probe(flops, ""), None)]
        ranked = sorted(
            (b.name for b in backends if b.precision == "fp32"),
            key=lambda name: family_rank(name, regime),
        )
        assert ordered == [*ranked, "onnxruntime-cpu-int8"], regime  # reduced precision last


def test_a_shared_conversion_is_built_once_by_its_registered_function(rng):
    from helpers import dense_model, target_for

    target = target_for(dense_model(), rng.standard_normal((2, 6)).astype("float32"))
    first = shared(target, "onnx")
    assert shared(target, "onnx") is first
    assert target.conversions.built() == {"onnx"}


def test_the_command_line_takes_its_choices_and_defaults_from_the_options():
    args = build_parser().parse_args(["demo"])
    for name in OPTION_NAMES:
        if name == "accuracy":  # labelled data and a metric: Python only (docs/api.md)
            continue
        assert getattr(args, name) == getattr(DEFAULTS, name), name
    (action,) = [a for a in build_parser()._subparsers._group_actions[0].choices["demo"]._actions
                 if a.dest == "objective"]  # fmt: skip
    assert tuple(action.choices) == OBJECTIVES
    # The old spellings still work.
    old = build_parser().parse_args(["demo", "--budget", "7", "--candidate-timeout", "none"])
    assert old.time_budget_s == 7.0 and old.candidate_timeout_s is None


def test_options_checked_rejects_an_unknown_name():
    with pytest.raises(TypeError, match="unknown option"):
        Options.checked(precisions=("fp32",))
    explicit = Options.checked(**{n: getattr(DEFAULTS, n) for n in OPTION_NAMES})
    assert all(getattr(explicit, n) == getattr(DEFAULTS, n) for n in OPTION_NAMES)


def test_available_backends_are_those_that_can_run_here():
    names = infertune.available_backends()
    assert names[0] == "keras-eager"
    for name in names[1:]:
        assert BACKENDS[name]().available() is None, name
    for name in set(BACKENDS) - set(names):
        assert BACKENDS[name]().available() is not None, name


def test_a_process_wide_patch_waits_for_the_one_in_place():
    """Two threads patching one function: the second waits until the first put its original
    back, so each restores what it found and the original stays at the end (two exports in
    threads, each putting back the other's replacement, had left one in place for good)."""

    class Module:
        @staticmethod
        def function():
            return "original"

    inside, entered, done = threading.Event(), threading.Event(), threading.Event()

    def second():
        inside.wait()
        with patching.patched(Module, {"function": lambda: "second"}):
            entered.set()
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    with patching.patched(Module, {"function": lambda: "first"}):
        inside.set()
        # The other thread cannot get in while this patch is in place (0.3 s: it would have
        # entered in microseconds without the lock).
        assert not entered.wait(0.3)
        assert Module.function() == "first"
    assert done.wait(10)
    thread.join()
    assert Module.function() == "original"


def test_two_exports_in_threads_leave_tensorflow_as_it_was(rng):
    from helpers import dense_model, target_for
    from tensorflow.python.framework import tensor_util
    from tf2onnx import tf_utils, tfonnx

    originals = (
        tensor_util.make_tensor_proto,
        tfonnx.resolve_functions,
        tf_utils.tf_to_onnx_tensor,
    )
    errors = []

    def export(seed: int) -> None:
        try:
            sample = np.random.default_rng(seed).standard_normal((2, 6)).astype("float32")
            shared(target_for(dense_model(seed=seed), sample), "onnx")
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=export, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    now = (tensor_util.make_tensor_proto, tfonnx.resolve_functions, tf_utils.tf_to_onnx_tensor)
    assert all(a is b for a, b in zip(now, originals))
