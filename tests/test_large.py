"""Models past 2 GB of weights, proven on small ones: the threshold past which the ONNX
export keeps its weights as external data and the TFLite conversion takes its large-model
path (INFERTUNE_EXTERNAL_DATA_BYTES, 1 GiB by default) is lowered under a model of a few KB,
so that every path a 2 GB model takes runs here in seconds."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime
import pytest
from helpers import (
    assert_matches_model,
    dense_model,
    mapped_resident_bytes,
    on_tmpfs,
    residency_detail,
    residency_tiers,
    target_for,
    weight_copying,
)

import infertune
from infertune.export.onnx import DATA_FILE, ONNX_FILE
from infertune.export.registry import export_onnx
from infertune.system.resources import LEAN_ALLOCATORS


def recommender(seed: int = 0):
    """A recommender in small: item ids through an embedding table (6.4 KB), float features,
    two outputs in a dict; each weight of more than 1 KB goes to the data file."""
    import keras

    keras.utils.set_random_seed(seed)
    features = keras.Input((4,), name="features")
    items = keras.Input((5,), name="items", dtype="int32")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(200, 8)(items))
    hidden = keras.layers.Dense(32, activation="tanh")(
        keras.layers.Concatenate()([features, embedded])
    )
    return keras.Model(
        {"features": features, "items": items},
        {"score": keras.layers.Dense(1)(hidden), "probs": keras.layers.Dense(3)(hidden)},
    )


def recommender_sample(rng, batch: int = 4):
    return {
        "features": rng.standard_normal((batch, 4)).astype("float32"),
        "items": rng.integers(0, 200, (batch, 5)).astype("int32"),
    }


@pytest.fixture
def large(monkeypatch):
    """Every model of more than 100 bytes of weights counts as large."""
    monkeypatch.setenv("INFERTUNE_EXTERNAL_DATA_BYTES", "100")


def test_the_export_keeps_weights_as_external_data_in_one_aligned_file(large, rng):
    exported = export_onnx(target_for(dense_model(64, 3), rng.standard_normal((4, 64))))
    assert exported.directory is not None
    files = sorted(p.name for p in exported.directory.iterdir())
    assert files == [ONNX_FILE, DATA_FILE]
    graph = onnx.load_from_string(exported.model_bytes).graph  # the graph alone, no weights
    external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external, "no initializer went to the data file"
    for tensor in external:
        where = {entry.key: entry.value for entry in tensor.external_data}
        assert where["location"] == DATA_FILE and int(where["offset"]) % 4096 == 0
    directory = exported.directory
    del exported  # the temporary directory goes with the export
    import gc

    gc.collect()
    assert not directory.exists()


@pytest.mark.slow
def test_a_constant_past_the_protobuf_limit_goes_to_the_data_file_untouched(
    large, monkeypatch, rng
):
    """A single weight past HUGE_CONSTANT_BYTES (lowered here from 1 GiB; tf2onnx's protobuf
    copies stop at 2 GiB: a 2.46 GB embedding table failed) is written to the data file as
    it is and read from there by the runtimes, with the same outputs."""
    from infertune.export import onnx_external as onnx_export

    monkeypatch.setattr(onnx_export, "HUGE_CONSTANT_BYTES", 6000)  # the 6.4 KB table alone
    written, to_file = [], onnx_export._huge_to_file
    monkeypatch.setattr(
        onnx_export, "_huge_to_file", lambda *a: written.append(to_file(*a)) or written[-1]
    )
    model, sample = recommender(), recommender_sample(rng)
    exported = export_onnx(target_for(model, sample))
    assert [list(t.dims) for t in written[0].values()] == [[200, 8]]
    graph = onnx.load_from_string(exported.model_bytes).graph
    sizes = {
        t.name: int({e.key: e.value for e in t.external_data}["length"])
        for t in graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    }
    assert 200 * 8 * 4 in sizes.values(), sizes
    names = ["onnxruntime-cpu", "openvino-cpu"]
    opt = infertune.optimize(model, sample, backends=names, verbose=False)
    for candidate in opt.report.candidates:
        if candidate.name in names:
            assert candidate.status in ("ok", "selected"), str(opt.report)
    fresh = recommender_sample(np.random.default_rng(3), batch=2)
    expected, outputs = model(fresh), opt(fresh)
    for key in expected:
        assert_matches_model(expected[key], outputs[key])


@pytest.mark.slow
def test_every_candidate_runs_external_data_and_results_carry_it(large, rng, tmp_path):
    model, sample = recommender(), recommender_sample(rng)
    names = ["onnxruntime-cpu", "openvino-cpu", "litert"]
    opt = infertune.optimize(model, sample, backends=names, verbose=False)
    statuses = {c.name: c.status for c in opt.report.candidates}
    for name in names:
        assert statuses[name] in ("ok", "selected"), str(opt.report)

    cache = tmp_path / "cache"
    tuned = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu"], cache=cache, verbose=False
    )
    cached = infertune.optimize(
        model, sample, backends=["onnxruntime-cpu"], cache=cache, verbose=False
    )
    assert cached.report.from_cache, str(cached.report)
    (entry,) = [path.parent for path in cache.rglob(DATA_FILE)]
    assert (entry / DATA_FILE).stat().st_size > 6400  # the cache entry carries the table
    saved = tuned.save(tmp_path / "saved")
    assert (saved / DATA_FILE).stat().st_size > 6400  # the embedding table at least
    loaded = infertune.load(saved)
    assert loaded.backend == "onnxruntime-cpu"
    fresh = recommender_sample(np.random.default_rng(7), batch=3)
    expected = model(fresh)
    for result in (loaded, cached):
        outputs = result(fresh)
        for key in expected:
            assert_matches_model(expected[key], outputs[key])

    export = tuned.export_triton(tmp_path / "repo", "big")
    version = tmp_path / "repo" / "big" / "1"
    assert (version / DATA_FILE).stat().st_size > 6400
    # What Triton's ONNX Runtime backend loads: the repository's model and its data file.
    session = onnxruntime.InferenceSession(
        str(version / ONNX_FILE), providers=["CPUExecutionProvider"]
    )
    feed = {i.name: np.asarray(fresh[export.names[i.name]]) for i in session.get_inputs()}
    names = [export.names[o.name] for o in session.get_outputs()]
    for key, output in zip(names, session.run(None, feed)):
        assert_matches_model(expected[key], output)


def test_the_large_tflite_conversion_never_loads_the_saved_model_in_python(large, monkeypatch, rng):
    # TensorFlow's own SavedModel path loads the model, variables and all, twice in Python
    # before its C++ converter reads it again (tflite_child._saved_model_converter); on these
    # versions neither load is made (if TensorFlow's private names move, the conversion takes
    # TensorFlow's own path, and this fails).
    import tensorflow as tf
    from tensorflow.lite.python import lite

    from infertune.backends.litert.backend import LiteRT

    def load(*args, **kwargs):
        raise AssertionError("the SavedModel was loaded in Python")

    monkeypatch.setattr(lite, "_load", load)
    model, sample = recommender(), recommender_sample(rng)
    target = target_for(model, sample)
    assert target.size().lean
    backend = LiteRT()
    backend.prepare(target)
    outputs = backend.run(target.signature.flatten(sample))
    assert_matches_model([np.asarray(x) for x in tf.nest.flatten(model(sample))], outputs)
    backend.close()


def test_a_candidate_memory_cannot_hold_is_skipped_with_the_estimate(monkeypatch, rng):
    from infertune.model.sizes import MEMORY_RESERVE_BYTES as MEMORY_RESERVE

    # The candidates may hold 1 KB in all: nothing that copies the weights fits, while
    # tf-function (the model's own variables) does.
    monkeypatch.setenv("INFERTUNE_MEMORY_BYTES", str(MEMORY_RESERVE + 1000))
    model = dense_model(64, 3)
    opt = infertune.optimize(
        model, rng.standard_normal((4, 64)), backends=["tf-function", "onnxruntime-cpu"]
    )
    by_name = {c.name: c for c in opt.report.candidates}
    assert by_name["tf-function"].status in ("ok", "selected")
    skipped = by_name["onnxruntime-cpu"]
    assert skipped.status == "skipped"
    assert "GB of memory" in skipped.reason and "onnx conversion" in skipped.reason
    memory = opt.report.to_dict()["memory"]
    assert memory["peak_bytes"] >= memory["before_bytes"] > 0
    assert "memory: peak" in str(opt.report)


@pytest.mark.slow
def test_a_large_model_keeps_the_fastest_copy_for_the_measurement(monkeypatch, rng):
    # Every model counts as large: holding all five would pass 1 byte.
    monkeypatch.setenv("INFERTUNE_HOLD_ALL_BYTES", "1")
    closed_backends: list[str] = []
    sleeps = {"slow-a": 0.02, "slow-b": 0.021, "slow-c": 0.022, "slow-d": 0.023, "slow-e": 0.1}
    backends = [
        weight_copying(name, lambda _, s=s: s, closed_backends) for name, s in sleeps.items()
    ]
    opt = infertune.optimize(dense_model(64, 3), rng.standard_normal((4, 64)), backends=backends)
    slow = [c for c in opt.report.candidates if c.name in sleeps]
    measured = [c.name for c in slow if c.latency is not None]
    closed = [c for c in slow if c.latency is None]
    assert len(measured) == 1 and len(closed) == 4, str(opt.report)
    for candidate in closed:  # verified, said so, and closed at once
        assert candidate.status == "skipped" and candidate.max_rel_err is not None
        assert "closed before the measurement to hold memory" in candidate.reason
        reason = candidate.reason
        assert "only the fastest is kept" in reason or "more than 1.5x" in reason
    assert "more than 1.5x" in {c.name: c for c in slow}["slow-e"].reason
    assert {c.name for c in closed} <= set(closed_backends)
    # The choice is the fastest measured: the model's own call (about 1 ms) here.
    assert opt.backend not in {c.name for c in closed}
    fastest = min((c for c in opt.report.candidates if c.latency), key=lambda c: c.latency.p50)
    assert opt.backend == fastest.name


@pytest.mark.slow
def test_a_large_model_tries_no_session_option_or_thread_variants(monkeypatch, rng):
    monkeypatch.setenv("INFERTUNE_HOLD_ALL_BYTES", "1")
    backends = ["onnxruntime-cpu", "onnxruntime-cpu:nospin", "onnxruntime-cpu:threads=1"]
    model, sample = dense_model(64, 3), rng.standard_normal((4, 64))
    opt = infertune.optimize(model, sample, backends=backends)
    by_name = {c.name: c for c in opt.report.candidates}
    variant = by_name["onnxruntime-cpu:nospin"]
    assert variant.status == "skipped"
    assert "only in a session option (nospin)" in variant.reason
    threads = by_name["onnxruntime-cpu:threads=1"]
    assert threads.status == "skipped" and "running on 1 thread(s)" in threads.reason
    # For several callers at once, a session on fewer threads is what may serve them best.
    opt = infertune.optimize(model, sample, backends=backends, concurrency=2)
    threads = {c.name: c for c in opt.report.candidates}["onnxruntime-cpu:threads=1"]
    assert "not tried on a model this large" not in (threads.reason or "")


def _first_call_and_export_end(monkeypatch, rng, backend_class, export_delay_s=0.0):
    """optimize() on a model counted large with a `backend_class` candidate and ONNX Runtime,
    the ONNX export delayed by `export_delay_s`: the report, when the candidate was first
    called, and when the export ended (perf_counter)."""
    import dataclasses
    import time

    from infertune.export.registry import CONVERSIONS

    monkeypatch.setenv("INFERTUNE_HOLD_ALL_BYTES", "1")
    export_ended, first_call = [], []
    convert = CONVERSIONS["onnx"].build

    def timed_convert(target):
        try:
            time.sleep(export_delay_s)
            return convert(target)
        finally:
            export_ended.append(time.perf_counter())

    class Recorded(backend_class):
        def run(self, inputs):
            first_call.append(time.perf_counter())
            return super().run(inputs)

    delayed = dataclasses.replace(CONVERSIONS["onnx"], build=timed_convert)
    monkeypatch.setitem(CONVERSIONS, "onnx", delayed)
    opt = infertune.optimize(
        dense_model(64, 3), rng.standard_normal((4, 64)), backends=[Recorded(), "onnxruntime-cpu"]
    )
    assert export_ended and first_call, str(opt.report)
    return opt.report, first_call[0], export_ended[0]


@pytest.mark.slow
def test_a_large_model_compiles_xla_after_the_conversions(monkeypatch, rng):
    """XLA's compile (3x the weights) waits for the ONNX export (4x) to end, not beside it."""
    from infertune.backends.tf_xla import TfXla

    report, first_call, export_ended = _first_call_and_export_end(monkeypatch, rng, TfXla)
    by_name = {c.name: c for c in report.candidates}
    assert by_name["onnxruntime-cpu"].max_rel_err is not None, str(report)
    assert first_call >= export_ended


