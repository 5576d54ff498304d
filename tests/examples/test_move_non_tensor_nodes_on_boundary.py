"""Before/Expected examples for ``move_non_tensor_nodes_on_boundary``: a non-tensor node (here a
size) read only by nodes of one other tag moves to that tag, so that no non-tensor value
crosses between the children ``split_by_tags`` makes. Only meta (the tags) changes."""

from __future__ import annotations

from beforeafter import program

from ir import alpha_equivalent
from transforms import move_non_tensor_nodes_on_boundary, split_by_tags

BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %view: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # tag: acc; tensor
      %size = call_function[aten.sym_size.int](%relu, 0)  # tag: acc
      %neg = call_function[aten.neg.default](%x)  # tag: cpu; tensor
      %view = call_function[aten.view.default](%neg, [%size])  # tag: cpu; tensor
      return (%view,)"""

EXPECTED = BEFORE.replace("(%relu, 0)  # tag: acc", "(%relu, 0)  # tag: cpu")


def tags(p) -> dict[str, object]:
    return {n.name: n.meta.get("tag") for n in p.root_module.graph.nodes}


def test_a_size_read_by_the_next_tag_moves_there():
    before = program(BEFORE)
    after = move_non_tensor_nodes_on_boundary(before, ["acc", "cpu"])
    expected = program(EXPECTED, like=before)
    assert tags(after) == tags(expected)
    assert after == before  # meta only
    split = split_by_tags(after, ["acc", "cpu"])
    assert alpha_equivalent(split, split_by_tags(expected, ["acc", "cpu"]))
    crossing = split.root_module.graph.node("cpu").args  # what the cpu child receives
    assert [r.name for r in crossing] == ["acc", "x"]  # a tensor and an input, not the size


def test_nothing_to_move_returns_the_program_itself():
    settled = program(EXPECTED)
    assert move_non_tensor_nodes_on_boundary(settled, ["acc", "cpu"]) is settled
