"""IR graphs to fx graphs, and fx graphs to compiled Python forward functions.

The generated function takes the module as ``self``; structurally identical graphs (same alpha
key, same placeholder names) share one compiled function, so a stack of N identical blocks compiles
once.
"""

from __future__ import annotations

import hashlib
import keyword
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from ir.alpha import interned_key
from ir.args import IDict, IList, Ref, thaw
from ir.errors import LoweringError
from ir.graph import Graph
from ir.memo import WeakMemo
from ir.module import split_call_target
from ir.node import CALL_FUNCTION, CALL_MODULE, OUTPUT, PLACEHOLDER, Node
from ir.torch_seam import TreeSpec, graph_codegen
from ir.tree_calls import torch_equivalent
from lowering.identifiers import check_graph, is_identifier
from lowering.source import compile_function

# The keyword argument by which a caller names the graph variant of a lowered module it calls.
GRAPH_KEYWORD = "_purefx_graph"
# Class attribute, true on module classes whose ``forward`` takes ``GRAPH_KEYWORD``.
TAKES_GRAPH = "_purefx_takes_graph"

# Names generated code uses for itself: a node may not shadow them (a child called ``self``).
_RESERVED = frozenset(
    {"self", "torch", "inf", "nan", "device", "getattr", "fx_pytree", "pytree", "builtins"}
) | frozenset(keyword.kwlist)

NodeRule = Callable[[torch.fx.Graph, Node, Callable[[Any], Any]], "torch.fx.Node | None"]


def to_fx_graph(
    graph: Graph, rules: dict[str, NodeRule] | None = None
) -> tuple[torch.fx.Graph, dict[str, Any]]:
    """Build a fresh ``torch.fx.Graph`` equal to ``graph``, and the attributes it reads.

    Literals that Python code cannot spell (pytree ``TreeSpec``s) become ``get_attr`` nodes of
    attributes named after their content (see ``spec_constants``), returned as ``{name: value}``
    for the owning module to hold. Raises ``LoweringError`` for a string that the generated code
    could not spell safely (``lowering.identifiers.check_graph``).
    ``rules`` maps a node name to a function that emits that node differently (the root uses this
    to read state instead of taking it as a placeholder); it returns the fx node that stands for
    the IR node's value, or ``None`` when the value is dropped.
    """
    check_graph(graph, "a lowered module")
    fx_graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    constants: dict[str, Any] = {}
    spec_nodes: dict[str, torch.fx.Node] = {}

    def read(r: Ref) -> torch.fx.Node:
        return env[r.name]

    held, names = _spec_names(graph)

    def spelled(tree: Any) -> Any:
        if isinstance(tree, TreeSpec):
            name = names[id(tree)]
            made = spec_nodes.get(name)
            if made is None:
                constants[name] = held[name]
                made = fx_graph.get_attr(name)
                spec_nodes[name] = made
            return made
        if type(tree) in (tuple, list):
            return type(tree)(spelled(x) for x in tree)
        if type(tree) is dict:
            return {k: spelled(v) for k, v in tree.items()}
        return tree

    def thawed(tree: Any) -> Any:
        return spelled(thaw(tree, read))

    for node in graph.nodes:
        rule = rules.get(node.name) if rules else None
        if rule is not None:
            made = rule(fx_graph, node, thawed)
        elif node.op == OUTPUT:
            made = fx_graph.output(thawed(node.args[0]) if node.args else None)
        else:
            target, kwargs = node.target, thawed(node.kwargs)
            if node.op == CALL_MODULE:
                target, kwargs = module_call(node, kwargs)
            elif node.op == CALL_FUNCTION:
                target = torch_equivalent(target)  # fx graphs call torch's pytree functions
            made = fx_graph.create_node(
                node.op, target, thawed(node.args), kwargs, name=fx_name(node.name)
            )
            if node.op == PLACEHOLDER and not is_identifier(target):
                made.target = made.name  # fx spells a placeholder's target as it is
        if made is None:
            continue
        if node.meta and not made.meta:
            made.meta = _copied_meta(node)
        env[node.name] = made
    return fx_graph, constants


