"""Balanced splits: ``split_stages(p, n=K, balance=...)``.

The cut search (``transforms.stage_balance.best_cuts``) is checked against brute force on
generated sequences (the largest part is the true minimum; among the cuts reaching it, the
traffic is the least); the split of real models is checked for its cut paths, its costs, its
numerics against eager, its errors, and its plan text.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import PassError, import_ep
from lowering import format_stage_plan, lower, stage_module
from tests import stage_cases as sc
from transforms import split_stages, transform
from transforms.stage_balance import best_cuts


def _brute(prefix, cuts, traffic, k):
    best = None
    for chosen in itertools.combinations(range(len(cuts)), k - 1):
        bounds = [0, *(cuts[j] for j in chosen), len(prefix) - 1]
        largest = max(prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds))
        key = (largest, sum(traffic[j] for j in chosen))
        best = key if best is None or key < best else best
    return best


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
    assert (largest, sum(traffic[j] for j in chosen)) == _brute(prefix, cuts, traffic, k)


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
    assert len(stages) == 4


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
