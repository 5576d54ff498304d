"""One process, no process group: ``load_stage_state`` (a stage of a meta export filled from a
``torch.distributed.checkpoint`` directory or a ``state_dict``), the argument checks of the
shared-weight calls that need no group, ``merge_stage_state_dicts`` of wrapped stages, and the
laws of ``stage_ranks`` (which rank runs which stage)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given
from hypothesis import strategies as st

from bench import stage_cases_dist as scd
from ir import import_ep
from ir.errors import LoweringError
from lowering import (
    load_stage_state,
    merge_stage_state_dicts,
    pipeline_stage,
    stage_module,
    sync_shared_grads,
)
from lowering.stage_modules import stage_ranks
from transforms import split_stages


def _meta_stages(case: str, n: int):
    model, ep, at, pos, kw, _tgt, _loss = scd.build(case, n, 1, export_on_meta=True)
    return model, split_stages(import_ep(ep), at), pos, kw


def _run(stages, modules, pos, kw):
    acts = pos
    for m in modules:
        out = m(*acts, **kw)
        acts = out if isinstance(out, tuple) else (out,)
    return out


def _save(sd, path):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(sd, checkpoint_id=path, no_dist=True)


@pytest.mark.parametrize("via", ["dcp", "mapping"])
@pytest.mark.parametrize("case,n", [("tied_lm", 2), ("tied3", 4)])
def test_meta_stages_loaded_one_by_one_equal_eager(tmp_path, via, case, n):
    """Each stage reads only its own entries (under the original fqns, tied copies too); the
    stages in sequence compute eager's output, and each stage's state is eager's."""
    model, stages, pos, kw = _meta_stages(case, n)
    source = model.state_dict()
    if via == "dcp":
        _save(source, str(tmp_path))
    modules = [stage_module(stages, k, "cpu") for k in range(n)]
    for k, m in enumerate(modules):
        load_stage_state(stages, k, m, str(tmp_path) if via == "dcp" else source)
        for fqn, t in m.state_dict().items():
            torch.testing.assert_close(t, source[fqn], rtol=0, atol=0)
    out = _run(stages, modules, pos, kw)
    want = model(*pos, **kw)
    got = out["logits"] if isinstance(out, dict) else out
    torch.testing.assert_close(got, want["logits"] if isinstance(want, dict) else want)


def test_several_stages_of_one_rank_load_at_once():
    model, stages, _pos, _kw = _meta_stages("tied3", 4)
    modules = [stage_module(stages, k, "cpu") for k in (0, 2)]
    load_stage_state(stages, [0, 2], modules, model.state_dict())
    for m in modules:
        for fqn, t in m.state_dict().items():
            assert torch.equal(t, model.state_dict()[fqn]), fqn


@pytest.mark.parametrize("via", ["dcp", "mapping"])
def test_a_checkpoint_without_another_stages_fqn_is_refused_before_loading(tmp_path, via):
    """Stage 1 is loaded, the missing fqn is stage 0's: the error names it anyway (every rank
    of a pipeline raises the same), and stage 1's module is left untouched."""
    model, stages, _pos, _kw = _meta_stages("tied_lm", 2)
    sd = {k: v for k, v in model.state_dict().items() if k != "layers.0.lin.weight"}
    if via == "dcp":
        _save(sd, str(tmp_path))
    m = stage_module(stages, 1, "cpu")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(LoweringError, match=r"no entry 'layers\.0\.lin\.weight' \(state of stage 0"):
        load_stage_state(stages, 1, m, str(tmp_path) if via == "dcp" else sd)
    for k, v in m.state_dict().items():  # bit for bit (the empty state may hold NaNs)
        assert torch.equal(v.view(torch.int64), before[k].view(torch.int64)), k


def test_a_mapping_entry_of_another_shape_is_named():
    model, stages, _pos, _kw = _meta_stages("mlp", 2)
    sd = dict(model.state_dict())
    sd["layers.2.lin.weight"] = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(LoweringError, match=r"stage 1's 'layers\.2\.lin\.weight' is \(6, 6\)"):
        load_stage_state(stages, 1, stage_module(stages, 1, "cpu"), sd)


def test_not_a_checkpoint_directory(tmp_path):
    _model, stages, _pos, _kw = _meta_stages("mlp", 2)
    with pytest.raises(LoweringError, match="cannot read a torch.distributed.checkpoint"):
        load_stage_state(stages, 0, stage_module(stages, 0, "cpu"), str(tmp_path / "nothing"))


