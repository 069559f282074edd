"""TensorRT's optimization profile and engine cache key, planned as values that need no GPU:
the min/opt/max shapes of the one profile an engine is built for (`profile_shapes`), and the
key a built engine is kept under (`engine_cache_key`). Both TensorRT candidates use them: the
tensorrt package's engines (backends/tensorrt/engine.py) and ONNX Runtime's TensorRT
execution provider (backends/onnxruntime/cuda.py), which builds TensorRT engines too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...model.inputs import InputSignature

__all__ = [
    "PROFILE_MAX_BATCH",
    "Profile",
    "default_batch_sizes",
    "engine_cache_key",
    "exact_shapes_of",
    "profile_shapes",
]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """A TensorRT optimization profile: (min, opt, max) shape per input name, in input order."""

    shapes: tuple[tuple[str, Shape, Shape, Shape], ...]

    def covers(self, name: str, shape: Sequence[int]) -> bool:
        for input_name, low, _, high in self.shapes:
            if input_name == name:
                return len(shape) == len(low) and all(
                    lo <= s <= hi for lo, s, hi in zip(low, shape, high)
                )
        return False

    def covers_all(self, shapes: Sequence[Sequence[int]]) -> bool:
        """Whether every input's shape (in input order) is within the profile."""
        return all(self.covers(entry[0], shape) for entry, shape in zip(self.shapes, shapes))

    def at_shapes(self, shapes: Sequence[Sequence[int]]) -> Profile:
        """This profile's batch range with every other dimension fixed at `shapes`' (one per
        input, in input order): a bucket's engine, built for the length its requests are
        padded to (optimize(traffic=...)), which TensorRT tunes its kernels for as it does
        for the sample's. The batch's opt stays this profile's, so that the same bucket
        names the same engine whatever batch its first call has (engine_cache_key)."""
        if len(shapes) != len(self.shapes):
            raise ValueError(f"{len(shapes)} shapes for a profile of {len(self.shapes)} inputs")
        fixed = []
        for (name, low, opt, high), shape in zip(self.shapes, shapes):
            shape = tuple(int(d) for d in shape)
            if len(shape) != len(opt):
                raise ValueError(f"input {name} has rank {len(opt)}; received shape {shape}")
            if shape and low[0] != high[0]:  # a free batch: its range kept
                rest = shape[1:]
                fixed.append((name, (low[0], *rest), (opt[0], *rest), (high[0], *rest)))
            else:
                fixed.append((name, shape, shape, shape))
        return Profile(tuple(fixed))

    def ort_options(self) -> dict[str, str]:
        """The TensorRT EP options trt_profile_{min,opt,max}_shapes ("in_0:1x3x224x224,...")."""
        options = {}
        for which, index in (("min", 1), ("opt", 2), ("max", 3)):
            options[f"trt_profile_{which}_shapes"] = ",".join(
                f"{entry[0]}:{'x'.join(map(str, entry[index]))}" for entry in self.shapes
            )
        return options

    def to_json(self) -> list:
        return [[name, list(lo), list(opt), list(hi)] for name, lo, opt, hi in self.shapes]

    @classmethod
    def from_json(cls, data: list) -> Profile:
        return cls(tuple((n, tuple(lo), tuple(opt), tuple(hi)) for n, lo, opt, hi in data))


# The largest batch a TensorRT engine is built for unless the sample's is larger: calls with a
# free batch dimension may use any batch up to it. Larger batches need a larger profile.
PROFILE_MAX_BATCH = 64


def default_batch_sizes(signature: InputSignature) -> tuple[int, ...]:
    """The batch sizes a profile covers by default: the sample's and PROFILE_MAX_BATCH."""
    sample = signature.sample_batch
    return (PROFILE_MAX_BATCH,) if sample is None else (sample, max(sample, PROFILE_MAX_BATCH))


def profile_shapes(
    signature: InputSignature, batch_sizes: Iterable[int] = (), names: Sequence[str] | None = None
) -> Profile:
    """The profile for the shapes in use: opt is the sample's shape (what TensorRT tunes its
    kernels for), min has batch 1, max the largest of the sample's batch and `batch_sizes`.

    Only a free batch dimension (None in the signature) varies; every other dimension is the
    sample's in all three. `names` are the engine's input names (default: the signature's
    ONNX names in_0, in_1, ...).
    """
    names = list(names) if names is not None else [f"in_{i}" for i in range(len(signature.specs))]
    if len(names) != len(signature.specs):
        raise ValueError(f"{len(names)} input names for {len(signature.specs)} inputs: {names}")
    sizes = [int(b) for b in batch_sizes]
    if any(b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be positive. Received: {sizes}.")
    shapes = []
    for name, spec, sample in zip(names, signature.specs, signature.sample_shapes):
        opt = tuple(int(d) for d in sample)
        if spec.shape and spec.shape[0] is None and opt:
            low = (1, *opt[1:])
            high = (max([opt[0], *sizes]), *opt[1:])
        else:
            low = high = opt
        shapes.append((name, low, opt, high))
    return Profile(tuple(shapes))


def exact_shapes_of(signature: InputSignature) -> tuple[list[tuple[int, ...]] | None, str]:
    """What Backend.exact_shapes and exact_reason are for an engine of `profile_shapes`: the
    sample's shapes where the model has a free dimension besides the batch (which the profile
    fixes at the sample's: the engine runs no other length, and the callable sends other
    shapes to the general choice), else None (any batch size up to the profile's bound)."""
    if signature.other_sizes(1) is None:
        return None, ""
    return signature.concrete_shapes(), (
        "its optimization profile fixes the free dimensions besides the batch at the "
        "sample's sizes; optimize(traffic=...) builds an engine for each bucket's length"
    )


def engine_cache_key(
    model_bytes: bytes | str, precision: str, profile: Profile, trt_version: str, gpu_name: str
) -> str:
    """A stable hex digest naming a built engine: the same ONNX model, precision, profile,
    TensorRT version and GPU give the same engine; anything else must build anew (an engine
    is specific to the GPU model and the TensorRT version that built it). `model_bytes` may
    be the path of a model.onnx whose weights are external data beside it (both hashed)."""
    digest = hashlib.sha256()
    if isinstance(model_bytes, str):
        model = hashlib.sha256()
        for file in sorted(Path(model_bytes).parent.glob("model.onnx*")):
            with open(file, "rb") as f:
                for block in iter(lambda f=f: f.read(1 << 24), b""):
                    model.update(block)
        digest.update(model.digest())
    else:
        digest.update(hashlib.sha256(model_bytes).digest())
    settings = {
        "precision": precision,
        "profile": profile.to_json(),
        "tensorrt": trt_version,
        "gpu": gpu_name,
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:32]
