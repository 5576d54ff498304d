"""Before/Expected examples for ``inline``: every ``call_module`` replaced by the graph it runs,
back to the flat program ``import_ep`` gives (holder modules at every path, shared objects split
into one holder per path with their state still tied)."""

from __future__ import annotations

import pytest
import torch
from beforeafter import program
from programs_nested import NESTED, SHARED

from ir import alpha_equivalent, format_program, verify
from lowering import lower
from transforms import inline, outline, outline_and_sink


def test_inline_flattens_nested_and_repeated_calls():
    before = outline(program(NESTED))
    after = inline(before)
    verify(after)
    expected = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %x: user_input
  outputs:
    %add: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)
      %mul = call_function[aten.mul.Tensor](%relu, %p_a_w)
      %neg = call_function[aten.neg.default](%mul)
      %add = call_function[aten.add.Tensor](%neg, %x)
      return (%add,)
  module a: A
  module a.b: B"""
    assert alpha_equivalent(after, program(expected, like=before))
    assert alpha_equivalent(after, program(NESTED, like=before))  # inline(outline(p)) ≅ p


def test_inline_reads_sunk_state_through_the_call_path_and_splits_shared_modules():
    before = outline_and_sink(program(SHARED))
    after = inline(before)
    verify(after)
    expected = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul_1: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
    b.w: parameter <Parameter (2,) torch.float32> = a.w requires_grad
    a.v: parameter <Parameter (2,) torch.float32>
    b.v: parameter <Parameter (2,) torch.float32> = a.v
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = get_attr[a.w]()
      %mul = call_function[aten.mul.Tensor](%x, %w)
      %w_1 = get_attr[b.w]()
      %mul_1 = call_function[aten.mul.Tensor](%mul, %w_1)
      return (%mul_1,)
  module a: Scale
  module b: Scale"""
    assert alpha_equivalent(after, program(expected, like=before))


def test_a_flat_program_is_returned_as_it_is():
    flat = program(NESTED)
    assert inline(flat) is flat


WRITES_ITS_INPUT = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_module[a](%x)
      %mul = call_function[aten.mul.Tensor](%x, %a)
      return (%mul,)
  module a: A
    graph 0:
      %y = placeholder
      %add_ = call_function[aten.add_.Tensor](%y, 1)
      %neg = call_function[aten.neg.default](%add_)
      return %neg"""


def _flat(body: str) -> str:
    return f"""\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
{body}
      return (%mul,)
  module a: A"""


@pytest.mark.parametrize(("before", "expected"), [
    # add_ returns the very tensor x (ir.effects.same_tensor): the root's later read of x
    # reads the write's result, as export writes it
    (WRITES_ITS_INPUT, _flat("""\
      %add_ = call_function[aten.add_.Tensor](%x, 1)
      %neg = call_function[aten.neg.default](%add_)
      %mul = call_function[aten.mul.Tensor](%add_, %neg)""")),
    # a view is another tensor over x's memory: written through, x is still read as x
    (WRITES_ITS_INPUT.replace(
        "%add_ = call_function[aten.add_.Tensor](%y, 1)",
        "%v = call_function[aten.view.default](%y, [-1])\n"
        "      %add_ = call_function[aten.add_.Tensor](%v, 1)"), _flat("""\
      %v = call_function[aten.view.default](%x, [-1])
      %add_ = call_function[aten.add_.Tensor](%v, 1)
      %neg = call_function[aten.neg.default](%add_)
      %mul = call_function[aten.mul.Tensor](%x, %neg)""")),
])
def test_reads_of_an_input_written_in_place_read_the_write(before, expected):
    p = program(before)
    after = inline(p)
    verify(after)
    assert alpha_equivalent(after, program(expected, like=p)), format_program(after, vals=False)
    x = torch.randn(4)
    torch.testing.assert_close(lower(after)(x.clone())[0], lower(p)(x.clone())[0])
