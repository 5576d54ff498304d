"""The laws have teeth for the preserved-call stages on ``crossing_programs``: bugs planted in
``rematerialize`` and ``insert_ivals`` are each caught, by the law named, within ``EXAMPLES``
generated programs (found, not shrunk).

A bug of ``rematerialize`` that changes what the flat program computes is caught by its own
laws. A bug of ``insert_ivals`` is not visible on the flat program (a ``copy_`` of a value into
its own state changes nothing there): it shows once ``outline`` reads the state, so each such
plant is put in the pipeline in the stage's place (``transforms.preserved``, where
``prepare_outline`` finds the stages) and the pipeline's laws catch it. On ``programs()`` with
the same features, where one program in about fifty has a value or state crossing a preserved
call, the plant that keeps only the first write-back of each state went uncaught in 200
programs (measured when this was written).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, settings
from lawcases import before

import transforms.preserved as stages
from ir.args import Ref, map_refs
from ir.graph import Graph
from ir.program import Program
from ir.strategies import crossing_programs
from lowering.pass_laws import LawViolation, check_laws
from transforms import transform
from transforms.machinery.frames import node_frames
from transforms.preserved.ivals import insert_ivals
from transforms.preserved.nesting import preserved_chains
from transforms.preserved.remat import rematerialize

EXAMPLES = 60  # every plant below is found within this many programs
FOUND = settings(settings.default, phases=[Phase.explicit, Phase.reuse, Phase.generate])
FEATURES = frozenset(
    {"crossing_reads", "preserved_calls", "nesting", "repeated_calls", "buffers",
     "inplace_mutation", "functional_mutation", "matrices"}
)


def _with_nodes(p: Program, nodes) -> Program:
    root = p.root_module.replace(graphs=(Graph(tuple(nodes)),))
    return p.replace(modules=p.modules.set(p.root, root))


def _added(p: Program, q: Program) -> list:
    """The root nodes of ``q`` that ``p`` does not have (what the stage inserted)."""
    old = {n.name for n in p.root_module.graph.nodes}
    return [n for n in q.root_module.graph.nodes if n.name not in old]


def _write_backs(p: Program, q: Program) -> set[str]:
    """The ``copy_`` nodes ``insert_ivals`` added to ``p`` (not its snapshots' ``clone``s)."""
    return {n.name for n in _added(p, q) if n.target is torch.ops.aten.copy_.default}


# --- planted bugs in rematerialize --------------------------------------------------------------


def remat_reads_the_operand(p: Program, frames_of=node_frames) -> Program:
    """Takes every op of a recomputed slice for a no-op: a copy's readers read its first
    argument instead."""
    q = rematerialize(p, frames_of)
    skip = {n.name: n.args[0] for n in _added(p, q) if n.args and type(n.args[0]) is Ref}

    def read(r: Ref) -> Ref:
        while r.name in skip:
            r = skip[r.name]
        return r

    return _with_nodes(q, [n.replace(args=map_refs(n.args, read))
                           for n in q.root_module.graph.nodes])


def remat_keeps_the_signatures(p: Program, frames_of=node_frames) -> Program:
    """Rewrites the graph but forgets to rename what the signatures pass and return."""
    return rematerialize(p, frames_of).replace(call_signatures=p.call_signatures)


# --- planted bugs in insert_ivals ---------------------------------------------------------------


def ivals_none(p: Program, frames_of=node_frames) -> Program:
    """Writes nothing back."""
    return p


def ivals_first_only(p: Program, frames_of=node_frames) -> Program:
    """Writes back only the first ival of each state."""
    q = insert_ivals(p, frames_of)
    written, dropped = set(), set()
    copies = _write_backs(p, q)
    for n in _added(p, q):
        if n.name not in copies:
            continue
        if n.args[0].name in written:
            dropped.add(n.name)
        written.add(n.args[0].name)
    return _with_nodes(q, [n for n in q.root_module.graph.nodes if n.name not in dropped])


def ivals_write_the_previous_value(p: Program, frames_of=node_frames) -> Program:
    """Each write-back writes the value before the ival on the state's update chain."""
    q = insert_ivals(p, frames_of)
    graph = q.root_module.graph
    copies = _write_backs(p, q)
    return _with_nodes(q, [
        n.replace(args=(n.args[0], graph.node(n.args[1].name).args[0])) if n.name in copies
        else n
        for n in graph.nodes
    ])


def ivals_in_the_reader(p: Program, frames_of=node_frames) -> Program:
    """Each write-back runs just before the first read across the boundary, in the reading
    call, instead of right after the value, in the call that computes it."""
    q = insert_ivals(p, frames_of)
    graph = q.root_module.graph
    chain = preserved_chains(graph, frames_of, frozenset(q.call_signatures))[0]
    nodes = list(graph.nodes)
    copies = _write_backs(p, q)
    moved: dict[str, list] = {}
    for i, n in enumerate(nodes):
        if n.name not in copies:
            continue
        value = n.args[1].name
        for m in nodes[i + 1:]:
            reads = any(r.name == value for r in m.inputs())
            if m.name not in copies and reads and chain.get(m.name) != chain.get(value):
                moved.setdefault(m.name, []).append(n.replace(meta=m.meta))
                break
        else:
            moved.setdefault(n.name, []).append(n)
    out = []
    for n in nodes:
        out += moved.get(n.name, [])
        if n.name not in copies:
            out.append(n)
    return _with_nodes(q, out)


# --- the checks ---------------------------------------------------------------------------------

# (planted bug, what each law that may catch it first says): a reader sent to a copy's operand
# changes the numbers and, where the copy was an output, leaves the output spec naming a value
# the graph no longer returns; which program comes first decides which law speaks
STAGE = [
    (remat_reads_the_operand, {"semantics": "values differ", "verify": "does not verify"}),
    (remat_keeps_the_signatures, {"idempotence": "applying the pass to its own result"}),
]


@pytest.mark.parametrize(("planted", "says"), STAGE, ids=[p.__name__ for p, *_ in STAGE])
def test_a_bug_planted_in_rematerialize_is_caught_by_its_laws(planted, says):
    programs = before(rematerialize, FEATURES, crossing_programs)
    with pytest.raises(LawViolation) as info:
        check_laws(planted, programs=programs, idempotent=True, max_examples=EXAMPLES,
                   settings=FOUND)
    assert info.value.law in says, info.value.law
    assert says[info.value.law] in str(info.value).splitlines()[0]


PIPELINE = [
    ("rematerialize", remat_keeps_the_signatures, "raises", "PassError"),
    ("insert_ivals", ivals_none, "raises", "PassError"),
    ("insert_ivals", ivals_first_only, "raises", "PassError"),
    ("insert_ivals", ivals_write_the_previous_value, "raises", "PassError"),
    ("insert_ivals", ivals_in_the_reader, "semantics", "values differ"),
]


@pytest.mark.parametrize(
    ("stage", "planted", "law", "says"), PIPELINE, ids=[p.__name__ for _, p, *_ in PIPELINE]
)
def test_a_bug_planted_in_a_stage_is_caught_by_the_pipelines_laws(
    monkeypatch, stage, planted, law, says
):
    monkeypatch.setattr(stages, stage, planted)
    with pytest.raises(LawViolation) as info:
        check_laws(transform, programs=crossing_programs(features=FEATURES), idempotent=True,
                   max_examples=EXAMPLES, settings=FOUND)
    assert info.value.law == law
    assert says in str(info.value).splitlines()[0]


def test_the_stages_as_they_are_pass_where_the_plants_are_caught():
    report = check_laws(transform, programs=crossing_programs(features=FEATURES),
                        idempotent=True, max_examples=EXAMPLES, settings=FOUND)
    assert report.changed == report.tried