def test_argument_checks_that_need_no_group():
    """Raised before any group is needed (the program has no shared weight, or the call
    itself is malformed)."""
    _model, ep, at, *_ = scd.build("mlp", 2, 1)
    stages = split_stages(import_ep(ep), at)
    m0 = stage_module(stages, 0)
    with pytest.raises(LoweringError, match="2 stage indices but 1 modules"):
        sync_shared_grads(stages, [0, 1], [m0])
    with pytest.raises(LoweringError, match=r"stage indices \[0, 0\] repeat a stage"):
        sync_shared_grads(stages, [0, 0], [m0, m0])
    with pytest.raises(LoweringError, match=r"stage index 2 is not in range\(0, 2\)"):
        sync_shared_grads(stages, 2, m0)
    with pytest.raises(LoweringError, match="the module of stage 0 is a dict"):
        load_stage_state(stages, 0, {}, {})
    with pytest.raises(LoweringError, match="expected the Stages"):
        sync_shared_grads("stages", 0, m0)
    sync_shared_grads(stages, 0, m0)  # nothing shared: nothing to do, no group needed
    with pytest.raises(LoweringError, match="no process group"):
        pipeline_stage(stages, 0, "cpu")
    _model, ep, at, *_ = scd.build("tied_lm", 2, 1)
    tied = split_stages(import_ep(ep), at)
    with pytest.raises(LoweringError, match="no process group"):
        sync_shared_grads(tied, 0, stage_module(tied, 0))


def test_merge_takes_ddp_state_dicts():
    """A ``DistributedDataParallel`` wrapper's state dict (every key under ``module.``) merges
    like its module's."""
    model, ep, at, *_ = scd.build("tied_lm", 2, 1)
    stages = split_stages(import_ep(ep), at)
    sds = [stage_module(stages, k).state_dict() for k in range(2)]
    wrapped = [{"module." + k: v for k, v in sd.items()} for sd in sds]
    merged = merge_stage_state_dicts(stages, [wrapped[0], sds[1]])
    assert list(merged) == list(model.state_dict())
    for k, v in model.state_dict().items():
        assert torch.equal(merged[k], v), k


class _Rotary(torch.nn.Module):
    """A non-persistent buffer (as a rotary embedding's ``inv_freq``) read in stage 1."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(3)])
        self.register_buffer("inv", torch.arange(1, d + 1, dtype=torch.float64) / d,
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        x = self.layers[1](x) * self.inv
        return self.layers[2](x)


@pytest.mark.parametrize("via", ["dcp", "mapping"])
def test_non_persistent_buffers_of_a_meta_export(tmp_path, via):
    """state_dict() leaves the buffer out and the meta export has no value of it: with it in the
    checkpoint the stages equal eager; without it, load_stage_state names it (every stage)."""
    torch.manual_seed(0)
    model = _Rotary().double()
    with torch.device("meta"):
        shell = _Rotary().double()
    x = torch.randn(2, 6, dtype=torch.float64)
    stages = split_stages(import_ep(torch.export.export(shell, (x.to("meta"),))),
                          at=["layers.1"])
    full = {**dict(model.named_buffers()), **model.state_dict()}
    plain = model.state_dict()
    if via == "dcp":
        _save(full, str(tmp_path / "full"))
        _save(plain, str(tmp_path / "plain"))
    src = {"full": str(tmp_path / "full") if via == "dcp" else full,
           "plain": str(tmp_path / "plain") if via == "dcp" else plain}
    with pytest.raises(LoweringError, match=r"no entry 'inv', a non-persistent buffer of stage 1"):
        load_stage_state(stages, 0, stage_module(stages, 0, "cpu"), src["plain"])
    modules = [stage_module(stages, k, "cpu") for k in range(2)]
    load_stage_state(stages, [0, 1], modules, src["full"])
    torch.testing.assert_close(_run(stages, modules, (x,), {}), model(x), rtol=0, atol=0)


# --- stage placement (the group rank of each stage), a pure function ------------------------

@given(size=st.integers(1, 8), per=st.integers(1, 4))
def test_loop_placement_is_torchs_and_balanced(size, per):
    ranks = stage_ranks(size * per, size)
    assert ranks == tuple(k % size for k in range(size * per)) == stage_ranks(size * per, size,
                                                                            "loop")
    assert all(ranks.count(r) == per for r in range(size))


@given(size=st.integers(1, 8))
def test_v_placement_turns_on_the_last_rank(size):
    ranks = stage_ranks(2 * size, size, "v")
    assert all(ranks.count(r) == 2 for r in range(size))
    assert [k for k in range(2 * size - 1) if ranks[k] == ranks[k + 1]] == [size - 1]
    assert ranks[0] == ranks[-1] == 0


@given(ranks=st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_explicit_placement_is_kept_and_checked(ranks):
    assert stage_ranks(len(ranks), 4, ranks) == tuple(ranks)
    with pytest.raises(LoweringError, match="is not 'loop', 'v' or a group rank"):
        stage_ranks(len(ranks) + 1, 4, ranks)
    with pytest.raises(LoweringError, match="is not 'loop', 'v' or a group rank"):
        stage_ranks(len(ranks), max(ranks), ranks)  # a rank outside the group
    with pytest.raises(LoweringError, match="placement 'v' needs two stages per rank"):
        stage_ranks(3, 2, "v")
