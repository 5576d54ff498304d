"""Before/Expected examples for ``eliminate_dead_code``: nodes whose results nothing reads and
that have no effect go, in every graph; placeholders, outputs, writes, side effects, random ops
(the generator's stream) and calls of modules that do any of these stay."""

from __future__ import annotations

import pytest
import torch
from beforeafter import program

from ir import format_program, import_ep, verify
from ir import signature as sg
from lowering import lower
from lowering.pass_laws import check_laws, check_program
from transforms import eliminate_dead_code, transform

BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %relu = call_function[aten.relu.default](%neg)
      %sin = call_function[aten.sin.default](%x)
      %rand = call_function[aten.rand.default]([2])
      %c = call_function[aten.clone.default](%x)
      %w = call_function[aten.add_.Tensor](%c, 1)
      %v = call_function[aten.view.default](%x, [2])
      %p = call_function[aten._print.default]('hi')
      %add = call_function[aten.add.Tensor](%neg, %x)
      return (%add,)"""

EXPECTED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %rand = call_function[aten.rand.default]([2])
      %c = call_function[aten.clone.default](%x)
      %w = call_function[aten.add_.Tensor](%c, 1)
      %p = call_function[aten._print.default]('hi')
      %add = call_function[aten.add.Tensor](%neg, %x)
      return (%add,)"""


def _inputs(p):
    return (torch.randn(2),), {}


def test_dead_pure_nodes_go_and_effects_stay():
    """``relu`` (read only by nothing), ``sin`` and the ``view`` go; ``rand`` stays (dropping it
    would shift later random numbers), the written copy and the print stay."""
    before = program(BEFORE)
    after = eliminate_dead_code(before)
    verify(after)
    assert after == program(EXPECTED, like=before)
    assert eliminate_dead_code(after) is after


def test_a_program_without_dead_nodes_is_returned_as_it_is():
    clean = program(EXPECTED)
    assert eliminate_dead_code(clean) is clean


def test_a_name_in_a_preserved_call_signature_stays():
    before = program(BEFORE)
    sig = sg.CallSignature((), (sg.ArgSpec(sg.TENSOR, "sin"),), None, None)
    before = before.replace(call_signatures=before.call_signatures.set("f", sig))
    assert "%sin = " in format_program(eliminate_dead_code(before), vals=False)


OUTLINED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_output
  state:
    b.w: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_module[a](%x)
      %a_1 = call_module[a](%x)
      %b = call_module[b](%x)
      %add = call_function[aten.add.Tensor](%a, %x)
      return (%add,)
  module a: A
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %cos = call_function[aten.cos.default](%x)
      return %neg
  module b: B
    graph 0:
      %x = placeholder
      %w = get_attr[w]()
      %copy_ = call_function[aten.copy_.default](%w, %x)
      return %copy_"""


def test_outlined_each_graph_once_and_a_call_with_an_effect_stays():
    """The unused call ``a_1`` of a pure module goes; the unused call of ``b``, which writes
    its buffer, stays; ``cos`` in ``a``'s graph (one graph, two calls) goes once."""
    before = program(OUTLINED)
    after = eliminate_dead_code(before)
    verify(after)
    expected = OUTLINED.replace("      %a_1 = call_module[a](%x)\n", "").replace(
        "      %cos = call_function[aten.cos.default](%x)\n", ""
    )
    assert after == program(expected, like=before)
    check_program(eliminate_dead_code, before, idempotent=True, inputs=_inputs)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.register_buffer("n", torch.zeros(4))

    def forward(self, x):
        unused = self.a(x).sin()  # noqa: F841 - the dead code
        self.n.add_(1)
        return self.a(x) + torch.rand(4) * 0


@pytest.mark.parametrize("outlined", [False, True], ids=["flat", "outlined"])
def test_numerics_and_state_equal_eager(outlined):
    x = torch.randn(3, 4)
    ep = torch.export.export(Model(), (x,))
    p = import_ep(ep)
    if outlined:
        p = transform(p)
    after = eliminate_dead_code(p)
    verify(after)
    assert after.node_count() < p.node_count()
    eager, lowered = ep.module(), lower(after)
    for _ in range(2):
        torch.testing.assert_close(lowered(x), eager(x))
    torch.testing.assert_close(lowered.n, eager.n)


def test_laws_on_hand_built_programs():
    seeded_alike = BEFORE.replace("aten.rand.default", "aten.ones.default")
    check_program(eliminate_dead_code, program(seeded_alike), idempotent=True, inputs=_inputs)


def test_laws_on_generated_programs():
    # check_laws judges vacuity after removing dead code from both sides, so dead-code
    # elimination itself changes nothing there: the laws are checked all the same
    report = check_laws(eliminate_dead_code, idempotent=True, max_examples=60,
                        allow_vacuous=True)
    assert report.tried == 60 and report.changed == 0


def test_a_node_that_defines_unbacked_symbols_is_kept():
    before = program(BEFORE)
    graph = before.root_module.graph
    nodes = [n.with_meta(unbacked_bindings={"u0": ()}) if n.name == "sin" else n
             for n in graph.nodes]
    before = before.replace(modules=before.modules.set(
        before.root, before.root_module.replace(graphs=(graph.of(nodes),))))
    assert "%sin = " in format_program(eliminate_dead_code(before), vals=False)


CHECKS = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %to = call_function[aten._to_copy.default](%x, dtype=torch.int8)
      %chk = call_function[aten._assert_tensor_metadata.default](%to, dtype=torch.int8)
      %q = call_module[q](%x)
      %neg = call_function[aten.neg.default](%x)
      return (%neg,)
  module q: Q
    graph 0:
      %x = placeholder
      %t = call_function[aten._to_copy.default](%x, dtype=torch.float16)
      %c = call_function[aten._assert_tensor_metadata.default](%t, dtype=torch.float16)
      return %t"""

CHECKS_EXPECTED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      return (%neg,)
  module q: Q
    graph 0:
      %x = placeholder
      %t = call_function[aten._to_copy.default](%x, dtype=torch.float16)
      return %t"""


def test_metadata_checks_are_kept_by_default():
    """A check is an effect (it raises on other metadata): it stays, and so does the cast it
    reads and the call of the module that holds one."""
    before = program(CHECKS)
    assert eliminate_dead_code(before) is before


def test_without_metadata_checks_what_they_read_goes_too():
    """``metadata_checks=False``: every check goes first, in every graph; then the cast only
    the check read and the call of a module whose only effect was its check are dead."""
    before = program(CHECKS)
    after = eliminate_dead_code(before, metadata_checks=False)
    verify(after)
    assert after == program(CHECKS_EXPECTED, like=before)
    assert eliminate_dead_code(after, metadata_checks=False) is after
    x = torch.randn(2)
    assert torch.equal(lower(after)(x)[0], lower(before)(x)[0])
