"""``bench.power`` (issue 60): every source of planted bugs is found, a case runs under a seed and
reports the law and the examples to its first catch, and the table prints (markdown too)."""

from __future__ import annotations

import pytest

from bench import power


@pytest.fixture(scope="module")
def pass_cases():
    return {c.key: c for c in power.cases(("pass",))}


def test_every_source_of_planted_pass_bugs_is_measured_with_its_twins(pass_cases):
    sources = {(c.source, c.bug) for c in pass_cases.values()}
    for source in ("planted_bugs", "heldout", "programs_like", "teeth"):
        assert (source, True) in sources and (source, False) in sources, source
    assert len(pass_cases) == len(set(pass_cases))  # one row per case: the keys tell them apart
    assert all(c.law for c in pass_cases.values() if c.bug)


def test_a_case_runs_under_a_seed_and_its_row_names_the_law_and_the_first_catch(pass_cases):
    key = "pass:planted_bugs:fold_names_by_counter"
    power._BY_KEY.update(pass_cases)
    outcomes = [power._one(key, seed, 30, 10)[2] for seed in (0, 1)]
    assert all(o.caught and o.law == "determinism" and 1 <= o.examples <= 30 for o in outcomes)
    r = power.row(pass_cases[key], outcomes)
    assert (r["caught"], r["seeds"], r["laws"]) == (2, 2, {"determinism": 2})
    text = power.table([r], markdown=True)
    assert text.splitlines()[0].startswith("| source | name |")
    assert "| caught 2/2 |" in text and "| determinism |" in text


def test_a_twin_reports_its_pass_rate_and_the_programs_it_changed(pass_cases):
    key = "pass:planted_bugs:correct_cse"  # (merges in most draws: a fold finds few at 30)
    outcome = pass_cases[key].run(3, 30)
    assert not outcome.caught and outcome.examples == 30 and outcome.changed >= 1
    text = power.table([power.row(pass_cases[key], [outcome])], markdown=False)
    assert "passed 1/1" in text and f"{outcome.changed} changed" in text


def test_a_case_without_programs_runs_as_its_test_does_with_no_programs_argument(monkeypatch):
    """A planted bug whose test gives no ``programs=`` is measured the same way: with none, so
    ``check_laws`` spends the budget as a user's call does (the default programs, then the
    pass's own targets); a case that draws its own programs passes them on. The examples to
    the first catch are the violation's ``tried``."""
    from lowering import pass_laws

    seen = []

    def recording(fn, **kwargs):
        seen.append(kwargs)
        caught = pass_laws.LawViolation("semantics", fn, "planted", None)
        caught.tried = 7
        raise caught

    monkeypatch.setattr(pass_laws, "check_laws", recording)
    mine = object()
    assert power._laws_run(lambda p: p, {})(3, 20) == power.Outcome(True, "semantics", 7)
    power._laws_run(lambda p: p, {"programs": mine})(3, 20)
    power._laws_run(lambda p: p, {}, mine)(3, 20)
    assert "programs" not in seen[0] and seen[0]["seed"] == 3
    assert seen[1]["programs"] is mine and seen[2]["programs"] is mine