def test_a_large_model_calls_tf_function_after_the_conversions(monkeypatch, rng):
    """tf-function's calls wait for the ONNX export to end: a call reading a variable while
    the export froze it made TensorFlow copy the variable (the 2.46 GB recommender's table,
    in copy-on-read mode) and keep the copy to the end. The export takes a second more, long
    enough for a call beside it to be seen."""
    from infertune.backends.tf_function import TfFunction

    report, first_call, export_ended = _first_call_and_export_end(
        monkeypatch, rng, TfFunction, export_delay_s=1.0
    )
    by_name = {c.name: c for c in report.candidates}
    assert by_name["tf-function"].max_rel_err is not None, str(report)
    assert first_call >= export_ended


@pytest.mark.slow
def test_a_large_model_is_not_checked_under_concurrent_callers(monkeypatch, rng):
    """Each concurrent caller of a TensorFlow candidate may hold its own copy of a variable
    in copy-on-read mode (7.5 GB more under 4 callers on the 2.46 GB recommender): a large
    model's choice is not measured again under several callers."""
    import threading

    from infertune.backends.tf_function import TfFunction

    monkeypatch.setenv("INFERTUNE_HOLD_ALL_BYTES", "1")
    lock, running, most = threading.Lock(), [0], [0]

    class Function(TfFunction):
        def run(self, inputs):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                return super().run(inputs)
            finally:
                with lock:
                    running[0] -= 1

    opt = infertune.optimize(
        dense_model(16, 3),
        rng.standard_normal((4, 16)),
        backends=[Function(), "onnxruntime-cpu", "openvino-cpu"],
    )
    assert "concurrency check" not in opt.report.stages.shared, str(opt.report)
    assert most[0] == 1
    # Started without the allocators that give a conversion's memory back: the notes say so.
    lean = all(os.environ.get(k) == v for k, v in LEAN_ALLOCATORS.items())
    told = [n for n in opt.report.notes if "MALLOC_ARENA_MAX=1" in n]
    assert bool(told) == (sys.platform.startswith("linux") and not lean), opt.report.notes
    # The same model, not counted large: the check runs, tf-function among its callers.
    monkeypatch.delenv("INFERTUNE_HOLD_ALL_BYTES")
    opt = infertune.optimize(
        dense_model(16, 3),
        rng.standard_normal((4, 16)),
        backends=[Function(), "onnxruntime-cpu", "openvino-cpu"],
    )
    assert "concurrency check" in opt.report.stages.shared, str(opt.report)
    assert most[0] > 1
    assert not [n for n in opt.report.notes if "MALLOC_ARENA_MAX=1" in n]


