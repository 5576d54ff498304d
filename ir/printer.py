"""A deterministic, readable, diffable text form of a ``Program``.

Nothing here depends on hash order or object identity, so two equal Programs print the same text
in any process. The text is complete: ``ir.parse_program`` reads it back into an equal Program
(``ir/parser.py``), except for what only exists as an object (tensors and script objects are
printed as descriptions; the parser takes them from a reference program or makes placeholder
tensors of the printed shape and dtype).

Symbolic sizes print as their expressions (``# float32[s26, 4]``, ``# float32[4*s26]``), and the
symbols are listed once, before the modules: the range constraints as ``s26 in [2, 8]  #
hint=2`` (the range, then the symbol's value in the example, which a val needs), and under
``symbols:`` any other symbol a val names. The parser makes a shape env of those symbols, so
the parsed vals are symbolic again, with the same expressions, hints and ranges.

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
from ir.torch_seam import size_symbols


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
    written (an opaque object, a sparse tensor, a size of no hint or of an expression
    :func:`format_size` cannot write).

    A tensor prints as ``DTYPE[SIZES]`` (``float32[2, 3]``, ``int64[()]`` for a scalar),
    followed by ``(stride=(...), device='...')`` where its strides are not the contiguous ones
    or its device is not the CPU. A symbolic size prints as its expression (``float32[s26,
    4]``, ``float32[4*s26]``: :func:`format_size`), and ``format_program`` lists each symbol
    with its range and hint, so the parse is symbolic again. ``int``/``float``/``bool``/
    ``str``/``None`` print as Python literals, a ``SymInt`` as its expression, a ``SymFloat``
    or ``SymBool`` as its hint; tuples and lists as tuples and lists of vals.

    Laws: ``parser.parse_val(format_val(v))`` has ``v``'s structure and, for each tensor, its
    dtype, sizes (their expressions and hints), strides and device. Complexity: O(size of the
    val).
    """
    if isinstance(val, torch.Tensor):
        if val.layout != torch.strided:
            return None
        sizes = [format_size(d) for d in val.shape]
        strides = [format_size(d) for d in val.stride()]
        if None in sizes or None in strides:
            return None
        text = f"{str(val.dtype).removeprefix('torch.')}[{', '.join(sizes) or '()'}]"  # type: ignore[arg-type]
        extra = []
        if strides != [format_size(d) for d in contiguous_strides(tuple(val.shape))]:
            extra.append(f"stride={_tuple_text(strides)}")  # type: ignore[arg-type]
        if val.device.type != "cpu":
            extra.append(f"device={str(val.device)!r}")
        return text + (f"({', '.join(extra)})" if extra else "")
    if isinstance(val, torch.SymInt):
        return format_size(val)
    if isinstance(val, (torch.SymFloat, torch.SymBool)):
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
        return _tuple_text(inner)  # type: ignore[arg-type]
    return None


