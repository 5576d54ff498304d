"""The wheel's run-time files, listed from the source tree (``.ci/check_wheel.py``; ``.ci/run``
builds the wheel, installs it and runs the same lister against the installed packages).

On the source tree: the data files purefx reads at run time are listed, and every one is
matched by a ``package-data`` glob (no build). On planted trees: a new data file without a glob,
a data file outside any package, a module directory without ``__init__.py`` and a file a module
names outside the packages are each one problem naming the file; the installed-package check
names a file missing from, or different in, an "installed" copy.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("check_wheel", ROOT / ".ci" / "check_wheel.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_wheel", module)
    spec.loader.exec_module(module)
    return module


check_wheel = _load()

PYPROJECT = """
[tool.setuptools.packages.find]
include = ["pkg*"]

[tool.setuptools.package-data]
"pkg.sub" = ["table.json"]
"""


def _tree(tmp_path: Path, files: dict[str, str], pyproject: str = PYPROJECT) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pyproject.toml").write_text(pyproject)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


GOOD = {
    "pkg/__init__.py": "",
    "pkg/sub/__init__.py": "",
    "pkg/sub/read.py": 'from pathlib import Path\nT = Path(__file__).with_name("table.json")\n',
    "pkg/sub/table.json": "{}",
    "outside/notes.txt": "not a package: not listed",
}


@pytest.fixture(scope="module")
def source_files():
    return check_wheel.runtime_files(ROOT)


def test_the_source_tree_lists_its_data_and_ships_all_of_it(source_files):
    files = source_files
    assert {"transforms/rewrite/shipped_verdicts.json", "ir/strategies/model_ops.json"} <= set(
        files.data)
    assert not any(name.endswith(".py") for name in files.data)
    assert {"ir", "transforms.rewrite", "lowering.fuzz"} <= set(files.packages)
    assert "transforms/rewrite/verdict_store.py" in files.code
    assert files.problems == ()


def test_a_good_tree_has_no_problem(tmp_path):
    files = check_wheel.runtime_files(_tree(tmp_path, GOOD))
    assert files.data == ("pkg/sub/table.json",)
    assert files.code == ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/read.py")
    assert files.problems == ()


@pytest.mark.parametrize("extra, named", [
    ({"pkg/sub/new.bin": "x"}, "pkg/sub/new.bin"),            # data without a glob
    ({"pkg/helpers/mod.py": ""}, "pkg/helpers/mod.py"),        # no __init__.py
    ({"pkg/sub/far.py": 'X = "outside/data.csv"\n', "outside/data.csv": "1"}, "outside/data.csv"),
])
def test_what_the_wheel_would_leave_out_is_one_problem_naming_it(tmp_path, extra, named):
    files = check_wheel.runtime_files(_tree(tmp_path, {**GOOD, **extra}))
    assert len(files.problems) == 1 and named in files.problems[0], files.problems


def test_a_docstring_naming_a_file_is_no_problem(tmp_path):
    extra = {"pkg/sub/doc.py": '"""See outside/notes.txt."""\n'}
    assert check_wheel.runtime_files(_tree(tmp_path, {**GOOD, **extra})).problems == ()


def test_the_installed_check_names_a_missing_and_a_changed_file(tmp_path, monkeypatch):
    source = _tree(tmp_path / "src", GOOD)
    files = check_wheel.runtime_files(source)
    site = tmp_path / "site"
    shutil.copytree(source / "pkg", site / "pkg")
    monkeypatch.syspath_prepend(str(site))
    for name in [n for n in sys.modules if n == "pkg" or n.startswith("pkg.")]:
        monkeypatch.delitem(sys.modules, name)
    assert check_wheel.installed_problems(files, source) == []
    (site / "pkg/sub/table.json").unlink()
    (site / "pkg/sub/read.py").write_text("# edited\n")
    problems = check_wheel.installed_problems(files, source)
    assert len(problems) == 2
    assert "pkg/sub/table.json: missing" in problems[1] and "other bytes" in problems[0]


def test_the_installed_check_refuses_the_source_tree_itself(source_files):
    spec = importlib.util.find_spec("ir")
    if not Path(spec.origin).resolve().is_relative_to(ROOT):
        pytest.skip("ir imports from elsewhere here")
    problems = check_wheel.installed_problems(source_files, ROOT)
    assert problems and all("source tree" in p for p in problems[:3])
