"""A replacement whose results share memory where the pattern's are fresh (issue 42).

``x @ w1, x @ w2 -> split(x @ cat(w1, w2))`` returns two views of one buffer. ``check_rule``
accepts it (the values are the law; aliasing that appears is the engine's to guard), and
``rewrite`` takes a match only where nothing writes either result and the caller does not get
both (guard ``shared``, ``transforms.rewrite.result_sharing``).
"""

from __future__ import annotations

import torch

from ir import Graph, import_ep
from lowering import lower
from transforms.rewrite import Rule, apply_rules, check_rule
from transforms.rewrite import guards as guard_table
from transforms.rewrite.result_sharing import output_bases


def _pattern(x, w1, w2):
    return x @ w1, x @ w2


def _split(x, w1, w2):
    y = x @ torch.cat([w1, w2], dim=-1)
    a, b = y.split([w1.shape[-1], w2.shape[-1]], dim=-1)
    return a, b


ARGS = (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 6))
# ``no_infs``: on inputs past float32's range the two matmuls overflow differently. Checked
# (hypothesis's draw with 3.4e38 in x, -inf / inf / nan in the weights): where a dot product
# holds ``89.6 * inf + 1.05 * -3.4e38 + ...`` the pattern's ``x @ w2`` (w2 transposed) gives
# nan (the product overflows to -inf) and the replacement's ``x @ cat(w1, w2)`` inf (as float64
# does): equal results only where no value is infinite (LLVM's ninf)
SHARED = Rule(_pattern, _split, ARGS, name="shared_matmul", max_examples=8,
              assumes={"no_infs"})


class _TwoHeads(torch.nn.Module):
    def forward(self, x, w1, w2):
        return torch.relu(x @ w1).sum(-1) + torch.relu(x @ w2).sum(-1)


def test_check_rule_accepts_results_that_share_one_buffer():
    assert check_rule(SHARED).rewritten > 0
    assert output_bases(SHARED.compiled("training").replacement) == ("matmul", "matmul")


def test_shared_results_are_taken_where_nothing_writes_them():
    p = import_ep(torch.export.export(_TwoHeads(), ARGS))
    q, report = apply_rules(p, [SHARED])
    assert report.counts == {"shared_matmul": 1}
    assert [str(n.target) for n in q.root_module.graph.nodes if n.op == "call_function"][:3] == [
        "aten.cat.default", "aten.matmul.default", "aten.split_with_sizes.default"]
    torch.testing.assert_close(lower(q)(*ARGS), _TwoHeads()(*ARGS))


class _BothFirst(torch.nn.Module):
    def forward(self, x, w1, w2):
        a, b = x @ w1, x @ w2
        return torch.relu(a).sum(-1) + torch.relu(b).sum(-1)


def _written():
    """``_BothFirst`` exported, its first ``relu`` made ``relu_`` (after both matmuls, so no
    write lies between the matched nodes): the first result is written in place."""
    p = import_ep(torch.export.export(_BothFirst(), ARGS))
    g = p.root_module.graph
    nodes = [n.replace(target=torch.ops.aten.relu_.default) if n.name == "relu" else n
             for n in g.nodes]
    mod = p.root_module.replace(graphs=(Graph.of(nodes),))
    return p.replace(modules=p.modules.set(p.root, mod))


def test_shared_results_are_declined_where_an_in_place_op_writes_one():
    """``relu_`` writes the first result: as views of one buffer, the write would stay inside
    its half here, but a write may reach the other through a view; declined, guard ``shared``."""
    p = _written()
    q, report = apply_rules(p, [SHARED])
    assert q is p and report.counts == {"shared_matmul": 0}
    assert set(report.skipped) == {"shared"}


def _sum_twice(x, y):
    return x + y, y + x


def _sum_once(x, y):
    s = x + y
    return s, s


class _WritesOne(torch.nn.Module):
    def forward(self, x, y):
        a, b = x + y, y + x
        return torch.relu(a).sum() + b.sum()


def _cse_written():
    """``_WritesOne`` exported, its ``relu`` made ``relu_``: a write to the first sum."""
    p = import_ep(torch.export.export(_WritesOne(), (torch.randn(4), torch.randn(4))))
    nodes = [n.replace(target=torch.ops.aten.relu_.default) if n.name == "relu" else n
             for n in p.root_module.graph.nodes]
    return p.replace(modules=p.modules.set(
        p.root, p.root_module.replace(graphs=(Graph.of(nodes),))))


def test_the_shared_guard_is_needed(monkeypatch):
    """``x + y, y + x -> s, s``: one value for both results. Where the first is written in
    place the rule is declined; without the ``shared`` row it is taken, and the write reaches
    the second result (the lowered program differs from eager)."""
    cse = Rule(_sum_twice, _sum_once, (torch.randn(4), torch.randn(4)), name="cse",
               trusted=True)
    p = _cse_written()
    x, y = -torch.ones(4), torch.zeros(4)  # relu_ zeroes the first sum: -4 eagerly
    assert float(lower(p)(x, y)) == -4.0
    q, report = apply_rules(p, [cse])
    assert q is p and set(report.skipped) == {"shared"}
    monkeypatch.setattr(guard_table, "GUARDS", guard_table.without("shared"))
    q, report = apply_rules(p, [cse])
    assert report.counts == {"cse": 1}
    assert float(lower(q)(x, y)) == 0.0  # wrong: the write reached the other result


class _Both(torch.nn.Module):
    def forward(self, x, w1, w2):
        return x @ w1, x @ w2


def test_shared_results_are_declined_where_the_caller_gets_both():
    p = import_ep(torch.export.export(_Both(), ARGS))
    q, report = apply_rules(p, [SHARED])
    assert q is p and set(report.skipped) == {"shared"}
