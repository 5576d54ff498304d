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
import operator
from collections.abc import Sequence
from typing import Any

import torch
from pyrsistent import pmap

from ir import signature as sg
from ir.args import map_refs
from ir.args import ref as make_ref
from ir.errors import PassError
from ir.graph import Graph
from ir.module import Module, ModuleId
from ir.module_stack import NO_STACK
from ir.names import Names, fresh_name
from ir.node import CALL_FUNCTION, CALL_MODULE, GET_ATTR, OUTPUT, PLACEHOLDER, Node, frozen_meta
from ir.ops import is_inplace, is_mutating, written_args
from ir.program import Program
from ir.signature import CallSignature, ExportSignature, InputSpec, OutputSpec
from ir.stages import Edge, Stages
from ir.state import Slot
from ir.torch_seam import op_schema, pytree
from transforms.inline import inline
from transforms.pipeline import transform
from transforms.stage_balance import Plan, balanced_at, stage_costs


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
           small as possible, exactly (``transforms.stage_balance``); among equally balanced
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
        flat = inline(p) if _is_outlined(p) else p
        return _Splitter(flat, at).run()
    flat = inline(p) if _is_outlined(p) else p
    balance = "params" if balance is None else balance
    at = balanced_at(flat, _Splitter(flat, ()).state_reads, n, balance)
    return _Splitter(flat, at, balance).run()


def _is_outlined(p: Program) -> bool:
    graph = p.root_module.graph
    return graph is not None and any(n.op == CALL_MODULE for n in graph.nodes)


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


def _frame_paths(node: Node) -> tuple[str, ...]:
    frames = node.module_frames
    if frames is None or frames is NO_STACK:
        return ()
    return tuple(f.path for f in frames)


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


