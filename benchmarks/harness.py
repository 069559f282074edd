"""What the benchmarks share; a library, not a script.

* the command line: `parser(doc, "--out", "--quick", ...)`, the shared options defined once;
* child processes: `run_in_child` (a script re-run as `--child NAME ... --child-out FILE`,
  its JSON result read back), `write_child_result`, `fresh_process` (a snippet of code in a
  new interpreter);
* the runtimes written by hand, as a user writes them with each library's defaults: every
  function returns a zero-argument runner whose result is on the host, so it can be timed
  beside infertune's callable in one interleaved run; `by_hand_builders` names them all,
  `build_runners` builds some, `check_first_calls` checks them, `against_by_hand` times them
  with infertune's callable;
* timing: `measure_runners` (warm-up, then infertune's interleaved engine);
* results: `results(...)` (the schema below, the machine and versions filled in),
  `write_results(folder, data)` (results.json, results.md, README.md), `publish` (the
  default folder docs/benchmarks/<benchmark>/<date>/, --json, the printout), `target`,
  `exit_code`.

results.json holds `benchmark`, `command`, `date`, `commit`, `infertune`, `machine` (cpu,
flags, cores, gpu, ...), `versions`, `rows` (one dict per measured row), `tables` (what
results.md shows: each a title and cells as text), `targets` (name, target, value, met:
true, false, or null where not checked), `headline` (a few numbers by name), and `about`,
`notes`, `sections` for README.md. results.md is `results_markdown(data)`: the tables alone,
as the docs quote them; README.md is `readme(data)`. Both are made from results.json's
content only, so either can be made again from it.

Imported as `harness` by the scripts beside it (`python benchmarks/NAME.py`) and as
`benchmarks.harness` by the studies (`python -m benchmarks.studies.NAME`). It imports
numpy and the standard library at import time, TensorFlow, the runtimes and infertune only
where a function needs them: `benchmarks/gpu_check.py run` and `benchmarks/portable.py`'s
child run where TensorFlow is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
STUDIES = BENCHMARKS / "studies"
RESULTS = ROOT / "docs" / "benchmarks"  # docs/benchmarks/<benchmark>/<date>/ by default
QUICK_RESULTS = Path(tempfile.gettempdir()) / "infertune-bench"  # --quick: not the docs'

EXACT_RTOL = 1e-3  # infertune's default tolerance: what "exact" means for a by-hand default

Runner = Callable[[], object]


def log(tag: str, message: str) -> None:
    """`[tag] message` on stderr, at once (stdout holds the results)."""
    print(f"[{tag}] {message}", file=sys.stderr, flush=True)


# -- the command line ----------------------------------------------------------------------------
SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "--out": {
        "type": Path,
        "default": None,
        "help": "the result folder for results.json, results.md and README.md (default: "
        "docs/benchmarks/<benchmark>/<date>/, or <date>-2, -3... where that exists; a --quick "
        f"run's goes under {QUICK_RESULTS})",
    },
    "--quick": {
        "action": "store_true",
        "help": "small models and short measurements: a smoke test, not numbers to keep",
    },
    "--json": {
        "type": Path,
        "default": None,
        "help": "also write results.json's content to this file",
    },
}


def parser(
    doc: str | None,
    *shared: str,
    child: bool = False,
    helps: dict[str, str] | None = None,
) -> argparse.ArgumentParser:
    """An ArgumentParser described by the docstring's first paragraph, with the options of
    SHARED_OPTIONS named in `shared` (their help replaced where `helps` gives one), and with
    `child` the hidden --child NAME and --child-out FILE of run_in_child's children."""
    description = (doc or "").strip().split("\n\n")[0]
    made = argparse.ArgumentParser(description=description)
    for option in shared:
        settings = dict(SHARED_OPTIONS[option])
        if helps and option in helps:
            settings["help"] = helps[option]
        made.add_argument(option, **settings)
    if child:
        made.add_argument("--child", help=argparse.SUPPRESS)
        made.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return made


def names_from(value: str | None, known: Iterable[str], made: argparse.ArgumentParser) -> list[str]:
    """The comma-separated names of `value` (every known one where it is None or empty); an
    unknown name is an argparse error that lists the known ones."""
    known = list(known)
    names = [n for n in (value or "").split(",") if n] or known
    unknown = [n for n in names if n not in known]
    if unknown:
        made.error(f"unknown names {unknown}; known: {known}")
    return names


def command_line() -> str:
    """This process's command as a user types it from the repository's root: `python
    benchmarks/NAME.py ...` or `python -m benchmarks.studies.NAME ...`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        head = f"python -m {spec.name}"
    else:
        path = Path(sys.argv[0]).resolve()
        with contextlib.suppress(ValueError):
            path = path.relative_to(ROOT)
        head = f"python {path}"
    return f"{head} {shlex.join(sys.argv[1:])}".strip()


# -- child processes -----------------------------------------------------------------------------
def _script_command(script: str | Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """How to start `script` again, and the environment for it (`env`): its path, or
    `-m benchmarks.studies.NAME` for a study with the repository's root first on PYTHONPATH
    (so the child starts from any directory)."""
    path = Path(script).resolve()
    if path.parent == STUDIES:
        paths = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return ["-m", f"benchmarks.studies.{path.stem}"], {**env, "PYTHONPATH": paths}
    return [str(path)], dict(env)


def tree_rss_gb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default) and all its descendants, in GB."""
    from infertune.system.resources import tree_rss_bytes

    return (tree_rss_bytes(pid) or 0) / 1e9


