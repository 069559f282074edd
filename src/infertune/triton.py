"""Export a tuned result to a Triton Inference Server model repository.

    REPOSITORY/NAME/config.pbtxt
    REPOSITORY/NAME/VERSION/model.onnx           (backend "onnxruntime" or "openvino")
    REPOSITORY/NAME/VERSION/model.savedmodel/    (platform "tensorflow_savedmodel")
    REPOSITORY/NAME/VERSION/model.py             (backend "python": any candidate, LiteRT
    REPOSITORY/NAME/VERSION/infertune_result/     included, run by infertune inside Triton)

The candidate decides the Triton backend, and its tuned settings go into config.pbtxt where
that backend has a parameter for them (ONNX Runtime threads, execution mode and graph
optimization level; OpenVINO's performance hint and bf16; XLA for TensorFlow graphs). What
has no Triton equivalent is said in `TritonExport.notes`, and a candidate no Triton backend
runs (LiteRT) is refused with the reason, unless it is exported for Triton's Python backend
(`backend="python"`), where infertune itself runs the saved result. A result with an
exact-shape fast path (a candidate that runs only the sample's shapes) exports the choice
among the candidates that run any shape; only the Python backend keeps the fast path.
Input and output names, data types and dims are read from the artifact itself (the ONNX
graph, the SavedModel's serving signature), so they are the names Triton will find. A future
TensorRT candidate maps to platform "tensorrt_plan" with model.plan: one more entry in
`_PLANS`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import ExportError, OptionError
from .saving import MANIFEST, read_manifest, verify_files

__all__ = ["PYTHON_RESULT_DIR", "TritonExport", "TritonTensor", "check_exportable", "export_saved"]

BACKENDS = (None, "python")  # None: the candidate's own Triton backend
PYTHON_RESULT_DIR = "infertune_result"  # the saved result, beside model.py
PYTHON_BATCH_SIZE = 32  # the Python backend's max_batch_size unless one is given

_TYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "object": "TYPE_STRING",
}

# Candidates no Triton backend runs, and what to do instead.
_WHY_NOT = {
    "litert": (
        "Triton Inference Server has no official LiteRT/TFLite backend (its backends are "
        "ONNX Runtime, OpenVINO, TensorFlow, TensorRT, PyTorch and Python). Tune again with "
        "backends=[...] naming onnxruntime-cpu, openvino-cpu or tf-function to get a result "
        'Triton can serve, or export it for Triton\'s Python backend (backend="python"), '
        "which runs it with infertune"
    ),
}


@dataclass(frozen=True)
class TritonTensor:
    """One input or output as config.pbtxt names it."""

    name: str
    dtype: str  # numpy dtype name
    dims: tuple[int, ...]  # -1 for a dynamic dimension

    @property
    def data_type(self) -> str:
        if self.dtype not in _TYPES:
            raise ExportError(f"Tensor {self.name!r} has dtype {self.dtype}, which Triton lacks.")
        return _TYPES[self.dtype]


@dataclass
class TritonExport:
    """What export_triton() wrote: paths, the backend, the config text, and what it carried."""

    model_dir: Path
    version_dir: Path
    backend: str  # Triton backend ("onnxruntime", "openvino") or platform ("tensorflow_savedmodel")
    config: str  # config.pbtxt as written
    carried: list[str] = field(default_factory=list)  # tuned settings written into the config
    notes: list[str] = field(default_factory=list)  # settings Triton has no place for, caveats
    names: dict[str, str] = field(default_factory=dict)  # Triton tensor name -> the model's name

    def __str__(self) -> str:
        lines = [f"wrote {self.version_dir} and {self.model_dir / 'config.pbtxt'} ({self.backend})"]
        if self.names:
            pairs = ", ".join(f"{triton} = {model}" for triton, model in self.names.items())
            lines.append(f"  tensors: {pairs}")
        lines += [f"  carried over: {item}" for item in self.carried]
        lines += [f"  note: {item}" for item in self.notes]
        return "\n".join(lines)


@dataclass
class _Plan:
    """How one candidate's saved artifact becomes a Triton model version."""

    backend: str | None  # config `backend`
    platform: str | None  # or config `platform`
    inputs: list[TritonTensor]
    outputs: list[TritonTensor]
    write: Callable[[Path], None]  # fills the version directory
    default_model_filename: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    graph_level: int | None = None
    carried: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # Triton tensor name -> the model's name


