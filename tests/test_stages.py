"""``split_stages`` and the stage modules in one process (no process group).

Before/Expected on the IR text of a split, edges and relays, keyword inputs, shared weights,
errors, and numerics: the stage modules run in sequence equal eager (loss, every gradient by
fqn once shared copies' gradients are summed, state after an SGD step, merged state dicts).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench import stage_cases as sc
from ir import PassError, format_program, import_ep, verify
from ir.errors import InputConstraintError, LoweringError
from lowering import export_ep, lower, merge_stage_state_dicts, stage_module
from transforms import inline, split_stages, transform


def _split(name: str, n_stages: int, n_mb: int = 2):
    model, ep, at, pos, kw, tgt, loss_fn = sc.build(name, n_stages, n_mb)
    p = import_ep(ep)
    return model, ep, p, split_stages(p, at), pos, kw, tgt, loss_fn


def _names(ep):
    return list(ep.module_call_graph[0].signature.forward_arg_names)


def _run_stages(mods, stages, pos, kw, tgt, loss_fn, n_mb):
    chunks = [torch.tensor_split(t, n_mb) for t in pos]
    kchunks = {k: torch.tensor_split(v, n_mb) for k, v in kw.items()}
    tchunks = torch.tensor_split(tgt, n_mb)
    losses = []
    for i in range(n_mb):
        kwi = {k: v[i] for k, v in kchunks.items()}
        acts = tuple(c[i] for c in chunks)
        for k, m in enumerate(mods):
            out = m(*acts, **kwi)
            if k < len(mods) - 1:
                assert isinstance(out, tuple)  # autograd chains the stages in one process
                acts = out
        loss = loss_fn(out, tchunks[i])
        (loss / n_mb).backward()
        losses.append(loss.detach())
    return losses


def _summed_grads(stages, mods):
    """fqn -> gradient, shared copies summed (what sync_shared_grads computes over a group)."""
    grads: dict[str, torch.Tensor] = {}
    for k, m in enumerate(mods):
        for fqn, prm in m.named_parameters():
            g = prm.grad if prm.grad is not None else torch.zeros_like(prm)
            key = stages.source.slot(fqn).tensor
            grads[key] = grads[key] + g if key in grads else g.clone()
    found = {}
    for k, m in enumerate(mods):
        for fqn, _ in m.named_parameters():
            found[fqn] = grads[stages.source.slot(fqn).tensor]
    return found


CASES = [
    ("mlp", 2), ("mlp", 4), ("tied_lm", 2), ("tied_lm", 4), ("fan_out", 4), ("twice", 2),
    ("twice", 4), ("local_buffer", 2), ("nograd_edge", 2), ("tied_plain", 2),
]


@pytest.mark.parametrize(("name", "n_stages"), CASES)
def test_stages_in_sequence_equal_eager(name, n_stages):
    n_mb = 3
    model, ep, _p, stages, pos, kw, tgt, loss_fn = _split(name, n_stages, n_mb)
    assert len(stages) == n_stages
    for q in stages.programs:
        verify(q)
    mods = [stage_module(stages, k) for k in range(n_stages)]
    losses = _run_stages(mods, stages, pos, kw, tgt, loss_fn, n_mb)
    eager_losses = sc.eager_step(model, pos, kw, _names(ep), tgt, loss_fn, n_mb)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-12, atol=1e-12)
    grads = _summed_grads(stages, mods)
    for fqn, g in grads.items():
        assert "@" not in fqn
        torch.testing.assert_close(g, model.get_parameter(fqn).grad, rtol=1e-10, atol=1e-12)
    # one SGD step on each stage and on eager: merged state equals eager's state_dict
    for m in mods:
        with torch.no_grad():
            for fqn, prm in m.named_parameters():
                prm.sub_(0.1 * grads[fqn])
    with torch.no_grad():
        for prm in model.parameters():
            prm.sub_(0.1 * prm.grad)
    merged = merge_stage_state_dicts(stages, [m.state_dict() for m in mods])
    want = model.state_dict()
    assert list(merged) == list(want) or set(merged) == set(want)
    for fqn, t in want.items():
        torch.testing.assert_close(merged[fqn], t, rtol=1e-10, atol=1e-12)


def test_split_is_pure_and_deterministic():
    _model, _ep, p, stages, *_ = _split("tied_lm", 2)
    text = format_program(p, vals=False)
    again = split_stages(p, stages.at)
    assert format_program(p, vals=False) == text
    assert [format_program(q, vals=False) for q in again.programs] == [
        format_program(q, vals=False) for q in stages.programs
    ]
    assert again.edges == stages.edges and again.shared == stages.shared


def test_tied_lm_structure():
    _, _, _p, stages, *_ = _split("tied_lm", 2)
    assert stages.inputs == (("tok",), ("tanh_1",))
    assert stages.root_inputs == ("mask",)
    assert [(e.name, e.src, e.dst) for e in stages.edges] == [("tanh_1", 0, 1)]
    assert dict(stages.shared) == {"emb.weight": (0, 1), "head.weight": (0, 1)}
    assert stages.state[0] == (
        "emb.weight", "layers.0.lin.weight", "layers.0.lin.bias",
        "layers.1.lin.weight", "layers.1.lin.bias",
    )
    assert "head.weight" in stages.state[1] and "emb.weight" not in stages.state[1]
    assert stages.modules == (
        ("emb", "layers.0", "layers.0.lin", "layers.1", "layers.1.lin"),
        ("layers.2", "layers.2.lin", "layers.3", "layers.3.lin", "norm", "head"),
    )


EXPECTED_LAST_STAGE = """\
program:
  inputs:
    %tanh_1: user_input
    %mask: user_input
  outputs:
    %mul: user_output
  state:
    layers.2.lin.weight: parameter <Parameter (6, 6) torch.float64> requires_grad
    layers.2.lin.bias: parameter <Parameter (6,) torch.float64> requires_grad
    layers.3.lin.weight: parameter <Parameter (6, 6) torch.float64> requires_grad
    layers.3.lin.bias: parameter <Parameter (6,) torch.float64> requires_grad
    norm.weight: parameter <Parameter (6,) torch.float64> requires_grad
    norm.bias: parameter <Parameter (6,) torch.float64> requires_grad
    head.weight: parameter <Parameter (13, 6) torch.float64> = emb.weight requires_grad
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [leaf], ['mask'])])
      out_spec: tree(dict, [leaf], ['logits'])
      forward_arg_names: ('tanh_1', 'mask')
  call order: ('', 'layers', 'layers.2', 'layers.2.lin', 'layers.3', 'layers.3.lin', 'norm', 'head')
  module <root>: bench.stage_cases.TiedLM [module] id=''
    graph 0:
      %tanh_1 = placeholder
      %mask = placeholder
      %tanh_2 = call_module[layers.2](%tanh_1)
      %tanh_3 = call_module[layers.3](%tanh_2)
      %layer_norm = call_module[norm](%tanh_3)
      %linear_4 = call_module[head](%layer_norm)
      %unsqueeze = call_function[aten.unsqueeze.default](%mask, 2)
      %mul = call_function[aten.mul.Tensor](%linear_4, %unsqueeze)
      return (%mul,)
