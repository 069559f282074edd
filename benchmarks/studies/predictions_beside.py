"""The model's predictions on the labelled data beside NNCF's quantization: what the session
that makes them costs the pair, by whether its threads spin between calls.

optimize() with reduced precision makes the model's predictions on the gate's data in a thread
of its own while the quantizers run (pipeline/preparing.py `_predict_early`). ONNX Runtime's
default session spins its worker threads between calls, which keeps both cores of a 2-core
machine busy while NNCF collects its statistics with OpenVINO beside it. This times the pair,
ResNet50 224 (random weights: the arithmetic is what counts), NNCF on 128 samples and the
predictions on 435 in batches of 32, each setting in a child process of its own, the settings
interleaved over the rounds:

    python -m benchmarks.studies.predictions_beside --rounds 3   # from the repository's root

Settings: `spin` (ONNX Runtime's default session), `nospin` (allow_spinning=0: what
infertune picks where such a candidate is verified), `one` (one thread, no spinning), `apart`
(one after the other, nospin), `openvino` (OpenVINO in float32 with the LATENCY hint, as the
`openvino-cpu` candidate compiles it), `shared` (nospin, and once NNCF is done its thread
takes the batches the predictions' thread has not started: whether the thread that waits for
the predictions in optimize() should help make them).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import harness

SETTINGS = ("spin", "nospin", "one", "apart", "openvino", "shared")
GATE, CALIBRATION, BATCH = 435, 128, 32


def export(path: Path) -> None:
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    spec = [tf.TensorSpec((None, 224, 224, 3), tf.float32, name="x")]
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    path.write_bytes(proto.SerializeToString())


def pair(path: Path, setting: str) -> dict:
    """NNCF's quantization and the predictions, beside each other or one after the other."""
    import nncf
    import numpy as np
    import onnxruntime as ort
    import openvino as ov

    onnx = path.read_bytes()
    rng = np.random.default_rng(0)
    gate = rng.random((GATE, 224, 224, 3), dtype=np.float32)
    calibration = [{"x": rng.random((1, 224, 224, 3), dtype=np.float32)} for _ in range(128)]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if setting != "spin":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if setting == "one":
        options.intra_op_num_threads = 1
    if setting == "openvino":
        import openvino.properties.hint as hints

        compiled = ov.Core().compile_model(
            ov.Core().read_model(onnx, b""), "CPU",
            {hints.inference_precision: ov.Type.f32,
             hints.performance_mode: hints.PerformanceMode.LATENCY},
        )  # fmt: skip
        request = compiled.create_infer_request()

        def call(x: np.ndarray) -> None:
            request.infer({0: x})
    else:
        session = ort.InferenceSession(onnx, options, providers=["CPUExecutionProvider"])

        def call(x: np.ndarray) -> None:
            session.run(None, {"x": x})

    call(gate[:1])

    def predict() -> float:
        start = time.perf_counter()
        for i in range(0, GATE, BATCH):
            call(gate[i : i + BATCH])
        return time.perf_counter() - start

    def quantize() -> float:
        start = time.perf_counter()
        core = ov.Core()
        quantized = nncf.quantize(
            core.read_model(onnx, b""), nncf.Dataset(calibration), subset_size=CALIBRATION
        )
        core.compile_model(quantized, "CPU")
        return time.perf_counter() - start

    start = time.perf_counter()
    if setting == "apart":
        nncf_s, predictions_s = quantize(), predict()
    elif setting == "shared":
        taken = iter(range(0, GATE, BATCH))  # next() on it is atomic under the GIL

        def work() -> None:
            for i in taken:
                call(gate[i : i + BATCH])

        thread = threading.Thread(target=work)
        thread.start()
        nncf_s = quantize()
        work()  # the batches not yet started
        thread.join()
        predictions_s = time.perf_counter() - start
    else:
        made: dict[str, float] = {}
        thread = threading.Thread(target=lambda: made.setdefault("s", predict()))
        thread.start()
        nncf_s = quantize()
        thread.join()
        predictions_s = made["s"]
    return {
        "setting": setting,
        "block_s": time.perf_counter() - start,
        "nncf_s": nncf_s,
        "predictions_s": predictions_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--onnx", type=Path, help=argparse.SUPPRESS)  # the child's model
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        harness.write_child_result(args.child_out, pair(args.onnx, args.child))
        return
    settings = args.settings.split(",")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "resnet50.onnx"
        export(path)
        rows: dict[str, list[dict]] = {s: [] for s in settings}
        for round_ in range(args.rounds):
            for setting in settings:
                log = Path(directory) / "child.log"  # NNCF's progress, kept out of the way
                row = harness.run_in_child(__file__, setting, ["--onnx", str(path)], log_file=log)
                if "error" in row:
                    raise SystemExit(f"{setting}: {row['error']}")
                rows[setting].append(row)
                print(
                    f"round {round_ + 1} {setting:>6}: the pair {row['block_s']:.1f} s "
                    f"(NNCF {row['nncf_s']:.1f} s, predictions {row['predictions_s']:.1f} s)",
                    flush=True,
                )
    for setting, done in rows.items():
        blocks = sorted(r["block_s"] for r in done)
        print(f"{setting:>6}: the pair {blocks[0]:.1f}-{blocks[-1]:.1f} s over {len(done)} rounds")


if __name__ == "__main__":
    main()
