"""Exact rewrites: ops a converter rejects, converted through an equivalent it takes
(export/rewrites.py), verified against the model and named in the report."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers import needs_litert, needs_onnxruntime

import infertune
from infertune.export.rewrites import rewrite_for_onnx, rewrite_for_tflite


def log_mel_layer():
    """A custom layer computing a log-mel spectrogram: STFT (frame 256, step 128), magnitude,
    a mel matrix, log. TensorFlow's ComplexAbs of an RFFT, which tf2onnx rejects."""
    import keras
    import tensorflow as tf

    class LogMel(keras.layers.Layer):
        def build(self, input_shape):
            mel = tf.signal.linear_to_mel_weight_matrix(16, 129, 16000, 20.0, 8000.0).numpy()
            self.mel = self.add_weight(
                shape=mel.shape, initializer=keras.initializers.Constant(mel), trainable=False
            )

        def call(self, x):
            magnitude = tf.abs(tf.signal.stft(x, frame_length=256, frame_step=128))
            return tf.math.log(tf.matmul(magnitude, self.mel) + 1e-6)

    return LogMel(name="log_mel")


def audio_model():
    """(batch, 2048 samples) -> log-mel (15 frames x 16 bins) -> Conv1D -> pooling -> Dense."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((2048,))
    x = keras.layers.Conv1D(8, 3, activation="relu")(log_mel_layer()(inputs))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(4)(x))


def recommender(mode: str, weighted: bool = False):
    """int64 item ids -> CategoryEncoding (TensorFlow's DenseBincount) -> Dense; with
    `weighted`, a second input of per-id weights (count_weights)."""
    import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((5,), dtype="int64", name="ids")
    encoding = keras.layers.CategoryEncoding(num_tokens=20, output_mode=mode, name="encoding")
    if weighted:
        weights = keras.Input((5,), name="weights")
        encoded = encoding(ids, count_weights=weights)
        inputs = {"ids": ids, "weights": weights}
    else:
        encoded, inputs = encoding(ids), ids
    return keras.Model(inputs, keras.layers.Dense(3)(encoded))


def ids_sample(batch: int = 4) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 20, (batch, 5)).astype("int64")


def passed(report, name: str) -> bool:
    return report.candidate(name).status in ("ok", "selected")


@needs_onnxruntime
def test_the_log_mel_model_converts_to_onnx_and_every_candidate_is_verified(tmp_path):
    sample = np.random.default_rng(0).standard_normal((2, 2048)).astype("float32")
    backends = ["onnxruntime-cpu"]  # each ONNX-based candidate failed on ComplexAbs before
    if importlib.util.find_spec("openvino") is not None:
        backends.append("openvino-cpu")
    opt = infertune.optimize(
        audio_model(), sample, backends=backends, isolation="off", verbose=False
    )
    report = opt.report
    assert all(passed(report, name) for name in backends), str(report)
    notes = [n for n in report.notes if "rewritten for ONNX" in n]
    assert len(notes) == 1, report.notes
    assert notes[0].startswith("RFFT + ComplexAbs (at ")
    assert "log_mel" in notes[0]  # the node's scope names the layer
    assert "sqrt(re^2 + im^2)" in notes[0]
    # Where the ONNX export is rewritten, what the drop-in callable returns is the model's.
    # 1e-4: the DFT as products sums in another order than TensorFlow's FFT (1e-6 relative
    # on the spectrum, measured 2e-7 over the output), 100x below that still.
    expected = audio_model()(sample).numpy()
    np.testing.assert_allclose(opt(sample), expected, rtol=1e-4, atol=1e-5)
    # The rewritten ONNX model is what is saved: loaded, it runs without the rewrite.
    loaded = infertune.load(opt.save(tmp_path / "audio"))
    np.testing.assert_array_equal(loaded(sample), opt(sample))


@needs_onnxruntime
@needs_litert
@pytest.mark.parametrize("mode", ["multi_hot", "count"])
def test_category_encoding_converts_to_tflite_and_is_verified(mode):
    sample = ids_sample()
    opt = infertune.optimize(
        recommender(mode), sample, backends=["litert", "onnxruntime-cpu"], verbose=False
    )
    report = opt.report
    assert passed(report, "litert") and passed(report, "onnxruntime-cpu"), str(report)
    # Counts and multi-hot vectors are small integers in float32: exact, as is the Dense
    # layer after them up to the order of its sums.
    assert report.candidate("litert").max_rel_err < 1e-6
    notes = [n for n in report.notes if "rewritten" in n]
    kind = "Max (multi-hot)" if mode == "multi_hot" else "Sum (counts)"
    assert len(notes) == 1, report.notes
    assert notes[0].startswith("DenseBincount (at ")
    assert "/encoding" in notes[0]  # the node's scope names the layer
    assert notes[0].endswith(
        f") rewritten for TFLite as OneHot + {kind}: an exact equivalent the converter takes"
    )


@pytest.mark.slow
@needs_litert
def test_a_conversion_rewritten_in_a_worker_process_says_so(monkeypatch):
    # The TFLite conversion made in a worker process (tf_worker.py) brings its notes back.
    monkeypatch.setenv("INFERTUNE_TF_WORKER", "always")
    opt = infertune.optimize(
        recommender("multi_hot"), ids_sample(), backends=["litert"], verbose=False
    )
    assert any("worker process beside this one" in note for note in opt.report.notes)
    assert passed(opt.report, "litert"), str(opt.report)
    assert any("rewritten for TFLite as OneHot + Max" in note for note in opt.report.notes)


@needs_onnxruntime
@needs_litert
def test_weighted_counts_convert_to_onnx_and_tflite():
    # tf2onnx's DenseBincount handler refuses weights ("Non-empty weights"): rewritten too.
    rng = np.random.default_rng(0)
    sample = {"ids": ids_sample(), "weights": rng.random((4, 5)).astype("float32")}
    opt = infertune.optimize(
        recommender("count", weighted=True), sample, backends=["litert", "onnxruntime-cpu"],
        verbose=False,
    )  # fmt: skip
    report = opt.report
    assert passed(report, "litert") and passed(report, "onnxruntime-cpu"), str(report)
    notes = " | ".join(report.notes)
    assert "rewritten for ONNX as OneHot x weights + Sum (weighted counts)" in notes
    assert "rewritten for TFLite as OneHot x weights + Sum (weighted counts)" in notes


def test_a_graph_without_rejected_ops_is_returned_as_it_is():
    import tensorflow as tf

    graph_def = tf.function(lambda x: x * 2.0).get_concrete_function(tf.TensorSpec((None, 3)))
    graph_def = graph_def.graph.as_graph_def()
    assert rewrite_for_onnx(graph_def) == (graph_def, [])
    assert rewrite_for_tflite(graph_def) == (graph_def, [])


# Each rewrite against the original op, in TensorFlow itself: the graph before and after.


def run_graph(graph_def, input_name: str, output_name: str, value: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    function = tf.compat.v1.wrap_function(lambda: tf.import_graph_def(graph_def, name=""), [])
    pruned = function.prune(
        function.graph.get_tensor_by_name(input_name),
        function.graph.get_tensor_by_name(output_name),
    )
    return pruned(tf.constant(value)).numpy()


def original_and_rewritten(function, spec, value, rewrite, rejected):
    """`function` run on `value` as traced, and as rewritten (which leaves none of the
    `rejected` ops), with the rewrite's notes."""
    import tensorflow as tf

    concrete = tf.function(function, input_signature=[spec]).get_concrete_function()
    graph_def = concrete.graph.as_graph_def()
    rewritten, notes = rewrite(graph_def)
    assert rejected.isdisjoint(node.op for node in rewritten.node)
    names = concrete.inputs[0].name, concrete.outputs[0].name
    return run_graph(graph_def, *names, value), run_graph(rewritten, *names, value), notes


@pytest.mark.parametrize("binary", [True, False], ids=["multi-hot", "counts"])
@pytest.mark.parametrize("shape", [(6, 7), (9,)], ids=["rank-2", "rank-1"])
def test_the_bincount_rewrite_equals_dense_bincount(binary, shape):
    import tensorflow as tf

    # Values 20 and above fall outside the 20 bins: both ignore them.
    values = np.random.default_rng(1).integers(0, 25, shape).astype("int32")
    spec = tf.TensorSpec((None,) + shape[1:], tf.int32)

    def bincount(x):
        axis = -1 if len(shape) == 2 else None
        return tf.math.bincount(x, minlength=20, maxlength=20, axis=axis, binary_output=binary)

    original, rewritten, notes = original_and_rewritten(
        bincount, spec, values, rewrite_for_tflite, {"DenseBincount"}
    )
    np.testing.assert_array_equal(rewritten, original)  # small integers: exactly equal
    assert len(notes) == 1 and "DenseBincount" in notes[0]
    # tf2onnx converts the unweighted op itself: the ONNX export leaves it.
    graph_def = tf.function(bincount, input_signature=[spec]).get_concrete_function()
    assert rewrite_for_onnx(graph_def.graph.as_graph_def())[1] == []


@pytest.mark.parametrize("rewrite", [rewrite_for_onnx, rewrite_for_tflite], ids=["onnx", "tflite"])
def test_the_weighted_bincount_rewrite_equals_dense_bincount(rewrite):
    import tensorflow as tf

    rng = np.random.default_rng(2)
    values = rng.integers(0, 25, (6, 7)).astype("int32")
    weights = tf.constant(rng.random((6, 7)).astype("float32"))

    def bincount(x):
        return tf.math.bincount(x, weights=weights, minlength=20, maxlength=20, axis=-1)

    spec = tf.TensorSpec((6, 7), tf.int32)
    original, rewritten, _ = original_and_rewritten(
        bincount, spec, values, rewrite, {"DenseBincount"}
    )
    # Sums of at most 7 weights in [0, 1) in another order: a few float32 ulps.
    np.testing.assert_allclose(rewritten, original, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fft_length", [200, 256, 300], ids=["crop", "same", "pad"])
@pytest.mark.parametrize("part", ["abs", "real", "imag"])
def test_the_dft_rewrite_equals_rfft(fft_length, part):
    import tensorflow as tf

    take = {"abs": tf.abs, "real": tf.math.real, "imag": tf.math.imag}[part]
    values = np.random.default_rng(3).standard_normal((3, 5, 256)).astype("float32")
    spec = tf.TensorSpec((None, 5, 256), tf.float32)
    original, rewritten, notes = original_and_rewritten(
        lambda x: take(tf.signal.rfft(x, [fft_length])),
        spec, values, rewrite_for_onnx, {"RFFT", "ComplexAbs", "Real", "Imag"},
    )  # fmt: skip
    assert rewritten.shape == original.shape == (3, 5, fft_length // 2 + 1)
    # float32 sums of 256 terms of order 1 in another order than the FFT's: measured 3e-7
    # relative in norm, 5e-5 at worst on values of order 30; 1e-5 relative in norm and
    # 2e-4 absolute leave 30x and 4x room, far below any wrong matrix (errors of order 1).
    assert np.linalg.norm(rewritten - original) <= 1e-5 * np.linalg.norm(original)
    np.testing.assert_allclose(rewritten, original, atol=2e-4)
    assert len(notes) == 1 and notes[0].startswith("RFFT + ")


def test_an_rfft_read_by_another_op_is_left_to_the_converter():
    import tensorflow as tf

    # The phase: where the FFT's imaginary part is exactly zero (bin n/2 of a real signal),
    # the DFT's round-off has either sign, and the phase flips between pi and -pi.
    concrete = tf.function(lambda x: tf.math.angle(tf.signal.rfft(x))).get_concrete_function(
        tf.TensorSpec((None, 64))
    )
    graph_def = concrete.graph.as_graph_def()
    assert rewrite_for_onnx(graph_def) == (graph_def, [])
    assert rewrite_for_tflite(graph_def) == (graph_def, [])


def test_a_complex_output_of_the_graph_is_left_to_the_converter():
    import tensorflow as tf

    concrete = tf.function(lambda x: tf.signal.rfft(x) * 2.0).get_concrete_function(
        tf.TensorSpec((None, 64))
    )
    graph_def = concrete.graph.as_graph_def()
    assert rewrite_for_onnx(graph_def) == (graph_def, [])


def test_tflite_keeps_its_own_rfft_and_complex_abs():
    import tensorflow as tf

    concrete = tf.function(lambda x: tf.abs(tf.signal.rfft(x))).get_concrete_function(
        tf.TensorSpec((None, 64))
    )
    graph_def = concrete.graph.as_graph_def()
    assert rewrite_for_tflite(graph_def) == (graph_def, [])
    assert rewrite_for_onnx(graph_def)[1] != []


def power_spectrum(x):
    import tensorflow as tf

    spectrum = tf.signal.stft(x, 64, 32)
    return tf.math.real(spectrum * tf.math.conj(spectrum))  # RFFT, Conj, Mul, Real


def dct(x):
    import tensorflow as tf

    return tf.signal.dct(x, type=2)  # RFFT, a slice, a product by a complex constant, Real


@pytest.mark.parametrize("rewrite", [rewrite_for_onnx, rewrite_for_tflite], ids=["onnx", "tflite"])
@pytest.mark.parametrize("function", [power_spectrum, dct], ids=["power-spectrum", "dct"])
def test_complex_arithmetic_after_an_rfft_is_lowered_to_real_arithmetic(function, rewrite):
    import tensorflow as tf

    values = np.random.default_rng(4).standard_normal((3, 256)).astype("float32")
    original, rewritten, notes = original_and_rewritten(
        function, tf.TensorSpec((None, 256)), values, rewrite,
        {"RFFT", "Conj", "ComplexAbs", "Real", "Imag"},  # the constant's Complex op stays, unused
    )  # fmt: skip
    assert rewritten.shape == original.shape
    # As for the DFT above: float32 round-off of sums in another order, 1e-7 relative.
    assert np.linalg.norm(rewritten - original) <= 1e-5 * np.linalg.norm(original)
    assert len(notes) == 1 and notes[0].startswith("RFFT + ")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_the_bucketize_rewrite_equals_bucketize(dtype):
    import tensorflow as tf

    boundaries = [-1.5, 0.0, 0.0, 2.0, 7.25]  # a repeated boundary too
    rng = np.random.default_rng(5)
    values = rng.uniform(-4, 10, (6, 9))
    if dtype.startswith("float"):  # every boundary itself, and NaN
        values[0, : len(boundaries)] = boundaries
        values[1, 0] = np.nan
    values = values.astype(dtype)
    spec = tf.TensorSpec((None, 9), dtype)
    original, rewritten, notes = original_and_rewritten(
        lambda x: tf.raw_ops.Bucketize(input=x, boundaries=boundaries),
        spec, values, rewrite_for_onnx, {"Bucketize"},
    )  # fmt: skip
    np.testing.assert_array_equal(rewritten, original)
    assert rewritten.dtype == np.int32
    assert notes[0].startswith("Bucketize (at ")


@needs_onnxruntime
def test_discretization_converts_to_onnx_and_is_verified():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    buckets = keras.layers.Discretization(bin_boundaries=[-1.0, 0.0, 1.0])(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.ops.cast(buckets, "float32")))
    sample = np.random.default_rng(0).standard_normal((4, 3)).astype("float32")
    backends = ["onnxruntime-cpu"]
    if importlib.util.find_spec("openvino") is not None:
        backends.append("openvino-cpu")  # the count in float32: see rewrites._bucketize
    opt = infertune.optimize(model, sample, backends=backends, isolation="off", verbose=False)
    for name in backends:
        assert passed(opt.report, name), str(opt.report)
    assert any(n.startswith("Bucketize (at ") for n in opt.report.notes), opt.report.notes


def mfcc_model():
    """Log-mel, then MFCCs: tf.signal.dct's complex product after an RFFT, which neither
    tf2onnx nor the TFLite converter takes."""
    import keras
    import tensorflow as tf

    class Mfcc(keras.layers.Layer):
        def call(self, x):
            return tf.signal.mfccs_from_log_mel_spectrograms(x)[..., :8]

    keras.utils.set_random_seed(0)
    inputs = keras.Input((2048,))
    x = Mfcc(name="mfcc")(log_mel_layer()(inputs))
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(x)))


