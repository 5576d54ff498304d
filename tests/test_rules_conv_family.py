"""One ``CONV_BN`` for the whole family (issue 42, "rules written once"): a rule traced at more
example sets (``Rule.also_at``) stands for each trace, so the one conv + batch norm fold covers
``conv1d``, ``conv2d`` and ``conv3d`` and a string padding (``"same"`` / ``"valid"``, which
export records as another operator, ``aten.conv2d.padding``) as well as the numeric paddings,
strides, dilations, groups and biases the hyperparameters already bind.

- Before/Expected on the IR text for a ``conv1d`` and a ``"same"``-padded ``conv2d``; numerics
  against eager for every member, by ``rewrite`` and by ``saturate`` (with the in-context law);
- ``check_rule`` checks each set: a fold wrong only at one rank is refused;
- malformed ``also_at`` sets are a ``PassError`` naming the position.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.conv_models import bn_dear, program
from ir import PassError, format_graph
from lowering import lower
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, apply_rules, check_rule, hyper, optional, saturate_report
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite_rules import CONV_BN

_NORM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


def _pair(dims: int, **conv) -> nn.Module:
    """``Conv{dims}d(4, 6, 3, **conv)`` then its batch norm, running statistics drawn, eval."""
    torch.manual_seed(0)
    m = nn.Sequential(_CONV[dims](4, 6, 3, **conv), _NORM[dims](6))
    m[1].running_mean.normal_()
    m[1].running_var.uniform_(0.5, 1.5)
    m[1].weight.data.normal_()
    return m.eval()


def _input(dims: int) -> torch.Tensor:
    return torch.randn(2, 4, *(9,) * dims)


def _compute(p) -> str:
    return "\n".join(line for line in format_graph(p.root_module.graph).splitlines()
                     if "placeholder" not in line)


def _norms(p) -> int:
    return sum(1 for n in p.root_module.graph.nodes if "batch_norm" in str(n.target))


def test_also_at_makes_one_variant_per_set_and_optional_combination():
    variants = CONV_BN.variants()
    assert len(variants) == 2 * (1 + len(CONV_BN.also_at)) == 12
    assert variants[0] is CONV_BN and {v.name for v in variants} == {"conv_bn"}
    ranks = [v.example_inputs[1].dim() for v in variants]
    assert ranks == [4, 4, 3, 3, 5, 5, 3, 3, 4, 4, 5, 5]
    for v in variants[6:]:
        assert v.hypers[10].example == "same" and v.hypers[10].values == ("same", "valid")
    assert [v.example_inputs[2] is None for v in variants] == [False, True] * 6
    assert all(v.also_at == () for v in variants[1:])


CONV1D_BEFORE = """\
%conv1d = call_function[aten.conv1d.default](%input, %p_0_weight, %p_0_bias, [2])
%batch_norm = call_function[aten.batch_norm.default](%conv1d, %p_1_weight, %p_1_bias, %b_1_running_mean, %b_1_running_var, False, 0.1, 1e-05, False)
return (%batch_norm,)"""

CONV1D_EXPECTED = """\
%add = call_function[aten.add.Tensor](%b_1_running_var, 1e-05)
%rsqrt = call_function[aten.rsqrt.default](%add)
%mul = call_function[aten.mul.Tensor](%p_1_weight, %rsqrt)
%sub = call_function[aten.sub.Tensor](%p_0_bias, %b_1_running_mean)
%mul_1 = call_function[aten.mul.Tensor](%sub, %mul)
%add_1 = call_function[aten.add.Tensor](%mul_1, %p_1_bias)
%reshape = call_function[aten.reshape.default](%mul, [-1, 1, 1])
%mul_2 = call_function[aten.mul.Tensor](%p_0_weight, %reshape)
%batch_norm = call_function[aten.conv1d.default](%input, %mul_2, %add_1, [2])
return (%batch_norm,)"""

SAME_BEFORE = """\
%conv2d = call_function[aten.conv2d.padding](%input, %p_0_weight, None, [1, 1], 'same')
%batch_norm = call_function[aten.batch_norm.default](%conv2d, %p_1_weight, %p_1_bias, %b_1_running_mean, %b_1_running_var, False, 0.1, 1e-05, False)
return (%batch_norm,)"""

SAME_EXPECTED = """\
%add = call_function[aten.add.Tensor](%b_1_running_var, 1e-05)
%rsqrt = call_function[aten.rsqrt.default](%add)
%mul = call_function[aten.mul.Tensor](%p_1_weight, %rsqrt)
%mul_1 = call_function[aten.mul.Tensor](%b_1_running_mean, %mul)
%sub = call_function[aten.sub.Tensor](%p_1_bias, %mul_1)
%reshape = call_function[aten.reshape.default](%mul, [-1, 1, 1, 1])
%mul_2 = call_function[aten.mul.Tensor](%p_0_weight, %reshape)
%batch_norm = call_function[aten.conv2d.padding](%input, %mul_2, %sub, [1, 1], 'same')
return (%batch_norm,)"""


@pytest.mark.parametrize("dims, conv, before, expected", [
    (1, {"stride": 2}, CONV1D_BEFORE, CONV1D_EXPECTED),
    (2, {"padding": "same", "bias": False}, SAME_BEFORE, SAME_EXPECTED),
], ids=["conv1d", "same"])
def test_the_rule_folds_a_conv1d_and_a_same_padded_conv2d(dims, conv, before, expected):
    model, x = _pair(dims, **conv), _input(dims)
    p = program(model, x)
    assert _compute(p) == before
    q, report = apply_rules(p, [CONV_BN])
    assert report.counts == {"conv_bn": 1}
    assert _compute(q) == expected
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)


MEMBERS = {
    "conv1d_dilated_groups": (1, {"padding": 2, "dilation": 2, "groups": 2}),
    "conv1d_valid_no_bias": (1, {"padding": "valid", "bias": False}),
    "conv2d_same_dilated": (2, {"padding": "same", "dilation": 2}),
    "conv2d_valid_stride": (2, {"padding": "valid", "stride": 2}),
    "conv3d_stride_pad": (3, {"stride": 2, "padding": 1}),
    "conv3d_same_no_bias": (3, {"padding": "same", "bias": False}),
}


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_every_member_of_the_family_is_folded_by_saturate_and_sound(member):
    dims, conv = MEMBERS[member]
    model, x = _pair(dims, **conv), _input(dims)
    p = program(model, x)
    # bn_dear: with state charged the roofline keeps the batch norm (test_saturate_state)
    q, report = saturate_report(p, [CONV_BN], assume={"reassociate"}, cost=bn_dear)
    assert dict(report.rewrites) == {"conv_bn": 1} and _norms(q) == 0
    check_extracted(p, q, (x,))
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)


# --- check_rule checks each set -------------------------------------------------------------------


def _folded_wrong_at_rank_3(x, w, b, mean, var, gamma, beta, momentum, eps, stride, padding,
                            dilation, groups):
    """The fold, but a conv1d's shift forgets the batch norm's beta."""
    conv = {3: F.conv1d, 4: F.conv2d}[w.dim()]
    s = gamma * torch.rsqrt(var + eps)
    shift = (b - mean) * s + (beta if w.dim() == 4 else 0.0)
    return conv(x, w * s.reshape(-1, *(1,) * (w.dim() - 1)), shift, stride, padding,
                dilation, groups)


def _conv_bn(x, w, b, mean, var, gamma, beta, momentum, eps, stride, padding, dilation, groups):
    conv = {3: F.conv1d, 4: F.conv2d}[w.dim()]
    return F.batch_norm(conv(x, w, b, stride, padding, dilation, groups), mean, var, gamma,
                        beta, False, momentum, eps)


def _example(spatial):
    n = len(spatial)
    return (torch.randn(1, 4, *spatial), torch.randn(4, 2, *(3,) * n), torch.randn(4),
            torch.randn(4), torch.rand(4) + 0.5, torch.randn(4), torch.randn(4), 0.1, 1e-5,
            hyper((2,) * n), hyper((1,) * n), hyper((3,) * n), hyper(2))


def test_check_rule_refuses_a_fold_wrong_only_at_another_rank():
    right_at_2d = Rule(_conv_bn, _folded_wrong_at_rank_3, _example((10, 10)), specials=False,
                       max_examples=8, name="wrong_at_1d")
    assert check_rule(right_at_2d).rewritten > 0  # its own rank alone passes
    wrong = Rule(_conv_bn, _folded_wrong_at_rank_3, _example((10, 10)), specials=False,
                 max_examples=8, name="wrong_at_1d", also_at=(_example((10,)),))
    with pytest.raises(LawViolation, match="wrong_at_1d"):
        check_rule(wrong)


def test_malformed_also_at_sets_are_refused_by_position():
    ex = _example((10, 10))
    with pytest.raises(PassError, match=r"also_at\[0\] has 12 arguments"):
        Rule(_conv_bn, _conv_bn, ex, also_at=(ex[:-1],))
    with pytest.raises(PassError, match=r"also_at\[0\]\[7\] is a hyper"):
        Rule(_conv_bn, _conv_bn, ex, also_at=((*ex[:7], hyper(3), *ex[8:]),))
    with pytest.raises(PassError, match=r"also_at\[0\]\[2\] must be a plain tensor"):
        Rule(_conv_bn, _conv_bn, (*ex[:2], optional(ex[2]), *ex[3:]),
             also_at=((*ex[:2], optional(ex[2]), *ex[3:]),))
    with pytest.raises(PassError, match="also_at must be a tuple"):
        Rule(_conv_bn, _conv_bn, ex, also_at=5)


def test_efficientnet_has_every_pair_folded():
    """transformers' ``EfficientNetModel`` (small config, no download) pads its convolutions
    with ``"same"`` / ``"valid"``: all 22 conv + batch norm pairs are ``aten.conv2d.padding``,
    so a rule traced with numeric padding folded 0 of them; ``also_at`` folds 22."""
    transformers = pytest.importorskip("transformers")
    config = transformers.EfficientNetConfig(image_size=32, width_coefficient=0.25,
                                             depth_coefficient=0.2, hidden_dim=320,
                                             num_hidden_layers=4)
    torch.manual_seed(0)
    model = transformers.EfficientNetModel(config).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, 32, 32)
    p = program(model, x)
    convs = {n.name: n.target for n in p.root_module.graph.nodes}
    sources = [convs[n.args[0].name] for n in p.root_module.graph.nodes
               if "batch_norm" in str(n.target)]
    assert len(sources) == 22 and set(sources) == {torch.ops.aten.conv2d.padding}
    q, report = apply_rules(p, [CONV_BN])
    assert report.counts == {"conv_bn": 22} and _norms(q) == 0
    with torch.no_grad():
        got = lower(q)(x)
        want = model(x).last_hidden_state
    got = got.last_hidden_state if hasattr(got, "last_hidden_state") else got[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
