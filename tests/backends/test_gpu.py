"""GPU candidates on a machine without a GPU, and every GPU code path that can run without one.

The real part: optimize() on this machine reports every GPU candidate `unavailable` with its
own reason, quickly, the fp16 ones included; the facts are read from this machine's files
(which distribution installed `onnxruntime`, what a shared library links, where a library
is); ONNX Runtime's IO binding and the CUDA-graph call path run end to end with the device
set to "cpu" on the CPU provider; the float16 graph the TensorRT 11 fp16 engine is built
from runs in ONNX Runtime; the TensorRT, cuda-python and TF-TRT names the backends call are
checked against the installed bindings where they import. `infertune env --check` runs.

FAKES, because no GPU can exist here: facts a CPU machine cannot produce (a GPU the driver
lists, onnxruntime-gpu installed, a TensorRT build of TensorFlow) are injected as values into
the decisions, and the IO-binding backend is told its device is "cpu". Nothing here runs on
a GPU (docs/gpu.md says what did run where).
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import time

import numpy as np
import pytest
from helpers import dense_model

import infertune
from infertune.backends.onnxruntime.cuda import (
    OnnxRuntimeCuda,
    OnnxRuntimeCudaFp16,
)
from infertune.backends.onnxruntime.iobinding import iobinding_plan
from infertune.backends.registry import (
    BACKENDS,
    GPU_BACKENDS,
)
from infertune.backends.tensorrt.engine import (
    build_settings,
    host_shape,
)
from infertune.backends.tensorrt.profiles import (
    Profile,
    engine_cache_key,
    profile_shapes,
)
from infertune.export.onnx import OnnxExport
from infertune.export.onnx_fp16 import float16_export, float16_onnx
from infertune.model.inputs import (
    InputSignature,
    InputSpec,
)
from infertune.model.structure import flatten
from infertune.system.environment import (
    gpu_devices,
    install_hint,
    package_version,
)
from infertune.system.gpu import (
    NO_GPU,
    GpuFacts,
    TfBuild,
    enable_tf_memory_growth,
    gpu_facts,
    reason_unavailable,
    tensorrt_major,
)
from infertune.system.gpu_libraries import (
    elf_needed,
    find_library,
    installed_by,
    loaded_libraries,
    module_directory,
    preload_cuda,
    preload_tensorrt,
)

GPU_CANDIDATES = [
    "onnxruntime-cuda",
    "onnxruntime-cuda:graph",
    "onnxruntime-cuda-fp16",
    "onnxruntime-cuda-fp16:graph",
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
    onnxruntime=("onnxruntime-gpu",),
    ort_providers=("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    ort_tensorrt_links=("libnvinfer.so.10", "libnvonnxparser.so.10"),  # onnxruntime-gpu 1.31
    ort_tensorrt_missing=(),
    tensorrt="tensorrt-cu13 10.16.1.11",
    tensorrt_error=None,
    cuda_python="13.4.4",
    cuda_python_error=None,
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
    assert names[-len(GPU_CANDIDATES) :] == GPU_CANDIDATES == list(GPU_BACKENDS)
    assert names[0] == "tf-function"


@needs_no_gpu
def test_every_gpu_candidate_is_unavailable_in_a_real_report():
    sample = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    # The default precision (fp32 only): the fp16 candidates are `unavailable` all the same,
    # since allowing fp16 would not let them run here (availability comes first).
    opt = infertune.optimize(dense_model(), sample, backends=GPU_CANDIDATES, verbose=False)
    assert opt.backend == "keras-eager"
    for name in GPU_CANDIDATES:
        result = opt.report.candidate(name)
        assert result.status == "unavailable", (name, result.reason)
        assert result.reason.startswith(NO_GPU), result.reason
    reason = {name: opt.report.candidate(name).reason for name in GPU_CANDIDATES}
    facts = gpu_facts()
    if "onnxruntime-gpu" not in facts.onnxruntime:  # the CPU install CI tests
        for name in ("onnxruntime-cuda", "onnxruntime-cuda-fp16", "onnxruntime-tensorrt"):
            assert install_hint("gpu") in reason[name]
    if facts.tensorrt is None:
        assert install_hint("tensorrt") in reason["tensorrt"]
    if facts.cuda_python is None:
        assert "cuda-python" in reason["tensorrt-fp16"]
    # optimize() has imported TensorFlow (2.21 here): its build is the reason, not a guess.
    assert "not built with TensorRT" in reason["tf-trt"], reason["tf-trt"]


@needs_no_gpu
def test_asking_all_gpu_candidates_imports_nothing():
    """What the timing check below holds to 50 ms, without a clock: asking every GPU
    candidate whether it can run here imports no module (a GPU runtime's import is the
    cost it guards against), whatever the machine's load."""
    import sys

    import tensorflow  # noqa: F401  (as in optimize(): imported, so tf-trt reads its build)

    backends = [BACKENDS[name]() for name in GPU_CANDIDATES]
    before = set(sys.modules)
    reasons = [backend.available() for backend in backends]
    assert all(reasons), reasons
    imported = {name for name in set(sys.modules) - before if not name.startswith("infertune")}
    assert not imported, sorted(imported)