def fx_name(name: str) -> str:
    """The fx node name to ask for an IR node named ``name`` (names generated code uses get a
    ``_``); fx's namespace still makes it a unique identifier (``Node._rename`` for a node that
    exists)."""
    return name if name not in _RESERVED else f"{name}_"


def module_call(node: Node, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The fx target and keyword arguments of ``call_module`` node ``node`` (target ``path@k``).

    The caller names the graph the call runs: graph ``k`` >= 1 is passed as the keyword
    ``GRAPH_KEYWORD`` (``self.block(x, _purefx_graph = 1)``), so no state on the called module
    decides it; a call without it runs graph 0 (see ``LoweredModule.forward``). The fx graph
    keeps this ``call_module``; compiled code and ``GraphInterpreter`` make it a ``call_graph``
    call, so a module that is not lowered (a user's replacement) never sees the keyword. Raises
    ``LoweringError`` when the node's own keyword arguments already use that name.
    """
    path, variant = split_call_target(node.target)
    if GRAPH_KEYWORD in kwargs:
        raise LoweringError(
            f"call_module node {node.name!r} passes a keyword argument named {GRAPH_KEYWORD!r}, "
            "which lowered modules reserve for the graph a call runs; rename it"
        )
    if variant:
        kwargs = {**kwargs, GRAPH_KEYWORD: variant}
    return path, kwargs


def call_graph(module: Callable[..., Any], variant: int, *args: Any, **kwargs: Any) -> Any:
    """Call ``module`` as a caller that runs its graph ``variant`` (what generated code runs).

    A lowered module (class attribute ``TAKES_GRAPH``) gets ``GRAPH_KEYWORD=variant`` for a
    ``variant`` >= 1; any other module (a user's replacement) gets the program's arguments only.
    The module is called as usual (``module(...)``), so its hooks fire. O(1) besides the call.
    """
    if variant and getattr(type(module), TAKES_GRAPH, False):
        return module(*args, **kwargs, **{GRAPH_KEYWORD: variant})
    return module(*args, **kwargs)


class GraphInterpreter(torch.fx.Interpreter):
    """``torch.fx.Interpreter`` that calls submodules through ``call_graph``."""

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        kwargs = dict(kwargs)
        variant = kwargs.pop(GRAPH_KEYWORD, 0)
        return call_graph(self.fetch_attr(target), variant, *args, **kwargs)


def interpret(module: torch.nn.Module, graph: torch.fx.Graph, args: Sequence[Any]) -> Any:
    """Run ``graph`` of ``module`` on ``args`` with ``GraphInterpreter``."""
    return GraphInterpreter(module, graph=graph).run(*args, enable_io_processing=False)


def _graph_calls_dispatched(fx_graph: torch.fx.Graph) -> torch.fx.Graph:
    """``fx_graph``, or a copy of it in which each ``call_module`` that passes ``GRAPH_KEYWORD``
    is a ``call_graph`` call on the module (a ``get_attr``), so the compiled code passes the
    keyword to lowered modules only. The input graph is not changed. O(nodes)."""
    def dispatched(n: torch.fx.Node) -> bool:
        return n.op == "call_module" and GRAPH_KEYWORD in n.kwargs

    if not any(dispatched(n) for n in fx_graph.nodes):
        return fx_graph
    copy = torch.fx.Graph()
    copy.set_codegen(graph_codegen(fx_graph))
    out, old_output = copy.graph_copy(fx_graph, {}, return_output_node=True)
    copy.output(out, type_expr=old_output.type)
    for node in [n for n in copy.nodes if dispatched(n)]:
        kwargs = dict(node.kwargs)
        variant = kwargs.pop(GRAPH_KEYWORD)
        with copy.inserting_before(node):
            module = copy.get_attr(node.target)
            call = copy.call_function(call_graph, (module, variant, *node.args), kwargs)
        node.replace_all_uses_with(call)
        copy.erase_node(node)
    return copy


def _copied_meta(node: Node) -> dict[str, Any]:
    meta = dict(node.meta)
    stack = meta.get("nn_module_stack")
    if stack is not None:
        meta["nn_module_stack"] = dict(stack)
    return meta


def spec_constants(graph: Graph) -> dict[str, Any]:
    """``{name: spec}`` for each distinct ``TreeSpec`` literal of ``graph``, in first-use order.

    A name is a function of the spec's content (``_spec_<digest>``), never of where the graph sits:
    two call variants of one module that need different specs get different attributes, and graphs
    that share compiled code (equal alpha keys, hence equal specs) read the same names. Equal specs
    share one name. O(size of the graph's literals), once per alpha key.
    """
    key = interned_key(graph)
    found = _SPECS_BY_KEY.get(key)
    if found is None:
        found = _SPECS_BY_KEY[key] = _spec_names(graph)[0]
    return found


# Graphs with one alpha key hold equal specs under equal names: scan one of them.
_SPECS_BY_KEY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _find_spec_names(graph: Graph) -> tuple[dict[str, Any], dict[int, str]]:
    """``spec_constants(graph)``, and the attribute name of each spec object (by ``id``)."""
    held: dict[str, Any] = {}
    names: dict[int, str] = {}
    by_value: dict[TreeSpec, str] = {}  # equal specs get one name: text and digest once

    def visit(tree: Any) -> None:
        if isinstance(tree, TreeSpec):
            if id(tree) not in names:
                try:
                    name = by_value.get(tree)
                except TypeError:  # a context torch cannot hash: no sharing, same name
                    name = _hold(held, tree)
                if name is None:
                    name = by_value[tree] = _hold(held, tree)
                names[id(tree)] = name
        elif isinstance(tree, (tuple, IList)):
            for x in tree:
                if type(x) not in _ATOMS:
                    visit(x)
        elif isinstance(tree, IDict):
            for _, v in tree.items:
                if type(v) not in _ATOMS:
                    visit(v)

    for node in graph.nodes:
        for x in node.args:  # visit(node.args), without a call for a node of atoms only
            if type(x) not in _ATOMS:
                visit(x)
        if node.kwargs.items:
            visit(node.kwargs)
    return held, names


# Argument values that are neither a spec nor hold one: skipped without a call.
_ATOMS = frozenset({Ref, int, float, bool, str, type(None)})

# Per Graph object (the names are by ``id`` of the graph's own spec objects), held weakly.
_spec_names: WeakMemo[Graph, tuple[dict[str, Any], dict[int, str]]] = WeakMemo(_find_spec_names)


def _hold(held: dict[str, Any], spec: TreeSpec) -> str:
    """The name ``spec`` is held under in ``held`` (added if new); unequal specs never share one."""
    base = f"_spec_{hashlib.blake2b(_spec_text(spec).encode(), digest_size=4).hexdigest()}"
    name, i = base, 0
    while name in held and held[name] != spec:
        i += 1
        name = f"{base}_{i}"
    held.setdefault(name, spec)
    return name


def _spec_text(spec: TreeSpec) -> str:
    """A deterministic text of a spec's structure: node types, contexts and children."""
    if spec.is_leaf():
        return "*"
    kind = spec.type
    children = ",".join(_spec_text(c) for c in spec.children())
    return f"{kind.__module__}.{kind.__qualname__}:{spec.context!r}({children})"


# Compiled functions live as long as some module uses them (their source too: lowering/source.py).
_COMPILED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def compiled(share_key: Any) -> Callable[..., Any] | None:
    """The function already compiled under ``share_key``, if any."""
    return _COMPILED.get(share_key)


def compile_graph(fx_graph: torch.fx.Graph, share_key: Any = None) -> Callable[..., Any]:
    """Compile ``fx_graph`` into ``forward(self, *args)``; reuse one compiled per ``share_key``."""
    if share_key is not None:
        found = _COMPILED.get(share_key)
        if found is not None:
            return found
    code = _graph_calls_dispatched(fx_graph).python_code(root_module="self")
    forward = compile_function(code.src, code.globals, "forward")
    if share_key is not None:
        _COMPILED[share_key] = forward
    return forward


def share_key(graph: Graph) -> Any:
    """The key under which two module graphs may share compiled code: their alpha key.

    Node names differ between structurally equal graphs (every block of a stack), so shared code
    is called positionally; a module binds keyword arguments to its own placeholder names first.
    """
    return interned_key(graph)
