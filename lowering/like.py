"""``programs_like``: the user's own program and variants of it, for testing a pass on one's model.

:func:`programs_like` draws :class:`LikeExample` s: a Program, the inputs to run it on, and a
line saying which variant it is. The first draw is the source itself on the inputs
``program_inputs`` gives it; every later draw switches variants on, each a draw that shrinks to
off, so a failure is reported on the variant nearest the source that still fails:

- **form**: the flat program (``import_ep``), outlined (``transforms.transform``: one graph per
  module call), decomposed (``run_decompositions()``, made once per strategy), or decomposed and
  outlined;
- **sizes**: each dynamic dimension of the export at another size within its range (its
  example size first, then the bounds and their neighbours);
- **edge values**: floating inputs drawn by ``ir.strategies.values.tensors`` (±0.0, ±inf, NaN,
  subnormals, the largest finite, ...); integer inputs keep ``program_inputs``' values
  (``0..9``), since an edge there is usually an index out of range, a failure of the model, not
  of a pass;
- **extra output**: an intermediate value is also returned (a pass that rewires uses by hand
  and forgets the outputs is seen);
- **extra reader**: an intermediate value is also read, last, by a ``neg`` that is returned (a
  pass that assumes one reader, or writes the value in place, is seen);
- **state writes**: each floating or integer buffer that the source does not write is written
  ``before`` its reads (an in-place ``add_`` right after the placeholders, every read then reading
  its result, as export writes in place) or ``after`` them (an ``add`` returned as a
  ``buffer_mutation``, as export writes functionally), by a drawn amount: a pass that reads a
  buffer's value at pass time (a mask of ones) is seen.

Values inside a preserved call are never picked for an extra output or reader, so every
variant keeps the source's preserved signatures as they are.

It sits in ``lowering``, above the pipeline, because two of its forms are made by the layers
below: the outlined form by ``transforms.transform``, the decomposed form of a ``Program`` source
by ``lowering.export_ep`` (then ``run_decompositions()``). ``check_laws`` (``lowering.pass_laws``)
takes its draws as they are.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import attrs
import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ir import ops
from ir import signature as sg
from ir.args import Ref, map_refs
from ir.graph import Graph
from ir.import_ep import import_ep
from ir.names import Names, fresh_name
from ir.node import CALL_FUNCTION, Node
from ir.program import Program
from ir.strategies import values
from ir.strategies.programs import program_inputs
from ir.torch_seam import pytree
from lowering.export import export_ep
from transforms import kernel as kn
from transforms.pipeline import transform

__all__ = ["FORMS", "LikeExample", "programs_like"]

aten = torch.ops.aten

FORMS = ("flat", "outlined", "decomposed", "decomposed+outlined")
"""The forms :func:`programs_like` draws, the first (the shrink target) first."""

_WRITE_AMOUNTS = (0.5, -1.0, 2.0)


@attrs.frozen(eq=False)
class LikeExample:
    """One draw of :func:`programs_like`: ``program``, the ``args`` / ``kwargs`` to call
    ``lower(program)`` with, which ``variant`` of the source it is (``"source"`` for the source
    itself), whether it ``keeps_signature``: it takes and returns what the source does, and
    whether it ``matches_reference``: it keeps the signature and computes what the source does
    (no state write drawn: ``steps += 1 before its reads`` changes what the outputs read), so
    an eager reference of the source model (``check_laws(reference=...)``) applies to it.
    ``check_laws`` takes these as they are drawn."""

    program: Program
    args: tuple
    kwargs: dict
    variant: str = "source"
    keeps_signature: bool = True
    matches_reference: bool = True

    def inputs(self, program: Program | None = None) -> tuple[tuple, dict]:
        """``(args, kwargs)``: the drawn inputs (for any program: they fit every form)."""
        return self.args, self.kwargs


def programs_like(
    source: Any,
    *,
    forms: tuple[str, ...] = FORMS,
    edge_values: bool = True,
    sizes: bool = True,
    extra_outputs: bool = True,
    state_writes: bool = True,
) -> st.SearchStrategy[LikeExample]:
    """The user's program ``source`` (an ``ExportedProgram`` or a flat ``Program``) and
    variants of it, as :class:`LikeExample` s.

    Parameters:
        source: an ``ExportedProgram`` (imported with ``import_ep``) or a flat ``Program``.
        forms: the forms that may be drawn (:data:`FORMS`; the first is drawn first).
        edge_values, sizes, extra_outputs, state_writes: switch a kind of variant off.

    Generates the source itself first (flat, on ``program_inputs``' inputs), then variants
    (see the module docstring): other forms, other sizes of the dynamic dimensions within
    their ranges, floating inputs at the edges, an intermediate made an extra output or given
    an extra reader, each unwritten buffer written before or after its reads. Every variant
    takes the source's inputs; all but the extra output and extra reader return what the
    source returns (``keeps_signature``). ``check_laws(pass_fn, programs=programs_like(ep))``
    checks a pass on them; with ``reference=`` the reference is called on each draw's inputs
    and compared where ``matches_reference``; on the other draws (an extra output or reader,
    which the reference does not return, or a state write, which it does not do) every law but
    semantics is checked.

    Shrinks towards the source: the flat form, no variant, the source's sizes and values.
    The decomposed forms are made on first use (one ``run_decompositions()``, about a second);
    where torch cannot decompose the source, they are the flat form (the variant line says so).
    """
    if isinstance(source, torch.export.ExportedProgram):
        exported, base = source, import_ep(source)
    elif isinstance(source, Program):
        exported, base = None, source
    else:
        raise InvalidArgument(
            f"programs_like(source): source must be a torch.export.ExportedProgram or a "
            f"purefx Program, got {type(source).__name__}")
    if not base.is_flat:
        raise InvalidArgument(
            "programs_like(source): source is an outlined Program; give the flat one "
            "(import_ep's result, before transform) and draw the outlined form from it")
    if not forms or any(f not in FORMS for f in forms):
        raise InvalidArgument(f"forms must be a non-empty tuple out of {FORMS}, got {forms!r}")
    decomposed = functools.cache(lambda: _decompose(exported, base))
    choices = {"edge_values": edge_values, "sizes": sizes, "extra_outputs": extra_outputs,
               "state_writes": state_writes}
    return _like(base, tuple(forms), decomposed, choices)


@st.composite
def _like(draw: st.DrawFn, base: Program, forms: tuple[str, ...],
          decomposed: Callable[[], tuple[Program, str]], choices: dict[str, bool]) -> LikeExample:
    said: list[str] = []
    form = draw(st.sampled_from(forms))
    program = base
    if form.startswith("decomposed"):
        program, why = decomposed()
        said.append("decomposed" + why)
    keeps = True
    if choices["extra_outputs"]:
        program, keeps = _draw_extra_values(draw, program, said)
    writes = 0
    if choices["state_writes"]:
        program, writes = _draw_state_writes(draw, program, said)
    if form.endswith("outlined"):
        program = transform(program)
        said.append("outlined")
    sizes = _draw_sizes(draw, base, said) if choices["sizes"] else {}
    args, kwargs = _inputs(draw, base, sizes, choices["edge_values"], said)
    return LikeExample(program, args, kwargs, ", ".join(said) or "source", keeps,
                       keeps and not writes)


# --- forms --------------------------------------------------------------------------------------


def _decompose(exported: Any, base: Program) -> tuple[Program, str]:
    """The decomposed flat form, and a note when torch cannot decompose the source."""
    try:
        if exported is None:
            exported = export_ep(base)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return import_ep(exported.run_decompositions()), ""
    except Exception as e:  # noqa: BLE001 - torch refuses some programs; the flat form stands in
        return base, f" (unavailable, flat form: {type(e).__name__})"


# --- extra outputs and readers ------------------------------------------------------------------


def _candidates(p: Program) -> list[Node]:
    """Intermediate tensor values that an extra output or reader may take: pure, non-view
    ``call_function`` nodes with a tensor ``val``, outside preserved calls, not outputs."""
    graph = p.root_module.graph
    returned = {s.name for s in p.signature.outputs}
    preserved = {name for name in p.call_signatures if name}
    return [n for n in graph.nodes
            if n.op == CALL_FUNCTION and n.name not in returned
            and isinstance(n.meta.get("val"), torch.Tensor)
            and ops.is_recomputable(n.target) and not ops.is_view(n.target)
            and not preserved & {path for path, _ in (n.meta.get("nn_module_stack") or {}).values()}]


def _draw_extra_values(draw: st.DrawFn, p: Program, said: list[str]) -> tuple[Program, bool]:
    kind = draw(st.sampled_from(("none", "output", "reader")))
    found = _candidates(p)
    if kind == "none" or not found:
        return p, True
    node = found[draw(st.integers(0, len(found) - 1))]
    if kind == "output":
        said.append(f"extra output %{node.name}")
        return _add_output(p, node.name, None), False
    reader = _call(p, f"{node.name}_reader", aten.neg.default, node.name,
                   stack={"L__self__": ("", p.root_module.type_name)})
    said.append(f"extra reader %{reader.name} of %{node.name}")
    return _add_output(p, reader.name, reader), False


def _add_output(p: Program, name: str, reader: Node | None) -> Program:
    """``p`` returning ``name`` too: the user outputs become ``(outputs, name)``; ``reader``,
    a new node, goes last, before the output (it reads the value after every other node,
    in-place writes included)."""
    root_sig = p.call_signatures[""]
    out_spec = pytree.TreeSpec(tuple, None, [root_sig.out_spec, pytree.treespec_leaf()])
    return _returning(p, reader, sg.OutputSpec(sg.USER_OUTPUT, name), first=False).replace(
        call_signatures=p.call_signatures.set("", attrs.evolve(root_sig, out_spec=out_spec)))


# --- state writes -------------------------------------------------------------------------------


def _writable(p: Program) -> list[sg.InputSpec]:
    """Buffers of a floating or integer dtype that the source does not write."""
    written = {s.target for s in p.signature.outputs if s.kind == sg.BUFFER_MUTATION}
    graph = p.root_module.graph
    for n in graph.nodes:
        if n.op == CALL_FUNCTION and ops.is_mutating(n.target):
            written.update(r.name for r in n.inputs())
    found = []
    for spec in p.signature.inputs:
        if spec.kind != sg.BUFFER or spec.target in written or spec.name in written:
            continue
        val = graph.node(spec.name).meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype != torch.bool and not val.is_complex():
            found.append(spec)
    return found


def _draw_state_writes(draw: st.DrawFn, p: Program, said: list[str]) -> tuple[Program, int]:
    """``p`` with the drawn state writes, and how many were drawn."""
    writes = 0
    for spec in _writable(p):
        when = draw(st.sampled_from(("none", "before", "after")))
        if when == "none":
            continue
        amount = draw(st.sampled_from(_WRITE_AMOUNTS))
        val = p.root_module.graph.node(spec.name).meta["val"]
        if not val.dtype.is_floating_point:
            amount = int(amount) or 1
        said.append(f"{spec.target} += {amount} {when} its reads")
        p = (_write_before if when == "before" else _write_after)(p, spec, amount)
        writes += 1
    return p, writes


def _write_before(p: Program, spec: sg.InputSpec, amount: float) -> Program:
    """An in-place ``add_`` of ``amount`` into the buffer right after the placeholders; every
    read of the buffer reads its result (as export writes in place)."""
    write = _call(p, f"{spec.name}_written", aten.add_.Tensor, spec.name, amount,
                  stack=_reader_stack(p, spec.name, first=True), val_of=aten.add.Tensor)
    written = Ref(write.name)

    def rename(r: Ref) -> Ref:
        return written if r.name == spec.name else r

    graph = p.root_module.graph
    placeholders = graph.placeholders  # first, as in every graph
    rest = [n.replace(args=map_refs(n.args, rename), kwargs=map_refs(n.kwargs, rename))
            for n in graph.nodes[len(placeholders):]]
    return _with_graph(p, [*placeholders, write, *rest])


def _write_after(p: Program, spec: sg.InputSpec, amount: float) -> Program:
    """An ``add`` of ``amount`` to the buffer before the output, returned as its
    ``buffer_mutation`` (as export writes functionally): the next call reads the new value."""
    new = _call(p, f"{spec.name}_next", aten.add.Tensor, spec.name, amount,
                stack=_reader_stack(p, spec.name, first=False))
    return _returning(p, new, sg.OutputSpec(sg.BUFFER_MUTATION, new.name, spec.target),
                      first=True)


def _returning(p: Program, node: Node | None, out: sg.OutputSpec, *, first: bool) -> Program:
    """``p`` also returning the value ``out`` names, first or last among the outputs (its
    spec likewise); ``node``, a new node, goes last, just before the output."""
    nodes = list(p.root_module.graph.nodes)
    output = nodes.pop()
    old, value = tuple(output.args[0]), (Ref(out.name),)
    nodes += [node] if node is not None else []
    nodes.append(output.replace(args=(value + old if first else old + value,)))
    outs = p.signature.outputs
    signature = attrs.evolve(p.signature, outputs=(out,) + outs if first else outs + (out,))
    return _with_graph(p, nodes).replace(signature=signature)


def _reader_stack(p: Program, name: str, *, first: bool) -> dict:
    """The module stack of the first (or last) node reading ``name``; the root's frame when
    none does."""
    graph = p.root_module.graph
    readers = [n for n in graph.nodes if n.op == CALL_FUNCTION
               and any(r.name == name for r in n.inputs()) and n.meta.get("nn_module_stack")]
    if readers:
        return dict(readers[0 if first else -1].meta["nn_module_stack"])
    return {"L__self__": ("", p.root_module.type_name)}


def _with_graph(p: Program, nodes: list[Node]) -> Program:
    root = p.root_module
    return p.replace(modules=p.modules.set(p.root, root.replace(graphs=(Graph(tuple(nodes)),))))


def _call(p: Program, base: str, target: Any, arg: str, *rest: Any, stack: dict,
          val_of: Callable[..., Any] | None = None) -> Node:
    """A new ``call_function`` node ``target(%arg, *rest)`` of the root graph, named after
    ``base`` (``ir.names.fresh_name`` there), module stack ``stack``; its ``val`` is ``val_of``
    (default ``target``) run on ``arg``'s ``val`` and ``rest``."""
    graph = p.root_module.graph
    val = (val_of or target)(graph.node(arg).meta["val"], *rest)
    name = fresh_name(base, Names(n.name for n in graph.nodes))
    meta = MappingProxyType({"nn_module_stack": stack, "val": val})
    return Node(CALL_FUNCTION, name, target, (Ref(arg), *rest), meta=meta)


# --- inputs -------------------------------------------------------------------------------------


def _symbols(p: Program) -> dict[Any, int]:
    """The free symbols of the user inputs' sizes, in the order they first appear, each with
    its example size (the hint of a dimension that is the symbol itself)."""
    found: dict[Any, int] = {}
    graph = p.root_module.graph
    for spec in p.signature.user_inputs():
        val = graph.node(spec.name).meta.get("val")
        dims = val.shape if isinstance(val, torch.Tensor) else (val,)
        for d in dims:
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                for s in sorted(expr.free_symbols, key=str):
                    if expr == s or s not in found:
                        found[s] = int(d.node.hint) if expr == s else found.get(s, 1)
    return found


def _draw_sizes(draw: st.DrawFn, p: Program, said: list[str]) -> dict[Any, int]:
    """A size per dynamic dimension's symbol: its example size first, then the bounds of its
    range (at least 1; an unbounded top read as twice the example, at least 8) and their
    neighbours."""
    ranges = p.range_constraints.value or {}
    sizes = {}
    for s, hint in _symbols(p).items():
        low, high = kn.size_range(p, s) if s in ranges else (hint, hint)
        low = max(low, 1)
        high = max(2 * hint, 8) if high is None else high
        picks = [hint] + [v for v in (low, high, low + 1, high - 1, hint + 1, hint - 1)
                          if low <= v <= high]
        sizes[s] = draw(st.sampled_from(list(dict.fromkeys(picks))))
        if sizes[s] != hint:
            said.append(f"{s} = {sizes[s]} (exported at {hint})")
    return sizes


def _inputs(draw: st.DrawFn, p: Program, sizes: dict[Any, int], edges: bool,
            said: list[str]) -> tuple[tuple, dict]:
    """``program_inputs``' inputs at ``sizes``; the floating ones drawn at the edges when
    ``edges`` and the draw says so."""
    at_edges = edges and draw(st.booleans())
    if at_edges:
        said.append("inputs at the edges")

    def edge(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return draw(values.tensors(shape, dtype, layout="contiguous"))

    named = {str(s): n for s, n in sizes.items()}
    return program_inputs(p, 0, named, floating=edge if at_edges else None)
