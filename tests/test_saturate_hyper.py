"""``saturate`` with rules written once: hyperparameter holes and optional tensor arguments in
the e-matcher (``transforms.rewrite.ematch``).

- one ``CONV_BN`` folds each conv + bn of ``test_rewrite_hyper``'s cases (stride, padding,
  dilation, groups, ``bias=None``) under ``saturate``: Before/Expected on the IR text (the
  greedy engine's Expected, the conv named as the e-graph's builder names it), numerics
  against eager, the in-context law (``check_extracted``);
- the small CNN: 4 of 4 pairs folded by the extraction itself (before: 0, the holes did not
  match); transformers' ``ResNetModel``: every pair folded, sound;
- the re-check of a loose match (``ematch.exact``) is needed: a pattern whose hole also covers
  a default literal matches a dilated convolution, and ``exact`` refuses it;
- the cost is per call: what is computed from unwritten state alone is charged at every call
  unless the state is frozen (``frozen_state=True``, then folded into constants). The folds
  here are searched under ``_BN_DEAR`` (a batch norm dearer than the arithmetic that folds it,
  a model under which folding by hand pays when charged), so the Expected texts show the
  folded arithmetic; ``tests/test_saturate_state.py`` has the roofline, charged and frozen;
- the in-context law on generated conv + bn (stride, padding, dilation, groups, bias drawn);
- ``bench.search.run_conv_bn`` runs (no timing asserted).
"""

from __future__ import annotations

import io

import attrs
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from bench.conv_models import (
    CNN,
    batch_norms,
    bn_dear,
    conv_bn,
    program,
    randomize_bn,
    resnet_model,
)
from ir import format_graph, import_ep
from lowering import lower
from transforms.rewrite import Rule, hyper, saturate, saturate_report
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.cost import invariant_values, program_cost
from transforms.rewrite.egraph import LEAF, from_graph
from transforms.rewrite.ematch import ematch, exact
from transforms.rewrite.match import Hole, with_holes
from transforms.rewrite_rules import CONV_BN

try:
    from .test_rewrite_hyper import CASES
except ImportError:  # run as a top-level module
    from test_rewrite_hyper import CASES


def _compute(p) -> str:
    return "\n".join(line for line in format_graph(p.root_module.graph).splitlines()
                     if "placeholder" not in line)


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_conv_bn_rule_folds_every_hyperparameter_combination_under_saturate(case):
    conv, before, expected = CASES[case]
    model = conv_bn(**conv)
    x = torch.randn(2, 4, 9, 9)
    p = program(model, x)
    assert _compute(p) == before
    q, report = saturate_report(p, [CONV_BN], assume={"reassociate"}, cost=bn_dear)
    assert report.chosen == "saturate" and dict(report.rewrites) == {"conv_bn": 1}
    assert _compute(q) == expected.replace("%batch_norm =", "%conv2d_1 =").replace(
        "(%batch_norm,)", "(%conv2d_1,)")
    check_extracted(p, q, (x,))
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_small_cnn_has_every_pair_folded_by_the_extraction():
    """Before (the e-matcher without holes): 0 of 4, ``p`` returned itself."""
    model = CNN().eval()
    randomize_bn(model)
    x = torch.randn(2, 3, 16, 16)
    p = program(model, x)
    q, report = saturate_report(p, [CONV_BN], assume={"reassociate"}, cost=bn_dear)
    assert report.chosen == "saturate" and dict(report.rewrites) == {"conv_bn": 4}
    assert batch_norms(p) == 4 and batch_norms(q) == 0
    assert report.cost_after < report.cost_before
    check_extracted(p, q, (x,))
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)


