"""Before/Expected examples for ``split_hop_bodies``: a set-grad or autocast call whose body's
nodes come from several modules becomes one call per module run of the body, each carrying that
run's module stack (with its ``get_attr`` and ``getitem`` nodes), so ``outline`` puts each run in
the module that made it. A body with one stack keeps its body; only the stacks move."""

from __future__ import annotations

from beforeafter import program

from ir import verify
from transforms import outline, split_hop_bodies

SET_GRAD = "torch.ops.higher_order.wrap_with_set_grad_enabled"
AUTOCAST = "torch.ops.higher_order.wrap_with_autocast"
TRACEPOINT = "torch.ops.higher_order._export_tracepoint"

# ``with torch.no_grad(): a = x * 2; y = self.sub(a); z = y + a`` in the root, where
# ``sub(a) = self.l(a).relu()``: the body spans the root, ``sub`` and ``sub.l``.
SPAN = f"""\
program:
  inputs:
    %x: user_input
    %w: user_input
  outputs:
    %getitem: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = placeholder
      %body = get_attr[submod_1]()
      %hop = call_function[{SET_GRAD}](False, %body, %x, %w)
      %getitem = call_function[_operator.getitem](%hop, 0)
      return (%getitem,)
  module sub: Sub
  module sub.l: Linear
  module submod_1: ? [subgraph]
    graph 0:
      %x = placeholder
      %w = placeholder
      %mul = call_function[aten.mul.Tensor](%x, 2)
      %linear = call_function[aten.linear.default](%mul, %w)  # stack: sub, sub.l
      %relu = call_function[aten.relu.default](%linear)  # stack: sub
      %add = call_function[aten.add.Tensor](%relu, %mul)
      return (%add,)"""

SPAN_SPLIT = f"""\
program:
  inputs:
    %x: user_input
    %w: user_input
  outputs:
    %getitem: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = placeholder
      %body_1 = get_attr[submod_1_0]()  # stack:
      %hop = call_function[{SET_GRAD}](False, %body_1, %x)
      %mul = call_function[_operator.getitem](%hop, 0)
      %body_2 = get_attr[submod_1_1]()  # stack: sub, sub.l
      %hop_1 = call_function[{SET_GRAD}](False, %body_2, %mul, %w)  # stack: sub, sub.l
      %linear = call_function[_operator.getitem](%hop_1, 0)  # stack: sub, sub.l
      %body_3 = get_attr[submod_1_2]()  # stack: sub
      %hop_2 = call_function[{SET_GRAD}](False, %body_3, %linear)  # stack: sub
      %relu = call_function[_operator.getitem](%hop_2, 0)  # stack: sub
      %body_4 = get_attr[submod_1_3]()  # stack:
      %hop_3 = call_function[{SET_GRAD}](False, %body_4, %relu, %mul)
      %getitem = call_function[_operator.getitem](%hop_3, 0)
      return (%getitem,)
  module sub: Sub
  module sub.l: Linear
  module submod_1_0: ? [subgraph]
    graph 0:
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, 2)
      return (%mul,)
  module submod_1_1: ? [subgraph]
    graph 0:
      %mul = placeholder
      %w = placeholder
      %linear = call_function[aten.linear.default](%mul, %w)  # stack: sub, sub.l
      return (%linear,)
  module submod_1_2: ? [subgraph]
    graph 0:
      %linear = placeholder
      %relu = call_function[aten.relu.default](%linear)  # stack: sub
      return (%relu,)
  module submod_1_3: ? [subgraph]
    graph 0:
      %relu = placeholder
      %mul = placeholder
      %add = call_function[aten.add.Tensor](%relu, %mul)
      return (%add,)"""

# ``with torch.autocast(...): h = self.lin(x)`` in the root: one stack (``lin``) in the body,
# the call made in the root.
ONE_STACK = f"""\
program:
  inputs:
    %x: user_input
    %w: user_input
  outputs:
    %to: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = placeholder
      %body = get_attr[submod_1]()
      %hop = call_function[{AUTOCAST}]('cpu', torch.bfloat16, True, False, %body, %x, %w)
      %getitem = call_function[_operator.getitem](%hop, 0)
      %to = call_function[aten.to.dtype](%getitem, torch.float32)
      return (%to,)
  module lin: Linear
  module submod_1: ? [subgraph]
    graph 0:
      %x = placeholder
      %w = placeholder
      %linear = call_function[aten.linear.default](%x, %w)  # stack: lin
      return (%linear,)"""

ONE_STACK_MOVED = f"""\
program:
  inputs:
    %x: user_input
    %w: user_input
  outputs:
    %to: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = placeholder
      %body_1 = get_attr[submod_1]()  # stack: lin
      %hop = call_function[{AUTOCAST}]('cpu', torch.bfloat16, True, False, %body_1, %x, %w)  # stack: lin
      %getitem = call_function[_operator.getitem](%hop, 0)  # stack: lin
      %to = call_function[aten.to.dtype](%getitem, torch.float32)
      return (%to,)
  module lin: Linear
  module submod_1: ? [subgraph]
    graph 0:
      %x = placeholder
      %w = placeholder
      %linear = call_function[aten.linear.default](%x, %w)  # stack: lin
      return (%linear,)"""


def stacks(p) -> dict[str, list[str]]:
    """Each root node's module stack as its paths (the root entry left out)."""
    return {
        n.name: [path for path, _ in n.meta["nn_module_stack"].values() if path]
        for n in p.root_module.graph.nodes
        if "nn_module_stack" in n.meta
    }