def watch(
    process: subprocess.Popen, timeout_s: float | None = None, max_gb: float = 0.0
) -> str | None:
    """Wait for a child; kill it where it runs past `timeout_s` or its tree's resident memory
    passes `max_gb` GB (0: no limit), and say why it was killed (None where it was not)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            process.wait(timeout=0.5)
            return None
        except subprocess.TimeoutExpired:
            pass
        if deadline is not None and time.monotonic() > deadline:
            why = f"did not finish within {timeout_s:.0f} s"
        elif max_gb and (rss := tree_rss_gb(process.pid)) > max_gb:
            why = f"killed at {rss:.1f} GB (--max-gb {max_gb:g})"
        else:
            continue
        process.kill()
        process.wait()
        return why


def run_in_child(
    script: str | Path,
    name: str,
    args: Sequence[str] = (),
    timeout_s: float | None = None,
    *,
    python: str | None = None,
    env: dict[str, str] | None = None,
    log_file: Path | None = None,
    max_gb: float = 0.0,
) -> dict:
    """`script --child NAME ARGS --child-out FILE` in a child process of its own (a study as
    `python -m benchmarks.studies.NAME`), its JSON result (a dict) read back with `wall_s`
    added. A crash, a hang past `timeout_s` or memory past `max_gb` becomes the result's
    `error` (beside what the child wrote before, if anything: {"model": name} otherwise).
    `python`: another interpreter (a virtual environment's); `env`: the child's whole
    environment; `log_file`: where its stdout and stderr go (their tail is in the error)."""
    command, child_env = _script_command(script, dict(os.environ if env is None else env))
    with tempfile.TemporaryDirectory(prefix=f"{Path(script).stem}-") as tmp:
        path = Path(tmp) / "result.json"
        command = [python or sys.executable, *command, "--child", name, *args]
        command += ["--child-out", str(path)]
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            stream = stack.enter_context(open(log_file, "w")) if log_file else None
            err = subprocess.STDOUT if stream else None
            process = subprocess.Popen(command, env=child_env, stdout=stream, stderr=err)
            why = watch(process, timeout_s, max_gb)
        found = path.exists()
        result = json.loads(path.read_text(encoding="utf-8")) if found else {"model": name}
        if process.returncode != 0 or not found:
            error = why or f"the child process exited with {process.returncode}"
            if log_file:
                error += f"; its output ends: {Path(log_file).read_text()[-2000:]}"
            result.setdefault("error", error)
        result["wall_s"] = time.perf_counter() - start
        return result


def write_child_result(path: Path, result: dict) -> None:
    """A child's result, for run_in_child to read back (may be called more than once: what is
    known so far, then all of it)."""
    Path(path).write_text(json.dumps(result, default=str), encoding="utf-8")


def fresh_process(code: str, env: dict[str, str] | None = None) -> dict:
    """`code` run by a new interpreter; its last line of stdout read as JSON, with the
    process's wall time (interpreter start included) added as `process_wall_s`."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


