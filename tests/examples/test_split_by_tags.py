"""Before/Expected examples for ``split_by_tags``: one child module per tag, in tag order; each
child holds the state it reads at ``<tag>.<fqn>`` (tied to the original tensor), takes the
placeholders it reads in order of first use and returns what later children or the output
read; a tag without nodes still gets a child."""

from __future__ import annotations

from beforeafter import program

from ir import alpha_equivalent, verify
from transforms import split_by_tags

BEFORE = """\
program:
  inputs:
    %x: user_input
    %y: user_input
  outputs:
    %add: user_output
  state:
    w: parameter <Parameter (2, 2) torch.float32>
  module <root>: Top
    graph 0:
      %x = placeholder
      %y = placeholder
      %w = get_attr[w]()
      %relu = call_function[aten.relu.default](%x)  # tag: ro
      %mm = call_function[aten.mm.default](%relu, %w)  # tag: ro
      %add = call_function[aten.add.Tensor](%mm, %y)  # tag: main
      return (%add,)"""


def test_one_child_per_tag_with_its_state():
    before = program(BEFORE)
    after = split_by_tags(before, ["ro", "main"])
    verify(after)
    expected = """\
program:
  inputs:
    %x: user_input
    %y: user_input
  outputs:
    %add: user_output
  state:
    ro.w: parameter <Parameter (2, 2) torch.float32> = w
  module <root>: Top
    graph 0:
      %x = placeholder
      %y = placeholder
      %mm = call_module[ro](%x)
      %add = call_module[main](%mm, %y)
      return (%add,)
  module ro: ?
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)
      %w = get_attr[w]()
      %mm = call_function[aten.mm.default](%relu, %w)
      return %mm
  module main: ?
    graph 0:
      %mm = placeholder
      %y = placeholder
      %add = call_function[aten.add.Tensor](%mm, %y)
      return %add"""
    assert alpha_equivalent(after, program(expected, like=before))


def test_a_tag_without_nodes_still_gets_a_child_returning_nothing():
    before = program(BEFORE)
    after = split_by_tags(before, ["ro", "idle", "main"])
    verify(after)
    idle = after.module(after.resolve("idle"))
    assert [n for n, _ in after.root_module.children] == ["ro", "idle", "main"]
    assert idle.graph.outputs == ()
