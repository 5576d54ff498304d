"""Before/Expected examples for ``remove_effect_tokens``: ``with_effects(token, op, *args)``
becomes ``op(*args)`` at the same place; the token's ``getitem`` disappears, a result's
``getitem`` becomes the op node; token placeholders, outputs and their specs are dropped."""

from __future__ import annotations

from beforeafter import program

from ir import alpha_equivalent, verify
from transforms import remove_effect_tokens

BEFORE = """\
program:
  inputs:
    %token: token
    %x: user_input
  outputs:
    %getitem_1: token
    %relu: user_output
  module <root>: Top
    graph 0:
      %token = placeholder
      %x = placeholder
      %with_effects = call_function[WITH_EFFECTS](%token, aten._print.default, 'a')
      %getitem = call_function[_operator.getitem](%with_effects, 0)
      %relu = call_function[aten.relu.default](%x)
      %with_effects_1 = call_function[WITH_EFFECTS](%getitem, aten._print.default, 'b')
      %getitem_1 = call_function[_operator.getitem](%with_effects_1, 0)
      return (%getitem_1, %relu)""".replace("WITH_EFFECTS", "torch.ops.higher_order.with_effects")

EXPECTED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %relu: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %with_effects = call_function[aten._print.default]('a')
      %relu = call_function[aten.relu.default](%x)
      %with_effects_1 = call_function[aten._print.default]('b')
      return (%relu,)"""


def test_tokens_are_removed_and_the_effects_stay_in_order():
    before = program(BEFORE)
    after = remove_effect_tokens(before)
    verify(after)
    assert after == program(EXPECTED, like=before)  # names are kept: exact equality


def test_a_program_without_tokens_is_returned_as_it_is():
    clean = program(EXPECTED)
    assert remove_effect_tokens(clean) is clean


def test_the_result_is_alpha_equivalent_to_the_expected_text_written_with_other_names():
    renamed = EXPECTED.replace("%with_effects_1", "%print_b").replace("%with_effects", "%print_a")
    before = program(BEFORE)
    assert alpha_equivalent(remove_effect_tokens(before), program(renamed, like=before))
