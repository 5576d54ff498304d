"""Before/Expected examples for ``cse``: a node computing what an earlier node of its graph
computed reads that node instead; literal types count (``x * 2`` is not ``x * 2.0``); impure,
random and written-in-place values never merge (a copy later written stays a copy); readers of
a written value merge only between the same writes; each graph of an outlined program once."""

from __future__ import annotations

import pytest
import torch
from beforeafter import program

import transforms
from ir import format_program, import_ep, verify
from ir import signature as sg
from lowering import lower
from lowering.pass_laws import LawViolation, check_laws, check_program, check_semantics
from transforms import cse, transform

BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
    %mul_1: user_output
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, 2)
      %mul_1 = call_function[aten.mul.Tensor](%x, 2)
      %mul_2 = call_function[aten.mul.Tensor](%x, 2.0)
      %mul_3 = call_function[aten.mul.Tensor](%x, True)
      %mul_4 = call_function[aten.mul.Tensor](%x, 1)
      %add = call_function[aten.add.Tensor](%mul_1, %mul_2)
      %add_1 = call_function[aten.add.Tensor](%mul_1, %mul_2, alpha=1)
      %rand = call_function[aten.rand.default]([2])
      %rand_1 = call_function[aten.rand.default]([2])
      %clone = call_function[aten.clone.default](%x)
      %clone_1 = call_function[aten.clone.default](%x)
      %add_ = call_function[aten.add_.Tensor](%clone, 1)
      %s = call_function[aten.stack.default]([%add, %add_1, %mul_3, %mul_4, %clone, %clone_1])
      %r = call_function[aten.stack.default]([%rand, %rand_1])
      %out = call_function[aten.cat.default]([%s, %r])
      return (%mul, %mul_1, %out)"""

EXPECTED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
    %mul: user_output
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, 2)
      %mul_2 = call_function[aten.mul.Tensor](%x, 2.0)
      %mul_3 = call_function[aten.mul.Tensor](%x, True)
      %mul_4 = call_function[aten.mul.Tensor](%x, 1)
      %add = call_function[aten.add.Tensor](%mul, %mul_2)
      %rand = call_function[aten.rand.default]([2])
      %rand_1 = call_function[aten.rand.default]([2])
      %clone = call_function[aten.clone.default](%x)
      %clone_1 = call_function[aten.clone.default](%x)
      %add_ = call_function[aten.add_.Tensor](%clone, 1)
      %s = call_function[aten.stack.default]([%add, %add, %mul_3, %mul_4, %clone, %clone_1])
      %r = call_function[aten.stack.default]([%rand, %rand_1])
      %out = call_function[aten.cat.default]([%s, %r])
      return (%mul, %mul, %out)"""


def _inputs(p):
    return (torch.randn(2),), {}


def same_outputs(before, after, *args):
    """``lower(after)`` returns what ``lower(before)`` returns, random ops seeded alike."""
    torch.manual_seed(0)
    want = lower(before)(*(a.clone() for a in args))
    torch.manual_seed(0)
    got = lower(after)(*(a.clone() for a in args))
    torch.testing.assert_close(got, want)


def test_repeats_merge_and_the_traps_stay():
    """``x * 2`` twice merges (and ``add`` with its default ``alpha`` spelled out merges with
    ``add``); ``x * 2.0``, ``x * True`` and ``x * 1`` stay apart; two ``rand`` stay; of two
    ``clone(x)`` the one written in place stays a copy, and so does the other."""
    before = program(BEFORE)
    after = cse(before)
    verify(after)
    assert after == program(EXPECTED, like=before)
    same_outputs(before, after, torch.randn(2))


def test_nothing_to_merge_is_the_program_itself():
    before = program(EXPECTED)
    assert cse(before) is before


