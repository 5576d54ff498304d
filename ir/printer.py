"""A deterministic, readable, diffable text form of a ``Program``.

Nothing here depends on hash order or object identity, so two equal Programs print the same text
in any process. The text is complete: ``ir.parse_program`` reads it back into an equal Program
(``ir/parser.py``), except for what only exists as an object (tensors, script objects and range
constraints are printed as descriptions; the parser takes them from a reference program or
makes placeholder tensors of the printed shape and dtype).

``format_program(p)`` ends each node line in its ``meta["val"]`` (:func:`format_val`), e.g.
``%y = call_function[aten.relu.default](%x)  # float32[2, 3]``, and the parser gives each node
that val back, so a printed program is one that runs (``lower``, the laws) once parsed: a
counterexample printed by a law replays. ``format_program(p, vals=False)`` leaves the vals out:
the structure alone, which is what Before/Expected tests compare (``==`` on Programs ignores
meta too). ``format_graph`` and ``format_node`` print fragments, which no parser reads back, and
leave vals out unless asked (``vals=True``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ir.args import IDict, IList, ISlice, Ref
from ir.fake_run import hint
from ir.graph import Graph
from ir.names import target_name
from ir.node import OUTPUT, PLACEHOLDER, Node
from ir.program import Program


def format_arg(tree: Any) -> str:
    """Render an argument tree: ``%name`` for refs, ``[...]`` lists, ``(...)`` tuples."""
    if type(tree) is Ref:
        return f"%{tree.name}"
    if type(tree) is tuple:
        inner = ", ".join(format_arg(x) for x in tree)
        return f"({inner},)" if len(tree) == 1 else f"({inner})"
    if type(tree) is IList:
        return "[" + ", ".join(format_arg(x) for x in tree.items) + "]"
    if type(tree) is IDict:
        return "{" + ", ".join(f"{k!r}: {format_arg(v)}" for k, v in tree.items) + "}"
    if type(tree) is ISlice:
        return f"slice({format_arg(tree.start)}, {format_arg(tree.stop)}, {format_arg(tree.step)})"
    if _is_spec(tree):
        return format_spec(tree)
    if callable(tree) and not isinstance(tree, type):
        return target_name(tree)
    return repr(tree)


def _is_spec(value: Any) -> bool:
    return type(value).__name__ in ("TreeSpec", "LeafSpec") and hasattr(value, "is_leaf")


def format_spec(spec: Any) -> str:
    """A pytree spec as ``leaf`` or ``tree(TYPE, [CHILDREN], CONTEXT)`` (context left out when it
    is ``None``), e.g. ``tree(tuple, [leaf, tree(dict, [leaf], ['a'])])``; ``None`` for none."""
    if spec is None:
        return "None"
    if spec.is_leaf():
        return "leaf"
    children = ", ".join(format_spec(c) for c in spec.children())
    context = "" if spec.context is None else f", {_format_context(spec.context)}"
    return f"tree({_type_name(spec.type)}, [{children}]{context})"


def _type_name(kind: type) -> str:
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _format_context(context: Any) -> str:
    if isinstance(context, type):
        return _type_name(context)
    return repr(context)


def format_arg_spec(arg: Any) -> str:
    """One flat input/output of a preserved call: ``%x`` for a named tensor, else
    ``KIND(%name)``, ``KIND(value=V)`` or ``KIND(%name, value=V)`` (``name='...'`` for a name
    that is not an identifier, such as torch's empty name of a constant)."""
    named = arg.name is not None and arg.name.isidentifier()
    if arg.kind == "tensor" and named and arg.value is None:
        return f"%{arg.name}"
    parts = [f"%{arg.name}"] if named else [] if arg.name is None else [f"name={arg.name!r}"]
    if arg.value is not None:
        parts.append(f"value={format_arg(arg.value)}")
    return f"{arg.kind}({', '.join(parts)})"


def format_val(val: Any) -> str | None:
    """A node's ``meta["val"]`` as text the parser reads back, or ``None`` where it cannot be
    written (an opaque object, a sparse tensor).

    A tensor prints as ``DTYPE[SIZES]`` (``float32[2, 3]``, ``int64[()]`` for a scalar),
    followed by ``(stride=(...), device='...')`` where its strides are not the contiguous ones
    or its device is not the CPU; a symbolic size prints as its hint (the parse is static).
    ``int``/``float``/``bool``/``str``/``None`` print as Python literals (a symbolic one as its
    hint), tuples and lists as tuples and lists of vals.

    Laws: ``parser.parse_val(format_val(v))`` has ``v``'s structure and, for each tensor, its
    dtype, sizes (hints), strides and device. Complexity: O(size of the val).
    """
    if isinstance(val, torch.Tensor):
        if val.layout != torch.strided:
            return None
        sizes = tuple(hint(d) for d in val.shape)
        strides = tuple(hint(d) for d in val.stride())
        if None in sizes or None in strides:
            return None
        text = f"{str(val.dtype).removeprefix('torch.')}[{', '.join(map(str, sizes)) or '()'}]"
        extra = []
        if strides != contiguous_strides(sizes):
            extra.append(f"stride={strides!r}")
        if val.device.type != "cpu":
            extra.append(f"device={str(val.device)!r}")
        return text + (f"({', '.join(extra)})" if extra else "")
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        found = hint(val)
        return None if found is None else repr(found)
    if val is None or type(val) in (int, float, bool, str):
        return repr(val)
    if type(val) in (tuple, list):
        inner = [format_val(v) for v in val]
        if any(x is None for x in inner):
            return None
        if type(val) is list:
            return "[" + ", ".join(inner) + "]"  # type: ignore[arg-type]
        return f"({inner[0]},)" if len(inner) == 1 else "(" + ", ".join(inner) + ")"  # type: ignore[arg-type]
    return None


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``sizes`` (as ``torch.empty(sizes).stride()``)."""
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def format_node(node: Node, *, vals: bool = False) -> str:
    """One line for one node, e.g. ``%y = call_function[aten.relu.default](%x)``; with
    ``vals``, followed by ``  # VAL`` (:func:`format_val`) where the node has a printable
    ``meta["val"]``."""
    line = _node_line(node)
    if vals and "val" in node.meta:
        text = format_val(node.meta["val"])
        if text is not None:
            line += f"  # {text}"
    return line


def _node_line(node: Node) -> str:
    plain = len(node.args) == 1 and not node.kwargs.items
    if node.op == OUTPUT and node.target == "output" and plain:
        shown = "" if node.name == "output" else f"[{node.name}]"
        return f"return{shown} {format_arg(node.args[0])}"
    bare = not node.args and not node.kwargs.items
    if node.op == PLACEHOLDER and node.target == node.name and bare:
        return f"%{node.name} = placeholder"
    parts = [format_arg(a) for a in node.args]
    parts += [f"{k}={format_arg(v)}" for k, v in node.kwargs.items]
    return f"%{node.name} = {node.op}[{target_name(node.target)}]({', '.join(parts)})"


def format_graph(graph: Graph, indent: str = "", *, vals: bool = False) -> str:
    """Every node of ``graph``, one line each (with its val when ``vals``: :func:`format_node`)."""
    return "\n".join(indent + format_node(n, vals=vals) for n in graph.nodes)


def format_program(program: Program, *, vals: bool = True) -> str:
    """The whole Program: signature, state, then each module once, in tree order.

    Parameters:
        program: the Program to print.
        vals: end every node line that has a printable ``meta["val"]`` in it
            (:func:`format_node`), the default, so that ``parse_program`` gives a program whose
            nodes carry vals again: one that ``lower`` and the laws
            (``lowering.pass_laws.check_program``) run; a counterexample prints this way. ``False``
            prints the structure alone (what Before/Expected tests compare).

    Returns:
        The text, one line per input, output, state slot, module and node.

    **Laws:** ``parse_program(format_program(p))`` has, at every node whose val prints, a val of
    the same structure, dtype, sizes (hints), strides and device, and ``check_program`` accepts
    it; ``parse_program(format_program(p), like=p) == p``; ``format_program(p, vals=False)`` is
    ``format_program(p)`` with each ``  # VAL`` comment removed.

    Complexity: O(size of the program and of its vals).
    """
    lines = ["program:"]
    lines.append("  inputs:")
    for s in program.signature.inputs:
        persistent = "" if s.persistent is None else f" persistent={s.persistent}"
        lines.append(f"    %{s.name}: {s.kind}" + (f" {s.target}" if s.target else "") + persistent)
    lines.append("  outputs:")
    for s in program.signature.outputs:
        if s.name is None:
            name = "<literal>"
        else:
            name = f"%{s.name}" if s.name else "<literal name=''>"
        lines.append(f"    {name}: {s.kind}" + (f" {s.target}" if s.target else ""))
    lines.append("  state:")
    for fqn in program.state_order:
        slot = program.state[fqn]
        value = program.tensors[slot.tensor]
        alias = "" if slot.tensor == fqn else f" = {slot.tensor}"
        flags = (" non-persistent" if not slot.persistent else "") + (
            " requires_grad" if slot.requires_grad else ""
        )
        lines.append(f"    {fqn}: {slot.kind} {value!r}{alias}{flags}")
    lines.extend(_unused_tensor_lines(program))
    if program.call_signatures:
        lines.append("  preserved calls:")
        for name in sorted(program.call_signatures):
            lines.extend(_call_signature_lines(name, program.call_signatures[name]))
    if program.call_order != ("",):
        lines.append(f"  call order: {program.call_order!r}")
    constraints = program.range_constraints.value
    if constraints:
        lines.append(f"  range constraints: {len(constraints)} (opaque)")
    for path, mid in program.walk():
        shown, first = path or "<root>", program.first_path(mid)
        if first != path:
            lines.append(f"  module {shown}: same object as {first or '<root>'}")
            continue
        mod = program.module_table()[mid]
        lines.append(f"  module {shown}: {mod.type_name or '?'} [{mod.kind}] id={mid!r}")
        for name, peer in mod.peers:
            lines.append(f"    peer {name}: id={peer!r}")
        for i, graph in enumerate(mod.graphs):
            lines.append(f"    graph {i}:")
            lines.append(format_graph(graph, "      ", vals=vals))
    return "\n".join(lines)


def _unused_tensor_lines(program: Program) -> list[str]:
    """The tensor table's entries that no state slot names (none after ``import_ep``)."""
    used = {slot.tensor for slot in program.state.values()}
    unused = sorted(k for k in program.tensors if k not in used)
    if not unused:
        return []
    return ["  unused tensors:"] + [f"    {k}: {program.tensors[k]!r}" for k in unused]


def _call_signature_lines(name: str, sig: Any) -> list[str]:
    lines = [
        f"    {name!r}:",
        f"      inputs: {_arg_specs(sig.inputs)}",
        f"      outputs: {_arg_specs(sig.outputs)}",
        f"      in_spec: {format_spec(sig.in_spec)}",
        f"      out_spec: {format_spec(sig.out_spec)}",
    ]
    if sig.forward_arg_names is not None:
        lines.append(f"      forward_arg_names: {tuple(sig.forward_arg_names)!r}")
    return lines


def _arg_specs(args: tuple) -> str:
    inner = ", ".join(format_arg_spec(a) for a in args)
    return f"({inner},)" if len(args) == 1 else f"({inner})"


def format_tree(program: Program) -> str:
    """The module tree, one line per path: type, node count, and which paths are one object."""
    lines = []
    for path, mid in program.walk():
        depth = path.count(".") + 1 if path else 0
        name = path.rsplit(".", 1)[-1] if path else "<root>"
        mod = program.module_table()[mid]
        short = (mod.type_name or mod.kind).rsplit(".", 1)[-1]
        first = program.first_path(mid)
        if first != path:
            lines.append(f"{'  ' * depth}{name}: {short} (same object as {first or '<root>'})")
            continue
        nodes = sum(len(g) for g in mod.graphs)
        graphs = f", {len(mod.graphs)} call graphs" if len(mod.graphs) > 1 else ""
        body = f"{nodes} nodes{graphs}" if mod.graphs else "no graph"
        lines.append(f"{'  ' * depth}{name}: {short} [{body}]")
    return "\n".join(lines)
