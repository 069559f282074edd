"""infertune: fast TensorFlow/Keras inference, chosen by measurement.

opt = infertune.optimize(model, sample_input)   # tries every backend that can run here
y = opt(x)                                      # same inputs, same output structure
print(opt.report)                               # what was tried, how fast, how exact
"""

from __future__ import annotations

from .api import available_backends, explain, optimize
from .diagnosis import Diagnosis
from .errors import InfertuneError, InputError, ModelError, OptionError
from .optimized import Optimized
from .report import CandidateResult, Report

__all__ = [
    "CandidateResult",
    "Diagnosis",
    "InfertuneError",
    "InputError",
    "ModelError",
    "Optimized",
    "OptionError",
    "Report",
    "available_backends",
    "explain",
    "optimize",
]

__version__ = "0.1.0"