def test_readers_of_a_written_value_merge_only_between_the_same_writes():
    before = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %c = call_function[aten.clone.default](%x)
      %r = call_function[aten.relu.default](%c)
      %r_1 = call_function[aten.relu.default](%c)
      %w = call_function[aten.add_.Tensor](%c, 1)
      %r_2 = call_function[aten.relu.default](%c)
      %v = call_function[aten.view.default](%c, [2])
      %v_1 = call_function[aten.view.default](%c, [2])
      %out = call_function[aten.stack.default]([%r, %r_1, %r_2, %v, %v_1])
      return (%out,)""")
    after = cse(before)
    text = format_program(after, vals=False)
    assert "%r_1 =" not in text  # read %c before the write, as %r did
    assert "%r_2 = call_function[aten.relu.default](%c)" in text  # read it after the write
    assert "%v_1 =" in text  # a view of a written value is written: never merged
    check_semantics(cse, before, after, inputs=_inputs)


def test_a_copy_later_written_is_not_merged_numerically():
    """The planted bug of issue 37: merging the two clones is off by 1.0."""
    before = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %c = call_function[aten.clone.default](%x)
      %c_1 = call_function[aten.clone.default](%x)
      %w = call_function[aten.add_.Tensor](%c, 1)
      %add = call_function[aten.add.Tensor](%c, %c_1)
      return (%add,)""")
    assert cse(before) is before
    x = torch.randn(2)
    assert torch.equal(lower(before)(x.clone())[0], 2 * x + 1)


def test_a_name_in_a_preserved_call_signature_is_kept():
    before = program(BEFORE)
    sig = sg.CallSignature((sg.ArgSpec(sg.TENSOR, "mul_1"),), (), None, None)
    before = before.replace(call_signatures=before.call_signatures.set("f", sig))
    text = format_program(cse(before), vals=False)
    assert "%mul_1 = call_function[aten.mul.Tensor](%x, 2)" in text


def test_nodes_of_different_module_calls_are_not_merged():
    before = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a
      %relu_1 = call_function[aten.relu.default](%x)  # stack: b
      %relu_2 = call_function[aten.relu.default](%x)  # stack: b
      %add = call_function[aten.add.Tensor](%relu, %relu_1)  # stack: b
      %add_1 = call_function[aten.add.Tensor](%add, %relu_2)
      return (%add_1,)
  module a: A
  module b: B""".replace("%add: user_output", "%add_1: user_output"))
    text = format_program(cse(before), vals=False)
    assert "%relu_1 =" in text and "%relu_2 =" not in text


OUTLINED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %b_1: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %b = call_module[b](%x)
      %b_1 = call_module[b](%b)
      %b_2 = call_module[b](%x)
      %add = call_function[aten.add.Tensor](%b_1, %b_2)
      return (%add,)
  module b: B
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %neg_1 = call_function[aten.neg.default](%x)
      %mul = call_function[aten.mul.Tensor](%neg, %neg_1)
      return %mul""".replace("%b_1: user_output", "%add: user_output")


def test_each_graph_of_an_outlined_program_once_and_calls_never_merge():
    before = program(OUTLINED)
    after = cse(before)
    verify(after)
    expected = OUTLINED.replace("      %neg_1 = call_function[aten.neg.default](%x)\n", "").replace(
        "(%neg, %neg_1)", "(%neg, %neg)"
    )
    assert after == program(expected.replace("%b_1: user_output", "%add: user_output"),
                            like=before)
    check_semantics(cse, before, after, inputs=_inputs)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.a(x)) + torch.relu(self.a(x))  # one module call per self.a(x)
        y = x.clone()
        y.add_(1)
        return self.b(h) * (x * 2) + (x * 2) + y + x.clone()


@pytest.mark.parametrize("outlined", [False, True], ids=["flat", "outlined"])
def test_numerics_equal_eager(outlined):
    x = torch.randn(3, 4)
    ep = torch.export.export(MLP(), (x,))
    p = import_ep(ep)
    if outlined:
        p = transform(p)
    after = cse(p)
    assert after.node_count() < p.node_count()
    verify(after)
    torch.testing.assert_close(lower(after)(x.clone()), ep.module()(x.clone()))


