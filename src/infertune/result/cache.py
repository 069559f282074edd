"""The tuning cache: optimize(..., cache=DIR) reuses a result tuned before for the same thing.

An entry is a saved result (see saving.py) in DIR/KEY/, where KEY hashes everything that
decides the outcome of a tuning run:

- the model: for a Keras Sequential or functional model, its config (Keras' own JSON, with
  layer names replaced by their order, so that a model rebuilt in a notebook or a new
  process, dense_7 instead of dense, has the same key) and every weight array's bytes; for
  anything else (subclassed Keras models, tf.Module, tf.function, SavedModel), the graph
  traced for the input signature, canonicalized so that it is the same in every process,
  and the bytes of every variable that graph reads. Changed weights change the key;
- the input signature (names, dtypes, shapes, the sample's shapes, so its batch size), but
  not the sample's values;
- the options: backends, rtol, atol, objective, precision (not time_budget_s or verbose);
- the environment fingerprint (Python, CPU, GPUs, package versions, thread variables) and
  infertune's version.

An entry is a saved result when the chosen candidates can be saved. Where one cannot (yet),
the entry keeps the choice alone instead (decision.json: the choice in the manifest's format,
result/choice.py, and the report): a hit then prepares those candidates again from the model
(their conversion, not the measurement).

A hit is checked before it is returned: the result must reproduce the model's own outputs on
the sample within rtol/atol, else it is tuned again and the entry replaced. The cache is
never pruned: remove entries (directories) you no longer need.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..accuracy import judge_agreement
from ..backends.base import Backend
from ..backends.registry import BACKENDS
from ..errors import EnvironmentMismatchError, ExportError, one_line
from ..model.inputs import InputSignature
from ..model.outputs import OutputSignature
from ..model.source import (
    ModelSource,
    tensor_specs,
)
from ..model.target import Target
from ..model.tolerance import (
    Comparison,
    compare_outputs,
)
from ..options import Options
from ..report import Report
from ..report.progress import Progress
from ..system.environment import (
    collect_environment,
    fingerprint,
)
from .calling import warm_up
from .choice import Choice
from .saved import (
    FORMAT_VERSION,
    MANIFEST,
    REPORT,
    Saved,
    open_saved,
    restore,
    save,
)

__all__ = ["CacheEntry", "Hit", "model_fingerprint"]

# Attributes that differ between processes or runs without changing what a node computes.
_VOLATILE_ATTRS = ("config_proto", "config", "executor_type")
DECISION = "decision.json"  # an entry for a candidate that cannot be saved: what was chosen

# A hit: the choice, its report, and the saved result it was loaded from (None where it was
# prepared again from a decision).
Hit = tuple[Choice, Report, Saved | None]


class CacheEntry:
    """One key of the tuning cache: where its result lives, and how the key was made."""

    def __init__(
        self,
        directory: Path,
        source: ModelSource,
        signature: InputSignature,
        options: Options,
    ):
        """The options that decide the result (Options.saved(): tolerances, objective,
        precision, batch sizes, the requested `backends`) are part of the key."""
        inputs = signature.to_dict()
        for spec in inputs["inputs"]:  # the sample's values do not change the tuned result
            del spec["low"], spec["high"]
        self.options = options.saved()
        self.material = {
            "format_version": FORMAT_VERSION,
            "infertune": __version__,
            "model": model_fingerprint(source, signature),
            "inputs": inputs,
            "options": self.options,
            "environment": fingerprint(collect_environment()),
        }
        blob = json.dumps(self.material, sort_keys=True).encode()
        self.key = hashlib.sha256(blob).hexdigest()[:32]
        self.path = Path(directory) / self.key
        self.note: str | None = None  # why an existing entry was not used

    def load(
        self,
        source: ModelSource,
        signature: InputSignature,
        sample: list[np.ndarray],
        progress: Progress,
    ) -> Hit | None:
        """The cached result, checked against the model on the sample; None on a miss."""
        if (self.path / MANIFEST).is_file():
            how = "loaded"
        elif (self.path / DECISION).is_file():
            how = "prepared again from the model (the candidate cannot be saved yet)"
        else:
            return None
        start = time.perf_counter()
        reference, structure = source.call_flat(signature, sample)
        if self.options.get("reference") == "traced":  # what the result was verified against
            reference = Target(source, signature, structure, []).run_traced(sample)
        saved = None
        try:
            if how == "loaded":
                saved = open_saved(self.path)
                problem = saved.unavailable()  # the key holds the environment: it matched
                if problem:
                    raise EnvironmentMismatchError(problem)
                choice, report = restore(saved)
            else:
                choice, report = self._prepare_again(source, signature, structure, reference)
        except Exception as exc:  # an entry that cannot be used is a miss, said, never an error
            return self._miss(f"was not usable ({one_line(exc)})", progress)
        try:  # every candidate it runs (one per tuned batch size), on the sample
            found = Comparison(True, "")
            for backend in choice.backends:
                found = found.merged(self._reproduces(backend, sample, reference))
        except Exception as exc:  # a cached result that cannot run is a miss
            choice.close()
            return self._miss(f"did not run ({one_line(exc)})", progress)
        if not found:
            choice.close()
            return self._miss(f"did not reproduce the model ({found.reason})", progress)
        report.from_cache = True
        report.notes.append(
            f"from the tuning cache '{self.path}': {how} in {time.perf_counter() - start:.2f} s, "
            f"checked against the model on the sample (relative error {found.max_rel_err:.1e}); "
            f"tuned {_saved_at(self.path)} in {report.total_s:.1f} s"
        )
        report.notes.append(warm_up(choice))
        progress.say(f"tuning cache hit: {choice.selected.name} from {self.path}")
        return choice, report, saved

    def _reproduces(
        self, backend: Backend, sample: list[np.ndarray], reference: list[np.ndarray]
    ) -> Comparison:
        """A cached candidate's outputs on the sample against the model's: under rtol/atol,
        or for a reduced-precision one (which the float32 tolerance never judged) by the
        agreement rule (accuracy.py): its task was judged when it was tuned."""
        outputs = backend.run(sample)
        rtol, atol = self.options["rtol"], self.options["atol"]
        if backend.precision == "fp32":
            return compare_outputs(outputs, reference, rtol, atol)
        errors = compare_outputs(outputs, reference, math.inf, math.inf)
        if not errors:  # a structure, shape or NaN difference
            return errors
        agreed = judge_agreement([reference], [outputs])
        return Comparison(bool(agreed), agreed.reason, errors.max_abs_err, errors.max_rel_err)

    def _prepare_again(self, source, signature, structure, reference) -> tuple[Choice, Report]:
        """A decision-only entry: the chosen candidates, prepared again from the model."""
        decision = json.loads((self.path / DECISION).read_text(encoding="utf-8"))
        outputs = OutputSignature.from_dict(decision["outputs"])
        target = Target(source, signature, structure, outputs.dtypes, self.options["objective"])
        backends: dict[str, Backend] = {}
        for name in Choice.names(decision["choice"]):
            if name not in BACKENDS:
                raise KeyError(f"{name!r} is not a candidate of this infertune")
            backend = BACKENDS[name]()
            reason = backend.available()
            if reason is not None:
                raise EnvironmentMismatchError(f"{name} cannot run here: {reason}")
            backend.prepare(target)
            backends[name] = backend
        choice = Choice.from_dict(decision["choice"], backends.__getitem__, signature, outputs)
        return choice, Report.from_json(self.path / REPORT)

    def _miss(self, why: str, progress: Progress) -> None:
        self.note = f"the cached entry '{self.path}' {why}"
        progress.say(f"{self.note}; tuning again")
        return None

    def store(self, choice: Choice, report: Report, progress: Progress) -> None:
        """Save the result as this key's entry; a failure is a note in the report, never an
        error."""
        try:
            if self.path.exists():  # an entry that was not usable: replaced
                shutil.rmtree(self.path)
            if all(_can_be_saved(backend) for backend in choice.backends):
                save(choice, report, self.options, self.path, extra={"cache_key": self.material})
                what = "stored in the tuning cache"
            else:
                self._store_decision(choice, report)
                what = (
                    f"stored in the tuning cache as a decision ({choice.selected.name} cannot "
                    f"be saved yet: a hit prepares it again)"
                )
        except (ExportError, OSError) as exc:
            report.notes.append(f"not stored in the tuning cache: {one_line(exc)}")
            progress.say(f"not stored in the tuning cache: {one_line(exc)}")
            return
        if self.note:
            report.notes.append(self.note + "; tuned again")
        report.notes.append(f"{what}: '{self.path}'")

    def _store_decision(self, choice: Choice, report: Report) -> None:
        for backend in choice.backends:
            if backend.name not in BACKENDS:
                raise ExportError(
                    f"the selected candidate {backend.name!r} is not a registered infertune backend"
                )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.key}.", dir=self.path.parent))
        try:
            report.to_json(staging / REPORT)
            decision = {
                "choice": choice.to_dict(),
                "outputs": choice.outputs.to_dict(),
                "options": self.options,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "cache_key": self.material,
            }
            (staging / DECISION).write_text(json.dumps(decision, indent=2), encoding="utf-8")
            os.rename(staging, self.path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _can_be_saved(backend: Backend) -> bool:
    return type(backend).save_artifact is not Backend.save_artifact


def _saved_at(path: Path) -> str:
    for name in (MANIFEST, DECISION):
        try:
            return json.loads((path / name).read_text(encoding="utf-8")).get("saved_at", "?")
        except (OSError, ValueError):
            continue
    return "?"


# -- the model's fingerprint ------------------------------------------------------------------
def model_fingerprint(source: ModelSource, signature: InputSignature) -> str:
    """sha256 of what the model computes: its definition (Keras config, or the traced graph)
    and the bytes of its weights. The same in every process for the same model."""
    digest = hashlib.sha256()
    owner = source.owner
    if source.is_keras and _config_describes_graph(owner):
        config = _canonical_keras_config(json.loads(owner.to_json()))
        digest.update(b"keras config\0" + json.dumps(config, sort_keys=True).encode())
        variables = list(owner.weights)
    else:
        import tensorflow as tf

        function = tf.function(
            source.graph_function(signature), input_signature=tensor_specs(signature)
        )
        concrete = function.get_concrete_function()
        digest.update(b"graph\0" + graph_digest(concrete.graph.as_graph_def()))
        variables = list(concrete.variables)
    for variable in variables:
        array = np.asarray(variable)
        digest.update(f"\0{array.dtype.str}{array.shape}\0".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _canonical_keras_config(config: dict) -> dict:
    """A Keras model's JSON config without what does not change its outputs and differs
    between processes or notebook re-runs: the model's name, layer names (Keras numbers them,
    dense_3, by how many were made before in the process; renamed layer_0, layer_1, ... by
    order of appearance, references included), and the training-only compile config."""
    names: dict[str, str] = {}

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            for layer in node.get("layers") or ():
                inner = layer.get("config") if isinstance(layer, dict) else None
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    names.setdefault(inner["name"], f"layer_{len(names)}")
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    def rename(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: rename(value) for key, value in node.items()}
        if isinstance(node, list):
            return [rename(value) for value in node]
        return names.get(node, node) if isinstance(node, str) else node

    config.pop("compile_config", None)
    if isinstance(config.get("config"), dict):
        config["config"].pop("name", None)
    collect(config)
    return rename(config)


def _config_describes_graph(model: Any) -> bool:
    """True for Keras Sequential and functional models, whose config is their whole graph; a
    subclassed model's config says nothing about its call() code."""
    cls = type(model)
    return cls.__name__ in ("Sequential", "Functional") and cls.__module__.split(".")[0] in (
        "keras",
        "tf_keras",
    )


