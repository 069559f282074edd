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
graph, the SavedModel's serving signature), so they are the names Triton will find; for the
Python backend, from the saved manifest's input and output signatures. What a backend writes
and how Triton serves it is the backend's own business (`Backend.triton_plan`): a new
candidate that Triton serves brings its plan in its own file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..backends.base import Backend
from ..backends.registry import backend_class
from ..backends.triton_plan import TritonPlan, TritonTensor
from ..errors import ExportError, OptionError
from ..result.saved import MANIFEST, Saved, open_saved
from ..system.environment import install_hint
from ..system.paths import user_path

__all__ = ["PYTHON_RESULT_DIR", "TritonExport", "TritonTensor", "check_exportable", "export_saved"]

BACKENDS = (None, "python")  # None: the candidate's own Triton backend
PYTHON_RESULT_DIR = "infertune_result"  # the saved result, beside model.py
PYTHON_BATCH_SIZE = 32  # the Python backend's max_batch_size unless one is given


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


def check_exportable(cls: type[Backend], name: str, backend: str | None = None) -> None:
    """Raise ExportError, with the reason, for a candidate no Triton backend runs (every
    candidate runs in the Python backend); OptionError for an unknown `backend`."""
    if backend not in BACKENDS:
        raise OptionError(
            f"backend must be None (the candidate's own Triton backend) or 'python' (Triton's "
            f"Python backend, running infertune). Received: backend={backend!r}."
        )
    if backend == "python" or cls.__dict__.get("triton_serves", False):
        return
    reason = cls.triton_unsupported or f"no Triton backend is known for the {cls.name!r} candidate"
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
    result = open_saved(user_path(saved))
    general = result.general
    cls = backend_class(general["kind"])
    if cls is None:
        raise ExportError(
            f"Cannot export '{saved}': it was saved with the {general['name']} candidate, which "
            f"this infertune does not know."
        )
    check_exportable(cls, general["name"], backend)
    model_dir = user_path(repository) / name
    version_dir = model_dir / str(version)
    if version_dir.exists():
        raise ExportError(
            f"'{version_dir}' already exists. Choose another version (version=...), or remove it."
        )
    if backend == "python":
        plan = _python_plan(result)
    else:
        plan = cls.triton_plan(result.directory(general), general, result.inputs, result.outputs)
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
    plan.notes += _choice_notes(result.manifest["choice"], backend)
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


def _choice_notes(choice: dict, backend: str | None) -> list[str]:
    """What a Triton model of one artifact leaves out of the choice (the choice per batch
    size, the exact-shape path), or how the Python backend keeps it."""
    notes = []
    general = choice["general"]
    by_batch = choice.get("by_batch") or {}
    if len(set(by_batch.values())) > 1:
        choices = ", ".join(f"batch {n}: {chosen}" for n, chosen in by_batch.items())
        if backend == "python":
            notes.append(
                f"the result chose candidates by batch size ({choices}); the Python backend "
                f"runs the whole result, so each batch Triton forms goes to its own choice"
            )
        else:
            notes.append(
                f"the result chose candidates by batch size ({choices}); this repository holds "
                f"{general} (the choice at the sample's batch size) for every batch size, as a "
                f"Triton model runs one artifact; backend='python' serves the choice per batch "
                f"size"
            )
    exact = choice.get("exact_shape")
    if exact:
        shapes = ", ".join(str(tuple(shape)) for shape in exact["shapes"])
        if backend == "python":
            notes.append(
                f"the result serves the sample's exact shapes {shapes} with {exact['backend']} "
                f"(the exact-shape path: it runs no other shape); the Python backend runs the "
                f"whole result, so requests of exactly those shapes go to it"
            )
        else:
            notes.append(
                f"the result serves the sample's exact shapes {shapes} with {exact['backend']} "
                f"(the exact-shape path), which runs no other shape; this repository holds "
                f"{general} (the choice among candidates that run any shape) for every "
                f"request, as a Triton model runs one artifact; backend='python' keeps the "
                f"exact-shape path"
            )
    buckets = choice.get("buckets")
    if buckets:
        shapes = bucket_words(buckets)
        if backend == "python":
            notes.append(
                f"the result serves the traffic's lengths by buckets ({shapes}); the Python "
                f"backend runs the whole result, so each request is padded into its bucket "
                f"(the buckets are in config.pbtxt's `infertune_buckets` parameter)"
            )
        else:
            notes.append(
                f"the result serves the traffic's lengths by buckets ({shapes}); this "
                f"repository holds {general} for every length, as a Triton model runs one "
                f"artifact at the shapes it is sent; backend='python' keeps the buckets"
            )
    return notes


def bucket_words(buckets: dict) -> str:
    """The buckets of a saved choice in words: (low, upper] by candidate, padded or not."""
    words, low = [], 0
    for bucket in buckets["buckets"]:
        how = f"padded to {bucket['upper']}" if bucket["padded"] else "at its own length"
        words.append(f"({low}, {bucket['upper']}] {bucket['backend']} {how}")
        low = bucket["upper"]
    words.append(f"longer: {buckets['beyond']}")
    return "; ".join(words)


def _python_plan(result: Saved) -> TritonPlan:
    """Any candidate, run by infertune in Triton's Python backend: model.py imports
    `infertune.deploy.triton_python`, which loads the copy of the saved result beside it.
    The tensors are the saved input and output signatures'."""
    manifest = result.manifest
    specs = [*result.inputs.specs, *result.outputs.specs]
    tensors = [
        TritonTensor(s.name, s.dtype.name, tuple(-1 if d is None else d for d in s.shape))
        for s in specs
    ]
    inputs, outputs = tensors[: len(result.inputs.specs)], tensors[len(result.inputs.specs) :]

    def write(version_dir: Path) -> None:
        target = version_dir / PYTHON_RESULT_DIR
        for rel in [*manifest["files"], MANIFEST]:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(result.path / rel, target / rel)
        (version_dir / "model.py").write_text(_PYTHON_MODEL, encoding="utf-8")

    plan = TritonPlan("python", None, inputs, outputs, write)
    plan.names = {t.name: t.name for t in inputs + outputs}
    buckets = manifest["choice"].get("buckets")
    if buckets:  # the shapes each bucket's candidate takes, for whoever sizes the server
        plan.parameters["infertune_buckets"] = bucket_words(buckets)
    general = result.general
    plan.carried += [
        f"the {general['name']} candidate itself with its tuned settings (the saved result in "
        f"{PYTHON_RESULT_DIR}/, run by infertune)",
        "instance_group KIND_CPU",
    ]
    extra = (
        f" and its runtime ({install_hint(general['requires'])})" if general.get("requires") else ""
    )
    plan.notes.append(
        f"Triton's Python backend runs model.py in its own Python: install infertune{extra} "
        f"there (or a packed environment named by EXECUTION_ENV_PATH in config.pbtxt)"
    )
    return plan


_PYTHON_MODEL = f'''"""A Triton Python-backend model: infertune's export_triton(backend="python").

It serves the infertune result saved in {PYTHON_RESULT_DIR}/ beside this file, so the Python
that Triton's Python backend runs needs infertune and that result's runtime installed.
"""

from infertune.deploy.triton_python import TritonPythonModel  # noqa: F401
'''


# -- config.pbtxt -----------------------------------------------------------------------------
def _config_text(
    name: str,
    plan: TritonPlan,
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
