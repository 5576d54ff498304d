"""Torch bugs already listed in ``docs/findings.md``, recognised in findings of the fuzzer.

A :class:`ListedBug` is a predicate ``(finding) -> bool``, asked like the known deviations of
``lowering.fuzz.known`` (``lowering.fuzz.differential`` counts what it explains in
``FuzzReport.known`` under its name, which carries the finding's number, instead of reporting
it as new). It holds for a finding of one of its ``targets`` when ``avoid`` (a rewrite of the
program that computes the same and takes away what the bug needs) changes the program, and the
backend, run again, differs from eager on the program and agrees with eager on the rewritten
one: then the bug was the whole
difference. A second bug in such a program stays a finding (it survives the rewrite).

The ``"unflatten"`` backend's programs have values and state crossing preserved call
boundaries (``lowering.fuzz.fuzz_programs``), which torch's unflatten mishandles in three ways:

- :data:`UNFLATTEN_UNSIGNED_VALUE` (finding 11): a value read across a preserved boundary
  outside the call signature is replaced by the first argument of the operator that made it
  (and written back into that argument). Avoided by purefx's ``rematerialize``, which makes
  every such read an alias or a recomputation on the reading side;
- :data:`UNFLATTEN_STATE_CHAIN` (finding 12): an intermediate value of a buffer updated more
  than once in a preserved call (a functional update chain, as ``run_decompositions`` writes
  it) is written back into the previous intermediate instead of the buffer. Avoided by
  purefx's ``insert_ivals`` after ``rematerialize``, which writes intermediate values of state
  read across a boundary back into the state;
- :data:`UNFLATTEN_ARGUMENT_TWICE` (finding 15): a preserved call that takes one value in two
  argument positions names the second position's value in its unflattened graph after the
  value (``sub`` -> ``sub_1``); when that new name is the name of an intermediate value of a
  buffer made in the call and read by its caller, unflatten writes the intermediate back after
  the wrong node, into the call's list of arguments, and the module crashes. Avoided, after
  finding 11's rewrite, by passing a clone of the value in every position after the first
  (:func:`_passed_apart`).

The ``"export_roundtrip"`` backend meets one more:

- :data:`LOADED_STATE_DETACHED` (finding 17): ``torch.export.load`` rebuilds every buffer and
  tensor constant as a view, so a program's ``detach_`` of one (a no-op on state that needs no
  grad) crashes after the round trip. Avoided by ``detach`` in its place, which reads the same
  values and aliases the same storage. ``docs/findings.md`` counts it as a deviation, not a bug
  (the views are torch's choice); it is recognised here all the same, so that the fuzzer does
  not report it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from ir import ops
from ir import signature as sg
from ir import state as st
from ir.args import ref
from ir.graph import Graph
from ir.module import ModuleId
from ir.node import CALL_FUNCTION, GET_ATTR, PLACEHOLDER
from ir.ops import COPY
from ir.program import Program
from ir.signature import CallSignature
from lowering.fuzz.trial import try_program
from transforms import kernel as kn
from transforms.machinery.each_graph import map_graphs, with_root_graph
from transforms.machinery.frames import node_frames
from transforms.passes.module_stacks import fill_call_gaps
from transforms.preserved.ivals import insert_ivals
from transforms.preserved.nesting import common_prefix, preserved_chains
from transforms.preserved.remat import caller_stack, rematerialize
from transforms.preserved.signatures import repair_call_signatures
from transforms.preserved.state_traffic import state_traffic


@attrs.frozen
class ListedBug:
    """A torch bug of ``docs/findings.md``: ``name`` (it names the ``finding`` number),
    ``finding`` (its number there), ``targets`` (the backend targets it is asked for),
    ``avoid`` (a program to a program that computes the same without what the bug needs; it
    returns its input itself when there is nothing to take away). Called on a finding:
    whether it is this bug (module docstring)."""

    name: str
    finding: int
    targets: frozenset[str]
    avoid: Callable[[Program], Program]

    def __call__(self, finding: Any) -> bool:
        """Whether ``finding`` (a ``lowering.fuzz.Finding``) is this bug: its backend's target
        is one of ``targets``, ``avoid`` changes its program, the backend differs from eager
        on the program and agrees with eager on the rewritten one. Costs one rewrite and two
        builds and runs. Never raises (an error is ``False``)."""
        backend = finding.compiler
        if backend is None or backend.target not in self.targets:
            return False
        try:
            avoided = self.avoid(finding.program)
            if avoided is finding.program:
                return False
            if not _differs(finding.program, backend, finding.setup):
                return False
            trial = try_program(avoided, (backend,), finding.setup)
        except Exception:  # noqa: BLE001 - a predicate that cannot decide says no
            return False
        return trial.eager.error is None and trial.verdicts[backend.name] is None


def _differs(program: Program, backend: Any, setup: Any) -> bool:
    """Whether ``backend`` differs from eager on ``program`` when run here again (the bug
    shows on the program itself, not only in the finding's word)."""
    trial = try_program(program, (backend,), setup)
    return trial.eager.error is None and trial.verdicts[backend.name] is not None


def _signed(program: Program) -> Program:
    """``program`` with every non-state value read across a preserved boundary made an alias
    or a recomputation on the reading side (``fill_call_gaps``, ``repair_call_signatures``,
    ``rematerialize``); ``program`` itself when none is."""
    return rematerialize(repair_call_signatures(fill_call_gaps(program)))


def _state_written_back(program: Program) -> Program:
    """:func:`_signed`, then ``insert_ivals``: intermediate values of state read across a
    preserved boundary written back into the state; ``program`` itself when ``insert_ivals``
    has nothing to do (so that :data:`UNFLATTEN_UNSIGNED_VALUE` keeps what it explains)."""
    signed = _signed(program)
    written = insert_ivals(signed)
    return program if written is signed else written


def _passed_apart(program: Program) -> Program:
    """:func:`_signed`, then each preserved call that takes one value in more than one argument
    position and makes a value of state read across a preserved boundary outside the
    signatures (an intermediate value of a state's update chain, which unflatten writes back
    by its node name: finding 15) passed a ``clone`` of that value in each position after the
    first, made by its caller just before the call starts and named by the call's signature;
    ``program`` itself when there is no such call, or when a repeated value is written in place
    (a clone would not see the write)."""
    signed = _signed(program)
    graph = signed.root_module.graph
    sigs = signed.call_signatures
    if graph is None:
        return program
    chain_of, _, root_stack, stack_of = preserved_chains(graph, node_frames, frozenset(sigs))
    making = {call for value in _crossing_state_values(signed) for call in chain_of[value]}
    repeated = {call: _repeated(sigs[call]) for call in making}
    repeated = {call: names for call, names in repeated.items() if names}
    by_name, users = graph.by_name(), graph.users()
    written = set(state_traffic(signed).aliases)  # the nodes that write a root input in place
    if not repeated or any(
        user in written or ops.is_mutating(by_name[user].target)
        for names in repeated.values() for name in names for user in users[name]
        if by_name[user].op == CALL_FUNCTION
    ):
        return program
    w = kn.WorkingGraph(graph, indexed=False)
    renamed: dict[str, CallSignature] = {}
    current: tuple[str, ...] = ()
    for node in graph.nodes:
        chain = chain_of[node.name]
        for call in chain[common_prefix(current, chain):]:
            if call in repeated:
                stack = caller_stack(call, stack_of(node)) or dict(root_stack)
                renamed[call] = _apart(sigs[call], repeated[call], w, by_name, stack)
        current = chain
        w.add(node)
    apart = with_root_graph(signed, w.finish()[0])
    return apart.replace(call_signatures=sigs.update(renamed))


def _crossing_state_values(program: Program) -> set[str]:
    """The values of state's update chains that ``program`` reads across a preserved boundary
    outside the signatures: those ``insert_ivals`` writes back."""
    written = insert_ivals(program)
    if written is program:
        return set()
    before = program.root_module.graph.by_name()
    return {
        node.args[1].name for node in written.root_module.graph.nodes
        if node.name not in before and node.target is COPY
    }


def _repeated(sig: CallSignature) -> frozenset[str]:
    """The values ``sig`` takes in more than one input position."""
    names = [a.name for a in sig.inputs if a.name]
    return frozenset(n for n in names if names.count(n) > 1)


def _apart(sig: CallSignature, repeated: frozenset[str], w: kn.WorkingGraph,
           by_name: Any, stack: Any) -> CallSignature:
    """``sig`` taking, in each position after the first of a value of ``repeated``, a clone
    of it added to ``w`` now (with the value's meta and the caller's module ``stack``)."""
    seen: set[str] = set()
    inputs = []
    for arg in sig.inputs:
        if arg.name in repeated and arg.name in seen:
            clone = w.make_carrying(CALL_FUNCTION, torch.ops.aten.clone.default,
                                    (ref(arg.name),), meta=by_name[arg.name].meta,
                                    stack=stack, base="clone")
            w.add(clone)
            arg = attrs.evolve(arg, name=clone.name)
        seen.add(arg.name)
        inputs.append(arg)
    return attrs.evolve(sig, inputs=tuple(inputs))


_DETACH_IN_PLACE = torch.ops.aten.detach_.default
_DETACH = torch.ops.aten.detach.default
_LOADED_AS_VIEWS = frozenset({st.BUFFER, st.CONSTANT})
_LOADED_AS_VIEWS_SPECS = frozenset({sg.BUFFER, sg.CONSTANT_TENSOR})


def _state_detached_out_of_place(program: Program) -> Program:
    """``program`` with every ``aten.detach_`` of a buffer or a tensor constant (a state
    placeholder of the root graph, or a ``get_attr`` naming such state by its fqn) made an
    ``aten.detach`` of it; ``program`` itself when it has none."""
    root_state = {spec.name for spec in program.signature.inputs
                  if spec.kind in _LOADED_AS_VIEWS_SPECS}
    slots = program.state_table()

    def reads_loaded_state(mid: ModuleId, node: Any) -> bool:
        if node.op == PLACEHOLDER:
            return mid == program.root and node.name in root_state
        if node.op == GET_ATTR and isinstance(node.target, str):
            slot = slots.get(node.target)
            return slot is not None and slot.kind in _LOADED_AS_VIEWS
        return False

    def rewrite(mid: ModuleId, graph: Graph) -> Graph:
        by_name = graph.by_name()
        found = [n for n in graph if n.target is _DETACH_IN_PLACE and n.args
                 and getattr(n.args[0], "name", None) in by_name
                 and reads_loaded_state(mid, by_name[n.args[0].name])]
        if not found:
            return graph
        swap = {n.name for n in found}
        w = kn.WorkingGraph(graph, indexed=False)
        for n in graph:
            w.add(n.replace(target=_DETACH) if n.name in swap else n)
        return w.finish()[0]

    return map_graphs(program, rewrite)


UNFLATTEN_UNSIGNED_VALUE = ListedBug(
    "torch.unflatten#11: a value read across a preserved boundary outside the signature",
    11, frozenset({"unflatten"}), _signed)
"""docs/findings.md, finding 11."""

UNFLATTEN_STATE_CHAIN = ListedBug(
    "torch.unflatten#12: a buffer updated twice in a preserved call, read by its caller",
    12, frozenset({"unflatten"}), _state_written_back)
"""docs/findings.md, finding 12."""

UNFLATTEN_ARGUMENT_TWICE = ListedBug(
    "torch.unflatten#15: a preserved call taking one value twice makes a buffer's "
    "intermediate value read by its caller",
    15, frozenset({"unflatten"}), _passed_apart)
"""docs/findings.md, finding 15."""

LOADED_STATE_DETACHED = ListedBug(
    "torch.export.load#17: a buffer or constant loaded as a view, then detach_ of it",
    17, frozenset({"export_roundtrip"}), _state_detached_out_of_place)
"""docs/findings.md, finding 17."""

LISTED_BUGS: tuple[ListedBug, ...] = (
    UNFLATTEN_UNSIGNED_VALUE, UNFLATTEN_STATE_CHAIN, UNFLATTEN_ARGUMENT_TWICE,
    LOADED_STATE_DETACHED)
"""The listed torch bugs ``lowering.fuzz.differential`` always asks, after the documented
deviations: finding 11 before 12 and 15 (a program that needs 11's rewrite and another is
counted under the other); finding 17 is asked of another target."""


__all__ = [
    "LISTED_BUGS",
    "LOADED_STATE_DETACHED",
    "UNFLATTEN_ARGUMENT_TWICE",
    "UNFLATTEN_STATE_CHAIN",
    "UNFLATTEN_UNSIGNED_VALUE",
    "ListedBug",
]