@pytest.mark.slow
@needs_onnxruntime
@needs_litert
def test_the_mfcc_model_converts_everywhere():
    sample = np.random.default_rng(0).standard_normal((2, 2048)).astype("float32")
    backends = ["onnxruntime-cpu", "litert"]
    opt = infertune.optimize(
        mfcc_model(), sample, backends=backends, isolation="off", verbose=False
    )
    assert all(passed(opt.report, name) for name in backends), str(opt.report)
    notes = [n for n in opt.report.notes if "/mfcc" in n]
    assert {n.split(" rewritten for ")[1].split(" ")[0] for n in notes} == {"ONNX", "TFLite"}, notes


@pytest.mark.parametrize("rewrite", [rewrite_for_onnx, rewrite_for_tflite], ids=["onnx", "tflite"])
@pytest.mark.parametrize("length", [64, 63, 48, 80], ids=["same", "odd", "crop", "pad"])
def test_a_spectral_filter_with_an_inverse_rfft_is_lowered(length, rewrite):
    import tensorflow as tf

    gains = np.random.default_rng(6).random(33) + 1j * np.random.default_rng(7).random(33)

    def spectral_filter(x):  # IRFFT: not a TFLite builtin, not converted by tf2onnx
        return tf.signal.irfft(tf.signal.rfft(x) * tf.constant(gains, tf.complex64), [length])

    values = np.random.default_rng(8).standard_normal((3, 64)).astype("float32")
    original, rewritten, notes = original_and_rewritten(
        spectral_filter, tf.TensorSpec((None, 64)), values, rewrite, {"RFFT", "IRFFT"}
    )
    assert rewritten.shape == original.shape == (3, length)
    # As for the DFT above: float32 round-off of sums in another order, 1e-7 relative.
    assert np.linalg.norm(rewritten - original) <= 1e-5 * np.linalg.norm(original)
    assert notes[0].startswith("RFFT + IRFFT + Mul")  # and Pad, where IRFFT pads


