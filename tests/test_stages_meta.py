"""A model that fits on no single machine, in one process: exported on ``meta``, split, each
stage made empty on a device and filled from a ``torch.distributed.checkpoint``; and device
literals recorded at export moved by ``lower(p, device=...)`` / ``transforms.move_to_device``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, event, given, settings
from torch import nn

from bench import stage_cases as sc
from ir import UnloadedStateError, format_program, import_ep, verify
from ir.errors import PassError
from ir.strategies import DETERMINISTIC_FEATURES, programs
from ir.strategies.programs import program_inputs
from ir.torch_seam import pytree, tensor_version
from lowering import lower, merge_stage_state_dicts, stage_module
from transforms import move_to_device, split_stages


def _meta_export(factory, args):
    with torch.device("meta"):
        model = factory().double()
    meta_args = tuple(a.to("meta") for a in args)
    return torch.export.export(model, meta_args)


def _tied_lm_inputs():
    torch.manual_seed(1)
    return torch.randint(0, 13, (2, 5)), (torch.rand(2, 5) > 0.3).double()


# --- meta exports: aliasing ---------------------------------------------------------------------


def test_meta_export_aliases_only_tied_weights():
    ep = _meta_export(sc.TiedLM, _tied_lm_inputs())
    p = import_ep(ep)
    keys = {f: p.slot(f).tensor for f in p.state_order}
    assert keys["head.weight"] == keys["emb.weight"]
    others = [keys[f] for f in p.state_order if f != "head.weight"]
    assert len(set(others)) == len(others)  # same-shape layers stay apart
    stages = split_stages(p, at=["layers.2"])
    assert dict(stages.shared) == {"emb.weight": (0, 1), "head.weight": (0, 1)}


def test_meta_views_of_one_storage_alias():
    class Viewed(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))
            self.register_buffer("flat", self.w.detach().view(16))
            self.register_buffer("other", torch.zeros(16))

        def forward(self, x):
            return x @ self.w + self.flat.sum() + self.other.sum()

    with torch.device("meta"):
        m = Viewed()
    p = import_ep(torch.export.export(m, (torch.empty(2, 4, device="meta"),)))
    assert p.slot("other").tensor != p.slot("flat").tensor


# --- meta exports: stages filled from a checkpoint --------------------------------------------


@pytest.mark.parametrize("via", ["dcp", "load_state_dict"])
def test_meta_stages_loaded_from_a_checkpoint_equal_eager(tmp_path, via):
    torch.manual_seed(0)
    eager = sc.TiedLM().double()
    tok, mask = _tied_lm_inputs()
    ep = _meta_export(sc.TiedLM, (tok, mask))
    stages = split_stages(import_ep(ep), n=3, balance="params")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving in a single process"
        dcp.save(eager.state_dict(), checkpoint_id=str(tmp_path))
        mods = []
        for k in range(len(stages)):
            m = stage_module(stages, k, "cpu")
            assert all(t.device.type == "cpu" for t in m.state_dict().values())
            assert set(m.state_dict()) == {f for f in stages.state[k]}
            if via == "dcp":
                sd = m.state_dict()
                dcp.load(sd, checkpoint_id=str(tmp_path))
            else:
                full = eager.state_dict()
                m.load_state_dict({f: full[f] for f in m.state_dict()})
            mods.append(m)
    acts, out = (tok,), None
    for k, m in enumerate(mods):
        out = m(*acts, mask=mask)
        acts = out if k < len(mods) - 1 else acts
    want = eager(tok, mask)["logits"]
    torch.testing.assert_close(out["logits"], want, rtol=0, atol=0)
    out["logits"].sum().backward()
    want.sum().backward()
    grads = {}
    for m in mods:
        for fqn, prm in m.named_parameters():
            key = stages.source.slot(fqn).tensor
            grads[key] = grads.get(key, 0) + prm.grad
    for fqn, prm in eager.named_parameters():
        torch.testing.assert_close(grads[stages.source.slot(fqn).tensor], prm.grad)
    merged = merge_stage_state_dicts(stages, [m.state_dict() for m in mods])
    for fqn, t in eager.state_dict().items():
        assert torch.equal(merged[fqn], t), fqn


def test_unloaded_meta_stage_names_the_first_fqn():
    tok, mask = _tied_lm_inputs()
    stages = split_stages(import_ep(_meta_export(sc.TiedLM, (tok, mask))), at=["layers.2"])
    m = stage_module(stages, 1, "cpu")
    with pytest.raises(UnloadedStateError, match=r"'layers.2.lin.weight' was never loaded"):
        m(torch.randn(2, 5, 6, dtype=torch.float64), mask=mask)
    # a partial load names the first fqn still empty
    eager = sc.TiedLM().double().state_dict()
    m.load_state_dict({f: eager[f] for f in ("layers.2.lin.weight", "layers.2.lin.bias")},
                      strict=False)
    with pytest.raises(UnloadedStateError, match=r"'layers.3.lin.weight' was never loaded"):
        m(torch.randn(2, 5, 6, dtype=torch.float64), mask=mask)
    # replacing by assignment counts as loading
    m.load_state_dict({f: eager[f] for f in m.state_dict()}, strict=True, assign=True)
    m(torch.randn(2, 5, 6, dtype=torch.float64), mask=mask)
    assert not m._forward_pre_hooks  # passing once removes the check


def test_meta_program_lowered_on_cpu_never_copies_out_of_meta():
    tok, mask = _tied_lm_inputs()
    p = import_ep(_meta_export(sc.TiedLM, (tok, mask)))
    m = lower(p, device="cpu")  # no NotImplementedError: Cannot copy out of meta tensor
    assert m.get_parameter("head.weight") is m.get_parameter("emb.weight")
    assert m.get_parameter("layers.0.lin.weight") is not m.get_parameter("layers.1.lin.weight")
    assert m.get_parameter("emb.weight").requires_grad
    with pytest.raises(UnloadedStateError, match="'emb.weight'"):
        m(tok, mask)
    assert lower(p)(tok.to("meta"), mask.to("meta"))["logits"].device.type == "meta"


# --- device literals ----------------------------------------------------------------------------


class Literals(nn.Module):
    """Every factory with ``device=x.device``: export records each as ``device=cpu``."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        n = x.shape[0]
        h = self.pre(x)
        z = torch.zeros(n, 4, device=x.device) + torch.ones(4, device=x.device)
        h = h + torch.full((4,), 2.0, device=x.device) + torch.empty(4, device=x.device).fill_(1)
        y = self.lin(h + z)
        pos = torch.arange(n, device=y.device)
        t = torch.tensor([1.0, 2.0, 3.0, 4.0], device=y.device)
        e = torch.eye(4, device=y.device)
        return y @ e + pos[:, None] + t + y.new_zeros(4, device=y.device)


