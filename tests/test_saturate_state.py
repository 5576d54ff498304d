"""``saturate``'s costs come true: what it charges is what the returned program runs per call.

- by default values computed from state alone are charged at every call, as ``lower(q)``
  recomputes them: on a merged LoRA, ``x @ (W + A @ B)``, the search splits it into
  ``x @ W + (x @ A) @ B`` (Before/Expected; before, it charged nothing for ``W + A @ B`` and
  kept the form that rebuilds it every call); on a CNN of conv + batch-norm pairs it keeps
  the program (folding by hand, every call, costs more than the batch norm: before, its report
  said 55.1 -> 35.1 and the lowered result was slower);
- with ``frozen_state=True`` those values are free to the search and folded into new
  constants in the result (``fold.fold_into_state``): the LoRA becomes one matmul of a folded
  weight, the CNN four convolutions of folded weights; the report says which;
- either way ``report.cost_after`` is ``program_cost`` of the returned program as it runs;
  numerics against eager; ``p`` unchanged.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from bench.conv_models import CNN, batch_norms, program, randomize_bn
from ir import format_graph, import_ep
from lowering import lower
from transforms.rewrite import Rule, saturate, saturate_report
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.cost import invariant_values, program_cost
from transforms.rewrite_rules import CONV_BN

R = frozenset({"reassociate"})
LORA_SPLIT = Rule(
    lambda x, w, a, b: x @ (w + a @ b), lambda x, w, a, b: x @ w + (x @ a) @ b,
    (torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 2), torch.randn(2, 8)),
    name="lora_split", both_ways=True, specials=False, assumes=R, trusted=True,
)


class _Lora(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(1024, 1024) / 32)
        self.a = torch.nn.Parameter(torch.randn(1024, 16) / 32)
        self.b = torch.nn.Parameter(torch.randn(16, 1024) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.w + self.a @ self.b)


def _lora():
    model, x = _Lora(), torch.randn(4, 1024)
    return model, x, import_ep(torch.export.export(model, (x,)))


def _compute(p) -> str:
    return "\n".join(line for line in format_graph(p.root_module.graph).splitlines()
                     if "placeholder" not in line)


BEFORE = """\
%matmul = call_function[aten.matmul.default](%p_a, %p_b)
%add = call_function[aten.add.Tensor](%p_w, %matmul)
%matmul_1 = call_function[aten.matmul.default](%x, %add)
return (%matmul_1,)"""

CHARGED = """\
%matmul_2 = call_function[aten.matmul.default](%x, %p_a)
%matmul_3 = call_function[aten.matmul.default](%matmul_2, %p_b)
%matmul_4 = call_function[aten.matmul.default](%x, %p_w)
%add_1 = call_function[aten.add.Tensor](%matmul_4, %matmul_3)
return (%add_1,)"""

FROZEN = """\
%matmul_1 = call_function[aten.matmul.default](%x, %c__folded_add)
return (%matmul_1,)"""


def test_a_merged_lora_is_split_where_state_is_charged():
    model, x, p = _lora()
    assert _compute(p) == BEFORE
    q, report = saturate_report(p, [LORA_SPLIT], assume=R)
    assert _compute(q) == CHARGED
    assert report.chosen == "saturate" and dict(report.rewrites) == {"lora_split": 1}
    assert report.state.startswith("charged")
    assert report.cost_after == pytest.approx(program_cost(q))
    assert report.cost_before == pytest.approx(program_cost(p))
    # what the old per-call cost called free: W + A @ B, rebuilt at every call
    assert program_cost(p, frozen_state=True) < report.cost_after < report.cost_before
    check_extracted(p, q, (x,), R)
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-4)


def test_a_merged_lora_is_one_matmul_of_a_folded_weight_where_state_is_frozen():
    model, x, p = _lora()
    keys = set(lower(p).state_dict())
    q, report = saturate_report(p, [LORA_SPLIT], assume=R, frozen_state=True)
    assert _compute(q) == FROZEN
    assert report.state == "frozen: 2 values computed from state alone folded into constants"
    assert not invariant_values(q, q.root, q.root_module.graph) & {
        n.name for n in q.root_module.graph.nodes if n.op == "call_function"}
    assert report.cost_after == pytest.approx(program_cost(q))
    assert report.cost_after == pytest.approx(program_cost(q, frozen_state=True))
    assert report.cost_after < program_cost(saturate(p, [LORA_SPLIT], assume=R))
    assert set(lower(q).state_dict()) == keys  # the folded constants are not in it
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-4)
    assert _compute(p) == BEFORE  # p unchanged


def _cnn():
    model = CNN().eval()
    randomize_bn(model)
    x = torch.randn(2, 3, 16, 16)
    return model, x, program(model, x)


def test_a_cnn_keeps_its_batch_norms_where_state_is_charged():
    _, _, p = _cnn()
    rule = attrs.evolve(CONV_BN, trusted=True)
    q, report = saturate_report(p, [rule], assume=rule.assumes)
    # folding by hand at every call costs more than the batch norm it replaces
    assert report.chosen == "original" and q is p and batch_norms(q) == 4
    assert report.cost_after == report.cost_before == pytest.approx(program_cost(p))


def test_a_cnn_has_every_batch_norm_folded_into_constants_where_state_is_frozen():
    model, x, p = _cnn()
    rule = attrs.evolve(CONV_BN, trusted=True)
    q, report = saturate_report(p, [rule], assume=rule.assumes, frozen_state=True)
    assert report.chosen == "saturate" and dict(report.rewrites) == {"conv_bn": 4}
    assert batch_norms(q) == 0 and report.state.startswith("frozen: ")
    convs = [n for n in q.root_module.graph.nodes if n.op == "call_function"
             and "conv" in str(n.target)]
    assert len(convs) == 4
    assert all("_folded_" in n.args[1].name for n in convs)
    assert report.cost_after == pytest.approx(program_cost(q))
    assert report.cost_after < report.cost_before
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)


def test_program_cost_counts_state_alone_only_where_not_frozen():
    _, _, p = _lora()
    ones = program_cost(p, cost=lambda t, a, k, v: 1.0)
    frozen = program_cost(p, cost=lambda t, a, k, v: 1.0, frozen_state=True)
    assert (ones, frozen) == (3.0, 1.0)  # mm(a, b), add, mm(x, .); frozen: the last only


def test_a_cnn_is_folded_where_its_rule_says_fold_state_without_frozen_state():
    # the rule declares fold_state=True: its values from state alone are free to the search
    # (frozen for its sites only) and folded into constants in the result, as rewrite does
    model, x, p = _cnn()
    rule = attrs.evolve(CONV_BN, name="conv_bn_fold", trusted=True, fold_state=True)
    q, report = saturate_report(p, [rule], assume=rule.assumes)
    frozen = saturate_report(p, [rule], assume=rule.assumes, frozen_state=True)[1]
    assert report.chosen == "saturate" and dict(report.rewrites) == {"conv_bn_fold": 4}
    assert report.cost_after == pytest.approx(frozen.cost_after)
    assert report.cost_after < report.cost_before
    assert report.cost_after == pytest.approx(program_cost(q))  # what the result runs
    assert batch_norms(q) == 0 and "fold_state rules made" in report.state
    convs = [n for n in q.root_module.graph.nodes if n.op == "call_function"
             and "conv" in str(n.target)]
    assert len(convs) == 4 and all("_folded_" in n.args[1].name for n in convs)
    assert batch_norms(p) == 4  # p unchanged
    with torch.no_grad():
        torch.testing.assert_close(lower(q)(x), model(x), rtol=1e-4, atol=1e-5)

