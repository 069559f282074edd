"""tf2onnx's errors translated for the ONNX export: the nodes it failed to convert, read from
its log (it logs a failing op handler and goes on), and the ops it left unconverted in the
graph, named with where they are (their scope names the layer) and why, as the one error the
export raises with (export/onnx.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import one_line

__all__ = ["Tf2onnxErrors", "raise_on_unconverted"]


class Tf2onnxErrors(logging.Handler):
    """The nodes tf2onnx failed to convert, from its log: it logs a failing op handler and goes
    on (as `from_function` does), leaving the node half-converted in the graph.

    While it is attached, tf2onnx's logger has a handler, so Python no longer prints its
    errors to stderr: what matters of them becomes the reason the export raises with.
    """

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.failed_nodes: dict[str, str] = {}  # node name -> the handler's error
        self._thread = threading.get_ident()  # another optimize() may convert at the same time

    def emit(self, record: logging.LogRecord) -> None:
        # tf2onnx logs ("Failed to convert node %r (fct=%r)\n%r", name, handler, summary).
        failed = str(record.msg).startswith("Failed to convert node") and record.args
        if record.thread != self._thread or not failed:
            return
        exc = record.exc_info[1] if record.exc_info else None
        why = one_line(exc).split(": ", 1)[-1] if exc else "its handler failed"
        self.failed_nodes[str(record.args[0])] = why

    def __enter__(self) -> Tf2onnxErrors:
        logging.getLogger("tf2onnx").addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger("tf2onnx").removeHandler(self)


# Domains whose ops onnx.defs knows; tf2onnx also emits com.microsoft and ai.onnx.contrib ops
# on purpose (runtimes that lack them say so when loading the model).
_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def raise_on_unconverted(model_proto: Any, failed_nodes: dict[str, str]) -> None:
    """Raise, naming the ops and where they are, if tf2onnx left TensorFlow ops in the graph."""
    import onnx

    unknown: dict[str, list[str]] = {}  # op type -> node names
    for node in _all_nodes(model_proto.graph):
        if node.domain in _STANDARD_DOMAINS and not onnx.defs.has(node.op_type, node.domain):
            unknown.setdefault(node.op_type, []).append(node.name)
    if unknown:
        ops = ", ".join(
            f"{op} ({_nodes_text(names)}{_why(failed_nodes, names[0])})"
            for op, names in unknown.items()
        )
        kind = "op" if len(unknown) == 1 else "ops"
        raise RuntimeError(f"tf2onnx cannot convert the TensorFlow {kind} {ops}")
    if failed_nodes:
        node, error = next(iter(failed_nodes.items()))
        more = f" and {len(failed_nodes) - 1} more node(s)" if len(failed_nodes) > 1 else ""
        raise RuntimeError(f"tf2onnx failed to convert node {node}{more}: {error}")


def _why(failed_nodes: dict[str, str], node: str) -> str:
    """`: the error` of tf2onnx's handler where one failed on the node, else nothing."""
    return f": {failed_nodes[node]}" if node in failed_nodes else ""


def _nodes_text(names: list[str]) -> str:
    """`at scope/op`, or `3 nodes, first at scope/op`: the node's scope names the layer."""
    if len(names) == 1:
        return f"at {names[0]}"
    return f"{len(names)} nodes, first at {names[0]}"


def _all_nodes(graph: Any) -> Iterator[Any]:
    """Every node of an ONNX graph, with those of the subgraphs of If/Loop/Scan nodes."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _all_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_nodes(subgraph)