class _Splitter:
    """One run of ``split_stages`` on a flat program (mutable while it runs, then dropped)."""

    def __init__(self, p: Program, at: tuple[str, ...], balance: str = "") -> None:
        self.p = p
        self.at = at
        self.balance = balance
        self.n = len(at) + 1
        self.graph = p.root_module.graph
        # Values that stand for state: state placeholders, and (in an inlined program)
        # get_attr nodes of state fqns. Each stage reads them from its own copy, never an edge.
        self.state_reads = {
            s.name: s.target for s in p.signature.inputs if s.kind in sg.STATE_INPUT_KINDS
        }
        for node in self.graph.nodes:
            if node.op == GET_ATTR and node.target in p.state:
                self.state_reads[node.name] = node.target
        # The result of an in-place op on state *is* that state (``add_`` returns the buffer):
        # a stage that reads it reads the buffer, and the op's stage writes it.
        self.aliases: dict[str, str] = {}
        # Views of state (``slice``, ``select``, ``view``, ``getitem`` of ``split``, ...) and of
        # its in-place results: a write through one is a write of the state. Only the write
        # check reads these (a view read in a later stage is sent as an edge, as any value).
        self.views: dict[str, str] = {}
        is_view = _ViewFacts()
        for node in self.graph.nodes:
            if node.op != CALL_FUNCTION or not node.args:
                continue
            first = getattr(node.args[0], "name", None)
            fqn = self.state_reads.get(first) or self.aliases.get(first)
            if fqn is not None and is_inplace(node.target):
                self.aliases[node.name] = fqn
            fqn = fqn or self.views.get(first)
            if fqn is not None and (is_inplace(node.target) or is_view(node.target)):
                self.views[node.name] = fqn

    # -- 1. the stage of every node -------------------------------------------------------
    def assign(self) -> dict[str, int]:
        stage_of: dict[str, int] = {}
        current = 0
        begun: dict[str, int] = {}
        for node in self.graph.nodes:
            if node.op in (PLACEHOLDER, OUTPUT) or node.name in self.state_reads:
                continue
            paths = _frame_paths(node)
            for j, path in enumerate(self.at):
                if path not in begun and any(_within(q, path) for q in paths):
                    if j + 1 < current:
                        raise PassError(
                            f"split_stages: {path!r} begins (at node %{node.name}) after "
                            f"{self.at[current - 1]!r}; give the paths of 'at' in module order"
                        )
                    begun[path] = j + 1
                    current = max(current, j + 1)
            stage_of[node.name] = current
        for path in self.at:
            if path not in begun:
                raise PassError(
                    f"split_stages: module {path!r} is never called (no node runs in it); "
                    "cut at a module that runs"
                )
        return stage_of

    def run(self) -> Stages:
        p, graph, n = self.p, self.graph, self.n
        stage_of = self.assign()
        state_ph = self.state_reads
        user_ph = [s.name for s in p.signature.user_inputs()]
        table = p.state_table()
        out_node = graph.output_node
        out_specs = p.signature.outputs

        # Who reads what: stage readers of every value; module paths per stage.
        readers: dict[str, set[int]] = {}
        paths_in: list[dict[str, None]] = [{"": None} for _ in range(n)]
        for node in graph.nodes:
            if node.name not in stage_of:
                continue
            s = stage_of[node.name]
            for q in _frame_paths(node):
                paths_in[s].setdefault(q, None)
            if node.op == GET_ATTR:
                paths_in[s].setdefault(node.target, None)
            for r in node.inputs():
                readers.setdefault(r.name, set()).add(s)
        # Outputs: mutations belong to the stage that made the value; user outputs to the last.
        outputs = out_node.args[0] if out_node.args else ()
        writer: dict[str, set[int]] = {}  # tensor key -> stages that write it
        for spec, value in zip(out_specs, outputs, strict=False):
            name = getattr(value, "name", None)
            if spec.kind in sg.MUTATION_KINDS:
                if spec.kind != sg.USER_INPUT_MUTATION and name is not None:
                    key = table[spec.target].tensor
                    writer.setdefault(key, set()).add(stage_of.get(name, 0))
            elif name is not None:
                readers.setdefault(name, set()).add(n - 1)
        for node in graph.nodes:  # in-place writes of state (a transformed, inlined program)
            if node.name not in stage_of or not is_mutating(node.target):
                continue
            for i in written_args(node.target):
                arg = node.args[i] if i < len(node.args) else None
                name = getattr(arg, "name", None)
                fqn = state_ph.get(name) or self.aliases.get(name) or self.views.get(name)
                if fqn is not None:
                    writer.setdefault(table[fqn].tensor, set()).add(stage_of[node.name])

        # Program inputs: keyword when a later stage reads them, else stage 0's positional.
        root_inputs = tuple(u for u in user_ph if any(s > 0 for s in readers.get(u, ())))
        first_inputs = tuple(u for u in user_ph if u not in root_inputs)

        # State per stage, under the fqns whose modules run there.
        key_fqns: dict[str, list[str]] = {}
        for fqn in p.state_order:
            key_fqns.setdefault(table[fqn].tensor, []).append(fqn)
        key_stages: dict[str, list[int]] = {}
        read_fqn: dict[str, str] = {}
        for ph, fqn in (*state_ph.items(), *self.aliases.items()):
            key = table[fqn].tensor
            if ph in state_ph:
                read_fqn.setdefault(key, fqn)
            for s in sorted(readers.get(ph, ())):
                if s not in key_stages.setdefault(key, []):
                    key_stages[key].append(s)
        for key, stages_w in writer.items():
            touched = sorted(set(key_stages.get(key, ())) | stages_w)
            if len(touched) > 1:
                fqns = ", ".join(repr(f) for f in key_fqns[key])
                raise PassError(
                    f"split_stages: buffer {fqns} is written in stage(s) "
                    f"{sorted(stages_w)} and read or written in stage(s) {touched}; each stage "
                    "would hold its own copy and they would diverge. Move a boundary in 'at' so "
                    "that one stage holds every use of it"
                )
        for key, stages_w in writer.items():  # a buffer only written is held where written
            for w in sorted(stages_w):
                if w not in key_stages.setdefault(key, []):
                    key_stages[key].append(w)
        held: list[dict[str, None]] = [{} for _ in range(n)]  # per stage: fqns held
        for key, fqns in key_fqns.items():
            stages_k = sorted(key_stages.get(key, ()))
            if not stages_k:  # read by no stage: held where its module runs (else stage 0)
                owner = fqns[0].rpartition(".")[0]
                stages_k = [next((s for s in range(n) if owner in paths_in[s]), 0)]
                key_stages[key] = stages_k
            for s in stages_k:
                mine = [f for f in fqns if f.rpartition(".")[0] in paths_in[s]]
                for f in mine or [read_fqn.get(key, fqns[0])]:
                    held[s][f] = None
        state_of = tuple(tuple(f for f in p.state_order if f in held[s]) for s in range(n))
        shared: dict[str, tuple[int, ...]] = {}
        for fqn in p.state_order:
            owners = tuple(sorted(key_stages[table[fqn].tensor]))
            if len(owners) > 1:
                shared[fqn] = owners

        grads = self.may_carry_grad()
        by_name = graph.by_name()
        # A symbolic size (a dynamic export's ``sym_size``) made in one stage and read in a
        # later one is not sent: the later stage reads it off one of its own tensor inputs of
        # that size (below), so a dynamic batch needs no scalar edge.
        sized: dict[str, list[int]] = {}
        for name, stages_r in readers.items():
            a = stage_of.get(name)
            if a is None or not isinstance(by_name[name].meta.get("val"), torch.SymInt):
                continue
            later = sorted(r for r in stages_r if r > a)
            if later:
                sized[name] = later
                readers[name] = stages_r - set(later)
        # Edges: a value made in stage a and last read in stage b crosses every boundary between.
        origin: dict[str, int] = {u: 0 for u in first_inputs}
        origin.update(stage_of)
        edges: list[Edge] = []
        per_boundary: list[list[str]] = [[] for _ in range(n - 1)]
        for name in (*first_inputs, *(nd.name for nd in graph.nodes if nd.name in stage_of)):
            a = origin[name]
            last = max(readers.get(name, ()), default=a)
            if last <= a:
                continue
            _check_tensor(by_name[name], a, last)
            for k in range(a, last):
                per_boundary[k].append(name)
        for k, names in enumerate(per_boundary):
            if not names:
                raise PassError(
                    f"split_stages: stage {k} passes nothing to stage {k + 1} (cut at "
                    f"{self.at[k]!r}); a pipeline stage needs at least one tensor input"
                )
            edges.extend(
                Edge(nm, k, origin[nm], i, nm in grads) for i, nm in enumerate(names)
            )
        inputs = (first_inputs, *(tuple(b) for b in per_boundary))
        derived: list[list[Node]] = [[] for _ in range(n)]
        root_stack = {"L__self__": ("", p.root_module.type_name or "")}  # runs in the root
        for name, later in sized.items():
            val = by_name[name].meta["val"]
            for s in later:
                found = _size_source(val, (*inputs[s], *root_inputs), by_name)
                if found is None:
                    raise PassError(
                        f"split_stages: size %{name} ({val}) is made in stage {stage_of[name]} "
                        f"and read in stage {s}, and no tensor input of stage {s} has that "
                        "size; a pipeline stage passes tensors only. Move a boundary so that "
                        "one stage makes and reads it"
                    )
                source, dim = found
                derived[s].append(Node(
                    CALL_FUNCTION, name, torch.ops.aten.sym_size.int, (make_ref(source), dim),
                    meta=frozen_meta({"val": val, "nn_module_stack": root_stack}),
                ))

        programs = tuple(
            transform(
                self.stage_program(
                    s, stage_of, state_of[s], inputs[s], root_inputs, per_boundary, paths_in[s],
                    derived[s],
                )
            )
            for s in range(n)
        )
        modules = tuple(tuple(q for q in paths_in[s] if q) for s in range(n))
        root_sig = p.call_signature("")
        return Stages(
            programs=programs,
            at=self.at,
            inputs=inputs,
            root_inputs=root_inputs,
            edges=tuple(edges),
            state=state_of,
            modules=modules,
            shared=pmap(shared),
            source=p,
            out_spec=root_sig.out_spec if root_sig is not None else None,
            balance=self.balance,
            params=_held_bytes(p, state_of),
            flops=stage_costs(Plan(p, state_ph), stage_of, n),
        )

    def may_carry_grad(self) -> set[str]:
        """The values that may carry a gradient: every floating-point or complex tensor value
        (and a value without a ``val``). Whether one does is decided at run time, not here:
        export-time ``requires_grad`` and ``detach`` would fix it at split time, and unfreezing a
        layer after the split would then give the stages before it no gradient. O(n)."""
        found = set()
        for node in self.graph.nodes:
            if node.op == OUTPUT:
                continue
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex():
                found.add(node.name)
        return found

    # -- 2. one stage as a flat Program ---------------------------------------------------
    def stage_program(
        self,
        s: int,
        stage_of: dict[str, int],
        fqns: tuple[str, ...],
        positional: tuple[str, ...],
        keywords: tuple[str, ...],
        per_boundary: list[list[str]],
        paths: dict[str, None],
        derived: list[Node],
    ) -> Program:
        p, graph, n = self.p, self.graph, self.n
        table = p.state_table()
        taken = Names(nd.name for nd in graph.nodes)
        ph_of_fqn: dict[str, str] = {}
        spec_of_fqn: dict[str, InputSpec] = {}
        for spec in p.signature.inputs:
            if spec.kind in sg.STATE_INPUT_KINDS:
                ph_of_fqn.setdefault(spec.target, spec.name)
                spec_of_fqn.setdefault(spec.target, spec)
        by_name = graph.by_name()
        nodes: list[Node] = []
        in_specs: list[InputSpec] = []
        key_ph: dict[str, str] = {}  # tensor key -> this stage's placeholder that reads it
        for fqn in fqns:
            name = ph_of_fqn.get(fqn) or fresh_name("p_" + fqn.replace(".", "_"), taken)
            taken.add(name)
            orig = by_name.get(ph_of_fqn.get(fqn, ""))
            nodes.append(orig if orig is not None else Node(PLACEHOLDER, name, name))
            slot = table[fqn]
            in_specs.append(_state_spec(spec_of_fqn.get(fqn), fqn, name, slot))
            key_ph.setdefault(slot.tensor, name)
        # Reads of a state placeholder go to this stage's placeholder of the same tensor.
        rename: dict[str, str] = {}
        for name, fqn in self.state_reads.items():
            mine = key_ph.get(table[fqn].tensor)
            if mine is not None and mine != name:
                rename[name] = mine
        for name in (*positional, *keywords):
            orig = by_name[name]
            nodes.append(orig if orig.op == PLACEHOLDER else Node(PLACEHOLDER, name, name,
                                                                   meta=orig.meta))
            in_specs.append(InputSpec(sg.USER_INPUT, name))
        nodes.extend(derived)  # sizes read off this stage's own inputs

        def read_ref(r):
            return make_ref(rename[r.name]) if r.name in rename else r

        for node in graph.nodes:
            if stage_of.get(node.name) != s:
                continue
            if rename and any(r.name in rename for r in node.inputs()):
                node = node.replace(
                    args=map_refs(node.args, read_ref), kwargs=map_refs(node.kwargs, read_ref)
                )
            nodes.append(node)
        out_node = graph.output_node
        outputs = out_node.args[0] if out_node.args else ()
        out_vals: list[Any] = []
        out_specs: list[OutputSpec] = []
        for spec, value in zip(p.signature.outputs, outputs, strict=False):
            name = getattr(value, "name", None)
            if spec.kind in sg.MUTATION_KINDS and stage_of.get(name, 0) == s:
                out_vals.append(value)
                out_specs.append(spec)
        if s == n - 1:
            for spec, value in zip(p.signature.outputs, outputs, strict=False):
                if spec.kind not in sg.MUTATION_KINDS:
                    out_vals.append(value)
                    out_specs.append(spec)
            out_spec = p.call_signature("").out_spec
        else:
            for name in per_boundary[s]:
                out_vals.append(by_name[name].ref)
                out_specs.append(OutputSpec(sg.USER_OUTPUT, name))
            out_spec = pytree.tree_structure(tuple(range(len(per_boundary[s]))))
        nodes.append(out_node.replace(args=(tuple(out_vals),)))
        in_spec = pytree.tree_structure(
            (tuple(range(len(positional))), {k: 0 for k in keywords})
        )
        kept = _kept_paths(paths, fqns)
        modules = _pruned_modules(p, kept)
        modules[p.root] = modules[p.root].replace(graphs=(Graph.of(nodes),))
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