def _complex_of(source: str):
    """A real (.., s, h) tensor made complex as models do it: a cast (FNet), Keras'
    ops.fft2 on (x, zeros), or a real and an imaginary part of their own."""
    import tensorflow as tf

    if source == "cast":
        return lambda x: tf.cast(x, tf.complex64)
    if source == "zeros":
        return lambda x: tf.complex(x, tf.zeros_like(x))
    return lambda x: tf.complex(x, tf.sin(3.0 * x))


@pytest.mark.parametrize("rewrite", [rewrite_for_onnx, rewrite_for_tflite], ids=["onnx", "tflite"])
@pytest.mark.parametrize("transform", ["fft", "fft2d"])
@pytest.mark.parametrize("source", ["cast", "zeros", "imaginary"])
@pytest.mark.parametrize("part", ["real", "imag", "abs"])
def test_the_dft_rewrite_equals_fft_of_a_real_input(rewrite, transform, source, part):
    import tensorflow as tf

    fft = {"fft": tf.signal.fft, "fft2d": tf.signal.fft2d}[transform]
    take = {"abs": tf.abs, "real": tf.math.real, "imag": tf.math.imag}[part]
    make = _complex_of(source)
    values = np.random.default_rng(5).standard_normal((2, 24, 16)).astype("float32")
    original, rewritten, notes = original_and_rewritten(
        lambda x: take(fft(make(x))), tf.TensorSpec((None, 24, 16), tf.float32), values,
        rewrite, {"FFT", "FFT2D", "Complex", "ComplexAbs", "Real", "Imag"},
    )  # fmt: skip
    assert rewritten.shape == original.shape == (2, 24, 16)
    # float32 sums of at most 24 x 16 terms of order 1 in another order than the FFT's:
    # measured 2e-7 relative in norm; 1e-5 leaves 50x room, far below a wrong matrix (order 1).
    assert np.linalg.norm(rewritten - original) <= 1e-5 * np.linalg.norm(original)
    assert len(notes) == 1 and transform.upper() in notes[0]


