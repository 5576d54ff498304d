"""The laws of DESIGN.md for every built-in pass and for the whole default pipeline.

Each pass is checked by ``lowering.laws.check_laws`` (purity, verify, determinism, semantics,
and idempotence where its docstring claims it) on the programs it meets in the pipeline.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from lawcases import before, examples, valid

from ir.strategies import programs
from lowering.laws import check_laws
from transforms import inline, transform
from transforms.dedup import deduplicate
from transforms.effects import remove_effect_tokens
from transforms.hop_split import split_hop_bodies
from transforms.mutations import functional_to_inplace
from transforms.outline import outline
from transforms.pipeline import pipeline
from transforms.sink import sink_state
from transforms.stacks import fix_module_stacks

# (pass, claims idempotence, examples under the ci profile)
PASSES = [
    (remove_effect_tokens, True, 60),
    (functional_to_inplace, True, 100),
    (split_hop_bodies, True, 30),
    (fix_module_stacks, True, 60),
    (outline, True, 120),
    (sink_state, True, 100),
    (deduplicate, True, 200),  # few generated programs have two equal bodies to merge
]


# Passes that change no generated program (check_laws would fail them as vacuous): what they
# rewrite is not generated (effect tokens, higher-order-op bodies) or already as they make it
# (import_ep's module stacks); their own example tests exercise them
# (tests/test_effects.py, tests/test_hop_split.py, tests/examples/).
NOTHING_TO_DO = {remove_effect_tokens, split_hop_bodies, fix_module_stacks}


@pytest.mark.parametrize(
    "pass_fn, idempotent, n", PASSES, ids=[f.__name__ for f, _, _ in PASSES]
)
def test_builtin_pass_obeys_its_laws(pass_fn, idempotent, n):
    check_laws(pass_fn, programs=before(pass_fn), idempotent=idempotent, max_examples=examples(n),
               allow_vacuous=pass_fn in NOTHING_TO_DO)


def test_default_pipeline_obeys_the_laws():
    check_laws(transform, idempotent=True, max_examples=examples(150))


def test_functional_pipeline_obeys_the_laws():
    keep = pipeline(keep_functional=True)

    def transform_functional(p):
        return transform(p, keep)

    check_laws(transform_functional, idempotent=True, max_examples=examples(60))


def test_inline_obeys_the_laws_on_outlined_programs():
    check_laws(inline, programs=before(sink_state), idempotent=True, max_examples=examples(80))


def test_inline_obeys_the_laws_on_pipeline_results():
    check_laws(inline, programs=valid(transform), idempotent=True, max_examples=examples(60))


@settings(max_examples=examples(30))
@given(programs())
def test_inline_of_a_flat_program_is_the_program(p):
    assert inline(p) is p


def test_default_pipeline_obeys_the_laws_on_exported_programs():
    """The same laws on real ``torch.export`` programs (the export tier), imported."""
    from ir import import_ep
    from ir.strategies import exported_programs

    check_laws(transform, programs=exported_programs().map(lambda drawn: import_ep(drawn[1])),
               idempotent=True, max_examples=examples(25))
