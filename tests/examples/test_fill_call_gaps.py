"""Before/Expected examples for ``fill_call_gaps``: a node that runs between two nodes of one
module call under a caller's stack (strict export does this to a higher-order op and the
``get_attr`` of its body, ``run_decompositions`` to the nodes of an inlined body) gets the stack
of that call, so ``outline`` makes one call of it, not two (``m`` and ``m@1``). Only meta
changes; the examples compare the stacks (``# stack:`` comments) and what ``outline`` makes."""

from __future__ import annotations

from beforeafter import program
from test_fix_module_stacks import stacks

from ir import alpha_equivalent, verify
from ir.node import CALL_MODULE
from transforms import outline
from transforms.passes.module_stacks import fill_call_gaps

BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %sin = call_function[aten.sin.default](%x)  # stack: m
      %cos = call_function[aten.cos.default](%sin)
      %exp = call_function[aten.exp.default](%cos)
      %neg = call_function[aten.neg.default](%exp)  # stack: m, m.inner
      %relu = call_function[aten.relu.default](%x)  # stack: b
      %tanh = call_function[aten.tanh.default](%neg)  # stack: m
      %add = call_function[aten.add.Tensor](%tanh, %relu)
      return (%add,)
  module m: M
  module m.inner: Inner
  module b: B"""

# cos and exp ran inside m's call (m's nodes come before and after them); relu is a call of
# another module (b), not a caller's node: it keeps its stack
EXPECTED = BEFORE.replace(
    "%cos = call_function[aten.cos.default](%sin)",
    "%cos = call_function[aten.cos.default](%sin)  # stack: m",
).replace(
    "%exp = call_function[aten.exp.default](%cos)",
    "%exp = call_function[aten.exp.default](%cos)  # stack: m",
)


def calls(p) -> list[str]:
    return [n.target for n in p.root_module.graph.nodes if n.op == CALL_MODULE]


def test_caller_nodes_in_a_gap_get_the_stack_of_the_call():
    before = program(BEFORE)
    after = fill_call_gaps(before)
    expected = program(EXPECTED, like=before)
    assert stacks(after) == stacks(expected)
    assert after == before  # meta only
    assert fill_call_gaps(after) is after  # idempotent: b still cuts m, but no caller node does
    assert alpha_equivalent(outline(before), outline(expected))


def test_outline_makes_one_call_where_a_caller_node_cut_it_in_two():
    before = program(BEFORE.replace("  # stack: b", "  # stack: m"))
    assert calls(outline(before)) == ["m"]  # before: m, then m@1 after cos and exp
    verify(outline(before))
    expected = program(
        EXPECTED.replace("  # stack: b", "  # stack: m"), like=before
    )
    assert alpha_equivalent(outline(before), outline(expected))


def test_a_program_whose_calls_are_whole_is_returned_as_it_is():
    whole = program(EXPECTED.replace("  # stack: b", "  # stack: m"))
    assert fill_call_gaps(whole) is whole


def test_the_deepest_call_open_on_both_sides_takes_the_node():
    before = program(
        """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %sin = call_function[aten.sin.default](%x)  # stack: m, m.inner
      %cos = call_function[aten.cos.default](%sin)  # stack: m
      %exp = call_function[aten.exp.default](%cos)
      %neg = call_function[aten.neg.default](%exp)  # stack: m, m.inner
      return (%neg,)
  module m: M
  module m.inner: Inner"""
    )
    after = fill_call_gaps(before)
    assert stacks(after)["cos"] == ["m", "m.inner"]
    assert stacks(after)["exp"] == ["m", "m.inner"]
    assert calls(outline(before)) == ["m"]
    assert [n.target for n in outline(before).modules["m"].graphs[0].nodes if n.op == CALL_MODULE] == [
        "inner"
    ]