"""


def test_last_stage_program_text():
    """Before: the flat tied LM; Expected: the last stage reads the tied weight under the
    head's own fqn, takes the edge positionally and the mask by keyword, returns the dict."""
    _, _, _p, stages, *_ = _split("tied_lm", 2)
    text = format_program(stages.programs[1], vals=False)
    assert text.startswith(EXPECTED_LAST_STAGE), text[:2000]
    assert "module head: torch.nn.modules.linear.Linear" in text
    assert "module emb:" not in text


def test_fan_out_is_relayed():
    _, _, _p, stages, *_ = _split("fan_out", 4)
    h0 = stages.edges[0].name
    relays = [(e.src, e.origin) for e in stages.edges if e.name == h0]
    assert relays == [(0, 0), (1, 0), (2, 0)]
    assert all(h0 in stages.inputs[k] for k in (1, 2, 3))


def test_twice_keeps_original_fqns():
    _, _, _p, stages, *_ = _split("twice", 2)
    m = stage_module(stages, 0)
    assert set(m.state_dict()) == {"blk.lin.weight", "blk.lin.bias", "layers.0.lin.weight",
                                   "layers.0.lin.bias"}


def test_outlined_program_is_inlined_first():
    _model, _ep, p, stages, pos, _kw, _tgt, _loss_fn = _split("mlp", 2)
    again = split_stages(transform(p), stages.at)
    assert again.edges == stages.edges and again.state == stages.state
    x = torch.tensor_split(pos[0], 2)[0]
    out = stage_module(again, 1)(*stage_module(again, 0)(x))
    torch.testing.assert_close(out, lower(p)(x))


def test_export_ep_per_stage():
    model, _ep, _p, stages, pos, kw, _tgt, _loss_fn = _split("tied_lm", 2)
    eps = [export_ep(q) for q in stages.programs]
    tok, mask = torch.tensor_split(pos[0], 2)[0], torch.tensor_split(kw["mask"], 2)[0]
    h = eps[0].module()(tok, mask=mask)
    out = eps[1].module()(*h, mask=mask)
    torch.testing.assert_close(out["logits"], model(tok, mask)["logits"])


def test_wrong_micro_batch_is_a_purefx_error():
    _, _, _p, stages, pos, *_ = _split("mlp", 2)
    with pytest.raises(InputConstraintError):
        stage_module(stages, 0)(pos[0])  # the whole batch, not one micro-batch


def test_unknown_path_did_you_mean():
    _, _, p, *_ = _split("mlp", 2)
    with pytest.raises(PassError, match=r"'layer.2' is not a module path.*did you mean 'layers.2'"):
        split_stages(p, ["layer.2"])
    with pytest.raises(PassError, match="twice"):
        split_stages(p, ["layers.1", "layers.1"])
    with pytest.raises(PassError, match="module order"):
        split_stages(p, ["layers.2", "layers.1"])
    with pytest.raises(PassError, match="at least one"):
        split_stages(p, [])