def check_exportable(kind: str, name: str, backend: str | None = None) -> None:
    """Raise ExportError, with the reason, for a candidate no Triton backend runs (every
    candidate runs in the Python backend); OptionError for an unknown `backend`."""
    if backend not in BACKENDS:
        raise OptionError(
            f"backend must be None (the candidate's own Triton backend) or 'python' (Triton's "
            f"Python backend, running infertune). Received: backend={backend!r}."
        )
    if kind in _PLANS or backend == "python":
        return
    reason = _WHY_NOT.get(kind, f"no Triton backend is known for the {kind!r} candidate")
    raise ExportError(f"Cannot export the {name} result to Triton: {reason}.")


def export_saved(
    saved: str | os.PathLike,
    repository: str | os.PathLike,
    name: str,
    version: int = 1,
    max_batch_size: int | None = None,
    backend: str | None = None,
) -> TritonExport:
    """Write the saved result in `saved` as model `name`, version `version`, of the Triton
    model repository `repository` (created if missing). See Optimized.export_triton."""
    _check_arguments(name, version, max_batch_size)
    saved = Path(saved)
    manifest = read_manifest(saved)
    verify_files(saved, manifest)
    check_exportable(manifest["backend"]["kind"], manifest["backend"]["name"], backend)
    model_dir = Path(repository) / name
    version_dir = model_dir / str(version)
    if version_dir.exists():
        raise ExportError(
            f"'{version_dir}' already exists. Choose another version (version=...), or remove it."
        )
    plan = (_python_plan if backend == "python" else _PLANS[manifest["backend"]["kind"]])(
        saved, manifest
    )
    inputs, outputs = plan.inputs, plan.outputs
    if max_batch_size is None:
        max_batch_size = 0
        if backend == "python":
            if all(t.dims and t.dims[0] == -1 for t in inputs + outputs):
                max_batch_size = PYTHON_BATCH_SIZE
            else:
                plan.notes.append(
                    "no dynamic batching: the model fixes its batch size, so Triton cannot "
                    "gather requests into larger batches"
                )
    if max_batch_size > 0:
        fixed = [t.name for t in inputs + outputs if not t.dims or t.dims[0] != -1]
        if fixed:
            raise ExportError(
                f"max_batch_size={max_batch_size} lets Triton batch requests along the first "
                f"dimension, but {', '.join(map(repr, fixed))} has no dynamic first dimension. "
                f"Use max_batch_size=0 (the default)."
            )
        inputs = [TritonTensor(t.name, t.dtype, t.dims[1:]) for t in inputs]
        outputs = [TritonTensor(t.name, t.dtype, t.dims[1:]) for t in outputs]
        plan.carried.append(f"max_batch_size {max_batch_size} with dynamic batching")
    config = _config_text(name, plan, inputs, outputs, max_batch_size)
    by_batch = manifest.get("by_batch") or {}
    if len(set(by_batch.values())) > 1:
        choices = ", ".join(f"batch {n}: {chosen}" for n, chosen in by_batch.items())
        if backend == "python":
            plan.notes.append(
                f"the result chose candidates by batch size ({choices}); the Python backend "
                f"runs the whole result, so each batch Triton forms goes to its own choice"
            )
        else:
            plan.notes.append(
                f"the result chose candidates by batch size ({choices}); this repository holds "
                f"{manifest['backend']['name']} (the choice at the sample's batch size) for "
                f"every batch size, as a Triton model runs one artifact; backend='python' "
                f"serves the choice per batch size"
            )

    exact = manifest.get("exact_backend")
    if exact:
        shapes = ", ".join(str(tuple(shape)) for shape in exact["shapes"])
        if backend == "python":
            plan.notes.append(
                f"the result serves the sample's exact shapes {shapes} with {exact['name']} "
                f"(it runs no other shape); the Python backend runs the whole result, so "
                f"requests of exactly those shapes go to it"
            )
        else:
            plan.notes.append(
                f"the result serves the sample's exact shapes {shapes} with {exact['name']}, "
                f"which runs no other shape; this repository holds "
                f"{manifest['backend']['name']} (the choice among candidates that run any "
                f"shape) for every request, as a Triton model runs one artifact; "
                f"backend='python' keeps the fast path"
            )

    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.exporting-", dir=model_dir))
    try:
        plan.write(staging)
        os.rename(staging, version_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    config_path = model_dir / "config.pbtxt"
    if config_path.exists():
        plan.notes.append(
            f"replaced the existing {config_path} (it now describes version {version})"
        )
    config_path.write_text(config, encoding="utf-8")
    backend_words = plan.backend or plan.platform
    return TritonExport(
        model_dir, version_dir, backend_words, config, plan.carried, plan.notes, plan.names
    )


def _check_arguments(name: str, version: int, max_batch_size: int | None) -> None:
    if (
        not isinstance(name, str)
        or not re.fullmatch(r"[A-Za-z0-9_.-]+", name)
        or name
        in (
            ".",
            "..",
        )
    ):
        raise OptionError(
            f"The Triton model name must be letters, digits, '_', '-' or '.' (it names a "
            f"directory). Received: name={name!r}."
        )
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise OptionError(f"version must be an integer >= 1. Received: version={version!r}.")
    if max_batch_size is not None and (
        isinstance(max_batch_size, bool)
        or not isinstance(max_batch_size, int)
        or max_batch_size < 0
    ):
        raise OptionError(
            f"max_batch_size must be an integer >= 0 or None. Received: "
            f"max_batch_size={max_batch_size!r}."
        )


# -- plans, one per kind of candidate ---------------------------------------------------------
def _model_names(manifest: dict, inputs: list[str], outputs: list[str]) -> dict[str, str]:
    """Triton's tensor names (flat order) against the model's input names and output keys."""
    from .structure import Structure

    model_inputs = [spec["name"] for spec in manifest["inputs"]["inputs"]]
    structure = Structure.from_dict(manifest["outputs"]["structure"])
    model_outputs = structure.leaf_names("" if structure.kind == "dict" else "output")
    return {**dict(zip(inputs, model_inputs)), **dict(zip(outputs, model_outputs))}


def _onnx_tensors(path: Path) -> tuple[list[TritonTensor], list[TritonTensor]]:
    """Inputs and outputs of an ONNX graph with their dtypes and dims (-1 where symbolic)."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}

    def tensors(values) -> list[TritonTensor]:
        found = []
        for value in values:
            if value.name in initializers:
                continue
            kind = value.type.tensor_type
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(kind.elem_type)).name
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim)
            found.append(TritonTensor(value.name, dtype, dims))
        return found

    return tensors(graph.input), tensors(graph.output)


def _copy_file(saved: Path, rel: str) -> Callable[[Path], None]:
    return lambda version_dir: shutil.copy2(saved / rel, version_dir / Path(rel).name)


def _onnxruntime_plan(saved: Path, manifest: dict) -> _Plan:
    settings = manifest["backend"]["settings"]
    inputs, outputs = _onnx_tensors(saved / settings["file"])
    session = settings["session"]
    plan = _Plan("onnxruntime", None, inputs, outputs, _copy_file(saved, settings["file"]))
    plan.names = _model_names(manifest, settings["input_names"], settings["output_names"])
    plan.default_model_filename = "model.onnx"
    plan.carried.append("instance_group KIND_CPU (tuned on the CPU execution provider)")
    if session["intra_op_threads"]:
        plan.parameters["intra_op_thread_count"] = str(session["intra_op_threads"])
        plan.carried.append(f"intra_op_thread_count {session['intra_op_threads']}")
    plan.parameters["execution_mode"] = "1" if session["execution_mode"] == "parallel" else "0"
    plan.carried.append(f"execution_mode {session['execution_mode']}")
    # Triton's ONNX Runtime backend: no graph level = ORT_ENABLE_ALL, -1 basic, 1 extended.
    level = {"all": None, "extended": 1, "basic": -1}[session["graph_optimization"]]
    if level is not None:
        plan.graph_level = level
        plan.carried.append(f"graph optimization level {session['graph_optimization']}")
    if not session["allow_spinning"]:
        plan.notes.append(
            "the tuned session's worker threads sleep between calls (nospin); Triton's ONNX "
            "Runtime backend has no parameter for that, so its sessions spin (ONNX Runtime's "
            "default)"
        )
    if manifest["backend"]["precision"] != "fp32":
        plan.carried.append(f"{manifest['backend']['precision']} (in the quantized model.onnx)")
    return plan


def _openvino_plan(saved: Path, manifest: dict) -> _Plan:
    settings = manifest["backend"]["settings"]
    inputs, outputs = _onnx_tensors(saved / settings["file"])
    plan = _Plan("openvino", None, inputs, outputs, _copy_file(saved, settings["file"]))
    plan.names = _model_names(manifest, settings["input_names"], settings["output_names"])
    plan.default_model_filename = "model.onnx"
    plan.parameters["PERFORMANCE_HINT"] = settings["hint"]
    plan.carried += ["instance_group KIND_CPU", f"PERFORMANCE_HINT {settings['hint']}"]
    if settings["inference_precision"] == "bf16":
        plan.parameters["HINT_BF16"] = "YES"
        plan.carried.append("bf16 inference precision (HINT_BF16)")
    else:
        plan.notes.append(
            "f32 inference precision cannot be pinned: Triton's OpenVINO backend has only "
            "HINT_BF16=YES, and on CPUs with bf16 units (avx512_bf16, AMX) OpenVINO computes in "
            "bf16 by default (about 5e-3 relative error measured on MobileNetV2). Serve it on "
            "a CPU without bf16, or export an onnxruntime-cpu result for exact fp32"
        )
    return plan


def _savedmodel_tensors(path: Path) -> tuple[list[TritonTensor], list[TritonTensor]]:
    """Inputs and outputs of a SavedModel's serving_default signature (what Triton serves)."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    _, kwargs = signature.structured_input_signature

    def tensors(specs: dict) -> list[TritonTensor]:
        return [
            TritonTensor(
                key,
                np.dtype(spec.dtype.as_numpy_dtype).name,
                tuple(-1 if d is None else int(d) for d in spec.shape.as_list()),
            )
            for key, spec in sorted(specs.items())
        ]

    return tensors(kwargs), tensors(signature.structured_outputs)


def _savedmodel_plan(saved: Path, manifest: dict) -> _Plan:
    kind = manifest["backend"]["kind"]
    settings = manifest["backend"]["settings"]
    if settings.get("format") == "keras":
        source = _keras_as_savedmodel(saved, manifest)

        def write(version_dir: Path) -> None:
            shutil.move(str(source), str(version_dir / "model.savedmodel"))
            shutil.rmtree(source.parent, ignore_errors=True)

    else:
        source = saved / settings["dir"]

        def write(version_dir: Path) -> None:
            shutil.copytree(source, version_dir / "model.savedmodel")

    inputs, outputs = _savedmodel_tensors(source)
    plan = _Plan(None, "tensorflow_savedmodel", inputs, outputs, write)
    plan.names = _model_names(
        manifest,
        [f"in_{i}" for i in range(len(inputs))],  # tensor_specs' names: the signature's keys
        [f"output_{i}" for i in range(len(outputs))],  # tf.saved_model's flat output keys
    )
    plan.carried.append("instance_group KIND_CPU")
    if kind == "tf-xla":
        # Triton's TensorFlow backend maps graph level 1 to XLA's GlobalJitLevel ON_1.
        plan.graph_level = 1
        plan.carried.append("XLA (jit_compile in the saved function; graph level 1)")
    if kind == "keras-eager":
        plan.notes.append(
            "the model's own call runs as a TensorFlow graph (Triton has no eager mode)"
        )
    plan.notes.append(
        "Triton serves it with its TensorFlow backend: check that your Triton release has one"
    )
    return plan


def _keras_as_savedmodel(saved: Path, manifest: dict) -> Path:
    """A .keras result as a SavedModel of the model's flat traced call, in a temporary dir."""
    import tensorflow as tf

    from .backends.tf_function import save_flat_savedmodel
    from .inputs import InputSignature
    from .models import load_model, tensor_specs

    source = load_model(saved / manifest["backend"]["settings"]["file"])
    signature = InputSignature.from_dict(manifest["inputs"])
    fn = tf.function(source.graph_function(signature), input_signature=tensor_specs(signature))
    path = Path(tempfile.mkdtemp(prefix="infertune-keras-")) / "model.savedmodel"
    save_flat_savedmodel(fn, source.owner, path)
    return path


def _python_plan(saved: Path, manifest: dict) -> _Plan:
    """Any candidate, run by infertune in Triton's Python backend: model.py imports
    `infertune.deploy.triton_python`, which loads the copy of the saved result beside it."""
    from .deploy.served import ServedModel

    model = ServedModel(saved)  # the names, dtypes and output shapes, from running it once
    try:
        inputs, outputs = (
            [TritonTensor(s.name, s.dtype.name, tuple(-1 if d is None else d for d in s.shape))
             for s in specs]
            for specs in (model.inputs, model.outputs)
        )  # fmt: skip
    finally:
        model.close()

    def write(version_dir: Path) -> None:
        target = version_dir / PYTHON_RESULT_DIR
        for rel in [*manifest["files"], MANIFEST]:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(saved / rel, target / rel)
        (version_dir / "model.py").write_text(_PYTHON_MODEL, encoding="utf-8")

    plan = _Plan("python", None, inputs, outputs, write)
    plan.names = {t.name: t.name for t in inputs + outputs}
    backend = manifest["backend"]
    plan.carried += [
        f"the {backend['name']} candidate itself with its tuned settings (the saved result in "
        f"{PYTHON_RESULT_DIR}/, run by infertune)",
        "instance_group KIND_CPU",
    ]
    extra = f'"infertune[{backend["requires"]}]"' if backend.get("requires") else "infertune"
    plan.notes.append(
        f"Triton's Python backend runs model.py in its own Python: install {extra} there "
        f"(pip install, or a packed environment named by EXECUTION_ENV_PATH in config.pbtxt)"
    )
    return plan


_PYTHON_MODEL = f'''"""A Triton Python-backend model: infertune's export_triton(backend="python").

It serves the infertune result saved in {PYTHON_RESULT_DIR}/ beside this file, so the Python
that Triton's Python backend runs needs infertune and that result's runtime installed.
"""

from infertune.deploy.triton_python import TritonPythonModel  # noqa: F401
'''


_PLANS: dict[str, Callable[[Path, dict], _Plan]] = {
    "onnxruntime-cpu": _onnxruntime_plan,
    "onnxruntime-cpu-int8": _onnxruntime_plan,
    "openvino-cpu": _openvino_plan,
    "openvino-cpu-bf16": _openvino_plan,
    "tf-function": _savedmodel_plan,
    "tf-xla": _savedmodel_plan,
    "keras-eager": _savedmodel_plan,
}


# -- config.pbtxt -----------------------------------------------------------------------------
def _config_text(
    name: str,
    plan: _Plan,
    inputs: list[TritonTensor],
    outputs: list[TritonTensor],
    max_batch_size: int,
) -> str:
    """config.pbtxt in protobuf text format (Triton's ModelConfig message)."""
    lines = [f"name: {_quote(name)}"]
    if plan.platform is not None:
        lines.append(f"platform: {_quote(plan.platform)}")
    else:
        lines.append(f"backend: {_quote(plan.backend)}")
    lines.append(f"max_batch_size: {max_batch_size}")
    if plan.default_model_filename:
        lines.append(f"default_model_filename: {_quote(plan.default_model_filename)}")
    for section, tensors in (("input", inputs), ("output", outputs)):
        lines.append(f"{section} [")
        for i, tensor in enumerate(tensors):
            lines += [
                "  {",
                f"    name: {_quote(tensor.name)}",
                f"    data_type: {tensor.data_type}",
            ]
            if tensor.dims:
                lines.append(f"    dims: [ {', '.join(map(str, tensor.dims))} ]")
            else:  # a scalar: Triton wants one element and a reshape to no dimensions
                lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
            lines.append("  }" + ("," if i < len(tensors) - 1 else ""))
        lines.append("]")
    if max_batch_size > 0:
        lines.append("dynamic_batching { }")
    lines += ["instance_group [", "  {", "    count: 1", "    kind: KIND_CPU", "  }", "]"]
    if plan.graph_level is not None:
        lines.append(f"optimization {{ graph {{ level: {plan.graph_level} }} }}")
    for key, value in plan.parameters.items():
        lines.append(
            f"parameters {{ key: {_quote(key)} value {{ string_value: {_quote(value)} }} }}"
        )
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
