"""Counts for Triton's statistics extension (GET /v2/models/NAME/stats): requests, and the
batches of the model they ran in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .wire import VERSION

__all__ = ["InferenceStatistics"]


@dataclass
class InferenceStatistics:
    """Counts for Triton's statistics extension: requests, and the batches they ran in.

    `batch_stats` counts executions by batch size in samples (Triton's meaning): requests of
    one sample each that ran together show as one execution of batch size N.
    """

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    inference_count: int = 0  # samples
    execution_count: int = 0  # model runs
    batches: Counter = field(default_factory=Counter)  # samples per run -> runs
    batch_ns: Counter = field(default_factory=Counter)  # samples per run -> ns

    def record_request(self, ok: bool, ns: int) -> None:
        if ok:
            self.success_count += 1
            self.success_ns += ns
        else:
            self.fail_count += 1
            self.fail_ns += ns

    def record_execution(self, samples: int, ns: int) -> None:
        self.inference_count += samples
        self.execution_count += 1
        self.batches[samples] += 1
        self.batch_ns[samples] += ns

    def to_dict(self, name: str) -> dict:
        return {
            "model_stats": [
                {
                    "name": name,
                    "version": VERSION,
                    "inference_count": self.inference_count,
                    "execution_count": self.execution_count,
                    "inference_stats": {
                        "success": {"count": self.success_count, "ns": self.success_ns},
                        "fail": {"count": self.fail_count, "ns": self.fail_ns},
                    },
                    "batch_stats": [
                        {
                            "batch_size": size,
                            "compute_infer": {
                                "count": self.batches[size],
                                "ns": self.batch_ns[size],
                            },
                        }
                        for size in sorted(self.batches)
                    ],
                }
            ]
        }
