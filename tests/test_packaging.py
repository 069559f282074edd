"""The install commands: one per machine, and the GPU one never brings the CPU onnxruntime.

onnxruntime and onnxruntime-gpu install the same `onnxruntime` module: where both are
installed the last one written wins (the CPU one, as pip orders them), ONNX Runtime has no
CUDA provider, and `pip check` says nothing. So the base requirements name neither, each
extra names one, and a real resolution of the `gpu` extra (pip's own resolver against the
registry, nothing installed) must not contain `onnxruntime`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CPU_RUNTIMES = {"onnxruntime", "openvino", "ai-edge-litert"}
# What the cpu extra brings besides the runtimes: NNCF, which quantizes to int8 for OpenVINO.
CPU_TOOLS = {"nncf"}


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(text).name.lower() for text in requirements}


def test_no_requirement_list_names_both_onnxruntime_packages():
    project = _project()
    assert not _names(project["dependencies"]) & {"onnxruntime", "onnxruntime-gpu"}
    for extra, requirements in project["optional-dependencies"].items():
        names = _names(requirements)
        assert not {"onnxruntime", "onnxruntime-gpu"} <= names, extra


def test_the_cpu_install_brings_every_cpu_runtime_and_ci_tests_it():
    extras = _project()["optional-dependencies"]
    assert _names(extras["cpu"]) == CPU_RUNTIMES | CPU_TOOLS
    # CI installs [test]: the CPU runtimes and tools too
    assert _names(extras["test"]) >= CPU_RUNTIMES | CPU_TOOLS
    for gpu_extra in ("gpu", "tensorrt"):  # a GPU machine runs the CPU candidates too
        assert _names(extras[gpu_extra]) >= {"onnxruntime-gpu", "openvino", "ai-edge-litert"}
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -c constraints.txt ".[cpu]" && infertune demo' in readme
    # CI runs README's test command, every tier of it (tests/conftest.py: `python -m pytest`
    # alone leaves the slow, network and timing tests out).
    tests = "python -m pytest -q --all-tiers"
    assert f'pip install -c constraints.txt ".[test]" && {tests}' in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'pip install -q -c constraints.txt ".[test]" && {tests}' in ci


def test_tensorrt_extra_pairs_onnxruntime_with_the_tensorrt_major_its_provider_links():
    requirements = {
        r.name: r for r in map(Requirement, _project()["optional-dependencies"]["tensorrt"])
    }
    # onnxruntime-gpu 1.31's TensorRT provider links libnvinfer.so.10 (read from the wheel
    # with readelf): TensorRT 10 in, TensorRT 11 out, and ONNX Runtime held where checked.
    tensorrt = requirements["tensorrt-cu13"].specifier
    assert Version("10.16.1.11") in tensorrt and Version("11.4.0.106") not in tensorrt
    ort = requirements["onnxruntime-gpu"]
    assert {"cuda", "cudnn"} <= ort.extras
    assert Version("1.31.1") in ort.specifier and Version("1.32.0") not in ort.specifier
    assert "cuda-python" in requirements


def _index_reachable() -> str | None:
    """None if pip's index answers, else why not (the dry run then has nothing to ask)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/onnxruntime-gpu/", timeout=10) as response:
            response.read(1)
    except (urllib.error.URLError, OSError) as exc:
        return f"the package index {index} cannot be reached: {exc}"
    return None


def _pip_version() -> Version:
    import pip

    return Version(pip.__version__)


@pytest.mark.network  # pip's resolver against the package index: 25-50 s
def test_gpu_extra_resolves_without_the_cpu_onnxruntime(tmp_path):
    why = _index_reachable()
    if why:
        pytest.skip(why)
    if _pip_version() < Version("24"):
        pytest.skip(f"pip {_pip_version()} is older than the test extra asks (pip>=25)")
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        # Wheel metadata by HTTP range requests: the registry here serves no separate
        # metadata files (PEP 658), and downloading the wheels (tensorflow alone is 570 MB)
        # took 40-50 s against 23-26 s this way, the same resolution either way (measured).
        "--use-feature=fast-deps",
        "--report", str(report), f"{ROOT}[gpu]",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    installed = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "onnxruntime" not in installed, installed  # the CPU build would shadow the GPU one
    assert Version(installed["onnxruntime-gpu"]) >= Version("1.31")
    # The CUDA 13 and cuDNN 9 wheels of onnxruntime-gpu's [cuda,cudnn] extras, which
    # infertune preloads before a CUDA session (gpu_libraries.preload_cuda).
    assert {"nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13"} <= set(installed)
    assert {"openvino", "ai-edge-litert", "tensorflow"} <= set(installed)
    print(f"pip resolved [gpu] in {seconds:.1f} s")
