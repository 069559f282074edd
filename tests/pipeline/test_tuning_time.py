"""Tuning time: the report says where optimize()'s time went, a time budget is kept with the
most promising candidates first, and every shortcut gives what the long way gave."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import keras
import numpy as np
import pytest
from crashing_backends import RaisesInChild, SegfaultsAtFirstCall
from custom_layers import Doubling, doubling_model
from helpers import (
    conv_model,
    dense_model,
    flatten_cnn,
    model_free_target,
    needs_litert,
    prepared_backend,
)

import infertune
from infertune.backends.base import Backend
from infertune.backends.litert.backend import LiteRT
from infertune.backends.litert.convert import (
    convert,
    reads_shapes,
)
from infertune.backends.litert.pool import Interpreters as _Interpreters
from infertune.backends.litert.pool import operators as _ops
from infertune.model.inputs import build_signature
from infertune.model.source import load_model
from infertune.model.structure import flatten
from infertune.model.target import Target
from infertune.options import known_backends
from infertune.pipeline.diagnosis import machine_peak
from infertune.pipeline.isolation import CandidateCrashed, Isolation, RehearsalError
from infertune.pipeline.machine import (
    PEAK_EVERY,
    MachineRecord,
)
from infertune.pipeline.planning import (
    Probe,
    conversion_estimate_s,
    estimate_s,
    order_candidates,
)
from infertune.report import Report
from infertune.report.stages import CANDIDATE_STAGES


@pytest.fixture(scope="module")
def timed_report():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    backends = ["tf-function", "tf-xla", "onnxruntime-cpu", "onnxruntime-cpu:threads=1"]
    if importlib.util.find_spec("ai_edge_litert") is not None:
        backends.append("litert")
    start = time.perf_counter()
    opt = infertune.optimize(dense_model(), sample, backends=backends, verbose=False)
    return opt.report, time.perf_counter() - start


def test_every_stage_is_timed_and_they_add_up_to_the_total(timed_report):
    report, wall_s = timed_report
    stages = report.stages
    shared = stages.shared
    for stage in (
        "model load",
        "reference",
        "traced graph",
        "verification inputs",
        "environment",
        "FLOP count",
        "ONNX export",
        "warm-up",
        "measurement",
        "diagnosis: machine peak",
    ):
        assert stage in shared, (stage, shared)
    if importlib.util.find_spec("ai_edge_litert") is not None:
        assert "TFLite conversion" in shared
    for c in report.candidates:
        here = stages.candidates.get(c.name, {})
        elsewhere = stages.background.get(c.name, {})
        assert set(here) <= set(CANDIDATE_STAGES), here
        done = set(here) | set(elsewhere)
        assert {"compile", "first call", "verification"} <= done, (c.name, done)
        if c.name in ("onnxruntime-cpu", "litert"):  # rehearsed in the child first
            assert "conversion" in here and "rehearsal in the child process" in elsewhere
        elif c.name.startswith(("onnxruntime-cpu:", "litert:")):  # its twin's rehearsal says
            assert "rehearsal in the child process" not in elsewhere, (c.name, elsewhere)
    values = [*shared.values(), *(s for c in stages.candidates.values() for s in c.values())]
    assert all(v >= 0 for v in values)
    # The stages are intervals of the calling thread's clock that do not overlap: their sum
    # is the total but for the bookkeeping between them (selection, building the report),
    # which is milliseconds: 10% of the total and 0.5 s leave room for a busy machine.
    assert stages.total_s == pytest.approx(report.total_s)
    assert stages.accounted_s <= stages.total_s + 1e-6
    assert stages.other_s <= 0.1 * stages.total_s + 0.5
    assert stages.total_s <= wall_s  # optimize() itself took at least that


def test_the_breakdown_is_in_the_table_and_all_of_it_in_the_json(timed_report):
    report, _ = timed_report
    table = str(report)
    assert "time: " in table and "shared (s): " in table and "candidates (s): " in table
    data = report.to_dict()["stages"]
    assert data["shared_s"]["ONNX export"] > 0
    assert set(data["candidates_s"]) >= {"keras-eager", "tf-function", "onnxruntime-cpu"}
    loaded = Report.from_dict(json.loads(report.to_json()))
    assert loaded.stages.to_dict() == report.stages.to_dict()


def test_progress_says_the_breakdown(capsys):
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    infertune.optimize(dense_model(), sample, backends=["tf-function"], verbose=True)
    err = capsys.readouterr().err
    assert "time: " in err and "shared (s): " in err


# -- the time budget ------------------------------------------------------------------------
class _OutlastsTheBudget(Backend):
    """A candidate whose first call takes a minute: the budget must abandon it, whatever the
    machine's speed (every real candidate of a tiny model may fit in 4 s on a fast one)."""

    name = "outlasts-the-budget"

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def prepare(self, target: Target) -> None:
        pass

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.release.wait(60)
        raise RuntimeError("released")


