"""A picklable form of fx graphs, so that lowered modules pickle and ``torch.save``.

Operator overloads (bound C++ objects) are stored by qualified name and looked up again; every
other target and argument is stored as it is. Node meta is kept where it pickles (stack traces,
module stacks) and dropped where it does not (fake tensors).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.fx

from ir import ops


class _Op:
    """An operator overload or packet, or a higher-order operator, by name."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name

    def resolve(self) -> Any:
        if self.kind == "hop":
            return getattr(torch.ops.higher_order, self.name)
        namespace, rest = self.name.split("::", 1)
        packet_name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace), packet_name)
        return packet if self.kind == "packet" else getattr(packet, overload or "default")


class _NodeRef:
    def __init__(self, name: str) -> None:
        self.name = name


def _encode_target(target: Any) -> Any:
    found = ops.facts(target)
    if found.kind in (ops.OVERLOAD, ops.PACKET, ops.HOP):
        return _Op(found.kind, found.qualname)
    return target


def _decode_target(target: Any) -> Any:
    return target.resolve() if isinstance(target, _Op) else target


def _picklable_meta(meta: dict) -> dict:
    kept = {}
    for key, value in meta.items():
        try:
            pickle.dumps(value, protocol=2)  # the protocol torch.save uses
        except Exception:  # noqa: BLE001, S112 (meta that cannot be pickled is left out)
            continue
        kept[key] = value
    return kept


def encode_graph(graph: torch.fx.Graph) -> list[tuple]:
    """``graph`` as a list of plain tuples that pickle."""
    nodes = []
    for node in graph.nodes:
        args = torch.fx.node.map_arg(node.args, lambda n: _NodeRef(n.name))
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: _NodeRef(n.name))
        args = _encode_tree(args)
        kwargs = _encode_tree(kwargs)
        nodes.append((node.op, node.name, _encode_target(node.target), args, kwargs, _picklable_meta(node.meta)))
    return nodes


def _encode_tree(tree: Any) -> Any:
    if isinstance(tree, (tuple, list)):
        return type(tree)(_encode_tree(x) for x in tree) if type(tree) in (tuple, list) else tuple(_encode_tree(x) for x in tree)
    if isinstance(tree, dict):
        return {k: _encode_tree(v) for k, v in tree.items()}
    return _encode_target(tree)


def decode_graph(nodes: list[tuple]) -> torch.fx.Graph:
    """Rebuild the fx graph ``encode_graph`` described."""
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}

    def decode(tree: Any) -> Any:
        if isinstance(tree, _NodeRef):
            return env[tree.name]
        if type(tree) in (tuple, list):
            return type(tree)(decode(x) for x in tree)
        if isinstance(tree, dict):
            return {k: decode(v) for k, v in tree.items()}
        return _decode_target(tree)

    for op, name, target, args, kwargs, meta in nodes:
        if op == "output":
            made = graph.output(decode(args[0]))
        else:
            made = graph.create_node(op, _decode_target(target), decode(args), decode(kwargs), name=name)
        made.meta = meta
        env[name] = made
    return graph
