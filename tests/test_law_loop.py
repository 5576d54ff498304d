"""The law loop (``ir.harness.loop``): the settings policy every law runs under, the key of a
trial's run, the shrunk failure raised, the shrink budget, and nothing written outside a suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase

from ir.harness import Law, ShrinkBudget, Trial, digest, hold, law_settings

ROOT = Path(__file__).resolve().parents[1]
LAW = Law("a test law")


class Broken(AssertionError):
    """The failure of the test law: ``drawn`` is the example it broke on."""

    def __init__(self, drawn: int) -> None:
        super().__init__(f"broken on {drawn}")
        self.drawn = drawn


def breaks_from(limit: int):
    """A check that breaks on every integer ``>= limit``; the calls it saw."""
    seen: list[int] = []

    def check(x: int) -> None:
        seen.append(x)
        if x >= limit:
            raise Broken(x)

    return check, seen


# --- the settings policy ------------------------------------------------------------------------


def test_law_settings_turns_off_the_deadline_and_multi_bug_reports_and_keeps_the_rest():
    base = settings(max_examples=37, deadline=200, report_multiple_bugs=True,
                    derandomize=True, database=None, phases=(Phase.generate,),
                    suppress_health_check=[HealthCheck.filter_too_much])
    chosen = law_settings(base)
    assert chosen.deadline is None
    assert chosen.report_multiple_bugs is False
    assert set(chosen.suppress_health_check) == {
        HealthCheck.filter_too_much, HealthCheck.too_slow, HealthCheck.data_too_large}
    assert (chosen.max_examples, chosen.derandomize, chosen.database, chosen.phases) == (
        37, True, None, (Phase.generate,))
    assert law_settings(base, max_examples=5).max_examples == 5


def test_law_settings_drop_the_explain_phase_and_keep_every_other():
    # explain reruns the test on variations of the shrunk example: a whole program each, words
    # that never reach the law's error (7 of a failing check_laws' 8 s)
    chosen = law_settings(settings(phases=tuple(Phase)))
    assert chosen.phases == tuple(p for p in Phase if p is not Phase.explain)
    assert Phase.explain not in law_settings().phases


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10"])
def test_law_settings_refuses_a_bad_max_examples(bad):
    with pytest.raises(ValueError, match=r"max_examples must be a positive int, got"):
        law_settings(max_examples=bad)


def test_under_a_suite_the_base_is_the_suite_profile():
    chosen = law_settings()
    assert chosen.max_examples == settings.default.max_examples
    assert chosen.derandomize == settings.default.derandomize


def test_outside_a_suite_the_base_is_derandomized_without_a_database():
    suite = settings.get_current_profile_name()
    settings.load_profile("default")  # hypothesis's own profile: what a script runs under
    try:
        assert settings.default.derandomize is False  # the profile itself is random
        chosen = law_settings()
    finally:
        settings.load_profile(suite)
    assert chosen.derandomize is True
    assert chosen.database is None
    assert chosen.deadline is None and chosen.report_multiple_bugs is False


# --- one run ------------------------------------------------------------------------------------


def test_a_check_that_holds_runs_on_max_examples_draws():
    check, seen = breaks_from(10**9)
    hold(Trial(LAW, st.integers(0, 10**6), check), max_examples=7)
    assert len(seen) == 7


def test_a_failing_check_raises_its_failure_for_the_shrunk_example():
    check, _ = breaks_from(10)
    with pytest.raises(Broken) as caught:
        hold(Trial(LAW, st.integers(0, 1000), check), max_examples=100)
    assert caught.value.drawn == 10  # shrunk to the smallest example that breaks the law
    assert isinstance(caught.value, AssertionError)  # the law's own error, not a group


def test_a_derandomized_run_repeats():
    def first_failure(key: str) -> tuple[int, list[int]]:
        check, seen = breaks_from(500)
        with pytest.raises(Broken) as caught:
            hold(Trial(LAW, st.integers(0, 1000), check, key=key),
                 settings=settings(derandomize=True, database=None), max_examples=50)
        return caught.value.drawn, seen

    assert first_failure("k") == first_failure("k")


def primary_key(saved: bytes) -> bytes:
    """The trial's own key of a database entry: hypothesis may also save, on some runs and not
    others, the shrinker's intermediate failures under ``<key>.secondary`` (and targets under
    ``<key>.pareto``); those are the same trial's key."""
    for sub_key in (b".secondary", b".pareto"):
        if saved.endswith(sub_key):
            return saved[: -len(sub_key)]
    return saved


