"""What ``atol``/``rtol`` mean where the input program's own output is not finite (issue 60): a
tolerance speaks of finite values (``ir.harness.FINITE_TOLERANCE``). Where the reference is
NaN or ±inf a position is not judged (a correct approximation of ``gelu`` gives ``inf`` where
exact ``gelu`` gives NaN); where it is finite the result must be finite and within the
tolerance; the positions so excused are counted (``LawReport.excused``), and a pass judged on
no position at all is vacuous. Without a tolerance the comparison stays exact at the specials.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from ir import import_ep
from ir.harness import FINITE_TOLERANCE, Judged, judged_positions, value_difference
from lowering.like import programs_like
from lowering.pass_laws import check_laws, check_semantics
from transforms.edit import rewrite_nodes
from transforms.machinery.law_violation import LawViolation

aten = torch.ops.aten
TOL = {"atol": 1e-3, "rtol": 1e-3}
INF = math.inf


class GeluMLP(torch.nn.Module):
    """Linear, exact gelu, linear; and gelu of the input itself (edge values reach it)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(8, 4, generator=gen))
        self.w2 = torch.nn.Parameter(torch.randn(3, 8, generator=gen))

    def forward(self, x):
        h = torch.nn.functional.gelu(x @ self.w1.t())
        return h @ self.w2.t(), torch.nn.functional.gelu(x)


def _program():
    return import_ep(torch.export.export(GeluMLP(), (torch.randn(2, 4),)))


def _gelu_as(form):
    """A pass replacing each exact ``gelu`` by ``form(e, x)``."""

    def gelu_pass(p):
        def visit(node, e):
            if node.target is aten.gelu.default and e.kwargs.get("approximate", "none") == "none":
                return form(e, e.args[0])
            return None

        return rewrite_nodes(p, visit)

    return gelu_pass


def _tanh_form(c: float):
    """``0.5 x (1 + tanh(c (x + 0.044715 x³)))``: gelu's tanh approximation at ``c =
    sqrt(2/pi)``."""

    def form(e, x):
        cube = e.call(aten.mul.Tensor, e.call(aten.mul.Tensor, x, x), x)
        inner = e.call(aten.add.Tensor, x, e.call(aten.mul.Tensor, cube, 0.044715))
        t = e.call(aten.tanh.default, e.call(aten.mul.Tensor, inner, c))
        return e.call(aten.mul.Tensor, e.call(aten.mul.Tensor, x, 0.5),
                      e.call(aten.add.Tensor, t, 1.0))

    return form


def _sigmoid_form(e, x):
    """``x sigmoid(1.702 x)``: a coarser approximation (off by up to ~0.02)."""
    return e.call(aten.mul.Tensor, x,
                  e.call(aten.sigmoid.default, e.call(aten.mul.Tensor, x, 1.702)))


GELU_TANH = _gelu_as(_tanh_form(math.sqrt(2 / math.pi)))
GELU_WRONG_CONSTANT = _gelu_as(_tanh_form(0.9))
GELU_SIGMOID = _gelu_as(_sigmoid_form)
EDGES = torch.tensor([[INF, -INF, 3.4e38, 0.5], [-3.4e38, 1.0, -0.0, 2.0]])


def _edge_inputs(p):
    return (EDGES.clone(),), {}


# --- the comparison -----------------------------------------------------------------------------


def test_a_tolerance_judges_finite_reference_values_only():
    want = torch.tensor([math.nan, INF, 1.0, 2.0])
    tol = {"assumes": FINITE_TOLERANCE, **TOL}
    assert value_difference(torch.tensor([3e36, math.nan, 1.0, 2.0]), want, **tol) is None
    # where the reference is finite: a non-finite or a far result breaks the law
    assert "got inf" in value_difference(torch.tensor([0.0, 0.0, INF, 2.0]), want, **tol)
    assert "got nan" in value_difference(torch.tensor([0.0, 0.0, math.nan, 2.0]), want, **tol)
    assert "got 1.5" in value_difference(torch.tensor([0.0, 0.0, 1.5, 2.0]), want, **tol)
    # exact at the specials without it
    assert value_difference(torch.tensor([3e36, INF, 1.0, 2.0]), want) is not None
    assert judged_positions(torch.tensor([3e36, INF, 1.0, 2.0]), want) == (2, 1)
    assert judged_positions((torch.tensor([1, 2]),), (torch.tensor([1, 3]),)) == (2, 0)


# --- check_semantics on inputs at the edges -----------------------------------------------------


def test_exact_gelu_is_nan_at_inf_where_its_tanh_form_is_not():
    x = torch.tensor([INF, 3.4e38])
    assert torch.isnan(torch.nn.functional.gelu(x)[0])  # the reason for the decision
    assert torch.isfinite(torch.nn.functional.gelu(x, approximate="tanh")[1])


