"""The layering of purefx, held by an import check (source is parsed with ``ast``, never imported).

The rule (``ir`` <- ``transforms`` <- ``lowering``), each layer importing only itself and the
layers below it:

- ``ir`` imports nothing from ``transforms`` or ``lowering``: the values know no pass;
- ``transforms`` imports ``ir`` (and itself): a pass is a function of IR values;
- ``lowering`` imports ``ir`` and ``transforms`` (and itself): building torch objects may run
  passes (``export_ep`` inlines, the command line runs the pipeline and lowers its result, the
  laws, ``lowering/laws.py``, lower programs to compare them with torch).

A module that has to sit on top of all three layers is named in ``ON_TOP`` with the reason:
it may import any layer, and nothing inside the three layers may import it (an import of an
on-top module is an upward import like any other), except the one package that re-exports it
under the name its issue fixed (``RE_EXPORTED``).

``bench/`` and ``tests/`` are outside the layers (they use all three); ``tests/`` may import
``bench/``, never the other way. Imports anywhere in a module count, also those inside
functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("ir", "transforms", "lowering")
ALLOWED = {
    "ir": {"ir"},
    "transforms": {"ir", "transforms"},
    "lowering": {"ir", "transforms", "lowering"},
}
ON_TOP: dict[str, str] = {
    "ir/strategies/like.py": (
        "programs_like(source) draws the user's own program in its outlined and decomposed "
        "forms too, which are transforms.transform's and lowering.export_ep's; the strategy "
        "is test support that the laws (lowering) consume, not IR"
    ),
}
RE_EXPORTED: dict[str, str] = {"ir/strategies/like.py": "ir/strategies/__init__.py"}


def layer_imports(path: Path, root: Path = ROOT) -> set[str]:
    """The purefx packages (``ir``, ``transforms``, ``lowering``) that ``path`` (a file under
    ``root``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom):
            names = [path.relative_to(root).parts[0]]  # a relative import stays in its package
        else:
            continue
        found.update(n.split(".")[0] for n in names if n.split(".")[0] in LAYERS)
    return found


def imported_modules(path: Path) -> set[str]:
    """Every dotted module name ``path`` imports (``from a.b import c`` gives ``a.b`` and
    ``a.b.c``: ``c`` may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def layer_files() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", layer_files(), ids=rel)
def test_each_module_imports_only_its_layer_and_those_below(path):
    if rel(path) in ON_TOP:
        return
    layer = path.relative_to(ROOT).parts[0]
    upward = layer_imports(path) - ALLOWED[layer]
    assert not upward, (
        f"{rel(path)} (layer {layer!r}) imports {sorted(upward)}; the layering is "
        f"ir <- transforms <- lowering. Move the code, or name the module in ON_TOP with why."
    )


def test_no_module_inside_the_layers_imports_an_on_top_module():
    on_top = {name.removesuffix(".py").replace("/", ".") for name in ON_TOP}
    for path in layer_files():
        if rel(path) in ON_TOP:
            continue
        reached = imported_modules(path) & on_top
        reached -= {name.removesuffix(".py").replace("/", ".")
                    for name, by in RE_EXPORTED.items() if by == rel(path)}
        assert not reached, f"{rel(path)} imports {sorted(reached)}, which sit on top of the layers"


@pytest.mark.parametrize("name", sorted(ON_TOP))
def test_each_named_exception_is_still_needed(name):
    """An ON_TOP entry that no longer imports upward must leave the list (it would hide a
    future upward import)."""
    path = ROOT / name
    assert path.exists(), f"{name} is named in ON_TOP but does not exist; remove it from the list"
    layer = path.relative_to(ROOT).parts[0]
    assert layer_imports(path) - ALLOWED[layer], (
        f"{name} imports only its own layer and those below now; remove it from ON_TOP"
    )


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    # the probe lives outside the tree: a file in transforms/ would be seen by the scans that
    # other tests (other xdist workers) run at the same time
    probe = tmp_path / "transforms" / "_probe_lazy_import.py"
    probe.parent.mkdir()
    probe.write_text("def f():\n    from lowering import lower\n    return lower\n")
    assert layer_imports(probe, root=tmp_path) == {"lowering"}


# --- no module reads another module's private names -------------------------------------------


def module_name(path: Path, root: Path = ROOT) -> str:
    """``ir/import_ep.py`` -> ``ir.import_ep`` (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path, root: Path = ROOT) -> list[str]:
    """The private names (``_x``, not dunders) of *other* purefx modules that ``path`` (a file
    under ``root``) reads: ``from pkg.mod import _x``, and ``mod._x`` where ``mod`` names an
    imported purefx module."""
    own = module_name(path, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    modules: dict[str, str] = {}  # local name -> purefx module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in LAYERS:
                continue
            for a in node.names:
                if node.module != own and _private(a.name):
                    found.append(f"from {node.module} import {a.name}")
                modules[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LAYERS:
                    modules[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and modules[node.value.id] != own
        ):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return sorted(set(found))


def test_private_use_finder_has_teeth(tmp_path: Path) -> None:
    probe = tmp_path / "transforms" / "_probe_private_use.py"  # outside the tree, as above
    probe.parent.mkdir()
    source = "from ir.import_ep import _x\nimport ir.ops as o\nfrom ir import ops\nops._y\no._z\n"
    probe.write_text(source)
    assert private_uses(probe, root=tmp_path) == [
        "from ir.import_ep import _x", "ir.ops._y", "ir.ops._z"
    ]


@pytest.mark.parametrize("path", layer_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reads_another_modules_private_names(path: Path) -> None:
    """A private name is its module's own: renaming it must never break another module. Share
    it as a public, documented function instead."""
    assert private_uses(path) == [], f"{path.relative_to(ROOT)} reads private names of others"


# --- bench/ never imports tests/ ------------------------------------------------------------------


def test_bench_never_imports_tests() -> None:
    """``tests/`` may use ``bench/`` (the stage cases live in ``bench/stage_cases.py``), never
    the other way: a benchmark must run from a tree without the test suite."""
    for path in sorted((ROOT / "bench").rglob("*.py")):
        reached = {m for m in imported_modules(path) if m.split(".")[0] == "tests"}
        assert not reached, f"{rel(path)} imports {sorted(reached)}; move the shared code to bench/"
