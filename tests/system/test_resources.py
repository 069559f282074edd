"""Resources: after optimize() returns, the rejected candidates hold nothing and no temporary
file of infertune's is left. Resident memory itself: benchmarks/memory.py (docs/guarantees.md)."""

from __future__ import annotations

import gc
import mmap
import os
import shutil
import sys
import tempfile
import threading

import numpy as np
import pytest
from helpers import dense_model, mapped_resident_bytes, on_tmpfs, residency_tiers

import infertune

# TensorFlow's autograph writes the source of each function it converts to a temporary file
# and deletes it when the process exits: TensorFlow's file, not infertune's.
AUTOGRAPH = "__autograph_generated_file"
# The page-out tests run in both tiers of residency_tiers (helpers.py): in the unit tier the
# advice covers the files, no byte of their data changes, the thread's CPUs are restored;
# the `timing` tier reads the resident bytes back too. No margin there: one 4 KB page left of
# 8 MB was the bug the second test was written for.


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_PAGEOUT): Linux")
@residency_tiers
def test_pages_of_its_own_weight_files_leave_memory_and_their_data_stays(tmp_path, residency):
    """page_out_own_files: the pages of infertune's temporary files a runtime mapped leave
    this process's resident memory; none of their data changes, a page written through a
    private mapping included; another file's pages stay."""
    from infertune.system.resources import page_out_own_files

    size = 8 << 20
    data = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
    own_dir = tempfile.mkdtemp(prefix="infertune-pages-")
    own, other = os.path.join(own_dir, "weights.bin"), str(tmp_path / "other.bin")
    try:
        for path in (own, other):
            with open(path, "wb") as file:
                file.write(data)
        with open(own, "rb") as f1, open(other, "rb") as f2:
            mapped = mmap.mmap(f1.fileno(), 0, access=mmap.ACCESS_COPY)  # private, as runtimes
            kept = mmap.mmap(f2.fileno(), 0, access=mmap.ACCESS_READ)
        assert mapped[:] == data and kept[:] == data  # every page read: resident
        mapped[:5] = b"wrote"  # a page this process changed (copy on write)
        if residency:
            assert mapped_resident_bytes(own) >= size // 2

        advised = page_out_own_files()

        assert advised >= size
        if residency and advised and not on_tmpfs(own):
            assert mapped_resident_bytes(own) < size // 4
            assert mapped_resident_bytes(other) >= size // 2
        assert mapped[:5] == b"wrote" and mapped[5:] == data[5:]
        assert kept[:] == data
        mapped.close()
        kept.close()
    finally:
        shutil.rmtree(own_dir, ignore_errors=True)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="per-CPU page batches: Linux, two CPUs",
)
@residency_tiers
def test_pages_another_cpu_just_brought_in_leave_memory_too(residency):
    """A file written by a thread on another CPU leaves its last pages in that CPU's batch of
    pages not yet on the LRU lists, which an madvise from this CPU does not drain: without
    the advice from every CPU, one 4 KB page of this file stayed resident in each of ten
    trials (a flatbuffer's 16 KB failed a test-suite run)."""
    from infertune.system.resources import page_out_own_files

    cpus = sorted(os.sched_getaffinity(0))
    data = np.random.default_rng(1).integers(0, 255, (8 << 20) + 12288, dtype=np.uint8)
    directory = tempfile.mkdtemp(prefix="infertune-pages-")
    path = os.path.join(directory, "model.tflite")
    try:
        for writer_cpu in cpus:

            def write(cpu: int = writer_cpu) -> None:
                os.sched_setaffinity(0, {cpu})
                with open(path, "wb") as file:
                    file.write(data.tobytes())

            writer = threading.Thread(target=write)
            writer.start()
            writer.join()
            with open(path, "rb") as file:
                mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            assert mapped[:] == data.tobytes()  # every page read: resident
            assert page_out_own_files() >= data.size
            if residency and not on_tmpfs(path):
                assert mapped_resident_bytes(path) == 0, f"written on CPU {writer_cpu}"
            assert mapped[:] == data.tobytes()
            mapped.close()
        assert sorted(os.sched_getaffinity(0)) == cpus  # this thread's affinity restored
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range: Linux")
@residency_tiers
def test_pages_being_written_to_disk_leave_memory_too(residency):
    """A file just written is written back by the kernel within seconds, and MADV_PAGEOUT
    skips a page under writeback: without the wait for it, every page of this file stayed
    resident (16 KB of a flatbuffer failed a test-suite run one time in three)."""
    from infertune.system.resources import _sync_file_range, page_out_own_files

    sync_file_range = _sync_file_range()
    data = np.random.default_rng(2).integers(0, 255, 16 << 20, dtype=np.uint8).tobytes()
    directory = tempfile.mkdtemp(prefix="infertune-pages-")
    path = os.path.join(directory, "model.tflite")
    try:
        with open(path, "wb") as file:
            file.write(data)
        with open(path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            assert mapped[:] == data  # every page read: resident
            assert sync_file_range(file.fileno(), 0, 0, 2) == 0  # _WRITE: started, not awaited
        assert page_out_own_files() >= len(data)
        if residency and not on_tmpfs(path):
            assert mapped_resident_bytes(path) == 0
        assert mapped[:] == data
        mapped.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status: Linux")
def test_the_peak_said_during_tuning_includes_a_conversion_the_samples_missed():
    """A spike between two samples (a converter holding the GIL) is in the peak the memory
    line gives, not only in the report's peak after the run; so is one from before a later
    conversion reset the high-water mark."""
    from infertune.system.resources import (
        MemoryPeak,
        _rss_bytes,
        high_water_above,
        release_freed_memory,
    )

    release_freed_memory()
    memory = MemoryPeak(every_s=3600).start()  # no sample of its own during the spike
    # This process alone: children left by earlier tests count in `before`, not in its VmHWM.
    own_before = _rss_bytes(os.getpid())
    try:
        spike = 300 << 20
        _, above = high_water_above(lambda: np.ones(spike, dtype=np.uint8).sum())
        assert above is not None and above >= spike * 0.9
        high_water_above(lambda: None)  # a later conversion resets it again
        memory.sample()
        assert memory.peak - own_before >= spike * 0.9
    finally:
        memory.stop()