def test_laws_on_hand_built_programs():
    for text in (BEFORE.replace("aten.rand.default", "aten.ones.default"), OUTLINED):
        check_program(cse, program(text), idempotent=True, inputs=_inputs)


def test_the_laws_catch_a_cse_that_merges_written_copies(monkeypatch):
    """The law checkers have teeth here: a cse that ignores writes breaks semantics."""
    import transforms.passes.subexpressions as module
    from ir.effects import Effects

    nothing = Effects({}, frozenset(), {}, frozenset(), frozenset(), frozenset(), frozenset())
    monkeypatch.setattr(module, "graph_effects", lambda p, mid, graph: nothing)
    before = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %c = call_function[aten.clone.default](%x)
      %c_1 = call_function[aten.clone.default](%x)
      %w = call_function[aten.add_.Tensor](%c, 1)
      %add = call_function[aten.add.Tensor](%c, %c_1)
      return (%add,)""")
    with pytest.raises(LawViolation, match="semantics"):
        check_program(module.cse, before, inputs=_inputs)


def test_laws_on_generated_programs():
    check_laws(cse, idempotent=True, max_examples=60)


def test_a_copy_a_called_module_writes_is_not_merged():
    """The callee writes its argument in place (``copy_`` into its placeholder): the caller's
    value is written, so the two clones stay apart (``ir.effects.graph_effects`` follows
    the call)."""
    before = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %c = call_function[aten.clone.default](%x)
      %c_1 = call_function[aten.clone.default](%x)
      %b = call_module[b](%c)
      %add = call_function[aten.add.Tensor](%c, %c_1)
      return (%add,)
  module b: B
    graph 0:
      %y = placeholder
      %neg = call_function[aten.neg.default](%y)
      %copy_ = call_function[aten.copy_.default](%y, %neg)
      return %copy_""")
    assert cse(before) is before
    x = torch.randn(2)
    torch.testing.assert_close(lower(before)(x.clone())[0], x - x)


def _with_bindings(p, name):
    """``p`` with node ``name`` of the root graph marked as defining an unbacked symbol."""
    graph = p.root_module.graph
    nodes = [n.with_meta(unbacked_bindings={"u0": ()}) if n.name == name else n
             for n in graph.nodes]
    root = p.root_module.replace(graphs=(graph.of(nodes),))
    return p.replace(modules=p.modules.set(p.root, root))


def test_a_node_that_defines_unbacked_symbols_is_kept():
    before = _with_bindings(program(BEFORE), "mul_1")
    assert "%mul_1 = call_function[aten.mul.Tensor](%x, 2)" in format_program(cse(before))


def test_the_cleanup_passes_run_by_name():
    before = program(BEFORE)
    assert transform(before, ["cse"]) == cse(before)
    names = ["fold_constants", "cse", "eliminate_dead_code"]
    assert transform(before, names) == transforms.eliminate_dead_code(cse(before))


def test_inputs_that_may_be_one_tensor_count_as_written_together():
    """``b`` writes its first input and reads its second before and after: a caller may pass
    one tensor twice (as here), so the two reads are not merged."""
    before = program("""\
program:
  inputs:
    %x: user_input
  outputs:
    %b: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %c = call_function[aten.clone.default](%x)
      %b = call_module[b](%c, %c)
      return (%b,)
  module b: B
    graph 0:
      %y = placeholder
      %z = placeholder
      %r = call_function[aten.neg.default](%z)
      %w = call_function[aten.add_.Tensor](%y, 1)
      %r_1 = call_function[aten.neg.default](%z)
      %add = call_function[aten.add.Tensor](%r, %r_1)
      return %add""")
    assert cse(before) is before
    x = torch.randn(2)
    torch.testing.assert_close(lower(before)(x.clone())[0], -2 * x - 1)
