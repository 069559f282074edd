"""OpenVINO CPU candidates: exact f32 despite the bf16 default, any batch size, bf16 by choice."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers import (
    assert_matches_model,
    dense_model,
    dict_model,
    dict_sample,
    needs_openvino,
)

import infertune
from infertune.backends.base import RunFacts
from infertune.backends.openvino import cpu as openvino_backend
from infertune.backends.openvino.cpu import (
    OpenVinoCpu,
    OpenVinoCpuBf16,
)
from infertune.model.inputs import build_signature
from infertune.model.source import load_model
from infertune.model.target import Target
from infertune.system.environment import install_hint

# An fp32 run differs from TensorFlow's only in summation order: a few float32 ulps (1.2e-7
# each) on these tiny models. 1e-5 leaves ~100x headroom and is ~400x below bf16's error.
FP32_RTOL = 1e-5
FP32_ATOL = 1e-6  # outputs are of order 1: ~10 float32 ulps of absolute slack near zero


def conv_model(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
        ]
    )


def prepared(model, sample, backend: OpenVinoCpu, objective: str = "latency") -> OpenVinoCpu:
    """The backend prepared on the Target that optimize() would build, outside the pipeline."""
    source = load_model(model)
    signature, flat = build_signature(sample, source.declared_inputs, source.default_float)
    reference, structure = source.call_flat(signature, flat)
    backend.prepare(Target(source, signature, structure, [r.dtype for r in reference], objective))
    return backend


@needs_openvino
@pytest.mark.parametrize(
    ("make_model", "shape"), [(dense_model, (4, 6)), (conv_model, (4, 8, 8, 3))]
)
def test_fp32_candidate_is_verified(make_model, shape):
    sample = np.random.default_rng(0).standard_normal(shape).astype("float32")
    opt = infertune.optimize(make_model(), sample, backends=[OpenVinoCpu()], verbose=False)
    result = opt.report.candidate("openvino-cpu")
    assert result.status in ("ok", "selected"), opt.report
    assert result.precision == "fp32"
    assert result.max_rel_err < FP32_RTOL  # f32 really pinned: bf16 here would give ~4e-3


@needs_openvino
@pytest.mark.parametrize(("make_model", "shape"), [(dense_model, (6,)), (conv_model, (8, 8, 3))])
def test_any_batch_size_matches_the_model(make_model, shape):
    model = make_model()
    rng = np.random.default_rng(1)
    sample = rng.standard_normal((4, *shape)).astype("float32")
    backend = prepared(model, sample, OpenVinoCpu())
    try:
        for batch in (4, 1, 9):  # the sample's batch size and two others, one compiled model
            x = rng.standard_normal((batch, *shape)).astype("float32")
            (out,) = backend.run([x])
            assert out.dtype == np.float32
            assert_matches_model(model(x), out, rtol=FP32_RTOL, atol=FP32_ATOL)
    finally:
        backend.close()


@needs_openvino
def test_outputs_are_copies_the_next_call_does_not_overwrite():
    model = dense_model()
    rng = np.random.default_rng(2)
    x1, x2 = (rng.standard_normal((4, 6)).astype("float32") for _ in range(2))
    backend = prepared(model, x1, OpenVinoCpu())
    (first,) = backend.run([x1])
    kept = first.copy()
    (second,) = backend.run([x2])
    np.testing.assert_array_equal(first, kept)
    assert not np.shares_memory(first, second)
    assert first.flags.owndata and first.flags.writeable
    backend.close()


@needs_openvino
def test_non_contiguous_input():
    model = dense_model()
    wide = np.random.default_rng(3).standard_normal((4, 12)).astype("float32")
    x = wide[:, ::2]  # a strided view: OpenVINO shares only C-contiguous memory
    backend = prepared(model, np.ascontiguousarray(x), OpenVinoCpu())
    assert_matches_model(model(np.ascontiguousarray(x)), backend.run([x])[0], FP32_RTOL, FP32_ATOL)
    backend.close()


@needs_openvino
def test_outputs_follow_the_export_order_with_two_inputs_and_outputs():
    # Two inputs (float and int32) and two outputs of different shapes, (4, 1) and (4, 3):
    # a wrong mapping of ports shows as a shape mismatch, not just a small error.
    model = dict_model()
    sample = dict_sample(np.random.default_rng(0))
    opt = infertune.optimize(model, sample, backends=[OpenVinoCpu()], verbose=False)
    result = opt.report.candidate("openvino-cpu")
    assert result.status in ("ok", "selected"), opt.report
    assert result.max_rel_err < FP32_RTOL


@needs_openvino
def test_throughput_hint_is_a_candidate_of_its_own():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    backends = [OpenVinoCpu(), OpenVinoCpu(performance_hint="THROUGHPUT")]
    assert backends[1].name == "openvino-cpu:throughput"
    opt = infertune.optimize(dense_model(), sample, backends=backends, verbose=False)
    for name in ("openvino-cpu", "openvino-cpu:throughput"):
        assert opt.report.candidate(name).status in ("ok", "selected"), opt.report
    with pytest.raises(ValueError, match="performance_hint"):
        OpenVinoCpu(performance_hint="FAST")


@needs_openvino
def test_performance_hint_follows_the_objective():
    import openvino.properties.hint as hints

    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    for objective, mode in (("latency", "LATENCY"), ("throughput", "THROUGHPUT")):
        backend = prepared(dense_model(), sample, OpenVinoCpu(), objective)
        assert backend.name == "openvino-cpu"
        assert str(backend._compiled.get_property(hints.performance_mode)) == mode


@needs_openvino
def test_bf16_is_judged_by_agreement_not_the_tolerance():
    reason = OpenVinoCpuBf16().available() or OpenVinoCpuBf16().not_worth_trying(RunFacts())
    if reason is not None:
        pytest.skip(reason)
    model = dense_model()
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    # bf16 keeps 8 significant bits (2**-8 = 3.9e-3 relative per rounding): far outside
    # rtol=1e-6, which measures its error and does not judge it (accuracy.py's agreement
    # rule does: within 5% relative error).
    opt = infertune.optimize(
        model, sample, backends=[OpenVinoCpuBf16()], precision=("fp32", "bf16"), rtol=1e-6,
        verbose=False,
    )  # fmt: skip
    bf16 = opt.report.candidate("openvino-cpu-bf16")
    assert bf16.status in ("ok", "selected"), opt.report
    assert bf16.precision == "bf16" and 1e-6 < bf16.max_rel_err < 5e-2
    assert bf16.gate.startswith("agreement")


def test_bf16_is_filtered_out_unless_allowed():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), sample, backends=[OpenVinoCpuBf16()], verbose=False)
    result = opt.report.candidate("openvino-cpu-bf16")
    reason = OpenVinoCpuBf16().available()
    if reason is None:
        assert result.status == "skipped" and "precision=" in result.reason
    else:  # availability comes first: allowing bf16 would not make it run on this CPU
        assert (result.status, result.reason) == ("unavailable", reason)


@needs_openvino
def test_bf16_is_skipped_on_a_cpu_without_bf16_units(monkeypatch):
    # Stands for a CPU without avx512_bf16 or AMX: OpenVINO would emulate bf16 there.
    monkeypatch.setattr(openvino_backend, "precision_instructions", lambda: ["avx512_vnni"])
    model = dense_model()
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        model, sample, backends=[OpenVinoCpuBf16()], precision=("fp32", "bf16"), verbose=False
    )
    bf16 = opt.report.candidate("openvino-cpu-bf16")
    assert bf16.status == "skipped" and "no bf16 units" in bf16.reason


def test_unavailable_without_openvino(monkeypatch):
    # The fake stands for a machine without openvino: with None in sys.modules, `import
    # openvino` raises ImportError and importlib.util.find_spec("openvino") returns None.
    monkeypatch.setitem(sys.modules, "openvino", None)
    for backend in (OpenVinoCpu(), OpenVinoCpuBf16()):
        reason = backend.available()
        assert reason is not None and install_hint("openvino") in reason

    model = dense_model()
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(model, sample, backends=[OpenVinoCpu()], verbose=False)
    result = opt.report.candidate("openvino-cpu")
    assert result.status == "unavailable"
    assert install_hint("openvino") in result.reason
    assert opt.backend != "openvino-cpu"
    x = np.random.default_rng(4).standard_normal((3, 6)).astype("float32")
    assert_matches_model(model(x), opt(x), rtol=FP32_RTOL, atol=FP32_ATOL)


_FIRST_DTYPES = """
import threading
import numpy as np
import openvino as ov
from openvino import opset13 as ops
from infertune.backends.openvino.cpu import port_dtype
x = ops.parameter([1, 4], np.float32, name="x")
compiled = ov.Core().compile_model(ov.Model([ops.relu(x)], [x]), "CPU")
barrier = threading.Barrier(4)
def first_call():
    barrier.wait()
    assert port_dtype(compiled.input(0)) == np.float32
threads = [threading.Thread(target=first_call) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("ok")
"""


@pytest.mark.slow
@needs_openvino
def test_the_first_port_dtypes_of_a_process_are_safe_from_threads_at_once():
    """OpenVINO's Type.to_dtype() deadlocks where two threads make a process's first call at
    once (13 of 30 processes hung with 4 threads): port_dtype takes them one at a time. Each
    of 8 fresh processes makes its first calls from 4 threads at once and must end."""
    import subprocess
    import time

    children = [
        subprocess.Popen(
            [sys.executable, "-c", _FIRST_DTYPES], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(8)
    ]
    deadline = time.monotonic() + 120  # each takes about 3 s; 8 at once on 2 cores, 10-20
    hung = 0
    try:
        for child in children:
            try:
                out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung += 1
                continue
            assert child.returncode == 0 and out.strip() == b"ok", err.decode()[-2000:]
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert hung == 0, f"{hung} of {len(children)} processes hung in their first to_dtype()"
