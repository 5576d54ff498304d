"""The guards ``rewrite`` puts on every match: what makes a match right in its program, beyond
the rule's own law (``check_rule``).

A rule is checked on its own functions; whether taking one match keeps the *program's* meaning
depends on the program around it. Three predicates decide that, each ``True`` when the match may
be taken (the engine skips it otherwise). The engine calls them as attributes of this module
(``guards.alias_guard(...)``), so a test can switch one off and watch a law fail.

- ``alias_guard``: a replacement that returns an input (``x * 1 -> x``), or a view of one, makes
  a value that was fresh an alias of a value outside the match. That is right only while no write
  in place can reach either of them (through any chain of views) and while the caller cannot see
  the new aliasing (the result returned next to, or as, an input or state value);
- ``barrier_guard``: a match must lie inside one chain of preserved calls
  (``preserve_module_call_signature``), so that outlining still finds every preserved call whole;
- ``dtype_guard``: each value that takes a replaced result's place has that result's dtype and
  shape (a replacement traced at one dtype must not change what a program at another computes).

Views are read from the operators' schemas (a result annotated ``Tensor(a)`` that is not written)
and from ``ir.ops.is_alias_like`` (``reshape``, ``to``, ``contiguous``: they may return their
input itself); a reader that is a ``call_module``, a higher-order op or an operator that writes
any argument counts as a write (it may write what it is given).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import torch

from ir import ops
from ir.args import Ref
from ir.memo import WeakMemo
from ir.module_stack import NO_STACK
from ir.node import CALL_FUNCTION, CALL_METHOD, OUTPUT, PLACEHOLDER, Node
from transforms.rewrite.trace import Traced


class GraphView(Protocol):
    """What a guard reads of the graph being rewritten: nodes by name and each value's readers
    (the output node is a reader of what it returns)."""

    node: Mapping[str, Node]
    users: Mapping[str, Mapping[str, None]]


# --- aliasing -----------------------------------------------------------------------------------


def alias_guard(view: GraphView, aliases: Mapping[str, str]) -> bool:
    """Whether results may become aliases of outside values without changing the program.

    Parameters:
        view: the graph as it is before the match is taken.
        aliases: ``{replaced result: outside value}``: each result of the match (a graph node
            name) that the replacement makes an alias of a value outside the match (the graph
            name of the value bound to the replacement input it returns, or a view of which it
            returns), and that the pattern did not already make an alias of that input.

    Returns ``False`` when, for some pair: a write in place (or a reader that may write:
    ``call_module``, a higher-order op) reaches the result or a view of it; or reaches the
    outside value's base (the value it is a view of, through any chain of views) or any view of
    that base; or the result (or a view of it) is returned while the outside value's base is a
    placeholder (an input or state the caller holds) or is returned too. Else ``True``; always
    ``True`` for an empty mapping.

    **Laws:** pure; ``False`` whenever taking the match would let a write through the result
    reach the caller's input (or a write to the input reach the result), or give the caller
    two outputs, or an output and an input, that share memory where eager's did not.
    Complexity: O(views of the values involved and their readers).
    """
    for result, outside in aliases.items():
        returned, ok = _reach(view, result)
        if not ok:
            return False
        base = _base(view, outside)
        base_returned, ok = _reach(view, base)
        if not ok:
            return False
        if returned:
            node = view.node.get(base)
            if node is None or node.op == PLACEHOLDER or base_returned:
                return False
    return True


def is_view(node: Node) -> bool:
    """Whether ``node``'s result may share memory with its first argument: a view operator
    (schema result ``Tensor(a)``, not written), an alias-like one (``ir.ops.is_alias_like``), or
    a ``getitem`` of such a node's results. O(1) after the first call per operator."""
    if node.op == CALL_METHOD:
        return ops.is_alias_like(node.target)
    if node.op != CALL_FUNCTION:
        return False
    return _view_op(node.target)


def _view_op(target: Any) -> bool:
    return ops.is_alias_like(target) or ops.is_getitem(target) or ops.is_view(target)


def _writes(node: Node) -> bool:
    """Whether ``node`` may write one of the values it reads: an operator that writes an
    argument, a higher-order op, a ``call_module`` (its graph may write what it is given)."""
    if node.op == OUTPUT:
        return False
    if node.op in (CALL_FUNCTION, CALL_METHOD):
        return ops.is_mutating(node.target) or bool(ops.hop_kind(node.target))
    return True


def _views_of(view: GraphView, name: str):
    """``name`` and every value that is a view of it through a chain of views, in BFS order."""
    seen = {name: None}
    todo = [name]
    while todo:
        v = todo.pop()
        for u in view.users.get(v, ()):
            if u in seen:
                continue
            node = view.node.get(u)
            if node is None or not is_view(node):
                continue
            first = node.args[0] if node.args else None
            if type(first) is Ref and first.name == v:
                seen[u] = None
                todo.append(u)
    return seen


def _reach(view: GraphView, name: str) -> tuple[bool, bool]:
    """(whether ``name`` or a view of it is returned, whether no write reaches them)."""
    returned = False
    for v in _views_of(view, name):
        for u in view.users.get(v, ()):
            node = view.node.get(u)
            if node is None:
                continue
            if node.op == OUTPUT:
                returned = True
            elif not is_view(node) and _writes(node):
                return returned, False
    return returned, True


