"""Rules written once (issue 42): hyperparameters and optional tensors bound from each match,
the search hooks ``matches`` / ``apply_match``, and ``program_key`` by content.

- one ``CONV_BN`` folds every eval conv + batch norm (stride, padding, dilation, groups, with
  and without bias): Before/Expected on the IR text, numerics against eager;
- a small CNN (4 of 4 pairs) and transformers' ``ResNetModel`` (16 of 16; before: 0 of each);
- ``check_rule`` draws hyperparameter values: a rule right only at stride 1 is refused;
- ``matches``/``apply_match`` round trip equals ``rewrite``; a stale or foreign match is a
  ``PassError``; the same fold run twice gives equal ``program_key``s.
"""

from __future__ import annotations

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.conv_models import CNN as _CNN
from bench.conv_models import batch_norms as _batch_norms
from bench.conv_models import conv_bn as _conv_bn
from bench.conv_models import program as _program
from bench.conv_models import randomize_bn as _randomize_bn
from bench.conv_models import resnet_model
from ir import PassError, format_graph, import_ep, program_key
from lowering import lower
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import (
    Rule,
    apply_match,
    apply_rules,
    check_rule,
    hyper,
    matches,
    optional,
)
from transforms.rewrite_rules import CONV_BN


def _compute(graph) -> str:
    return "\n".join(line for line in format_graph(graph).splitlines()
                     if "placeholder" not in line)


_FOLD = """\
%add = call_function[aten.add.Tensor](%b_1_running_var, 1e-05)
%rsqrt = call_function[aten.rsqrt.default](%add)
%mul = call_function[aten.mul.Tensor](%p_1_weight, %rsqrt)
"""

