"""``transforms.machinery.call_walk``: call spans and last uses read off a flat graph's module stacks."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "examples"))

from beforeafter import program
from programs_nested import NESTED

from transforms.machinery.call_walk import call_spans, last_uses
from transforms.machinery.frames import node_frames

# ``a`` runs, leaves for a node of the root, and runs again (``a.b`` only in its second run)
REENTERED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a
      %neg = call_function[aten.neg.default](%relu)
      %mul = call_function[aten.mul.Tensor](%neg, %x)  # stack: a, a.b
      %sin = call_function[aten.sin.default](%mul)  # stack: a
      %add = call_function[aten.add.Tensor](%sin, %x)
      return (%add,)
  module a: A
  module a.b: B"""


def _spans(text: str) -> dict[str, tuple[int, int]]:
    first, last = call_spans(program(text).root_module.graph, node_frames)
    assert first.keys() == last.keys()
    return {name: (first[name], last[name]) for name in first}


def test_spans_of_nested_and_repeated_calls():
    assert _spans(NESTED) == {"a": (2, 4), "a.b": (2, 2), "a.b@1": (4, 4)}


def test_a_call_left_and_entered_again_spans_both_runs():
    # positions: x 0, relu 1, neg 2 (root), mul 3, sin 4, add 5 (root)
    assert _spans(REENTERED) == {"a": (1, 4), "a.b": (3, 3)}


def test_last_uses_are_the_last_readers():
    graph = program(REENTERED).root_module.graph
    last = last_uses(graph, node_frames, {})
    assert last == {"x": 5, "relu": 2, "neg": 3, "mul": 4, "sin": 5, "add": 6}
