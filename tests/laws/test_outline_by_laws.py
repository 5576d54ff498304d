"""Laws of ``outline_by`` (``transforms.passes.outline.outline_by``) on generated programs, each key a
partition of the flat root graph into nested calls:

- ``node_frames`` (the module stack, ``outline``'s own key): ``outline_by(p, node_frames) ==
  outline(p)`` on the programs ``outline`` meets, and ``inline`` undoes it (without preserved
  calls);
- the outermost module of each node only (calls one level deep): the result verifies and
  computes what ``p`` computes; ``inline`` of it computes the same too;
- any key: pure, deterministic, idempotent (an outlined program is returned as it is), and no
  compute node is added or dropped (only ``getitem``s of a call's results are);
- no frame for any node: the root graph is ``p``'s.
"""

from __future__ import annotations

import operator
from collections import Counter

from hypothesis import HealthCheck, given, settings
from lawcases import before, examples, without

from ir import Program, verify
from ir.module_stack import Frame
from ir.node import CALL_FUNCTION, Node
from lowering.pass_laws import check_inverse, check_laws
from transforms import inline
from transforms.machinery.frames import node_frames
from transforms.passes.outline import outline, outline_by

NO_PRESERVED = without("preserved_calls")


def by_module(p: Program) -> Program:
    return outline_by(p, node_frames)


def outermost(node: Node) -> tuple[Frame, ...] | None:
    """The outermost call a node runs in (``None``, "keep the current call", is kept)."""
    frames = node_frames(node)
    return frames[:1] if frames else frames


def by_outermost(p: Program) -> Program:
    return outline_by(p, outermost)


def compute_targets(p: Program) -> Counter:
    """Every graph's ``call_function`` targets but ``getitem`` (a call's results are taken
    apart by ``getitem``s in its caller), with their counts."""
    return Counter(
        str(n.target)
        for m in p.modules.values()
        for g in m.graphs
        for n in g.nodes
        if n.op == CALL_FUNCTION and n.target is not operator.getitem
    )


def test_by_module_stack_obeys_the_laws():
    check_laws(by_module, programs=before(outline), idempotent=True, max_examples=examples(40))


def test_by_outermost_module_obeys_the_laws():
    check_laws(
        by_outermost, programs=before(outline, NO_PRESERVED), idempotent=True,
        max_examples=examples(40),
    )


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(before(outline))
def test_by_module_stack_is_outline(p):
    assert by_module(p) == outline(p)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(before(outline, NO_PRESERVED))
def test_inline_undoes_it_by_module_stack(p):
    check_inverse(by_module, inline, p)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(before(outline, NO_PRESERVED))
def test_no_compute_node_is_added_or_dropped(p):
    want = compute_targets(p)
    for q in (by_module(p), by_outermost(p)):
        assert compute_targets(q) == want


@settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(before(outline, NO_PRESERVED))
def test_no_frames_keeps_the_root_graph(p):
    q = verify(outline_by(p, lambda node: ()))
    assert not q.is_outlined
    assert q.root_module.graph == p.root_module.graph


def test_inline_of_outermost_computes_the_same():
    """Inlining undoes the outermost outlining exactly on most programs (the round trip then
    changes nothing, which ``check_laws`` would call vacuous), so what puts the laws to the
    test is the outlined middle: it must hold calls on some of the programs."""
    middles: list[bool] = []

    def round_trip(p: Program) -> Program:
        q = by_outermost(p)
        middles.append(q.is_outlined)
        return inline(q)

    check_laws(round_trip, programs=before(outline, NO_PRESERVED), allow_vacuous=True,
               laws=("purity", "verify", "semantics"), max_examples=examples(30))
    assert any(middles)

