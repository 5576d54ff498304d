"""Argument forms from real models (``ir.strategies.forms``, ``bench.model_forms``): the classes
a call's arguments fall in, the census shipped in ``ir/strategies/model_forms.json``, and the
opset steps drawing its forms, by default and when an operator is named."""

from __future__ import annotations

import collections
import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from bench.model_forms import drawn_forms
from ir.args import Ref
from ir.opset import TensorSpec, run_sample, table
from ir.strategies import programs
from ir.strategies.forms import census, decode_sample, encode_sample, form_of, form_samples
from ir.strategies.opset_steps import (
    FORM_SHARE,
    ROW_FEATURES,
    form_boosts,
    form_units,
    form_weights,
    opset_rows,
    overload,
    pick_form,
    row_samples,
    scatter,
)

aten = torch.ops.aten


def _spec(*shape: int) -> TensorSpec:
    return TensorSpec(shape, torch.float32)


def _form(op, *args, **kwargs) -> str:
    return form_of(op, args, kwargs, is_tensor=lambda v: isinstance(v, TensorSpec))


def test_a_form_classes_lists_by_length_and_scalars_by_edge_class():
    x = _spec(2, 3, 4, 4)
    assert _form(aten.mean.dim, x, [2, 3], True) == "aten.mean.dim(T, ints2, True)"
    assert _form(aten.mean.dim, x, [-1]) == "aten.mean.dim(T, ints1-)"
    assert _form(aten.unsqueeze.default, x, 0) != _form(aten.unsqueeze.default, x, -1)
    assert _form(aten.mul.Tensor, x, 0.0) == "aten.mul.Tensor(T, 0.0)"
    assert _form(aten.mul.Tensor, x, math.inf) == "aten.mul.Tensor(T, inf)"
    assert _form(aten.mul.Tensor, x, math.nan) == "aten.mul.Tensor(T, nan)"
    assert _form(aten.div.Tensor_mode, x, x, rounding_mode="floor") == (
        "aten.div.Tensor_mode(T, T, rounding_mode='floor')")


def test_trailing_defaults_are_left_out_and_optional_tensors_absent_are_none():
    x = _spec(2, 4)
    w = _spec(4)
    # layer_norm(x, [4], None, None, eps=1e-05, cudnn=True): every trailing default dropped
    assert _form(aten.layer_norm.default, x, [4], None, None, 1e-05, True) == (
        "aten.layer_norm.default(T, ints1)")
    assert _form(aten.layer_norm.default, x, [4], w, None, 1e-6) == (
        "aten.layer_norm.default(T, ints1, T, None, float)")
    assert _form(aten.cat.default, [x, x], -1) == "aten.cat.default(T*2, -1)"
    assert _form(aten.cat.default, [x, x], 0) == "aten.cat.default(T*2)"


def test_a_programs_node_has_the_form_of_its_call():
    r = Ref("x")
    assert form_of(aten.transpose.int, (r, 1, 2), {}, is_tensor=lambda v: isinstance(v, Ref)) \
        == "aten.transpose.int(T, 1, int)"


def test_the_census_counts_the_models_forms_each_with_a_runnable_example():
    forms = census()
    assert len(forms) >= 200
    ops = {f.op for f in forms.values()}
    assert len(ops) >= 120
    assert all(f.uses >= f.models >= 1 for f in forms.values())
    with_example = [f for f in forms.values() if f.example is not None]
    assert len(with_example) >= 0.95 * len(forms)
    for f in with_example:
        op = overload(f.op)
        # the key is the example's own form: the example draws the form it stands for
        assert form_of(op, f.example.args, dict(f.example.kwargs),
                       is_tensor=lambda v: isinstance(v, TensorSpec)) == f.form
        assert decode_sample(encode_sample(f.example)) == f.example
    # the forms the issue names, from transformers and CNNs
    for form in ("aten.mean.dim(T, ints2)", "aten.unsqueeze.default(T, 0)",
                 "aten.transpose.int(T, 1, int)", "aten.dropout.default(T, 0.0, False)",
                 "aten.masked_fill_.Scalar(T, T, -inf)", "aten.cat.default(T*2, -1)",
                 "aten.view.default(T, ints4-)",
                 "aten.layer_norm.default(T, ints1, T, T, float, False)"):
        assert form in forms, form


