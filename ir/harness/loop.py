"""The law loop: a law's examples drawn and each one checked, under hypothesis, in one place.

Every law that draws (``lowering.pass_laws.check_laws``: generated programs and the pass's laws on
each; ``transforms.rewrite.rule_check.check_rule``: a rule's arguments at one signature, the pattern
against the rewritten pattern; ``transforms.rewrite.check_context.check_rule_in_context``: a
rule's pattern planted in a program, the program against its rewrite) is a :class:`Trial`: the
law it observes (``ir.harness.Law``), what is drawn (a hypothesis strategy), what runs on each
draw (the two sides, run and judged through ``ir.harness.run_side`` / ``judge``), a key telling
it apart from other trials of that law, and an optional limit on shrinking. :func:`hold` runs
one; it owns the hypothesis settings (:func:`law_settings`), the example database's key, the
run, and where hypothesis keeps its files outside a test suite.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import attrs

from ir.harness.observe import Law
from ir.harness.run import ShrinkLimit


@attrs.frozen(eq=False)
class Trial:
    """A law run over drawn examples, as a value.

    - ``law``: the law (``ir.harness.Law``: what is observed of each side and compared);
    - ``draws``: a hypothesis strategy, what is drawn (programs, a signature's arguments,
      rewrite sites);
    - ``check``: ``check(drawn)`` runs the sides on one draw and judges them, returning when
      the law holds and raising the law's failure (a ``LawViolation``) when it breaks;
    - ``key``: what tells this trial apart from the others with the same ``check`` (the laws
      checked, a rule's content): hypothesis keys the example database and, derandomized,
      seeds the draws by ``check``'s source and :func:`digest` of ``key``. It holds no name
      (a pass's, a rule's, a function's) and nothing else that a renaming or a respacing of
      the code under test changes: whether a bug is caught must not depend on what it is
      called;
    - ``budget``: a limit on shrinking (``ir.harness.run.ShrinkLimit``: ``ShrinkBudget`` in
      seconds, ``ShrinkCalls`` in calls), or ``None`` (hypothesis shrinks as long as it
      likes). Each ``check`` runs under it, and once it runs out the
      smallest failure found is raised.
    """

    law: Law
    draws: Any
    check: Callable[[Any], None]
    key: Hashable = ()
    budget: ShrinkLimit | None = None


def digest(trial: Trial) -> bytes:
    """The bytes that key ``trial``'s run besides its ``check``: ``repr(trial.key)`` encoded.
    Hypothesis keys the example database and, derandomized, seeds the draws by the check (its
    source and signature) and these bytes, so two trials of one check with other keys get
    other entries and other draws; the same trial gets the same ones on every run.
    O(size of the key's repr)."""
    return repr(trial.key).encode()


def law_settings(base: Any = None, *, max_examples: int | None = None) -> Any:
    """The hypothesis settings a law runs under: ``base`` with the law's policy on top.

    ``base`` defaults to the active profile (under a test suite, the suite's own); outside a
    suite (one of hypothesis's own profiles active: its ``default``, or the ``ci`` profile it
    loads by itself where a ``CI`` variable is set) the active profile derandomized and without
    an example database, so a run is repeatable. On top, always: no deadline (a law's example
    runs whole programs), one failure reported (``report_multiple_bugs=False``: the law's own
    error is raised, not a group), the ``too_slow`` and ``data_too_large`` health checks
    suppressed besides ``base``'s, no ``explain`` phase; ``max_examples`` when given (else
    ``base``'s). Hypothesis's explain phase runs the test again on variations of the shrunk
    example after shrinking, to say which parts of it may vary: every such run draws a whole
    program (a failing ``check_laws`` spent 7 of its 8 s there), its words never reach the
    law's error, and under a shrink limit a variation that fails could be raised in place of
    the shrunk example.

    Raises ``ValueError`` naming ``max_examples`` when it is not a positive int.
    Laws: ``law_settings(s).deadline is None``, ``not law_settings(s).report_multiple_bugs``
    and ``Phase.explain not in law_settings(s).phases`` for every ``s``; every other setting
    is ``base``'s. Complexity: O(1).
    """
    from hypothesis import HealthCheck, Phase
    from hypothesis import settings as hsettings

    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples must be a positive int, got {max_examples!r}")
    if base is None:
        base = hsettings.default
        if _outside_a_suite():
            base = hsettings(base, derandomize=True, database=None)
    suppressed = list(base.suppress_health_check)
    suppressed += [h for h in (HealthCheck.too_slow, HealthCheck.data_too_large)
                   if h not in suppressed]
    return hsettings(
        base,
        max_examples=max_examples if max_examples is not None else base.max_examples,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=suppressed,
        phases=tuple(p for p in base.phases if p is not Phase.explain),
    )


def hold(trial: Trial, *, settings: Any = None, max_examples: int | None = None,
         seed: int | None = None) -> None:
    """Check ``trial.law`` on examples drawn from ``trial.draws``: return when ``trial.check``
    returned on every one, else raise its failure for the shrunk example.

    Parameters:
        trial: what is drawn, what is checked on each draw, the key and the shrink budget.
        settings: hypothesis settings to start from (``law_settings``' ``base``; default: the
            active profile, derandomized without a database outside a test suite).
        max_examples: how many examples (default: the settings' own).
        seed: ``None``: the settings decide the draws (derandomized: by the check and the key;
            else hypothesis's own random seed). An int: the draws are random ones seeded by it
            (hypothesis's ``seed``, which overrides ``derandomize``) and no example database is
            read or written, so a run under one seed is repeatable and independent of earlier
            runs, and runs under other seeds draw other examples: how a law's power is measured
            (``bench.power``).

    The run: ``given(trial.draws)`` over ``trial.check`` (under ``trial.budget`` when there is
    one) with ``law_settings(settings, max_examples=...)``; the example database's key and the
    derandomized seed are hypothesis's digest of ``trial.check`` (its source and signature) and
    ``digest(trial)``. Outside a test suite, when the settings keep no
    example database, hypothesis's files (its caches, which it writes even then) go to a
    temporary directory for the run unless ``HYPOTHESIS_STORAGE_DIRECTORY`` says where: nothing
    lands in the caller's tree.

    Raises what ``trial.check`` raises for the shrunk (or, once ``trial.budget`` ran out, the
    smallest found) example, hypothesis's report of it added as a note; ``ValueError`` for a
    bad ``max_examples`` or a ``seed`` that is not an int. Must not be called inside a
    hypothesis test (hypothesis does not nest).

    Laws: with derandomized settings (the default outside a suite, purefx's ``ci`` profile) two
    calls with equal trials draw the same examples and fail alike; two calls with one ``seed``
    and equal ``draws`` and ``check`` draw the same examples, whatever the settings' database
    and ``derandomize``. Complexity: the examples' checks, plus hypothesis's shrinking of a
    failure.
    """
    from hypothesis import given
    from hypothesis import seed as hseed
    from hypothesis import settings as hsettings

    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    chosen = law_settings(settings, max_examples=max_examples)
    if seed is not None:
        # a seeded run reads no saved failure and saves none: its draws are the seed's alone
        chosen = hsettings(chosen, database=None, derandomize=False)
    check, budget = trial.check, trial.budget

    # hypothesis keys a run by its test function (source and signature, read through
    # ``__wrapped__``: ``check``'s own) plus this digest; the wrapper leaves ``check`` unwritten
    @functools.wraps(check)
    def one_draw(*args: Any, **kwargs: Any) -> None:
        if budget is None:
            check(*args, **kwargs)
        else:
            budget.run(trial.key, lambda: check(*args, **kwargs))

    one_draw._hypothesis_internal_add_digest = digest(trial)  # type: ignore[attr-defined]
    test = chosen(given(trial.draws)(one_draw))
    if seed is not None:
        test = hseed(seed)(test)
    with _storage_outside_the_tree(chosen.database is None and _outside_a_suite()):
        if budget is None:
            test()
        else:
            budget.guard(test)


def _outside_a_suite() -> bool:
    """Whether one of hypothesis's own profiles is active (no test suite loaded one): its
    ``default``, or its built-in ``ci`` profile, which it loads by itself where a CI variable
    (``CI``, ``GITHUB_ACTIONS``, ...) is set."""
    import hypothesis._settings as own
    from hypothesis import settings as hsettings

    # ``own.CI`` is the built-in profile object, whatever a suite registers under "ci" later
    active = hsettings.default
    return active is hsettings.get_profile("default") or active is getattr(own, "CI", None)


@contextlib.contextmanager
def _storage_outside_the_tree(outside: bool) -> Iterator[None]:
    """Where ``outside``, hypothesis's storage (its caches, e.g. ``constants``, which it writes
    even without an example database) in a temporary directory for the run, unless
    ``HYPOTHESIS_STORAGE_DIRECTORY`` says where it goes: nothing lands in the caller's tree."""
    if not outside or os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        yield
        return
    from hypothesis.configuration import set_hypothesis_home_dir, storage_directory

    before = storage_directory(intent_to_write=False).home_directory
    with tempfile.TemporaryDirectory(prefix="purefx-laws-") as where:
        set_hypothesis_home_dir(where)
        try:
            yield
        finally:
            set_hypothesis_home_dir(before)


__all__ = ["Trial", "digest", "hold", "law_settings"]
