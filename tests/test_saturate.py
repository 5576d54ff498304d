"""``transforms.rewrite.saturate``: equality saturation over the IR, then extraction.

Matrix chains reach their cheapest association with associativity both ways; distributivity
in both directions does not cycle; an enabling step of benefit 0 lets a fusion match; ``p`` is
returned itself when nothing is cheaper; limits stop the search and the report says which;
the extracted program computes what the original does (the in-context law's comparison)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ir import PassError, import_ep
from ir.printer import format_graph, format_program
from transforms.rewrite import (
    Rule,
    SaturationLimits,
    rewrite,
    saturate,
    saturate_report,
)
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.cost import program_cost, roofline

M3 = (torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 6))
REASSOC = frozenset({"reassociate"})


def _rule(pattern, replacement, example, name, **kw):
    # trusted: these tests are about the search; test_assoc_rule_is_checked checks one rule
    return Rule(pattern, replacement, example, name=name, trusted=True, specials=False,
                assumes=REASSOC, **kw)


ASSOC = _rule(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), M3, "assoc",
              both_ways=True)
ASSOC_RIGHT = _rule(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), M3, "right")
ASSOC_LEFT = _rule(lambda a, b, c: a @ (b @ c), lambda a, b, c: (a @ b) @ c, M3, "left")
E3 = (torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5))
FACTOR = _rule(lambda a, b, c: a * b + a * c, lambda a, b, c: a * (b + c), E3, "factor",
               both_ways=True)


class _Three(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, a, b, c):
        return self.fn(a, b, c)


class _Four(_Three):
    def forward(self, a, b, c, d):
        return self.fn(a, b, c, d)


class _Five(_Three):
    def forward(self, a, b, c, d, e):
        return self.fn(a, b, c, d, e)


def _export(fn, *args):
    module = {3: _Three, 4: _Four, 5: _Five}[len(args)](fn)
    return import_ep(torch.export.export(module, args))


def _body(p) -> str:
    """The root graph's compute lines, names dropped to their operator and arguments."""
    return format_graph(p.root_module.graph).strip()


def _chain3(a, b, c):
    return (a @ b) @ c


def _chain4(a, b, c, d):
    return ((a @ b) @ c) @ d


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        # (a@b)@c is cheapest: kept, the program itself
        ([(1024, 1024), (1024, 8), (8, 1024)], None),
        # a@(b@c) is cheapest: b@c first
        ([(1024, 1024), (1024, 1024), (1024, 8)], """\
%a = placeholder
%b = placeholder
%c = placeholder
%matmul_2 = call_function[aten.matmul.default](%b, %c)
%matmul_3 = call_function[aten.matmul.default](%a, %matmul_2)
return (%matmul_3,)"""),
        ([(8, 1024), (1024, 1024), (1024, 1024)], None),
    ],
)
def test_matrix_chain_of_three_reaches_the_cheapest_association(shapes, expected):
    p = _export(_chain3, *(torch.randn(*s) for s in shapes))
    q, report = saturate_report(p, [ASSOC], assume=REASSOC)
    if expected is None:
        assert q is p
        assert report.chosen == "original"
    else:
        assert _body(q) == expected
        assert report.chosen == "saturate"
        assert report.cost_after < report.cost_before
        assert report.rewrites == {"assoc": 1}
    assert report.stopped == ("saturated",)


def test_matrix_chain_of_four_reaches_a_middle_association():
    # (a @ (b @ c)) @ d: b@c is small (8x8); neither all-left nor all-right
    shapes = [(512, 8), (8, 2048), (2048, 8), (8, 512)]
    p = _export(_chain4, *(torch.randn(*s) for s in shapes))
    q, report = saturate_report(p, [ASSOC], assume=REASSOC)
    lines = [ln.split("= ")[1] for ln in _body(q).splitlines() if "matmul" in ln
             and "return" not in ln]
    assert lines[0] == "call_function[aten.matmul.default](%b, %c)"
    assert report.cost_after < report.cost_before
    # the best of all five associations, costed by the same model
    best = min(
        program_cost(_export(f, *(torch.randn(*s) for s in shapes)))
        for f in (
            lambda a, b, c, d: ((a @ b) @ c) @ d, lambda a, b, c, d: (a @ (b @ c)) @ d,
            lambda a, b, c, d: a @ ((b @ c) @ d), lambda a, b, c, d: a @ (b @ (c @ d)),
            lambda a, b, c, d: (a @ b) @ (c @ d),
        )
    )
    assert report.cost_after == pytest.approx(best)


