"""fx metadata on every node of a lowered fx graph, as torch's passes expect it.

Nodes that come from the program carry its meta (``val``, ``tensor_meta``, ``nn_module_stack``,
``stack_trace``, ...) through the IR unchanged. The nodes lowering adds have none of their own:
a ``call_module`` node's ``val`` is its callee's output value (read from the callee's IR graph,
recursively through nested calls), an ``output`` node's is the tree of its arguments' values,
and a placeholder or ``get_attr`` holding a tensor gets the ``tensor_meta`` torch gives it.
So ``ShapeProp``, ``FakeTensorProp``, partitioners and pipeline splitters run on our graphs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ir import ops
from ir.args import Ref, thaw
from ir.graph import Graph
from ir.module import split_call_target
from ir.node import CALL_FUNCTION, Node
from ir.returned_values import graph_value
from ir.runtime import expect_constant
from ir.torch_seam import pytree
from ir.tree_calls import flatten_by_spec, torch_equivalent, unflatten_tree
from lowering.lowering_seam import extract_tensor_metadata

_NO_VALUE = object()

# Functions on containers that lowering adds around preserved calls: their value follows from
# their arguments' values, so it is computed by calling them on those values (purefx's in IR
# graphs, torch's in the fx graphs built from them).
_CONTAINER_FUNCTIONS = frozenset(
    {operator.getitem, unflatten_tree, flatten_by_spec}
    | {torch_equivalent(unflatten_tree), torch_equivalent(flatten_by_spec)}
)


def _apply(fn: Any, args: Any, kwargs: Any, value_of: Any) -> Any:
    """``fn`` on the values of ``args``; ``_NO_VALUE`` when some value is unknown or ``fn``
    refuses them."""
    args, kwargs = torch.fx.node.map_arg((args, kwargs), value_of)
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 -- an unknown value (None) where a container was expected
        return _NO_VALUE


def complete_meta(fx_graph: torch.fx.Graph, ir_graph: Graph, owner: torch.nn.Module) -> None:
    """Give every node of ``fx_graph`` (built from ``ir_graph``, run by ``owner``, whose children
    must be attached) a ``val`` where one can be known, and ``tensor_meta`` on placeholders and
    ``get_attr`` nodes holding a tensor. Writes only meta keys that are missing. O(nodes), plus
    the callees' output nodes, each read once per call."""
    by_name = ir_graph.by_name()
    memo: dict[tuple[int, int], Any] = {}
    arguments: dict[str, Any] | None = None
    for node in fx_graph.nodes:
        meta = node.meta
        if "val" not in meta:
            val = _NO_VALUE
            if node.op == "placeholder":
                arguments = _argument_values(ir_graph) if arguments is None else arguments
                val = arguments.get(node.name, _NO_VALUE)
            elif node.op == "call_module":
                ir_node = by_name.get(node.name) or by_name.get(node.name[:-1])
                if ir_node is not None:
                    args = torch.fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
                    val = _call_value(owner, ir_node.target, args, memo)
            elif node.op == "get_attr" and "." not in node.target:
                val = owner.__dict__.get(node.target, _NO_VALUE)  # a held literal (TreeSpec)
            elif node.op == "call_function" and node.target in _CONTAINER_FUNCTIONS:
                val = _apply(node.target, node.args, node.kwargs, lambda n: n.meta.get("val"))
                if val is _NO_VALUE or val is None:
                    val = _checked_constant(node)
            elif node.op == "call_function" and node.target is expect_constant:
                val = _constant_of(node)
            elif node.op == "call_function" and ops.facts(node.target).results == 0:
                meta["val"] = None  # an operator that returns nothing (an assertion), as torch
            elif node.op == "output":
                val = torch.fx.node.map_arg(node.args[0], lambda n: n.meta.get("val"))
            if val is not _NO_VALUE and val is not None:
                meta["val"] = val
        if (
            "tensor_meta" not in meta
            and node.op in ("placeholder", "get_attr")
            and isinstance(meta.get("val"), torch.Tensor)
        ):
            meta["tensor_meta"] = extract_tensor_metadata(meta["val"])


def _constant_of(check: torch.fx.Node) -> Any:
    """The constant an ``expect_constant(value, constant, where)`` node passes on."""
    return check.args[1] if len(check.args) > 1 else _NO_VALUE


