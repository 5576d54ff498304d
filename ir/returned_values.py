"""The value a graph returns, read from its nodes' ``meta["val"]`` (fake tensors, sizes).

A pass that drops a graph a call was traced with (``deduplicate`` keeps one graph for calls at
several shapes) reads the dropped graph's output value here, so the call keeps the ``val`` of
*its* shapes. Nothing is run: values come from meta, through the container functions that
``outline`` puts around preserved calls (``getitem``, ``unflatten_tree``, ``flatten_by_spec``)
and through nested ``call_module`` nodes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ir import ops
from ir.args import Ref, thaw
from ir.graph import Graph
from ir.module import ModuleId, split_call_target
from ir.node import CALL_FUNCTION, CALL_MODULE, Node
from ir.program import Program
from ir.tree_calls import flatten_by_spec, unflatten_tree

_CONTAINERS = frozenset({operator.getitem, unflatten_tree, flatten_by_spec})


def output_value(program: Program, mid: ModuleId, graph: Graph) -> Any:
    """The tree ``graph`` (a graph of module ``mid`` in ``program``) returns, with each value
    read from its node's ``meta["val"]``, computed through container functions and nested calls
    where a node has none; an unknown value is ``None``.

    **Laws:** for a graph whose output nodes carry ``val``, equals the tree of those vals; never
    runs an operator. O(nodes of ``graph`` and of the graphs it calls, each once).
    """
    return _output(program, mid, graph, {})


def _output(program: Program, mid: ModuleId, graph: Graph, memo: dict) -> Any:
    return graph_value(graph, lambda node, value: _call(program, mid, node.target, memo))


def graph_value(graph: Graph, call: Callable[[Node, Callable[[Ref], Any]], Any]) -> Any:
    """The tree ``graph`` returns, each value read from its node's ``meta["val"]``, computed
    where a node has none: a container function (``getitem``, ``unflatten_tree``,
    ``flatten_by_spec``) run on its arguments' values, a ``call_module`` node's value
    ``call(node, value)`` (``value``: a ``Ref``'s value, for the call's arguments); an unknown
    value is ``None``. The step ``output_value`` takes on a program and ``lowering.meta`` on a
    lowered module tree. O(nodes), besides ``call``."""
    by_name = graph.by_name()
    known: dict[str, Any] = {}

    def value(r: Ref) -> Any:
        if r.name in known:
            return known[r.name]
        node = by_name.get(r.name)
        found = None
        if node is None:
            found = None
        elif "val" in node.meta:
            found = node.meta["val"]
        elif node.op == CALL_MODULE:
            found = call(node, value)
        elif node.op == CALL_FUNCTION and ops.is_in(node.target, _CONTAINERS):
            try:
                found = node.target(*thaw(node.args, value), **dict(thaw(node.kwargs, value)))
            except Exception:  # noqa: BLE001 - an unknown value (None) where a tree was expected
                found = None
        known[r.name] = found
        return found

    output = graph.output_node
    return thaw(output.args[0], value) if output.args else None


def _call(program: Program, mid: ModuleId, target: Any, memo: dict) -> Any:
    if type(target) is not str:
        return None
    path, variant = split_call_target(target)
    child = program.resolve(path, mid)
    if child is None:
        return None
    graphs = program.module_table()[child].graphs
    if variant >= len(graphs):
        return None
    key = (child, variant)
    if key not in memo:
        memo[key] = None  # a cycle (not in a verified program) reads as unknown
        memo[key] = _output(program, child, graphs[variant], memo)
    return memo[key]