@pytest.mark.timing  # optimize()'s wall time against its budget (tests/conftest.py: tiers)
def test_a_small_budget_is_kept_and_what_it_skipped_says_why(monkeypatch):
    monkeypatch.setenv("INFERTUNE_MACHINE_FILE", "off")  # no history: the built-in order
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    budget = 4.0
    model = dense_model()
    slow = _OutlastsTheBudget()
    start = time.perf_counter()
    try:
        opt = infertune.optimize(
            model, sample, backends=[*known_backends(), slow], time_budget_s=budget, verbose=True
        )
    finally:
        slow.release.set()  # let the abandoned thread end
    took = time.perf_counter() - start
    report = opt.report
    first_call_s = report.candidates[0].first_call_ms / 1e3
    # The budget excludes the model's own first call. The measurement stops at the end of a
    # round and the diagnosis and report follow it: 2 s of slack covers a round of 11
    # candidates and the report on a busy two-core machine.
    assert took <= budget + first_call_s + 2.0, (took, report.stages.summary())
    skipped = [c for c in report.candidates if "time_budget_s" in c.reason]
    assert slow.name in [c.name for c in skipped], [
        (c.name, c.status, c.reason) for c in report.candidates
    ]
    for c in skipped:
        assert c.status == "skipped"
        assert "time_budget_s=4" in c.reason and (" s" in c.reason or "ran out" in c.reason)
        assert f"{c.name}: skipped" in stream.getvalue()  # progress says it too
    assert any("tried most promising first" in note for note in report.notes)
    np.testing.assert_allclose(opt(sample), model(sample), rtol=1e-4, atol=1e-5)


def test_the_order_puts_the_likely_winners_first():
    from infertune.backends.registry import BACKENDS

    backends = [factory() for factory in BACKENDS.values()]
    light = Probe(flops=1_000, flops_note="", trace_s=0.05, call_s=0.001)
    heavy = Probe(flops=2_500_000_000, flops_note="", trace_s=2.0, call_s=0.4)
    first = [b.name for b in order_candidates(backends, light, None)][:2]
    assert first == ["onnxruntime-cpu", "onnxruntime-cpu:threads=1"]  # lowest per-call floor
    assert order_candidates(backends, heavy, None)[0].name == "openvino-cpu"  # best kernels
    # Reduced-precision candidates come after every exact one.
    names = [b.name for b in order_candidates(backends, heavy, None)]
    assert names.index("openvino-cpu-bf16") > names.index("tf-function")
    # Loops in the graph: LiteRT's converter may fail on them, it goes after the others.
    loops = Probe(2_500_000_000, "", Counter({"While": 1}), 2.0, 0.4)
    names = [b.name for b in order_candidates(backends, loops, None)]
    assert names.index("litert") > names.index("tf-function")


def test_earlier_wins_on_this_machine_come_first(tmp_path):
    from infertune.backends.registry import BACKENDS

    record = MachineRecord("fingerprint", tmp_path / "machine.json")
    for _ in range(2):
        record.learn_win("overhead", "litert")
    record.save()
    again = MachineRecord("fingerprint", tmp_path / "machine.json")
    backends = [factory() for factory in BACKENDS.values()]
    light = Probe(flops=1_000, flops_note="", trace_s=0.05, call_s=0.001)
    assert order_candidates(backends, light, again)[0].name == "litert"


def test_a_shared_conversion_is_estimated_once():
    from infertune.backends.onnxruntime.cpu import (
        OnnxRuntimeCpu,
        OrtSettings,
    )

    probe = Probe(flops=1_000_000, flops_note="", trace_s=1.0, call_s=0.01)
    before, how = estimate_s(OnnxRuntimeCpu(), probe, set(), None)
    variant = OnnxRuntimeCpu(OrtSettings(intra_op_threads=1))
    after, how_after = estimate_s(variant, probe, {"onnx"}, None)
    assert "onnx conversion" in how and "onnx conversion" not in how_after
    assert after < before


