"""``check_rule_in_context`` (issue 31, item 2): rewrite's law on generated programs holding a
rule's pattern. A sample of the rule library (``tests/rule_library.py``) passes it in CI, the
whole library and the shipped rules under ``slow``; the strategy under it
(``ir.strategies.rewrite_sites``) makes what it says."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from ir import import_ep
from ir.strategies.rewrite_sites import (
    PLACES,
    SiteSpec,
    export_site,
    literal_slots,
    realize_site,
    retyped,
    rewrite_sites,
)
from tests.rule_library import RULES, SAMPLE
from transforms.machinery.trace import TRAINING, trace
from transforms.rewrite import check_rule_in_context
from transforms.rewrite.check_context import check_site
from transforms.rewrite.interpret import run_program
from transforms.rewrite.rule_check import signatures
from transforms.rewrite.rules import RELU_RELU
from transforms.rewrite.rules import RULES as SHIPPED

BY_NAME = {r.name: r for r in RULES}


def test_the_library_holds_twenty_rules_at_least():
    assert len(RULES) >= 20 and len(BY_NAME) == len(RULES)
    assert set(SAMPLE) <= set(BY_NAME)


@pytest.mark.parametrize("name", SAMPLE[:4])
def test_a_sample_of_the_library_passes_in_context(name):
    check_rule_in_context(BY_NAME[name], max_examples=6)


@pytest.mark.slow
@pytest.mark.nightly  # ~10 s of CPU per rule; the sample above runs by default
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_whole_library_passes_in_context(name):
    check_rule_in_context(BY_NAME[name], max_examples=15)


# by default the four rules that are not attention and the plain attention rule; the ten other
# attention spellings (10-24 s each in a full run, their check_rule verdicts included) with -m nightly:
# each spelling is still fused and run against eager by default (VARIANTS in
# tests/test_rewrite_attention.py), and checked by check_rule there
IN_CONTEXT_SAMPLE = ("attention", "conv_bn", "relu_relu", "silu", "times_one")


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule",
    [r if r.name in IN_CONTEXT_SAMPLE else pytest.param(r, marks=pytest.mark.nightly)
     for r in SHIPPED],
    ids=lambda r: r.name,
)
def test_the_shipped_rules_pass_in_context(rule):
    check_rule_in_context(rule, max_examples=10)


def _split(rule):
    return trace(rule.pattern, rule.example_inputs, TRAINING, rule.name, "pattern",
                 sentinels=False).graph


def test_a_site_runs_as_its_module_does():
    # the interpreter that runs programs in the law agrees with the eager module
    spec = SiteSpec((((3, 4), torch.float32),), ("view",), (("output", "write_view"),),
                    "inside", True, "training", 1, 7)
    ep, inputs = export_site(spec, RELU_RELU.pattern)
    model, _ = realize_site(spec, RELU_RELU.pattern)
    eager_in = tuple(x.clone() for x in inputs)
    want = model(*eager_in)
    p = import_ep(ep)
    got_in = tuple(x.clone() for x in inputs)
    got = run_program(p, got_in, {})
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_in, eager_in)  # the write through the view reached the input
    assert set(p.call_signatures) == {"", "child"}


def test_a_site_across_a_preserved_call_splits_the_pattern():
    spec = SiteSpec((((3, 4), torch.float32),), ("input",), (("output",),), "across", True,
                    "training", 1, 0)
    ep, inputs = export_site(spec, RELU_RELU.pattern, _split(RELU_RELU))
    p = import_ep(ep)
    relus = [n for n in p.root_module.graph.nodes if n.op == "call_function"]
    stacks = [len(n.meta["nn_module_stack"]) for n in relus]
    assert stacks == [1, 2]  # the first relu in the root, the second inside the child
    assert check_site(RELU_RELU, p, inputs) is p  # rewrite keeps the match off the boundary


def test_near_misses_retype_literals():
    assert (retyped(1), retyped(2.0), retyped(0.0), retyped(True), retyped(0.5)) == (
        1.0, 2, -0.0, 1, None)
    assert str(retyped(0.0)) == "-0.0"
    graph = _split(BY_NAME["twice_as_add"])  # x * 2
    assert len(literal_slots(graph)) == 1


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(rewrite_sites(BY_NAME["relu_and_double"].pattern,
                     [s.args for s in signatures(BY_NAME["relu_and_double"])], results=2,
                     split=_split(BY_NAME["relu_and_double"])))
def test_sites_draw_every_place_source_and_use(spec):
    _SEEN.update({spec.place, spec.level, *spec.sources, *(u for us in spec.uses for u in us)})
    _SEEN.update(str(a[1]) for a in spec.args if isinstance(a, tuple))


_SEEN: set = set()


def test_the_draws_cover_the_kinds():
    test_sites_draw_every_place_source_and_use()
    assert set(PLACES) <= _SEEN
    assert {"input", "computed", "view", "buffer", "core", "training"} <= _SEEN
    assert {"output", "view", "write", "write_view", "buffer", "flat"} <= _SEEN
    assert "torch.int64" in _SEEN or "torch.int32" in _SEEN