def test_a_rule_and_its_reverse_passed_together_do_not_cycle():
    shapes = [(1024, 1024), (1024, 1024), (1024, 8)]
    p = _export(_chain3, *(torch.randn(*s) for s in shapes))
    with pytest.raises(PassError, match="saturate"):
        rewrite(p, [ASSOC_RIGHT, ASSOC_LEFT], assume=REASSOC)  # greedy cycles, and says so
    q, report = saturate_report(p, [ASSOC_RIGHT, ASSOC_LEFT], assume=REASSOC)
    assert report.greedy_cost is None  # greedy raised: nothing to compare
    assert report.chosen == "saturate"
    assert "%matmul_2 = call_function[aten.matmul.default](%b, %c)" in _body(q)


def test_distributivity_both_ways_factors_without_cycling():
    p = _export(lambda a, b, c: a * b + a * c, *E3)
    q, report = saturate_report(p, [FACTOR], assume=REASSOC)
    assert _body(q) == """\
%a = placeholder
%b = placeholder
%c = placeholder
%add_1 = call_function[aten.add.Tensor](%b, %c)
%mul_2 = call_function[aten.mul.Tensor](%a, %add_1)
return (%mul_2,)"""
    assert report.stopped == ("saturated",)
    assert report.rewrites == {"factor": 1}
    # the factored program is a fixpoint: nothing cheaper from there
    assert saturate(q, [FACTOR], assume=REASSOC) is q


def test_an_enabling_step_of_benefit_zero_lets_a_fusion_match():
    # (a @ b) * s + c: moving the scale onto a (benefit 0) lets a@b + c fuse into addmm
    move = _rule(lambda a, b, s: (a @ b) * s, lambda a, b, s: (a * s) @ b,
                 (torch.randn(3, 4), torch.randn(4, 5), 0.5), "move_scale")
    fuse = _rule(lambda a, b, c: a @ b + c, lambda a, b, c: torch.addmm(c, a, b),
                 (torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)), "fuse")
    args = (torch.randn(256, 16), torch.randn(16, 256), torch.randn(256, 256))
    p = _export(lambda a, b, c: (a @ b) * 0.125 + c, *args)
    assert saturate(p, [fuse], assume=REASSOC) is p  # the fusion alone cannot match
    q, report = saturate_report(p, [move, fuse], assume=REASSOC)
    body = _body(q)
    assert "aten.addmm.default" in body and "aten.mul.Tensor](%a, 0.125)" in body
    assert report.rewrites == {"fuse": 1}  # move_scale's result is not kept, only its a * s
    check_extracted(p, q, args, REASSOC)


def test_purity_the_input_is_untouched_and_returned_when_nothing_is_cheaper():
    p = _export(_chain3, *(torch.randn(*s) for s in [(1024, 1024), (1024, 1024), (1024, 8)]))
    text = format_program(p, vals=False)
    snapshot = copy.copy(p.root_module.graph.nodes)
    q = saturate(p, [ASSOC], assume=REASSOC)
    assert q is not p
    assert format_program(p, vals=False) == text and p.root_module.graph.nodes == snapshot
    assert saturate(p, []) is p
    assert saturate(q, [ASSOC], assume=REASSOC) is q
    # not granted: neither checked nor applied, and the report says so
    q2, report = saturate_report(p, [ASSOC])
    assert q2 is p and "not granted" in report.skipped_rules["assoc"]