def _literal_program():
    torch.manual_seed(0)
    model = Literals()
    x = torch.randn(3, 4)
    return model, x, import_ep(torch.export.export(model, (x,)))


def _device_literals(p):
    found = []
    for _, mid in p.walk():
        for g in p.module(mid).graphs:
            for node in g.nodes:
                for _k, v in node.kwargs.items:
                    if isinstance(v, torch.device):
                        found.append((node.name, v.type))
    return found


def test_export_records_cpu_and_lower_moves_it_to_meta():
    model, x, p = _literal_program()
    assert {d for _, d in _device_literals(p)} == {"cpu"}
    assert len(_device_literals(p)) >= 6
    out = lower(p, device="meta")(x.to("meta"))
    assert out.device.type == "meta" and out.shape == (3, 4)
    torch.testing.assert_close(lower(p, device="cpu")(x), model(x))


def test_move_to_device_is_pure_and_moves_literals_and_state():
    _model, x, p = _literal_program()
    text = format_program(p, vals=False)
    versions = {k: tensor_version(v.value) for k, v in p.tensors.items()}
    q = move_to_device(p, "meta")
    verify(q)
    assert format_program(p, vals=False) == text
    assert {k: tensor_version(v.value) for k, v in p.tensors.items()} == versions
    assert {d for _, d in _device_literals(q)} == {"meta"}
    assert [n for n, _ in _device_literals(q)] == [n for n, _ in _device_literals(p)]
    assert all(v.value.device.type == "meta" for v in q.tensors.values())
    assert all(v.value.device.type == "cpu" for v in p.tensors.values())
    assert isinstance(q.tensor("lin.weight"), nn.Parameter) and q.tensor("lin.weight").requires_grad
    assert lower(q)(x.to("meta")).device.type == "meta"
    assert move_to_device(q, "meta") is q  # idempotent, and nothing to do is the input
    assert move_to_device(p, "cpu") is p
    assert move_to_device(p, {"cuda": "meta"}) is p  # a mapping moves only what it names
    r = move_to_device(p, {"cpu": "meta"})
    assert {d for _, d in _device_literals(r)} == {"meta"}
    with pytest.raises(PassError, match="move_to_device: device 'gpu!'"):
        move_to_device(p, "gpu!")