@needs_no_gpu
@pytest.mark.timing  # a wall-clock bound (tests/conftest.py: tiers)
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
    if not facts.gpus:
        assert facts.tensorrt_error is None and facts.cuda_python_error is None  # not tried
    # The CPU install here: the `onnxruntime` module comes from the onnxruntime distribution.
    assert facts.onnxruntime == ("onnxruntime",) and facts.ort_tensorrt_links == ()


@needs_no_gpu
def test_memory_growth_without_a_gpu_does_nothing():
    done = enable_tf_memory_growth()
    assert done == {"gpus": [], "enabled": [], "already": [], "too_late": []}


# --- availability decisions, with injected facts --------------------------------------------


def test_everything_installed_on_a_gpu_means_available():
    for kind in ("onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "tf-trt"):
        assert reason_unavailable(kind, ALL_THERE) is None, kind


def test_gpu_without_onnxruntime_gpu_names_the_extra():
    facts = dataclasses.replace(
        ALL_THERE, onnxruntime=(), ort_providers=None, ort_tensorrt_links=()
    )
    reason = reason_unavailable("onnxruntime-cuda", facts)
    assert reason == f"onnxruntime-gpu is not installed ({install_hint('gpu')})"
    # Beside the CPU onnxruntime, installing the GPU one is not enough: both write the module.
    cpu_only = dataclasses.replace(facts, onnxruntime=("onnxruntime",))
    assert reason_unavailable("onnxruntime-cuda", cpu_only) == (
        f"onnxruntime-gpu is not installed (pip uninstall -y onnxruntime onnxruntime-gpu, "
        f"then {install_hint('gpu')})"
    )


def test_cpu_onnxruntime_shadowing_the_gpu_one_is_explained():
    facts = dataclasses.replace(
        ALL_THERE,
        onnxruntime=("onnxruntime", "onnxruntime-gpu"),  # both wrote the module
        ort_providers=("CPUExecutionProvider",),  # and the CPU one won
    )
    reason = reason_unavailable("onnxruntime-cuda", facts)
    assert "no CUDAExecutionProvider" in reason and "both installed" in reason
    # The fix works now that the gpu extra does not bring the CPU onnxruntime back.
    assert f"pip uninstall -y onnxruntime onnxruntime-gpu, then {install_hint('gpu')}" in reason


def test_tensorrt_needs_the_package_that_imports_and_cuda_python():
    facts = dataclasses.replace(ALL_THERE, tensorrt=None, cuda_python=None)
    reason = reason_unavailable("tensorrt", facts)
    assert f"tensorrt is not installed ({install_hint('tensorrt')})" in reason
    assert "cuda-python is not installed" in reason
    # Installed, its libraries missing: `import tensorrt` fails, so the candidate is
    # unavailable with that error, not `failed` in the middle of optimize().
    broken = dataclasses.replace(
        ALL_THERE, tensorrt_error="ImportError: libnvinfer.so.10: cannot open shared object file"
    )
    reason = reason_unavailable("tensorrt", broken)
    assert reason.startswith("tensorrt-cu13 10.16.1.11 is installed but `import tensorrt` fails")
    assert "libnvinfer.so.10" in reason


def test_onnxruntime_tensorrt_needs_the_tensorrt_major_its_provider_links():
    # TensorRT 11 installed (what `tensorrt>=10` resolves to), no libnvinfer.so.10 anywhere.
    facts = dataclasses.replace(
        ALL_THERE,
        tensorrt="tensorrt-cu13 11.4.0.106",
        ort_tensorrt_missing=("libnvinfer.so.10", "libnvonnxparser.so.10"),
    )
    reason = reason_unavailable("onnxruntime-tensorrt", facts)
    assert "links libnvinfer.so.10, libnvonnxparser.so.10 (TensorRT 10)" in reason
    assert "tensorrt-cu13 11.4.0.106 is installed and cannot serve it" in reason
    assert install_hint("tensorrt") in reason
    assert reason_unavailable("onnxruntime-cuda", facts) is None  # CUDA does not need it
    no_provider = dataclasses.replace(ALL_THERE, ort_tensorrt_links=(), ort_providers=None)
    assert "no TensorRT provider library" in reason_unavailable("onnxruntime-tensorrt", no_provider)


def test_tf_221_build_gives_the_tf_trt_reason():
    facts = dataclasses.replace(ALL_THERE, tf=TF_221)
    reason = reason_unavailable("tf-trt", facts)
    assert reason.startswith("TensorFlow 2.21.0 was not built with TensorRT")
    assert "\n" not in reason


def test_no_gpu_comes_first_and_lists_what_else_is_missing():
    facts = GpuFacts(
        gpus=(),
        onnxruntime=("onnxruntime",),
        ort_providers=("CPUExecutionProvider",),
        ort_tensorrt_links=(),
        ort_tensorrt_missing=(),
        tensorrt=None,
        tensorrt_error=None,
        cuda_python=None,
        cuda_python_error=None,
        tf=TF_221,
    )
    for kind in ("onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "tf-trt"):
        reason = reason_unavailable(kind, facts)
        assert reason.startswith("no NVIDIA GPU here (") and "; also " in reason, reason
    no_gpu_only = dataclasses.replace(ALL_THERE, gpus=())
    assert reason_unavailable("tensorrt", no_gpu_only) == NO_GPU
    assert NO_GPU == "no NVIDIA GPU here (the driver lists none in /proc/driver/nvidia)"
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


# --- the native libraries, read from this machine's files -----------------------------------


def test_installed_by_names_the_distribution_that_wrote_the_module():
    assert installed_by("onnxruntime") == (("onnxruntime", package_version("onnxruntime")),)
    assert installed_by("no_such_module_here") == ()


def test_elf_needed_reads_what_a_library_links(tmp_path):
    capi = module_directory("onnxruntime") / "capi"
    pybind = next(capi.glob("onnxruntime_pybind11_state*.so"))
    needed = elf_needed(pybind)
    assert "libc.so.6" in needed and "libstdc++.so.6" in needed, needed
    text = tmp_path / "not-a-library.so"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        elf_needed(text)


def test_libraries_are_found_and_a_missing_tensorrt_is_named():
    libc = find_library("libc.so.6")
    assert libc is not None and libc.endswith("libc.so.6")
    if find_library("libnvinfer.so.10") is not None:
        pytest.skip("TensorRT 10 is installed here")
    with pytest.raises(RuntimeError, match=r"links libnvinfer\.so\.10, found neither"):
        preload_tensorrt(("libnvinfer.so.10",))


def test_preloading_cuda_with_the_cpu_onnxruntime_does_nothing():
    # The real onnxruntime.preload_dlls(): in the CPU build it returns at once, prints nothing.
    assert preload_cuda() == ()
    assert not any("libcudart" in path for path in loaded_libraries())
    assert any("onnxruntime" in path for path in loaded_libraries())  # it did import


# --- ONNX Runtime's GPU call paths, run on the CPU -----------------------------------------


class IoBindingOnCpu(OnnxRuntimeCuda):
    """FAKE device, because no GPU can exist here: OnnxRuntimeCuda exactly, with its device
    set to "cpu" and the CPU provider, so that its IO-binding call and its CUDA-graph call
    (fixed OrtValue buffers bound once, update_inplace in, .numpy() out) run for real. Graph
    capture itself needs a GPU: the graph session is a plain CPU session here."""

    name = "iobinding-on-cpu"
    provider = "CPUExecutionProvider"
    device = "cpu"
    rehearse_in_child = False  # built in this process: the child knows only registered names

    def available(self):
        return None

    def provider_options(self, target, model_bytes):
        return [("CPUExecutionProvider", {})]

    def graph_provider_options(self, providers):
        return providers


def test_iobinding_and_cuda_graph_call_paths_pass_verification_on_the_cpu():
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(
        dense_model(),
        x,
        backends=[IoBindingOnCpu(), IoBindingOnCpu(cuda_graph=True)],
        isolation="off",
        verbose=False,
    )
    for name in ("iobinding-on-cpu", "iobinding-on-cpu:graph"):
        result = opt.report.candidate(name)
        assert result.status in ("ok", "selected"), (name, result.reason)
        assert result.max_rel_err < 1e-6  # float32 on the same CPU kernels: round-off only


def test_cuda_graph_call_serves_the_sample_shape_and_the_plain_path_the_others():
    from helpers import prepared_backend

    model = dense_model()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6)).astype("float32")
    backend, _ = prepared_backend(IoBindingOnCpu(cuda_graph=True), model, x)
    assert backend._graph is not None and backend._plan.uses_graph([x.shape])
    # Its calls go through its own run (the bound buffers), never the CPU session's shortcut.
    assert backend.single_runner(x.shape) is None
    expected = np.asarray(model(x))
    # 1e-5: float32 kernels of ONNX Runtime vs TensorFlow's on the same CPU: round-off only.
    np.testing.assert_allclose(backend._graph.run([x])[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(backend.run([x])[0], expected, rtol=1e-5, atol=1e-6)
    other = rng.standard_normal((7, 6)).astype("float32")  # not the captured shape
    assert not backend._plan.uses_graph([other.shape])
    np.testing.assert_allclose(
        backend.run([other])[0], np.asarray(model(other)), rtol=1e-5, atol=1e-6
    )
    # The graph's buffers are shared: concurrent calls take turns and get their own outputs.
    inputs = [rng.standard_normal((4, 6)).astype("float32") for _ in range(4)]
    wanted = [backend.run([a])[0] for a in inputs]
    got = [None] * 4

    def call(i):
        for _ in range(50):
            got[i] = backend.run([inputs[i]])[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(4):
        np.testing.assert_array_equal(got[i], wanted[i])
    backend.close()


class Fp16OnCpu(IoBindingOnCpu, OnnxRuntimeCudaFp16):
    """FAKE device, because no GPU can exist here: OnnxRuntimeCudaFp16 (the float16 graph,
    IO binding, the CUDA graph's fixed buffers) on the CPU provider with its device set to
    "cpu", as IoBindingOnCpu (ONNX Runtime runs the float16 graph's operators on the CPU too)."""

    name = "fp16-on-cpu"
    rehearse_in_child = False  # built in this process: the child knows only registered names


def test_cuda_fp16_asks_cudnn_for_its_heuristic_convolution_algorithms():
    """On an H100 (docs/gpu.md) cuDNN's heuristic choice ran MobileNetV2's
    float16 convolutions 0.84-0.85x the time of the exhaustive search's at batch 32, and the
    same at batch 1; float32 gained nothing, so it keeps the provider's default."""
    fp16, fp32 = OnnxRuntimeCudaFp16(cuda_graph=True), OnnxRuntimeCuda(cuda_graph=True)
    for backend, search in ((fp16, {"cudnn_conv_algo_search": "HEURISTIC"}), (fp32, {})):
        plain = backend.provider_options(None, b"")
        assert plain == [("CUDAExecutionProvider", {"use_tf32": "0", **search})]
        graph = backend.graph_provider_options(plain)
        assert graph[0][1] == {"use_tf32": "0", **search, "enable_cuda_graph": "1"}


def test_cuda_fp16_runs_the_float16_graph_is_judged_by_the_gate_and_loads(tmp_path):
    import onnx
    from helpers import prepared_backend, target_for

    model = dense_model()
    x = np.random.default_rng(3).standard_normal((16, 6)).astype("float32")
    for graph in (False, True):  # each alone: the slower of two is not judged
        backend = Fp16OnCpu(cuda_graph=graph)
        opt = infertune.optimize(
            model, x, precision=("fp32", "fp16"), backends=[backend], isolation="off",
            verbose=False,
        )  # fmt: skip
        result = opt.report.candidate(backend.name)
        assert result.status in ("ok", "selected"), (backend.name, result.reason)
        assert result.precision == "fp16" and result.gate is not None  # the gate judged it
        assert result.quantization and "float16" in result.quantization
        # float16 keeps 11 significant bits: two layers' round-off, not float32's 1e-7.
        assert 1e-6 < result.max_rel_err < 1e-2, result.max_rel_err
        opt.close()
    backend, signature = prepared_backend(Fp16OnCpu(cuda_graph=True), model, x)
    graph = onnx.load_from_string(backend._saved[0].model_bytes).graph
    assert {i.data_type for i in graph.initializer} == {onnx.TensorProto.FLOAT16}
    # The saved model.onnx is the float16 graph; loaded, it runs as it ran.
    settings = backend.save_artifact(tmp_path)
    assert settings["cuda_graph"] is True
    target = target_for(model, x)
    loading = type(target)(None, signature, target.output_structure, target.output_dtypes)
    loaded = Fp16OnCpu.load_artifact(tmp_path, settings, loading)
    saved = onnx.load(str(tmp_path / settings["file"])).graph
    assert {i.data_type for i in saved.initializer} == {onnx.TensorProto.FLOAT16}
    for batch in (16, 5):  # the captured shape and another
        inputs = signature.flatten(x[:batch])
        np.testing.assert_array_equal(loaded.run(inputs)[0], backend.run(inputs)[0])
    loaded.close()
    backend.close()


# --- TensorRT 10 and 11 ---------------------------------------------------------------------


def test_build_settings_follow_the_tensorrt_major():
    assert build_settings(10, "fp32") == build_settings(10, "fp32")
    ten_fp16, eleven_fp16 = build_settings(10, "fp16"), build_settings(11, "fp16")
    assert ten_fp16.graph == "fp32" and ten_fp16.set_flags == ("FP16",)
    assert eleven_fp16.graph == "fp16" and eleven_fp16.set_flags == ()  # no FP16 flag in 11
    for major in (10, 11, 12):
        for precision in ("fp32", "fp16"):
            settings = build_settings(major, precision)
            assert settings.clear_flags == ("TF32",)  # float32 layers stay float32
            assert "EXPLICIT_BATCH" not in settings.network_flags  # gone in 11, default in 10
    assert build_settings(11, "fp32").graph == "fp32"
    with pytest.raises(ValueError, match="fp32 or fp16"):
        build_settings(10, "int8")
    with pytest.raises(ValueError, match="TensorRT 10 or later"):
        build_settings(8, "fp32")
    assert tensorrt_major("10.16.1.11") == 10 and tensorrt_major("11.4.0.106") == 11


def test_a_data_dependent_output_shape_is_a_clear_failure():
    assert host_shape("out_0", (8, 4)) == (8, 4)
    with pytest.raises(RuntimeError, match=r"output out_0 has a data-dependent shape \(-1, 4\)"):
        host_shape("out_0", (-1, 4))


def test_the_float16_graph_for_tensorrt_11_runs_and_is_reduced_precision():
    import onnx
    import onnxruntime
    from helpers import prepared_backend

    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu

    model = dense_model()
    x = np.random.default_rng(2).standard_normal((4, 6)).astype("float32")
    backend, _ = prepared_backend(OnnxRuntimeCpu(), model, x)
    fp16 = float16_onnx(backend._saved[0].model_bytes)
    graph = onnx.load_from_string(fp16).graph
    assert {i.data_type for i in graph.initializer} == {onnx.TensorProto.FLOAT16}
    float32 = onnx.TensorProto.FLOAT
    assert [i.type.tensor_type.elem_type for i in graph.input] == [float32]  # io stays fp32
    assert [o.type.tensor_type.elem_type for o in graph.output] == [float32]
    session = onnxruntime.InferenceSession(fp16, providers=["CPUExecutionProvider"])
    y = session.run(None, {"in_0": x})[0]
    reference = np.asarray(model(x))
    error = np.linalg.norm(y - reference) / np.linalg.norm(reference)
    # float16 keeps 11 significant bits (2^-11 = 4.9e-4 per rounding): two layers land near
    # 1e-3, above float32 round-off (1e-7) and well below 1e-2 (a wrong graph is ~1).
    assert 1e-6 < error < 1e-2, error


def test_the_float16_conversion_says_it_does_not_read_external_data(tmp_path):
    # A model past 2 GB is exported with its weights in model.onnx.data beside model.onnx.
    exported = OnnxExport(b"", ["in_0"], ["out_0"], 0.0, 17, directory=tmp_path)
    with pytest.raises(RuntimeError, match="external data"):
        float16_export(exported)


# The TensorRT names backends/tensorrt/engine.py calls, checked against the installed bindings.
TENSORRT_CALLS = {
    "Logger": ("ERROR",),
    "Runtime": ("deserialize_cuda_engine",),
    "Builder": (
        "create_network",
        "create_builder_config",
        "create_optimization_profile",
        "build_serialized_network",
    ),
    "OnnxParser": ("parse", "num_errors", "get_error"),
    "IBuilderConfig": ("set_flag", "clear_flag", "add_optimization_profile"),
    "IOptimizationProfile": ("set_shape",),
    "ICudaEngine": ("create_execution_context", "get_tensor_dtype"),
    "IExecutionContext": (
        "set_input_shape",
        "get_tensor_shape",
        "set_tensor_address",
        "execute_async_v3",
    ),
}


def test_tensorrt_calls_exist_in_the_installed_bindings():
    trt = pytest.importorskip("tensorrt", reason="TensorRT does not import here")
    major = tensorrt_major(trt.__version__)
    for cls, members in TENSORRT_CALLS.items():
        for member in members:
            assert hasattr(getattr(trt, cls), member), f"tensorrt {trt.__version__}: {cls}.{member}"
    assert callable(trt.nptype)
    for precision in ("fp32", "fp16"):
        settings = build_settings(major, precision)
        for flag in settings.set_flags + settings.clear_flags:
            assert flag in trt.BuilderFlag.__members__, (trt.__version__, flag)
        for flag in settings.network_flags:
            assert flag in trt.NetworkDefinitionCreationFlag.__members__, (trt.__version__, flag)


def test_cuda_python_calls_exist_and_report_errors_as_values():
    runtime = pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    from infertune.backends.tensorrt.engine import _checked

    for name in ("cudaMalloc", "cudaFree", "cudaMemcpyAsync", "cudaStreamCreate"):
        assert callable(getattr(runtime, name))
    for name in ("cudaStreamSynchronize", "cudaStreamDestroy"):
        assert callable(getattr(runtime, name))
    assert (
        runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
        != runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
    )
    if gpu_devices():
        pytest.skip("a GPU is here: a stream would be created")
    # cuda-python 13 returns (error, value) instead of raising: without a driver, the error.
    result = runtime.cudaStreamCreate()
    assert isinstance(result, tuple) and result[0] != runtime.cudaError_t.cudaSuccess
    with pytest.raises(RuntimeError, match="CUDA runtime error"):
        _checked(runtime, result)


def test_tf_trt_arguments_match_the_installed_converter(tmp_path):
    from tensorflow.python.compiler.tensorrt import trt_convert

    from infertune.backends.tf_trt import TfTrt

    x = np.zeros((2, 6), "float32")
    signature = InputSignature([InputSpec("in_0", (None, 6), x.dtype)], flatten(x)[1], [x.shape])
    target = type("T", (), {"signature": signature})()
    arguments = TfTrt().converter_arguments(target, tmp_path, trt_convert)
    assert "conversion_params" not in arguments  # deprecated
    inspect.signature(trt_convert.TrtGraphConverterV2.__init__).bind(None, **arguments)
    assert arguments["precision_mode"] in trt_convert.TrtPrecisionMode.supported_precision_modes()


# --- infertune env --check ------------------------------------------------------------------


@pytest.mark.slow
@needs_no_gpu
def test_env_check_runs_every_candidate_and_says_why_no_gpu_one_can(capsys):
    from infertune.cli import main

    code = main(["env", "--check", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"No GPU candidate can run here: {NO_GPU}" in out
    assert "| candidate | status | p50 ms | max rel err | error / reason |" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    for name in ("tf-function", "onnxruntime-cpu", "openvino-cpu", "litert"):
        assert rows[name].split("|")[2].strip() in ("ok", "selected"), rows[name]
    for name in GPU_CANDIDATES:
        label = name if "fp16" not in name else f"{name} (fp16)"
        assert rows[label].split("|")[2].strip() == "unavailable", rows[label]
    assert "ran end to end (exit status 0)" in out


def test_a_bucket_of_the_cuda_graph_variant_captures_graphs_of_its_own():
    """FAKE device (IoBindingOnCpu: no GPU can exist here): a bucket's shaped runner captures
    a graph per shape it meets, in a session of its own, up to GRAPHS_PER_BUCKET, and sends
    the rest to the plain session; every call's outputs are the model's."""
    from helpers import prepared_backend

    from infertune.backends.onnxruntime.cuda import GRAPHS_PER_BUCKET

    model = dense_model()
    rng = np.random.default_rng(2)
    backend, _ = prepared_backend(
        IoBindingOnCpu(cuda_graph=True), model, rng.random((4, 6), "float32")
    )
    assert backend.bucket_memory_factor == 1.0
    run = backend.shaped_runner()
    (graphs,) = backend._bucket_graphs
    for batch in [3, 5, 3, 9, 2, 11, 5, 13]:
        x = rng.standard_normal((batch, 6)).astype("float32")
        # 1e-5: float32 kernels of ONNX Runtime vs TensorFlow's on the same CPU: round-off only.
        np.testing.assert_allclose(run([x])[0], np.asarray(model(x)), rtol=1e-5, atol=1e-6)
    assert len(graphs._graphs) == GRAPHS_PER_BUCKET  # 3, 5, 9, 2: then the plain session
    assert sorted(s[0][0] for s in graphs._graphs) == [2, 3, 5, 9]
    plain = IoBindingOnCpu()
    assert plain.bucket_memory_factor == 0.0
