"""The candidate backends: one file each (a folder for a runtime that spans files: litert/,
onnxruntime/, openvino/, tensorrt/), and one line each in registry.py's FAMILIES.

`Backend` (base.py) is the extension point: subclass it to add a candidate. This package's
face names only it and the `Target` it is prepared on, so that a runtime's own modules (its
conversions among them) import without the registry, which imports every backend.
"""

from .base import Backend, Target

__all__ = ["Backend", "Target"]