class _ViewFacts:
    """Whether a target returns a view of its first argument: its schema's first result shares
    the first argument's alias set without writing it (``slice``, ``view``, ``split``'s list),
    or it is ``getitem`` (of such a list). Answers kept per instance (one split). O(1)."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[Any, bool]] = {}

    def __call__(self, target: Any) -> bool:
        hit = self.known.get(id(target))
        if hit is not None and hit[0] is target:
            return hit[1]
        found = target is operator.getitem or _returns_view(target)
        self.known[id(target)] = (target, found)
        return found


def _returns_view(target: Any) -> bool:
    schema = op_schema(target)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    ret, arg = schema.returns[0].alias_info, schema.arguments[0].alias_info
    if ret is None or arg is None or ret.is_write or arg.is_write:
        return False
    # ``Tensor(a) self -> Tensor(a)``; a list of views (``split``, ``unbind``) carries its
    # alias set on the elements: ``Tensor(a -> *) self -> Tensor(a)[]``
    return bool(set(ret.before_set) & set(arg.before_set)) or "*" in arg.after_set


def _held_bytes(p: Program, state_of: tuple[tuple[str, ...], ...]) -> tuple[int, ...]:
    """Bytes of the distinct state tensors each stage holds (tied fqns once). O(state)."""
    table, tensors = p.state_table(), p.tensor_table()
    found = []
    for fqns in state_of:
        keys = dict.fromkeys(table[f].tensor for f in fqns)
        found.append(sum(
            v.numel() * v.element_size()
            for v in (tensors[k].value for k in keys) if isinstance(v, torch.Tensor)
        ))
    return tuple(found)


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


def _size_source(val: Any, names: Sequence[str], by_name: Any) -> tuple[str, int] | None:
    """The first of ``names`` whose tensor value has a dimension equal to the symbolic size
    ``val``, with that dimension's index; ``None`` when none has. O(names * dims)."""
    expr = val.node.expr
    for name in names:
        t = by_name[name].meta.get("val")
        if not isinstance(t, torch.Tensor):
            continue
        for dim, d in enumerate(t.shape):
            if isinstance(d, torch.SymInt) and d.node.expr == expr:
                return name, dim
    return None


def _check_tensor(node: Node, a: int, b: int) -> None:
    val = node.meta.get("val")
    if val is None and node.op == PLACEHOLDER:
        return
    if val is not None and not isinstance(val, torch.Tensor):
        raise PassError(
            f"split_stages: value %{node.name} ({type(val).__name__}) is made in stage {a} and "
            f"read in stage {b}; a pipeline stage passes tensors only. Move a boundary so that "
            "one stage makes and reads it"
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