# -- outputs and errors --------------------------------------------------------------------------
def relative_error(outputs, reference) -> float:
    """The largest ||out - ref|| / ||ref|| over the outputs; each side is one array or a list
    of arrays in the same order. An output of the same size in another shape is compared
    flat (LiteRT may keep a fixed batch); a different count or size raises ValueError."""
    outs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    refs = list(reference) if isinstance(reference, list | tuple) else [reference]
    if len(outs) != len(refs):
        raise ValueError(f"returned {len(outs)} output(s), the model returns {len(refs)}")
    worst = 0.0
    for out, ref in zip(outs, refs):
        ref = np.asarray(ref, dtype=np.float64)
        out = np.asarray(out, dtype=np.float64)
        if out.size != ref.size:
            raise ValueError(f"returned an output of shape {out.shape}, the model's is {ref.shape}")
        diff = float(np.linalg.norm(out.reshape(ref.shape) - ref))
        norm = float(np.linalg.norm(ref))
        worst = max(worst, diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf")))
    return worst


def flat_outputs(outputs) -> list[np.ndarray]:
    """A model's or a runner's outputs (a tensor, a list, a dict...) as a flat list of arrays."""
    import tensorflow as tf

    return [np.asarray(leaf) for leaf in tf.nest.flatten(outputs)]


def first_output(outputs) -> np.ndarray:
    return np.asarray(outputs[0] if isinstance(outputs, list | tuple) else outputs)


def reason(exc: BaseException, limit: int = 400) -> str:
    """The exception on one line. OpenVINO opens its messages with the place that raised
    ("Exception from src/...", "Check 'false' failed at ..."): the cause comes after."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if not line.startswith(("Exception from src/", "Check '"))]
    text = f"{type(exc).__name__}: " + " / ".join(causes or lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_input(sample) -> str:
    """`1x28x28x1 float32`, or a dict's inputs by name."""
    if isinstance(sample, dict):
        return ", ".join(f"{k} {describe_input(v)}" for k, v in sorted(sample.items()))
    return f"{'x'.join(map(str, sample.shape))} {sample.dtype}"


def milliseconds(value: float) -> str:
    return f"{value:.4g}"


# -- the runtimes by hand ------------------------------------------------------------------------
# A sample is one array or a dict of arrays (the model's inputs by name). The exported and
# traced functions keep the batch free, and every other axis the Keras model declares free
# (None: a sequence length, an image's height and width), as a user writing
# `tf.TensorSpec((None, None), tf.int32)` for a text model does; LiteRT converts at the
# sample's exact shape, as the LiteRT docs show.


def flat_inputs(sample) -> tuple[list[str], list[np.ndarray]]:
    """The sample as (names, arrays): a dict's keys in sorted order, or ["x"] for one array."""
    if isinstance(sample, dict):
        names = sorted(sample)
        return names, [np.asarray(sample[name]) for name in names]
    return ["x"], [np.asarray(sample)]


def input_specs(model, sample, *, exact: bool = False) -> list:
    """One tf.TensorSpec per flat input, named after it (the ONNX and TFLite input names too):
    the sample's exact shapes when `exact`, else the batch and every axis the model
    declares free left as None."""
    import tensorflow as tf

    names, arrays = flat_inputs(sample)
    declared = _declared_shapes(model, names)
    specs = []
    for name, array in zip(names, arrays):
        shape = list(array.shape)
        if not exact:
            shape[0] = None
            free = declared.get(name)
            if free is not None and len(free) == array.ndim:
                shape = [None if want is None else got for want, got in zip(free, shape)]
        specs.append(tf.TensorSpec(shape, tf.as_dtype(array.dtype), name=name))
    return specs


def _declared_shapes(model, names: list[str]) -> dict[str, tuple]:
    """The input shapes a Keras model declares, by input name (by position for one input)."""
    inputs = list(getattr(model, "inputs", None) or [])
    if len(names) == 1 and len(inputs) == 1:
        return {names[0]: tuple(inputs[0].shape)}
    return {tensor.name: tuple(tensor.shape) for tensor in inputs}


def _flat_function(model, sample) -> Callable:
    """The model as a function of the flat inputs, called with the sample's structure."""
    if isinstance(sample, dict):
        names, _ = flat_inputs(sample)
        return lambda *flat: model(dict(zip(names, flat)))
    return lambda x: model(x)


def _on_host(result) -> object:
    """A function's outputs as numpy: one array, or a flat list for several outputs."""
    import tensorflow as tf

    if isinstance(result, tf.Tensor):
        return result.numpy()
    return [tensor.numpy() for tensor in tf.nest.flatten(result)]


def keras_call(model, sample) -> Runner:
    return lambda: model(sample).numpy()


def keras_predict(model, sample) -> Runner:
    return lambda: model.predict(sample, verbose=0)


def tf_function(model, sample, jit_compile: bool = False) -> Runner:
    import tensorflow as tf

    specs = input_specs(model, sample)
    signature = dict(zip(flat_inputs(sample)[0], specs)) if isinstance(sample, dict) else specs[0]
    fn = tf.function(model, input_signature=[signature], jit_compile=jit_compile)
    if isinstance(fn(sample), tf.Tensor):  # traces (and for XLA compiles) at the first call
        return lambda: fn(sample).numpy()
    return lambda: _on_host(fn(sample))


def onnx_bytes(model, sample) -> bytes:
    """The model exported to ONNX by hand: tf2onnx's from_function, the batch (and every
    axis the model declares free) left free."""
    import tensorflow as tf
    import tf2onnx

    specs = input_specs(model, sample)
    proto, _ = tf2onnx.convert.from_function(
        tf.function(_flat_function(model, sample), input_signature=specs), input_signature=specs
    )
    return proto.SerializeToString()


def _feed(names_wanted: list[str], sample) -> dict[str, np.ndarray]:
    """The sample's arrays by the runtime's input names, which must be the sample's names."""
    names, arrays = flat_inputs(sample)
    if sorted(names_wanted) != names:
        raise ValueError(f"The runtime's inputs are {names_wanted}; the sample has {names}.")
    return dict(zip(names, arrays))


def onnxruntime_session(model_bytes: bytes, sample, options=None) -> Runner:
    """ONNX Runtime's CPU session on the export (its default options, or `options`)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    if not isinstance(sample, dict):
        name = session.get_inputs()[0].name
        return lambda: session.run(None, {name: sample})
    feed = _feed([node.name for node in session.get_inputs()], sample)
    return lambda: session.run(None, feed)


def openvino_compiled(model_bytes: bytes, sample, precision_hint: str | None = None) -> Runner:
    """OpenVINO from the ONNX export. With its defaults (no `precision_hint`) that means
    bf16 inference on CPUs with bf16 support; precision_hint="f32" asks for float32."""
    import openvino

    core = openvino.Core()
    config = {} if precision_hint is None else {"INFERENCE_PRECISION_HINT": precision_hint}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model_bytes)
        compiled = core.compile_model(core.read_model(path), "CPU", config)
    inputs = sample
    if isinstance(sample, dict):
        inputs = _feed([node.get_any_name() for node in compiled.inputs], sample)
    if len(compiled.outputs) == 1:
        output = compiled.output(0)
        return lambda: compiled(inputs)[output]
    ports = compiled.outputs

    def run_all():
        result = compiled(inputs)
        return [result[port] for port in ports]

    return run_all


def per_caller(make: Callable[[], Runner]) -> Runner:
    """A runner that gives each calling thread its own runner from make() (made on the
    thread's first call, which the measurement does not time)."""
    import threading

    local = threading.local()

    def run():
        runner = getattr(local, "runner", None)
        if runner is None:
            runner = local.runner = make()
        return runner()

    return run


def openvino_per_caller(model_bytes: bytes, sample, hint: str) -> Runner:
    """OpenVINO f32 with a performance hint (LATENCY, THROUGHPUT): one compiled model, an
    infer request per calling thread."""
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(
        core.read_model(model_bytes),
        "CPU",
        {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": hint},
    )

    def make():
        request = compiled.create_infer_request()
        return lambda: [request.infer([sample])[port].copy() for port in compiled.outputs]

    return per_caller(make)


def tflite_bytes(model, sample) -> bytes:
    """The model converted to TFLite at the sample's shape, the way the LiteRT docs show."""
    import tensorflow as tf

    fn = tf.function(_flat_function(model, sample))
    concrete = fn.get_concrete_function(*input_specs(model, sample, exact=True))
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn).convert()


def litert_interpreter(
    model, sample, content: bytes | None = None, threads: int | None = None
) -> Runner:
    """TFLite conversion at the sample's shape (`content`, where it is made already) and
    ai-edge-litert's interpreter (XNNPACK), with its default thread count (one) or
    `threads`."""
    from ai_edge_litert.interpreter import Interpreter

    content = content or tflite_bytes(model, sample)
    interpreter = Interpreter(model_content=content, num_threads=threads)
    interpreter.allocate_tensors()
    output_indices = [detail["index"] for detail in interpreter.get_output_details()]
    if not isinstance(sample, dict):
        input_index = interpreter.get_input_details()[0]["index"]
        output_index = output_indices[0]

        def run():
            interpreter.set_tensor(input_index, sample)
            interpreter.invoke()
            return interpreter.get_tensor(output_index)

        return run
    details = interpreter.get_input_details()
    feed = _feed([detail["name"] for detail in details], sample)
    indexed = [(detail["index"], feed[detail["name"]]) for detail in details]

    def run_named():
        for index, array in indexed:
            interpreter.set_tensor(index, array)
        interpreter.invoke()
        outputs = [interpreter.get_tensor(index) for index in output_indices]
        return outputs[0] if len(outputs) == 1 else outputs

    return run_named


@contextlib.contextmanager
def quiet_nncf():
    """NNCF's progress bar (rich, on stdout) silenced."""
    import rich

    console = rich.get_console()
    was = console.quiet
    console.quiet = True
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        console.quiet = was


def ort_static_int8(model_bytes: bytes, calibration: np.ndarray, buffer: np.ndarray) -> Runner:
    """ONNX Runtime's quantize_static with its defaults (QDQ, int8 activations and weights,
    min-max calibration) but per-channel weights, as its docs recommend for convolutions."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    name = onnx.load_from_string(model_bytes).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rows = iter(range(len(calibration)))

        def get_next(self):
            i = next(self.rows, None)
            return None if i is None else {name: calibration[i : i + 1]}

    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "model.onnx", Path(tmp) / "int8.onnx"
        source.write_bytes(model_bytes)
        # The defaults hold every float tensor of every calibration sample (105 MB a sample
        # on ResNet50 224: 13.5 GB for 128); CalibMaxIntermediateOutputs would bound it, but
        # onnxruntime 1.32 drops each group's data instead of merging its ranges.
        quantize_static(source, target, Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
        quantized = target.read_bytes()
    return onnxruntime_session(quantized, buffer)


def nncf_int8(model_bytes: bytes, calibration: np.ndarray, buffer: np.ndarray) -> Runner:
    """NNCF's quantize with its defaults on the ONNX export read by OpenVINO, compiled for
    the CPU with f32 inference precision for what stays float (its default here is bf16)."""
    import logging

    os.environ.setdefault("NNCF_CI", "1")  # NNCF reads it at import: no telemetry
    import nncf
    import openvino

    nncf.set_log_level(logging.ERROR)
    core = openvino.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model_bytes)
        model = core.read_model(path)
        dataset = nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))])
        with quiet_nncf():
            quantized = nncf.quantize(model, dataset)
        compiled = core.compile_model(quantized, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    output = compiled.output(0)
    return lambda: compiled(buffer)[output]


def litert_full_int8(model, calibration: np.ndarray, buffer: np.ndarray) -> Runner:
    """TFLite full int8 as the LiteRT docs show it: Optimize.DEFAULT and a representative
    dataset (float32 inputs and outputs), converted at the sample's shape."""
    import tensorflow as tf

    fn = tf.function(lambda x: model(x))
    concrete = fn.get_concrete_function(tf.TensorSpec(buffer.shape, tf.as_dtype(buffer.dtype)))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], fn)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        [calibration[i : i + 1]] for i in range(len(calibration))
    )
    return litert_interpreter(model, buffer, content=converter.convert())


