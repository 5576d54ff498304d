"""``Graph``: nodes in topological order, with lazy derived indexes."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import attrs

from ir.errors import VerifyError
from ir.node import OUTPUT, PLACEHOLDER, Node


@attrs.frozen(cache_hash=True)
class Graph:
    """An immutable SSA graph: ``nodes`` in topological order, the last one the ``output`` node.

    Indexes by name and users are built on first use and never take part in equality.
    """

    nodes: tuple[Node, ...]
    _index: dict = attrs.field(factory=dict, init=False, eq=False, repr=False)

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
        found = self._index.get("by_name")
        if found is None:
            found = {n.name: n for n in self.nodes}
            self._index["by_name"] = found
        return found

    def node(self, name: str) -> Node:
        """The node called ``name``; ``VerifyError`` naming it when absent."""
        try:
            return self.by_name()[name]
        except KeyError:
            raise VerifyError(f"graph has no node named {name!r}") from None

    def users(self) -> Mapping[str, tuple[str, ...]]:
        """``{name: names of the nodes that read it}``, users in graph order, without repeats."""
        found = self._index.get("users")
        if found is None:
            lists: dict[str, list[str]] = {n.name: [] for n in self.nodes}
            for n in self.nodes:
                for r in dict.fromkeys(n.inputs()):
                    if r.name in lists:
                        lists[r.name].append(n.name)
            found = {k: tuple(v) for k, v in lists.items()}
            self._index["users"] = found
        return found

    @property
    def placeholders(self) -> tuple[Node, ...]:
        """The placeholder nodes, in order (built once)."""
        found = self._index.get("placeholders")
        if found is None:
            found = tuple(n for n in self.nodes if n.op == PLACEHOLDER)
            self._index["placeholders"] = found
        return found

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
