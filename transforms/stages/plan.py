"""The plan of a pipeline split: the stage key ``outline_by`` outlines by, and the plan value read
off the outlined stages.

``split_stages`` is outlining with another partition key. ``stage_key`` gives each node of the
flat program its stage: stages are consecutive runs of the graph, and stage ``j + 1`` begins
where the first call of the module ``at[j]`` begins. ``outline_by`` then makes one call per
stage, and the placeholders of a stage's graph are exactly the values the stage reads from
outside it (an in-place result of state is read as the state itself, as the state traffic says;
``get_attr`` nodes are copied into each stage that reads them). ``plan_stages`` turns those
reads into a ``StagePlan``:

- values made in one stage and read in a later one are **edges**, relayed stage to stage so that
  every edge goes from stage ``k`` to stage ``k + 1``; a symbolic size is not sent, the later
  stage reads it off one of its own inputs;
- a program input read by a later stage reaches every stage by **keyword**; the others are
  stage 0's positional inputs;
- each stage holds the state it reads under the **original fqns**: a tied tensor under the fqn
  of a module that runs there (``transforms.sink.StateOwners``' tied groups), else under the fqn
  the program reads it by; a tensor held by several stages is **shared**;
- state (or a program input) written in one stage and read or written in another is refused:
  each stage would hold its own copy (writes through views and in-place results count).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir import signature as sg
from ir.effects import alias_roots, graph_effects
from ir.errors import PassError
from ir.module_stack import NO_STACK
from ir.node import GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from transforms.machinery.frames import part_frames as stage_frames
from transforms.passes.state_sinking import StateOwners
from transforms.preserved.state_traffic import state_traffic

__all__ = ["StagePlan", "plan_stages", "stage_frames", "stage_key", "state_reads"]


def state_reads(p: Program) -> dict[str, str]:
    """``{value: fqn}`` for the values of ``p``'s flat root graph that stand for state: state
    placeholders, and (in an inlined program) ``get_attr`` nodes of state fqns. Each stage
    reads them from its own copy, never as an edge. O(n)."""
    found = dict(StateOwners(p).fqn_of)
    for node in p.root_module.graph.nodes:
        if node.op == GET_ATTR and node.target in p.state:
            found[node.name] = node.target
    return found


def frame_paths(node: Node) -> tuple[str, ...]:
    """The module paths of the calls ``node`` runs in, outermost first (``()`` without any)."""
    frames = node.module_frames
    if frames is None or frames is NO_STACK:
        return ()
    return tuple(f.path for f in frames)


def stage_key(p: Program, at: tuple[str, ...]) -> dict[str, int]:
    """The stage of every node of ``p``'s flat root graph that runs (not a placeholder, the
    output or a ``get_attr``, which is copied where read): stage ``j + 1`` begins with the first
    node inside the first call of ``at[j]``; a node outside every module stays in the stage that
    is current where it is.

    Raises ``PassError`` naming the path when a path of ``at`` begins before the path before it
    or is never called. O(n * len(at)) for n nodes (``at`` is short: the stage count).
    """
    stage_of: dict[str, int] = {}
    current = 0
    begun: dict[str, int] = {}
    for node in p.root_module.graph.nodes:
        if node.op in (PLACEHOLDER, OUTPUT, GET_ATTR):
            continue
        paths = frame_paths(node)
        for j, path in enumerate(at):
            if path in begun or not any(q == path or q.startswith(path + ".") for q in paths):
                continue
            if j + 1 < current:
                raise PassError(
                    f"split_stages: {path!r} begins (at node %{node.name}) after "
                    f"{at[current - 1]!r}; give the paths of 'at' in module order"
                )
            begun[path] = j + 1
            current = max(current, j + 1)
        stage_of[node.name] = current
    for path in at:
        if path not in begun:
            raise PassError(
                f"split_stages: module {path!r} is never called (no node runs in it); "
                "cut at a module that runs"
            )
    return stage_of


@attrs.frozen
class StagePlan:
    """What each stage of a split takes, sends and holds (``plan_stages``).

    - ``stage_of``: node name -> its stage (the key ``outline_by`` outlined by);
    - ``inputs``: per stage, its positional inputs (stage 0: program inputs; stage ``k > 0``:
      what stage ``k - 1`` sends);
    - ``root_inputs``: the program inputs every stage takes by keyword, in program order;
    - ``sent``: per boundary ``k -> k + 1``, the values sent, in flat graph order;
    - ``origin``: value -> the stage that makes it (0 for a program input);
    - ``sizes``: per stage, ``(size, input, dim)`` for each symbolic size it reads off its own
      input ``input`` instead of receiving it;
    - ``state``: per stage, the fqns it holds, in the program's state order;
    - ``renames``: per stage, each state read -> the stage's own read of that tensor;
    - ``shared``: fqn -> the stages holding a copy of its tensor (2 or more);
    - ``modules``: per stage, the module paths whose calls run there (the root ``""`` first).
    """

    stage_of: Mapping[str, int]
    inputs: tuple[tuple[str, ...], ...]
    root_inputs: tuple[str, ...]
    sent: tuple[tuple[str, ...], ...]
    origin: Mapping[str, int]
    sizes: tuple[tuple[tuple[str, str, int], ...], ...]
    state: tuple[tuple[str, ...], ...]
    renames: tuple[Mapping[str, str], ...]
    shared: Mapping[str, tuple[int, ...]]
    modules: tuple[tuple[str, ...], ...]

    @property
    def n(self) -> int:
        """The number of stages."""
        return len(self.inputs)


def plan_stages(
    p: Program,
    at: tuple[str, ...],
    stage_of: Mapping[str, int],
    outside: Sequence[Sequence[str]],
    attrs_read: Sequence[Sequence[str]],
    reads: Mapping[str, str],
) -> StagePlan:
    """The plan of splitting the flat ``p`` by ``stage_of`` (``stage_key``).

    Parameters:
        p: the flat program that was outlined.
        at: the cut paths (for messages).
        stage_of: the stage key.
        outside: per stage, the values its outlined graph reads from outside it (its
            placeholders), in the order it reads them.
        attrs_read: per stage, the names of the ``get_attr`` nodes copied into it.
        reads: ``state_reads(p)``.

    Raises ``PassError`` naming the fqn (or input) and the stages when state or a program input
    is written in one stage and read or written in another, and naming the value when a
    non-tensor value crosses a boundary, a size cannot be read off a later stage's inputs, or a
    stage sends nothing.

    **Laws:** a pure function of its arguments; every edge goes from ``k`` to ``k + 1``; each
    state tensor any stage reads or writes is held by every stage that does.
    Complexity: O(n + s * k) for n nodes, s state entries and k stages.
    """
    n = len(at) + 1
    graph = p.root_module.graph
    by_name = graph.by_name()
    user = [s.name for s in p.signature.user_inputs()]
    readers: dict[str, set[int]] = {}
    for k in range(n):
        for name in (*outside[k], *attrs_read[k]):
            readers.setdefault(name, set()).add(k)
    outputs = graph.outputs or ()
    for spec, value in zip(p.signature.outputs, outputs, strict=False):
        name = getattr(value, "name", None)
        if name is not None and spec.kind not in sg.MUTATION_KINDS and stage_of.get(name) != n - 1:
            readers.setdefault(name, set()).add(n - 1)

    for value, dest in state_traffic(p).written_back.items():
        if dest in user:  # the stage that makes an input's new value writes it back: it takes it
            readers.setdefault(dest, set()).add(stage_of.get(value, 0))
    root_inputs = tuple(u for u in user if any(s > 0 for s in readers.get(u, ())))
    first_inputs = tuple(u for u in user if u not in root_inputs)
    paths = _module_paths(p, stage_of, attrs_read, n)
    state, renames, shared = _held_state(p, reads, readers, stage_of, paths)

    origin: dict[str, int] = {u: 0 for u in first_inputs}
    origin.update(stage_of)
    sized: dict[str, list[int]] = {}
    sent: list[list[str]] = [[] for _ in range(n - 1)]
    for name in (*first_inputs, *(nd.name for nd in graph.nodes if nd.name in stage_of)):
        a = origin[name]
        later = sorted(r for r in readers.get(name, ()) if r > a)
        if not later:
            continue
        if isinstance(by_name[name].meta.get("val"), torch.SymInt):
            sized[name] = later  # read off a later stage's own input, never sent
            continue
        _check_tensor(by_name[name], a, later[-1])
        for k in range(a, later[-1]):
            sent[k].append(name)
    for k, names in enumerate(sent):
        if not names:
            raise PassError(
                f"split_stages: stage {k} passes nothing to stage {k + 1} (cut at "
                f"{at[k]!r}); a pipeline stage needs at least one tensor input"
            )
    inputs = (first_inputs, *(tuple(b) for b in sent))
    sizes: list[list[tuple[str, str, int]]] = [[] for _ in range(n)]
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
            sizes[s].append((name, *found))
    return StagePlan(
        stage_of=pmap(stage_of),
        inputs=inputs,
        root_inputs=root_inputs,
        sent=tuple(tuple(b) for b in sent),
        origin=pmap(origin),
        sizes=tuple(tuple(x) for x in sizes),
        state=state,
        renames=renames,
        shared=pmap(shared),
        modules=paths,
    )


def _module_paths(
    p: Program, stage_of: Mapping[str, int], attrs_read: Sequence[Sequence[str]], n: int
) -> tuple[tuple[str, ...], ...]:
    """Per stage: ``""``, then the module paths its nodes run in and the subgraph modules its
    ``get_attr`` copies read, in graph order. O(n * depth)."""
    found: list[dict[str, None]] = [{"": None} for _ in range(n)]
    by_name = p.root_module.graph.by_name()
    for node in p.root_module.graph.nodes:
        s = stage_of.get(node.name)
        if s is None:
            continue
        for q in frame_paths(node):
            found[s].setdefault(q, None)
    for s in range(n):
        for name in attrs_read[s]:
            target = by_name[name].target
            if target not in p.state and p.resolve(target) is not None:
                found[s].setdefault(target, None)
    return tuple(tuple(f) for f in found)


def _written(p: Program, reads: Mapping[str, str], stage_of: Mapping[str, int]) -> dict[Any, set[int]]:
    """``{what: stages that write it}``, ``what`` a state tensor key or ``("input", name)`` for a
    program input: the values the signature writes back (``state_traffic``'s ``written_back``,
    state only: an input's write-back goes to the caller's tensor), and every in-place write
    (``ir.effects``: ``Effects.writes`` of each writer) of a value whose memory may be a state
    read's or a program input's (``ir.effects.alias_roots``: through views, ``getitem``,
    in-place results, alias-like operators such as ``reshape``). A higher-order op counts as
    the analysis counts it: it writes its operands when its body writes an input, and its
    results may share memory with every operand, so a write of one of them is a write of
    each state or input the op was given (conservative: the split is refused, never wrong).
    O(n)."""
    table = p.state_table()
    traffic = state_traffic(p)
    user = {s.name for s in p.signature.user_inputs()}

    def what(name: str) -> Any:
        fqn = reads.get(name)
        if fqn is not None:
            return table[fqn].tensor
        return ("input", name) if name in user else None

    found: dict[Any, set[int]] = {}
    for value, dest in traffic.written_back.items():
        fqn = reads.get(dest)
        if fqn is not None:
            found.setdefault(table[fqn].tensor, set()).add(stage_of.get(value, 0))
    graph = p.root_module.graph
    effects = graph_effects(p, p.root, graph)
    if not effects.writers:
        return found
    roots = alias_roots(graph, [*reads, *(u for u in user if u not in reads)])
    for writer in effects.writers:
        stage = stage_of.get(writer)
        if stage is None:
            continue
        for value in effects.writes(writer):
            for root in roots.get(value, ()):
                found.setdefault(what(root), set()).add(stage)
    return found


def _held_state(
    p: Program,
    reads: Mapping[str, str],
    readers: Mapping[str, set[int]],
    stage_of: Mapping[str, int],
    paths: tuple[tuple[str, ...], ...],
) -> tuple[tuple[tuple[str, ...], ...], tuple[Mapping[str, str], ...], dict[str, tuple[int, ...]]]:
    """Per stage the fqns held and the renames of state reads to the stage's own read of the
    tensor; the shared fqns. Refuses a cross-stage write. O(n + s * k)."""
    n = len(paths)
    table = p.state_table()
    owners = StateOwners(p)
    key_stages: dict[str, set[int]] = {}
    read_fqn: dict[str, str] = {}
    for name, fqn in reads.items():
        key = table[fqn].tensor
        if name in owners.fqn_of:
            read_fqn.setdefault(key, fqn)
        key_stages.setdefault(key, set()).update(readers.get(name, ()))
    user_readers = {u: readers.get(u, set()) for u in (s.name for s in p.signature.user_inputs())}
    tied_of = {table[f].tensor: owners.aliases[f] for f in p.state_order}
    for key, writers in _written(p, reads, stage_of).items():
        if isinstance(key, tuple):
            # an input written in place: a later stage is sent the written value (an in-place
            # result is a value like any other), but one that reads the input itself reads its
            # own, unwritten copy
            later = sorted(r for r in user_readers.get(key[1], ()) if r > min(writers))
            if later:
                raise PassError(
                    f"split_stages: input {key[1]!r} is written in place in stage "
                    f"{min(writers)} and read in later stage(s) {later}, which take their own "
                    "copy of it and would not see the write. Read the written value (the "
                    "in-place op's result) there, or move a boundary in 'at' so that one stage "
                    "holds the write and every later read"
                )
            continue
        touched = sorted(key_stages.get(key, set()) | writers)
        if len(touched) > 1:
            fqns = ", ".join(repr(f) for f in tied_of[key])
            raise PassError(
                f"split_stages: buffer {fqns} is written in stage(s) {sorted(writers)} and read "
                f"or written in stage(s) {touched}; each stage would hold its own copy and they "
                "would diverge. Move a boundary in 'at' so that one stage holds every use of it"
            )
        key_stages.setdefault(key, set()).update(writers)
    in_stage = [set(ps) for ps in paths]
    held: list[dict[str, None]] = [{} for _ in range(n)]
    seen: set[str] = set()
    for fqn in p.state_order:
        key = table[fqn].tensor
        if key in seen:
            continue
        seen.add(key)
        tied = tied_of[key]
        stages_k = sorted(key_stages.get(key, ()))
        if not stages_k:  # read by no stage: held where its module runs (else stage 0)
            owner = tied[0].rpartition(".")[0]
            stages_k = [next((s for s in range(n) if owner in in_stage[s]), 0)]
            key_stages[key] = set(stages_k)
        for s in stages_k:
            mine = [f for f in tied if f.rpartition(".")[0] in in_stage[s]]
            for f in mine or [read_fqn.get(key, tied[0])]:
                held[s][f] = None
    state = tuple(tuple(f for f in p.state_order if f in held[s]) for s in range(n))
    renames = []
    for s in range(n):
        mine: dict[str, str] = {}
        for fqn in state[s]:
            mine.setdefault(table[fqn].tensor, fqn)
        renames.append(pmap({
            name: mine[table[fqn].tensor] for name, fqn in reads.items()
            if table[fqn].tensor in mine
        }))
    shared = {
        fqn: tuple(sorted(key_stages[table[fqn].tensor]))
        for fqn in p.state_order
        if len(key_stages[table[fqn].tensor]) > 1
    }
    return state, tuple(renames), shared


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
    """``PassError`` when ``node``'s value is known and is no tensor (a value without a ``val``
    is taken for a tensor, as torch's stage would find out when it sends it)."""
    val = node.meta.get("val")
    if val is not None and not isinstance(val, torch.Tensor):
        raise PassError(
            f"split_stages: value %{node.name} ({type(val).__name__}) is made in stage {a} and "
            f"read in stage {b}; a pipeline stage passes tensors only. Move a boundary so that "
            "one stage makes and reads it"
        )
