"""Before/Expected examples for ``outline_by``: ``outline`` with a partition key the caller
gives, here a node's tag (``# tag:``) instead of its module stack; nodes without a frame stay in
the root, and ``copied`` nodes (a ``get_attr``) are copied into each call that reads them instead
of being passed in."""

from __future__ import annotations

from beforeafter import program

from ir import alpha_equivalent, verify
from ir.module_stack import Frame
from ir.node import GET_ATTR, Node
from transforms.passes.outline import outline_by

BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  state:
    w: parameter <Parameter (2,) torch.float32>
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = get_attr[w]()
      %sin = call_function[aten.sin.default](%x)
      %mul = call_function[aten.mul.Tensor](%sin, %w)  # tag: f
      %relu = call_function[aten.relu.default](%mul)  # tag: f
      %neg = call_function[aten.neg.default](%relu)  # tag: g
      %add = call_function[aten.add.Tensor](%neg, %w)  # tag: g
      return (%add,)"""


def by_tag(node: Node) -> tuple[Frame, ...] | None:
    """One call per tag (the module at the tag's path); untagged nodes run in the root."""
    if node.op == GET_ATTR:
        return None  # a state read stays where it is
    tag = node.meta.get("tag")
    return (Frame(tag, tag, None, 0),) if tag else ()


def test_one_call_per_tag_reading_state_through_an_input():
    before = program(BEFORE)
    after = outline_by(before, by_tag)
    verify(after)
    expected = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  state:
    w: parameter <Parameter (2,) torch.float32>
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = get_attr[w]()
      %sin = call_function[aten.sin.default](%x)
      %relu = call_module[f](%sin, %w)
      %add = call_module[g](%relu, %w)
      return (%add,)
  module f: ?
    graph 0:
      %sin = placeholder
      %w = placeholder
      %mul = call_function[aten.mul.Tensor](%sin, %w)
      %relu = call_function[aten.relu.default](%mul)
      return %relu
  module g: ?
    graph 0:
      %relu = placeholder
      %w = placeholder
      %neg = call_function[aten.neg.default](%relu)
      %add = call_function[aten.add.Tensor](%neg, %w)
      return %add"""
    assert alpha_equivalent(after, program(expected, like=before))


def test_a_copied_state_read_is_copied_into_each_call_that_reads_it():
    before = program(BEFORE)
    after = outline_by(before, by_tag, copied=lambda n: n.op == GET_ATTR)
    # each copy still reads the root's ``w``: the caller re-homes the state (``split_by_tags``
    # does), so ``verify`` holds only after that
    expected = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  state:
    w: parameter <Parameter (2,) torch.float32>
  module <root>: Top
    graph 0:
      %x = placeholder
      %sin = call_function[aten.sin.default](%x)
      %relu = call_module[f](%sin)
      %add = call_module[g](%relu)
      return (%add,)
  module f: ?
    graph 0:
      %sin = placeholder
      %w = get_attr[w]()
      %mul = call_function[aten.mul.Tensor](%sin, %w)
      %relu = call_function[aten.relu.default](%mul)
      return %relu
  module g: ?
    graph 0:
      %relu = placeholder
      %neg = call_function[aten.neg.default](%relu)
      %w = get_attr[w]()
      %add = call_function[aten.add.Tensor](%neg, %w)
      return %add"""
    assert alpha_equivalent(after, program(expected, like=before))
