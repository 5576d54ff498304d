"""The pipeline-stage seam (``lowering.lowering_seam.CheckedPipelineStage``) against the installed
torch: the method it overrides and the cache it rewrites are still there, with the shape it
relies on; and the seam's handling of each layout torch has had (2.13/2.14, 2.15) and of none,
on stand-in stages, whatever torch is installed."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.distributed.pipelining import PipelineStage

from ir.errors import LoweringError
from lowering.lowering_seam import CheckedPipelineStage, data_parallel_inner


def test_forward_one_chunk_has_the_signature_the_seam_overrides():
    params = list(inspect.signature(PipelineStage.forward_one_chunk).parameters)
    assert params == ["self", "fwd_chunk_id", "args", "kwargs", "save_forward_output"]
    ours = list(inspect.signature(CheckedPipelineStage.forward_one_chunk).parameters)
    assert ours == params


def test_the_kept_forward_holds_outputs_then_inputs_per_chunk():
    """torch keeps each micro-batch's forward for its backward, in one of two layouts (the
    seam's comment): 2.13/2.14 write ``self.fwd_cache[chunk] = (output_tuple, flat inputs)`` in
    forward_one_chunk and pop it as ``(stage_output, input_values)`` in backward_one_chunk; 2.15
    writes ``self._forward_chunk_states[chunk] = self._make_forward_chunk_state(output_tuple,
    flat inputs)`` and pops it, reading ``input_values``."""
    fwd = inspect.getsource(PipelineStage.forward_one_chunk)
    bwd = inspect.getsource(PipelineStage.backward_one_chunk)
    if "_forward_chunk_states" in fwd:
        assert "self._forward_chunk_states[fwd_chunk_id] = self._make_forward_chunk_state(" in fwd
        assert "self._forward_chunk_states.pop(bwd_chunk_id)" in bwd
        assert "input_values" in bwd
        params = list(inspect.signature(PipelineStage._make_forward_chunk_state).parameters)
        assert params == ["self", "output_tuple", "input_values"]
    else:
        assert "self.fwd_cache[fwd_chunk_id] = (" in fwd
        assert "self.fwd_cache.pop(bwd_chunk_id)" in bwd and "input_values," in bwd


def test_data_parallel_inner_unwraps_ddp_only():
    m = torch.nn.Linear(2, 2)
    assert data_parallel_inner(m) is m


# The seam's own handling of each layout, on stand-in stages (the unbound method called on an
# object that has only what the layout has), so both layouts are checked on any installed torch.

class _State:
    """A stand-in for torch 2.15's kept forward: outputs and inputs."""

    def __init__(self, outputs, input_values):
        self.outputs, self.input_values = outputs, input_values


class _Layout215:
    stage_index = 1

    def __init__(self, kept):
        self._forward_chunk_states = kept

    def _make_forward_chunk_state(self, output_tuple, input_values):
        return _State(output_tuple, input_values)


class _Layout213:
    stage_index = 1

    def __init__(self, kept):
        self.fwd_cache = kept


def test_a_kept_forward_in_the_215_layout_gets_the_leaves_and_keeps_its_inputs():
    x, leaf, other = torch.ones(2), torch.zeros(3), torch.full((1,), 5.0)
    stage = _Layout215({0: _State(({"a": leaf},), [x]), 1: _State(("untouched",), [other])})
    CheckedPipelineStage._keep_for_backward(stage, 0, (leaf,))
    kept = stage._forward_chunk_states
    assert kept[0].outputs == (leaf,) and kept[0].input_values[0] is x
    assert kept[1].outputs == ("untouched",) and kept[1].input_values[0] is other


def test_a_kept_forward_in_the_213_layout_gets_the_leaves_and_keeps_its_inputs():
    x, leaf = torch.ones(2), torch.zeros(3)
    stage = _Layout213({0: (({"a": leaf},), [x]), 1: (("untouched",), [x])})
    CheckedPipelineStage._keep_for_backward(stage, 0, (leaf,))
    outputs, inputs = stage.fwd_cache[0]
    assert outputs == (leaf,) and inputs[0] is x
    assert stage.fwd_cache[1] == (("untouched",), [x])


def test_a_stage_with_neither_layout_is_a_lowering_error_naming_torch_and_the_fix():
    class Neither:
        stage_index = 3

    with pytest.raises(LoweringError) as e:
        CheckedPipelineStage._keep_for_backward(Neither(), 0, (torch.zeros(1),))
    message = str(e.value)
    assert "stage 3" in message and torch.__version__ in message
    assert "torch>=2.13,<2.16" in message and "tuple of tensors" in message