# The float32 runtimes by hand that zoo.py, production.py and precision.py time infertune
# against (OpenVINO asked for f32: its default is bf16 on CPUs with bf16 units), and the
# int8 ones of precision.py, calibrated on `calibration`.
RAW_RUNTIMES = ("tf.function", "tf.function+XLA", "onnxruntime", "openvino-f32", "litert")
INT8_RUNTIMES = ("onnxruntime-int8", "openvino-nncf-int8", "litert-int8")


def by_hand_builders(
    model,
    sample,
    labels: Sequence[str] = RAW_RUNTIMES,
    *,
    onnx: bytes | None = None,
    calibration: np.ndarray | None = None,
) -> tuple[dict[str, Callable[[], Runner]], Callable[[], bytes]]:
    """The runtimes by hand named in `labels`, each a builder (label -> () -> runner), and
    the ONNX export they share (`onnx`, or made on first use: a builder of another runtime
    may start from it). Labels: model(x), model.predict(x), tf.function, tf.function+XLA,
    onnxruntime, openvino (its defaults), openvino-f32, litert, and with `calibration` the
    int8 ones (onnxruntime-int8, openvino-nncf-int8, litert-int8)."""
    exported: dict[str, bytes] = {} if onnx is None else {"onnx": onnx}

    def export() -> bytes:  # one export by hand, shared by everything ONNX
        if "onnx" not in exported:
            exported["onnx"] = onnx_bytes(model, sample)
        return exported["onnx"]

    every: dict[str, Callable[[], Runner]] = {
        "model(x)": lambda: keras_call(model, sample),
        "model.predict(x)": lambda: keras_predict(model, sample),
        "tf.function": lambda: tf_function(model, sample),
        "tf.function+XLA": lambda: tf_function(model, sample, jit_compile=True),
        "onnxruntime": lambda: onnxruntime_session(export(), sample),
        "openvino": lambda: openvino_compiled(export(), sample),
        "openvino-f32": lambda: openvino_compiled(export(), sample, precision_hint="f32"),
        "litert": lambda: litert_interpreter(model, sample),
        "onnxruntime-int8": lambda: ort_static_int8(export(), calibration, sample),
        "openvino-nncf-int8": lambda: nncf_int8(export(), calibration, sample),
        "litert-int8": lambda: litert_full_int8(model, calibration, sample),
    }
    unknown = [label for label in labels if label not in every]
    if unknown:
        raise ValueError(f"no runtime by hand is called {unknown}; known: {list(every)}")
    return {label: every[label] for label in labels}, export