def test_the_database_key_differs_per_key_and_repeats_for_one_key():
    def keys_saved(key: str) -> set[bytes]:
        db = InMemoryExampleDatabase()
        check, _ = breaks_from(3)
        with pytest.raises(Broken):
            hold(Trial(LAW, st.integers(0, 100), check, key=key),
                 settings=settings(database=db, derandomize=False), max_examples=50)
        assert db.data, "a failure is saved in the database"
        return {primary_key(k) for k in db.data}

    a, b = keys_saved("pass a"), keys_saved("pass b")
    assert a == keys_saved("pass a")
    assert not a & b
    assert digest(Trial(LAW, st.none(), print, key="pass a")) != digest(
        Trial(LAW, st.none(), print, key="pass b"))


def test_a_seed_makes_the_draws_random_repeatable_and_keeps_no_database():
    """``seed=``: random draws seeded by it, whatever ``derandomize`` says; the same seed draws
    the same examples, others draw others; no failure is saved (or replayed) even where the
    settings keep a database."""

    def drawn(seed: int) -> list[int]:
        check, seen = breaks_from(10**9)
        hold(Trial(LAW, st.integers(0, 10**6), check, key="k"),
             settings=settings(derandomize=True), max_examples=20, seed=seed)
        return seen

    assert drawn(1) == drawn(1)
    assert drawn(1) != drawn(2)
    check, _ = breaks_from(3)
    db = InMemoryExampleDatabase()
    with pytest.raises(Broken):
        hold(Trial(LAW, st.integers(0, 100), check, key="k"),
             settings=settings(derandomize=False, database=db), max_examples=50, seed=5)
    assert not db.data, "a seeded run saves no failure"


@pytest.mark.parametrize("seed", ["1", 1.5, True])
def test_a_seed_that_is_not_an_int_is_refused(seed):
    with pytest.raises(ValueError, match="seed must be an int"):
        hold(Trial(LAW, st.none(), print), seed=seed)


def test_the_run_is_keyed_by_the_check_itself_not_by_the_loop():
    """The wrapper ``hold`` puts around a check reads as the check to hypothesis (its name, its
    source), so a law's draws are those its own check and key give."""

    def my_check(x: int) -> None:
        raise Broken(x)

    with pytest.raises(Broken) as caught:
        hold(Trial(LAW, st.integers(0, 100), my_check), max_examples=5)
    assert any("my_check(" in note for note in getattr(caught.value, "__notes__", ()))


def test_the_shrink_budget_ends_shrinking_with_the_smallest_failure_found():
    check, seen = breaks_from(10)
    with pytest.raises(Broken) as caught:
        hold(Trial(LAW, st.integers(0, 10**6), check, budget=ShrinkBudget(0.0, Broken)),
             settings=settings(derandomize=True, database=None), max_examples=100)
    failures = [x for x in seen if x >= 10]
    # budget 0: the run after the first failure ends the search, which raises that failure
    assert failures == [caught.value.drawn]


def test_outside_a_suite_a_run_repeats_and_writes_no_hypothesis_directory(tmp_path):
    script = (
        "from hypothesis import strategies as st\n"
        "from ir.harness import Law, Trial, hold\n"
        "def check(x):\n"
        "    assert x < 300, x\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        hold(Trial(Law('l'), st.lists(st.integers(0, 1000)).map(sum), check))\n"
        "    except AssertionError as e:\n"
        "        print(e.args[0])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("HYPOTHESIS_")}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=300)
    first, second = run.stdout.split()
    assert first == second == "300"
    assert not (tmp_path / ".hypothesis").exists(), sorted(os.listdir(tmp_path))