def test_xla_is_skipped_for_the_memory_its_compile_takes(monkeypatch, rng):
    from infertune.model.sizes import MEMORY_RESERVE_BYTES as MEMORY_RESERVE

    # Room for 1x the weights (about 800 bytes), not for XLA's compile.
    monkeypatch.setenv("INFERTUNE_MEMORY_BYTES", str(MEMORY_RESERVE + 1000))
    opt = infertune.optimize(
        dense_model(64, 3), rng.standard_normal((4, 64)), backends=["tf-function", "tf-xla"]
    )
    xla = {c.name: c for c in opt.report.candidates}["tf-xla"]
    assert xla.status == "skipped" and "while it compiles" in xla.reason


@pytest.mark.slow
def test_a_conversion_memory_is_measured_learned_and_used(monkeypatch, rng, tmp_path):
    """Each conversion's own peak is in the report and the machine's record, and the next
    run's memory estimate uses what was learned instead of the built-in factor."""
    import json

    from infertune.model import sizes
    from infertune.model.sizes import MEMORY_RESERVE_BYTES as MEMORY_RESERVE

    monkeypatch.setattr(sizes, "WATCHED_MIN_BYTES", 0)  # every model counts
    machine = tmp_path / "machine.json"
    monkeypatch.setenv("INFERTUNE_MACHINE_FILE", str(machine))
    model, sample = dense_model(64, 3), rng.standard_normal((4, 64))
    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"])
    memory = opt.report.to_dict()["memory"]
    assert memory["conversions_bytes"]["ONNX export"] > 0
    assert "ONNX export" in str(opt.report)
    data = json.loads(machine.read_text())
    (entry,) = data["machines"].values()
    ((weights_seen, peak),) = entry["memory_runs"]["onnx"]
    assert weights_seen == memory["weights_bytes"] and peak > 0

    weights = memory["weights_bytes"]
    monkeypatch.setenv("INFERTUNE_MEMORY_BYTES", str(MEMORY_RESERVE + 100 * weights))
    # A run on a model large enough to teach the copies of the weights the export makes.
    large = 1 << 30
    for learned, fits in ((1e6, False), (2.0, True)):
        entry["memory_runs"]["onnx"] = [[large, int(learned * large)]]
        machine.write_text(json.dumps(data))
        opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"])
        candidate = {c.name: c for c in opt.report.candidates}["onnxruntime-cpu"]
        assert (candidate.status != "skipped") == fits, str(opt.report)
        if not fits:  # the reason says the estimate was learned, and how to ignore it
            assert "learned from 1 earlier run" in candidate.reason, candidate.reason
            assert "INFERTUNE_MACHINE_FILE=off" in candidate.reason


