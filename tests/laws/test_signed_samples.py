"""``ir.strategies.signed_samples``: a recorded call's operand with its other sign, kept only
inside the operator's domain, and drawn where programs are asked to be rich in an operator."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, Phase, find, settings

from ir.opset import Sample, TensorSpec, table
from ir.strategies import program_inputs, programs
from ir.strategies.opset_steps import opset_rows, overload, row_samples
from ir.strategies.signed_samples import MAX_VARIANTS, signed_variants
from lowering import lower

aten = torch.ops.aten
FLOOR = "aten.div.Tensor_mode"


def _point(v: float) -> TensorSpec:
    return TensorSpec((), torch.float32, low=v, high=v)


def test_a_one_signed_operand_is_turned_and_a_mixed_one_is_not():
    both = Sample((_point(-8.5), _point(-1.5)), (("rounding_mode", "floor"),))
    turned = [v for _, v in signed_variants("test.div", aten.div.Tensor_mode, (both,))]
    assert [tuple(a.low for a in v.args) for v in turned] == [(8.5, -1.5), (-8.5, 1.5)]
    mixed = Sample((TensorSpec((3,), torch.float32, low=-1.0, high=1.0), _point(2.0)),
                   (("rounding_mode", "floor"),))
    assert [v.args[1].low for _, v in signed_variants("test.div2", aten.div.Tensor_mode,
                                                       (mixed,))] == [-2.0]


def test_a_variant_outside_the_domain_is_dropped():
    """``log`` of a negative is NaN where the recorded call was finite: no variant. Exact
    values are negated with the range."""
    positive = Sample((TensorSpec((4,), torch.float32, values=(0.5, 1.0, 2.0, 4.0)),))
    assert signed_variants("test.log", aten.log.default, (positive,)) == ()
    (_, v), = signed_variants("test.neg", aten.neg.default, (positive,))
    assert v.args[0].values == (-0.5, -1.0, -2.0, -4.0)


def test_at_most_max_variants_per_sample_and_integers_keep_their_sign():
    three = Sample(tuple(_point(1.0 + i) for i in range(3)))
    turned = signed_variants("test.addcmul", aten.addcmul.default, (three,))
    assert MAX_VARIANTS == 2 and [tuple(a.low for a in v.args) for _, v in turned] == [
        (-1.0, 2.0, 3.0), (1.0, -2.0, 3.0)]
    ints = Sample((TensorSpec((3,), torch.int64, values=(1, 2, 3)), 2))
    assert signed_variants("test.floor_divide", aten.floor_divide.Scalar, (ints,)) == ()


def test_variants_are_drawn_only_where_an_operator_is_asked_for():
    if FLOOR not in table():
        return
    asked = {e.name: s for e, _, s in opset_rows(frozenset({"opset"}), frozenset({FLOOR}))}
    default = {e.name: s for e, _, s in opset_rows(frozenset({"opset"}), None)}
    e = table()[FLOOR]
    extra = signed_variants(FLOOR, overload(FLOOR), row_samples(e))
    assert extra and len(asked[FLOOR]) == len(default[FLOOR]) + len(extra)


def test_programs_asked_for_floor_division_divide_a_negative_quotient():
    """The table's recorded floor divisions all have quotients of one sign where floor and
    truncation agree; asked for the operator, a program is drawn where they differ (floor
    division written as truncation breaks the semantics law), and it runs."""
    from lowering.pass_laws import LawViolation, check_program
    from tests.laws.planted_forms import floor_division_truncates

    if FLOOR not in table():
        return

    def truncation_differs(p):
        try:
            check_program(floor_division_truncates, p, laws={"semantics"})
        except LawViolation:
            return True
        return False

    found = settings(database=None, derandomize=True, max_examples=60, deadline=None,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    p = find(programs(features={"opset"}, always={"opset"}, ops=[FLOOR]), truncation_differs,
             settings=found)
    args, kwargs = program_inputs(p)
    lower(p)(*args, **kwargs)
