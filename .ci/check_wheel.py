"""What a built purefx wheel must carry, and the checks that an installed purefx carries it.

    python3 .ci/check_wheel.py files [ROOT]          # list the run-time files of the source tree
    VENV/bin/python .ci/check_wheel.py installed ROOT   # each one installed in VENV, byte for byte
    VENV/bin/python .ci/check_wheel.py rewrite          # the shipped rules, from their shipped verdicts

The run-time files are read from the source tree (``ROOT``, default: this checkout), never
listed by hand: the packages are those ``pyproject.toml``'s ``[tool.setuptools.packages.find]``
selects (a directory with an ``__init__.py`` under a top-level directory it includes); their
files are every ``.py`` module, and as *data* every other file in a package's directory tree
(the shipped verdicts, the model operator counts, whatever is added next), git-tracked files
only where ``ROOT`` is a checkout. ``files`` also fails (exit 1) where the wheel would not carry
one: a data file no ``[tool.setuptools.package-data]`` glob of its package matches, a
directory of ``.py`` modules without ``__init__.py`` (``find`` skips it), or a file that a
module names by a literal path (``"model_ops.json"`` beside it, or ``"bench/x.json"`` from the
root) that lies outside every package. ``tests/test_check_wheel.py`` runs this on the source
tree (no build).

``installed`` and ``rewrite`` run in a venv where the built wheel is installed (not editable;
``.ci/run`` builds it with ``python -m build`` and installs it): ``installed`` finds each
run-time file in the installed packages and compares its bytes with the source's;
``rewrite`` runs ``rewrite_report(p, RULES, assume=ATTENTION_ASSUMES)`` on a small model holding
a site of each shipped rule family, with an empty verdict store, and fails unless each family
rewrote, the lowered result runs like the model, and no rule was checked (every verdict came
from the shipped file: a missing or stale ``shipped_verdicts.json`` would have checked them and
filed them in the store). Both refuse to run where ``ir`` is imported from a source tree.

Standard library only (``files`` runs on the CI's bare ``python3``).
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


@dataclass(frozen=True)
class RuntimeFiles:
    """The run-time files of a source tree, as paths relative to its root (POSIX, sorted).

    ``packages``: dotted names of the packages the wheel holds; ``code``: their ``.py``
    modules; ``data``: every other file in a package's tree; ``problems``: one sentence per
    file the wheel would not carry (empty when it carries them all)."""

    packages: tuple[str, ...]
    code: tuple[str, ...]
    data: tuple[str, ...]
    problems: tuple[str, ...] = field(default=())


def _config(root: Path) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _tracked(root: Path) -> set[str] | None:
    """Files git tracks under ``root`` (POSIX, relative), ``None`` where ``root`` is no
    checkout (then every file on disk counts)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = {n for n in out.decode().split("\0") if n}
    return names or None


def _walk(top: Path) -> list[Path]:
    found = []
    for path in sorted(top.rglob("*")):
        rel = path.relative_to(top)
        if any(part in _SKIP_DIRS for part in rel.parts) or path.suffix in _SKIP_SUFFIXES:
            continue
        if path.is_file():
            found.append(path)
    return found


def runtime_files(root: Path = ROOT) -> RuntimeFiles:
    """The run-time files of the source tree at ``root`` and the problems that would keep one
    out of the wheel (see the module docstring). Reads ``pyproject.toml`` and the tree; runs
    no build. O(files + size of the modules' source)."""
    root = root.resolve()
    conf = _config(root).get("tool", {}).get("setuptools", {})
    find = conf.get("packages", {}).get("find", {})
    include, exclude = find.get("include", ["*"]), find.get("exclude", [])
    globs: dict[str, list[str]] = conf.get("package-data", {})
    tracked = _tracked(root)

    def rel(path: Path) -> str:
        return path.relative_to(root).as_posix()

    tops = sorted(d for d in root.iterdir() if d.is_dir() and (d / "__init__.py").exists()
                  and _matches(d.name, include) and not _matches(d.name, exclude))
    packages: dict[str, Path] = {}
    code, data, problems = [], [], []
    for top in tops:
        for path in _walk(top):
            if tracked is not None and rel(path) not in tracked:
                continue
            parent = path.parent
            dotted = ".".join(parent.relative_to(root).parts)
            if path.suffix == ".py":
                if not (parent / "__init__.py").exists():
                    problems.append(f"{rel(path)}: its directory has no __init__.py, so "
                                    "setuptools' find does not ship it; add one")
                    continue
                if _matches(dotted, exclude) or not _matches(dotted, include):
                    continue
                packages[dotted] = parent
                code.append(rel(path))
            else:
                data.append(rel(path))
    for name in data:
        owner = _owner(root / name, packages)
        if owner is None:
            problems.append(f"{name}: lies in no package the wheel holds; move it into one")
            continue
        dotted, pdir = owner
        pats = globs.get(dotted, []) + globs.get("*", []) + globs.get("", [])
        if not any(root / name in set(pdir.glob(p)) for p in pats):
            problems.append(f"{name}: no [tool.setuptools.package-data] glob of package "
                            f"{dotted!r} matches it, so the wheel leaves it out; add "
                            f"\"{(root / name).relative_to(pdir).as_posix()}\" under "
                            f"\"{dotted}\" in pyproject.toml")
    shipped = set(code) | set(data)
    for module in code:
        for named in _named_files(root / module, root):
            if rel(named) not in shipped:
                problems.append(f"{module} names {rel(named)!r}, which the wheel does not "
                                "hold (it lies outside the packages); move it into a package "
                                "and list it in package-data")
    return RuntimeFiles(tuple(sorted(packages)), tuple(sorted(code)), tuple(sorted(data)),
                        tuple(dict.fromkeys(problems)))