def test_a_heavy_model_s_slow_eager_call_does_not_inflate_the_candidates_estimates():
    # ResNet50 at 128x128 here: 2.5 GFLOP, an eager call of 0.3 s, ONNX Runtime's 17 ms.
    # Counting five verification calls at the eager speed overestimated OpenVINO's own work
    # 3x, and a 20 s budget skipped the candidate it would have chosen without one.
    from infertune.backends.keras_eager import KerasEager
    from infertune.backends.openvino.cpu import OpenVinoCpu

    probe = Probe(
        flops=2_500_000_000, flops_note="", trace_s=1.0, call_s=0.3, checks=5, peak_gflops=180.0
    )
    assert probe.runtime_call_s < probe.call_s / 5  # 2.5 GFLOP at a quarter of 180 GFLOP/s
    compiled, _ = estimate_s(OpenVinoCpu(), probe, {"onnx"}, None)
    eager_calls = 2.5 * probe.checks * probe.call_s  # what the calls alone counted before
    assert compiled < OpenVinoCpu.relative_cost * probe.trace_s + eager_calls / 2
    # The model's own call stays the model's own: keras-eager runs at the eager speed.
    own, _ = estimate_s(KerasEager(), probe, set(), None)
    assert own >= probe.checks * probe.call_s


def test_costs_learned_here_correct_the_estimates(tmp_path):
    record = MachineRecord("fingerprint", tmp_path / "machine.json")
    from infertune.backends.litert.backend import LiteRT as LiteRTBackend

    probe = Probe(flops=1_000_000, flops_note="", trace_s=1.0, call_s=0.01)
    plain, _ = estimate_s(LiteRTBackend(), probe, set(), record)
    record.learn_cost("conversion tflite", 1.0, 3.0)  # took three times the estimate here
    corrected, _ = estimate_s(LiteRTBackend(), probe, set(), record)
    assert corrected > plain


def test_a_conversion_made_in_a_worker_is_learned_at_its_time_there_not_the_wait(tmp_path):
    """This process waits little for a conversion a worker made: learned as its cost, that
    wait would put the next run's estimate under the worker's threshold (offload.py)."""
    from infertune.pipeline.planning import learn_from_run
    from infertune.report.stages import StageTimes

    record = MachineRecord("fingerprint", tmp_path / "machine.json")
    probe = Probe(flops=1_000_000, flops_note="", trace_s=1.0, call_s=0.01)
    times = StageTimes()
    times.add("TFLite full int8 conversion", 0.2)  # the wait here
    times.add_background("(shared)", 26.0, "TFLite full int8 conversion in a worker process")
    learn_from_run(record, probe, [], {}, times, "litert-int8")
    assert record.correction("conversion tflite-int8") == pytest.approx(
        26.0 / conversion_estimate_s("tflite-int8", probe, None)
    )


def test_a_calibrated_conversion_is_estimated_from_the_models_arithmetic():
    """A calibration runs the model on each sample: its time follows the model's arithmetic,
    which the graph's size does not tell (the BERT-sized encoder traces in a third of
    ResNet50's time for the same arithmetic; estimated from the trace alone, TFLite's full
    int8 conversion of ResNet50 224 came out at 6.5 s against 18-22 s measured while TFLite's
    calibrator measured its ranges, 8-10 s since infertune's range pass does)."""
    resnet = Probe(flops=7_750_000_000, flops_note="", trace_s=0.7, call_s=0.06)
    assert 5.0 <= conversion_estimate_s("tflite-int8", resnet, None) <= 12.0
    same_graph_less_arithmetic = Probe(flops=7_750_000, flops_note="", trace_s=0.7, call_s=0.06)
    for key in ("tflite-int8", "openvino-int8", "onnx-int8-static"):
        assert conversion_estimate_s(key, resnet, None) > conversion_estimate_s(
            key, same_graph_less_arithmetic, None
        )
    # Conversions that calibrate nothing: the graph alone.
    for key in ("tflite", "onnx"):
        assert conversion_estimate_s(key, resnet, None) == conversion_estimate_s(
            key, same_graph_less_arithmetic, None
        )


def test_a_conversion_built_inside_another_is_timed_once():
    """TFLite's full int8 builds the float32 conversion it quantizes where that one is not
    built yet: each shared build's seconds are its own, the nested one's left out of the
    outer's, so a stage holding both adds up to its time (not the float32 conversion twice,
    which also taught the machine's record the wrong cost)."""
    target, _ = model_free_target(np.zeros((2, 3), np.float32))

    def outer():
        time.sleep(0.2)
        return target.shared("inner", lambda: time.sleep(1.0))

    start = time.perf_counter()
    target.shared("outer", outer)
    end = time.perf_counter()
    seconds = target.conversions.built_between(start, end)
    assert seconds["inner"] >= 1.0
    assert 0.2 <= seconds["outer"] < 1.0, seconds  # 1.2 s and more counting the inner one
    assert sum(seconds.values()) <= end - start
    assert target.conversions.shared_seconds(["outer", "inner"]) <= end - start


