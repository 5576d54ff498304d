"""Before/Expected examples for ``hold_foreign_state`` (a listed pass, and the last step of
``sink_state``): a preserved call whose subtree reads state owned outside it takes only its
signature's arguments; it reads the state through a peer that holds the owner, and its callers
stop passing it."""

from __future__ import annotations

import pytest
from beforeafter import program
from programs_nested import NESTED

import transforms
from ir import VerifyError, alpha_equivalent, format_program, parse_program, verify
from ir.node import GET_ATTR
from transforms import inline, outline, outline_and_sink, sink_state, transform
from transforms.passes.foreign_state import hold_foreign_state
from transforms.pipeline import named_passes

# ``a.b`` is preserved and reads ``n.w``, owned by ``n``, a sibling of its parent ``a``
FLAT = """\
program:
  inputs:
    %p_n_w: parameter n.w
    %x: user_input
  outputs:
    %neg: user_output
  state:
    n.w: parameter <Parameter (2,) torch.float32>
  preserved calls:
    'a.b':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
  call order: ('', 'a', 'a.b')
  module <root>: Top
    graph 0:
      %p_n_w = placeholder
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a, a.b
      %mul = call_function[aten.mul.Tensor](%relu, %p_n_w)  # stack: a, a.b
      %neg = call_function[aten.neg.default](%mul)  # stack: a
      return (%neg,)
  module n: N
  module a: A
  module a.b: B"""

_HEAD = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  state:
    n.w: parameter <Parameter (2,) torch.float32>
  preserved calls:
    'a.b':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
  call order: ('', 'a', 'a.b')
"""

# what sinking alone gives: ``n.w`` cannot sink below ``a`` or ``a.b``, so it is passed down
# as an extra argument of the preserved call, which a swapped-in ``B`` would not accept
WIDENED = _HEAD + """\
  module <root>: Top
    graph 0:
      %x = placeholder
      %p_n_w = get_attr[n.w]()
      %neg = call_module[a](%x, %p_n_w)
      return (%neg,)
  module n: N
  module a: A
    graph 0:
      %x = placeholder
      %p_n_w = placeholder
      %b = call_module[b](%x, %p_n_w)
      %_flat_out = call_function[ir.tree_calls.flatten_by_spec](%b, leaf)
      %mul = call_function[_operator.getitem](%_flat_out, 0)
      %neg = call_function[aten.neg.default](%mul)
      return %neg
  module a.b: B
    graph 0:
      %_positional_arg_0 = placeholder
      %p_n_w = placeholder
      %_flat_args = call_function[ir.tree_calls.flatten_by_spec](((%_positional_arg_0,), {}), tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])]))
      %x = call_function[_operator.getitem](%_flat_args, 0)
      %relu = call_function[aten.relu.default](%x)
      %mul = call_function[aten.mul.Tensor](%relu, %p_n_w)
      %_tree_out = call_function[ir.tree_calls.unflatten_tree]((%mul,), leaf)
      return %_tree_out"""

# ``a.b`` holds ``n`` as a peer and reads ``_peer_n.w``; ``a`` (a plain call) no longer takes
# the tensor it only passed on, and the root no longer reads it
HELD = _HEAD + """\
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_module[a](%x)
      return (%neg,)
  module n: N
  module a: A
    graph 0:
      %x = placeholder
      %b = call_module[b](%x)
      %_flat_out = call_function[ir.tree_calls.flatten_by_spec](%b, leaf)
      %mul = call_function[_operator.getitem](%_flat_out, 0)
      %neg = call_function[aten.neg.default](%mul)
      return %neg
  module a.b: B
    peer _peer_n: id='n'
    graph 0:
      %_positional_arg_0 = placeholder
      %p_n_w = get_attr[_peer_n.w]()
      %_flat_args = call_function[ir.tree_calls.flatten_by_spec](((%_positional_arg_0,), {}), tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])]))
      %x = call_function[_operator.getitem](%_flat_args, 0)
      %relu = call_function[aten.relu.default](%x)
      %mul = call_function[aten.mul.Tensor](%relu, %p_n_w)
      %_tree_out = call_function[ir.tree_calls.unflatten_tree]((%mul,), leaf)
      return %_tree_out"""


def test_foreign_state_of_a_preserved_call_is_read_through_a_peer():
    before = program(WIDENED)
    after = hold_foreign_state(before)
    verify(after)
    assert alpha_equivalent(after, program(HELD, like=before))
    assert len(after.modules["a.b"].graphs[0].placeholders) == 1  # the signature's one input


def test_it_is_a_listed_pass_runnable_by_name():
    assert transforms.hold_foreign_state is hold_foreign_state
    assert named_passes()["hold_foreign_state"] is hold_foreign_state
    before = program(WIDENED)
    after = transform(before, ["hold_foreign_state"], check=True)
    assert alpha_equivalent(after, program(HELD, like=before))
    assert transform(after, ["hold_foreign_state"]) is after


def test_sinking_ends_with_it_fused_or_not():
    before = program(FLAT)
    fused = outline_and_sink(before)
    assert fused == sink_state(outline(before))
    assert alpha_equivalent(fused, program(HELD, like=before))


def test_idempotent_and_the_identity_without_foreign_state():
    held = program(HELD)
    assert hold_foreign_state(held) is held
    plain = sink_state(outline(program(NESTED)))  # no preserved call
    assert hold_foreign_state(plain) is plain


def test_peers_print_and_parse_back():
    held = program(HELD)
    assert "    peer _peer_n: id='n'" in format_program(held, vals=False)
    assert parse_program(format_program(held, vals=False), like=held) == held


def test_inline_reads_the_owner_state_at_its_own_path():
    flat = inline(program(HELD))
    verify(flat)
    reads = [n.target for n in flat.root_module.graph.nodes if n.op == GET_ATTR]
    assert reads == ["n.w"]


def test_verify_names_a_peer_outside_the_tree():
    held = program(HELD)
    b = held.modules["a.b"]
    broken = held.replace(modules=held.modules.set("a.b", b.replace(peers=(("_peer_n", "gone"),))))
    with pytest.raises(VerifyError, match="holds peer '_peer_n'"):
        verify(broken)


def test_a_peer_is_named_unlike_the_module_own_state():
    text = WIDENED.replace(
        "    n.w: parameter <Parameter (2,) torch.float32>\n",
        "    n.w: parameter <Parameter (2,) torch.float32>\n"
        "    a.b._peer_n: buffer <Tensor (2,) torch.float32>\n",
    )
    after = hold_foreign_state(program(text))
    verify(after)
    assert after.modules["a.b"].peers == (("_peer_n_1", "n"),)
