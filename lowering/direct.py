"""Direct code: a graph as a Python function that calls its submodules' direct code itself.

The ordinary generated code of a lowered module (``lowering/codegen.py``) calls each submodule
through ``nn.Module.__call__`` and reads state through ``nn.Module.__getattr__``. That is right
whatever a user does to the tree, and it costs a few microseconds per call, which matters for a
small module called thousands of times. Direct code is the same graph with those two layers
removed: a submodule call becomes ``child._direct[k](child, ...)`` (graph variant ``k`` of the
child, known statically) and a state read becomes a lookup in the owner's ``_parameters``,
``_buffers``, ``_modules`` or ``__dict__``. It is only valid while the tree is exactly as
``lower`` built it; ``lowering/tree_watch.py`` decides when it may run.

A submodule call is one line, ``add_3 = (_m := _k0['3'])._direct[0](_m, add_2)``: ``_k0`` is
the owner's ``_modules`` table, read into a local once, and the child's direct function is looked
up on the child at each call, so a module put into the table in place of the built one runs its
own code. One short line per call: a root that calls thousands of blocks is one large function,
and compiling it costs in proportion to its tokens.

Direct functions are shared like ordinary code: one per (alpha key, how each state read is
reached), so all blocks of a stack share one.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from keyword import iskeyword
from typing import Any

import torch

from ir import ops
from ir.alpha import interned_key
from ir.args import IDict, IList, ISlice, Ref
from ir.graph import Graph
from ir.module import split_call_target
from ir.node import (
    CALL_FUNCTION,
    CALL_METHOD,
    CALL_MODULE,
    GET_ATTR,
    OUTPUT,
    PLACEHOLDER,
    Node,
)
from ir.ops import COPY, MAKE_DEP_TOKEN
from ir.torch_seam import TreeSpec, pytree
from ir.tree_calls import flatten_by_spec, unflatten_tree
from lowering.identifiers import check_graph
from lowering.lowering_seam import BUFFER_TABLE, MODULE_TABLE, PARAMETER_TABLE
from lowering.source import compile_function

# How the last step of a state path is reached, by where nn.Module keeps it.
PLAIN_ATTRIBUTE = "__dict__"

# A read: the module path's parts, then the table that holds the last name (or None: getattr).
# A part that starts with HELD is a module held in a plain attribute (a peer), not a child.
Read = tuple[tuple[str, ...], str, str | None]
HELD = "__dict__:"

DirectFn = Callable[..., Any]

_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_SIMPLE_LITERALS = (int, bool, str, type(None))


def locate(owner: torch.nn.Module, target: str) -> Read | None:
    """Where the attribute at dotted ``target`` below ``owner`` lives now; ``None`` when a step
    of the path is neither a registered submodule nor a module held in a plain attribute (a
    peer, recorded as ``HELD + name``), or the name is nowhere."""
    *names, name = target.split(".")
    parts = []
    mod = owner
    for part in names:
        child = mod.__dict__[MODULE_TABLE].get(part)
        if child is None:
            child = mod.__dict__.get(part)
            if not isinstance(child, torch.nn.Module):
                return None
            part = HELD + part
        parts.append(part)
        mod = child
    for table in (PARAMETER_TABLE, BUFFER_TABLE, MODULE_TABLE):
        if name in mod.__dict__[table]:
            return tuple(parts), name, table
    if name in mod.__dict__:
        return tuple(parts), name, PLAIN_ATTRIBUTE
    if hasattr(mod, name):
        return tuple(parts), name, None
    return None


def direct_function(
    graph: Graph,
    reads: Mapping[str, Read],
    *,
    bound: Mapping[str, tuple] | None = None,
    outputs: Sequence[tuple[str, Any]] | None = None,
    label: str = "module",
) -> DirectFn:
    """Compile ``graph`` into ``fn(self, *placeholders)`` that calls submodules directly.

    ``reads`` maps each ``get_attr`` target of the graph to where it lives (see ``locate``).
    For the root: ``bound`` maps placeholder names to ``("state", fqn)`` (read the state; the
    fqn must be in ``reads``) or ``("token",)`` (a fresh effect token), and ``outputs`` says, per
    output position, ``("return", None)``, ``("copy_state", fqn)`` or ``("copy_input",
    placeholder name)``. Functions are cached per (alpha key, reads, bindings, outputs).
    Raises ``LoweringError`` for a string that source could not spell safely (see
    ``lowering.identifiers``).
    """
    check_graph(graph, label)
    key = (
        interned_key(graph),
        tuple(sorted(reads.items())),
        tuple(sorted((bound or {}).items())),
        tuple(outputs) if outputs is not None else None,
    )
    found = _SHARED.get(key)
    if found is None:
        found = _Emitter(graph, reads, bound or {}, outputs).compile()
        _SHARED[key] = found
    return found


def call_direct(child: torch.nn.Module, variant: int, args: tuple, kwargs: dict) -> Any:
    """A direct call that passes keyword arguments: bind them to the child's placeholders."""
    return child._direct[variant](child, *child._bind(variant, args, kwargs))


