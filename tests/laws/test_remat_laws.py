"""Laws of ``rematerialize``, ``insert_ivals`` and ``repair_call_signatures``, and of ``outline``
and the pipeline, on generated programs whose values and state cross preserved call boundaries
(``ir.strategies.crossing_programs``): one a caller computes from an argument and the preserved
call reads, one the call computes from its output and the caller reads (as a no-op alias or
through an op), a buffer of the call that its caller updates before it or after it, with
nesting, repeated calls, sibling preserved calls and buffer updates around them.

Each stage must change most programs it is checked on (``MOST``), so that its laws are put to
the test; ``tests/laws/test_stage_teeth.py`` plants bugs in the stages that these programs
catch."""

from __future__ import annotations

import functools

from hypothesis import given, settings
from lawcases import before, examples

from ir.strategies import CROSSING_FEATURES, crossing_programs, programs
from lowering.pass_laws import LawReport, check_laws
from transforms import transform
from transforms.passes.outline import outline
from transforms.preserved.ivals import insert_ivals
from transforms.preserved.remat import rematerialize
from transforms.preserved.signatures import repair_call_signatures

CROSSING = frozenset(
    {
        "crossing_reads",
        "preserved_calls",
        "nesting",
        "repeated_calls",
        "buffers",
        "inplace_mutation",
        "functional_mutation",
        "multi_result_ops",
        "matrices",
    }
)

# Share of the programs tried that each stage must change. Measured under the ``ci`` profile:
# rematerialize 80 of 80, insert_ivals 42 of 60 (on ``programs()`` with the same features, 1 in
# 60 and none, so their checks used to accept a vacuous run); repair_call_signatures, with
# ``stale_signatures`` always on, 19 of 40.
MOST = 0.5
SOME = 0.25


def stage_programs(pass_fn, always=CROSSING_FEATURES):
    """``crossing_programs`` as ``pass_fn`` meets them in the default pipeline."""
    return before(pass_fn, CROSSING, functools.partial(crossing_programs, always=always))


def changed_at_least(report: LawReport, share: float) -> None:
    """``report``'s pass changed at least ``share`` of the programs tried (a run of fewer than
    20, as the ``dev`` profile makes, need only not be vacuous: ``check_laws`` checks that)."""
    if report.tried >= 20:
        assert report.changed >= share * report.tried, (
            f"{report}: the stage changed fewer than {share:.0%} of the programs, so its laws "
            "are barely tested; the generator no longer makes what it rewrites"
        )


def test_rematerialize_obeys_its_laws():
    report = check_laws(
        rematerialize, programs=stage_programs(rematerialize), idempotent=True,
        max_examples=examples(80),
    )
    changed_at_least(report, MOST)


def test_insert_ivals_obeys_its_laws():
    report = check_laws(
        insert_ivals, programs=stage_programs(insert_ivals), idempotent=True,
        max_examples=examples(60),
    )
    changed_at_least(report, MOST)


def test_repair_call_signatures_obeys_its_laws():
    report = check_laws(
        repair_call_signatures,
        programs=stage_programs(repair_call_signatures, CROSSING_FEATURES | {"stale_signatures"}),
        idempotent=True, max_examples=examples(40),
    )
    changed_at_least(report, SOME)


@settings(max_examples=examples(60), deadline=None)
@given(stage_programs(repair_call_signatures))
def test_generated_signatures_are_never_repaired(p):
    """Without ``stale_signatures``, generated signatures name what crosses: the repair leaves
    them as they are."""
    assert repair_call_signatures(p) is p


def test_outline_obeys_its_laws_with_crossing_reads():
    check_laws(
        outline, programs=stage_programs(outline), idempotent=True, max_examples=examples(80)
    )


def test_pipeline_obeys_the_laws_with_crossing_reads():
    check_laws(transform, programs=crossing_programs(features=CROSSING), idempotent=True,
               max_examples=examples(80))


def test_pipeline_obeys_the_laws_with_crossing_reads_now_and_then():
    """The same on ``programs()``, where preserved calls and crossing values are rarer."""
    check_laws(transform, programs=programs(features=CROSSING), idempotent=True,
               max_examples=examples(40))