def build_runners(
    builders: dict[str, Callable[[], Runner]], tag: str | None = None
) -> tuple[dict[str, Runner], dict[str, str], dict[str, float]]:
    """Every runner that could be built: (runners, {label: why it failed}, {label: seconds
    to build}); one that fails is recorded, the others are built. `tag`: say each on stderr."""
    runners, failed, build_s = {}, {}, {}
    for label, build in builders.items():
        if tag:
            log(tag, f"  by hand: {label}")
        start = time.perf_counter()
        try:
            runners[label] = build()
        except Exception as exc:  # a runtime missing here or failing on this model: say why
            failed[label] = reason(exc)
        build_s[label] = time.perf_counter() - start
    return runners, failed, build_s


def check_first_calls(runners: dict, reference, failed: dict[str, str]) -> dict[str, float]:
    """Each runner's first call, its relative error against `reference`; a runner whose
    first call raises is dropped from `runners`, its reason in `failed`."""
    errors = {}
    for label in list(runners):
        try:
            errors[label] = relative_error(runners[label](), reference)
        except Exception as exc:
            failed[label] = f"first call: {reason(exc)}"
            del runners[label]
    return errors


def _holds_strings(sample) -> bool:
    return any(array.dtype.kind in "OSU" for array in flat_inputs(sample)[1])