@pytest.mark.parametrize("name", ["aten.mean.dim", "aten.view.default", "aten.masked_fill_.Scalar"])
def test_each_census_example_runs_on_real_tensors(name):
    for _, _, sample in form_samples()[name]:
        run_sample(overload(name), sample)


def test_every_operator_the_models_call_with_an_example_has_a_row_that_draws_its_forms():
    rows = table()
    for name, found in form_samples().items():
        assert name in rows, name
        samples = row_samples(rows[name])
        assert all(s in samples for _, _, s in found)


def test_default_steps_draw_census_forms_by_weight_deterministically():
    on = frozenset({"opset", "integer_values", "bool_values", "low_precision",
                    "inplace_variants", "train_norms"})
    units = form_units(on, None)
    weights = form_weights(on, None)
    assert len(units) == len(weights) and len(units) >= 0.9 * sum(
        1 for f in census().values() if f.example is not None)
    assert all(b > a for a, b in itertools.pairwise(weights))
    picks = [pick_form(on, scatter(i), ()) for i in range(4000)]
    assert picks == [pick_form(on, scatter(i), ()) for i in range(4000)]
    drawn = [p for p in picks if p is not None]
    assert abs(len(drawn) / len(picks) - FORM_SHARE) < 0.05  # FORM_SHARE of the calls
    assert len(set(drawn)) >= 0.8 * len(units)  # the rare forms too
    rows = opset_rows(on, None)
    # the operator-even share evens the operators out: none of many forms takes more than four
    # times an even share of the picks; the fit (``form_boosts``) evens them over the swarm's
    # feature sets, not in any one of them (the forms that need a feature weigh more, so the
    # others less), so here none takes less than a sixth (the swarm's own bound: the next test)
    per_op = collections.Counter(rows[units[k][0]][0].name for k in drawn)
    operators = {rows[i][0].name for i, _ in units}
    even = len(drawn) / len(operators)
    assert max(per_op.values()) <= 4 * even, per_op.most_common(3)
    assert min(per_op[name] for name in operators) >= even / 6, per_op.most_common()[-3:]
    for i, j in units:  # each unit is a census example of its row
        e, _, samples = rows[i]
        assert any(samples[j] == s for _, _, s in form_samples()[e.name])
    # each form once per program: a used form passes to the next one
    first = pick_form(on, scatter(0), ())
    if first is not None:
        assert pick_form(on, scatter(0), {first}) != first


def test_over_the_swarms_feature_sets_no_operator_of_the_census_is_drawn_rarely():
    # form_boosts' law: over every feature set (each switched flag on or off), each operator's
    # picks come near an even share; without the fit the operators whose forms need a feature
    # (the in-place ones, ``lstm``, ``new_zeros``) had half of it, and some stream of 200
    # programs missed one
    flags = sorted(ROW_FEATURES - {"opset"})
    per_op: collections.Counter = collections.Counter()
    operators: set[str] = set()
    for mask in range(2 ** len(flags)):
        on = frozenset({"opset"} | {f for k, f in enumerate(flags) if mask >> k & 1})
        units, rows = form_units(on, None), opset_rows(on, None)
        operators |= {rows[i][0].name for i, _ in units}
        for i in range(60):
            picked = pick_form(on, scatter(i * 1000003 + mask), ())
            if picked is not None:
                per_op[rows[units[picked][0]][0].name] += 1
    even = sum(per_op.values()) / len(operators)
    rarest = min(operators, key=lambda name: per_op[name])
    assert per_op[rarest] >= 0.6 * even, (rarest, per_op[rarest], even)
    assert set(form_boosts()) <= operators and min(form_boosts().values()) > 0


def _drawn(strategy, n: int) -> list:
    out: list = []

    @settings(max_examples=n, database=None, derandomize=True, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(p):
        out.append(p)

    run()
    return out


def test_naming_an_operator_draws_its_forms_means_over_two_dims_among_them():
    drawn = drawn_forms(_drawn(programs(ops=[aten.mean.dim]), 30))
    means = {f for f in drawn if f.startswith("aten.mean.dim(")}
    assert any("ints2" in f for f in means), means
    known = {f for f, _, _ in form_samples()["aten.mean.dim"]}
    assert len(known & means) >= len(known) - 1, (known - means)
