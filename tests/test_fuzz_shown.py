"""A finding is confirmed only by its repro showing a difference of the finding's own kind
(``lowering.fuzz.shown``): a crash of the same exception type, an input eager refuses, a
gradient, a value. Another difference the repro happens to show leaves it unconfirmed, and says
which."""

from __future__ import annotations

import pytest
import torch

from ir import import_ep
from lowering.fuzz import Finding
from lowering.fuzz.backends import resolve
from lowering.fuzz.confirmed import why_unconfirmed
from lowering.fuzz.repro import shortest_repro
from lowering.fuzz.search import with_repro
from lowering.fuzz.shown import (
    CRASH,
    GRADIENT,
    REFUSED,
    VALUE,
    finding_class,
    sentence_class,
    shows,
)

VALUE_SENTENCE = "output 0: 3 of 12 values differ, largest by 1; first at flat index 0: got 1.0"
CRASH_SENTENCE = "crash: RuntimeError: the backend broke"
REFUSED_SENTENCE = "the backend accepts an input eager refuses (eager: IndexError: out of range)"
GRADIENT_SENTENCE = "gradient of input 0: 1 of 4 values differ, largest by 2"


@pytest.mark.parametrize(("sentence", "expected"), [
    (VALUE_SENTENCE, VALUE),
    ("input 1: got tensor([1.]), eager gives tensor([2.])", VALUE),
    ("state 'w': 1 of 4 values differ", VALUE),
    ("2 outputs, eager gives 3", VALUE),
    (CRASH_SENTENCE, CRASH),
    (REFUSED_SENTENCE, REFUSED),
    (GRADIENT_SENTENCE, GRADIENT),
    ("call 1 (s0=3): gradient of parameter 'w': 1 of 4 values differ", GRADIENT),
    ("call 2 (s0=5, s1=2): output 0: 1 of 4 values differ", VALUE),
    ("call 1 (s0=3): crash: ValueError: no", CRASH),
])
def test_each_sentence_difference_writes_has_its_class(sentence, expected):
    assert sentence_class(sentence) == expected


@pytest.mark.parametrize(("kind", "detail", "expected"), [
    ("mismatch", "output 0: 3 of 12 values differ", VALUE),
    ("mismatch", "the backend accepts an input eager refuses (IndexError: x)", REFUSED),
    ("crash", "RuntimeError: x", CRASH),
    ("grad_crash", "the backward raises RuntimeError: x", CRASH),
    ("grad", "gradient of input 0: 1 of 4 values differ", GRADIENT),
])
def test_each_finding_has_its_class(kind, detail, expected):
    assert finding_class(kind, detail) == expected


def test_only_a_sentence_of_the_findings_kind_shows_it():
    assert shows("mismatch", "output 0: x", [VALUE_SENTENCE])
    assert not shows("mismatch", "output 0: x", [CRASH_SENTENCE, GRADIENT_SENTENCE])
    assert not shows("mismatch", "output 0: x", [REFUSED_SENTENCE])
    assert shows("mismatch", REFUSED_SENTENCE, [REFUSED_SENTENCE])
    assert not shows("mismatch", REFUSED_SENTENCE, [VALUE_SENTENCE])
    assert shows("grad", "gradient of input 0: x", [VALUE_SENTENCE, GRADIENT_SENTENCE])
    assert not shows("grad", "gradient of input 0: x", [VALUE_SENTENCE])
    assert not shows("crash", "RuntimeError: the backend broke", [VALUE_SENTENCE])
    for kind in ("mismatch", "crash", "grad", "grad_crash"):
        assert not shows(kind, "RuntimeError: x", [])


def test_a_crash_is_shown_only_by_a_crash_of_its_exception_type():
    assert shows("crash", "RuntimeError: the backend broke", [CRASH_SENTENCE])
    assert not shows("crash", "ValueError: the backend broke", [CRASH_SENTENCE])
    assert shows("grad_crash", "the backward raises RuntimeError: no grad",
                 ["call 1 (s0=3): " + CRASH_SENTENCE])
    assert not shows("grad_crash", "the backward raises TypeError: no grad", [CRASH_SENTENCE])
    assert shows("crash", "a detail naming no type", [CRASH_SENTENCE])


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2


@pytest.fixture(scope="module")
def program():
    return import_ep(torch.export.export(Scale(), (torch.randn(3, 4),)))


def _wrong_values(module):
    def run(x):
        out = module(x)
        return tuple(o + 1 for o in out) if isinstance(out, tuple) else out + 1
    return run


def _raises_value_error(module):
    def run(x):
        raise ValueError("the backend refuses this")
    return run


def _finding(program, backend, kind, detail) -> Finding:
    [compiler] = resolve({"b": backend})
    return Finding("b", kind, detail, program=program, args=(torch.randn(3, 4),),
                   cause="aten.mul.Tensor", compiler=compiler)


def test_a_crash_finding_whose_repro_shows_wrong_values_is_unconfirmed(program):
    found = with_repro(_finding(program, _wrong_values, "crash", "RuntimeError: it broke"))
    assert found.repro and found.reproduced is False
    assert found.repro_shows and sentence_class(found.repro_shows[0]) == VALUE
    assert why_unconfirmed(found).startswith("its repro shows another difference: output 0")


def test_a_value_finding_whose_repro_crashes_is_unconfirmed(program):
    found = with_repro(_finding(program, _raises_value_error, "mismatch", "output 0: x"))
    assert found.reproduced is False
    assert found.repro_shows == ("crash: ValueError: the backend refuses this",)


def test_a_crash_of_another_type_is_unconfirmed_and_of_its_own_type_confirmed(program):
    other = with_repro(_finding(program, _raises_value_error, "crash", "RuntimeError: x"))
    same = with_repro(_finding(program, _raises_value_error, "crash", "ValueError: x"))
    assert other.reproduced is False and same.reproduced is True


def test_a_value_finding_whose_repro_shows_it_is_confirmed(program):
    found = with_repro(_finding(program, _wrong_values, "mismatch", "output 0: x"))
    assert found.reproduced is True and why_unconfirmed(found) != ""
    assert all(sentence_class(s) == VALUE for s in found.repro_shows)


def test_shortest_repro_goes_on_to_the_exact_script_when_the_short_one_shows_another_kind(
        program):
    args = (torch.randn(40, 40),)
    big = import_ep(torch.export.export(Scale(), args))
    seen = []

    def only_the_exact_one(problems):
        seen.append(list(problems))
        return False

    text, problems = shortest_repro(big, args, {}, {}, target="callable", summary="s",
                                    compile=_wrong_values, shows=only_the_exact_one)
    assert len(seen) == 2 and all(seen), "both scripts ran and each showed the wrong values"
    assert problems == seen[-1]  # the exact script's own problems are returned
    assert "uniform(" not in text  # the exact script, kept as the last tried
    text, _ = shortest_repro(big, args, {}, {}, target="callable", summary="s",
                             compile=_wrong_values)
    assert "uniform(" in text  # by default the short one, which shows a difference, is kept