def _base(view: GraphView, name: str) -> str:
    """The value ``name`` is a view of, through views up to a value that is not one."""
    seen = set()
    while name not in seen:
        seen.add(name)
        node = view.node.get(name)
        if node is None or not is_view(node) or not node.args or type(node.args[0]) is not Ref:
            return name
        name = node.args[0].name
    return name


def result_aliases(traced: Traced) -> tuple[int | None, ...]:
    """For each result of a traced rule function: the index of the input (placeholder order)
    that it is, or is a view of through a chain of views; ``None`` for a fresh result. A memo
    per ``Traced``. O(nodes) once."""
    return _RESULT_ALIASES(traced)


def _result_aliases(traced: Traced) -> tuple[int | None, ...]:
    nodes = {n.name: n for n in traced.graph.nodes}
    order = {n.name: i for i, n in enumerate(n for n in traced.graph.nodes if n.op == PLACEHOLDER)}
    out: list[int | None] = []
    for r in traced.outputs:
        found = None
        seen: set[str] = set()
        while type(r) is Ref and r.name not in seen:
            seen.add(r.name)
            if r.name in order:
                found = order[r.name]
                break
            node = nodes.get(r.name)
            if node is None or not is_view(node) or not node.args or _converts(node, nodes):
                break
            r = node.args[0]
        out.append(found)
    return tuple(out)


def _converts(node: Node, nodes: Mapping[str, Node]) -> bool:
    """Whether a may-alias operator (``to``, ``contiguous``: schema result ``Tensor(a)``) made a
    new tensor here: its ``val`` has another dtype or device than its input's (``x.to(float64)``
    of a float32 ``x`` is a copy; of a float64 ``x``, ``x`` itself)."""
    source = node.args[0]
    arg = nodes.get(source.name) if type(source) is Ref else None
    before = arg.meta.get("val") if arg is not None else None
    after = node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    return before.dtype != after.dtype or before.device != after.device


_RESULT_ALIASES: WeakMemo[Traced, tuple] = WeakMemo(_result_aliases)


# --- preserved calls ----------------------------------------------------------------------------


def barrier_guard(
    view: GraphView, nodes: Collection[str], preserved: Collection[str],
    renamed: Collection[str] = (), boundary: Collection[str] = (),
) -> bool:
    """Whether a match stays inside one chain of preserved calls.

    Parameters:
        view: the graph before the match is taken (a flat program's root graph).
        nodes: every node the match removes (pattern nodes and ``Binding.absorbed``).
        preserved: the program's preserved call names (``Program.call_signatures`` keys but
            ``""``, e.g. ``"blocks.0"``, ``"blocks.0@1"``).
        renamed: the match's results whose value will be read under another name (the
            replacement returns an input): they must not be named in a preserved signature.
        boundary: the value names that preserved call signatures name.

    Returns ``True`` when every node in ``nodes`` runs in the same chain of preserved calls
    (read from its ``nn_module_stack`` frames whose ``call_name`` is in ``preserved``; a node
    without a stack runs in none) and no name in ``renamed`` is in ``boundary``; always ``True``
    when ``preserved`` is empty.

    **Laws:** pure; a match it lets through computes no value on one side of a preserved
    call's boundary that is read on the other, so ``transform`` outlines every preserved call
    of the rewritten program as before. Complexity: O(len(nodes) · stack depth).
    """
    if not preserved:
        return True
    if any(r in boundary for r in renamed):
        return False
    chains = {_chain(view.node[n], preserved) for n in nodes if n in view.node}
    return len(chains) <= 1


def _chain(node: Node, preserved: Collection[str]) -> tuple[str, ...]:
    frames = node.module_frames
    if frames is NO_STACK or frames is None:
        return ()
    return tuple(f.call_name for f in frames if f.call_name in preserved)


# --- dtypes and shapes --------------------------------------------------------------------------


def dtype_guard(old: Sequence[Any], new: Sequence[Any]) -> bool:
    """Whether each new value has the dtype and shape of the result it replaces.

    ``old[i]`` is the replaced result's ``meta['val']``, ``new[i]`` the ``meta['val']`` of the
    value taking its place; ``None`` on either side is unknown and passes. Fake tensors (or
    tuples/lists of them) compare by dtype and rank, and by each size where both sizes are
    plain ints (a symbolic size is not compared); other values by type.

    **Laws:** pure; ``dtype_guard(v, v)`` holds. Complexity: O(results · rank).
    """
    return all(_same_meta(o, n) for o, n in zip(old, new))


def _same_meta(old: Any, new: Any) -> bool:
    if old is None or new is None:
        return True
    if isinstance(old, (tuple, list)) or isinstance(new, (tuple, list)):
        if not (isinstance(old, (tuple, list)) and isinstance(new, (tuple, list))):
            return False
        return len(old) == len(new) and all(_same_meta(a, b) for a, b in zip(old, new))
    if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return False
        if old.dtype != new.dtype or old.dim() != new.dim():
            return False
        return all(
            a == b for a, b in zip(old.shape, new.shape) if type(a) is int and type(b) is int
        )
    return type(old) is type(new)


__all__ = [
    "GraphView",
    "alias_guard",
    "barrier_guard",
    "dtype_guard",
    "is_view",
    "result_aliases",
]
