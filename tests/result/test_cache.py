"""The tuning cache: hits for the same model and options (in a new process too), misses after a
weight or option change, and a damaged entry tuned again. Real files, real runtimes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import TESTS, dense_model

import infertune

X = np.random.default_rng(3).standard_normal((4, 6)).astype("float32")
ORT = ["onnxruntime-cpu"]


@pytest.mark.slow
def test_second_call_hits_and_a_weight_change_misses(tmp_path):
    model = dense_model()
    first = infertune.optimize(model, X, backends=ORT, cache=tmp_path, verbose=False)
    assert not first.report.from_cache
    assert any("stored in the tuning cache" in note for note in first.report.notes)
    entries = list(tmp_path.iterdir())
    assert len(entries) == 1 and (entries[0] / "manifest.json").is_file()

    # time_budget_s and verbose do not decide the tuned result: not part of the key.
    second = infertune.optimize(
        model, X, backends=ORT, cache=tmp_path, time_budget_s=60, verbose=False
    )
    assert second.report.from_cache and second.backend == first.backend
    assert "from the tuning cache" in str(second.report)
    np.testing.assert_array_equal(second(X), first(X))  # the same ONNX file and session

    # Rebuilt (as a notebook re-run does): Keras numbers its layers anew, dense_4 for dense;
    # the same definition and weights still hit.
    rebuilt = infertune.optimize(dense_model(), X, backends=ORT, cache=tmp_path, verbose=False)
    assert rebuilt.report.from_cache

    kernel = model.layers[0].kernel
    kernel.assign(kernel.numpy() * 1.5)
    changed = infertune.optimize(model, X, backends=ORT, cache=tmp_path, verbose=False)
    assert not changed.report.from_cache
    # The new weights are served, not the cached ones: float32 round-off of a 2-layer MLP.
    np.testing.assert_allclose(changed(X), np.asarray(model(X)), rtol=1e-4, atol=1e-6)

    other_tolerance = infertune.optimize(
        model, X, backends=ORT, cache=tmp_path, rtol=1e-2, verbose=False
    )
    assert not other_tolerance.report.from_cache
    assert len(list(tmp_path.iterdir())) == 3


@pytest.mark.slow
def test_a_damaged_entry_is_tuned_again_and_replaced(tmp_path):
    model = dense_model()
    infertune.optimize(model, X, backends=ORT, cache=tmp_path, verbose=False)
    (entry,) = tmp_path.iterdir()
    (entry / "model.onnx").write_bytes(b"not an onnx model")
    again = infertune.optimize(model, X, backends=ORT, cache=tmp_path, verbose=False)
    assert not again.report.from_cache
    assert any("was not usable" in note and "model.onnx" in note for note in again.report.notes)
    hit = infertune.optimize(model, X, backends=ORT, cache=tmp_path, verbose=False)
    assert hit.report.from_cache  # the entry was written anew


AFFINE = """
import numpy as np, tensorflow as tf

class Affine(tf.Module):
    def __init__(self):
        self.w = tf.Variable(np.arange(12, dtype="float32").reshape(6, 2))

    @tf.function(input_signature=[tf.TensorSpec((None, 6), tf.float32)])
    def __call__(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))
"""


@pytest.mark.slow
def test_a_new_process_hits_the_cache_and_fingerprints_agree(tmp_path):
    """Keys must not depend on what a process makes up: layer-name and function counters, ids
    of captured variables, the hash seed. The child traces other functions first and runs
    under another PYTHONHASHSEED; a tf.Module (fingerprinted by its traced graph) must agree."""
    from infertune.model.inputs import build_signature
    from infertune.model.source import load_model
    from infertune.result.cache import model_fingerprint

    cache = tmp_path / "cache"
    infertune.optimize(dense_model(), X, backends=ORT, cache=cache, verbose=False)
    namespace: dict = {}
    exec(AFFINE, namespace)  # the same class in both processes
    source = load_model(namespace["Affine"]())
    signature, _ = build_signature(X, source.declared_inputs, source.default_float)
    here = model_fingerprint(source, signature)

    np.save(tmp_path / "x.npy", X)
    script = AFFINE + textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import infertune
        from helpers import dense_model
        from infertune.result.cache import model_fingerprint
        from infertune.model.inputs import build_signature
        from infertune.model.source import load_model

        for _ in range(3):  # shift TensorFlow's per-process counters
            tf.function(lambda y: y + 1).get_concrete_function(tf.TensorSpec((2,), tf.float32))
        x = np.load({str(tmp_path / "x.npy")!r})
        opt = infertune.optimize(dense_model(), x, backends=["onnxruntime-cpu"],
                                 cache={str(cache)!r}, verbose=False)
        source = load_model(Affine())
        signature, _ = build_signature(x, source.declared_inputs, source.default_float)
        print(opt.report.from_cache, model_fingerprint(source, signature))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONHASHSEED": "12345"},
    )
    assert done.returncode == 0, done.stderr
    from_cache, there = done.stdout.split()[-2:]
    assert from_cache == "True", done.stdout + done.stderr
    assert there == here


def test_a_candidate_that_cannot_be_saved_is_cached_as_a_decision(tmp_path, monkeypatch):
    """A registered candidate without save_artifact (as LiteRT is today) still hits: the entry
    keeps the decision and the report, and a hit prepares that candidate again."""
    from infertune.backends.base import Backend
    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu
    from infertune.backends.registry import BACKENDS

    class Unsaveable(OnnxRuntimeCpu):
        name = "ort-unsaveable"
        save_artifact = Backend.save_artifact  # the base's: "does not support saving yet"

    # Registering a candidate is the documented extension point, not a mock.
    monkeypatch.setitem(BACKENDS, "ort-unsaveable", Unsaveable)
    model = dense_model()
    cache = tmp_path / "new" / "cache"  # made on first use
    first = infertune.optimize(model, X, backends=["ort-unsaveable"], cache=cache, verbose=False)
    assert first.backend == "ort-unsaveable", str(first.report)
    assert any("as a decision" in note for note in first.report.notes)
    (entry,) = cache.iterdir()
    assert sorted(p.name for p in entry.iterdir()) == ["decision.json", "report.json"]
    hit = infertune.optimize(model, X, backends=["ort-unsaveable"], cache=cache, verbose=False)
    assert hit.report.from_cache and hit.backend == "ort-unsaveable"
    assert any("prepared again from the model" in note for note in hit.report.notes)
    np.testing.assert_array_equal(hit(X), first(X))  # the same export on the same session
