"""Before/Expected examples for ``deduplicate``: the calls of one module whose graphs are equal
modulo names share one graph (``b@1`` becomes ``b``); graphs that differ stay; different
modules are never merged."""

from __future__ import annotations

from beforeafter import program
from programs_nested import NESTED, SHARED, TWICE_SAME

from ir import alpha_equivalent, verify
from transforms import deduplicate, outline_and_sink


def test_two_calls_with_one_body_share_one_graph():
    before = outline_and_sink(program(TWICE_SAME))
    assert len(before.modules["b"].graphs) == 2
    after = deduplicate(before)
    verify(after)
    expected = """\
program:
  inputs:
    %x: user_input
  outputs:
    %relu_1: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_module[b](%x)
      %relu_1 = call_module[b](%relu)
      return (%relu_1,)
  module b: B
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)
      return %relu"""
    assert alpha_equivalent(after, program(expected, like=before))


def test_a_shared_module_called_twice_runs_one_graph():
    before = outline_and_sink(program(SHARED))
    after = deduplicate(before)
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
      %mul = call_module[a](%x)
      %mul_1 = call_module[b](%mul)
      return (%mul_1,)
  module a: Scale
    graph 0:
      %x = placeholder
      %w = get_attr[w]()
      %mul = call_function[aten.mul.Tensor](%x, %w)
      return %mul
  module b: same object as a"""
    assert alpha_equivalent(after, program(expected, like=before))


def test_calls_with_different_bodies_keep_their_graphs():
    before = outline_and_sink(program(NESTED))  # a.b runs relu, then neg
    assert deduplicate(before) == before


def test_different_modules_with_one_body_are_not_merged():
    before = outline_and_sink(
        program(
            """\
program:
  inputs:
    %x: user_input
  outputs:
    %relu_1: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: b
      %relu_1 = call_function[aten.relu.default](%relu)  # stack: c
      return (%relu_1,)
  module b: B
  module c: B"""
        )
    )
    assert deduplicate(before) == before
