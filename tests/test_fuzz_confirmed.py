"""A fuzzer finding counts only where its own repro shows it again
(``lowering.fuzz.confirmed``): the repro can show every kind the judge makes, an input eager
refuses and the backend accepts included; the report and ``bench.fuzz_cuda`` list the
others apart as unconfirmed, and ``purefx fuzz`` exits 1 only for a confirmed one."""

from __future__ import annotations

import attrs
import pytest
import torch

from ir import import_ep
from lowering.fuzz import Finding
from lowering.fuzz.backends import resolve
from lowering.fuzz.command import report_text, write_report
from lowering.fuzz.confirmed import split, why_unconfirmed
from lowering.fuzz.search import FuzzReport, with_repro


class Pick(torch.nn.Module):
    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, idx) * 2


@pytest.fixture(scope="module")
def program():
    args = (torch.randn(3, 4), torch.tensor([0, 2]))
    return import_ep(torch.export.export(Pick(), args))


def _lenient(module):
    """A backend that never refuses: zeros of the eager result's shape for any index."""
    return lambda x, idx: torch.zeros(idx.shape[0], x.shape[1])


def _strict(module):
    return module


def _finding(program, backend, args) -> Finding:
    [compiler] = resolve({"b": backend})
    return Finding("b", "mismatch", "the backend accepts an input eager refuses (IndexError)",
                   program=program, args=args, cause="IndexError", compiler=compiler)


OUT_OF_RANGE = (torch.randn(3, 4), torch.tensor([0, 7]))


def test_an_input_eager_refuses_and_the_backend_accepts_is_shown_by_the_repro(program):
    found = with_repro(_finding(program, _lenient, OUT_OF_RANGE))
    assert found.reproduced is True
    assert "the backend accepts an input eager refuses" in found.repro


def test_both_refusing_is_no_difference_and_so_unconfirmed(program):
    found = with_repro(_finding(program, _strict, OUT_OF_RANGE))
    assert found.reproduced is False and found.repro
    assert why_unconfirmed(found) == "its repro does not show it when run again"


def test_split_partitions_in_order_and_says_why(program):
    base = _finding(program, _lenient, OUT_OF_RANGE)
    shown = attrs.evolve(base, reproduced=True, repro="x", cause="a")
    not_shown = attrs.evolve(base, reproduced=False, repro="x", cause="b")
    no_repro = attrs.evolve(base, reproduced=False, repro="", cause="c")
    not_run = attrs.evolve(base, reproduced=None, cause="d")
    confirmed, unconfirmed = split([not_shown, shown, no_repro, not_run])
    assert confirmed == (shown,) and unconfirmed == (not_shown, no_repro, not_run)
    assert [why_unconfirmed(f) for f in unconfirmed] == [
        "its repro does not show it when run again", "no repro could be written",
        "its repro was not run"]


def test_the_report_counts_confirmed_findings_and_lists_the_others_apart(program, tmp_path):
    base = _finding(program, _lenient, OUT_OF_RANGE)
    shown = attrs.evolve(base, reproduced=True, repro="# r\n", cause="aten.a")
    not_shown = attrs.evolve(base, reproduced=False, repro="# r\n", cause="aten.b")
    report = FuzzReport(findings=(not_shown, shown), examples=3, seconds=1.0, raw=2)
    assert "1 new confirmed by their repro, 1 unconfirmed" in report_text(report)
    text = write_report(report, str(tmp_path))
    lines = text.splitlines()
    first = lines.index("findings (each shown again by its own repro):")
    second = lines.index("unconfirmed (not counted; the repro does not show them here):")
    assert first < second
    assert "aten.a" in lines[first + 1] and "aten.b" in lines[second + 1]
    assert "(its repro does not show it when run again)" in lines[second + 1]
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2


def test_fuzz_cuda_lists_unconfirmed_findings_apart(program):
    from bench.fuzz_cuda import findings_lines

    base = _finding(program, _lenient, OUT_OF_RANGE)
    lines = findings_lines([attrs.evolve(base, reproduced=False, repro="# r\n"),
                            attrs.evolve(base, reproduced=True, repro="# r\n")])
    assert lines[0].startswith("  confirmed by its repro: b: mismatch")
    assert lines[1].startswith("  unconfirmed (its repro does not show it when run again; "
                               "not counted): b: mismatch")