@pytest.mark.slow
def test_a_record_learned_on_small_models_does_not_shut_a_large_one_out(monkeypatch, rng, tmp_path):
    """Runs on models below the size that teaches the copies of the weights (lowered here to
    50 KB: the model below counts as large, the recorded ones as small) learn only a fixed
    cost: 15x their tiny weights, learned as one factor, had skipped a 2.56 GB model's ONNX
    Runtime where its export peaked at 1.1x."""
    import json

    from infertune.model.sizes import MEMORY_RESERVE_BYTES as MEMORY_RESERVE
    from infertune.pipeline import memory

    monkeypatch.setattr(memory, "LEARN_PER_BYTE_MIN_BYTES", 50_000)
    machine = tmp_path / "machine.json"
    monkeypatch.setenv("INFERTUNE_MACHINE_FILE", str(machine))
    model, sample = dense_model(256, 128), rng.standard_normal((4, 256))
    opt = infertune.optimize(model, sample, backends=["tf-function"], verbose=False)
    written = json.loads(machine.read_text())
    (fingerprint,), version = written["machines"], written["version"]
    weights = 4 * (256 * 8 + 8 + 8 * 128 + 128)  # float32 kernels and biases: 12.8 KB
    # Thirty runs on models of 2 KB of weights whose export peaked at 30 KB: 15x each.
    small = [[2000, 30_000]] * 30
    entry = {"memory_runs": {"onnx": small}}
    machine.write_text(json.dumps({"version": version, "machines": {fingerprint: entry}}))
    # Room for the runtime's copy, the built-in 4 copies during the export and the fixed
    # cost learned (22 KB), not for the 15 copies a factor learned on the small ones says.
    monkeypatch.setenv("INFERTUNE_MEMORY_BYTES", str(MEMORY_RESERVE + 10 * weights))
    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)
    candidate = {c.name: c for c in opt.report.candidates}["onnxruntime-cpu"]
    assert candidate.status in ("ok", "selected"), str(opt.report)
    # The same runs on models that are large here teach the copies themselves: 15x, too many.
    entry["memory_runs"]["onnx"] = [[100_000, 1_500_000]]
    machine.write_text(json.dumps({"version": version, "machines": {fingerprint: entry}}))
    opt = infertune.optimize(model, sample, backends=["onnxruntime-cpu"], verbose=False)
    candidate = {c.name: c for c in opt.report.candidates}["onnxruntime-cpu"]
    assert candidate.status == "skipped" and "15.0x the weights" in candidate.reason


