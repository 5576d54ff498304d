"""``transforms.rewrite`` on held-out rules: classes of failures found by probing rules and models
nobody wrote the engine for, each pinned by one small test (Before/Expected where structural)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ir import PassError, import_ep, verify
from lowering import export_ep, lower
from transforms import transform
from transforms.rewrite import Rule, check_rule, rewrite, rewrite_report


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 5.0) * 7.0 + (x * 2.0) * 3.0 + (x * 2) * 3  # ints: no float sentinel binds


def test_a_replacement_computing_on_its_scalars_gets_each_matchs_values():
    # x * (a * b): tracing folds a * b into one literal no sentinel marks; before the fix the
    # folded example product was used at every match
    # (max * 2.0) * -0.0 is NaN where max * (2.0 * -0.0) is -0.0: right without infs
    fold = Rule(lambda x, a, b: (x * a) * b, lambda x, a, b: x * (a * b), (torch.randn(4), 2.0, 3.0),
                name="fold", max_examples=10, assumes={"no_infs"})
    check_rule(fold)  # right, so never refused
    x = torch.randn(4)
    ep = torch.export.export(_Scaled(), (x,))
    q, report = rewrite_report(import_ep(ep), [fold], assume={"no_infs"})
    assert report.counts == {"fold": 2}
    scalars = sorted(n.args[1] for n in q.root_module.graph.nodes
                     if n.op == "call_function" and n.target is torch.ops.aten.mul.Tensor)
    assert scalars == [2, 3, 6.0, 35.0]
    torch.testing.assert_close(lower(q)(x), _Scaled()(x))


class _Lin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


_ADDMM = Rule(
    lambda x, w, b: F.linear(x, w, b),
    lambda x, w, b: torch.addmm(b, x.reshape(-1, x.shape[-1]), w.t()).reshape(
        *x.shape[:-1], w.shape[0]),
    (torch.randn(2, 3), torch.randn(4, 3), torch.randn(4)),
    name="addmm", max_examples=10, specials=False,
)


@pytest.mark.parametrize("level", ["training", "outlined"])
def test_a_replacement_reading_sizes_is_traced_at_each_matchs_shapes(level):
    # the example is (2, 3) x (4, 3); the model's linear is (7, 6) x (5, 6): the sizes the
    # replacement read from its examples must not be baked in
    check_rule(_ADDMM)
    x = torch.randn(7, 6)
    model = _Lin()
    p = import_ep(torch.export.export(model, (x,)))
    p = transform(p) if level == "outlined" else p
    q, report = rewrite_report(p, [_ADDMM])
    verify(q)
    assert report.counts == {"addmm": 1}
    torch.testing.assert_close(lower(q)(x), model(x))
    if level == "training":
        torch.testing.assert_close(export_ep(q).module()(x), model(x))


def test_inner_replacement_nodes_never_take_a_result_name():
    # at core aten, linear is permute + addmm; the replacement's inner addmm must not be named
    # "addmm" too, which the result (a reshape) takes: before, the result read itself
    x = torch.randn(7, 6)
    model = _Lin()
    p = import_ep(torch.export.export(model, (x,)).run_decompositions())
    q = rewrite(p, [_ADDMM])
    verify(q)
    names = [n.name for n in q.root_module.graph.nodes]
    assert len(names) == len(set(names))
    torch.testing.assert_close(lower(q)(x), model(x))


class _TwoLin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.relu(self.a(x)))
        return self.b(torch.var_mean(h, -1, keepdim=True)[1] + h)


def test_new_results_have_a_val_in_outlined_graphs():
    # an outlined graph reads a child call's result, which has no val: a new result takes the
    # val of the node it replaces
    rule = Rule(lambda x: torch.relu(torch.relu(x)), torch.relu, (torch.randn(4),), name="rr",
                trusted=True)
    mean = Rule(lambda x: x.mean(-1, keepdim=True),
                lambda x: torch.var_mean(x, -1, keepdim=True)[1], (torch.randn(3, 4),),
                name="mean", trusted=True)
    p = transform(import_ep(torch.export.export(_TwoLin(), (torch.randn(2, 4),))))
    q, report = rewrite_report(p, [rule, mean])
    assert report.counts["rr"] == 1
    created = {c for rw in report.rewrites for c in rw.created}
    new = [n for n in q.root_module.graph.nodes if n.name in created]
    assert new and all("val" in n.meta for n in new)


def test_rules_that_are_not_a_list_raise_a_pass_error():
    p = import_ep(torch.export.export(_Scaled(), (torch.randn(4),)))
    with pytest.raises(PassError, match="rules must be a list of Rule"):
        rewrite(p, 5)


class _ViewThenWrite(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.ones(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.c.view(2, 4)  # an alias of the buffer written below
        m = v.mean(-1, keepdim=True)
        self.c.add_(x)
        return m + v.var(-1, keepdim=True, unbiased=False)


_MEAN_VAR = Rule(
    lambda x: (x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)),
    lambda x: tuple(reversed(torch.var_mean(x, -1, keepdim=True, unbiased=False))),
    (torch.randn(3, 4),), name="mean_var", trusted=True,
)


@pytest.mark.parametrize("level", ["training", "outlined"])
def test_a_match_never_spans_a_write_to_a_view_of_its_input(level):
    # mean reads the buffer before add_, var after: one var_mean would read one of the two
    p = import_ep(torch.export.export(_ViewThenWrite(), (torch.randn(2, 4),)))
    p = transform(p) if level == "outlined" else p
    q, report = rewrite_report(p, [_MEAN_VAR])
    assert report.counts == {"mean_var": 0} and q is p
    x = torch.randn(2, 4)
    torch.testing.assert_close(lower(q)(x.clone()), _ViewThenWrite()(x.clone()))


def test_a_training_program_of_core_tagged_ops_is_matched_at_the_training_level():
    # mean.dim and var.dim are both tagged core, but run_decompositions() rewrites var.dim:
    # the program is at the training level, so the pattern must be traced there (before, the
    # pattern was decomposed to var.correction and never matched)
    class Free(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(-1, keepdim=True) * x.var(-1, keepdim=True, unbiased=False)

    x = torch.randn(2, 4)
    q, report = rewrite_report(import_ep(torch.export.export(Free(), (x,))), [_MEAN_VAR])
    assert report.counts == {"mean_var": 1}
    targets = [str(n.target) for n in q.root_module.graph.nodes if n.op == "call_function"]
    assert sum(t.startswith("aten.var_mean") for t in targets) == 1
    assert "aten.var.dim" not in targets and "aten.mean.dim" not in targets
    torch.testing.assert_close(lower(q)(x), Free()(x))


class _Twice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Lin()  # one graph after outlining, run on (7, 6) and on (3, 7, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).sum() + self.inner(x.expand(3, 7, 6)).sum()


def test_no_per_shape_replacement_in_a_graph_run_by_calls_of_other_shapes():
    x = torch.randn(7, 6)
    model = _Twice()
    ep = torch.export.export(model, (x,))
    flat, report = rewrite_report(import_ep(ep), [_ADDMM])
    assert report.counts == {"addmm": 2}  # flat: each call's linear at its own shapes
    outlined, report = rewrite_report(transform(import_ep(ep)), [_ADDMM])
    assert report.counts == {"addmm": 0}
    for q in (flat, outlined):
        torch.testing.assert_close(lower(q)(x), model(x))
