"""The process-wide patches the conversions make to other libraries, one at a time.

The ONNX export replaces functions of library modules for as long as a step of its runs:
TensorFlow's `tensor_util.make_tensor_proto` while it freezes the traced function (tf2onnx's
`convert_variables_to_constants_large_model` does so itself, and export/onnx_freeze.py
`_weights_apart` on top, to keep the weights apart), and tf2onnx's `tfonnx.resolve_functions`
and `tf_utils.tf_to_onnx_tensor` while it reads the graph. Each
saves the function it finds and puts it back at the end; two optimize() calls in threads
doing this at once would each put back the other's replacement, leaving it in place for
good (seen: tf2onnx's wrapper left in TensorFlow after two exports in threads,
tests/test_registry.py). `patched` holds one process-wide lock for the whole time a
replacement is in place, so patches are made one at a time (two exports in threads take turns
on that step, as they take turns on the interpreter lock anyway); `held()` holds it around a
library's own patching (tf2onnx's freezing).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["patched"]

_LOCK = threading.RLock()


@contextlib.contextmanager
def patched(owner: Any, replacements: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`owner`'s attributes replaced by `replacements` (name -> value) while the block runs,
    under the process-wide lock; yields the originals, by name. An RLock: a patch inside
    another's block (the same thread) nests."""
    with _LOCK:
        originals = {name: getattr(owner, name) for name in replacements}
        try:
            for name, value in replacements.items():
                setattr(owner, name, value)
            yield originals
        finally:
            for name, value in originals.items():
                setattr(owner, name, value)


def held() -> contextlib.AbstractContextManager:
    """The lock itself, for a step that makes several patches with `patched` in turn and must
    not let another thread's patches in between."""
    return _LOCK