@pytest.mark.slow
def test_a_large_tflite_flatbuffer_lives_in_a_file_of_its_own(large, rng, tmp_path):
    """Past the threshold the flatbuffer is not held in memory: a temporary file each
    interpreter maps, removed with the conversion; a saved result carries it."""
    import gc

    from infertune.backends.litert.convert import convert

    model, sample = recommender(), recommender_sample(rng)
    converted = convert(target_for(model, sample))
    assert converted.content == b"" and converted.path.stat().st_size > 6400
    directory = converted.path.parent
    del converted
    gc.collect()
    assert not directory.exists()

    opt = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert opt.backend == "litert", str(opt.report)
    loaded = infertune.load(opt.save(tmp_path / "saved"))
    fresh = recommender_sample(np.random.default_rng(5), batch=2)
    expected, outputs = model(fresh), loaded(fresh)
    for key in expected:
        assert_matches_model(expected[key], outputs[key])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_PAGEOUT): Linux")
@residency_tiers
def test_the_result_holds_no_page_of_its_weight_file_until_a_call_reads_it(large, rng, residency):
    """XNNPACK packs the weights into buffers of its own: after optimize() the flatbuffer's
    mapped pages are out of memory (a call reads back the ones it uses), outputs unchanged."""
    model, sample = recommender(), recommender_sample(rng)
    opt = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert opt.backend == "litert", str(opt.report)
    # This result's files (other tests' results, still alive, map files of their own).
    backend = opt._choice.selected
    files = [str(c.path) for c in (backend._converted, backend._fixed) if c is not None]
    assert files and all(path.startswith(tempfile.gettempdir()) for path in files)
    for path in files:
        if residency and not on_tmpfs(path):
            assert mapped_resident_bytes(path) == 0, residency_detail(path)
    fresh = recommender_sample(np.random.default_rng(6), batch=3)
    expected, outputs = model(fresh), opt(fresh)
    for key in expected:
        assert_matches_model(expected[key], outputs[key])


