"""Balanced splits: ``split_stages(p, n=K, balance=...)``.

The cut search (``transforms.stages.balance.best_cuts``) is checked against brute force on
generated sequences (the largest part is the true minimum; among the cuts reaching it, the
traffic is the least); the split of real models is checked for its cut paths, its costs, its
numerics against eager, its errors, and its plan text.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bench import stage_cases as sc
from ir import PassError, import_ep
from ir.module_stack import NO_STACK
from ir.strategies import DETERMINISTIC_FEATURES, programs
from ir.strategies.programs import program_inputs
from ir.torch_seam import pytree
from lowering import format_stage_plan, lower, stage_module
from transforms import split_stages, transform
from transforms.stages.balance import best_cuts


def _key(prefix, cuts, traffic, k, chosen):
    """(largest part, sum |k * part - total|, traffic): what best_cuts minimises, in order."""
    bounds = [0, *(cuts[j] for j in chosen), len(prefix) - 1]
    parts = [prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds)]
    total = prefix[-1]
    return (max(parts), sum(abs(k * x - total) for x in parts), sum(traffic[j] for j in chosen))


def _brute(prefix, cuts, traffic, k):
    return min(
        _key(prefix, cuts, traffic, k, chosen)
        for chosen in itertools.combinations(range(len(cuts)), k - 1)
    )


@settings(max_examples=150, deadline=None)
@given(
    costs=st.lists(st.integers(0, 50), min_size=2, max_size=12),
    data=st.data(),
)
def test_best_cuts_is_exact(costs, data):
    """Shrinks towards short, small cost lists and few stages."""
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    positions = list(range(1, len(costs)))
    cuts = sorted(data.draw(st.sets(st.sampled_from(positions)), label="cuts"))
    traffic = data.draw(st.lists(st.integers(0, 9), min_size=len(cuts), max_size=len(cuts)))
    k = data.draw(st.integers(1, len(cuts) + 2), label="k")
    found = best_cuts(prefix, cuts, traffic, k)
    if len(cuts) < k - 1:
        assert found is None
        return
    largest, chosen = found
    assert chosen == sorted(set(chosen)) and len(chosen) == k - 1
    bounds = [0, *(cuts[j] for j in chosen), len(costs)]
    assert largest == max(prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds))
    assert _key(prefix, cuts, traffic, k, chosen) == _brute(prefix, cuts, traffic, k)


def _model(name):
    model, ep, _at, pos, kw, _tgt, _loss = sc.build(name, 2, 2)
    pos = tuple(torch.tensor_split(t, 2)[0] for t in pos)  # one micro-batch, as exported
    kw = {k: torch.tensor_split(v, 2)[0] for k, v in kw.items()}
    return model, ep, import_ep(ep), pos, kw


def test_balanced_mlp_by_params():
    _m, _ep, p, *_ = _model("mlp")
    stages = split_stages(p, n=4, balance="params")
    assert stages.at == ("layers.1", "layers.2", "layers.3")
    assert stages.balance == "params"
    assert stages.params == (336, 336, 336, 504)  # float64 6x6+6 per block; the last + out
    # a block: linear on (2, 6) -> 2 * 12 * 6 multiply-adds, tanh 12; out: 2 * 6 * 6
    assert stages.flops == (156, 156, 156, 228)
    assert len(stages) == 4


class _ConvAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=(3, 2))
        self.proj = torch.nn.Linear(5, 8)

    def forward(self, img, q, k, v):
        y = self.conv(img)  # (2, 4, 6, 7): 2 * 336 outputs * (3 * 3 * 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # q (2, 2, 4, 8), k len 6
        b = torch.bmm(q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2))  # (4, 4, 6), K = 8
        return y.sum() + a.sum() + self.proj(v[..., :5]).sum() + b.sum()


def test_flop_rules():
    from transforms.stages.balance import node_flops

    args = (torch.randn(2, 3, 8, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 6, 8),
            torch.randn(2, 2, 6, 8))
    p = import_ep(torch.export.export(_ConvAttention(), args))
    graph = p.root_module.graph
    vals = {nd.name: nd.meta.get("val") for nd in graph.nodes}
    found = {str(nd.target): node_flops(nd, vals) for nd in graph.nodes
             if nd.op == "call_function"}
    assert found["aten.conv2d.default"] == 2 * (2 * 4 * 6 * 7) * (3 * 3 * 2)
    assert found["aten.scaled_dot_product_attention.default"] == 4 * (2 * 2 * 4 * 8) * 6
    assert found["aten.bmm.default"] == 2 * (4 * 4 * 6) * 8
    assert found["aten.linear.default"] == 2 * (2 * 2 * 6 * 8) * 5
    assert found["aten.sum.default"] == 1  # other ops: their output elements


def test_balanced_tied_lm_counts_the_tied_copy():
    """The embedding and the lm head hold one tied tensor, held by two stages: the balance
    charges it to both, so the cut is where the held bytes are balanced."""
    _m, _ep, p, *_ = _model("tied_lm")
    stages = split_stages(p, n=2, balance="params")
    assert stages.at == ("layers.2",)
    assert stages.params == (1296, 1392)
    flops = split_stages(p, n=3, balance="flops")
    assert flops.at == ("layers.2", "head")
    assert max(flops.flops) <= min(
        max(split_stages(p, at=list(at)).flops)
        for at in itertools.combinations(["layers.0", "layers.1", "layers.2", "layers.3",
                                          "norm", "head"], 2)
    )


@pytest.mark.parametrize("name", ["mlp", "tied_lm", "fan_out", "twice", "nograd_edge"])
@pytest.mark.parametrize("balance", ["params", "flops"])
def test_balanced_stages_compute_the_program(name, balance):
    _, _ep, p, pos, kw = _model(name)
    want = lower(p)(*pos, *kw.values())  # the program takes every input positionally
    for n in (2, 3):
        stages = split_stages(p, n=n, balance=balance)
        assert len(stages) == n and len(stages.at) == n - 1
        values = stages.params if balance == "params" else stages.flops
        assert sum(stages.flops) == sum(split_stages(p, n=1).flops)
        assert len(values) == n
        names = [s.name for s in p.signature.user_inputs()]
        given = dict(zip(names, (*pos, *kw.values()), strict=False))
        acts = tuple(given[nm] for nm in stages.inputs[0])
        kws = {nm: given[nm] for nm in stages.root_inputs}
        for k in range(n):
            out = stage_module(stages, k)(*acts, **kws)
            acts = out
        torch.testing.assert_close(out, want)


def test_balanced_split_of_an_outlined_program_is_the_flat_one():
    _m, _ep, p, *_ = _model("tied_lm")
    assert split_stages(transform(p), n=3).at == split_stages(p, n=3).at


def test_one_stage_is_the_whole_program():
    _m, _ep, p, pos, _kw = _model("mlp")
    stages = split_stages(p, n=1)
    assert stages.at == () and len(stages) == 1
    torch.testing.assert_close(stage_module(stages, 0)(*pos), lower(p)(*pos))


def test_bad_balance_arguments_are_pass_errors():
    _m, _ep, p, *_ = _model("mlp")
    with pytest.raises(PassError, match=r"balance='bytes' is not one of 'params', 'flops'"):
        split_stages(p, n=2, balance="bytes")
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(PassError, match=r"n=.* must be an int >= 1"):
            split_stages(p, n=bad)
    with pytest.raises(PassError, match=r"n=9 needs 8 cut points, but the program has only 4"):
        split_stages(p, n=9)
    with pytest.raises(PassError, match="not both"):
        split_stages(p, ["layers.1"], n=2)
    with pytest.raises(PassError, match="needs n="):
        split_stages(p, ["layers.1"], balance="flops")
    with pytest.raises(PassError, match="give 'at'"):
        split_stages(p)


def test_plan_shows_each_stage_share():
    _m, _ep, p, *_ = _model("mlp")
    plan = format_stage_plan(split_stages(p, n=4, balance="params"))
    assert plan.startswith(
        "4 stages balanced by params, cut at layers.1, layers.2, layers.3: largest stage 504 B "
        "(33.3%)\n"
    )
    assert "  share: 22.2% of state bytes (balanced), " in plan
    plain = format_stage_plan(split_stages(p, ["layers.2"]))
    assert "  share: 44.4% of state bytes, " in plain and "balanced" not in plain


def test_cli_auto_stages(tmp_path, capsys):
    from lowering.cli import main

    _, ep, *_ = sc.build("tied_lm", 4, 2)
    path = tmp_path / "lm.pt2"
    torch.export.save(ep, str(path))
    assert main([str(path), "--stages", "auto:3"]) == 0
    out = capsys.readouterr().out
    assert "3 stages balanced by params, cut at layers.1, norm: largest stage 1008 B" in out
    assert main([str(path), "--stages", "auto:3:flops"]) == 0
    assert "3 stages balanced by flops, cut at layers.2, head" in capsys.readouterr().out
    assert main([str(path), "--stages", "auto:x"]) == 2
    assert "write auto:K" in capsys.readouterr().err
    assert main([str(path), "--stages", "auto:30"]) == 2
    assert "n=30 needs 29 cut points" in capsys.readouterr().err


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=programs(max_modules=4, max_ops=5, max_nodes=40, features=DETERMINISTIC_FEATURES), k=st.integers(2, 3),
       balance=st.sampled_from(["params", "flops"]))
def test_balanced_split_of_generated_programs(p, k, balance):
    """A balanced split of a generated program either is refused with a ``PassError`` or gives
    ``k`` stages cut at module paths in order, whose largest cost is no more than any single
    cut's (k = 2), and whose modules in sequence compute the program."""
    try:
        stages = split_stages(p, n=k, balance=balance)
    except PassError:
        event("declined")
        return
    event("split")
    assert len(stages) == k and len(stages.at) == k - 1
    values = stages.params if balance == "params" else stages.flops
    if k == 2 and balance == "flops":
        for path in {f.path for nd in p.root_module.graph.nodes
                     for f in (nd.module_frames if nd.module_frames not in (None, NO_STACK)
                               else ())}:
            try:
                other = split_stages(p, [path])
            except PassError:
                continue
            assert max(values) <= max(other.flops)
    args, kwargs = program_inputs(p, seed=1)
    want = pytree.tree_leaves(lower(p)(*args, **kwargs))
    leaves = pytree.tree_leaves(program_inputs(p, seed=1))
    by_name = dict(zip([s.name for s in p.signature.user_inputs()], leaves, strict=True))
    acts = tuple(by_name[n] for n in stages.inputs[0])
    kw = {n: by_name[n] for n in stages.root_inputs}
    for i in range(k):
        out = stage_module(stages, i)(*acts, **kw)
        acts = tuple(out) if i < k - 1 else acts
    got = pytree.tree_leaves(out)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):  # a masked softmax of a row all -inf is nan in both
            torch.testing.assert_close(g, w, equal_nan=True)
        else:
            assert g == w


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(1000))

    def forward(self):
        self.seen.add_(1)


class _NothingCrosses(torch.nn.Module):
    """Nothing crosses a cut at ``a`` (the counter's write stays in its stage; ``x`` is an
    input): only ``b`` can begin stage 1, though a cut at ``a`` would balance better."""

    def __init__(self):
        super().__init__()
        self.count = _Counter()
        self.a = torch.nn.Linear(10, 10)
        self.b = torch.nn.Linear(10, 2)

    def forward(self, x):
        self.count()
        return self.b(self.a(x))


def test_cut_points_need_a_tensor_crossing():
    p = import_ep(torch.export.export(_NothingCrosses(), (torch.randn(3, 10),)))
    assert split_stages(p, n=2).at == ("b",)
    with pytest.raises(PassError, match=r"n=3 needs 2 cut points, but the program has only 1 "):
        split_stages(p, n=3)