# -- shortcuts give what the long way gave ----------------------------------------------------
def test_the_peak_is_measured_once_then_read_until_it_is_due_again(tmp_path):
    record = MachineRecord("fingerprint", tmp_path / "machine.json")
    assert record.peak_gflops is None
    record.set_peak(100.0)
    record.set_peak(80.0)  # a measurement on a busier machine does not lower it
    record.save()
    again = MachineRecord("fingerprint", tmp_path / "machine.json")
    assert again.peak_gflops == 100.0
    for _ in range(PEAK_EVERY):
        assert machine_peak(again) == 100.0  # read, not measured
    assert again.peak_gflops is None  # due for a new measurement
    assert MachineRecord("another machine", tmp_path / "machine.json").peak_gflops is None


def test_a_record_that_cannot_be_written_is_ignored(tmp_path):
    (tmp_path / "file").write_text("")
    record = MachineRecord("fingerprint", tmp_path / "file" / "machine.json")
    record.set_peak(1.0)
    record.save()  # the directory cannot be made: nothing raised, nothing kept
    assert MachineRecord("fingerprint", tmp_path / "file" / "machine.json").peak_gflops is None


def test_flops_counted_without_freezing_are_the_frozen_count():
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    from infertune.pipeline.diagnosis import trace_and_count

    model = conv_model()
    sample = np.zeros((2, 12, 12, 3), np.float32)
    source = load_model(model)
    signature, flat = build_signature(sample, source.declared_inputs, source.default_float)
    flops, _, op_types, trace_s = trace_and_count(source.graph_function(signature), flat)
    concrete = tf.function(source.graph_function(signature)).get_concrete_function(
        tf.TensorSpec(sample.shape, tf.float32)
    )
    frozen = convert_variables_to_constants_v2(concrete).graph
    builder = tf.compat.v1.profiler.ProfileOptionBuilder
    options = builder(builder.float_operation()).with_empty_output().build()
    profile = tf.compat.v1.profiler.profile(
        graph=frozen, run_meta=tf.compat.v1.RunMetadata(), cmd="op", options=options
    )
    assert flops == profile.total_float_ops > 0
    assert op_types["Conv2D"] == 1 and trace_s > 0


@needs_litert
@pytest.mark.parametrize("make_model, shape", [(dense_model, (4, 6)), (conv_model, (4, 12, 12, 3))])
def test_no_fixed_conversion_where_it_would_give_the_same_model(make_model, shape):
    model = make_model()
    sample = np.random.default_rng(0).random(shape, dtype=np.float32)
    backend, signature = prepared_backend(LiteRT(), model, sample)
    free = backend._converted
    assert not reads_shapes(free)
    assert backend._fixed is None  # decided without converting twice
    # The long way: the fixed conversion made anyway has the same operators (the rule that
    # dropped it before) and gives the same outputs at the sample's shape, bit for bit.
    source = load_model(model)
    target = Target(source, signature, flatten(np.zeros(1))[1], [np.dtype("float32")])
    fixed = convert(target, fixed=True)
    shapes = signature.concrete_shapes()
    fixed_run = _Interpreters(fixed, 1, 1, 1, shapes)
    free_run = _Interpreters(free, 1, 1, 1)
    assert _ops(fixed_run) == _ops(free_run)
    x = signature.flatten(sample)
    np.testing.assert_array_equal(fixed_run.run(x, shapes)[0], free_run.run(x, shapes)[0])
    np.testing.assert_array_equal(backend.run(x)[0], fixed_run.run(x, shapes)[0])


@needs_litert
def test_shape_arithmetic_still_gets_the_fixed_conversion():
    sample = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    backend, _ = prepared_backend(LiteRT(), flatten_cnn(), sample)
    assert reads_shapes(backend._converted)
    assert backend._fixed is not None and backend._fixed_run is not None


@pytest.mark.slow
@needs_litert
def test_a_conversion_made_in_a_worker_process_runs_as_one_made_here(monkeypatch):
    # A tiny model's conversion too, whatever the machine's load (system/settings.py).
    monkeypatch.setenv("INFERTUNE_TF_WORKER", "always")
    model = conv_model()
    sample = np.random.default_rng(0).random((2, 12, 12, 3), dtype=np.float32)
    opt = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert any("worker process beside this one" in note for note in opt.report.notes)
    assert opt.report.candidate("litert").status in ("ok", "selected")
    worker = opt.report.stages.background["(shared)"]
    assert worker["TFLite conversion in a worker process"] > 0
    here, _ = prepared_backend(LiteRT(), model, sample)
    if opt.backend == "litert":  # the same conversion: the same outputs, bit for bit
        np.testing.assert_array_equal(opt(sample), here.run([sample])[0])