def against_by_hand(
    name: str, tag: str, model, sample, reference: list, opt, budget_s: float
) -> dict:
    """The float32 runtimes by hand (RAW_RUNTIMES), each checked against `reference` on its
    first call, and `opt(sample)` where there is an `opt`, timed in interleaved rounds: a
    result's raw_failed, raw_rel_err, raw_build_s, p50_ms, stats, best_exact_raw (the
    fastest within EXACT_RTOL) and vs_best_exact_raw (its p50 over infertune's)."""
    log(tag, f"{name}: runtimes by hand")
    builders, _ = by_hand_builders(model, sample)
    failed = {}
    if _holds_strings(sample):
        # XLA compiling a function of a string tensor aborts the process (TensorFlow's check
        # DataTypeCanUseMemcpy), which no try can catch: not built.
        del builders["tf.function+XLA"]
        failed["tf.function+XLA"] = "XLA takes no string tensors (it aborts the process)"
    runners, build_failed, build_s = build_runners(builders, tag)
    failed.update(build_failed)
    raw_err = check_first_calls(runners, reference, failed)
    cooldown = {"onnxruntime": onnxruntime_cooldown_s()}
    if opt is not None:
        runners["infertune"] = lambda: opt(sample)
        cooldown["infertune"] = max(b.cooldown_s for b in opt.backends)  # a fast path's too
    log(tag, f"{name}: measuring {len(runners)} runners")
    measured = measure_runners(runners, budget_s=budget_s, cooldown_s=cooldown)
    for label, why in measured.errors.items():
        failed[label] = f"measurement: {why}"
    p50 = {label: stats.p50 for label, stats in measured.stats.items()}
    exact = {
        label: p50[label]
        for label in RAW_RUNTIMES
        if label in p50 and raw_err.get(label, 1.0) <= EXACT_RTOL
    }
    best = min(exact, key=exact.get) if exact else None
    ours = p50.get("infertune")
    return {
        "raw_failed": failed,
        "raw_rel_err": raw_err,
        "raw_build_s": build_s,
        "p50_ms": p50,
        "stats": {label: s.to_dict() for label, s in measured.stats.items()},
        "best_exact_raw": best,
        "vs_best_exact_raw": exact[best] / ours if best and ours else None,
    }


# -- tables of runtimes by hand -----------------------------------------------------------------
def raw_cell(r: dict, label: str) -> str:
    """A by-hand runtime's cell in a results table: its p50 in ms (with its error where it is
    not exact), or why there is none."""
    if label in r["raw_failed"]:
        return "failed"
    value = r["p50_ms"].get(label)
    if value is None:
        return "-"
    err = r["raw_rel_err"].get(label, 0.0)
    return milliseconds(value) + (f" (err {err:.0e})" if err > EXACT_RTOL else "")


def runtime_table(
    results: list[dict],
    trailing: list[str],
    chose: Callable[[dict], str],
    tail: Callable[[dict], list[str]],
) -> dict:
    """The table of zoo.py and production.py: each model's input, optimize()'s seconds, its
    choice (`chose(r)`), the p50 ms of every runtime by hand and of infertune, the ratio to
    the fastest exact runtime by hand, then the `trailing` columns (`tail(r)`)."""
    columns = [*RAW_RUNTIMES, "infertune"]
    head = ["model", "input", "optimize() s", "infertune chose", *columns]
    head += ["vs fastest exact by hand", *trailing]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["model"], "", "", r["error"]])
            continue
        cells = [raw_cell(r, label) for label in RAW_RUNTIMES]
        ours = r["p50_ms"].get("infertune")
        cells.append("-" if ours is None else milliseconds(ours))
        ratio = r["vs_best_exact_raw"]
        versus = "-" if ratio is None else f"{ratio:.2f}x ({r['best_exact_raw']})"
        rows.append(
            [r["model"], r["input"], f"{r['optimize_s']:.0f}", chose(r), *cells, versus, *tail(r)]
        )
    return table(head, rows)


def fate_lines(title: str, candidates: list[dict]) -> list[str]:
    """A model's line of every candidate's fate (the names by status), then a line for each
    candidate that failed, mismatched or timed out, with its reason."""
    by_status: dict[str, list[str]] = {}
    for c in candidates:
        by_status.setdefault(c["status"], []).append(c["name"])
    statuses = "; ".join(f"{status}: {', '.join(names)}" for status, names in by_status.items())
    lines = [f"- {title}: {statuses}"]
    for c in candidates:
        if c["status"] in ("mismatch", "failed", "timeout"):
            lines.append(f"  - {c['name']} {c['status']}: {c['reason']}")
    return lines


# -- timing --------------------------------------------------------------------------------------
@functools.cache
def onnxruntime_cooldown_s() -> float:
    """ONNX Runtime's spinning workers keep a core busy after each call (see OrtSettings):
    the by-hand session's blocks are followed by the same wait as infertune's own."""
    from infertune.backends.onnxruntime.cpu import OnnxRuntimeCpu

    return OnnxRuntimeCpu().cooldown_s