CASES = {
    # conv kwargs: (Before, Expected) compute lines
    "stride2_pad1_no_bias": (
        {"stride": 2, "padding": 1, "bias": False},
        """\
%conv2d = call_function[aten.conv2d.default](%input, %p_0_weight, None, [2, 2], [1, 1])
%batch_norm = call_function[aten.batch_norm.default](%conv2d, %p_1_weight, %p_1_bias, %b_1_running_mean, %b_1_running_var, False, 0.1, 1e-05, False)
return (%batch_norm,)""",
        _FOLD + """\
%mul_1 = call_function[aten.mul.Tensor](%b_1_running_mean, %mul)
%sub = call_function[aten.sub.Tensor](%p_1_bias, %mul_1)
%reshape = call_function[aten.reshape.default](%mul, [-1, 1, 1, 1])
%mul_2 = call_function[aten.mul.Tensor](%p_0_weight, %reshape)
%batch_norm = call_function[aten.conv2d.default](%input, %mul_2, %sub, [2, 2], [1, 1])
return (%batch_norm,)""",
    ),
    "dilation2_groups2_bias": (
        {"padding": 2, "dilation": 2, "groups": 2},
        """\
%conv2d = call_function[aten.conv2d.default](%input, %p_0_weight, %p_0_bias, [1, 1], [2, 2], [2, 2], 2)
%batch_norm = call_function[aten.batch_norm.default](%conv2d, %p_1_weight, %p_1_bias, %b_1_running_mean, %b_1_running_var, False, 0.1, 1e-05, False)
return (%batch_norm,)""",
        _FOLD + """\
%sub = call_function[aten.sub.Tensor](%p_0_bias, %b_1_running_mean)
%mul_1 = call_function[aten.mul.Tensor](%sub, %mul)
%add_1 = call_function[aten.add.Tensor](%mul_1, %p_1_bias)
%reshape = call_function[aten.reshape.default](%mul, [-1, 1, 1, 1])
%mul_2 = call_function[aten.mul.Tensor](%p_0_weight, %reshape)
%batch_norm = call_function[aten.conv2d.default](%input, %mul_2, %add_1, [1, 1], [2, 2], [2, 2], 2)
return (%batch_norm,)""",
    ),
    "nonsquare_stride_padding": (
        {"stride": (1, 2), "padding": (0, 1)},
        """\
%conv2d = call_function[aten.conv2d.default](%input, %p_0_weight, %p_0_bias, [1, 2], [0, 1])
%batch_norm = call_function[aten.batch_norm.default](%conv2d, %p_1_weight, %p_1_bias, %b_1_running_mean, %b_1_running_var, False, 0.1, 1e-05, False)
return (%batch_norm,)""",
        _FOLD + """\
%sub = call_function[aten.sub.Tensor](%p_0_bias, %b_1_running_mean)
%mul_1 = call_function[aten.mul.Tensor](%sub, %mul)
%add_1 = call_function[aten.add.Tensor](%mul_1, %p_1_bias)
%reshape = call_function[aten.reshape.default](%mul, [-1, 1, 1, 1])
%mul_2 = call_function[aten.mul.Tensor](%p_0_weight, %reshape)
%batch_norm = call_function[aten.conv2d.default](%input, %mul_2, %add_1, [1, 2], [0, 1])
return (%batch_norm,)""",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_conv_bn_rule_folds_every_hyperparameter_combination(case):
    conv, before, expected = CASES[case]
    model = _conv_bn(**conv)
    x = torch.randn(2, 4, 9, 9)
    p = _program(model, x)
    assert _compute(p.root_module.graph) == before
    q, report = apply_rules(p, [CONV_BN])
    assert report.counts == {"conv_bn": 1}
    assert _compute(q.root_module.graph) == expected
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_small_cnn_has_every_pair_folded():
    """Before (main at 57cf58c): 0 of 4."""
    model = _CNN().eval()
    _randomize_bn(model)
    x = torch.randn(2, 3, 16, 16)
    p = _program(model, x)
    q, report = apply_rules(p, [CONV_BN])
    assert report.counts == {"conv_bn": 4}
    assert _batch_norms(q) == 0
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)


def test_resnet_model_has_every_pair_folded():
    """transformers' ResNetModel from a small config (no download): 16 conv + bn pairs, 16
    folded (before, main at 57cf58c: 0)."""
    pytest.importorskip("transformers")
    model = resnet_model()
    x = torch.randn(2, 3, 32, 32)
    p = _program(model, x)
    pairs = _batch_norms(p)
    q, report = apply_rules(p, [CONV_BN])
    assert pairs == 16 and report.counts == {"conv_bn": pairs}
    assert _batch_norms(q) == 0
    with torch.no_grad():
        want = model(x).last_hidden_state
        got = lower(q)(x)
    got = got.last_hidden_state if hasattr(got, "last_hidden_state") else got[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# --- declaring hyperparameters -------------------------------------------------------------------


def _strided(x, w, stride):
    return torch.relu(F.conv2d(x, w, None, stride))


def _first_rows(x, w, stride):
    """Right only at stride 1: the dense convolution's first rows, not every stride-th."""
    nh = (x.shape[-2] - w.shape[-2]) // stride[0] + 1
    nw = (x.shape[-1] - w.shape[-1]) // stride[1] + 1
    return torch.clamp_min(F.conv2d(x, w)[..., :nh, :nw], 0.0)


_STRIDED = (torch.randn(1, 2, 7, 7), torch.randn(3, 2, 3, 3))


def test_check_rule_refuses_a_rule_right_only_at_its_example_stride():
    wrong = Rule(_strided, _first_rows, (*_STRIDED, hyper((1, 1))), name="first_rows",
                 specials=False)
    with pytest.raises(LawViolation, match="values differ"):
        check_rule(wrong)


def test_a_hyperparameter_binds_where_a_default_of_the_same_value_stays_literal():
    """The example stride (1, 1) equals conv2d's default dilation [1, 1]: a second trace at
    another stride tells the stride apart, so a stride-2 conv (dilation 1) matches and a
    dilated one does not."""
    rule = Rule(_strided, lambda x, w, stride: torch.relu(F.conv2d(x, w, None, stride) * 1.0),
                (*_STRIDED, hyper((1, 1))), name="strided", trusted=True)
    holes = rule.compiled("training").pattern.args["conv2d"]
    assert [type(a).__name__ for a in holes[3:5]] == ["Hole", "list"]

    class Two(nn.Module):
        def forward(self, x, w):
            return torch.relu(F.conv2d(x, w, None, 2)), torch.relu(F.conv2d(x, w, None, 1, 0, 2))

    p = import_ep(torch.export.export(Two(), _STRIDED))
    ms = matches(p, rule)
    assert [m.binding.scalars[2] for m in ms] == [(2, 2)]


def test_hyperparameters_are_declared_plainly():
    rule = Rule(_strided, _strided, (*_STRIDED, hyper([2, 2])), trusted=True)
    assert rule.example_inputs[2] == (2, 2) and rule.hypers[2].values[0] == (2, 2)
    assert rule.hypers[2].values[:3] == ((2, 2), (1, 1), (3, 3))
    with pytest.raises(PassError, match="hyper: the example must be"):
        hyper(1.5)
    with pytest.raises(PassError, match="is a tuple"):
        Rule(_strided, _strided, (*_STRIDED, (2, 2)))  # a tuple without hyper()
    with pytest.raises(PassError, match="optional: the example must be a tensor"):
        optional(3)
    unused = Rule(lambda x, k: torch.relu(x), lambda x, k: torch.relu(x) * 1.0,
                  (torch.randn(3), hyper(5)), trusted=True)
    with pytest.raises(PassError, match="appear nowhere in the pattern"):
        unused.compiled("training")


def test_an_optional_tensor_makes_one_variant_per_none():
    variants = CONV_BN.variants()
    assert len(variants) == 2 * (1 + len(CONV_BN.also_at)) and variants[0] is CONV_BN
    assert variants[1].example_inputs[2] is None and variants[1].name == CONV_BN.name
    assert CONV_BN.variants() is variants  # made once


def test_check_rule_accepts_conv_bn_over_drawn_hyperparameters():
    checked = check_rule(attrs.evolve(CONV_BN, max_examples=4))
    assert checked.rewritten > 0


# --- search hooks ----------------------------------------------------------------------------------


def test_matches_then_apply_match_equals_rewrite_on_one_match():
    model = _conv_bn(stride=2, padding=1)
    x = torch.randn(2, 4, 9, 9)
    p = _program(model, x)
    ms = matches(p, CONV_BN)
    assert len(ms) == 1
    m = ms[0]
    assert (m.rule, m.module, m.graph, m.anchor) == ("conv_bn", "", 0, "batch_norm")
    assert set(m.nodes) == {"conv2d", "batch_norm"}
    assert m.binding.scalars[9] == (2, 2) and m.binding.scalars[10] == (1, 1)
    q = apply_match(p, m)
    r, _ = apply_rules(p, [CONV_BN])
    assert format_graph(q.root_module.graph) == format_graph(r.root_module.graph)
    assert program_key(q) == program_key(r)
    assert matches(q, CONV_BN) == ()
    with pytest.raises(PassError, match="not a match in this program"):
        apply_match(q, m)  # stale: the graph it was found in is gone


def test_apply_match_refuses_a_match_of_another_program():
    x = torch.randn(2, 4, 9, 9)
    m = matches(_program(_conv_bn(stride=2), x), CONV_BN)[0]
    other = _program(_conv_bn(padding=1), x)
    with pytest.raises(PassError, match="apply_match: the match of rule 'conv_bn'"):
        apply_match(other, m)
    with pytest.raises(PassError, match="expected a Match"):
        apply_match(other, "conv_bn")


def test_program_key_is_equal_for_the_same_fold_run_twice():
    folding = attrs.evolve(CONV_BN, name="conv_bn_fold", fold_state=True)
    p = _program(_conv_bn(stride=2), torch.randn(2, 4, 9, 9))
    q1, _ = apply_rules(p, [folding])
    q2, _ = apply_rules(p, [folding])
    new = [f for f in q1.state_order if f not in p.state]
    assert new and all(q1.tensor(f) is not q2.tensor(f) for f in new)  # new tensors each run
    assert program_key(q1) == program_key(q2)
    # contents count: another value of one folded constant is another key
    changed = q2.replace(tensors=q2.tensors.set(
        q2.slot(new[0]).tensor, type(q2.tensors[q2.slot(new[0]).tensor])(
            q2.tensor(new[0]) + 1)))
    assert program_key(changed) != program_key(q1)