def _tuple_text(items: Sequence[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"


SIZE_FUNCTIONS = frozenset({"FloorDiv", "Mod", "Min", "Max"})
"""The functions of symbolic sizes the text writes by name (``Min(4, s26)``, ``Mod(s26, 2)``;
``FloorDiv`` prints as ``(s26//2)``), beside ``+``, ``-``, ``*`` and ``**``."""


def format_size(d: Any) -> str | None:
    """A size (or stride) as text: an ``int`` as itself; a ``SymInt`` as its expression in its
    symbols (``s26``, ``4*s26``, ``Min(4, s26)``, ``(s26//2)``; as itself where it is a
    number); ``None`` for a ``SymInt`` without a hint (an unbacked size) or whose expression
    is not one the parser reads (sums, products, integer powers, :data:`SIZE_FUNCTIONS` of
    integers and backed size symbols). Laws: the parser evaluates the text, in a shape env of
    the same symbols, to a ``SymInt`` of the same expression and hint. O(size of the
    expression)."""
    if not isinstance(d, torch.SymInt):
        return str(int(d))
    expr = d.node.expr
    if expr.is_number:
        return str(int(expr))
    if d.node.hint is None or not _writable(expr):
        return None
    return str(expr)


def _writable(expr: Any) -> bool:
    if expr.is_Integer:
        return True
    if expr.is_Symbol:
        return str(expr)[:1] == "s" and str(expr)[1:].isdigit()
    kind = type(expr).__name__
    if kind == "Pow":
        base, power = expr.args
        return power.is_Integer and int(power) > 0 and _writable(base)
    if kind in ("Add", "Mul") or kind in SIZE_FUNCTIONS:
        return all(_writable(a) for a in expr.args)
    return False


def contiguous_strides(sizes: Sequence[Any]) -> tuple[Any, ...]:
    """The strides of a contiguous tensor of ``sizes`` (as ``torch.empty(sizes).stride()``);
    a symbolic size counts as itself (a size symbol is at least 2), so no guard is asked."""
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step = step * (n if isinstance(n, torch.SymInt) else max(n, 1))
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


def format_graph(graph: Graph, indent: str = "", *, vals: bool = False,
                 lines: NodeLines | None = None) -> str:
    """Every node of ``graph``, one line each (with its val when ``vals``: :func:`format_node`).
    ``lines``: a :class:`NodeLines` memo to read and fill (programs that share nodes print
    them once)."""
    line = format_node if lines is None else lines.line
    return "\n".join(indent + line(n, vals=vals) for n in graph.nodes)


class NodeLines:
    """A memo of :func:`format_node` lines by node object, for printing several programs that
    share nodes (a pass's two results share every node it did not change): each shared node is
    formatted once. A node's line is a function of the node alone (it is immutable), so the
    memo changes no text; it holds the nodes it saw (an id is never reused while the memo
    lives). Make one per comparison and drop it. O(1) a node after its first line."""

    def __init__(self) -> None:
        self._lines: dict[tuple[int, bool], tuple[Node, str]] = {}

    def line(self, node: Node, *, vals: bool = False) -> str:
        """:func:`format_node` ``(node, vals=vals)``, formatted once per node object."""
        key = (id(node), vals)
        kept = self._lines.get(key)
        if kept is None:
            kept = self._lines[key] = (node, format_node(node, vals=vals))
        return kept[1]


def format_program(program: Program, *, vals: bool = True, lines: NodeLines | None = None) -> str:
    """The whole Program: signature, state, then each module once, in tree order.

    Parameters:
        program: the Program to print.
        vals: end every node line that has a printable ``meta["val"]`` in it
            (:func:`format_node`), the default, so that ``parse_program`` gives a program whose
            nodes carry vals again: one that ``lower`` and the laws
            (``lowering.pass_laws.check_program``) run; a counterexample prints this way. ``False``
            prints the structure alone (what Before/Expected tests compare).
        lines: a :class:`NodeLines` memo shared with other calls: a node it has seen is not
            formatted again (the same text; the determinism law prints a pass's two results,
            which share the nodes it did not change).

    Returns:
        The text, one line per input, output, state slot, module and node.

    **Laws:** ``parse_program(format_program(p))`` has, at every node whose val prints, a val of
    the same structure, dtype, sizes (symbolic ones: the same expressions of symbols of the
    same names, hints and ranges), strides and device, the same range constraints (by name and
    bounds), and ``check_program`` accepts it; ``format_program`` of it is the same text;
    ``parse_program(format_program(p), like=p) == p``; ``format_program(p, vals=False)`` is
    ``format_program(p)`` with each ``  # VAL`` and ``  # hint=N`` comment and the
    ``symbols:`` section (symbols only vals name) removed.

    Complexity: O(size of the program and of its vals).
    """
    text = ["program:"]
    text.append("  inputs:")
    for s in program.signature.inputs:
        persistent = "" if s.persistent is None else f" persistent={s.persistent}"
        text.append(f"    %{s.name}: {s.kind}" + (f" {s.target}" if s.target else "") + persistent)
    text.append("  outputs:")
    for s in program.signature.outputs:
        if s.name is None:
            name = "<literal>"
        else:
            name = f"%{s.name}" if s.name else "<literal name=''>"
        text.append(f"    {name}: {s.kind}" + (f" {s.target}" if s.target else ""))
    text.append("  state:")
    for fqn in program.state_order:
        slot = program.state[fqn]
        value = program.tensors[slot.tensor]
        alias = "" if slot.tensor == fqn else f" = {slot.tensor}"
        flags = (" non-persistent" if not slot.persistent else "") + (
            " requires_grad" if slot.requires_grad else ""
        )
        text.append(f"    {fqn}: {slot.kind} {value!r}{alias}{flags}")
    text.extend(_unused_tensor_lines(program))
    if program.call_signatures:
        text.append("  preserved calls:")
        for name in sorted(program.call_signatures):
            text.extend(_call_signature_lines(name, program.call_signatures[name]))
    if program.call_order != ("",):
        text.append(f"  call order: {program.call_order!r}")
    text.extend(_symbol_lines(program, vals))
    for path, mid in program.walk():
        shown, first = path or "<root>", program.first_path(mid)
        if first != path:
            text.append(f"  module {shown}: same object as {first or '<root>'}")
            continue
        mod = program.module_table()[mid]
        text.append(f"  module {shown}: {mod.type_name or '?'} [{mod.kind}] id={mid!r}")
        for name, peer in mod.peers:
            text.append(f"    peer {name}: id={peer!r}")
        for i, graph in enumerate(mod.graphs):
            text.append(f"    graph {i}:")
            text.append(format_graph(graph, "      ", vals=vals, lines=lines))
    return "\n".join(text)


def _symbol_lines(program: Program, vals: bool) -> list[str]:
    """The range constraints, ``s26 in [3, 9]  # hint=3`` each (:func:`format_symbol`; the
    hint, like a val, with ``vals`` only), then with ``vals`` the symbols the vals' sizes name
    that are not constrained (``symbols:``), each with its range and hint in the vals' shape
    env. Constraints the text cannot spell (a key that is not a size symbol, a bound that is
    not an integer) print as ``range constraints: N (opaque)``, as before symbols were
    written: the parser then takes them from ``like``."""
    seen = val_symbols(program) if vals else {}
    constraints = program.range_constraints.value or {}
    lines = []
    if constraints:
        items = [format_symbol(str(k), seen.get(str(k), (None,))[0], v.lower, v.upper)
                 for k, v in constraints.items()]
        if all(items) and all(getattr(k, "is_Symbol", False) for k in constraints):
            lines += ["  range constraints:"] + [f"    {x}" for x in sorted(items, key=_by_name)]
        else:
            lines.append(f"  range constraints: {len(constraints)} (opaque)")
    named = {str(k) for k in constraints}
    rest = [format_symbol(name, *found) for name, found in seen.items() if name not in named]
    if rest:
        lines += ["  symbols:"] + [f"    {x}" for x in sorted(rest, key=_by_name)]  # type: ignore[arg-type]
    return lines


def _by_name(item: str | None) -> tuple:
    name = (item or "").split(" ", 1)[0]
    return (name[:1], int(name[1:]) if name[1:].isdigit() else -1, name)


def format_symbol(name: str, hint: int | None, low: Any, high: Any) -> str | None:
    """One symbol of a program's sizes: ``s26 in [3, 9]  # hint=3`` (its range, then its
    value in the example as a comment, as a node's val is one; left out where it has none or
    is not asked for; an unbounded end is ``int_oo`` / ``-int_oo``, as torch prints it);
    ``None`` where a bound is not an integer or infinity."""
    ends = [_bound_text(b) for b in (low, high)]
    if None in ends:
        return None
    return f"{name} in [{ends[0]}, {ends[1]}]" + ("" if hint is None else f"  # hint={hint}")


def _bound_text(bound: Any) -> str | None:
    text = str(bound)
    if text in ("int_oo", "-int_oo"):
        return text
    try:
        return str(int(text))
    except ValueError:
        return None


def val_symbols(program: Program) -> dict[str, tuple[int | None, Any, Any]]:
    """Every size symbol the printable vals of ``program``'s nodes name (tensor sizes and
    strides, ``SymInt`` vals, through tuples and lists; a val :func:`format_val` cannot write
    is left out): name -> ``(hint, low, high)`` in the vals'
    shape env (``ir.torch_seam.size_symbols``). O(size of the vals)."""
    found: dict[str, tuple[int | None, Any, Any]] = {}

    def visit(val: Any, into: dict) -> None:
        if isinstance(val, torch.Tensor):
            if val.layout == torch.strided:
                for d in (*val.shape, *val.stride()):
                    if isinstance(d, torch.SymInt):
                        into.update(size_symbols(d))
        elif isinstance(val, torch.SymInt):
            into.update(size_symbols(val))
        elif type(val) in (tuple, list):
            for v in val:
                visit(v, into)

    for _, mid in program.walk():
        for graph in program.module_table()[mid].graphs:
            for node in graph.nodes:
                if "val" not in node.meta:
                    continue
                named: dict[str, tuple[int | None, Any, Any]] = {}
                visit(node.meta["val"], named)
                # a val's symbols count where the val prints (asked only of vals with one)
                if named and format_val(node.meta["val"]) is not None:
                    found.update(named)
    return found


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
