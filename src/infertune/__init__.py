"""infertune: fast TensorFlow/Keras inference, chosen by measurement.

opt = infertune.optimize(model, sample_input)   # tries every backend that can run here
y = opt(x)                                      # same inputs, same output structure
print(opt.report)                               # what was tried, how fast, how exact
opt.save("tuned/")                              # infertune.load("tuned/") restores it
"""

from __future__ import annotations

from ._version import __version__ as __version__
from .accuracy import Accuracy
from .api import available_backends, load, optimize, package
from .deploy.triton import TritonExport
from .errors import (
    ArtifactError,
    ClosedError,
    EnvironmentMismatchError,
    ExportError,
    InfertuneError,
    InputError,
    ModelError,
    OptionError,
)
from .explain import explain
from .optimized import Optimized
from .report import BatchResult, CandidateResult, Diagnosis, Report
from .system.quiet import quiet_tensorflow_logs

# Importing infertune imports no TensorFlow, so this comes before it does (system/quiet.py says
# why).
quiet_tensorflow_logs()

__all__ = [
    "Accuracy",
    "ArtifactError",
    "BatchResult",
    "CandidateResult",
    "ClosedError",
    "Diagnosis",
    "EnvironmentMismatchError",
    "ExportError",
    "InfertuneError",
    "InputError",
    "ModelError",
    "Optimized",
    "OptionError",
    "Report",
    "TritonExport",
    "available_backends",
    "explain",
    "load",
    "optimize",
    "package",
]
