"""What keeps TensorFlow's start-up log lines and the runtimes' banners from a user who did
not ask for them: on a CPU machine TensorFlow prints oneDNN and CUDA notices (twice) and an
error-level "failed call to cuInit", and LiteRT "INFO: Created TensorFlow Lite XNNPACK
delegate for CPU.", none of which says anything about the user's model.

A user who sets TF_CPP_MIN_LOG_LEVEL (any value) gets TensorFlow's logging as they set it:
`TF_CPP_MIN_LOG_LEVEL=0` shows everything again (docs/faq.md).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = [
    "import_tensorflow",
    "quiet_tensorflow_logs",
    "stderr_without",
    "stdout_silenced",
    "without_xnnpack_banner",
]

_T = TypeVar("_T")

# One redirection of the process's stdout or stderr at a time: each saves what it finds and
# puts it back at the end, so two in threads at once would each put back the other's (a
# quantizer's stdout left on a StringIO for good, every print after it lost).
_OUTPUT_LOCK = threading.RLock()

# TensorFlow's lines before absl's logging is initialized (TF_CPP_MIN_LOG_LEVEL does not reach
# them): absl's notice, oneDNN's, the CUDA stub's, the CPU feature guard's.
_TF_START = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    rb"STDERR|[IW]\d{4} [\d:. ]+ +\d+ (port|cudart_stub|cpu_feature_guard)\.cc:\d+\] .*|To "
    rb"enable the following instructions: .*)\n",
    re.MULTILINE,
)
_quieted = False  # whether quiet_tensorflow_logs() set TF_CPP_MIN_LOG_LEVEL (not the user)


# LiteRT's line on stderr when an interpreter first applies XNNPACK in a process; no setting
# turns it off. Filtered from the first such interpreter of the process, whoever makes it (a
# LiteRT candidate's session, the TFLite range pass).
_XNNPACK_BANNER = re.compile(rb"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.\n", re.M)
_banner_lock = threading.Lock()
_banner_said = False


def quiet_tensorflow_logs() -> None:
    """TF_CPP_MIN_LOG_LEVEL=3 (TensorFlow's C++ logging: its errors too; its Python
    exceptions still say what went wrong) unless the user set it, and only before TensorFlow
    is imported: TensorFlow reads it once."""
    global _quieted
    if "tensorflow" not in sys.modules and "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        _quieted = True


def import_tensorflow():
    """`import tensorflow`, without its start-up lines where infertune made it quiet."""
    if "tensorflow" in sys.modules or not _quieted:
        return importlib.import_module("tensorflow")
    with stderr_without(_TF_START):
        return importlib.import_module("tensorflow")


@contextlib.contextmanager
def stderr_without(unwanted: re.Pattern[bytes]) -> Iterator[None]:
    """Capture what native code and Python write to file descriptor 2 meanwhile, and write it
    back afterwards without the lines `unwanted` matches (what no setting turns off):
    nothing else is lost, only written a moment later."""
    with _OUTPUT_LOCK, tempfile.TemporaryFile() as capture:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            data = unwanted.sub(b"", capture.read())
            if data:
                os.write(2, data)


@contextlib.contextmanager
def stdout_silenced() -> Iterator[None]:
    """What Python code prints to sys.stdout meanwhile, dropped (a quantizer's calibration
    progress, NNCF's progress bar): one redirection at a time in the process."""
    with _OUTPUT_LOCK, contextlib.redirect_stdout(io.StringIO()):
        yield


def without_xnnpack_banner(open_interpreter: Callable[[], _T]) -> _T:
    """open_interpreter() (an interpreter made and allocated: XNNPACK is applied then), the
    process's first with stderr filtered of LiteRT's banner; later ones as they are."""
    global _banner_said
    if _banner_said:
        return open_interpreter()
    with _banner_lock:
        if _banner_said:
            return open_interpreter()
        with stderr_without(_XNNPACK_BANNER):
            made = open_interpreter()
        _banner_said = True
        return made