def test_move_to_device_keeps_ties():
    p = import_ep(torch.export.export(sc.TiedLM().double(), _tied_lm_inputs()))
    q = move_to_device(p, "meta")
    assert q.slot("head.weight").tensor == q.slot("emb.weight").tensor
    assert q.tensor("head.weight").device.type == "meta"


def test_stage_module_moves_device_literals():
    _model, x, p = _literal_program()
    stages = split_stages(p, at=["lin"])
    mods = [stage_module(stages, k, "meta") for k in range(2)]
    out = mods[1](*mods[0](x.to("meta")))
    assert out.device.type == "meta" and out.shape == (3, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lower_and_move_to_device_on_cuda():
    model, x, p = _literal_program()
    want = model(x)
    got = lower(p, device="cuda")(x.cuda())
    torch.testing.assert_close(got.cpu(), want)
    q = move_to_device(p, "cuda")
    torch.testing.assert_close(lower(q)(x.cuda()).cpu(), want)
    stages = split_stages(p, at=["lin"])
    mods = [stage_module(stages, k, "cuda") for k in range(2)]
    torch.testing.assert_close(mods[1](*mods[0](x.cuda())).cpu(), want)


def test_hf_llama_on_meta_with_non_persistent_buffers(tmp_path):
    """An unseen model: a tiny Llama (tied embedding, a non-persistent rotary buffer), built and
    exported on meta, split in 3 balanced stages, each loaded from a checkpoint that also holds
    the non-persistent buffers (``named_buffers()``): the stage chain equals eager exactly, and
    without those buffers the check names the rotary buffer."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=200, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
        use_cache=False, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(cfg).eval()
    with torch.device("meta"):
        shell = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 200, (2, 8))
    stages = split_stages(import_ep(torch.export.export(shell, (ids.to("meta"),))), n=3)
    assert set(stages.shared) == {"lm_head.weight", "model.embed_tokens.weight"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(eager.state_dict(), checkpoint_id=str(tmp_path / "plain"))
        dcp.save({**dict(eager.named_buffers()), **eager.state_dict()},
                 checkpoint_id=str(tmp_path / "full"))
        first = stage_module(stages, 0, "cpu")
        dcp.load(first.state_dict(), checkpoint_id=str(tmp_path / "plain"))
        with pytest.raises(UnloadedStateError, match="'model.rotary_emb.inv_freq'"):
            first(ids)
        mods = []
        for k in range(len(stages)):
            m = stage_module(stages, k, "cpu")
            dcp.load({**dict(m.named_buffers()), **m.state_dict()},
                     checkpoint_id=str(tmp_path / "full"))
            mods.append(m)
    acts = (ids,)
    for m in mods:
        acts = m(*acts)
    torch.testing.assert_close(acts["logits"], eager(ids).logits, rtol=0, atol=0)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=programs(max_modules=3, max_ops=5, max_nodes=30, features=DETERMINISTIC_FEATURES))
def test_move_to_device_laws(p):
    """On generated programs: pure, idempotent, ``verify`` holds, every tensor and literal on the
    target, and the moved program computes the same shapes (run on meta) as the original."""
    text = format_program(p, vals=False)
    versions = {k: tensor_version(v.value) for k, v in p.tensors.items()
                if isinstance(v.value, torch.Tensor)}
    q = move_to_device(p, "meta")
    assert format_program(p, vals=False) == text
    assert {k: tensor_version(v.value) for k, v in p.tensors.items()
            if isinstance(v.value, torch.Tensor)} == versions
    verify(q)
    assert move_to_device(q, "meta") is q
    assert all(v.value.device.type == "meta" for v in q.tensors.values()
               if isinstance(v.value, torch.Tensor))
    assert {d for _, d in _device_literals(q)} <= {"meta"}
    if not _device_literals(p) and all(
        v.value.device.type == "cpu" for v in p.tensors.values()
        if isinstance(v.value, torch.Tensor)
    ):
        assert move_to_device(p, "cpu") is p
    if not any(slot.kind in ("parameter", "buffer") for slot in p.state.values()):
        # a constant is no device probe (``.to()`` does not move it): meta inputs are refused
        event("no parameter or buffer: a lowered module refuses meta inputs")
        return
    try:
        _assert_meta_shapes_agree(p, q)
    except NotImplementedError:
        event("an op without a meta kernel")


def _assert_meta_shapes_agree(p, q):
    """``lower(q)`` (``q = move_to_device(p, "meta")``) computes, on meta inputs, the shapes
    that ``lower(p, device="meta")`` computes: the reference runs on the same device, since an
    operator's output shape may depend on the device (eval-mode ``native_batch_norm`` gives its
    saved statistics shape ``(0,)`` on CPU, ``(C,)`` elsewhere)."""
    def on_meta():
        return pytree.tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t,
                               program_inputs(p, seed=0))

    args, kwargs = on_meta()
    want = pytree.tree_leaves(lower(p, device="meta")(*args, **kwargs))
    args, kwargs = on_meta()
    got = pytree.tree_leaves(lower(q)(*args, **kwargs))
    assert [(tuple(t.shape), t.dtype) for t in got if isinstance(t, torch.Tensor)] == [
        (tuple(t.shape), t.dtype) for t in want if isinstance(t, torch.Tensor)
    ]


class _EvalStats(nn.Module):
    """Eval-mode ``native_batch_norm`` returning its saved statistics: their shape is
    ``(0,)`` on CPU and ``(2,)`` on meta."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.b = nn.Parameter(torch.zeros(2))
        self.register_buffer("rm", torch.zeros(2))
        self.register_buffer("rv", torch.ones(2))

    def forward(self, x):
        return torch.ops.aten.native_batch_norm(x, self.w, self.b, self.rm, self.rv, False, 0.1,
                                                1e-5)


def test_move_to_device_law_compares_shapes_on_the_same_device():
    """Regression (found by the opset draws): the law compared the meta run's shapes with a CPU
    run's, and an operator whose output shape depends on the device failed it though
    ``move_to_device`` was right; the reference is now ``lower(p, device="meta")``."""
    x = torch.randn(3, 2, 4)
    p = import_ep(torch.export.export(_EvalStats(), (x,)))
    on_cpu = [tuple(t.shape) for t in lower(p)(x)]
    assert on_cpu == [(3, 2, 4), (0,), (0,)]  # the device-dependent shapes the law must allow
    q = move_to_device(p, "meta")
    _assert_meta_shapes_agree(p, q)
    assert [tuple(t.shape) for t in lower(q)(x.to("meta"))] == [(3, 2, 4), (2,), (2,)]
