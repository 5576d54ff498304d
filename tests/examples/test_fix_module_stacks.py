"""Before/Expected examples for ``fix_module_stacks``: a module stack is cut at its first entry
that is not inside the one before it (a call of an ancestor's sibling), or that names no module
of the program; the node stays in the last module that nests. Only meta changes, so the
examples compare the stacks (``# stack:`` comments) and what ``outline`` makes of them."""

from __future__ import annotations

import logging

from beforeafter import program

from ir import alpha_equivalent
from transforms import fix_module_stacks, outline

BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a, a.leaf
      %sin = call_function[aten.sin.default](%relu)  # stack: a, a.leaf, norm
      %cos = call_function[aten.cos.default](%sin)  # stack: a, a.leaf, a.leaf._peer[0]
      %neg = call_function[aten.neg.default](%cos)  # stack: norm
      return (%neg,)
  module a: A
  module a.leaf: Leaf
  module norm: Norm"""

EXPECTED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a, a.leaf
      %sin = call_function[aten.sin.default](%relu)  # stack: a, a.leaf
      %cos = call_function[aten.cos.default](%sin)  # stack: a, a.leaf
      %neg = call_function[aten.neg.default](%cos)  # stack: norm
      return (%neg,)
  module a: A
  module a.leaf: Leaf
  module norm: Norm"""


def stacks(p) -> dict[str, list[str]]:
    """Each root node's module stack as its paths (the root entry left out)."""
    return {
        n.name: [path for path, _ in n.meta["nn_module_stack"].values() if path]
        for n in p.root_module.graph.nodes
        if "nn_module_stack" in n.meta
    }


def test_stacks_that_do_not_nest_are_cut(caplog):
    before = program(BEFORE)
    with caplog.at_level(logging.WARNING, logger="purefx"):
        after = fix_module_stacks(before)
    expected = program(EXPECTED, like=before)
    assert stacks(after) == stacks(expected)
    assert after == before  # meta only
    assert alpha_equivalent(outline(after), outline(expected))
    assert "do not nest" in caplog.text and "sin" in caplog.text and "cos" in caplog.text


def test_stacks_that_nest_are_returned_as_they_are():
    fine = program(EXPECTED)
    assert fix_module_stacks(fine) is fine
