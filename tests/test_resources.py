"""Resources: after optimize() returns, the rejected candidates hold nothing and no temporary
file of infertune's is left. Resident memory itself: benchmarks/memory.py (docs/guarantees.md)."""

from __future__ import annotations

import gc
import os
import tempfile

import numpy as np
from conftest import dense_model

import infertune

# TensorFlow's autograph writes the source of each function it converts to a temporary file
# and deletes it when the process exits: TensorFlow's file, not infertune's.
AUTOGRAPH = "__autograph_generated_file"


def _runtime_objects() -> dict[str, int]:
    """Live sessions, compiled models and interpreters of the native runtimes, by runtime."""
    import onnxruntime
    import openvino
    from ai_edge_litert.interpreter import Interpreter

    gc.collect()
    kinds = {
        "onnxruntime": onnxruntime.InferenceSession,
        "openvino": openvino.CompiledModel,
        "litert": Interpreter,
    }
    objects = gc.get_objects()
    return {name: sum(isinstance(o, cls) for o in objects) for name, cls in kinds.items()}


def test_only_the_chosen_candidate_keeps_a_runtime_session(rng):
    before = _runtime_objects()
    x = rng.standard_normal((4, 6)).astype(np.float32)
    opt = infertune.optimize(dense_model(), x, precision=("fp32", "bf16", "int8"), verbose=False)
    tried = [c for c in opt.report.candidates if c.status in ("ok", "selected", "mismatch")]
    assert len(tried) >= 8  # ONNX Runtime variants, OpenVINO, LiteRT all ran
    grown = {k: v - before[k] for k, v in _runtime_objects().items()}
    runtime = opt.backend.split("-")[0].split(":")[0]
    others = {k: v for k, v in grown.items() if k != runtime}
    assert others == dict.fromkeys(others, 0), f"chose {opt.backend}; rejected left {grown}"
    # One session or compiled model; LiteRT: an interpreter per model, fixed and free batch.
    assert grown.get(runtime, 1) in (1, 2), f"chose {opt.backend}; it holds {grown}"
    del opt
    assert _runtime_objects() == before


def test_no_temporary_file_is_left(rng, tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    x = rng.standard_normal((4, 6)).astype(np.float32)
    # int8 quantization and the child process of isolation="process" both write files.
    opt = infertune.optimize(dense_model(), x, precision=("fp32", "int8"), verbose=False)
    assert any(c.name == "onnxruntime-cpu-int8" and c.prepare_s for c in opt.report.candidates)
    left = [name for name in os.listdir(scratch) if not name.startswith(AUTOGRAPH)]
    assert left == []


def test_temporary_files_are_removed_when_a_candidate_crashes(rng, tmp_path, monkeypatch):
    from crashing_backends import SegfaultsAtFirstCall

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    x = rng.standard_normal((4, 6)).astype(np.float32)
    opt = infertune.optimize(dense_model(), x, backends=[SegfaultsAtFirstCall()], verbose=False)
    assert "SIGSEGV" in opt.report.candidates[1].reason
    assert [n for n in os.listdir(scratch) if not n.startswith(AUTOGRAPH)] == []
