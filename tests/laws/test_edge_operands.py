"""``edge_operands``: values at the edges reach the operands of ops in default programs, and
what a user declares keeps them out: ``programs(assumes=...)`` (a pass right only on finite
values gets no poisoned program) and a tolerance (``check_laws(atol=, rtol=)`` judges finite
positions only, so a correct pass checked with one is not vacuous on poisoned draws).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import InvalidArgument, NoSuchExample

from ir.args import Ref
from ir.strategies import FEATURES, OPSET_FEATURES, OPT_IN_FEATURES, WIDTH, program_inputs, programs
from lowering import lower
from lowering.pass_laws import check_laws
from transforms import rewrite_nodes

aten = torch.ops.aten
FIXED = frozenset(FEATURES) - set(OPSET_FEATURES) - OPT_IN_FEATURES - {"edge_operands"}
FIND = settings(database=None, derandomize=True, max_examples=300, deadline=None,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck))
NONE_FOUND = settings(FIND, max_examples=150)  # a search that must come back empty (cheaper)


def _poisons(p) -> list[float]:
    """The edge literals ``where`` / ``masked_fill`` put in a value of ``p``."""
    found = []
    for n in p.root_module.graph.nodes:
        if n.target is aten.where.ScalarSelf:
            found.append(n.args[1])
        elif n.target is aten.masked_fill.Scalar and isinstance(n.args[2], float):
            found.append(n.args[2])
    return found


def _poisoned(p) -> bool:
    return any(n.target is aten.where.ScalarSelf for n in p.root_module.graph.nodes)


@settings(max_examples=30, database=None, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(programs(features=FIXED | {"edge_operands"}, always={"edge_operands"}))
def test_a_poisoned_value_is_at_an_edge_in_one_column_and_ordinary_in_others(p):
    """Each poison is an edge literal put in one column (``arange(WIDTH) == k``), so the other
    columns keep their ordinary values; the program runs. (The opset's rows are off: its
    ``where.ScalarSelf`` row takes a sample's own scalar.)"""
    graph = p.root_module.graph
    # (none where the body filled ``max_nodes`` before the step's place)
    for n in (n for n in graph.nodes if n.target is aten.where.ScalarSelf):
        edge = n.args[1]
        assert isinstance(edge, float) and (not math.isfinite(edge) or abs(edge) > 1e38), n
        mask = graph.node(n.args[0].name)
        assert mask.target is aten.eq.Scalar and 0 <= mask.args[1] < WIDTH, mask
        assert graph.node(mask.args[0].name).target is aten.arange.default
    args, kwargs = program_inputs(p)
    lower(p)(*args, **kwargs)


def test_a_fold_reads_a_poisoned_value_in_default_programs():
    """Without being asked for: ``x * 0``, ``x - x``, ``x / x`` and ``log(exp(x))`` of a
    value that holds an edge, each in some default program."""
    for reads in (
        lambda n: n.target is aten.mul.Tensor and n.args[1:] == (0.0,),
        lambda n: n.target is aten.sub.Tensor and len(n.args) == 2 and n.args[0] == n.args[1],
        lambda n: n.target is aten.div.Tensor and len(n.args) == 2 and n.args[0] == n.args[1],
        lambda n: n.target is aten.exp.default,
    ):
        def poisoned_read(p, reads=reads):
            nodes = p.root_module.graph.by_name()
            edged = {n.name for n in nodes.values()
                     if n.target in (aten.where.ScalarSelf, aten.masked_fill.Scalar)}
            return any(reads(n) and isinstance(n.args[0], Ref) and n.args[0].name in edged
                       for n in nodes.values() if n.op == "call_function")

        find(programs(), poisoned_read, settings=FIND)


@pytest.mark.parametrize("assumed", [{"no_nans"}, {"no_infs"}, {"no_nans", "no_infs"}])
def test_a_pass_that_assumes_finite_values_gets_no_poisoned_program(assumed):
    with pytest.raises(NoSuchExample):
        find(programs(assumes=assumed), _poisoned, settings=NONE_FOUND)


def test_no_signed_zeros_puts_no_negative_zero():
    def negative_zero(p):
        return any(v == 0 and math.copysign(1.0, v) < 0 for v in _poisons(p))

    find(programs(always={"edge_operands"}), negative_zero, settings=FIND)  # there without it
    with pytest.raises(NoSuchExample):
        find(programs(always={"edge_operands"}, assumes={"no_signed_zeros"}), negative_zero,
             settings=NONE_FOUND)
    find(programs(assumes={"no_signed_zeros"}), _poisoned, settings=FIND)  # still poisoned


@pytest.mark.parametrize("kwargs, named", [
    ({"assumes": "no_nans"}, "assumes"),
    ({"assumes": {"finite"}}, "assumes"),
    ({"assumes": {"no_nans"}, "always": {"edge_operands"}}, "always"),
    ({"assumes": {"no_infs"}, "always": {"edge_values"}}, "always"),
])
def test_bad_assumptions_name_the_argument(kwargs, named):
    with pytest.raises(InvalidArgument, match=named):
        programs(**kwargs).example()


def _guarded(p):
    """A pass that changes values on purpose where they are not finite: each floating user
    output that nothing else reads becomes ``where(isfinite(v), v, 0)`` (a guard against
    overflow, as a quantizer clips). Exact where the input program's value is finite, other
    than it where not. The outputs, not an operator the generator may leave out (it guarded
    ``relu`` once, and a stream without a non-finite ``relu`` judged nothing on torch 2.14):
    every poisoned program whose poison reaches an output has positions to excuse."""
    graph = p.root_module.graph
    users = graph.users()
    outputs = {s.name for s in p.signature.user_outputs()}
    output_node = graph.nodes[-1].name
    guarded = {name for name in outputs
               if name is not None and set(users.get(name, ())) == {output_node}}

    def visit(node, e):
        val = e.val(node.ref)
        if node.name not in guarded or not isinstance(val, torch.Tensor) \
                or not val.is_floating_point():
            return None
        return e.call(aten.where.ScalarOther, e.call(aten.isfinite.default, node.ref), node.ref,
                      0.0)

    return rewrite_nodes(p, visit)


def test_a_correct_pass_checked_with_a_tolerance_is_judged_on_poisoned_programs():
    """Every program poisoned: the tolerance excuses the non-finite positions and judges the
    rest, so the pass passes and is not vacuous (some positions of each program are finite)."""
    report = check_laws(_guarded, programs=programs(always={"edge_operands"}), max_examples=20,
                        atol=1e-2, rtol=1e-2)
    assert report.changed > 0 and report.excused > 0, report
    assert report.unjudged < report.tried - report.declined, report