@pytest.mark.slow  # two TFLite conversions in child processes importing TensorFlow: 20 s
def test_a_conversion_past_the_child_threshold_runs_in_a_child_whose_peak_is_counted(
    large, monkeypatch, rng, tmp_path
):
    """Past CHILD_CONVERSION_MIN_BYTES the TFLite conversion runs in a child process (what
    TensorFlow's allocators keep stays there): the same outputs, its peak in the report's,
    and the converter's own error where it fails."""
    from infertune.backends.litert import child as tflite_child
    from infertune.model import sizes

    monkeypatch.setattr(sizes, "CHILD_CONVERSION_MIN_BYTES", 0)
    monkeypatch.setattr(sizes, "WATCHED_MIN_BYTES", 0)  # conversions' peaks kept
    # The child's TensorFlow against a few KB of weights: not a factor for other tests to learn.
    monkeypatch.setenv("INFERTUNE_MACHINE_FILE", str(tmp_path / "machine.json"))
    children = []
    real = tflite_child.run_module

    def counted(module, *args, **kwargs):
        children.append(module)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(tflite_child, "run_module", counted)
    model, sample = recommender(), recommender_sample(rng)
    opt = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert opt.backend == "litert", str(opt.report)
    assert children  # the free conversion, and the one at the sample's shapes
    fresh = recommender_sample(np.random.default_rng(7), batch=2)
    expected, outputs = model(fresh), opt(fresh)
    for key in expected:
        assert_matches_model(expected[key], outputs[key])
    # The child imported TensorFlow (hundreds of MB): its peak is the conversion's.
    conversions = opt.report.memory["conversions_bytes"]
    assert conversions["TFLite conversion"] > 100e6, conversions
    assert opt.report.memory["peak_bytes"] - opt.report.memory["before_bytes"] > 100e6

    # What the child held is learned under a name of its own, and estimated from it: an
    # in-process conversion's copies (as if each held a billion here) do not skip it.
    from infertune.model.sizes import MEMORY_RESERVE_BYTES as MEMORY_RESERVE

    machine_file = tmp_path / "machine.json"
    machine = json.loads(machine_file.read_text())
    (entry,) = machine["machines"].values()
    runs = entry["memory_runs"]
    assert "tflite-child" in runs and "tflite" not in runs, entry
    large = 1 << 30  # runs on a model large enough to teach the copies of the weights
    runs |= {"tflite": [[large, int(1e9 * large)]], "tflite-child": [[large, 4 * large]]}
    machine_file.write_text(json.dumps(machine))
    monkeypatch.setenv("INFERTUNE_MEMORY_BYTES", str(MEMORY_RESERVE + 100_000_000))
    again = infertune.optimize(model, sample, backends=["litert"], verbose=False)
    assert again.backend == "litert", str(again.report)

    with pytest.raises(RuntimeError, match="TFLite conversion in a child process failed"):
        tflite_child.convert_in_child(str(tmp_path / "no-saved-model"), tmp_path / "m.tflite")