def test_a_worker_is_given_the_calibration_samples_the_conversion_reads(tmp_path):
    """The first `samples` rows of the calibration batches, in order, every input of each
    (the worker's conversion reads what the one made here would)."""
    from infertune.pipeline.tf_worker import _read_calibration, _write_calibration

    rng = np.random.default_rng(0)
    batches = [
        [rng.random((n, 3), dtype=np.float32), rng.integers(0, 9, (n, 2))] for n in (32, 32, 5)
    ]
    _write_calibration(batches, 40, tmp_path)
    read = _read_calibration(tmp_path)
    assert [len(b[0]) for b in read] == [32, 8]
    for got, given in zip(read, batches):
        for array, original in zip(got, given):
            np.testing.assert_array_equal(array, original[: len(array)])
            assert array.dtype == original.dtype
    assert _read_calibration(tmp_path / "none") is None


@pytest.mark.timing
def test_a_core_is_free_for_a_worker_unless_other_processes_fill_them():
    """What this process and its children do (a thread spinning, a child spinning) leaves a
    core free; other processes spinning on every core do not. Timing tier: a busy machine
    moves what is measured."""
    from infertune.pipeline.offload import _cores_busy_elsewhere, _free_core
    from infertune.system.environment import usable_cores

    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    stop = threading.Event()
    spinning = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    spinning.start()
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)  # the child's start-up
        assert _free_core() is None
    finally:
        stop.set()
        spinning.join()
        child.kill()
        child.wait()
    # Not children: started by a shell that exits at once.
    cores = usable_cores()
    one = f"{sys.executable} -c '{spin}' >/dev/null 2>&1 & echo $!"
    script = f"for i in $(seq {cores}); do {one}; done"
    started = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    others = [int(pid) for pid in started.stdout.split()]
    try:
        time.sleep(0.5)
        assert _cores_busy_elsewhere() > cores - 1
        assert "leaves no core free" in _free_core()
    finally:
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@needs_litert
def test_a_worker_process_loads_a_model_of_the_users_own_layers(monkeypatch):
    # Keras loads a class it does not define only where it is named or registered in the
    # loading process: the worker imports it from its module (tf_worker.custom_classes).
    monkeypatch.setenv("INFERTUNE_TF_WORKER", "always")
    model = doubling_model()
    sample = np.random.default_rng(0).random((2, 6), dtype=np.float32)
    opt = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert any("worker process beside this one" in note for note in opt.report.notes), str(
        opt.report
    )
    assert opt.report.candidate("litert").status in ("ok", "selected")
    np.testing.assert_allclose(opt(sample), model(sample), rtol=1e-5, atol=1e-6)


@needs_litert
def test_no_worker_process_starts_for_a_class_it_cannot_import(monkeypatch):
    # A class of a script or notebook (__main__): no save for a worker that would fail.
    monkeypatch.setenv("INFERTUNE_TF_WORKER", "always")
    monkeypatch.setattr(Doubling, "__module__", "__main__")
    saves = []
    monkeypatch.setattr(keras.Model, "save", lambda *args, **kwargs: saves.append(args))
    model = doubling_model()
    sample = np.random.default_rng(0).random((2, 6), dtype=np.float32)
    opt = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert not saves
    assert any(
        "TFLite conversion was made here, not in a worker process: the model's class Doubling "
        "is defined in __main__" in note
        for note in opt.report.notes
    ), opt.report.notes
    assert opt.report.candidate("litert").status in ("ok", "selected")


# -- rehearsals queued in the child -----------------------------------------------------------
def test_jobs_queued_behind_a_crash_go_to_a_fresh_child():
    target, sample = model_free_target(np.zeros((2, 3), np.float32))
    isolation = Isolation("process", 60)
    try:
        crash = isolation.submit(SegfaultsAtFirstCall(), target, [sample], 60)
        behind = isolation.submit(RaisesInChild(), target, [sample], 60)
        with pytest.raises(RehearsalError, match="unsupported operator Foo"):
            behind.wait()  # answered, by a second child: the first died on the job before
        with pytest.raises(CandidateCrashed, match="SIGSEGV"):
            crash.wait()
    finally:
        isolation.close()
