"""infertune: fast TensorFlow/Keras inference, chosen by measurement.

opt = infertune.optimize(model, sample_input)   # tries every backend that can run here
y = opt(x)                                      # same inputs, same output structure
print(opt.report)                               # what was tried, how fast, how exact
opt.save("tuned/")                              # infertune.load("tuned/") restores it
"""

from __future__ import annotations

from .api import available_backends, optimize
from .diagnosis import Diagnosis
from .errors import (
    ArtifactError,
    EnvironmentMismatchError,
    ExportError,
    InfertuneError,
    InputError,
    ModelError,
    OptionError,
)
from .explain import explain
from .optimized import Optimized
from .report import CandidateResult, Report
from .saving import load
from .triton import TritonExport

__all__ = [
    "ArtifactError",
    "CandidateResult",
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
]

__version__ = "0.1.0"