def unflatten_source(spec: Any, leaf: Callable[[], str], constant: Callable[[Any], str],
                     key: Callable[[Any], str], unsupported: type[Exception]) -> str:
    """Source that builds ``tree_unflatten(leaves, spec)``: each leaf spelled by ``leaf()`` in
    order, tuples, lists and dicts as displays (their keys spelled by ``key``), ``None`` as
    itself, any other registered node through its own unflatten function (``constant`` spells
    a Python object); raises ``unsupported`` at a node type pytree does not know. O(spec)."""
    if spec.is_leaf():
        return leaf()
    parts = [unflatten_source(c, leaf, constant, key, unsupported) for c in spec.children()]
    kind = spec.type
    if kind is tuple:
        return f"({''.join(p + ', ' for p in parts)})"
    if kind is list:
        return f"[{', '.join(parts)}]"
    if kind is dict:
        return "{" + ", ".join(f"{key(k)}: {p}" for k, p in zip(spec.context, parts)) + "}"
    if kind is type(None):
        return "None"
    node = pytree.SUPPORTED_NODES.get(kind)
    if node is None:
        raise unsupported
    return f"{constant(node.unflatten_fn)}([{', '.join(parts)}], {constant(spec.context)})"


class _Emitter:
    """Writes one function's source, line by line, then compiles it."""

    def __init__(
        self,
        graph: Graph,
        reads: Mapping[str, Read],
        bound: Mapping[str, tuple],
        outputs: Sequence[tuple[str, Any]] | None,
    ) -> None:
        self.graph = graph
        self.reads = reads
        self.bound = bound
        self.outputs = outputs
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {"call_direct": call_direct}
        self.constant_names: dict[int, str] = {}
        self.names: dict[str, str] = {}
        # module path -> the local holding that module's ``_modules`` table
        self.tables: dict[tuple[str, ...], str] = {}
        # a flat list made from a literal spec (``tree_call``) -> its items' expressions
        self.flat_lists: dict[str, list[str]] = {}

    def compile(self) -> DirectFn:
        params = ["self"]
        for node in self.graph.nodes:
            if node.op == PLACEHOLDER:
                name = self.local(node.name)
                binding = self.bound.get(node.name)
                if binding is None:
                    params.append(name)
                elif binding[0] == "token":
                    self.emit(f"{name} = {self.constant(MAKE_DEP_TOKEN)}()")
                else:
                    self.emit(f"{name} = {self.read(binding[1])}")
            elif node.op == GET_ATTR:
                self.emit(f"{self.local(node.name)} = {self.read(node.target)}")
            elif node.op == CALL_FUNCTION:
                if _is_subscript(node):  # ``base[index]``: the same operation, spelled shorter
                    base, index = node.args
                    known = self.flat_lists.get(base.name)
                    if (
                        known is not None
                        and type(index) is int
                        and 0 <= index < len(known)
                        and known[index].isidentifier()  # an item that is a name: that name
                    ):
                        self.names[node.name] = known[index]
                        continue
                    self.emit(f"{self.local(node.name)} = {self.value(base)}[{self.value(index)}]")
                    continue
                if self.tree_call(node):
                    continue
                call = self.call(self.constant(node.target), node.args, node.kwargs)
                self.emit(f"{self.local(node.name)} = {call}")
            elif node.op == CALL_METHOD:
                receiver, *rest = node.args
                call = self.call(f"{self.value(receiver)}.{node.target}", tuple(rest), node.kwargs)
                self.emit(f"{self.local(node.name)} = {call}")
            elif node.op == CALL_MODULE:
                self.emit_module_call(node.name, node.target, node.args, node.kwargs)
            elif node.op == OUTPUT:
                self.emit_return(node.args[0] if node.args else None)
        body = "\n".join("    " + line for line in self.lines) or "    pass"
        source = f"def direct({', '.join(params)}):\n{body}\n"
        return compile_function(source, self.globals, "direct")

    # --- pytree plumbing of preserved calls ----------------------------------------------------

    def tree_call(self, node: Node) -> bool:
        """Emit ``flatten_by_spec(tree, spec)`` or ``unflatten_tree(leaves, spec)`` (a preserved
        call's plumbing, ``ir.tree_calls``) as the list or tree display it computes, where the
        spec is a literal: the value at each of the spec's leaves is read by the same subscripts
        ``tree_flatten_spec`` makes, and a subscript of the flat list becomes the item's name.
        ``False`` (emit the call) where some part is not spelled statically."""
        if node.kwargs.items or len(node.args) != 2 or not isinstance(node.args[1], TreeSpec):
            return False
        tree, spec = node.args
        try:
            if node.target is flatten_by_spec:
                items = self.spec_leaves(tree, spec)
                self.emit(f"{self.local(node.name)} = [{', '.join(items)}]")
                self.flat_lists[node.name] = items
                return True
            if node.target is unflatten_tree:
                leaves = tree.items if type(tree) is IList else tree
                if type(leaves) is not tuple and type(tree) is not IList:
                    return False
                if len(leaves) != spec.num_leaves:
                    return False
                display = unflatten_source(spec, iter([self.value(x) for x in leaves]).__next__,
                                           self.constant, self.value, _NotStatic)
                self.emit(f"{self.local(node.name)} = {display}")
                return True
        except _NotStatic:
            return False
        return False

    def spec_leaves(self, tree: Any, spec: Any) -> list[str]:
        """The expressions of ``tree_flatten_spec(tree, spec)``'s items: a literal's parts are
        taken as they are, a value's by subscript (``v[0]``, ``v['key']``), as torch reads them."""
        if spec.is_leaf():
            return [self.value(tree)]
        kind = spec.type
        runtime = type(tree) in (Ref, _Raw)
        if kind in (tuple, list):
            if runtime:
                base = self.value(tree)
                parts = [_Raw(f"{base}[{i}]") for i in range(spec.num_children)]
            elif type(tree) in (tuple, IList):
                items = tree if type(tree) is tuple else tree.items
                if len(items) < spec.num_children:
                    raise _NotStatic
                parts = list(items[: spec.num_children])
            else:
                raise _NotStatic
        elif kind is dict:
            if runtime:
                base = self.value(tree)
                parts = [_Raw(f"{base}[{self.value(k)}]") for k in spec.context]
            elif type(tree) is IDict:
                by_key = dict(tree.items)
                if any(k not in by_key for k in spec.context):
                    raise _NotStatic
                parts = [by_key[k] for k in spec.context]
            else:
                raise _NotStatic
        else:
            raise _NotStatic
        out: list[str] = []
        for part, child in zip(parts, spec.children()):
            out += self.spec_leaves(part, child)
        return out

    # --- pieces -------------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def emit_module_call(self, name: str, target: str, args: tuple, kwargs: IDict) -> None:
        path, variant = split_call_target(target)
        child = self.module_path(path.split("."))
        if kwargs.items:
            call = f"call_direct({child}, {variant}, {self.value(args)}, {self.value(kwargs)})"
        else:  # the child's function looked up at each call: the module now in its place runs
            call = self.call(f"(_m := {child})._direct[{variant}]", (_Raw("_m"), *args), kwargs)
        self.emit(f"{self.local(name)} = {call}")

    def emit_return(self, tree: Any) -> None:
        if self.outputs is None:
            self.emit(f"return {self.value(tree)}")
            return
        values = tree if isinstance(tree, tuple) else (tree,)
        kept = []
        copy_ = self.constant(COPY)
        for value, (kind, target) in zip(values, self.outputs):
            if kind == "return":
                kept.append(self.value(value))
            elif kind == "copy_state":
                self.emit(f"{copy_}({self.read(target)}, {self.value(value)})")
            elif kind == "copy_input":
                self.emit(f"{copy_}({self.local(target)}, {self.value(value)})")
        self.emit(f"return ({''.join(k + ', ' for k in kept)})")

    def read(self, target: str) -> str:
        parts, name, table = self.reads[target]
        owner = self.module_path(parts)
        if table is None:
            return f"getattr({owner}, {name!r})"
        return f"{owner}.__dict__[{table!r}][{name!r}]" if table != PLAIN_ATTRIBUTE else (
            f"{owner}.__dict__[{name!r}]"
        )

    def module_path(self, parts: Sequence[str]) -> str:
        """The expression of the module at ``parts`` below ``self``. The ``_modules`` table of
        the module holding the last step is read into a local once, at its first use, so that
        the calls of its children spell one subscript each (the tree does not change during a
        direct call)."""
        steps = tuple(p for p in parts if p)
        if len(steps) < 2:
            return "self" + "".join(map(_step, steps))
        owner, last = steps[:-1], steps[-1]
        if last.startswith(HELD):
            return self.module_path(owner) + _step(last)
        table = self.tables.get(owner)
        if table is None:
            spelled = self.module_path(owner)  # may hoist the owner's owner's table first
            table = self.tables[owner] = f"_k{len(self.tables)}"
            self.emit(f"{table} = {spelled}.{MODULE_TABLE}")
        return f"{table}[{last!r}]"

    def call(self, fn: str, args: tuple, kwargs: IDict) -> str:
        rendered = [self.value(a) for a in args]
        if kwargs.items and all(
            isinstance(k, str) and k.isidentifier() and not iskeyword(k) for k, _ in kwargs.items
        ):
            rendered += [f"{k}={self.value(v)}" for k, v in kwargs.items]
        elif kwargs.items:
            rendered.append(f"**{self.value(kwargs)}")
        return f"{fn}({', '.join(rendered)})"

    def value(self, tree: Any) -> str:
        kind = type(tree)
        if kind is Ref:
            return self.names.get(tree.name) or self.local(tree.name)
        if kind is _Raw:
            return tree.text
        if kind is tuple:
            inner = ", ".join(self.value(x) for x in tree)
            return f"({inner},)" if len(tree) == 1 else f"({inner})"
        if kind is IList:
            return "[" + ", ".join(self.value(x) for x in tree.items) + "]"
        if kind is IDict:
            pairs = ", ".join(f"{self.value(k)}: {self.value(v)}" for k, v in tree.items)
            return "{" + pairs + "}"
        if kind is ISlice:
            parts = (tree.start, tree.stop, tree.step)
            return f"slice({', '.join(self.value(x) for x in parts)})"
        if kind in _SIMPLE_LITERALS or (kind is float and math.isfinite(tree)):
            return repr(tree)
        return self.constant(tree)

    def constant(self, obj: Any) -> str:
        name = self.constant_names.get(id(obj))
        if name is None:
            name = f"_c{len(self.constant_names)}"
            self.constant_names[id(obj)] = name
            self.globals[name] = obj
        return name

    def local(self, name: str) -> str:
        found = self.names.get(name)
        if found is None:
            usable = name.isidentifier() and not iskeyword(name) and not name.startswith("_")
            found = name if usable and name not in _TAKEN else f"_v{len(self.names)}"
            self.names[name] = found
        return found


def _is_subscript(node: Node) -> bool:
    """Whether ``node`` is ``operator.getitem(value, index)`` of a node's value."""
    return (
        ops.is_getitem(node.target)
        and len(node.args) == 2
        and type(node.args[0]) is Ref
        and not node.kwargs.items
    )


def _step(part: str) -> str:
    """One step of a module path: a child in ``_modules``, or a module held in ``__dict__``."""
    if part.startswith(HELD):
        return f".__dict__[{part.removeprefix(HELD)!r}]"
    return f".{MODULE_TABLE}[{part!r}]"


class _NotStatic(Exception):
    """A pytree call whose result ``_Emitter.tree_call`` cannot spell statically."""


class _Raw:
    """Source text to splice into an argument list as it is."""

    def __init__(self, text: str) -> None:
        self.text = text


_TAKEN = frozenset({"self", "call_direct", "getattr", "slice"})
