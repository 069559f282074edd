"""A model split in two (model/splitting.py): its preprocessing head as a TensorFlow graph, then its
body on another candidate's runtime. One candidate like any other: verified end to end
against the whole model, measured as a whole (the head's time included), selected only where
the chain wins.

`TfHeadChain(body_backend, split)` is named `tf-head+<body's name>`; its body backend gets
a Target of its own for the body model (shared by every chain, so the body's ONNX export and
TFLite conversion are made once). Where its candidate is rehearsed in a child process
(pipeline/isolation.py), the child rehearses the body alone, on the head's outputs for the
verification inputs (the head runs here: the child has no TensorFlow). Saved, a chain is
the head's SavedModel beside the body's own artifact; loading it needs TensorFlow, for the
head.

`TensorFlowOnly(backend, why)` stands for a converting candidate where the model takes
strings that no converter runs and cannot be split: it is skipped with that reason, before
any conversion is tried.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..model.inputs import InputSignature
from ..model.splitting import Split
from .base import Backend, NotApplicable, Target
from .tf_function import load_flat_savedmodel, save_flat_savedmodel, tensorflow_missing

__all__ = ["HEAD_DIR", "TensorFlowOnly", "TfHeadChain"]

HEAD_DIR = "head.savedmodel"
BODY_DIR = "body"
_BODY_TARGET = "split body"  # the Target key of the body's own Target


class TfHeadChain(Backend):
    """The model's head (preprocessing layers) as a tf.function, then its body on `body`."""

    name = "tf-head"
    runtime_packages = ("tensorflow",)
    triton_unsupported = (
        "a split model runs its TensorFlow head then its body on another runtime, which no "
        "one Triton backend does: export_triton(..., backend='python') serves it"
    )
    # The registry's lookup of a backend class by its manifest kind, for loading the body:
    # given by backends/__init__ (which imports this module), so that no import goes back up.
    body_class: ClassVar[Callable[[str], type[Backend] | None]]

    def __init__(self, body: Backend | None = None, split: Split | None = None):
        self.body = body
        self.split = split
        self._head = None  # its concrete function: what each call runs
        self._head_function = None  # the tf.function, which save_artifact writes
        self._head_owner = None
        self._body_signature: InputSignature | None = None
        if body is not None:
            self.name = f"tf-head+{body.name}"
            self.precision = body.precision
            self.precision_note = body.precision_note
            self.cooldown_s = body.cooldown_s
            self.callers_only = body.callers_only
            # No shared conversion of the whole model: the body's are built on the body's
            # own Target (a worker process making the whole model's would convert the part
            # no converter takes). Its cost, for the order and the budget, in traces: the
            # body's own, plus a share of the body's conversions (made once for all chains).
            self.conversions = ()
            self.relative_cost = body.relative_cost + 2.0

    def available(self) -> str | None:
        missing = tensorflow_missing()
        if missing is not None:
            return (
                f"its head (the model's preprocessing layers, split off because no converter "
                f"takes them) runs in TensorFlow: {missing}"
            )
        return self.body.available() if self.body is not None else None

    def _body_target(self, target: Target) -> Target:
        """The body's own Target, one for every chain of this run (its conversions shared)."""
        split = self.split
        return target.shared(
            _BODY_TARGET,
            lambda: Target(
                split.body,
                split.body_signature,
                target.output_structure,
                target.output_dtypes,
                target.objective,
                target.concurrency,
            ),
        )

    def convert(self, target: Target) -> None:
        """The body's conversion (where its candidate is rehearsed in the child process)."""
        self._body_signature = self.split.body_signature
        self.body.convert(self._body_target(target))
        self._take_exact_shapes(target)

    def rehearsed_part(self) -> Backend:
        return self.body

    def rehearsal(
        self, target: Target, inputs: list[list[np.ndarray]]
    ) -> tuple[Backend, Target, list[list[np.ndarray]]]:
        """The body rehearsed in the child on the head's outputs for the verification inputs
        (the head runs here: the child has no TensorFlow)."""
        head = self.split.head_function.get_concrete_function()
        middle = [[tensor.numpy() for tensor in head(*call)] for call in inputs]
        return self.body, self._body_target(target), middle

    def prepare(self, target: Target) -> None:
        split = self.split
        body_target = self._body_target(target)
        self._head_function, self._head_owner = split.head_function, split.head
        # Called as its concrete function: 0.1 ms a call less than through the tf.function's
        # dispatch (0.2 against 0.3 ms for the tabular model's head), with the same graph.
        self._head = split.head_function.get_concrete_function()
        self._body_signature = split.body_signature
        self.body.prepare(body_target)
        self._take_exact_shapes(target)
        self.split = None  # the body's Keras model and its sample's signature: not needed now

    def _take_exact_shapes(self, target: Target) -> None:
        """Where the body runs only its sample's shapes, the chain runs only the model's."""
        if self.body.exact_shapes is None:
            return
        if any(None in spec.shape[1:] for spec in self._body_signature.specs):
            raise NotApplicable(
                f"its body runs only the shapes {self.body.exact_shapes} "
                f"({self.body.exact_reason}), while the head's output shape varies with "
                f"the input's values"
            )
        self.exact_shapes = target.signature.concrete_shapes()
        self.exact_reason = f"its body: {self.body.exact_reason}"

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self.body.run([tensor.numpy() for tensor in self._head(*inputs)])

    def trim(self) -> None:
        self.body.trim()

    def close(self) -> None:
        if self.body is not None:
            self.body.close()
        self._head = self._head_function = self._head_owner = None

    def save_artifact(self, directory: Path) -> dict:
        """The head as a SavedModel of its flat tf.function (its lookup tables and vocabularies
        inside), the body's own artifact in `body/`."""
        save_flat_savedmodel(self._head_function, self._head_owner, directory / HEAD_DIR)
        (directory / BODY_DIR).mkdir()
        settings = self.body.save_artifact(directory / BODY_DIR)
        return {
            "head": HEAD_DIR,
            "body": {
                "dir": BODY_DIR,
                "name": self.body.name,
                "kind": type(self.body).name,
                "settings": settings,
            },
            "body_inputs": self._body_signature.to_dict(),
        }

    @classmethod
    def load_artifact(cls, directory: Path, settings: dict, target: Target) -> Backend:
        entry = settings["body"]
        body_cls = cls.body_class(entry["kind"])
        if body_cls is None:
            raise RuntimeError(f"its body's candidate {entry['name']} is unknown here")
        reason = body_cls().available()
        if reason is not None:
            raise RuntimeError(f"its body's candidate {entry['name']} cannot run here: {reason}")
        body_signature = InputSignature.from_dict(settings["body_inputs"])
        body_target = Target(
            None, body_signature, target.output_structure, target.output_dtypes, target.objective
        )
        body = body_cls.load_artifact(directory / entry["dir"], entry["settings"], body_target)
        body.name = entry["name"]
        chain = cls(body)
        loaded = load_flat_savedmodel(directory / settings["head"])
        chain._head_function, chain._head_owner = loaded.fn, loaded
        traced = loaded.fn.concrete_functions  # one: traced with its input signature
        chain._head = traced[0] if len(traced) == 1 else loaded.fn
        chain._body_signature = body_signature
        return chain


class TensorFlowOnly(Backend):
    """A converting candidate for a model whose string inputs only TensorFlow runs, where the
    model cannot be split: skipped with the reason, nothing converted."""

    name = "tensorflow-only"

    def __init__(self, backend: Backend, why: str):
        self.name = backend.name
        self.precision = backend.precision
        self.callers_only = backend.callers_only
        self._backend, self._why = backend, why

    def available(self) -> str | None:
        return self._backend.available()

    def prepare(self, target: Target) -> None:
        raise NotApplicable(self._why)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotApplicable(self._why)
