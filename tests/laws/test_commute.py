"""Passes that touch independent parts of a program commute.

``remove_effect_tokens`` (tokens), ``functional_to_inplace`` (mutation outputs) and
``fix_module_stacks`` (module-stack meta) each rewrite their own part of a flat program;
``deduplicate`` (module graphs) and ``fix_module_stacks`` (root meta) do on outlined programs.
Deduplication is invisible once a program is inlined again.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from lawcases import before, examples

from ir import alpha_equivalent
from ir.strategies import programs
from transforms import inline
from transforms.passes.dedup import deduplicate
from transforms.passes.effect_tokens import remove_effect_tokens
from transforms.passes.module_stacks import fix_module_stacks
from transforms.passes.mutations import functional_to_inplace
from transforms.passes.state_sinking import sink_state


def stacks(p):
    return [(n.name, n.meta.get("nn_module_stack")) for _, mid in p.walk()
            for g in p.modules[mid].graphs for n in g.nodes]


FLAT = (remove_effect_tokens, functional_to_inplace, fix_module_stacks)


@pytest.mark.parametrize("a, b", list(itertools.combinations(FLAT, 2)),
                         ids=lambda f: f.__name__)
def test_flat_normalizers_commute(a, b):
    @settings(max_examples=examples(60))
    @given(programs())
    def commute(p):
        ab, ba = a(b(p)), b(a(p))
        assert ab == ba
        assert stacks(ab) == stacks(ba)

    commute()


@settings(max_examples=examples(60))
@given(before(deduplicate))
def test_dedup_and_stack_fixing_commute(p):
    assert deduplicate(fix_module_stacks(p)) == fix_module_stacks(deduplicate(p))


@settings(max_examples=examples(80))
@given(before(sink_state))
def test_dedup_is_invisible_once_inlined(p):
    assert alpha_equivalent(inline(deduplicate(p)), inline(p))
