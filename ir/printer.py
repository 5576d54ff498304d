"""A deterministic, readable, diffable text form of a ``Program``.

Nothing here depends on hash order or object identity, so two equal Programs print the same text
in any process.
"""

from __future__ import annotations

from typing import Any

from ir.args import IDict, IList, ISlice, Ref
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
    if callable(tree) and not isinstance(tree, type):
        return target_name(tree)
    return repr(tree)


def format_node(node: Node) -> str:
    """One line for one node, e.g. ``%y = call_function[aten.relu.default](%x)``."""
    if node.op == OUTPUT:
        return f"return {format_arg(node.args[0] if node.args else None)}"
    if node.op == PLACEHOLDER:
        return f"%{node.name} = placeholder"
    parts = [format_arg(a) for a in node.args]
    parts += [f"{k}={format_arg(v)}" for k, v in node.kwargs.items]
    return f"%{node.name} = {node.op}[{target_name(node.target)}]({', '.join(parts)})"


def format_graph(graph: Graph, indent: str = "") -> str:
    """Every node of ``graph``, one line each."""
    return "\n".join(indent + format_node(n) for n in graph.nodes)


def format_program(program: Program) -> str:
    """The whole Program: signature, state, then each module once, in tree order."""
    lines = ["program:"]
    lines.append("  inputs:")
    for s in program.signature.inputs:
        lines.append(f"    %{s.name}: {s.kind}" + (f" {s.target}" if s.target else ""))
    lines.append("  outputs:")
    for s in program.signature.outputs:
        name = f"%{s.name}" if s.name else "<literal>"
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
    if program.call_signatures:
        lines.append("  preserved calls:")
        for name in sorted(program.call_signatures):
            sig = program.call_signatures[name]
            ins = ", ".join(a.name or repr(a.value) for a in sig.inputs)
            outs = ", ".join(a.name or repr(a.value) for a in sig.outputs)
            lines.append(f"    {name!r}: ({ins}) -> ({outs})")
    seen: dict[str, str] = {}
    for path, mid in program.walk():
        shown = path or "<root>"
        if mid in seen:
            lines.append(f"  module {shown}: same object as {seen[mid] or '<root>'}")
            continue
        seen[mid] = path
        mod = program.module_table()[mid]
        lines.append(f"  module {shown}: {mod.type_name or '?'} [{mod.kind}] id={mid!r}")
        for i, graph in enumerate(mod.graphs):
            lines.append(f"    graph {i}:")
            lines.append(format_graph(graph, "      "))
    return "\n".join(lines)


def format_tree(program: Program) -> str:
    """The module tree, one line per path: type, node count, and which paths are one object."""
    lines = []
    first: dict[str, str] = {}
    for path, mid in program.walk():
        depth = path.count(".") + 1 if path else 0
        name = path.rsplit(".", 1)[-1] if path else "<root>"
        mod = program.module_table()[mid]
        short = (mod.type_name or mod.kind).rsplit(".", 1)[-1]
        if mid in first:
            lines.append(f"{'  ' * depth}{name}: {short} (same object as {first[mid] or '<root>'})")
            continue
        first[mid] = path
        nodes = sum(len(g) for g in mod.graphs)
        graphs = f", {len(mod.graphs)} call graphs" if len(mod.graphs) > 1 else ""
        body = f"{nodes} nodes{graphs}" if mod.graphs else "no graph"
        lines.append(f"{'  ' * depth}{name}: {short} [{body}]")
    return "\n".join(lines)
