"""The public law-checking API: usable in three lines, each law usable alone, clear errors."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, settings

from ir.errors import PassError
from ir.strategies import programs
from transforms.laws import (
    LAWS,
    LawViolation,
    check_determinism,
    check_idempotence,
    check_laws,
    check_program,
    check_purity,
    check_semantics,
    check_verify,
)

FIND = settings(database=None, derandomize=True, max_examples=500,
                suppress_health_check=list(HealthCheck))


def a_program(condition=lambda p: True):
    return find(programs(), condition, settings=FIND)


def test_three_lines_check_a_new_rewrite():
    from transforms.laws import check_laws

    def my_rewrite(p):
        return p.replace()  # a rewrite that changes nothing

    report = check_laws(my_rewrite, max_examples=20, allow_vacuous=True)
    assert (report.tried, report.changed, report.declined) == (20, 0, 0)


def test_a_pass_that_changes_nothing_fails_as_vacuous():
    def my_rewrite(p):
        return p.replace()

    with pytest.raises(LawViolation, match="VACUOUS: the pass changed none of the 20 programs"
                       ) as caught:
        check_laws(my_rewrite, max_examples=20)
    assert caught.value.law == "vacuous" and "allow_vacuous=True" in str(caught.value)


def test_law_violation_is_an_assertion_error_that_names_the_law():
    def breaks_verify(p):
        return p.replace(state_order=p.state_order + ("nowhere",))

    with pytest.raises(AssertionError) as caught:
        check_laws(breaks_verify, max_examples=20)
    assert isinstance(caught.value, LawViolation)
    assert caught.value.law == "verify"
    assert "law 'verify' broken by " in str(caught.value)


def test_each_law_can_be_checked_alone_without_hypothesis():
    p = a_program(lambda p: len(p.state) > 0)

    def identity(q):
        return q

    assert check_purity(identity, p) is p
    assert check_verify(identity, p) is p
    assert check_determinism(identity, p) is p
    assert check_semantics(identity, p) is p
    assert check_idempotence(identity, p) is p
    assert check_program(identity, p, idempotent=True) is p


def test_a_pass_may_decline_programs_with_allowed_errors():
    def no_state(p):
        if p.state:
            raise PassError("this pass takes programs without state")
        return p

    with pytest.raises(LawViolation) as caught:
        check_laws(no_state, max_examples=50)
    assert caught.value.law == "raises" and "without state" in str(caught.value)
    report = check_laws(no_state, max_examples=50, allowed_errors=(PassError,),
                        allow_vacuous=True)
    assert report.declined > 0 and report.changed == 0


def test_a_subset_of_laws_can_be_checked():
    def prints(p):
        print("hello")
        return p

    check_laws(prints, laws=("verify", "determinism"), max_examples=10, allow_vacuous=True)
    with pytest.raises(LawViolation, match="printed 'hello"):
        check_laws(prints, laws=("purity",), max_examples=10)


def test_other_program_strategies_can_be_given():
    check_laws(lambda p: p, programs=programs(features=()), max_examples=10,
               allow_vacuous=True)


def test_the_message_shows_the_shrunk_program_and_its_module_stacks():
    def refuses_module_calls(p):
        if any(len(n.meta.get("nn_module_stack", ())) > 1 for n in p.root_module.graph.nodes):
            raise PassError("refused")
        return p

    with pytest.raises(LawViolation) as caught:
        check_laws(refuses_module_calls, max_examples=100)
    assert caught.value.law == "raises"
    text = str(caught.value)
    assert "module stacks:\n    <root> graph 0 %" in text and ": m0" in text
    assert caught.value.program.root_module.graph.compute_count() == 1  # shrunk


@pytest.mark.parametrize(
    "kwargs",
    [{"laws": ("purity", "kindness")}, {"laws": "purity"}, {"max_examples": 0},
     {"atol": -1.0}, {"rtol": "1e-3"}, {"atol": True}],
)
def test_bad_arguments_are_rejected(kwargs):
    with pytest.raises(ValueError):
        check_laws(lambda p: p, **kwargs)


def test_every_law_has_a_checker():
    assert LAWS == ("purity", "verify", "determinism", "semantics", "idempotence")
