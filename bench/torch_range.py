"""The torch versions purefx supports, read from the one place that says so: the ``torch``
requirement of ``pyproject.toml`` (``torch>=2.13,<2.16``), or of the installed distribution's
metadata where there is no ``pyproject.toml`` beside the code.

    python3 -m bench.torch_range            # prints the specifier, e.g. ">=2.13,<2.16"

``.ci/run`` installs the newest torch it allows; ``bench.cuda`` runs AOTInductor only on a
torch inside it. Standard library only, imports no torch.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|~=|>|<)\s*([0-9][0-9.]*)\s*$")


def torch_spec(root: Path = ROOT) -> str:
    """The specifier of purefx's ``torch`` requirement, as written (``">=2.13,<2.16"``).
    Raises ``LookupError`` when neither ``pyproject.toml`` nor the installed metadata has
    one. O(size of pyproject.toml)."""
    requirements: list[str] = []
    path = root / "pyproject.toml"
    if path.exists():
        import tomllib

        with open(path, "rb") as f:
            requirements = tomllib.load(f).get("project", {}).get("dependencies", [])
    else:  # pragma: no cover - an installed purefx without its source tree
        import importlib.metadata

        requirements = importlib.metadata.requires("purefx") or []
    for req in requirements:
        found = re.match(r"^\s*torch\s*([^;]*)", req)
        if found and not re.match(r"^\s*torch[\w-]", req):
            return found.group(1).strip().replace(" ", "")
    raise LookupError(f"no torch requirement in {path} or in purefx's installed metadata")


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a torch version string: ``"2.14.1+cu130"`` -> ``(2, 14, 1)``,
    ``"2.11.0a0+git1234"`` -> ``(2, 11, 0)``. Raises ``ValueError`` for a string that does
    not start with one. O(len(version))."""
    found = re.match(r"^\s*(\d+(?:\.\d+)*)", version)
    if not found:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(x) for x in found.group(1).split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def _clauses(spec: str) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for part in spec.split(","):
        found = _CLAUSE.match(part)
        if not found:
            raise ValueError(f"cannot read the clause {part!r} of {spec!r} (expected e.g. "
                             "'>=2.13' or '<2.16')")
        out.append((found.group(1), release(found.group(2))))
    return out


def allows(version: str, spec: str) -> bool:
    """Whether torch ``version`` (its release numbers; a local or pre-release tag is ignored)
    meets every clause of ``spec`` (``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=``). O(clauses)."""
    v = release(version)
    tests = {">=": lambda c: c >= 0, ">": lambda c: c > 0, "<=": lambda c: c <= 0,
             "<": lambda c: c < 0, "==": lambda c: c == 0, "!=": lambda c: c != 0,
             "~=": lambda c: c >= 0}
    return all(tests[op](_cmp(v, bound)) for op, bound in _clauses(spec))


def outside(version: str, spec: str) -> str | None:
    """``None`` where ``spec`` allows torch ``version``, else why not, in the words of a table
    cell: ``"torch 2.11 is below the supported range (>=2.13,<2.16)"`` (it fails a lower
    bound) or ``"... is above ..."`` / ``"... is outside ..."``. O(clauses)."""
    if allows(version, spec):
        return None
    v = release(version)
    short = ".".join(str(x) for x in v[:2])
    low = any(op in (">=", ">", "~=") and not allows(version, f"{op}{'.'.join(map(str, b))}")
              for op, b in _clauses(spec))
    high = any(op in ("<", "<=") and not allows(version, f"{op}{'.'.join(map(str, b))}")
               for op, b in _clauses(spec))
    where = "below" if low else "above" if high else "outside"
    return f"torch {short} is {where} the supported range ({spec})"


if __name__ == "__main__":
    print(torch_spec())
    sys.exit(0)
