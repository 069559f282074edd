"""infertune: fast TensorFlow/Keras inference, chosen by measurement.

opt = infertune.optimize(model, sample_input)   # tries every backend that can run here
y = opt(x)                                      # same inputs, same output structure
print(opt.report)                               # what was tried, how fast, how exact
opt.save("tuned/")                              # infertune.load("tuned/") restores it
"""

from __future__ import annotations

from ._version import __version__ as __version__
from .api import available_backends, load, optimize
from .deploy.triton import TritonExport
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
from .report import BatchResult, CandidateResult, Diagnosis, Report

__all__ = [
    "ArtifactError",
    "BatchResult",
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
