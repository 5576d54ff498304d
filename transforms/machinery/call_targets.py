"""The distinct ``call_function`` targets of a graph.

A pass that looks for one kind of operator (``with_effects``, a mode-setting higher-order op)
asks once per distinct target instead of once per node: a graph of n nodes calls a few dozen
operators. The answer is a memo of the graph, so the passes that read one graph scan it once.
"""

from __future__ import annotations

from typing import Any

from ir.graph import Graph
from ir.memo import WeakMemo
from ir.node import CALL_FUNCTION


def call_targets(graph: Graph) -> tuple[Any, ...]:
    """Each target of ``graph``'s ``call_function`` nodes, once (by identity), in the order of
    first use. Read-only: a memo of ``graph`` (``ir.memo.WeakMemo``), shared by its readers.

    **Laws:** ``set(map(id, call_targets(g))) == {id(n.target) for n in g.nodes if n.op ==
    "call_function"}``. Complexity: O(n) once per graph, O(1) after.
    """
    return _CALL_TARGETS(graph)


def _call_targets(graph: Graph) -> tuple[Any, ...]:
    # keyed by id: an operator's ``__hash__`` is Python code; the targets live as long as the
    # graph's nodes, so no id is reused while this runs
    return tuple({id(n.target): n.target for n in graph.nodes if n.op == CALL_FUNCTION}.values())


_CALL_TARGETS: WeakMemo[Graph, tuple[Any, ...]] = WeakMemo(_call_targets)
