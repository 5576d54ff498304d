"""Outlining: split the flat root graph into one graph per module call.

The flat graph's nodes carry module stacks; each maximal run of nodes inside one call of one
module becomes that module's graph (a new graph variant per call), and the caller gets a
``call_module`` node. Values flow into a call as placeholders and out as outputs, except at
preserved call signatures, where the call takes and returns exactly the eager
``(args, kwargs)`` / output pytrees of ``preserve_module_call_signature``, and state (including
intermediate values of state) is the only other thing that crosses them: the preserved-call
stages (``transforms.preserved``: listed passes that run before this walk) make it so.

The partition key is pluggable (``outline_by``): the module stack is one key, tags another.
This module walks the flat graph and threads values between calls; the builder of one call is
``transforms.machinery.call_builder.OpenCall``, and the pytree plumbing of preserved signatures is
``transforms.preserved.pytrees``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ir.args import map_refs_in, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.module import ModuleId, call_target
from ir.module_stack import NO_STACK, Frame
from ir.node import CALL_FUNCTION, CALL_MODULE, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from ir.signature import STATE_INPUT_KINDS
from transforms import kernel as kn
from transforms.machinery.call_builder import OpenCall, call_base
from transforms.machinery.call_walk import CLOSE, INPUT, NODE, OPEN, call_steps, last_uses
from transforms.machinery.frames import FrameOf, graph_frames, node_frames, part_frames
from transforms.machinery.module_sharing import canonical_paths
from transforms.machinery.module_table import reachable_modules, with_outlined_modules
from transforms.passes.state_sinking import (
    StateOwners,
    finish_sinking,
    input_reads,
    sink_state,
    sinks_in_one_pass,
    sunk_graph,
    sunk_inputs,
)
from transforms.preserved import prepare_outline
from transforms.preserved.pytrees import call_preserved, close_preserved, open_preserved
from transforms.preserved.state_traffic import state_traffic

__all__ = [
    "outline",
    "outline_and_sink",
    "outline_by",
    "outline_parts",
    "prepare_outline_and_sink",
    "reachable_modules",
]

CopiedWhereRead = Callable[[Node], bool]


def outline(program: Program) -> Program:
    """Split the flat root graph into per-call module graphs following ``nn_module_stack``: the
    outlining walk.

    Each maximal run of nodes inside one call of one module becomes a graph variant of that
    module and a ``call_module`` in its caller. Modules that state aliasing shows to be one
    object (every state tensor under two paths tied, same class) become one ModuleId. At a
    preserved call signature the call takes and returns exactly its eager pytrees
    (``transforms.preserved.pytrees``); a value read across its boundary without being in the
    signature must be state and is read from the state: the result of an in-place op, the value
    a ``copy_`` writes (``transforms.preserved.state_traffic``).

    The walk needs the preserved-call stages to have run (``transforms.preserved``:
    ``fill_call_gaps``, ``repair_call_signatures``, ``rematerialize``, ``insert_ivals``; the
    default pipeline lists them before ``outline``). Called on a flat program on which they have
    not run (``transform(p, ["outline"])`` on a raw import), it runs them first: each stage reads
    from the Program whether it has anything to do (a call cut in two; a value that crosses a
    preserved boundary unsigned, from ``state_traffic`` and the call nesting) and returns its
    input itself when not, so on a program the pipeline prepared they only check.

    **Laws:** ``outline(p) == outline(prepare_outline(p))``; ``inline(outline(p))`` is
    alpha-equivalent to ``p`` (without preserved calls); ``outline(outline(p)) == outline(p)``
    (an outlined program is returned as it is); compute nodes are neither added nor removed
    except the call plumbing and what the stages add. Raises ``PassError`` naming the node for a
    node without a module stack, a value that cannot cross a preserved boundary (neither state
    nor on a state's update chain), or from the stages. Complexity: O(n) in the number of
    nodes (the stages' checks, then one walk).
    """
    if program.is_outlined:
        return program
    return _Outliner(prepare_outline(program, node_frames), node_frames).run()


def outline_and_sink(program: Program) -> Program:
    """``sink_state(outline(program))``, in one pass over the flat graph where that is exact.

    Sinking while outlining rebuilds each module graph once instead of twice. It is exact when
    each module sits at one path and no preserved call signature names a state input; otherwise
    (and for a program already outlined) the two passes run one after the other.
    ``transform`` runs this for the pair ``outline, sink_state`` in a pipeline.

    **Laws:** ``outline_and_sink(p) == sink_state(outline(p))``. Complexity: O(n).
    """
    if program.is_outlined:
        return sink_state(program)
    return _outline_and_sink_prepared(prepare_outline(program, node_frames))


def prepare_outline_and_sink(program: Program) -> Program:
    """The preserved-call stages then ``outline_and_sink``, the stages run once.

    ``outline`` runs the stages again on a prepared program, where they only check and return
    it as it is; composed in order they are a fixpoint (``prepare_outline``'s law), so this form
    runs them once. ``transform`` runs it for ``fill_call_gaps, repair_call_signatures,
    rematerialize, insert_ivals, outline, sink_state`` in a pipeline.

    **Laws:** ``prepare_outline_and_sink(p) == outline_and_sink(prepare_outline(p))``. Raises
    ``PassError`` for an outlined program, as the stages do. Complexity: O(n).
    """
    return _outline_and_sink_prepared(prepare_outline(program, node_frames))


def _outline_and_sink_prepared(program: Program) -> Program:
    if program.is_outlined:
        return sink_state(program)
    outliner = _Outliner(program, node_frames, owners=StateOwners(program))
    if outliner.canon or not sinks_in_one_pass(program):
        outliner.owners = None
        return sink_state(outliner.run())
    return finish_sinking(outliner.run())


def outline_by(
    program: Program, frames_of: FrameOf, *, copied: CopiedWhereRead | None = None
) -> Program:
    """``outline`` with another partition key: ``frames_of(node)`` gives the nested calls a node
    runs in (outermost first), or ``None`` to keep it in the current call.

    ``copied(node)`` marks nodes (without inputs, such as ``get_attr``) that belong to no call:
    each call that reads one gets its own copy instead of an input; none is made where unread.
    A copied ``get_attr`` keeps the root-relative target it had, so the result verifies only once
    the caller has moved that state under the calls that read it (as ``split_by_tags`` does).

    Parameters:
        program: a flat Program (an outlined one is returned as it is).
        frames_of: the partition key, node -> its calls (``transforms.stacks.node_frames`` is
            ``outline``'s; ``machinery.frames.part_frames`` is ``outline_parts``').
        copied: nodes copied into each call that reads them (default: none).

    Returns:
        The outlined Program: one graph variant per call, a ``call_module`` per call in its
        caller.

    **Laws** (checked on generated programs, ``tests/laws/test_outline_by_laws.py``; without
    ``copied``): pure and deterministic; the result verifies and computes what ``program``
    computes; idempotent (``outline_by(q, k) is q`` for an outlined ``q``);
    ``outline_by(p, node_frames) == outline(p)`` on a program the preserved-call stages have
    prepared; ``inline(outline_by(p, node_frames))`` is alpha-equivalent to ``p`` without
    preserved calls (with another key, ``inline`` of it computes the same, module type names of
    modules no call opens aside); no compute node is added or dropped, only ``getitem``s of a
    call's results; a key giving every node no frame leaves the root graph as it is.

    **Complexity:** O(n) over the root graph, like ``outline``.
    """
    if program.is_outlined:
        return program
    program = prepare_outline(program, frames_of, fill_gaps=False)
    return _Outliner(program, frames_of, copied).run()


def outline_parts(
    program: Program, part: Mapping[str, int], paths: Sequence[str]
) -> tuple[Program, list[Graph | None]]:
    """``outline_by`` keyed by a partition (``machinery.frames.part_frames``): node ``n`` of the
    flat root graph runs in the one call of the root's child ``paths[part[n]]`` (a node without
    a part stays in the current call), and ``get_attr`` nodes are copied into each part that
    reads them. Returns the outlined Program and each part's graph, ``None`` for a part no node
    runs in: the cut ``split_by_tags`` and ``split_stages`` share. O(n)."""
    outlined = outline_by(program, part_frames(part, paths), copied=_is_get_attr)
    graphs: list[Graph | None] = []
    for path in paths:
        mid = outlined.resolve(path)
        graphs.append(outlined.module(mid).graphs[0] if mid is not None else None)
    return outlined, graphs


def _is_get_attr(node: Node) -> bool:
    return node.op == GET_ATTR


def _never(node: Node) -> bool:
    return False


class _Outliner:
    """One walk over a prepared flat graph (``call_steps``): each node is copied into the
    innermost open call, reading its operands through ``_read`` (which threads a value into the
    call as a placeholder, or reads the state a value stands for); a call that closes becomes
    a graph variant of its module and a ``call_module`` in its caller (``_close_plain``, or
    ``transforms.preserved.pytrees`` for a preserved signature), with its inputs sunk to state
    reads when ``owners`` is given (``outline_and_sink``). ``run`` returns the new Program.

    Mutable while walking: the open calls' builders, ``w`` (the flat graph's
    ``kernel.WorkingGraph``: it draws every new name, those of all the call graphs, and makes
    the nodes named so; a node that keeps a flat value's name is made under that name), ``hidden``
    (values local to a closed preserved call: with the in-place results, the values ``_read``
    does not thread in as a plain input), ``variants/``types``/``subgraph_owner`` (the
    module table to be), ``root_sunk``. One instance runs once.
    """

    def __init__(
        self,
        program: Program,
        frames_of: FrameOf,
        copied: CopiedWhereRead | None = None,
        *,
        owners: StateOwners | None = None,
    ) -> None:
        self.p = program
        self.frames_of = frames_of
        self.copied = copied or _never
        self.graph = program.root_module.graph
        self.nodes = self.graph.nodes
        self.last_use = last_uses(self.graph, frames_of, program.call_signatures)
        self.by_name = self.graph.by_name()
        self.call_signatures = dict(program.call_signatures)  # a dict reads faster than a PMap
        self.canon = canonical_paths(program, _identity_keys(self.graph, frames_of))
        traffic = state_traffic(program)
        self.aliased_state, self.mutated_state = traffic.aliases, traffic.sources
        self.hidden: set[str] = set()
        self.variants: dict[ModuleId, list[Graph]] = {}
        self.types: dict[ModuleId, str | None] = {}
        self.subgraph_owner: dict[str, ModuleId] = {}
        self.state_inputs = {
            s.name for s in program.signature.inputs if s.kind in STATE_INPUT_KINDS
        }
        # draws every new name (of every call's graph: names are unique across them)
        self.w = kn.WorkingGraph(self.graph, indexed=False)
        # sinking while outlining (``outline_and_sink``): where each state input may be a get_attr
        self.owners = owners
        self.root_sunk: dict[str, str] = {}

    # --- driver -----------------------------------------------------------------------------

    def run(self) -> Program:
        root_graph = self._outline_root()
        return with_outlined_modules(
            self.p,
            root_graph,
            self.variants,
            self.types,
            self.subgraph_owner,
            self.canon,
            dropped_inputs=self.root_sunk,
        )

    def _outline_root(self) -> Graph:
        root = OpenCall(None, "", 0, None)
        stack = [root]
        for kind, at, what in call_steps(self.graph, self.frames_of, self.copied):
            if kind == NODE:
                self._copy(stack[-1], what)
            elif kind == OPEN:
                self._open(stack, what, at)
            elif kind == CLOSE:
                self._close(stack, at)
            elif kind == INPUT:
                root.placeholders.append(what)
                root.env[what.name] = what.ref
            else:  # RETURN
                root.body.append(what.replace(args=self._args(root, what.args)))
        self.root_sunk = sunk_inputs(self.owners, root)
        return sunk_graph(root.placeholders, self.root_sunk, root.body)

    def _open(self, stack: list[OpenCall], frame: Frame, start: int) -> None:
        sig = self.call_signatures.get(frame.call_name) if frame.path else None
        call = OpenCall(frame, frame.path, start, sig)
        if sig is not None:
            open_preserved(call, sig, self.w, self.by_name, self._mutated_input)
        stack.append(call)

    # --- copying nodes ----------------------------------------------------------------------

    def _copy(self, call: OpenCall, node: Node, define: bool = True) -> None:
        args = self._args(call, node.args)
        kwargs = node.kwargs if not node.kwargs.items else self._args(call, node.kwargs)
        if node.op == GET_ATTR and self.p.resolve(node.target) is not None:
            self.subgraph_owner[node.target] = self.canon.get(call.path, call.path)
        if args is not node.args or kwargs is not node.kwargs:
            node = node.replace(args=args, kwargs=kwargs)
        call.body.append(node)
        name = node.name
        call.env[name] = ref(name)
        if define:
            call.defined.append(name)

    def _args(self, call: OpenCall, tree: Any) -> Any:
        """``tree`` with each value read as ``call`` sees it (``_read``); the same object when
        nothing changes."""
        return map_refs_in(tree, call.env, lambda r: self._read(call, r.name))

    def _read(self, call: OpenCall, name: str) -> Any:
        """The local value of flat value ``name`` in ``call``, threading it in if needed: a
        value hidden in a closed preserved call, or the result of an in-place op, is read as
        the state it is; a preserved call takes state only, after its positional arguments."""
        found = call.env.get(name)
        if found is not None:
            return found
        shared = self.by_name.get(name)
        if shared is not None and self.copied is not _never and self.copied(shared):
            self._copy(call, shared, define=False)  # a copy per call: never returned from it
            return call.env[name]
        if name in self.hidden:
            return self._read(call, self._ival_source(name, call))
        if name in self.aliased_state:
            # an in-place result is its mutated state: read the state itself (sinkable)
            return self._read(call, self.aliased_state[name])
        if shared is None:
            raise PassError(f"a node reads %{name}, which no node of the root graph defines")
        if call.frame is None:
            raise PassError(f"value %{name} is read before it is defined in the root graph")
        if call.sig is None:
            # the common case: a plain call takes the value as an input (its placeholder is
            # made when the call closes, and only if the input is not sunk)
            call.inputs.append(name)
        else:
            source = self.mutated_state.get(name)
            if source is not None:
                return self._read(call, source)
            if name not in self.state_inputs:
                raise PassError(
                    f"value %{name} is computed outside the preserved call "
                    f"{call.frame.call_name!r} "
                    "and read inside it without being one of its inputs; purefx can only carry "
                    "state and state mutations across a preserved signature"
                )
            # state threaded into a preserved call goes after its positional placeholders (and
            # before its keyword ones); sinking removes it again
            at = call.n_positional + len(call.extra_inputs)
            call.extra_inputs.append(name)
            placeholder = self.w.make_carrying(PLACEHOLDER, name=name, meta=shared.meta)
            call.placeholders.insert(at, placeholder)
        found = call.env[name] = ref(name)
        return found

    def _ival_source(self, name: str, call: OpenCall) -> str:
        source = self.mutated_state.get(name)
        if source is None:
            where = call.frame.call_name if call.frame else "<root>"
            raise PassError(
                f"value %{name} is produced inside a preserved call and read in {where!r} "
                "without being an output of that call; only state mutations can be carried"
            )
        return source

    def _mutated_input(self, name: str) -> str | None:
        """The user input (not state) that value ``name`` is a state of, or ``None``."""
        dest = self.mutated_state.get(name)
        return dest if dest is not None and dest not in self.state_inputs else None

    # --- closing calls ----------------------------------------------------------------------

    def _close(self, stack: list[OpenCall], end: int) -> None:
        call = stack.pop()
        parent = stack[-1]
        mid = self.canon.get(call.path, call.path)
        graphs = self.variants.setdefault(mid, [])
        self.types.setdefault(mid, call.frame.type_name)
        target = call_target(_relative(parent.path, call.path, call.frame), len(graphs))
        sunk = sunk_inputs(self.owners, call)
        if call.sig is not None:
            graph = self._close_preserved(call, parent, target, sunk)
        else:
            graph = self._close_plain(call, parent, target, end, sunk)
        graphs.append(graph)

    def _pass_inputs(self, parent: OpenCall, names: list[str], sunk: dict[str, str]) -> list[Any]:
        """The caller's values for inputs ``names``; a sunk one is still threaded through the
        caller (as ``outline`` alone would, so placeholder order stays the same) but not passed."""
        values = []
        for name in names:
            value = self._read(parent, name)
            if name not in sunk:
                values.append(value)
        return values

    def _close_plain(
        self, call: OpenCall, parent: OpenCall, target: str, end: int, sunk: dict[str, str]
    ) -> Graph:
        # in-place results are not returned: readers outside read the mutated state instead;
        # each output is a value of the flat graph: its ``val`` is the call's result there
        last_use, aliased, env, by_name = self.last_use, self.aliased_state, call.env, self.by_name
        outputs, local, vals = [], [], []
        for v in call.defined:
            if last_use.get(v, -1) >= end and v not in aliased:
                outputs.append(v)
                local.append(env[v])
                vals.append(by_name[v].meta.get("val") if v in by_name else None)
        returned = local[0] if len(local) == 1 else tuple(local)
        w = self.w
        body = call.body
        body.append(w.make_carrying(OUTPUT, "output", (returned,), base="output"))
        args = tuple(self._pass_inputs(parent, call.inputs, sunk))
        if len(outputs) == 1:
            called = w.make_carrying(CALL_MODULE, target, args, meta=call.meta, name=outputs[0],
                                     val=kn.KEEP if vals[0] is None else vals[0])
        else:
            called = w.make_carrying(CALL_MODULE, target, args, base=call_base(target),
                                     meta=call.meta, val=kn.KEEP if None in vals else tuple(vals))
        parent.body.append(called)
        if len(outputs) == 1:
            parent.env[called.name] = called.ref
        else:
            for i, (v, val) in enumerate(zip(outputs, vals)):
                parent.body.append(
                    w.make_carrying(CALL_FUNCTION, operator.getitem, (called.ref, i), name=v,
                                    val=kn.KEEP if val is None else val)
                )
                parent.env[v] = ref(v)
        parent.defined.extend(outputs)
        # the placeholders: one per input not sunk, named as the flat value and with its meta
        placeholders = [
            w.make_carrying(PLACEHOLDER, name=v, meta=by_name[v].meta)
            for v in call.inputs
            if v not in sunk
        ]
        if not sunk:
            return kn.built((*placeholders, *body))
        reads = input_reads(call.inputs, sunk, body, by_name)
        return kn.built((*placeholders, *reads, *body))

    def _close_preserved(
        self, call: OpenCall, parent: OpenCall, target: str, sunk: dict[str, str]
    ) -> Graph:
        body = close_preserved(call, self.w, self.by_name, self._read)
        exported = {out.name for out in call.sig.outputs if out.name}
        now_hidden = [v for v in call.defined if v not in exported]
        self.hidden.update(now_hidden)

        def state_args() -> list[Any]:
            return self._pass_inputs(parent, call.extra_inputs, sunk)

        held = call_preserved(
            call, parent, target, state_args, self.w, self.by_name, self._read
        )
        self.hidden.difference_update(held)
        return sunk_graph(call.placeholders, sunk, body)


# --- helpers ----------------------------------------------------------------------------------


def _identity_keys(graph: Graph, frames_of: FrameOf) -> dict[str, str]:
    """Module path -> identity key, where a key is seen under two paths (strict export's keys
    are object identities; non-strict ones are derived from the path and tell nothing)."""
    # the frame tuples of the nodes with a module stack, each once, by identity
    # (``node_frames`` shares one per stack); held so that no id is reused by a later tuple
    if frames_of is node_frames:
        # ``graph_frames`` is ``NO_STACK`` exactly for the nodes without a module stack
        seen = {id(f): f for f in graph_frames(graph) if f is not NO_STACK and f}
    else:
        seen = {}
        for node in graph.nodes:
            if node.op in (PLACEHOLDER, OUTPUT) or not node.meta.get("nn_module_stack"):
                continue
            frames = frames_of(node)
            if frames:
                seen.setdefault(id(frames), frames)
    paths_of: dict[str, dict[str, None]] = {}
    for frames in seen.values():
        for frame in frames:
            paths_of.setdefault(frame.key, {})[frame.path] = None
    return {path: key for key, paths in paths_of.items() if len(paths) > 1 for path in paths}


def _relative(parent: str, child: str, frame: Frame) -> str:
    if parent == "":
        return child
    if not child.startswith(parent + "."):
        raise PassError(
            f"module call {frame.call_name!r} is not inside its caller {parent!r}; run "
            "fix_module_stacks first"
        )
    return child[len(parent) + 1 :]