def test_the_tanh_approximation_passes_with_a_tolerance_and_counts_what_it_excused():
    p = _program()
    seen = Judged()
    check_semantics(GELU_TANH, p, inputs=_edge_inputs, judged=seen, **TOL)
    assert seen.excused > 0 and seen.judged > 0
    with pytest.raises(LawViolation, match="want nan"):  # exact without a tolerance
        check_semantics(GELU_TANH, p, inputs=_edge_inputs)


@pytest.mark.parametrize("wrong", [GELU_WRONG_CONSTANT, GELU_SIGMOID],
                         ids=["wrong_constant", "sigmoid"])
def test_a_wrong_approximation_is_caught_where_the_reference_is_finite(wrong):
    with pytest.raises(LawViolation, match="values differ"):
        check_semantics(wrong, _program(), inputs=_edge_inputs, **TOL)


def test_a_result_not_finite_where_the_reference_is_breaks_the_law():
    # gelu(x) / (x - x): NaN or inf everywhere; the reference is finite at the finite inputs
    def form(e, x):
        return e.call(aten.div.Tensor, e.call(aten.gelu.default, x, approximate="tanh"),
                      e.call(aten.sub.Tensor, x, x))

    with pytest.raises(LawViolation, match="got (nan|inf|-inf), want"):
        check_semantics(_gelu_as(form), _program(), inputs=_edge_inputs, **TOL)


# --- check_laws on programs_like ----------------------------------------------------------------

_LIKE = settings(max_examples=12, derandomize=True, database=None)


def test_on_programs_like_the_approximation_passes_and_a_wrong_one_is_caught():
    ep = torch.export.export(GeluMLP(), (torch.randn(2, 4),))
    # the draws with inputs at the edges that hold a value gelu does not keep finite, whichever
    # others the stream holds
    edges = programs_like(ep).filter(
        lambda ex: "inputs at the edges" in ex.variant and any(
            isinstance(a, torch.Tensor) and a.is_floating_point() and not a.isfinite().all()
            for a in ex.args))
    report = check_laws(GELU_TANH, programs=edges, settings=_LIKE, **TOL)
    assert report.excused > 0 and report.unjudged < report.changed  # edge values were excused
    with pytest.raises(LawViolation, match="values differ"):
        check_laws(GELU_SIGMOID, programs=programs_like(ep), settings=_LIKE, **TOL)


class Overflowed(torch.nn.Module):
    def forward(self, x):
        return x * INF


def _negate_the_scale(p):
    def visit(node, e):
        if node.target is aten.mul.Tensor:
            return e.call(aten.mul.Tensor, e.args[0], -INF)
        return None

    return rewrite_nodes(p, visit)


def test_a_pass_judged_only_where_the_reference_is_not_finite_is_vacuous():
    p = import_ep(torch.export.export(Overflowed(), (torch.randn(3),)))
    just = st.just(p)
    with pytest.raises(LawViolation, match="judged no value"):
        check_laws(_negate_the_scale, programs=just, max_examples=2, **TOL)
    report = check_laws(_negate_the_scale, programs=just, max_examples=2, allow_vacuous=True,
                        **TOL)
    assert report.unjudged == report.changed > 0 and "judged nowhere" in str(report)
    with pytest.raises(LawViolation, match="values differ"):  # exact: -inf is not inf
        check_laws(_negate_the_scale, programs=just, max_examples=2)


# --- the sign of zero under a tolerance ---------------------------------------------------------


class NegZero(torch.nn.Module):
    """``relu(x) * x``: -0.0 wherever ``x`` is negative."""

    def forward(self, x):
        return torch.relu(x) * x


def _round_inputs(e, x):
    """``x`` rounded to a multiple of 0.5 (a small negative value becomes +0.0)."""
    return e.call(aten.mul.Tensor, e.call(aten.round.default, e.call(aten.mul.Tensor, x, 2.0)),
                  0.5)


def _rounds_inputs(p):
    def visit(node, e):
        if node.target is aten.relu.default:
            return e.call(aten.relu.default, _round_inputs(e, e.args[0]))
        return None

    return rewrite_nodes(p, visit)


def _neg_zero_inputs(p):
    return (torch.tensor([[-0.1, -0.2, 0.1, 0.7]]),), {}


def test_a_tolerance_makes_minus_zero_equal_plus_zero_and_exactness_does_not():
    """A pass that rounds on purpose turns ``0 * -0.1 = -0.0`` into ``+0.0``: within any
    tolerance (the two differ by nothing a bound measures); without one the sign is judged."""
    p = import_ep(torch.export.export(NegZero(), (torch.randn(1, 4),)))
    check_semantics(_rounds_inputs, p, inputs=_neg_zero_inputs, atol=0.5, rtol=0.0)
    with pytest.raises(LawViolation, match="got 0.0"):
        check_semantics(_rounds_inputs, p, inputs=_neg_zero_inputs)
    # a zero of the wrong sign is all the tolerance forgives: a far value still breaks it
    with pytest.raises(LawViolation, match="values differ"):
        check_semantics(_rounds_inputs, p, inputs=_neg_zero_inputs, atol=1e-3, rtol=0.0)
