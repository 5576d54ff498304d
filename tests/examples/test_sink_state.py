"""Before/Expected examples for ``sink_state`` (and ``outline_and_sink``): a state placeholder
becomes a ``get_attr`` in the module that owns the state; callers stop passing it and the root's
signature drops the state input; a module reading state it does not own keeps the argument."""

from __future__ import annotations

from beforeafter import program
from programs_nested import NESTED

from ir import alpha_equivalent, verify
from transforms import outline, outline_and_sink, sink_state

SUNK = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_module[a](%x)
      %add = call_function[aten.add.Tensor](%neg, %x)
      return (%add,)
  module a: A
    graph 0:
      %x = placeholder
      %w = get_attr[w]()
      %relu = call_module[b](%x)
      %mul = call_function[aten.mul.Tensor](%relu, %w)
      %neg = call_module[b@1](%mul)
      return %neg
  module a.b: B
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)
      return %relu
    graph 1:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      return %neg"""


def test_state_sinks_into_its_owner():
    before = outline(program(NESTED))
    after = sink_state(before)
    verify(after)
    assert alpha_equivalent(after, program(SUNK, like=before))


def test_outline_and_sink_is_the_two_passes_in_one():
    before = program(NESTED)
    assert alpha_equivalent(outline_and_sink(before), program(SUNK, like=before))
    assert outline_and_sink(before) == sink_state(outline(before))


def test_state_read_by_a_module_that_does_not_own_it_stays_an_argument():
    before = program(
        """\
program:
  inputs:
    %p_a_w: parameter a.w
    %x: user_input
  outputs:
    %mul: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a
      %mul = call_function[aten.mul.Tensor](%relu, %p_a_w)  # stack: c
      return (%mul,)
  module a: A
  module c: C"""
    )
    after = sink_state(outline(before))
    verify(after)
    expected = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32>
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = get_attr[a.w]()
      %relu = call_module[a](%x)
      %mul = call_module[c](%relu, %w)
      return (%mul,)
  module a: A
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)
      return %relu
  module c: C
    graph 0:
      %relu = placeholder
      %w = placeholder
      %mul = call_function[aten.mul.Tensor](%relu, %w)
      return %mul"""
    assert alpha_equivalent(after, program(expected, like=before))


def test_sink_state_is_idempotent_on_the_example():
    once = sink_state(outline(program(NESTED)))
    assert sink_state(once) == once