def _checked_constant(node: torch.fx.Node) -> Any:
    """A preserved call's constant argument, read by ``getitem`` from its flattened arguments,
    is the constant that an ``expect_constant`` user of it checks for."""
    for user in node.users:
        if user.op == "call_function" and user.target is expect_constant and user.args[0] is node:
            return _constant_of(user)
    return _NO_VALUE


def _call_value(owner: torch.nn.Module, target: str, args: Any, memo: dict) -> Any:
    """The value a ``call_module`` of ``target`` (``path@k``) below ``owner`` returns when given
    ``args`` (values): the callee graph's output value, unless its placeholders were traced with
    other shapes or dtypes than ``args`` (one deduplicated graph serves calls of several shapes:
    then the value is unknown rather than wrong)."""
    path, variant = split_call_target(target)
    try:
        callee = owner.get_submodule(path)
    except AttributeError:
        return _NO_VALUE
    graphs = callee.__dict__.get("_ir_graphs")
    if not graphs or variant >= len(graphs):
        return _NO_VALUE
    if not _same_values(args, [n.meta.get("val") for n in graphs[variant].placeholders]):
        return _NO_VALUE
    key = (id(graphs[variant]), id(callee))
    if key not in memo:
        memo[key] = _NO_VALUE  # a cycle (not in a valid program) reads as unknown
        memo[key] = _output_value(graphs[variant], callee, memo)
    return memo[key]


def _output_value(graph: Graph, owner: torch.nn.Module, memo: dict) -> Any:
    def call(node: Node, value: Callable[[Ref], Any]) -> Any:
        found = _call_value(owner, node.target, thaw(node.args, value), memo)
        return None if found is _NO_VALUE else found

    return graph_value(graph, call)


def _same_values(given: Any, traced: list[Any]) -> bool:
    """Whether the call's positional argument values match the callee's placeholder values
    (tensors by shape and dtype; unknown values match anything)."""
    given = list(given) if isinstance(given, (tuple, list)) else [given]
    if len(given) != len(traced):
        return True  # keyword or adapted calls: nothing to compare positionally
    for a, b in zip(given, traced):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.dtype != b.dtype or len(a.shape) != len(b.shape):
                return False
            if any(str(x) != str(y) for x, y in zip(a.shape, b.shape)):
                return False
    return True


def _argument_values(graph: Graph) -> dict[str, Any]:
    """Values of the placeholders of a preserved call's graph (the eager arguments, which the
    program never traced as such): the graph flattens them with ``tree_flatten_spec`` and reads
    each leaf with ``getitem``, whose values the program has; unflattening those leaves with the
    spec gives each argument's value. O(nodes)."""
    found: dict[str, Any] = {}
    flattens = {
        n.name: n
        for n in graph.nodes
        if n.op == CALL_FUNCTION and n.target is flatten_by_spec and len(n.args) == 2
    }
    leaves: dict[str, dict[int, Any]] = {name: {} for name in flattens}
    constants = {  # a constant leaf has no val: the value its check expects
        n.args[0].name: n.args[1]
        for n in graph.nodes
        if n.op == CALL_FUNCTION and n.target is expect_constant and len(n.args) > 1
        and isinstance(n.args[0], Ref)
    }
    for n in graph.nodes:
        if n.op == CALL_FUNCTION and n.target is operator.getitem and (
            "val" in n.meta or n.name in constants
        ):
            base, index = n.args
            if isinstance(base, Ref) and base.name in leaves and isinstance(index, int):
                leaves[base.name][index] = n.meta.get("val", constants.get(n.name))
    for name, node in flattens.items():
        tree, spec = node.args
        got = leaves[name]
        if not hasattr(spec, "num_leaves") or sorted(got) != list(range(spec.num_leaves)):
            continue
        values = pytree.tree_unflatten([got[i] for i in range(spec.num_leaves)], spec)
        _pair_refs(thaw(tree, lambda r: r), values, found)
    return found


def _pair_refs(tree: Any, values: Any, into: dict[str, Any]) -> None:
    if isinstance(tree, Ref):
        into[tree.name] = values
    elif isinstance(tree, (tuple, list)) and isinstance(values, (tuple, list)):
        for t, v in zip(tree, values):
            _pair_refs(t, v, into)
    elif isinstance(tree, dict) and isinstance(values, dict):
        for key, t in tree.items():
            if key in values:
                _pair_refs(t, values[key], into)
