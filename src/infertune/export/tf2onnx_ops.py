"""Conversions tf2onnx lacks, registered with its op handler table on import.

Keras 3's exact GELU (`activation="gelu"`, the transformer default) lowers to TensorFlow's
Erfc op, which tf2onnx 1.17 does not convert ("Unsupported ops: Erfc"): without this, every
transformer with GELU loses all ONNX-based candidates.
"""

from __future__ import annotations

import numpy as np
from tf2onnx import utils
from tf2onnx.handler import tf_op

__all__ = ["Erfc"]


@tf_op("Erfc")
class Erfc:
    """erfc(x) = 1 - erf(x), with ONNX's Erf (opset 9 and later)."""

    @classmethod
    def version_9(cls, ctx, node, **kwargs):
        dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
        one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype=dtype))
        erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name, name="erf")
        output, shapes, dtypes = node.output[0], node.output_shapes, node.output_dtypes
        ctx.remove_node(node.name)
        ctx.make_node(
            "Sub", [one.output[0], erf.output[0]], outputs=[output], name=node.name,
            shapes=shapes, dtypes=dtypes,
        )  # fmt: skip