def _owner(path: Path, packages: dict[str, Path]) -> tuple[str, Path] | None:
    """The innermost package whose directory holds ``path``."""
    best = None
    for dotted, pdir in packages.items():
        if path.is_relative_to(pdir) and (best is None or len(pdir.parts) > len(best[1].parts)):
            best = (dotted, pdir)
    return best


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            ids.add(id(body[0].value))
    return ids


def _named_files(module: Path, root: Path) -> list[Path]:
    """Existing non-``.py`` files that a string literal of ``module`` (docstrings aside) names
    by a relative path: beside the module or from ``root``."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) \
                or id(node) in skip:
            continue
        text = node.value
        if not text or len(text) > 200 or "\n" in text or text.endswith(".py") \
                or "." not in text.rsplit("/", 1)[-1] or text.startswith(("/", ".")):
            continue
        for base in (module.parent, root):
            candidate = base / text
            try:
                if candidate.is_file():
                    found.append(candidate.resolve())
                    break
            except OSError:
                continue
    return found


# --- in the venv that holds the installed wheel -------------------------------------------------


def installed_problems(files: RuntimeFiles, root: Path) -> list[str]:
    """One sentence per run-time file of ``files`` that the packages importable here lack or
    hold with other bytes than ``root``'s. Imports nothing of purefx (finds its packages with
    ``importlib.util.find_spec``). O(bytes of the files)."""
    import importlib.util

    tops: dict[str, Path | None] = {}
    for dotted in files.packages:
        top = dotted.split(".")[0]
        if top not in tops:
            spec = importlib.util.find_spec(top)
            where = None if spec is None or spec.origin is None else Path(spec.origin).parent
            tops[top] = where
    out = []
    for name in (*files.code, *files.data):
        top = name.split("/")[0]
        where = tops.get(top)
        if where is None:
            out.append(f"{name}: package {top!r} is not installed")
            continue
        if where.resolve().is_relative_to(root.resolve()):
            out.append(f"{name}: {top!r} imports from the source tree ({where}), not an "
                       "installed wheel: run from a venv where the wheel is installed")
            continue
        got = where / Path(name).relative_to(top)
        if not got.is_file():
            out.append(f"{name}: missing from the installed package ({got})")
        elif got.read_bytes() != (root / name).read_bytes():
            out.append(f"{name}: installed with other bytes than the source's ({got})")
    return out


def rewrite_check() -> list[str]:
    """Rewrite a small model with the shipped rules from the installed package (see the module
    docstring); one sentence per thing that went wrong. About 10 s on two cores."""
    import math
    import tempfile
    import time

    import torch
    from torch import nn

    import ir

    if Path(ir.__file__).resolve().is_relative_to(ROOT):
        return [f"ir imports from the source tree ({ir.__file__}): run from the wheel's venv"]
    from lowering import lower
    from transforms.rewrite import rewrite_report
    from transforms.rewrite_rules import ATTENTION_ASSUMES, RULES

    class Sites(nn.Module):
        """One site of each shipped rule family: conv + eval batch norm, relu(relu), x * 1,
        x * sigmoid(x), softmax attention with a divided score."""

        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, img: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(torch.relu(self.bn(self.conv(img)))) * 1
            x = x * torch.sigmoid(x)
            q, k, v = (f(x).view(2, 8, 2, 8).transpose(1, 2) for f in (self.q, self.k, self.v))
            a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v
            return y.sum() + a.sum()

    from ir import import_ep

    torch.manual_seed(0)
    model = Sites().eval()
    args = (torch.randn(2, 3, 8, 8), torch.randn(2, 8, 16))
    p = import_ep(torch.export.export(model, args))
    problems = []
    with tempfile.TemporaryDirectory() as store:
        start = time.perf_counter()
        q, report = rewrite_report(p, RULES, assume=ATTENTION_ASSUMES, verdicts=store)
        took = time.perf_counter() - start
        checked = sorted(x.name for x in Path(store).glob("*.json"))
    print(f"check_wheel: rewrite with the shipped rules in {took:.1f} s; {report}")
    families = {"relu_relu": ["relu_relu"], "times_one": ["times_one"], "silu": ["silu"],
                "conv_bn": ["conv_bn"],
                "attention": [n for n in report.counts if n.startswith("attention")]}
    for family, names in families.items():
        if not sum(report.counts.get(n, 0) for n in names):
            problems.append(f"the shipped rules rewrote no {family} site ({report})")
    if checked:
        problems.append(
            f"{len(checked)} rule verdict(s) were checked and filed instead of read from the "
            f"shipped verdicts (torch {torch.__version__}): transforms/rewrite/"
            "shipped_verdicts.json is missing from the wheel or holds no verdict for this torch")
    with torch.no_grad():
        got, want = lower(q)(*args), model(*args)
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
        problems.append(f"lower(rewrite(p)) gives {got.item()!r}, the model {want.item()!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """``files [ROOT]``, ``installed ROOT`` or ``rewrite`` (see the module docstring); exit
    status 1 with one line per problem, 2 for bad arguments."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("files", "installed", "rewrite"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    root = Path(rest[0]) if rest else ROOT
    if command == "rewrite":
        problems = rewrite_check()
    else:
        files = runtime_files(root)
        problems = list(files.problems)
        if command == "files":
            for name in files.data:
                print(f"data {name}")
            print(f"check_wheel: {len(files.packages)} packages, {len(files.code)} modules, "
                  f"{len(files.data)} data files")
        else:
            problems += installed_problems(files, root)
            print(f"check_wheel: {len(files.code)} modules and {len(files.data)} data files "
                  f"looked for in the installed packages")
    for line in problems:
        print(f"check_wheel: FAIL: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