def test_the_default_node_limit_scales_with_the_program():
    limits = SaturationLimits()
    assert limits.nodes is None and limits.node_limit(10) == 20_000  # NODES, as before
    assert limits.node_limit(10_000) == 160_000  # growth x the e-graph as built
    assert SaturationLimits(nodes=8).node_limit(10_000) == 8  # a number given is kept
    assert SaturationLimits(growth=2.0).node_limit(50_000) == 100_000


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        (SaturationLimits(iterations=1), "iterations"),
        (SaturationLimits(nodes=8), "nodes"),
        (SaturationLimits(seconds=0.0), "seconds"),
    ],
)
def test_limits_stop_the_search_and_the_report_says_which(limits, why):
    shapes = [(64, 64)] * 5
    p = _export(lambda a, b, c, d, e: (((a @ b) @ c) @ d) @ e,
                *(torch.randn(*s) for s in shapes))
    _, report = saturate_report(p, [ASSOC], assume=REASSOC, limits=limits)
    assert report.stopped == (why,)
    assert report.sizes[0][-1] <= max(limits.node_limit(report.sizes[0][0]) + 16,
                                      report.sizes[0][0])
    assert report.cost_after <= report.cost_before
    if why == "iterations":
        assert len(report.sizes[0]) == 2  # built, then one round


def test_a_custom_cost_model_decides():
    # a cost that only counts launches: every association costs the same, nothing changes
    p = _export(_chain3, *(torch.randn(*s) for s in [(1024, 1024), (1024, 1024), (1024, 8)]))
    assert saturate(p, [ASSOC], assume=REASSOC, cost=lambda t, a, k, v: 1.0) is p
    # a cost that penalises matmuls whose left operand is an input named by its first dim
    q = saturate(p, [ASSOC], assume=REASSOC, cost=roofline)
    assert q is not p


def test_assoc_rule_is_checked_once_before_saturation():
    wrong = Rule(lambda a, b, c: (a @ b) @ c, lambda a, b, c: (a @ b) @ c + 1, M3,
                 name="wrong")
    p = _export(_chain3, *M3)
    with pytest.raises(PassError, match="wrong"):
        saturate(p, [wrong])


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(dims=st.lists(st.integers(1, 40), min_size=5, max_size=5),
       ops=st.lists(st.sampled_from(["mm", "fma"]), min_size=3, max_size=3))
def test_sound_extracted_programs_compute_what_the_original_does(dims, ops):
    # generated chains of matmuls and a*b + a*c sums at generated shapes, searched with
    # associativity and factoring both ways under a cost that makes shapes matter
    def fn(a, b, c, d):
        out = a
        for op, x in zip(ops, (b, c, d)):
            out = out @ x if op == "mm" else out * x.sum() + out * x.mean()
        return out

    shapes = [(dims[0], dims[1])]
    cur = shapes[0]
    for op, (i, j) in zip(ops, ((1, 2), (2, 3), (3, 4))):
        if op == "mm":
            shapes.append((cur[1], dims[j]))
            cur = (cur[0], dims[j])
        else:  # a scale drawn from a tensor of any shape
            shapes.append((dims[i], dims[j]))
    args = tuple(torch.rand(*s) for s in shapes)
    p = _export(fn, *args)
    q = saturate(p, [ASSOC, FACTOR], assume=REASSOC,
                 cost=lambda t, a, k, v: 1.0 + sum(x.numel() for x in a
                                                   if isinstance(x, torch.Tensor)))
    check_extracted(p, q, args, REASSOC)


def test_in_place_code_stays_sound():
    # export makes the in-place add functional; the search around it stays sound
    def fn(a, b, c):
        m = a @ b
        m.add_(1.0)
        return m @ c

    args = tuple(torch.randn(*s) for s in [(1024, 1024), (1024, 1024), (1024, 8)])
    p = _export(fn, *args)
    q = saturate(p, [ASSOC], assume=REASSOC)
    check_extracted(p, q, args, REASSOC)
    assert "aten.add" in _body(q)


class _Inner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(64, 64))
        self.w2 = torch.nn.Parameter(torch.randn(64, 2))

    def forward(self, x):
        return (x @ self.w1) @ self.w2


