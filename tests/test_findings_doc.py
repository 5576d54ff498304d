"""``docs/findings.md`` stays honest: every finding has its fields, a kind (a bug: wrong value,
crash on valid input, unkept promise; or a deviation, not counted as a bug) that the summary
repeats and counts, and a repro that needs torch alone; (nightly, on torch 2.13) every repro still
fails the way the page says it does."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "findings.md"
FIELDS = ("component", "torch", "device", "kind", "what is wrong", "expected", "got", "upstream")
BUG_KINDS = ("wrong value", "crash on valid input", "unkept promise")  # counted as bugs
KINDS = BUG_KINDS + ("deviation",)  # a different valid choice or a bad message: not a bug
# the page's count: "**21 findings: 16 bugs (11 wrong values, 5 crashes on valid input, 0 unkept
# promises) and 5 deviations**", its words wrapped over lines anywhere
COUNT = re.compile(
    r"\*\*(\d+) findings: (\d+) bugs \((\d+) wrong values?, (\d+) crash(?:es)? on valid input,"
    r" (\d+) unkept promises?\) and (\d+) deviations?\*\*")
# a repro's code block, then the line that says how it fails
REPRO = re.compile(r"```python\n(.*?)```\n\nFails with: `([^`]+)`", re.DOTALL)
MAX_LINES = 20  # "under 20 lines where shrinking allows": a longer one must be argued for


def _findings() -> list[tuple[str, str]]:
    """``(title, section text)`` for each numbered ``## N.`` section of the page."""
    parts = re.split(r"^## (?=\d+\. )", DOC.read_text(), flags=re.MULTILINE)[1:]
    return [(p.split("\n", 1)[0], p) for p in parts]


def _kind(text: str) -> str:
    """The kind a cell names: the one of ``KINDS`` it starts with (its detail follows)."""
    kinds = [k for k in KINDS if text.startswith(k)]
    assert len(kinds) == 1, f"{text[:60]!r} does not start with one of {KINDS}"
    return kinds[0]


def _entry_kinds() -> dict[int, str]:
    """``{finding number: kind}`` from each finding's own ``| kind | ... |`` row."""
    out = {}
    for title, text in _findings():
        row = re.search(r"^\| kind \| (.+) \|$", text, re.MULTILINE)
        assert row, f"{title}: no kind row"
        out[int(title.split(".", 1)[0])] = _kind(row.group(1))
    return out


def _summary_kinds() -> dict[int, str]:
    """``{finding number: kind}`` from the summary table (its ``kind`` column)."""
    summary = DOC.read_text().split("## Summary", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in summary.splitlines() if line.startswith("| # |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("kind")
    out = {}
    for line in summary.splitlines():
        if re.match(r"\| \d+ \| ", line):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            out[int(cells[0])] = _kind(cells[column])
    return out


def _repros() -> list:
    """One ``pytest.param(id, code, failure text)`` for every repro of every finding."""
    out = []
    for title, text in _findings():
        number = title.split(".", 1)[0]
        for i, (code, fails) in enumerate(REPRO.findall(text)):
            ident = f"{number}{'abcdef'[i]}"
            out.append(pytest.param(ident, code, fails, id=ident))
    return out


def _imported_roots(code: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    return roots


def test_the_page_lists_at_least_three_findings_each_with_every_field_and_a_repro() -> None:
    findings = _findings()
    assert len(findings) >= 3
    for title, text in findings:
        rows = {m.group(1) for m in re.finditer(r"^\| ([a-z ]+) \| .+ \|$", text, re.MULTILINE)}
        assert set(FIELDS) <= rows, (title, set(FIELDS) - rows)
        assert REPRO.search(text), f"{title}: no ```python block followed by 'Fails with: `...`'"
    assert [t.split(".", 1)[0] for t, _ in findings] == [str(i + 1) for i in range(len(findings))]


def test_each_finding_has_one_kind_and_the_summary_repeats_it():
    entries = _entry_kinds()
    assert _summary_kinds() == entries


def test_the_page_counts_as_bugs_only_wrong_values_crashes_and_unkept_promises():
    counts = COUNT.search(" ".join(DOC.read_text().split()))
    assert counts, "no '**N findings: B bugs (...) and D deviations**' line"
    total, bugs, wrong, crashes, promises, deviations = map(int, counts.groups())
    kinds = list(_entry_kinds().values())
    assert total == len(kinds)
    assert (wrong, crashes, promises) == tuple(kinds.count(k) for k in BUG_KINDS)
    assert bugs == wrong + crashes + promises == sum(k in BUG_KINDS for k in kinds)
    assert deviations == kinds.count("deviation") == total - bugs


@pytest.mark.parametrize(("ident", "code", "fails"), _repros())
def test_each_repro_is_python_that_imports_torch_and_the_standard_library_only(ident, code, fails):
    roots = _imported_roots(code)
    assert "torch" in roots, ident
    assert roots <= {"torch"} | set(sys.stdlib_module_names), (ident, roots)
    assert "purefx" not in code and "import ir" not in code, ident
    assert len(code.strip().splitlines()) <= MAX_LINES, ident
    assert fails.strip(), ident


@pytest.mark.nightly
@pytest.mark.skipif(not torch.__version__.startswith("2.13."), reason="the page is about torch 2.13")
@pytest.mark.parametrize(("ident", "code", "fails"), _repros())
def test_each_repro_still_fails_as_written(ident, code, fails, tmp_path):
    script = tmp_path / f"repro_{ident}.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, "-W", "ignore", str(script)], check=False,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode != 0, f"{ident}: the repro ran clean: the bug may be fixed"
    assert fails in run.stdout + run.stderr, (ident, (run.stdout + run.stderr)[-2000:])