def graph_digest(graph_def: Any) -> bytes:
    """sha256 of a GraphDef, canonicalized so that the same model gives the same digest in
    every process: node names (captured variables are named by a per-process id) and function
    names (`__inference_flat_model_123`, a per-process counter) are replaced by their order of
    appearance; device strings and private or session-configuration attributes are dropped."""
    from tensorflow.core.framework import node_def_pb2

    library = {function.signature.name: function for function in graph_def.library.function}
    renamed: dict[str, str] = {}
    pending: list[str] = []
    digest = hashlib.sha256()

    def function_name(name: str) -> str:
        if name not in library:
            return name
        if name not in renamed:
            renamed[name] = f"function_{len(renamed)}"
            pending.append(name)
        return renamed[name]

    def add_nodes(nodes: Any) -> dict[str, str]:
        names = {node.name: f"node_{i}" for i, node in enumerate(nodes)}
        for original in nodes:
            node = node_def_pb2.NodeDef.FromString(original.SerializeToString())  # to edit
            node.name = names[node.name]
            node.op = function_name(node.op)
            node.device = ""
            node.ClearField("experimental_debug_info")
            inputs = [_renamed_input(name, names) for name in node.input]
            del node.input[:]
            node.input.extend(inputs)
            for key in list(node.attr):
                if key.startswith("_") or key in _VOLATILE_ATTRS:
                    del node.attr[key]
                    continue
                value = node.attr[key]
                if value.HasField("func"):
                    value.func.name = function_name(value.func.name)
                for function in value.list.func:
                    function.name = function_name(function.name)
            digest.update(node.SerializeToString(deterministic=True))
        return names

    add_nodes(graph_def.node)
    while pending:
        function = library[pending.pop(0)]
        signature = type(function.signature).FromString(function.signature.SerializeToString())
        signature.name = renamed[function.signature.name]
        digest.update(b"\0function\0" + signature.SerializeToString(deterministic=True))
        names = add_nodes(function.node_def)
        for key in sorted(function.ret):
            digest.update(f"\0{key}={_renamed_input(function.ret[key], names)}".encode())
    return digest.digest()


def _renamed_input(name: str, names: dict[str, str]) -> str:
    """A node input ("node", "node:1", "^node", "node:output:0") with the node renamed."""
    control = name.startswith("^")
    base, colon, rest = name.lstrip("^").partition(":")
    return ("^" if control else "") + names.get(base, base) + colon + rest
