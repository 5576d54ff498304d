"""Before/Expected examples for ``outline``: one graph per module call, following the module
stacks; repeated calls become graph variants (``path@k``); modules whose state is all tied are
one object; the export signature and state are kept."""

from __future__ import annotations

from beforeafter import program
from programs_nested import NESTED, SHARED

from ir import alpha_equivalent, graph_key, verify
from transforms import outline


def check(before_text: str, expected_text: str) -> None:
    before = program(before_text)
    after = outline(before)
    verify(after)
    assert alpha_equivalent(after, program(expected_text, like=before))


def test_nesting_and_repeated_calls():
    check(
        NESTED,
        """\
program:
  inputs:
    %p_a_w: parameter a.w
    %x: user_input
  outputs:
    %add: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %x = placeholder
      %neg = call_module[a](%x, %p_a_w)
      %add = call_function[aten.add.Tensor](%neg, %x)
      return (%add,)
  module a: A
    graph 0:
      %x = placeholder
      %w = placeholder
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
      return %neg""",
    )


def test_modules_with_all_state_tied_are_one_object_called_twice():
    check(
        SHARED,
        """\
program:
  inputs:
    %p_a_w: parameter a.w
    %p_b_w: parameter b.w
    %p_a_v: parameter a.v
    %p_b_v: parameter b.v
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
      %p_a_w = placeholder
      %p_b_w = placeholder
      %p_a_v = placeholder
      %p_b_v = placeholder
      %x = placeholder
      %mul = call_module[a](%x, %p_a_w)
      %mul_1 = call_module[b@1](%mul, %p_b_w)
      return (%mul_1,)
  module a: Scale
    graph 0:
      %x = placeholder
      %w = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %w)
      return %mul
    graph 1:
      %x = placeholder
      %w = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %w)
      return %mul
  module b: same object as a""",
    )


def test_a_program_that_runs_only_in_the_root_keeps_its_graph():
    flat = """\
program:
  inputs:
    %x: user_input
  outputs:
    %relu: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack:
      return (%relu,)"""
    check(flat, flat)


def test_outline_is_idempotent_on_the_example():
    once = outline(program(NESTED))
    assert outline(once) == once


IN_SPEC = "tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])"
PRESERVED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%neg,)
      in_spec: IN_SPEC
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%x,)
      outputs: (%relu,)
      in_spec: IN_SPEC
      out_spec: leaf
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a
      %neg = call_function[aten.neg.default](%relu)
      return (%neg,)
  module a: A"""


def test_a_preserved_call_takes_eager_arguments_and_flattens_them_itself():
    check(
        PRESERVED.replace("IN_SPEC", IN_SPEC),
        """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%neg,)
      in_spec: IN_SPEC
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%x,)
      outputs: (%relu,)
      in_spec: IN_SPEC
      out_spec: leaf
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_module[a](%x)
      %flat_out = call_function[ir.tree_calls.flatten_by_spec](%a, leaf)
      %relu = call_function[_operator.getitem](%flat_out, 0)
      %neg = call_function[aten.neg.default](%relu)
      return (%neg,)
  module a: A
    graph 0:
      %arg = placeholder
      %flat = call_function[ir.tree_calls.flatten_by_spec](((%arg,), {}), IN_SPEC)
      %x = call_function[_operator.getitem](%flat, 0)
      %relu = call_function[aten.relu.default](%x)
      %tree_out = call_function[ir.tree_calls.unflatten_tree]((%relu,), leaf)
      return %tree_out""".replace("IN_SPEC", IN_SPEC),
    )


# ``a`` takes its three values as one tuple argument and a keyword, or as two leaves and a keyword
TAKES = """\
program:
  inputs:
    %x: user_input
    %y: user_input
    %z: user_input
  outputs:
    %neg: user_output
  preserved calls:
    '':
      inputs: (%x, %y, %z)
      outputs: (%neg,)
      in_spec: tree(tuple, [tree(tuple, [leaf, leaf, leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%x, %y, %z)
      outputs: (%mul,)
      in_spec: IN_SPEC
      out_spec: leaf
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %x = placeholder
      %y = placeholder
      %z = placeholder
      %add = call_function[aten.add.Tensor](%x, %y)  # stack: a
      %mul = call_function[aten.mul.Tensor](%add, %z)  # stack: a
      %neg = call_function[aten.neg.default](%mul)
      return (%neg,)
  module a: A"""
ROOT_TAIL = """\
      %flat_out = call_function[ir.tree_calls.flatten_by_spec](%a, leaf)
      %mul = call_function[_operator.getitem](%flat_out, 0)
      %neg = call_function[aten.neg.default](%mul)
      return (%neg,)"""


def _root_key(text: str) -> tuple:
    return graph_key(program(text).root_module.graph)


def check_root(in_spec: str, expected_body: str) -> None:
    """``outline`` of ``TAKES`` with ``in_spec`` gives a root graph equal (up to names) to
    ``expected_body`` followed by ``ROOT_TAIL``."""
    before = TAKES.replace("IN_SPEC", in_spec)
    flat_body = before[before.index("      %add") : before.index("  module a: A")]
    expected = before.replace(flat_body, expected_body + ROOT_TAIL + "\n")
    got = graph_key(outline(program(before)).root_module.graph)
    assert got == _root_key(expected)


def test_a_preserved_call_passes_leaf_arguments_as_they_are():
    spec = "tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [leaf], ['scale'])])"
    check_root(spec, "      %a = call_module[a](%x, %y, scale=%z)\n")


def test_a_preserved_call_builds_a_nested_argument_from_its_leaves():
    spec = "tree(tuple, [tree(tuple, [tree(tuple, [leaf, leaf])]), tree(dict, [leaf], ['scale'])])"
    check_root(
        spec,
        f"""\
      %tree_in = call_function[ir.tree_calls.unflatten_tree]((%x, %y, %z), {spec})
      %args = call_function[_operator.getitem](%tree_in, 0)
      %kwargs = call_function[_operator.getitem](%tree_in, 1)
      %arg = call_function[_operator.getitem](%args, 0)
      %kwarg = call_function[_operator.getitem](%kwargs, 'scale')
      %a = call_module[a](%arg, scale=%kwarg)
""",
    )


SELF_COPY = """\
program:
  inputs:
    %b_n: buffer a.n persistent=True
    %x: user_input
  outputs:
    %mul: user_output
  state:
    a.n: buffer <Tensor (2,) torch.float32>
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %copy_ = call_function[aten.copy_.default](%b_n, %b_n)
      %mul = call_function[aten.mul.Tensor](%x, %b_n)  # stack: a
      return (%mul,)
  module a: A"""


def test_a_buffer_copied_onto_itself_is_still_the_buffer_in_a_preserved_call():
    """``copy_(n, n)`` writes nothing: the preserved call ``a`` reads ``n`` as state. (Outlining
    took ``n`` for the value a ``copy_`` writes into ``n`` and recursed without end; found by
    ``tests/laws/test_stage_teeth.py``'s plant that writes back the previous value.)"""
    import torch

    from lowering.pass_laws import check_program
    from transforms import transform

    p = program(SELF_COPY)
    verify(outline(p))
    check_program(transform, p, inputs=lambda _: ((torch.randn(2),), {}), idempotent=True)
