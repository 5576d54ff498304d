"""``Graph``: nodes in topological order, with lazy derived indexes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ir.errors import VerifyError
from ir.memo import memoized
from ir.node import OUTPUT, PLACEHOLDER, Node
from ir.slot_init import slot_init


@slot_init
@attrs.frozen(cache_hash=True)
class Graph:
    """An immutable SSA graph: ``nodes`` in topological order, the last one the ``output`` node.

    Indexes by name and users are built on first use (``ir.memo.memoized``) and never take part
    in equality.
    """

    nodes: tuple[Node, ...]

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> Graph:
        """Freeze an iterable of nodes (a pass's local builder list) into a Graph."""
        return cls(tuple(nodes))

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self):
        return iter(self.nodes)

    def by_name(self) -> Mapping[str, Node]:
        """``{name: node}`` for every node (built once)."""
        return self._by_name

    @memoized
    def _by_name(self) -> Mapping[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        """The node called ``name``; ``VerifyError`` naming it when absent."""
        try:
            return self.by_name()[name]
        except KeyError:
            raise VerifyError(f"graph has no node named {name!r}") from None

    def users(self) -> Mapping[str, tuple[str, ...]]:
        """``{name: names of the nodes that read it}``, users in graph order, without repeats."""
        return self._users

    @memoized
    def _users(self) -> Mapping[str, tuple[str, ...]]:
        lists: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for r in dict.fromkeys(n.inputs()):
                if r.name in lists:
                    lists[r.name].append(n.name)
        return {k: tuple(v) for k, v in lists.items()}

    @memoized
    def placeholders(self) -> tuple[Node, ...]:
        """The placeholder nodes, in order (built once)."""
        return tuple(n for n in self.nodes if n.op == PLACEHOLDER)

    @property
    def output_node(self) -> Node:
        """The final ``output`` node; ``VerifyError`` when the graph has none."""
        if not self.nodes or self.nodes[-1].op != OUTPUT:
            raise VerifyError("graph does not end with an output node")
        return self.nodes[-1]

    @property
    def outputs(self) -> Any:
        """The output node's returned tree (``output.args[0]``)."""
        args = self.output_node.args
        return args[0] if args else None

    def compute_count(self) -> int:
        """Number of nodes that compute (not placeholder, get_attr or output)."""
        return sum(1 for n in self.nodes if n.op not in (PLACEHOLDER, OUTPUT, "get_attr"))