def measure_runners(
    runners: dict[str, Runner],
    *,
    budget_s: float,
    cooldown_s: dict[str, float] | None = None,
    min_rounds: int = 8,
    race: bool = True,
):
    """Warm every runner up, then time them all in interleaved rounds (infertune's engine,
    a MeasureResult); `race` False: none leaves the rounds for being far behind."""
    from infertune.pipeline.timing import measure_interleaved, warm_up

    estimates = {label: warm_up(fn, min_calls=2) for label, fn in runners.items()}
    return measure_interleaved(
        runners,
        budget_s=budget_s,
        per_call_estimate_s=estimates,
        cooldown_s=cooldown_s or {},
        min_rounds=min_rounds,
        race=race,
    )


def warm_up_optimize(precision: tuple[str, ...] = ("fp32",), max_drop: float = 0.01) -> None:
    """optimize() with `precision` once on a tiny model: the process's one-time costs (the
    runtimes' and quantizers' imports, tf2onnx's first conversion) paid before the
    optimize() calls or conversions a benchmark times."""
    import keras

    import infertune

    x = np.random.default_rng(0).random((200, 8), dtype=np.float32)
    tiny = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    labels = tiny.predict(x[100:], verbose=0).argmax(axis=-1)
    options: dict[str, Any] = {"precision": precision}
    if precision != ("fp32",):
        options["calibration"] = x[:100]
        options["accuracy"] = infertune.Accuracy((x[100:], labels), "accuracy", max_drop=max_drop)
    with infertune.optimize(tiny, x[:1], verbose=False, **options):
        pass


# -- the machine ---------------------------------------------------------------------------------
VERSIONED = (
    "tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime", "onnxruntime-gpu", "openvino",
    "nncf", "ai-edge-litert", "tensorrt", "cuda-python", "numpy", "ray", "scikit-learn",
    "keras-hub",
)  # fmt: skip


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / 2**30, 1)
    except OSError:
        pass
    return None


def machine() -> dict:
    """The machine, as results.json records it: CPU model, the instruction sets that matter
    (infertune's list), usable cores, GPUs (the NVIDIA driver's), memory, platform, Python."""
    from infertune.system.environment import collect_environment

    env = collect_environment(packages=())
    cpu = env["cpu"]
    return {
        "cpu": cpu["model"],
        "flags": list(dict.fromkeys([*cpu["features"], *cpu["precision_instructions"]])),
        "cores": cpu["usable_cores"],
        "logical_cores": cpu["logical_cores"],
        "gpu": ", ".join(env["gpu_devices"]) or None,
        "memory_gib": _memory_gib(),
        "platform": env["platform"],
        "python": env["python"],
    }


def versions() -> dict[str, str]:
    """The versions of the packages that change results or speed, those installed."""
    from infertune.system.environment import package_version

    found = {name: package_version(name) for name in VERSIONED}
    return {name: version for name, version in found.items() if version}


def machine_description(described: dict | None = None) -> str:
    """The machine on one line: CPU, cores (flags), GPU, memory, platform, Python."""
    m = described or machine()
    memory = f", {m['memory_gib']:.0f} GiB" if m.get("memory_gib") else ""
    return (
        f"{m['cpu']}, {m['cores']} cores ({', '.join(m['flags']) or 'none of the flags'}), "
        f"GPU: {m['gpu'] or 'none'}{memory}, {m['platform']}, Python {m['python']}"
    )


