"""ONNX Runtime's IO binding on a GPU, planned as a value that needs no GPU: the inputs and
outputs a CUDA session binds per call, and whether a call may replay a CUDA graph
(`IoBindingPlan`, run by backends/onnxruntime/cuda.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...model.inputs import InputSignature

__all__ = ["IoBindingPlan", "iobinding_plan"]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class IoBindingPlan:
    """What an ONNX Runtime CUDA session binds per call.

    Inputs are copied to the GPU once per call (bind_cpu_input, or OrtValue.update_inplace
    into the buffers a CUDA graph was captured with), outputs are bound on the GPU and copied
    to the host explicitly: that copy is the synchronization point. A CUDA graph replays
    fixed device addresses and shapes, so it serves only calls with exactly the sample's
    shapes (`uses_graph`); every other shape goes through the plain session.
    """

    input_names: tuple[str, ...]
    input_dtypes: tuple[np.dtype, ...]
    input_shapes: tuple[Shape, ...]  # the sample's: the shapes a CUDA graph is captured at
    output_names: tuple[str, ...]
    cuda_graph: bool
    why_no_graph: str | None = field(default=None, compare=False)

    def uses_graph(self, shapes: Sequence[Sequence[int]]) -> bool:
        return self.cuda_graph and tuple(tuple(s) for s in shapes) == self.input_shapes


def iobinding_plan(
    signature: InputSignature,
    input_names: Sequence[str],
    output_names: Sequence[str],
    want_cuda_graph: bool,
) -> IoBindingPlan:
    """The binding for `signature`; a CUDA graph where asked for and the model qualifies
    (every input has a known shape in the sample and a dtype the GPU takes)."""
    if len(input_names) != len(signature.specs):
        raise ValueError(f"{len(input_names)} input names for {len(signature.specs)} inputs")
    why = None
    dtypes = tuple(np.dtype(spec.dtype) for spec in signature.specs)
    if not want_cuda_graph:
        why = "not asked for"
    elif any(dtype.kind not in "biuf" for dtype in dtypes):
        why = "an input is neither numeric nor boolean (strings stay on the host)"
    elif any(0 in shape for shape in signature.sample_shapes):
        why = "an input of the sample is empty"
    return IoBindingPlan(
        input_names=tuple(input_names),
        input_dtypes=dtypes,
        input_shapes=tuple(tuple(int(d) for d in s) for s in signature.sample_shapes),
        output_names=tuple(output_names),
        cuda_graph=want_cuda_graph and why is None,
        why_no_graph=why,
    )
