"""Before/Expected examples for ``transforms.rewrite``: rules written as PyTorch functions,
matched in a normal form (scalars by value, commutative operands in either order), applied to a
fixpoint, never swallowing a value read outside the match or a random operator."""

from __future__ import annotations

import pytest
import torch
from beforeafter import program

from ir import PassError, verify
from transforms.rewrite import Rule, rewrite, rewrite_report

X = (torch.randn(3, 4),)


def _rule(pattern, replacement, name, example=X):
    # trusted: these tests are about matching; tests/test_rewrite.py checks rules
    return Rule(pattern, replacement, example, name=name, trusted=True)


RELU_RELU = _rule(lambda x: torch.relu(torch.relu(x)), torch.relu, "relu_relu")
TIMES_ONE = _rule(lambda x: x * 1, lambda x: x, "times_one")
SILU = _rule(lambda x: torch.sigmoid(x) * x, torch.nn.functional.silu, "silu")


def _one_graph(body: str, outputs: str, inputs: str = "    %x: user_input") -> str:
    returned = ", ".join(f"%{o}" for o in outputs.split())
    specs = "\n".join(f"    %{o}: user_output" for o in outputs.split())
    return (
        f"program:\n  inputs:\n{inputs}\n  outputs:\n{specs}\n  module <root>: Top\n"
        f"    graph 0:\n{body}\n      return ({returned},)"
    )


def test_relu_relu_relu_becomes_one_relu_at_the_fixpoint():
    before = program(_one_graph("""\
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)
      %relu_1 = call_function[aten.relu.default](%relu)
      %relu_2 = call_function[aten.relu.default](%relu_1)""", "relu_2"))
    expected = program(_one_graph("""\
      %x = placeholder
      %relu_2 = call_function[aten.relu.default](%x)""", "relu_2"), like=before)
    after, report = rewrite_report(before, [RELU_RELU])
    verify(after)
    assert after == expected
    assert report.counts == {"relu_relu": 2}


def test_a_scalar_matches_by_value_and_the_output_spec_follows_the_value():
    before = program(_one_graph("""\
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %mul = call_function[aten.mul.Tensor](%neg, 1)""", "mul"))
    expected = program(_one_graph("""\
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)""", "neg"), like=before)
    after = rewrite(before, [TIMES_ONE])
    verify(after)
    assert after == expected


@pytest.mark.parametrize("literal", ["1.0", "True"])
def test_a_literal_matches_only_a_literal_of_its_own_type(literal):
    # TIMES_ONE is `x * 1`: an int literal. `x * 1.0` is float on an int64 x, `x * True` bool
    # arithmetic: the literal's type is part of what it computes, as ir.alpha keys it
    before = program(_one_graph(f"""\
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %mul = call_function[aten.mul.Tensor](%neg, {literal})""", "mul"))
    assert rewrite(before, [TIMES_ONE]) is before


@pytest.mark.parametrize("operands", ["%sigmoid, %x", "%x, %sigmoid"])
def test_commutative_operands_match_in_either_order(operands):
    before = program(_one_graph(f"""\
      %x = placeholder
      %sigmoid = call_function[aten.sigmoid.default](%x)
      %mul = call_function[aten.mul.Tensor]({operands})""", "mul"))
    expected = program(_one_graph("""\
      %x = placeholder
      %mul = call_function[aten.silu.default](%x)""", "mul"), like=before)
    assert rewrite(before, [SILU]) == expected


def test_a_multi_use_input_must_bind_one_value():
    before = program(_one_graph("""\
      %x = placeholder
      %y = placeholder
      %sigmoid = call_function[aten.sigmoid.default](%x)
      %mul = call_function[aten.mul.Tensor](%sigmoid, %y)""", "mul",
                                "    %x: user_input\n    %y: user_input"))
    assert rewrite(before, [SILU]) is before


def test_an_interior_value_read_outside_the_match_blocks_it():
    before = program(_one_graph("""\
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)
      %relu_1 = call_function[aten.relu.default](%relu)""", "relu_1 relu"))
    assert rewrite(before, [RELU_RELU]) is before


def test_a_random_operator_is_never_matched():
    rand_times_zero = _rule(
        lambda x: torch.rand_like(x) * 0, lambda x: torch.zeros_like(x), "rand_times_zero"
    )
    before = program(_one_graph("""\
      %x = placeholder
      %rand_like = call_function[aten.rand_like.default](%x)
      %mul = call_function[aten.mul.Tensor](%rand_like, 0)""", "mul"))
    assert rewrite(before, [rand_times_zero]) is before


def test_a_pattern_with_two_results():
    def pattern(x):
        y = torch.neg(x)
        return y, torch.neg(y)

    neg_pair = _rule(pattern, lambda x: (torch.neg(x), x), "neg_pair")
    before = program(_one_graph("""\
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %neg_1 = call_function[aten.neg.default](%neg)
      %relu = call_function[aten.relu.default](%neg_1)""", "neg relu"))
    expected = program(_one_graph("""\
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %relu = call_function[aten.relu.default](%x)""", "neg relu"), like=before)
    assert rewrite(before, [neg_pair]) == expected


def test_rules_that_undo_each_other_are_a_cycle_named_in_the_error():
    double = _rule(lambda x: x * 2, lambda x: x + x, "double_to_add")
    add = _rule(lambda x: x + x, lambda x: x * 2, "add_to_double")
    before = program(_one_graph("""\
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, 2)""", "mul"))
    with pytest.raises(PassError, match="add_to_double.*double_to_add.*cycle"):
        rewrite(before, [double, add])


def test_no_match_returns_the_program_itself_and_counts_zero():
    before = program(_one_graph("""\
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)""", "relu"))
    after, report = rewrite_report(before, [RELU_RELU, TIMES_ONE])
    assert after is before
    assert report.counts == {"relu_relu": 0, "times_one": 0}
    assert rewrite(before, []) is before