def _commit() -> tuple[str | None, bool | None]:
    """The repository's short commit and whether its tracked files have changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        status = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head or None, bool(status)


def _infertune_version() -> str | None:
    from infertune.system.environment import package_version

    try:
        import infertune

        return infertune.__version__
    except Exception:  # a checkout without the package importable: its metadata, if any
        return package_version("infertune")


# -- results -------------------------------------------------------------------------------------
def target(name: str, wanted: str, value, met: bool | None, detail: str | None = None) -> dict:
    """One target's verdict: its name, what it asks ("<= 1.0x"), the value measured (a
    number, or None where nothing was measured), met (None: not checked, as under --quick),
    and the sentence that says it (`detail`, the name and numbers otherwise)."""
    found = {"name": name, "target": wanted, "value": _plain(value), "met": met}
    if detail:
        found["detail"] = detail
    return found


def target_line(t: dict) -> str:
    """PASS, FAIL or INFO (not checked), then what was measured against what was asked."""
    verdict = "INFO" if t["met"] is None else "PASS" if t["met"] else "FAIL"
    value = t["value"]
    shown = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{verdict} " + (t.get("detail") or f"{t['name']}: {shown} ({t['target']})")


def exit_code(targets: Iterable[dict], failed: bool = False) -> int:
    """1 where a target was missed (or `failed`), else 0."""
    return 1 if failed or any(t["met"] is False for t in targets) else 0


def table(columns: Sequence[str], rows: Iterable[Sequence], title: str | None = None) -> dict:
    """A table of results.md: its columns and its rows' cells, as text (short rows are
    padded with empty cells), and a line above it where `title`."""
    cells = [[str(cell) for cell in row] for row in rows]
    cells = [row + [""] * (len(columns) - len(row)) for row in cells]
    return {"title": title, "columns": list(columns), "rows": cells}


def preformatted(text: str, title: str | None = None) -> dict:
    """A block of text of results.md, shown as it is (```text)."""
    return {"title": title, "text": text}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(t: dict) -> str:
    """One entry of data["tables"] as GitHub markdown (a table, or a fenced block of text)."""
    lines = [t["title"], ""] if t.get("title") else []
    if "text" in t:
        return "\n".join([*lines, "```text", t["text"].rstrip("\n"), "```"])
    lines.append("| " + " | ".join(_cell(c) for c in t["columns"]) + " |")
    lines.append("|" + "---|" * len(t["columns"]))
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t["rows"]]
    return "\n".join(lines)


def results_markdown(data: dict) -> str:
    """results.md: the tables of results.json, as the docs quote them."""
    return "\n\n".join(markdown_table(t) for t in data["tables"]) + "\n"


def readme(data: dict) -> str:
    """README.md of a result folder: what was measured, how, where and when; the targets;
    the sections (every candidate's fate, failures...)."""
    commit = data.get("commit") or "unknown"
    if data.get("uncommitted_changes"):
        commit += " (with uncommitted changes)"
    version_list = ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items())
    lines = [f"# {data['benchmark']}: {data['date']}", ""]
    if data.get("about"):
        lines += [data["about"].strip(), ""]
    lines += [
        f"- Command: `{data['command']}`",
        f"- Date: {data['date']}",
        f"- Commit: {commit}",
        f"- infertune: {data.get('infertune') or 'unknown'}",
        f"- Machine: {machine_description(data['machine'])}",
        f"- Versions: {version_list or 'unknown'}",
        "",
    ]
    if data.get("notes"):
        lines += [data["notes"].strip(), ""]
    lines += [
        "The tables: [results.md](results.md); every number: [results.json](results.json).",
        "",
    ]
    if data.get("headline"):
        lines += ["## Headline", ""]
        lines += [f"- {k}: {_shown(v)}" for k, v in data["headline"].items()]
        lines.append("")
    if data.get("targets"):
        lines += ["## Targets", ""] + [f"- {target_line(t)}" for t in data["targets"]] + [""]
    for section in data.get("sections", []):
        lines += [f"## {section['title']}", "", *section["lines"], ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _shown(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _plain(value):
    """`value` as JSON holds it: numpy numbers as Python's, NaN and infinities as None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def results(
    benchmark: str,
    *,
    rows: list,
    tables: list[dict],
    targets: Sequence[dict] = (),
    headline: dict | None = None,
    about: str | None = None,
    notes: str | None = None,
    sections: Sequence[dict] = (),
    **extra,
) -> dict:
    """A run's results in results.json's schema: what the caller measured (`rows`, the
    `tables` results.md shows, `targets`, `headline`, README.md's `about`, `notes` and
    `sections`: {"title", "lines"}), with the command line, date, commit, infertune's
    version, the machine and the packages' versions filled in; `extra` keys are kept."""
    commit, changed = _commit()
    data = {
        "benchmark": benchmark,
        "command": command_line(),
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "uncommitted_changes": changed,
        "infertune": _infertune_version(),
        "machine": machine(),
        "versions": versions(),
        "about": about,
        "notes": notes,
        "rows": rows,
        "tables": list(tables),
        "targets": list(targets),
        "headline": headline or {},
        "sections": list(sections),
        **extra,
    }
    return _plain(data)


def about(doc: str | None) -> str:
    """A script's docstring's first paragraph, on one line: README.md's `about`."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def result_folder(benchmark: str, out: Path | None, date: str, quick: bool = False) -> Path:
    """`out`, or docs/benchmarks/<benchmark>/<date>/ (<date>-2, -3... where it exists), or
    with `quick` the same under a temporary folder: a smoke test's numbers stay out of
    the docs."""
    if out is not None:
        return Path(out)
    base = (QUICK_RESULTS if quick else RESULTS) / benchmark
    folder, n = base / date, 1
    while folder.exists() and not quick:
        n += 1
        folder = base / f"{date}-{n}"
    return folder


def write_results(folder: Path, data: dict) -> None:
    """`folder`/results.json (`data`), results.md (its tables) and README.md (what, how,
    where, when; its targets and sections), all three made from `data` alone."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = _plain(data)
    (folder / "results.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (folder / "results.md").write_text(results_markdown(data), encoding="utf-8")
    (folder / "README.md").write_text(readme(data), encoding="utf-8")


def publish(
    data: dict, out: Path | None = None, json_file: Path | None = None, quick: bool = False
) -> Path:
    """Print the tables and the targets, write the result folder (result_folder) and, where
    given, `json_file`; returns the folder."""
    folder = result_folder(data["benchmark"], out, data["date"], quick)
    print(results_markdown(data))
    for t in data["targets"]:
        print(target_line(t))
    write_results(folder, data)
    if json_file is not None:
        Path(json_file).write_text(json.dumps(_plain(data), indent=2) + "\n", encoding="utf-8")
    print(f"results written to {folder}", file=sys.stderr)
    return folder
