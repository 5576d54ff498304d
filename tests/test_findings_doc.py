"""``docs/findings.md`` stays honest: every finding has its fields and a repro that needs torch
alone, and (nightly, on torch 2.13) every repro still fails the way the page says it does."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "findings.md"
FIELDS = ("component", "torch", "device", "what is wrong", "expected", "got", "upstream")
# a repro's code block, then the line that says how it fails
REPRO = re.compile(r"```python\n(.*?)```\n\nFails with: `([^`]+)`", re.DOTALL)
MAX_LINES = 20  # "under 20 lines where shrinking allows": a longer one must be argued for


def _findings() -> list[tuple[str, str]]:
    """``(title, section text)`` for each numbered ``## N.`` section of the page."""
    parts = re.split(r"^## (?=\d+\. )", DOC.read_text(), flags=re.MULTILINE)[1:]
    return [(p.split("\n", 1)[0], p) for p in parts]


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