def graph_of(p, path: str):
    """The first graph of the module at ``path``."""
    return p.modules[p.resolve(path)].graph


def test_a_body_across_three_modules_becomes_one_call_per_run():
    before = program(SPAN)
    after = verify(split_hop_bodies(before))
    expected = program(SPAN_SPLIT, like=before)
    assert after == expected  # names kept where they can be: exact equality
    assert stacks(after) == stacks(expected)


def test_outlining_puts_each_run_in_the_module_that_made_it():
    after = outline(split_hop_bodies(program(SPAN)))
    owners = {}
    for path, mid in after.walk():
        for name, child in after.modules[mid].children:
            if after.modules[child].kind == "subgraph":
                owners[name] = path
    assert owners == {
        "submod_1_0": "", "submod_1_1": "sub.l", "submod_1_2": "sub", "submod_1_3": ""
    }
    lin_targets = [str(n.target) for n in graph_of(after, "sub.l").nodes]
    assert any("wrap_with_set_grad_enabled" in t for t in lin_targets)


def test_a_body_with_one_stack_keeps_its_body_and_moves():
    before = program(ONE_STACK)
    after = verify(split_hop_bodies(before))
    expected = program(ONE_STACK_MOVED, like=before)
    assert after == expected
    assert stacks(after) == stacks(expected)
    assert after.modules["submod_1"] is before.modules["submod_1"]


def test_bodies_in_place_are_returned_as_they_are():
    done = split_hop_bodies(program(SPAN))
    assert split_hop_bodies(done) is done
    moved = program(ONE_STACK_MOVED)
    assert split_hop_bodies(moved) is moved


def test_a_call_read_other_than_by_getitem_is_kept():
    odd = program(SPAN.replace(
        "%getitem = call_function[_operator.getitem](%hop, 0)",
        "%getitem = call_function[builtins.len](%hop)",
    ))
    assert split_hop_bodies(odd) is odd


# ``with torch.no_grad(): y = self.sub(x)`` with ``sub`` preserved: export leaves ``sub``'s
# signature empty and its tracepoints in the body, and returns ``x`` through the body (the root
# reads it as ``%getitem``).
PRESERVED = f"""\
program:
  inputs:
    %x: user_input
    %w: user_input
  outputs:
    %add: user_output
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [], [])])
      out_spec: leaf
    'sub':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = placeholder
      %body = get_attr[submod_1]()
      %hop = call_function[{SET_GRAD}](False, %body, %x, %w)
      %getitem = call_function[_operator.getitem](%hop, 0)
      %getitem_1 = call_function[_operator.getitem](%hop, 1)
      %add = call_function[aten.add.Tensor](%getitem, %getitem_1)
      return (%add,)
  module sub: Sub
  module sub.l: Linear
  module submod_1: ? [subgraph]
    graph 0:
      %x = placeholder
      %w = placeholder
      %tp = call_function[{TRACEPOINT}](%x, kind='module_call_inputs', path='_export_root.sub')  # stack: sub
      %getitem = call_function[_operator.getitem](%tp, 0)  # stack: sub
      %linear = call_function[aten.linear.default](%getitem, %w)  # stack: sub, sub.l
      %relu = call_function[aten.relu.default](%linear)  # stack: sub
      %tp_1 = call_function[{TRACEPOINT}](%relu, kind='module_call_outputs', path='_export_root.sub')  # stack: sub
      %getitem_1 = call_function[_operator.getitem](%tp_1, 0)
      return (%getitem, %getitem_1)"""

PRESERVED_SPLIT = f"""\
program:
  inputs:
    %x: user_input
    %w: user_input
  outputs:
    %add: user_output
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [], [])])
      out_spec: leaf
    'sub':
      inputs: (%x,)
      outputs: (%getitem_1,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
  module <root>: Top
    graph 0:
      %x = placeholder
      %w = placeholder
      %body_1 = get_attr[submod_1_0]()  # stack: sub, sub.l
      %hop = call_function[{SET_GRAD}](False, %body_1, %x, %w)  # stack: sub, sub.l
      %linear = call_function[_operator.getitem](%hop, 0)  # stack: sub, sub.l
      %body_2 = get_attr[submod_1_1]()  # stack: sub
      %hop_1 = call_function[{SET_GRAD}](False, %body_2, %linear)  # stack: sub
      %getitem_1 = call_function[_operator.getitem](%hop_1, 0)  # stack: sub
      %add = call_function[aten.add.Tensor](%x, %getitem_1)
      return (%add,)
  module sub: Sub
  module sub.l: Linear
  module submod_1_0: ? [subgraph]
    graph 0:
      %x = placeholder
      %w = placeholder
      %linear = call_function[aten.linear.default](%x, %w)  # stack: sub, sub.l
      return (%linear,)
  module submod_1_1: ? [subgraph]
    graph 0:
      %linear = placeholder
      %relu = call_function[aten.relu.default](%linear)  # stack: sub
      return (%relu,)"""


def test_a_preserved_call_inside_a_body_gets_its_signature_from_its_tracepoints():
    before = program(PRESERVED)
    after = verify(split_hop_bodies(before))
    expected = program(PRESERVED_SPLIT, like=before)
    assert after == expected
    assert stacks(after) == stacks(expected)
    assert after.call_signatures["sub"] == expected.call_signatures["sub"]
    assert before.call_signatures["sub"].inputs == ()  # what export leaves