class _Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        y = self.a(x) + self.count
        z = self.b(y)
        self.count.add_(1)
        return z


def test_buffer_written_in_one_stage_read_in_another():
    ep = torch.export.export(_Shared(), (torch.randn(2, 3),))
    with pytest.raises(PassError, match=r"buffer 'count' is written in stage\(s\) \[1\]"):
        split_stages(import_ep(ep), ["b"])


def test_merge_errors():
    _, _, _p, stages, *_ = _split("mlp", 2)
    with pytest.raises(LoweringError, match="2 stages but 1"):
        merge_stage_state_dicts(stages, [{}])
    with pytest.raises(LoweringError, match="no stage's state dict holds"):
        merge_stage_state_dicts(stages, [{}, {}])
    with pytest.raises(LoweringError):
        stage_module(stages, 5)


def test_inline_of_stage_runs_like_stage():
    _, _, _p, stages, pos, *_ = _split("mlp", 2)
    x = torch.tensor_split(pos[0], 2)[0]
    (h,) = lower(inline(stages.programs[0]))(x)
    torch.testing.assert_close(h, stage_module(stages, 0)(x)[0])


def test_cli_prints_a_stage_plan(tmp_path, capsys):
    from lowering.cli import main

    _model, ep, *_ = sc.build("tied_lm", 4, 2)
    path = tmp_path / "lm.pt2"
    torch.export.save(ep, str(path))
    assert main([str(path), "--stages", "layers.1,layers.3"]) == 0
    out = capsys.readouterr().out
    assert "stage 1 (begins at layers.1):" in out
    assert "modules: layers.3, layers.3.lin, norm, head" in out
    assert "shared: head.weight (also in stage 0)" in out
    assert "sends to stage 1: tanh (2, 5, 6) float64" in out
    assert "keyword inputs: mask" in out
    assert main([str(path), "--stages", "layer.1"]) == 2
    assert "did you mean 'layers.1'" in capsys.readouterr().err


def test_edges_say_which_may_carry_gradients():
    """Floating edges may carry a gradient (decided at run time, not from export-time
    ``requires_grad`` or ``detach``); integer edges never do."""
    _, _, _p, stages, *_ = _split("nograd_edge", 2)
    assert [(e.name, e.grad) for e in stages.edges] == [
        ("tanh", True), ("mean", True), ("argmax", False)
    ]


def test_buffer_updated_in_place_in_one_stage_read_in_the_next():
    """The in-place result of a buffer update is the buffer: reading it in another stage is
    reading the buffer there."""
    _model, ep, *_ = sc.build("cross_buffer", 2, 2)
    with pytest.raises(
        PassError, match=r"buffer 'stats.running' is written in stage\(s\) \[0\] and read or "
        r"written in stage\(s\) \[0, 1\]"
    ):
        split_stages(import_ep(ep), ["layers.1"])


class _Overwrite(nn.Module):
    """A buffer only written (never read) in the last stage."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.register_buffer("last", torch.zeros(2, 3))

    def forward(self, x):
        z = self.b(self.a(x))
        self.last.copy_(z.detach())
        return z


def test_buffer_only_written_is_held_by_its_stage():
    model = _Overwrite()
    x = torch.randn(2, 3)
    stages = split_stages(import_ep(torch.export.export(model, (x,))), ["b"])
    assert "last" in stages.state[1] and "last" not in stages.state[0]
    m0, m1 = stage_module(stages, 0), stage_module(stages, 1)
    out = m1(*m0(x))
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(m1.get_buffer("last"), model.last)


def test_plan_names_relays():
    from lowering import format_stage_plan

    _, _, _p, stages, *_ = _split("fan_out", 4)
    plan = format_stage_plan(stages)
    assert "sends to stage 1: tanh (2, 6) float64\n" in plan
    assert "sends to stage 2: tanh (2, 6) float64 [relay from stage 0], tanh_1 (2, 6)" in plan
    assert "sends to stage 3: tanh (2, 6) float64 [relay from stage 0], add (2, 6)" in plan


def test_stage_modules_never_write_the_program_tensors():
    from ir.torch_seam import tensor_version

    _model, ep, p, stages, pos, kw, tgt, loss_fn = _split("local_buffer", 2)
    versions = {k: tensor_version(v.value) for k, v in p.tensors.items()}
    ep_versions = {k: tensor_version(v) for k, v in ep.state_dict.items()}
    mods = [stage_module(stages, k) for k in range(2)]
    _run_stages(mods, stages, pos, kw, tgt, loss_fn, 2)  # updates the stage's own buffer
    assert {k: tensor_version(v.value) for k, v in p.tensors.items()} == versions
    assert {k: tensor_version(v) for k, v in ep.state_dict.items()} == ep_versions
    assert not torch.equal(mods[0].get_buffer("running"), p.tensor("running"))
