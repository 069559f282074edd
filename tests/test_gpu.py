"""GPU candidates on a machine without a GPU, and the GPU decisions that need none.

The real part: optimize() on this machine reports every GPU candidate `unavailable` with its
own reason, quickly. The decisions (availability, TensorRT profiles, engine-cache keys, IO
binding plans) are pure functions of `GpuFacts`; facts a CPU machine cannot produce (a GPU
the driver lists, onnxruntime-gpu installed, a TensorRT build of TensorFlow) are injected as
values: FAKES, because no GPU can exist here. Nothing in this file runs a GPU code path.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from conftest import dense_model

import infertune
from infertune.backends import BACKENDS
from infertune.environment import gpu_devices
from infertune.gpu import (
    GpuFacts,
    Profile,
    TfBuild,
    enable_tf_memory_growth,
    engine_cache_key,
    gpu_facts,
    iobinding_plan,
    profile_shapes,
    reason_unavailable,
)
from infertune.inputs import InputSignature, InputSpec
from infertune.structure import flatten

GPU_CANDIDATES = [
    "onnxruntime-cuda",
    "onnxruntime-cuda:graph",
    "onnxruntime-tensorrt",
    "onnxruntime-tensorrt-fp16",
    "tensorrt",
    "tensorrt-fp16",
    "tf-trt",
]

needs_no_gpu = pytest.mark.skipif(bool(gpu_devices()), reason="this machine has a GPU")

# Facts of a GPU machine where everything is installed (fake: no GPU can exist here).
ALL_THERE = GpuFacts(
    gpus=("NVIDIA H100 80GB HBM3",),
    onnxruntime_gpu=True,
    ort_providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    tensorrt=True,
    cuda_python=True,
    tf=TfBuild(version="2.17.0", is_cuda_build=True, is_tensorrt_build=True),
)
TF_221 = TfBuild(version="2.21.0", is_cuda_build=True, is_tensorrt_build=False)  # as measured


def signature(sample: dict, batch_free: bool = True) -> InputSignature:
    _, structure = flatten(sample)
    specs = [
        InputSpec(name, (None if batch_free else a.shape[0], *a.shape[1:]), a.dtype)
        for name, a in sample.items()
    ]
    return InputSignature(specs, structure, [a.shape for a in sample.values()])


# --- on this machine -----------------------------------------------------------------------


def test_gpu_candidates_are_registered_after_the_cpu_ones():
    names = list(BACKENDS)
    assert names[-len(GPU_CANDIDATES) :] == GPU_CANDIDATES
    assert names[0] == "tf-function"


@needs_no_gpu
def test_every_gpu_candidate_is_unavailable_in_a_real_report():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(),
        sample,
        backends=GPU_CANDIDATES,
        precision=("fp32", "fp16"),  # else the fp16 ones are `skipped` before availability
        verbose=False,
    )
    assert opt.backend == "keras-eager"
    for name in GPU_CANDIDATES:
        result = opt.report.candidate(name)
        assert result.status == "unavailable", (name, result.reason)
        assert result.reason.startswith("no NVIDIA GPU here"), result.reason
    reason = {name: opt.report.candidate(name).reason for name in GPU_CANDIDATES}
    for name in ("onnxruntime-cuda", "onnxruntime-cuda:graph", "onnxruntime-tensorrt"):
        assert "infertune[gpu]" in reason[name]  # onnxruntime-gpu is not installed here
    assert "infertune[tensorrt]" in reason["tensorrt"]
    assert "cuda-python" in reason["tensorrt-fp16"]
    # optimize() has imported TensorFlow (2.21 here): its build is the reason, not a guess.
    assert "not built with TensorRT" in reason["tf-trt"], reason["tf-trt"]


@needs_no_gpu
def test_asking_all_gpu_candidates_costs_nothing_noticeable():
    import tensorflow  # noqa: F401  (as in optimize(): imported, so tf-trt reads its build)

    backends = [BACKENDS[name]() for name in GPU_CANDIDATES]
    start = time.perf_counter()
    reasons = [backend.available() for backend in backends]
    elapsed = time.perf_counter() - start
    assert all(reasons), reasons
    # 50 ms for all seven: what a user would not notice; measured here about 10 ms (a few
    # find_spec lookups and /proc reads each), so a GPU runtime import would blow it.
    assert elapsed < 0.05, f"{elapsed * 1000:.1f} ms"


def test_facts_here_are_read_without_importing_gpu_runtimes():
    import sys

    facts = gpu_facts()
    assert facts.gpus == tuple(gpu_devices())
    assert "tensorrt" not in sys.modules and "cuda" not in sys.modules


def test_memory_growth_without_a_gpu_does_nothing():
    done = enable_tf_memory_growth()
    if not gpu_devices():
        assert done == {"gpus": [], "enabled": [], "already": [], "too_late": []}


# --- availability decisions, with injected facts --------------------------------------------


def test_everything_installed_on_a_gpu_means_available():
    for kind in ("onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "tf-trt"):
        assert reason_unavailable(kind, ALL_THERE) is None, kind


def test_gpu_without_onnxruntime_gpu_names_the_extra():
    facts = dataclasses.replace(ALL_THERE, onnxruntime_gpu=False, ort_providers=None)
    reason = reason_unavailable("onnxruntime-cuda", facts)
    assert reason == "onnxruntime-gpu is not installed (pip install 'infertune[gpu]')"


def test_cpu_onnxruntime_shadowing_the_gpu_one_is_explained():
    facts = dataclasses.replace(ALL_THERE, ort_providers=("CPUExecutionProvider",))
    reason = reason_unavailable("onnxruntime-cuda", facts)
    assert "no CUDAExecutionProvider" in reason and "pip uninstall onnxruntime" in reason


def test_tensorrt_needs_the_package_and_cuda_python():
    facts = dataclasses.replace(ALL_THERE, tensorrt=False, cuda_python=False)
    reason = reason_unavailable("tensorrt", facts)
    assert "infertune[tensorrt]" in reason and "cuda-python" in reason
    assert "infertune[tensorrt]" in reason_unavailable("onnxruntime-tensorrt", facts)


def test_tf_221_build_gives_the_tf_trt_reason():
    facts = dataclasses.replace(ALL_THERE, tf=TF_221)
    reason = reason_unavailable("tf-trt", facts)
    assert reason.startswith("TensorFlow 2.21.0 was not built with TensorRT")
    assert "\n" not in reason


def test_no_gpu_comes_first_and_lists_what_else_is_missing():
    facts = GpuFacts((), False, ("CPUExecutionProvider",), False, False, TF_221)
    for kind in ("onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "tf-trt"):
        reason = reason_unavailable(kind, facts)
        assert reason.startswith("no NVIDIA GPU here (") and "; also " in reason, reason
    no_gpu_only = dataclasses.replace(ALL_THERE, gpus=())
    assert reason_unavailable("tensorrt", no_gpu_only) == (
        "no NVIDIA GPU here (the driver lists none in /proc/driver/nvidia)"
    )
    with pytest.raises(ValueError, match="Unknown GPU candidate kind"):
        reason_unavailable("cuda-magic", facts)


# --- TensorRT profiles and engine keys -----------------------------------------------------


def test_profile_covers_batch_one_to_the_largest_size_in_use():
    sig = signature({"a": np.zeros((8, 3, 4), "float32"), "b": np.zeros((8, 5), "int32")})
    profile = profile_shapes(sig, batch_sizes=[8, 32])
    assert profile.shapes == (
        ("in_0", (1, 3, 4), (8, 3, 4), (32, 3, 4)),
        ("in_1", (1, 5), (8, 5), (32, 5)),
    )
    assert profile.max_batch() == 32
    assert profile.covers("in_0", (17, 3, 4)) and not profile.covers("in_0", (33, 3, 4))
    assert not profile.covers("in_0", (8, 3, 5))
    assert profile.ort_options() == {
        "trt_profile_min_shapes": "in_0:1x3x4,in_1:1x5",
        "trt_profile_opt_shapes": "in_0:8x3x4,in_1:8x5",
        "trt_profile_max_shapes": "in_0:32x3x4,in_1:32x5",
    }
    assert Profile.from_json(profile.to_json()) == profile


def test_profile_of_a_fixed_batch_is_the_sample_shape():
    sig = signature({"a": np.zeros((2, 6), "float32")}, batch_free=False)
    assert profile_shapes(sig, [64]).shapes == (("in_0", (2, 6), (2, 6), (2, 6)),)
    with pytest.raises(ValueError, match="positive"):
        profile_shapes(sig, [0])


def test_engine_cache_key_is_stable_and_changes_with_what_makes_an_engine():
    sig = signature({"a": np.zeros((4, 6), "float32")})
    profile = profile_shapes(sig, [64])
    args = (b"onnx-bytes", "fp32", profile, "10.9.0", "NVIDIA H100 80GB HBM3")
    key = engine_cache_key(*args)
    assert key == engine_cache_key(*args) and len(key) == 32 and int(key, 16) >= 0
    changed = [
        (b"other-bytes", *args[1:]),
        (args[0], "fp16", *args[2:]),
        (*args[:2], profile_shapes(sig, [128]), *args[3:]),
        (*args[:3], "10.10.0", args[4]),
        (*args[:4], "NVIDIA A100-SXM4-40GB"),
    ]
    assert len({engine_cache_key(*c) for c in changed} | {key}) == len(changed) + 1


# --- IO binding plans ----------------------------------------------------------------------


def test_cuda_graph_serves_exactly_the_sample_shapes():
    sig = signature({"a": np.zeros((4, 6), "float32"), "b": np.zeros((4, 2), "int64")})
    plan = iobinding_plan(sig, ["in_0", "in_1"], ["out"], want_cuda_graph=True)
    assert plan.cuda_graph and plan.input_shapes == ((4, 6), (4, 2))
    assert plan.input_dtypes == (np.dtype("float32"), np.dtype("int64"))
    assert plan.uses_graph([(4, 6), (4, 2)])
    assert not plan.uses_graph([(5, 6), (5, 2)])  # another batch: the plain session
    plain = iobinding_plan(sig, ["in_0", "in_1"], ["out"], want_cuda_graph=False)
    assert not plain.cuda_graph and not plain.uses_graph([(4, 6), (4, 2)])


def test_no_cuda_graph_for_inputs_that_stay_on_the_host():
    sig = signature({"a": np.array([["x"], ["y"]], dtype=object)})
    plan = iobinding_plan(sig, ["in_0"], ["out"], want_cuda_graph=True)
    assert not plan.cuda_graph and "neither numeric" in plan.why_no_graph
    with pytest.raises(ValueError, match="input names"):
        iobinding_plan(sig, ["in_0", "in_1"], ["out"], want_cuda_graph=True)
