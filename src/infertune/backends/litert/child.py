"""A large model's TFLite conversion in a process of its own.

`python -m infertune.backends.litert.child SAVED_MODEL FLATBUFFER` converts the SavedModel
this process wrote (convert_saved_model, which the in-process path calls too),
writes the flatbuffer and exits: 0 with its peak resident memory on the last line of stdout,
1 with the error in error.txt beside the flatbuffer.

Why a child: in this process TensorFlow's allocators keep what the converter used. oneDNN's
allocator pools the restored variables and never returns them (0.9x the weights, held to the
end of the process: 2.2 GB after a 2.42 GB MLP's tuning), and each of the converter's threads
allocates in a glibc arena of its own (on a BERT-base-sized model the conversion peaked at
4.2-5.0x the weights in a worker thread). The child starts with one arena (MALLOC_ARENA_MAX,
read when a process starts) and the system allocator for oneDNN
(TF_ONEDNN_USE_SYSTEM_ALLOCATOR): 3.4x, all of it gone when it exits.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import one_line
from ...system.children import (
    ChildTimeout,
    run_module,
)
from ...system.resources import (
    LEAN_ALLOCATORS,
    high_water_mark,
    note_child_peak,
)

__all__ = ["LEAN_ENVIRONMENT", "convert_in_child", "convert_saved_model"]

# The child's allocators: one glibc arena, and the system allocator under oneDNN.
LEAN_ENVIRONMENT = {**LEAN_ALLOCATORS, "TF_CPP_MIN_LOG_LEVEL": "2"}

ERROR_FILE = "error.txt"
# The longest a conversion in the child may take before it is killed: the 2.46 GB
# recommender's whole tuning took 71 s on two cores; an hour means it hangs.
CONVERSION_TIMEOUT_S = 3600.0


def convert_in_child(saved_model: str, destination: Path) -> None:
    """Write the TFLite conversion of `saved_model` to `destination` from a child process;
    its peak goes into this process's accounts (resources.note_child_peak). Raises
    RuntimeError with the converter's own message where it fails."""
    try:
        done = run_module(
            __name__,
            saved_model,
            str(destination),
            timeout_s=CONVERSION_TIMEOUT_S,
            env=LEAN_ENVIRONMENT,
        )
    except ChildTimeout as exc:
        raise RuntimeError(f"the TFLite conversion in a child process failed: {exc}") from None
    error = destination.parent / ERROR_FILE
    if done.returncode != 0 or not destination.is_file():
        why = error.read_text().strip() if error.is_file() else _tail(done.stderr)
        raise RuntimeError(
            f"the TFLite conversion in a child process failed (exit status "
            f"{done.returncode}): {why}"
        )
    lines = done.stdout.split()
    if lines and lines[-1].isdigit():
        note_child_peak(int(lines[-1]))


def convert_saved_model(directory: str, destination: Path) -> None:
    """Write the SavedModel in `directory` as a TFLite flatbuffer to `destination` (what the
    child does, and this process below sizes.CHILD_CONVERSION_MIN_BYTES): float32, builtin ops
    only, the weights stored after the flatbuffer (past 2 GB it could not hold them)."""
    import tensorflow as tf

    converter, convert = _saved_model_converter(directory)
    if not hasattr(converter, "_experimental_use_buffer_offset"):
        raise RuntimeError(
            "this TFLite converter cannot store weights outside the flatbuffer, which stops at 2 GB"
        )
    converter._experimental_use_buffer_offset = True
    converter.exclude_conversion_metadata = True
    converter.optimizations = []
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    destination.write_bytes(convert())


def _saved_model_converter(directory: str) -> tuple[Any, Callable[[], bytes]]:
    """The converter of the SavedModel in `directory`, and the call that converts it without
    the two Python loads of the whole SavedModel TensorFlow's own path makes:
    `from_saved_model` loads it (variables and all) to list its signatures, and `convert()`
    loads it again for the stack traces of its error messages, before the C++ converter
    reads the variables once more. Their memory goes back to the heap, not always to the
    C++ converter: on a BERT-base-sized model (0.44 GB), with the heap trimmed after the
    SavedModel was written, the conversion's high-water mark was 5.1-5.4x the weights above
    what the process held, and 4.0-4.2x without the loads; where the C++ converter reused
    what they freed it was 4.1x either way (the C++ converter's own share), 1-1.5 s faster
    without them. The model's outputs are bit for bit the same (the flatbuffer orders its
    buffers differently from one run to the next either way). The signature is the one
    `tf.saved_model.save` wrote (serving_default). Where TensorFlow's private names moved,
    its own path converts: the same result, with the larger peak (tests/test_large.py fails
    on the pinned versions if that happens)."""
    import tensorflow as tf

    tags = {tf.saved_model.SERVING}
    try:
        from tensorflow.lite.python.lite import TFLiteSavedModelConverterV2

        converter = TFLiteSavedModelConverterV2(directory, tags, ["serving_default"])
        load, from_graph = converter._load_saved_model, converter._convert_from_saved_model
    except (ImportError, AttributeError, TypeError):
        converter = None
    if converter is None or converter.saved_model_dir is None:  # not its SavedModel path
        converter = tf.lite.TFLiteConverter.from_saved_model(directory)
        return converter, converter.convert

    def convert() -> bytes:
        graph_def, _, _ = load(directory, tags)  # the graph alone, no variables
        return from_graph(graph_def)

    return converter, convert


def _tail(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text[-limit:] if text else "no output"


def main() -> None:
    saved_model, destination = sys.argv[1], Path(sys.argv[2])
    try:
        convert_saved_model(saved_model, destination)
    except Exception as exc:
        (destination.parent / ERROR_FILE).write_text(one_line(exc))
        sys.exit(1)
    print(high_water_mark() or "")


if __name__ == "__main__":
    main()