def test_an_fft_over_a_free_length_is_left_to_the_converter():
    import tensorflow as tf

    concrete = tf.function(lambda x: tf.math.real(tf.signal.fft2d(tf.cast(x, tf.complex64))))
    graph_def = concrete.get_concrete_function(tf.TensorSpec((None, None, 16))).graph
    graph_def = graph_def.as_graph_def()
    assert rewrite_for_onnx(graph_def) == (graph_def, [])


def fnet_encoder(length: int):
    """An FNet-style encoder: token embeddings, then two blocks of Fourier mixing (the real
    part of a 2-D FFT over the sequence and hidden axes) and a feed-forward layer, each with
    a residual and LayerNormalization, and a classification head."""
    import keras
    import tensorflow as tf

    class FourierMixing(keras.layers.Layer):
        def call(self, x):
            return tf.math.real(tf.signal.fft2d(tf.cast(x, tf.complex64)))

    keras.utils.set_random_seed(0)
    tokens = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(50, 16)(tokens)
    for _ in range(2):
        x = keras.layers.LayerNormalization()(x + FourierMixing()(x))
        hidden = keras.layers.Dense(32, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(16)(hidden))
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(tokens, keras.layers.Dense(2)(pooled))


@pytest.mark.slow
@needs_onnxruntime
@needs_litert
@pytest.mark.parametrize("length", [16, 40])
def test_a_fourier_mixing_encoder_gets_every_converting_candidate(length):
    model = fnet_encoder(length)
    tokens = np.random.default_rng(6).integers(0, 50, (2, length)).astype("int32")
    converting = ["onnxruntime-cpu", "openvino-cpu", "litert"]
    opt = infertune.optimize(model, tokens, backends=converting, verbose=False)
    for name in converting:
        assert passed(opt.report, name), str(opt.report)
    notes = [n for n in opt.report.notes if "FFT2D" in n]
    assert len(notes) == 2 and all("rewritten" in n for n in notes), opt.report.notes
    fresh = np.random.default_rng(7).integers(0, 50, (3, length)).astype("int32")
    np.testing.assert_allclose(opt(fresh), model.predict(fresh, verbose=0), rtol=1e-4, atol=1e-5)
