"""The prepared problem every backend receives: model, input signature, outputs, shared work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .inputs import InputSignature
from .models import ModelSource
from .structure import Structure

__all__ = ["Target"]


@dataclass
class Target:
    """Everything a backend may use to prepare the model, the same for every candidate."""

    source: ModelSource
    signature: InputSignature
    output_structure: Structure
    output_dtypes: list[np.dtype]
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)

    def shared(self, key: str, build: Callable[[], Any]) -> Any:
        """Build a conversion once and share it (or its failure) between backends."""
        if key not in self._shared:
            try:
                self._shared[key] = (True, build())
            except Exception as exc:
                self._shared[key] = (False, exc)
        ok, value = self._shared[key]
        if not ok:
            raise value
        return value

    def shared_value(self, key: str) -> Any | None:
        """A shared conversion that was already built successfully, else None."""
        ok, value = self._shared.get(key, (False, None))
        return value if ok else None
