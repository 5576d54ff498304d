"""Before/Expected examples for ``move_to_device``: every device literal a node's arguments
carry (``arange``, ``full``, ``_to_copy`` ...) and every state tensor go to the target device, in
the root and in every module graph; a mapping moves only the devices it names. Runs without an
accelerator: the target is ``meta`` (no values to move) or ``cpu`` (nothing to move)."""

from __future__ import annotations

import pytest
import torch
from beforeafter import program

from ir import PassError, alpha_equivalent, format_program, verify
from lowering import lower
from transforms import move_to_device, outline, transform

BEFORE = """\
program:
  inputs:
    %p_w: parameter w
    %b_b: buffer b persistent=True
    %x: user_input
  outputs:
    %add_2: user_output
  state:
    w: parameter <Parameter (2,) torch.float32> requires_grad
    b: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_w = placeholder
      %b_b = placeholder
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_w)  # stack: lin
      %arange = call_function[aten.arange.default](2, dtype=torch.float32, device=device(type='cpu'), pin_memory=False)  # stack: lin
      %add = call_function[aten.add.Tensor](%mul, %arange)  # stack: lin
      %add_1 = call_function[aten.add.Tensor](%add, %b_b)
      %full = call_function[aten.full.default]([2], 3.0, device=device(type='cpu'), pin_memory=False)
      %to = call_function[aten._to_copy.default](%full, dtype=torch.float32, device=device(type='cpu'))
      %add_2 = call_function[aten.add.Tensor](%add_1, %to)
      return (%add_2,)
  module lin: Lin"""

EXPECTED = """\
program:
  inputs:
    %p_w: parameter w
    %b_b: buffer b persistent=True
    %x: user_input
  outputs:
    %add_2: user_output
  state:
    w: parameter <Parameter (2,) torch.float32> requires_grad
    b: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_w = placeholder
      %b_b = placeholder
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_w)
      %arange = call_function[aten.arange.default](2, dtype=torch.float32, device=device(type='meta'), pin_memory=False)
      %add = call_function[aten.add.Tensor](%mul, %arange)
      %add_1 = call_function[aten.add.Tensor](%add, %b_b)
      %full = call_function[aten.full.default]([2], 3.0, device=device(type='meta'), pin_memory=False)
      %to = call_function[aten._to_copy.default](%full, dtype=torch.float32, device=device(type='meta'))
      %add_2 = call_function[aten.add.Tensor](%add_1, %to)
      return (%add_2,)
  module lin: Lin"""


def _devices(p) -> dict[str, str]:
    table = p.state_table()
    return {fqn: str(p.tensors[table[fqn].tensor].value.device) for fqn in table}


def test_literals_and_state_move_to_meta():
    before = program(BEFORE)
    text = format_program(before, vals=False)
    after = move_to_device(before, "meta")
    verify(after)
    assert alpha_equivalent(after, program(EXPECTED, like=after))
    assert _devices(after) == {"w": "meta", "b": "meta"}
    w = after.tensors[after.state_table()["w"].tensor].value
    assert isinstance(w, torch.nn.Parameter) and w.requires_grad
    # pure: the input's text and tensors are as they were
    assert format_program(before, vals=False) == text
    assert _devices(before) == {"w": "cpu", "b": "cpu"}


OUTLINED = """\
program:
  inputs:
    %p_w: parameter w
    %b_b: buffer b persistent=True
    %x: user_input
  outputs:
    %add_2: user_output
  state:
    w: parameter <Parameter (2,) torch.float32> requires_grad
    b: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_w = placeholder
      %b_b = placeholder
      %x = placeholder
      %add = call_module[lin](%x, %p_w)
      %add_1 = call_function[aten.add.Tensor](%add, %b_b)
      %full = call_function[aten.full.default]([2], 3.0, device=device(type='meta'), pin_memory=False)
      %to = call_function[aten._to_copy.default](%full, dtype=torch.float32, device=device(type='meta'))
      %add_2 = call_function[aten.add.Tensor](%add_1, %to)
      return (%add_2,)
  module lin: Lin
    graph 0:
      %x = placeholder
      %p_w = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_w)
      %arange = call_function[aten.arange.default](2, dtype=torch.float32, device=device(type='meta'), pin_memory=False)
      %add = call_function[aten.add.Tensor](%mul, %arange)
      return[output_1] %add"""


def test_literals_move_in_every_module_graph():
    before = outline(program(BEFORE))
    after = move_to_device(before, "meta")
    verify(after)
    assert alpha_equivalent(after, program(OUTLINED, like=after))
    assert "device(type='meta')" not in format_program(before, vals=False)
    assert _devices(after) == {"w": "meta", "b": "meta"}


def test_a_mapping_moves_only_what_it_names_and_nothing_to_move_is_the_input():
    before = program(BEFORE)
    assert move_to_device(before, "cpu") is before
    assert move_to_device(before, {"cuda": "meta"}) is before
    mapped = move_to_device(before, {"cpu": "meta"})
    assert alpha_equivalent(mapped, program(EXPECTED, like=mapped))
    assert move_to_device(mapped, "meta") is mapped  # idempotent


def test_the_moved_program_runs_on_meta_inputs():
    """Lowered, the moved program runs on meta inputs: a literal left on cpu would fail there
    (a cpu tensor does not mix with meta ones); the input program still runs on cpu."""
    (out,) = lower(transform(move_to_device(program(BEFORE), "meta")))(torch.empty(2, device="meta"))
    assert out.device.type == "meta" and out.shape == (2,)
    (got,) = lower(transform(program(BEFORE)))(torch.ones(2))
    torch.testing.assert_close(got, torch.tensor([3.0, 4.0]))  # state is zeros: 1*0+[0,1]+0+3
    before = program(BEFORE)
    state_only = before.replace(tensors=move_to_device(before, "meta").tensors)  # literals stay
    with pytest.raises(RuntimeError, match="not on the expected device"):
        lower(transform(state_only))(torch.empty(2, device="meta"))


def test_a_device_that_is_none_is_a_pass_error():
    with pytest.raises(PassError, match="move_to_device: device 'gpu!'"):
        move_to_device(program(BEFORE), "gpu!")