class _Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _Inner()
        self.b = _Inner()

    def forward(self, x):
        return self.a(x).sum() + self.b(x).sum()


def test_outlined_program_each_module_graph_searched_once():
    from lowering import lower
    from transforms import transform

    torch.manual_seed(0)
    model = _Outer().eval()
    x = torch.rand(4096, 64)
    p = transform(import_ep(torch.export.export(model, (x,))))
    q, report = saturate_report(p, [ASSOC], assume=REASSOC)
    assert report.chosen == "saturate" and report.cost_after < report.cost_before
    texts = [format_graph(g) for mod in q.module_table().values() for g in mod.graphs]
    # w1 @ w2 (64x2) first in each module's graph: one e-graph per module graph
    assert sum(bool(re.search(r"matmul\.default\]\(%p_\w_w1, %p_\w_w2\)", t))
               for t in texts) == 2
    assert report.rewrites == {"assoc": 2} and len(report.sizes) == 3
    got = lower(q)(x)
    torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-2)


def test_roofline_formula():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from transforms.rewrite import cost as c

    with FakeTensorMode() as mode:
        a, b = torch.empty(1024, 512), torch.empty(512, 256)
        out = a @ b
        v = torch.empty(1024, 512).t()
    mm = c.roofline(torch.ops.aten.matmul.default, (a, b), {}, out)
    flops = 2 * 1024 * 256 * 512
    moved = 4 * (1024 * 512 + 512 * 256 + 1024 * 256)
    assert mm == pytest.approx(c.LAUNCH_US + 1e6 * max(flops / c.PEAK_FLOPS,
                                                       moved / c.PEAK_BYTES))
    add = c.roofline(torch.ops.aten.add.Tensor, (a, a), {}, a)
    assert add == pytest.approx(c.LAUNCH_US + 1e6 * 3 * 4 * 1024 * 512 / c.PEAK_BYTES)
    assert c.roofline(torch.ops.aten.t.default, (a,), {}, v) == 0.0  # a view is free
    del mode


def test_measured_cost_is_a_value_the_caller_holds():
    from transforms.rewrite.cost import measured_cost

    p = _export(_chain3, *(torch.randn(*s) for s in [(64, 64), (64, 64), (64, 2)]))
    m = measured_cost(repeats=1)
    q = saturate(p, [ASSOC], assume=REASSOC, cost=m)
    timed = dict(m.table)
    assert timed and all(v >= 0 for v in timed.values())
    assert saturate(p, [ASSOC], assume=REASSOC, cost=m) is not None
    assert m.table == timed  # the same operators at the same shapes: not timed again
    assert measured_cost().table == {}  # nothing shared between values
    assert q is p or "matmul" in _body(q)


def test_where_is_checked_on_the_class_data():
    only_f64 = _rule(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), M3, "f64",
                     where=lambda m: m.val(0).dtype == torch.float64)
    p = _export(_chain3, *(torch.randn(*s) for s in [(1024, 1024), (1024, 1024), (1024, 8)]))
    assert saturate(p, [only_f64], assume=REASSOC) is p  # float32: the where says no
    q = saturate(p, [attrs_evolve(only_f64, where=lambda m: m.val(0).dtype == torch.float32)],
                 assume=REASSOC)
    assert q is not p


def attrs_evolve(rule, **kw):
    import attrs

    return attrs.evolve(rule, **kw)


def test_two_equal_returned_values_stay_two_tensors():
    # hash-consing makes the two chains one class; the outputs must not become one tensor
    args = tuple(torch.rand(*s) for s in [(256, 256), (256, 256), (256, 4)])
    p = _export(lambda a, b, c: ((a @ b) @ c, (a @ b) @ c), *args)
    q = saturate(p, [ASSOC], assume=REASSOC)
    assert q is not p
    check_extracted(p, q, args, REASSOC)  # values and aliasing of the outputs
    outs = [r.name for r in q.root_module.graph.nodes[-1].inputs()]
    assert len(set(outs)) == 2
