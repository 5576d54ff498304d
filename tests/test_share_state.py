"""``lower(p, share_state=True)``: new tensor objects over the program's storage, no copies."""

from __future__ import annotations

import copy

import pytest
import torch
import zoo

from ir import import_ep
from lowering import lower
from transforms import transform


def _build(name: str, **options):
    ep = copy.deepcopy(zoo.export_case(zoo.CASES[name]))  # these tests write its buffers
    return ep, lower(transform(import_ep(ep)), **options)


@pytest.mark.parametrize("name", ["mlp_nested", "tied_weights", "buffer_mutation"])
def test_shared_state_uses_the_programs_storage(name):
    ep, module = _build(name, share_state=True)
    held = {**ep.state_dict, **ep.constants}
    state = dict(module.named_parameters(remove_duplicate=False))
    state |= dict(module.named_buffers(remove_duplicate=False))
    assert state, "the case has state"
    for fqn, tensor in state.items():
        assert tensor.data_ptr() == held[fqn].data_ptr(), fqn
        assert tensor is not held[fqn], f"{fqn}: a new tensor object, not the program's"
    for fqn, p in module.named_parameters():
        assert type(p) is torch.nn.Parameter and p.requires_grad == held[fqn].requires_grad


@pytest.mark.parametrize("name", ["mlp_nested", "buffer_mutation", "buffer_mutation_repeated"])
def test_shared_state_computes_like_copied_state(name):
    case = zoo.CASES[name]
    _, shared = _build(name, share_state=True)
    _, copied = _build(name)
    for _ in range(3):
        torch.testing.assert_close(shared(*case.args()), copied(*case.args()))


def test_tied_weights_stay_one_object_when_shared():
    _, module = _build("tied_weights", share_state=True)
    params = dict(module.named_parameters(remove_duplicate=False))
    tied = [p for p in params.values() if sum(q is p for q in params.values()) > 1]
    assert tied, "the tied embedding and head are one Parameter"


def test_buffer_updates_reach_the_program_only_when_shared():
    case = zoo.CASES["buffer_mutation"]
    ep_copied, copied = _build("buffer_mutation")
    ep_shared, shared = _build("buffer_mutation", share_state=True)
    before = {k: v.clone() for k, v in ep_copied.state_dict.items()}
    copied(*case.args())
    shared(*case.args())
    changed = {k for k, v in ep_shared.state_dict.items() if not torch.equal(v, before[k])}
    assert changed, "the in-place buffer update is written through to the program"
    assert all(torch.equal(v, before[k]) for k, v in ep_copied.state_dict.items())
    for fqn in changed:
        torch.testing.assert_close(shared.get_buffer(fqn), ep_shared.state_dict[fqn])


SHARED_HOLDER = '''
program:
  inputs:
    %b_m0_b0: buffer m0.b0 persistent=True
    %b_s0_b0: buffer s0.b0 persistent=True
    %c_m0_c0: constant_tensor m0.c0
    %c_s0_c0: constant_tensor s0.c0
    %x0: user_input
  outputs:
    %x0: user_output
  state:
    m0.b0: buffer <Tensor (4,) torch.float32>
    s0.b0: buffer <Tensor (4,) torch.float32> = m0.b0
    m0.c0: constant <Tensor (4,) torch.float32>
    s0.c0: constant <Tensor (4,) torch.float32> = m0.c0
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('x0',)
  call order: ('', 'm0', 's0')
  module <root>: purefx.generated.Root [module] id=''
    graph 0:
      %b_m0_b0 = placeholder
      %b_s0_b0 = placeholder
      %c_m0_c0 = placeholder
      %c_s0_c0 = placeholder
      %x0 = placeholder
      return (%x0,)
  module m0: ? [module] id='m0'
  module s0: ? [module] id='s0'
'''


def test_a_module_under_two_paths_holds_its_tied_constant_once():
    # m0 and s0 tie every state tensor, so they are one module object; its constant is
    # registered under both paths, the second time as the value it already holds
    from ir import parse_program

    m = lower(transform(parse_program(SHARED_HOLDER)))
    assert m.m0 is m.s0
    assert m.s0.c0 is m.m0.c0
    assert [name for name, _ in m.named_buffers()] == ["m0.b0"]
