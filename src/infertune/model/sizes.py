"""A model's size and every byte threshold that decides something from it, in one place.

The weights' bytes (the variables the traced function captures: what every conversion
copies) decide which path a conversion takes and how carefully memory is handled. Each
threshold is named here once; `ModelSize` answers the questions the code asks of a size.

Two of them are settings (system/settings.py) that tests lower: `external_data_bytes()` and
`hold_all_bytes()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..system import settings

__all__ = [
    "CHILD_CONVERSION_MIN_BYTES",
    "FIXED_TFLITE_MAX_BYTES",
    "HUGE_CONSTANT_BYTES",
    "LEAN_CONVERSION_MIN_BYTES",
    "MEMORY_RESERVE_BYTES",
    "ModelSize",
    "WATCHED_MIN_BYTES",
    "WORKER_BASE_BYTES",
]

# Weights past which each shared conversion's memory is watched: its high-water mark is
# measured (for the machine's record) and the heap it freed is handed back at once. Below it
# the full garbage collection this needs would cost more time than the memory is worth.
WATCHED_MIN_BYTES = 64 << 20

# Weights past which the conversions take their large-model paths even below protobuf's
# 2 GiB: the ONNX export without grappler and with the weights as external data (a
# BERT-base-sized export peaked at 12.5x its weights through grappler, 4.1x on the lean
# path; every session then maps one data file instead of copying the bytes), and the TFLite
# conversion through a SavedModel (9.8x the weights from the concrete function, 5.4x from a
# SavedModel). 256 MB keeps the model zoo's convolutional networks (ResNet50: 100 MB) on the
# paths whose graphs were measured.
LEAN_CONVERSION_MIN_BYTES = 256 << 20

# Weights past which a TFLite conversion runs in a child process of its own
# (backends/litert/child.py): TensorFlow's allocators keep what the converter used in this
# process (oneDNN's pool, 0.9x the weights, to the end), and the child's TensorFlow costs
# 0.65 GB resident, less than the pool alone past 1 GiB.
CHILD_CONVERSION_MIN_BYTES = 1 << 30

# One constant past this many bytes goes to the ONNX data file before tf2onnx reads the graph,
# and tf2onnx gets its TensorProto pointing there: tf2onnx copies each constant into protobuf
# messages by serializing them, which stops at 2 GiB (a 2.46 GB embedding table failed with
# "EncodeError: Failed to serialize proto"), and makes four copies of it on the way.
HUGE_CONSTANT_BYTES = 1 << 30

# A free-dimension TFLite model past this many bytes gets no second conversion at the
# sample's exact shapes: it would double the conversion's time and memory to fold shape
# arithmetic whose share of a call shrinks as the model grows (backends/litert/backend.py).
FIXED_TFLITE_MAX_BYTES = 32 << 20

# What a TensorFlow worker process holds beside the model's copy and its conversion.
WORKER_BASE_BYTES = 1 << 30

# What optimize() needs beside the candidates: verification and measurement inputs and
# outputs, the runtimes' own code and arenas (pipeline/memory.py).
MEMORY_RESERVE_BYTES = 1 << 30


@dataclass(frozen=True)
class ModelSize:
    """The bytes of a model's weights, and what follows from them."""

    weights: int

    @property
    def past_protobuf(self) -> bool:
        """Whether one protobuf message cannot hold the weights (settings.external_data_bytes,
        1 GiB by default, below protobuf's 2 GiB with room for the graph): the ONNX export
        writes them as external data, the TFLite conversion after the flatbuffer."""
        return self.weights > settings.external_data_bytes()

    @property
    def lean(self) -> bool:
        """Whether the conversions take their large-model paths (LEAN_CONVERSION_MIN_BYTES,
        or past protobuf)."""
        return self.past_protobuf or self.weights > LEAN_CONVERSION_MIN_BYTES

    @property
    def tflite_in_child(self) -> bool:
        """Whether the TFLite conversion runs in a child process of its own."""
        return self.weights >= CHILD_CONVERSION_MIN_BYTES

    @property
    def watched(self) -> bool:
        """Whether each conversion's memory is measured and its freed heap handed back."""
        return self.weights > WATCHED_MIN_BYTES

    def gb(self) -> str:
        """The weights in GB, for a person: '2.42 GB'."""
        return f"{self.weights / 1e9:.2f} GB"
