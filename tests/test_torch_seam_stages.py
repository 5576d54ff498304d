"""The pipeline-stage seam (``lowering.lowering_seam.CheckedPipelineStage``) against the installed
torch: the method it overrides and the cache it rewrites are still there, with the shape it
relies on."""

from __future__ import annotations

import inspect

import torch
from torch.distributed.pipelining import PipelineStage

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
