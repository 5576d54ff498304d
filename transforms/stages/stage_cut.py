"""``split_stages``: a Program cut into pipeline stages, each itself a Program.

A pipeline schedule (``torch.distributed.pipelining``) runs stage ``k`` on rank ``k``: it hands
stage 0 the positional inputs, every stage the keyword inputs, and each stage's outputs to the
next stage as its positional inputs. ``split_stages`` is outlining with another partition key,
the stage: the flat program's nodes are cut in module order where a named module's first call
begins, and each piece becomes a Program of its own (outlined by the default pipeline, so it
has the original module tree and fqns):

- values made in one stage and read in a later one are **edges**, relayed stage to stage so that
  every edge goes from stage ``k`` to stage ``k + 1``;
- a program input read by a later stage reaches every stage by **keyword** (``root_inputs``);
  the other program inputs are stage 0's positional inputs;
- each stage holds the state it reads under the **original fqns**; a tensor read by several
  stages is listed in ``Stages.shared`` with its owners; fqns tied to one tensor inside a stage
  stay one tensor;
- the last stage returns the program's outputs in their structure (a dict stays a dict).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import torch
from pyrsistent import pmap

from ir import signature as sg
from ir.args import EMPTY_DICT
from ir.args import ref as make_ref
from ir.errors import PassError
from ir.graph import Graph
from ir.module import Module, ModuleId
from ir.node import CALL_FUNCTION, CALL_MODULE, GET_ATTR, OUTPUT, PLACEHOLDER
from ir.program import Program
from ir.signature import CallSignature, ExportSignature, InputSpec, OutputSpec
from ir.staged import Edge, Stages
from ir.state import Slot
from ir.torch_seam import pytree
from transforms import kernel as kn
from transforms.passes.inlining import inline_with_calls, restacked
from transforms.passes.outline import outline_parts
from transforms.pipeline import transform
from transforms.rewrite.cost import nbytes
from transforms.stages.balance import Plan, balanced_at, stage_costs
from transforms.stages.plan import StagePlan, plan_stages, stage_key, state_reads


def split_stages(
    p: Program,
    at: Sequence[str] | None = None,
    *,
    n: int | None = None,
    balance: str | None = None,
) -> Stages:
    """Cut ``p`` into pipeline stages; each path in ``at`` begins a new stage, or ``n`` stages
    balanced by ``balance``.

    Parameters:
        p: a Program from ``import_ep``, flat or already transformed (an outlined program is
           inlined first with ``transforms.inline``).
        at: module paths (``"layers.4"``) in module order; stage ``j + 1`` begins with the first
           node that runs inside the first call of ``at[j]``. Nodes outside every module (the
           root's own) stay in the stage that is current where they are.
        n: instead of ``at``, the number of stages: ``n - 1`` cut points are chosen among the
           module boundaries (each module path's first call) so that the largest stage is as
           small as possible, exactly (``transforms.stages.balance``); among equally balanced
           cuts, the one sending the fewest activation bytes. ``Stages.at`` names the paths.
        balance: with ``n``: ``"params"`` (default; bytes of the state tensors a stage reads
           first) or ``"flops"`` (FLOPs estimated from each node's ``val``: matmuls and
           convolutions 2 x multiply-adds, attention 4 x q elements x key length, other ops one
           per output element).

    Returns:
        ``Stages`` with ``len(at) + 1`` stage Programs. Stage ``k``'s root forward is
        ``forward(*inputs[k], **root_inputs)``; stages before the last return the tuple of
        their edges, the last returns the program's outputs with ``p``'s output spec. Preserved
        call signatures of submodules are not kept in the stages (each stage is outlined by
        ``nn_module_stack``).

    Raises:
        PassError: naming the argument, when both or neither of ``at`` and ``n`` are given,
        ``balance`` is given without ``n`` or is unknown, ``n`` is not an int >= 1, or ``n - 1``
        is more than the usable cut points;
        naming the path, when a path of ``at`` is empty, repeated, not a module of
        ``p`` (with the closest paths: "did you mean"), never called, or begins before the path
        before it; naming the fqn and the stages, when a buffer written in one stage is read or
        written in another; naming the value, when a non-tensor value crosses a stage boundary
        (``PipelineStage`` sends tensors only) or a stage passes nothing to the next.

    **Laws:** pure (``p`` and its tensors are untouched); deterministic (orders come from the
    graph and ``state_order``, never from a map); running the stage modules in sequence,
    feeding each stage's outputs to the next and the keyword inputs to all, computes what
    ``lower(p)`` computes; the stages' state, merged by first owner, is ``p``'s state; ``verify``
    holds of every stage program.

    Complexity: O(n + s * k) for n root-graph nodes, s state entries and k stages, plus the
    default pipeline on each stage (O(n) in total); with ``n=``, plus O(c * k) for c candidate
    cut points.
    """
    if p.call_signature("") is None:
        raise PassError(
            "split_stages: the program has no root call signature (the export's in_spec and "
            "out_spec, preserved call ''); the stages need it to take keyword inputs and to "
            "return the program's output structure. Import it from torch.export with import_ep"
        )
    if at is not None and n is not None:
        raise PassError(
            f"split_stages: give either 'at' (cut points) or 'n' (a stage count), not both "
            f"(got at={at!r}, n={n!r})"
        )
    if n is None:
        if balance is not None:
            raise PassError(
                f"split_stages: balance={balance!r} needs n= (the stage count to balance); "
                "'at' cuts where it says"
            )
        if at is None:
            raise PassError("split_stages: give 'at' (module paths to cut at) or 'n' (stages)")
        at = _check_at(p, at)
        return _split(_flat(p), at, "")
    flat = _flat(p)
    balance = "params" if balance is None else balance
    return _split(flat, balanced_at(flat, state_reads(flat), n, balance), balance)


def _flat(p: Program) -> Program:
    """``p`` flat: an outlined program inlined, each node with the module stack of the call it
    ran in (``transforms.inline.restacked``), so that cuts follow the calls even in a
    deduplicated program, whose shared graphs' nodes name one call."""
    graph = p.root_module.graph
    if graph is None or not any(n.op == CALL_MODULE for n in graph.nodes):
        return p
    flat, chains = inline_with_calls(p)
    return restacked(flat, chains, p)


def _check_at(p: Program, at: Sequence[str]) -> tuple[str, ...]:
    if isinstance(at, str) or not all(isinstance(a, str) for a in at):
        raise PassError(f"split_stages: 'at' must be a sequence of module paths, got {at!r}")
    at = tuple(at)
    if not at:
        raise PassError("split_stages: 'at' is empty; name at least one module path to cut at")
    known = [path for path, _ in p.walk() if path]
    for path in at:
        if not path:
            raise PassError("split_stages: '' (the root) cannot begin a stage")
        if at.count(path) > 1:
            raise PassError(f"split_stages: path {path!r} is given twice in 'at'")
        if p.resolve(path) is None:
            close = difflib.get_close_matches(path, known, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise PassError(f"split_stages: {path!r} is not a module path of the program{hint}")
    return at


def _split(flat: Program, at: tuple[str, ...], balance: str) -> Stages:
    """The split of the flat ``flat`` at ``at``: the stage key, one ``outline_by`` call per
    stage, the plan read off the calls' placeholders, then one Program per stage."""
    n = len(at) + 1
    stage_of = stage_key(flat, at)
    paths = tuple(f"stage_{k}" for k in range(n))
    _, graphs = outline_parts(_bare(flat), stage_of, paths)
    outside = [tuple(nd.name for nd in g.placeholders) if g else () for g in graphs]
    attrs_read = [
        tuple(nd.name for nd in g.nodes if nd.op == GET_ATTR) if g else () for g in graphs
    ]
    reads = state_reads(flat)
    plan = plan_stages(flat, at, stage_of, outside, attrs_read, reads)
    programs = tuple(transform(_stage_program(flat, plan, k, graphs[k])) for k in range(n))
    grads = _may_carry_grad(flat)
    edges = tuple(
        Edge(name, k, plan.origin[name], i, name in grads)
        for k, names in enumerate(plan.sent)
        for i, name in enumerate(names)
    )
    root_sig = flat.call_signature("")
    return Stages(
        programs=programs,
        at=at,
        inputs=plan.inputs,
        root_inputs=plan.root_inputs,
        edges=edges,
        state=plan.state,
        modules=tuple(tuple(q for q in mods if q) for mods in plan.modules),
        shared=plan.shared,
        source=flat,
        out_spec=root_sig.out_spec if root_sig is not None else None,
        balance=balance,
        params=_held_bytes(flat, plan.state),
        flops=stage_costs(Plan(flat, reads), stage_of, n),
    )


def _bare(p: Program) -> Program:
    """``p`` as the stage outlining sees it: the root alone (no module tree: the stage calls
    are its only children), only the root's call signature, and the program inputs left out
    of the signature's inputs. The state traffic then reads an in-place result of state as the
    state (which one stage holds), but an in-place result of a program input as a value like
    any other: each rank has its own copy of an input, so a later stage is sent the written
    value instead of reading its own, unwritten copy."""
    root = p.root_module.replace(children=())
    state_only = tuple(s for s in p.signature.inputs if s.kind in sg.STATE_INPUT_KINDS)
    return p.replace(
        modules=pmap({p.root: root}),
        signature=ExportSignature(state_only, p.signature.outputs),
        call_signatures=pmap({k: v for k, v in p.call_signatures.items() if k == ""}),
        call_order=tuple(c for c in p.call_order if c == ""),
    )


def _may_carry_grad(p: Program) -> set[str]:
    """The values that may carry a gradient: every floating-point or complex tensor value
    (and a value without a ``val``). Whether one does is decided at run time, not here:
    export-time ``requires_grad`` and ``detach`` would fix it at split time, and unfreezing a
    layer after the split would then give the stages before it no gradient. O(n)."""
    found = set()
    for node in p.root_module.graph.nodes:
        if node.op == OUTPUT:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex():
            found.add(node.name)
    return found


def _stage_program(p: Program, plan: StagePlan, s: int, graph: Graph | None) -> Program:
    """Stage ``s`` as a flat Program: its state placeholders (one per fqn held), positional and
    keyword inputs, the sizes it reads off them, the body of its outlined call (state reads
    renamed to its own), and its outputs (the values it sends, or the program's outputs)."""
    table = p.state_table()
    by_name = p.root_module.graph.by_name()
    w = kn.WorkingGraph(p.root_module.graph, indexed=False)  # new names: none of the flat's
    ph_of_fqn: dict[str, str] = {}
    spec_of_fqn: dict[str, InputSpec] = {}
    for spec in p.signature.inputs:
        if spec.kind in sg.STATE_INPUT_KINDS:
            ph_of_fqn.setdefault(spec.target, spec.name)
            spec_of_fqn.setdefault(spec.target, spec)
    in_specs: list[InputSpec] = []
    fqn_ph: dict[str, str] = {}  # held fqn -> this stage's placeholder of it
    for fqn in plan.state[s]:
        held = ph_of_fqn.get(fqn)
        node = by_name.get(held) if held else None
        if node is None:
            node = w.make_carrying(PLACEHOLDER, base="p_" + fqn.replace(".", "_"), name=held)
        w.add(node)
        in_specs.append(_state_spec(spec_of_fqn.get(fqn), fqn, node.name, table[fqn]))
        fqn_ph[fqn] = node.name
    positional, keywords = plan.inputs[s], plan.root_inputs
    for name in (*positional, *keywords):
        orig = by_name[name]
        w.add(orig if orig.op == PLACEHOLDER else
              w.make_carrying(PLACEHOLDER, meta=orig.meta, name=name))
        in_specs.append(InputSpec(sg.USER_INPUT, name))
    root_stack = {"L__self__": ("", p.root_module.type_name or "")}  # runs in the root
    for name, source, dim in plan.sizes[s]:
        w.add(w.make(CALL_FUNCTION, torch.ops.aten.sym_size.int, (make_ref(source), dim),
                     EMPTY_DICT, name=name, val=by_name[name].meta["val"], stack=root_stack))
    for read, fqn in plan.renames[s].items():  # a state get_attr reads this stage's placeholder
        if fqn_ph[fqn] != read:
            w.read_as(read, make_ref(fqn_ph[fqn]))
    for node in graph.nodes if graph is not None else ():
        if node.op in (PLACEHOLDER, OUTPUT) or node.name in plan.renames[s]:
            continue  # inputs are made above
        if node.op == CALL_FUNCTION and not node.meta.get("nn_module_stack"):
            node = node.with_meta(nn_module_stack=root_stack)  # plumbing of the root's calls
        w.keep(node)
    out_node = p.root_module.graph.output_node
    outputs = out_node.args[0] if out_node.args else ()
    out_vals: list[Any] = []
    out_specs: list[OutputSpec] = []
    for spec, value in zip(p.signature.outputs, outputs, strict=False):
        if spec.kind in sg.MUTATION_KINDS and plan.stage_of.get(getattr(value, "name", None), 0) == s:
            out_vals.append(value)  # the stage that makes a written-back value writes it
            out_specs.append(spec)
    if s == plan.n - 1:
        for spec, value in zip(p.signature.outputs, outputs, strict=False):
            if spec.kind not in sg.MUTATION_KINDS:
                out_vals.append(value)  # read as placed: ``keep`` below
                out_specs.append(spec)
        out_spec = p.call_signature("").out_spec
    else:
        out_vals.extend(by_name[name].ref for name in plan.sent[s])
        out_specs.extend(OutputSpec(sg.USER_OUTPUT, name) for name in plan.sent[s])
        out_spec = pytree.tree_structure(tuple(range(len(plan.sent[s]))))
    w.keep(out_node.replace(args=(tuple(out_vals),)))
    in_spec = pytree.tree_structure((tuple(range(len(positional))), {k: 0 for k in keywords}))
    fqns = plan.state[s]
    kept = _kept_paths(plan.modules[s], fqns)
    modules = _pruned_modules(p, kept)
    modules[p.root] = modules[p.root].replace(graphs=(w.finish()[0],))
    return Program(
        root=p.root,
        modules=pmap(modules),
        state=pmap({f: table[f] for f in fqns}),
        state_order=fqns,
        tensors=pmap({table[f].tensor: p.tensor_table()[table[f].tensor] for f in fqns}),
        signature=ExportSignature(tuple(in_specs), tuple(out_specs)),
        call_signatures=pmap(
            {"": CallSignature((), (), in_spec, out_spec, (*positional, *keywords))}
        ),
        call_order=tuple(c for c in p.call_order if c == "" or c in kept),
        range_constraints=p.range_constraints,
    )


def _held_bytes(p: Program, state_of: tuple[tuple[str, ...], ...]) -> tuple[int, ...]:
    """Bytes of the distinct state tensors each stage holds (tied fqns once). O(state)."""
    table, tensors = p.state_table(), p.tensor_table()
    return tuple(sum(nbytes(tensors[k].value) for k in dict.fromkeys(table[f].tensor for f in fqns))
                 for fqns in state_of)


def _state_spec(spec: InputSpec | None, fqn: str, name: str, slot: Slot) -> InputSpec:
    if spec is not None:
        return InputSpec(spec.kind, name, fqn, spec.persistent)
    kind = {"parameter": sg.PARAMETER, "buffer": sg.BUFFER, "constant": sg.CONSTANT_TENSOR}
    return InputSpec(
        kind.get(slot.kind, sg.CUSTOM_OBJ),
        name,
        fqn,
        slot.persistent if slot.kind == "buffer" else None,
    )


def _kept_paths(paths: dict[str, None], fqns: tuple[str, ...]) -> set[str]:
    kept: set[str] = {""}
    for q in (*paths, *(f.rpartition(".")[0] for f in fqns)):
        while q and q not in kept:
            kept.add(q)
            q = q.rpartition(".")[0]
    return kept


def _pruned_modules(p: Program, kept: set[str]) -> dict[ModuleId, Module]:
    found: dict[ModuleId, Module] = {}
    for path, mid in p.walk():
        if path not in kept or mid in found:
            continue
        mod = p.module(mid)
        kids = tuple(
            (name, child)
            for name, child in mod.children
            if (f"{path}.{name}" if path else name) in kept
        )
        found[mid] = mod.replace(children=kids)
    return found


__all__ = ["Edge", "Stages", "split_stages"]
