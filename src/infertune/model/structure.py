"""Nested structures of tensors (a leaf, lists, tuples, dicts) flattened to a list and back.

infertune works on flat lists of arrays internally; a `Structure` remembers how to rebuild
the user's form (a model's input or output: tensor, list, tuple or dict). It is plain data,
so it can be written to JSON and read back without TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Structure", "flatten"]


@dataclass(frozen=True)
class Structure:
    """The shape of a nested container of leaves: `kind`, dict `keys`, and `children`."""

    kind: str
    keys: tuple = ()
    children: tuple[Structure, ...] = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(child.num_leaves for child in self.children)

    @property
    def is_flat(self) -> bool:
        return all(child.kind == "leaf" for child in self.children)

    def pack(self, leaves: Sequence) -> Any:
        """Rebuild the nested form from a flat sequence of leaves (inverse of `flatten`)."""
        if self.kind == "leaf":
            return leaves[0]
        if self.is_flat:
            if self.kind == "dict":
                return dict(zip(self.keys, leaves))
            return list(leaves) if self.kind == "list" else tuple(leaves)
        it = iter(leaves)
        return self._pack_from(it)

    def _pack_from(self, it) -> Any:
        if self.kind == "leaf":
            return next(it)
        values = [child._pack_from(it) for child in self.children]
        if self.kind == "dict":
            return dict(zip(self.keys, values))
        return values if self.kind == "list" else tuple(values)

    def packer(self) -> Callable[[Sequence], Any]:
        """A function that packs leaves, specialised for the common forms (hot path)."""
        if self.kind == "leaf":
            return _first
        if self.is_flat and self.kind == "dict":
            keys = self.keys
            return lambda leaves: dict(zip(keys, leaves))
        if self.is_flat and self.kind == "list":
            return list
        return self.pack

    def leaf_names(self, prefix: str = "") -> list[str]:
        """Readable names of the leaves: `x`, `input[0]`, dict keys, `a.b` when nested."""
        if self.kind == "leaf":
            return [prefix or "input"]
        names: list[str] = []
        for i, child in enumerate(self.children):
            if self.kind == "dict":
                key = str(self.keys[i])
                label = f"{prefix}.{key}" if prefix else key
            else:
                label = f"{prefix or 'input'}[{i}]"
            names.extend(child.leaf_names(label))
        return names

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "dict":
            out["keys"] = list(self.keys)
        if self.kind != "leaf":
            out["children"] = [child.to_dict() for child in self.children]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Structure:
        children = tuple(cls.from_dict(c) for c in data.get("children", ()))
        return cls(data["kind"], tuple(data.get("keys", ())), children)


def _first(leaves: Sequence) -> Any:
    return leaves[0]


def _sorted_keys(d: dict) -> list:
    try:
        return sorted(d)
    except TypeError:
        return list(d)


def flatten(obj: Any) -> tuple[list, Structure]:
    """Flatten lists, tuples and dicts (keys sorted, as tf.nest does) into leaves."""
    leaves: list = []
    structure = _flatten_into(obj, leaves)
    return leaves, structure


def _flatten_into(obj: Any, leaves: list) -> Structure:
    if isinstance(obj, dict):
        keys = _sorted_keys(obj)
        children = tuple(_flatten_into(obj[k], leaves) for k in keys)
        return Structure("dict", tuple(keys), children)
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        children = tuple(_flatten_into(item, leaves) for item in obj)
        return Structure(kind, (), children)
    leaves.append(obj)
    return Structure("leaf")
