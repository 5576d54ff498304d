"""Checks on an ``ExportedProgram``'s raw parts, run by ``import_ep`` before it builds anything.

torch builds an ``ExportedProgram`` from whatever it is given (a deserialized file, a program
edited by hand) and trusts it later; purefx checks each part once, at import, so that a malformed
program fails there with an ``UnsupportedProgramError`` naming the node, spec, entry or state
fqn, never later with a raw ``KeyError`` or a silent wrong answer.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import re
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx
from torch.export import graph_signature as gs

from ir import ops
from ir.errors import UnsupportedProgramError
from ir.module_names import all_attribute_names, check_path, first_path_fault
from ir.node import (
    CALL_FUNCTION,
    CALL_METHOD,
    CALL_MODULE,
    GET_ATTR,
    OPS,
    OUTPUT,
    PLACEHOLDER,
    Node,
)
from ir.torch_seam import pytree

_KEYWORDS = frozenset(keyword.kwlist)  # what ``keyword.iskeyword`` tests, without the call
_CALL_NAME = re.compile(r"[^.@]+(\.[^.@]+)*(@[0-9]+)?")
_EXPORTED_OPS = (PLACEHOLDER, GET_ATTR, CALL_FUNCTION, OUTPUT)
_NOT_EXPORTED = frozenset(OPS) - frozenset(_EXPORTED_OPS)
_TARGET_OPS = {PLACEHOLDER: "a name", GET_ATTR: "a dotted attribute path", CALL_MODULE: "a path",
               CALL_METHOD: "a method name", OUTPUT: "a name"}


def check_node(
    node: torch.fx.Node,
    args: Any,
    kwargs: Any,
    *,
    exported: bool = True,
    accepted: set[Any] | None = None,
) -> None:
    """``node`` has a known op, an identifier for a name, a target of the kind its op needs and
    an ``nn_module_stack`` (if any) of ``key -> (path, type)`` string entries; a placeholder has
    no default value (a plain GraphModule, ``exported=False``, may give it one constant).
    ``args`` and ``kwargs`` are ``node.args`` and ``node.kwargs`` as the caller read them (fx
    reads each through a Python property).

    ``accepted`` (the caller's, for one graph) remembers each ``(op, target, argument count,
    keyword names)`` found valid, the target by identity (hashing an operator runs Python code;
    the graph keeps its targets alive while the set is in use), so a target called the same way
    again is not checked again: its verdict depends on nothing else. A placeholder without
    arguments whose target is a non-empty string is valid as it is. O(arguments + stack depth);
    O(1 + stack depth) when the layout was accepted before."""
    name = node.name
    if type(name) is not str or not name.isidentifier() or name in _KEYWORDS:
        raise UnsupportedProgramError(f"node {name!r} has a name that is not a Python identifier")
    op = node.op
    if op == PLACEHOLDER:  # its verdict reads its defaults: checked unless it plainly has none
        target = node.target
        if args or kwargs or type(target) is not str or not target:
            _check_op_and_target(node, exported)
    elif accepted is None:
        _check_op_and_target(node, exported)
    else:
        layout = (op, id(node.target), len(args), tuple(kwargs))
        try:
            known: bool | None = layout in accepted
        except TypeError:  # an unhashable op: checked at each node
            known = None
        if not known:
            _check_op_and_target(node, exported)
            if known is False:
                accepted.add(layout)
    _check_module_stack(node)


def _check_op_and_target(node: torch.fx.Node, exported: bool) -> None:
    where = f"node {node.name!r}"
    if node.op not in OPS:
        raise UnsupportedProgramError(f"{where} has unknown op {node.op!r}; expected one of {OPS}")
    if exported and node.op in _NOT_EXPORTED:
        raise UnsupportedProgramError(
            f"{where} is a {node.op} node ({node.target!r}), which export IR never holds (only "
            f"{', '.join(_EXPORTED_OPS)}); the program was edited or is not a torch.export "
            "program: export the model again, or import an fx GraphModule with "
            "ir.import_graph_module"
        )
    if node.op == PLACEHOLDER and (node.kwargs or node.args and (
        exported or len(node.args) > 1 or isinstance(node.args[0], torch.fx.Node)
    )):
        raise UnsupportedProgramError(
            f"placeholder {node.name!r} has a default value {node.args!r}; exported programs "
            "have none"
        )
    target = node.target
    if node.op == CALL_FUNCTION:
        if isinstance(target, str) or not callable(target):
            raise UnsupportedProgramError(
                f"{where} (call_function) has target {target!r}, which is not a callable"
            )
        _check_call_arguments(node)
    elif (
        not isinstance(target, str)
        or not target
        or (node.op == GET_ATTR and not all(_path_part(p) for p in target.split(".")))
        or (node.op == CALL_METHOD and not target.isidentifier())
    ):
        raise UnsupportedProgramError(
            f"{where} ({node.op}) has target {target!r}; it must be {_TARGET_OPS[node.op]}"
        )


def _path_part(part: str) -> bool:
    """One step of an attribute path: a name, or a container index (``layers.0.bias``)."""
    return part.isidentifier() or (part.isdigit() and part.isascii())


def _check_call_arguments(node: torch.fx.Node) -> None:
    """An operator gets the arguments its schema lists (no more positional ones, only keywords it
    names, every one without a default); another function, what its signature binds."""
    target = node.target
    kind = ops.facts(target).kind
    if kind == ops.HOP:
        return
    if kind == ops.OVERLOAD:
        if ops.normalized_args(target, node.args, node.kwargs) is None:
            raise UnsupportedProgramError(
                f"node {node.name!r} passes {len(node.args)} positional arguments and keywords "
                f"{sorted(node.kwargs)} to {target}, whose schema is {ops.facts(target).schema}"
            )
        return
    try:
        signature = _signature(target)
    except TypeError:  # unhashable: look it up uncached
        signature = _signature.__wrapped__(target)
    if signature is None:  # a builtin without a text signature: nothing to check
        return
    try:
        signature.bind(*node.args, **node.kwargs)
    except TypeError as err:
        raise UnsupportedProgramError(
            f"node {node.name!r} calls {getattr(target, '__name__', target)} with arguments it "
            f"does not take ({err})"
        ) from None


@functools.lru_cache(maxsize=4096)
def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _check_module_stack(node: torch.fx.Node) -> None:
    stack = node.meta.get("nn_module_stack")
    if stack is None:
        return
    if type(stack) is dict:  # the common case, checked in one loop; what follows names the fault
        for key, entry in stack.items():
            if not (type(key) is str and type(entry) is tuple and len(entry) == 2
                    and type(entry[0]) is str
                    and (type(entry[1]) is str or isinstance(entry[1], type))):
                break
        else:
            return
    bad = f"node {node.name!r} has a malformed nn_module_stack"
    if not isinstance(stack, dict):
        raise UnsupportedProgramError(
            f"{bad}: a {type(stack).__name__}, not a dict of key -> (path, type)"
        )
    for key, entry in stack.items():
        if not isinstance(key, str):
            raise UnsupportedProgramError(f"{bad}: key {key!r} is not a string")
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise UnsupportedProgramError(f"{bad}: entry {key!r} is {entry!r}, not (path, type)")
        path, type_name = entry
        if not isinstance(path, str):
            raise UnsupportedProgramError(f"{bad}: entry {key!r} has path {path!r}, not a string")
        if not isinstance(type_name, (str, type)):
            raise UnsupportedProgramError(
                f"{bad}: entry {key!r} has type {type_name!r}, not a class or its name"
            )


def check_call_graph(
    ep: torch.export.ExportedProgram, state: set[str], root_counts: tuple[int, int]
) -> None:
    """The module call graph starts with the root entry ``""`` (with a signature), names each
    call once, by a module path (``a.b`` or ``a.b@n``) that is not state or inside state, and
    each signature lists arguments whose count matches its pytree specs (the root's: the
    program's user inputs and outputs, ``root_counts``). O(entries + state).

    The names of the common graph (no ``@n`` variant, no fault) are checked in one walk over its
    module paths; any other graph is checked entry by entry, which names the first entry at
    fault."""
    entries = list(ep.module_call_graph)
    if not entries or entries[0].fqn != "" or entries[0].signature is None:
        raise UnsupportedProgramError(
            "the module call graph has no root entry '' with a signature first; the program "
            "cannot be called with checked inputs: re-export it with torch.export.export"
        )
    if not _plain_call_names([entry.fqn for entry in entries], state):
        _check_call_graph_entries(entries, state, root_counts)
        return
    for i, entry in enumerate(entries):
        if entry.signature is not None:
            counts = root_counts if entry.fqn == "" else None
            _check_call_signature(entry.signature, i, entry.fqn, counts)


def _plain_call_names(fqns: list[str], state: set[str]) -> bool:
    """Whether ``fqns`` (the root ``""`` first) are distinct module paths without ``@n``
    variants, each step a name a module can register, none of them state or inside state: then
    ``_check_call_graph_entries`` would find no fault in any name. O(total length)."""
    paths = fqns[1:]
    if not set(map(type, paths)) <= {str} or "@" in ".".join(paths):
        return False  # an entry that is not a string, or a variant: checked entry by entry
    modules, steps = _prefixes_and_steps(paths)
    return all_attribute_names(steps) and len(set(fqns)) == len(fqns) and (
        state.isdisjoint(modules)
    )


def _check_call_graph_entries(
    entries: list[Any], state: set[str], root_counts: tuple[int, int]
) -> None:
    """``check_call_graph``'s checks, entry by entry, in order. O(entries + state)."""
    seen: set[str] = set()
    clear: set[str] = set()
    for i, entry in enumerate(entries):
        fqn = entry.fqn
        where = _entry(i, fqn)
        if not isinstance(fqn, str) or (fqn and not _CALL_NAME.fullmatch(fqn)):
            raise UnsupportedProgramError(f"{where} is not a module path such as 'a.b' or 'a.b@1'")
        if fqn in seen:
            raise UnsupportedProgramError(f"{where} appears twice")
        seen.add(fqn)
        path = fqn.partition("@")[0]
        if path:
            check_path(path, f"{where}: module path", UnsupportedProgramError)
        owner = _outermost_in(path, state, clear)
        if owner is not None:
            raise UnsupportedProgramError(
                f"{where} names {path!r}, but {owner!r} is a parameter, buffer or constant, "
                "not a module"
            )
        if entry.signature is not None:
            _check_call_signature(entry.signature, i, fqn, root_counts if fqn == "" else None)


def _entry(i: int, fqn: Any) -> str:
    """How an error names call graph entry ``i``."""
    return f"module call graph entry {i} ({fqn!r})"


def _outermost_in(path: str, owners: set[str], clear: set[str]) -> str | None:
    """The shortest of ``path`` and its dotted prefixes that is in ``owners``, or None.

    ``clear`` (the caller's, for one ``owners``) collects paths known to have no prefix in
    ``owners``; a walk stops at the first of them, so checking many paths under one module costs
    O(total new prefixes) rather than O(paths x depth)."""
    walked = []
    found = None
    while path and path not in clear:
        if path in owners:
            found = path
        walked.append(path)
        path = path.rpartition(".")[0]
    if found is None:
        clear.update(walked)
    return found


def _prefixes_and_steps(paths: Iterable[str]) -> tuple[set[str], set[str]]:
    """The strings ``paths`` with all their dotted prefixes (``a.b.c`` adds ``a.b`` and ``a``),
    and the steps these are made of (``""`` among them when a path has an empty step). O(total
    length): the walk up from a path stops at a prefix already found, whose steps are in."""
    prefixes: set[str] = set()
    steps: set[str] = set()
    for path in paths:
        while path not in prefixes:
            prefixes.add(path)
            head, dot, step = path.rpartition(".")
            steps.add(step)
            if not dot:
                break
            path = head
    return prefixes, steps


_ARGUMENTS = (
    gs.TensorArgument, gs.SymIntArgument, gs.SymFloatArgument, gs.SymBoolArgument,
    gs.CustomObjArgument, gs.TokenArgument, gs.ConstantArgument,
)


def _check_call_signature(
    sig: Any, index: int, fqn: str, root_counts: tuple[int, int] | None
) -> None:
    """The signature of call graph entry ``index`` (``fqn``) lists arguments and pytree specs,
    and each spec has as many leaves as the entry has arguments (the root: user inputs and
    outputs) on that side. O(arguments)."""
    sides = (("inputs", sig.inputs, sig.in_spec), ("outputs", sig.outputs, sig.out_spec))
    # torch leaves an entry unfilled (no inputs, no outputs) when the module's calls are not in
    # the top graph (inside an autocast or set-grad body): its specs describe eager calls only.
    unfilled = root_counts is None and not sig.inputs and not sig.outputs
    for i, (side, args, spec) in enumerate(sides):
        if not isinstance(args, (list, tuple)) or any(not isinstance(a, _ARGUMENTS) for a in args):
            raise UnsupportedProgramError(
                f"{_entry(index, fqn)} has {side} {args!r}, not a list of arguments"
            )
        if not isinstance(spec, pytree.TreeSpec):
            raise UnsupportedProgramError(
                f"{_entry(index, fqn)} has {side} spec {spec!r}, not a pytree spec"
            )
        count = len(args) if root_counts is None else root_counts[i]
        if spec.num_leaves != count and not unfilled:
            raise UnsupportedProgramError(
                f"{_entry(index, fqn)}: its {side} spec has {spec.num_leaves} leaves but the "
                f"program has {count} {side} there"
            )


def check_state_fqns(fqns: list[str]) -> None:
    """Every state fqn is a dotted path of names an ``nn.Module`` can register (not ``forward``,
    ``training``, ... : ``ir.module_names``), and none lies inside another (a tensor cannot hold
    attributes). O(total length).

    Fault-free fqns (the common case) are recognized by one walk over the modules that hold
    state; otherwise the fqns are checked in order, which names the first at fault."""
    if _plain_state_fqns(fqns):
        return
    bad = first_path_fault(fqns)
    known = set(fqns)
    clear: set[str] = set()
    if bad is not None and type(bad[0]) is str and bad[0] and "" not in bad[0].split("."):
        check_path(bad[0], "state", UnsupportedProgramError)
    for fqn in fqns:
        if not isinstance(fqn, str) or not fqn or "" in fqn.split("."):
            raise UnsupportedProgramError(f"state fqn {fqn!r} is not a dotted attribute path")
        owner = _outermost_in(fqn.rpartition(".")[0], known, clear)
        if owner is not None:
            raise UnsupportedProgramError(
                f"state {fqn!r} lies inside state {owner!r}, which is a tensor, not a module"
            )


def _plain_state_fqns(fqns: list[str]) -> bool:
    """Whether ``fqns`` are strings whose steps a module can register, none of them among the
    paths of the modules that hold state: then ``check_state_fqns`` finds no fault. O(total
    length)."""
    if not set(map(type, fqns)) <= {str}:
        return False
    parts = [fqn.rpartition(".") for fqn in fqns]
    holders, steps = _prefixes_and_steps({owner for owner, dot, _ in parts if dot})
    steps.update([name for _, _, name in parts])
    return all_attribute_names(steps) and set(fqns).isdisjoint(holders)


def check_state_value(fqn: str, value: Any, kind: str, placeholder: Node | None) -> None:
    """A parameter, buffer or constant tensor holds a tensor of the shape and dtype its
    placeholder (the imported root graph's node, or None) was traced with (when static); a
    custom object holds no tensor. O(dimensions)."""
    if kind == "custom_obj":
        if isinstance(value, torch.Tensor):
            raise UnsupportedProgramError(f"{kind} {fqn!r} holds a tensor, not a custom object")
        return
    if not isinstance(value, torch.Tensor):
        raise UnsupportedProgramError(
            f"{kind} {fqn!r} holds a {type(value).__name__}, not a tensor; the program is corrupt"
        )
    traced = placeholder.meta.get("val") if placeholder is not None else None
    if not isinstance(traced, torch.Tensor):
        return
    shape = traced.shape
    if _static(shape) and value.shape != shape:
        raise UnsupportedProgramError(
            f"{kind} {fqn!r} has shape {tuple(value.shape)}, but its placeholder "
            f"{placeholder.name!r} was traced with shape {tuple(shape)}"
        )
    if value.dtype != traced.dtype:
        raise UnsupportedProgramError(
            f"{kind} {fqn!r} has dtype {value.dtype}, but its placeholder {placeholder.name!r} "
            f"was traced with {traced.dtype}"
        )


def _static(shape: torch.Size) -> bool:
    """Whether every dimension of ``shape`` is a plain ``int`` (comparing a symbolic one would
    add a guard to its shape environment). A loop, not ``all`` over a generator: this runs once
    per state tensor."""
    for d in shape:
        if type(d) is not int:
            return False
    return True