def test_resnet_model_has_every_pair_folded():
    """16 conv + bn pairs; the residual adds write the bn outputs in place, fresh
    intermediates that the e-graph sees functionally (``transforms.rewrite.versions``), so
    the extraction itself folds all 16 (before: 8, and greedy's program was kept;
    ``test_saturate_versions``)."""
    pytest.importorskip("transformers")
    model = resnet_model()
    x = torch.randn(2, 3, 32, 32)
    p = program(model, x)
    q, report = saturate_report(p, [CONV_BN], assume={"reassociate"}, cost=bn_dear)
    assert batch_norms(p) == 16 and batch_norms(q) == 0
    assert report.cost_after <= report.greedy_cost
    assert report.sizes[0][-1] > report.sizes[0][0]  # the e-graph folded some itself
    check_extracted(p, q, (x,))
    with torch.no_grad():
        want = model(x).last_hidden_state
        got = lower(q)(x)
    got = got.last_hidden_state if hasattr(got, "last_hidden_state") else got[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# --- the re-check of a loose match --------------------------------------------------------------


def _strided(x, w, stride):
    return torch.relu(F.conv2d(x, w, None, stride))


def _clamped(x, w, stride):
    return torch.clamp_min(F.conv2d(x, w, None, stride), 0.0)


_STRIDED = (torch.randn(1, 2, 7, 7), torch.randn(3, 2, 3, 3))
STRIDED = Rule(_strided, _clamped, (*_STRIDED, hyper((1, 1))), name="strided", trusted=True)


class _Two(nn.Module):
    def forward(self, x, w):
        return (torch.relu(F.conv2d(x, w, None, 2, 0, 2)),  # stride 2, dilation 2
                torch.relu(F.conv2d(x, w, None, 2)))  # stride 2, dilation 1


def _cheap_clamp(target, args, kwargs, val):
    return 1.0 if "clamp" in str(target) else 10.0


def test_saturate_binds_a_hole_only_where_the_pattern_traced_there_matches():
    p = import_ep(torch.export.export(_Two(), _STRIDED))
    q, report = saturate_report(p, [STRIDED], cost=_cheap_clamp)
    assert dict(report.rewrites) == {"strided": 1}
    body = _compute(q)
    assert "aten.clamp_min" in body and "aten.relu" in body  # the dilated conv is kept
    check_extracted(p, q, _STRIDED)


def test_exact_refuses_a_loose_match_the_traced_pattern_does_not_make():
    """A pattern whose stride hole also covers the default dilation ``[1, 1]`` (no second trace
    to tell them apart) matches the stride-2, dilation-2 conv, binding ``(2, 2)``; traced at
    stride ``(2, 2)`` the pattern has dilation ``[1, 1]``: ``exact`` refuses that match. The
    rule's own pattern (dilation a literal) matches the stride-2, dilation-1 conv, loosely, and
    ``exact`` keeps it."""
    compiled = STRIDED.compiled("training")
    args = dict(compiled.pattern.args)
    args["conv2d"] = tuple([1, 1] if type(a) is Hole else a for a in args["conv2d"])
    raw = attrs.evolve(compiled.pattern, args=args, holes={})
    loose = with_holes(raw, {2: (1, 1)}, "test")  # every [1, 1]: stride and dilation
    assert [type(a).__name__ for a in loose.args["conv2d"][3:6]] == ["Hole", "list", "Hole"]
    p = import_ep(torch.export.export(_Two(), _STRIDED))
    geg = from_graph(p, p.root, p.root_module.graph)
    by_op: dict = {}
    for c, nodes in geg.eg.classes.items():
        for n in nodes:
            if n.op != LEAF:
                by_op.setdefault(n.op, []).append((n, c))
    root = {geg.eg.find(geg.class_of[n]): n for n in ("relu", "relu_1")}
    wrong = ematch(geg.eg, loose, by_op, 100)
    assert [(root[m.root], m.scalars, m.loose) for m in wrong] == [("relu", {2: (2, 2)}, True)]
    assert not exact(geg.eg, STRIDED, attrs.evolve(compiled, pattern=loose), wrong[0])
    right = ematch(geg.eg, compiled.pattern, by_op, 100)
    assert [(root[m.root], m.scalars, m.loose) for m in right] == [("relu_1", {2: (2, 2)}, True)]
    assert exact(geg.eg, STRIDED, compiled, right[0])


# --- the cost is per call ---------------------------------------------------------------------------


def test_what_state_alone_computes_costs_nothing_per_call():
    model = conv_bn(stride=2, padding=1, bias=False)
    p = program(model, torch.randn(2, 4, 9, 9))
    q = saturate(p, [CONV_BN], assume={"reassociate"}, cost=bn_dear)
    once = invariant_values(q, q.root, q.root_module.graph)
    assert {"add", "rsqrt", "mul", "reshape", "mul_2", "p_0_weight"} <= once
    assert "conv2d_1" not in once and "input" not in once
    conv = next(n for n in q.root_module.graph.nodes if n.name == "conv2d_1")
    ones = lambda t, a, k, v: 1.0
    alone = program_cost(q, cost=ones, frozen_state=True)
    assert alone == 1.0 and conv.target is torch.ops.aten.conv2d.default  # the conv only
    assert program_cost(q, cost=ones) == len(once - {n.name for n in q.root_module.graph.nodes
                                                     if n.op == "placeholder"}) + 1
    frozen = saturate(p, [CONV_BN], assume={"reassociate"}, frozen_state=True)
    assert program_cost(frozen, cost=ones) == 1.0  # the fold's arithmetic became constants


# --- the in-context law on generated convolutions ---------------------------------------------------


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(stride=st.sampled_from([1, 2, (1, 2)]), padding=st.sampled_from([0, 1, (2, 0)]),
       dilation=st.sampled_from([1, 2]), groups=st.sampled_from([1, 2]), bias=st.booleans())
def test_law_every_generated_conv_bn_is_folded_and_sound(stride, padding, dilation, groups,
                                                         bias):
    # conv + bn at drawn hyperparameters; shrinks towards the first of each list
    model = conv_bn(stride=stride, padding=padding, dilation=dilation, groups=groups,
                    bias=bias)
    x = torch.randn(2, 4, 11, 11)
    p = program(model, x)
    q, report = saturate_report(p, [CONV_BN], assume={"reassociate"}, cost=bn_dear)
    assert dict(report.rewrites) == {"conv_bn": 1} and batch_norms(q) == 0
    check_extracted(p, q, (x,))


def test_the_search_bench_runs_its_conv_bn_programs():
    from bench import search as bench

    out = io.StringIO()
    rows = bench.run_conv_bn(max_states=8, out=out, n_cases=1)
    assert [r["name"] for r in rows] == ["conv_bn_stride2_nobias"]
    assert rows[0]["sat"] == rows[0]["exh"] == rows[0]["greedy"] < rows[0]["before"]
    assert "conv_bn: saturate = exhaustive on 1/1" in out.getvalue()


class _Counted(nn.Module):
    """A buffer written at each call (``scale``) beside one only read (``shift``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("shift", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.scale.mul_(2.0)
        return x * (self.scale + 1.0) + (self.shift * 3.0)


def test_state_the_program_writes_is_not_invariant():
    p = import_ep(torch.export.export(_Counted(), (torch.randn(4),)))
    once = invariant_values(p, p.root, p.root_module.graph)
    reads = {n.name: [r.name for r in n.inputs()] for n in p.root_module.graph.nodes}
    shift_ops = {k for k, v in reads.items() if "b_shift" in v}
    scale_ops = {k for k, v in reads.items() if "b_scale" in v}
    assert "b_shift" in once and shift_ops <= once and shift_ops
    assert "b_scale" not in once and not (scale_ops & once) and scale_ops
