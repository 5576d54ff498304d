"""The layering of purefx, held by an import check (source is parsed with ``ast``, never imported).

The rule (``ir`` <- ``transforms`` <- ``lowering``), each layer importing only itself and the
layers below it:

- ``ir`` imports nothing from ``transforms`` or ``lowering``: the values know no pass;
- ``transforms`` imports ``ir`` (and itself): a pass is a function of IR values;
- ``lowering`` imports ``ir`` and ``transforms`` (and itself): building torch objects may run
  passes (``export_ep`` inlines, the command line runs the pipeline and lowers its result, the
  laws, ``lowering/pass_laws.py``, lower programs to compare them with torch, ``programs_like``,
  ``lowering/like.py``, draws the pipeline's forms).

One named door goes up (``DOORS``): ``transforms/laws.py``, the public path fixed for the law
checker, re-exports ``lowering.pass_laws`` (the semantics law lowers programs); it imports that
module alone from above, and no module of the three layers imports the door, so it closes no
cycle.

No import cycle among the modules of the three layers either (``test_no_import_cycle``). Inside
``ir``, the IR values (``IR_VALUES``) import only each other, and the test support
(``ir.strategies``, ``ir.harness``) is imported by no other module of ``ir``.

``bench/`` and ``tests/`` are outside the layers (they use all three); ``tests/`` may import
``bench/``, never the other way. Imports anywhere in a module count, also those inside
functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("ir", "transforms", "lowering")
ALLOWED = {
    "ir": {"ir"},
    "transforms": {"ir", "transforms"},
    "lowering": {"ir", "transforms", "lowering"},
}


DOORS = {"transforms/laws.py": frozenset({"lowering.pass_laws"})}
"""The doors: a module at a public path an earlier issue fixed whose implementation lives a layer
up, with the modules above its layer it may import (exactly these). No module of the layers
imports a door (``test_no_module_imports_a_door``)."""


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


def absolute_imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Each absolute import statement of ``path``, anywhere in it: the module it names and, for
    ``from m import a, b``, the names it takes (``()`` for ``import m``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, tuple(a.name for a in node.names)))
    return found


def imported_modules(path: Path) -> set[str]:
    """Every dotted module name ``path`` imports (``from a.b import c`` gives ``a.b`` and
    ``a.b.c``: ``c`` may be a module)."""
    found = set()
    for module, names in absolute_imports(path):
        found.add(module)
        found.update(f"{module}.{name}" for name in names)
    return found


def layer_files() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def upward_modules(path: Path, root: Path = ROOT) -> set[str]:
    """The modules above its layer that ``path`` (a file under ``root``) imports, as its import
    statements name them (``from lowering.pass_laws import x`` gives ``lowering.pass_laws``)."""
    allowed = ALLOWED[path.relative_to(root).parts[0]]
    found = {module for module, _ in absolute_imports(path)}
    return {m for m in found if m.split(".")[0] in LAYERS and m.split(".")[0] not in allowed}


@pytest.mark.parametrize("path", layer_files(), ids=rel)
def test_each_module_imports_only_its_layer_and_those_below(path):
    layer = path.relative_to(ROOT).parts[0]
    if rel(path) in DOORS:
        assert upward_modules(path) == DOORS[rel(path)], (
            f"{rel(path)} is a door: it imports exactly {sorted(DOORS[rel(path)])} from above"
        )
        return
    upward = layer_imports(path) - ALLOWED[layer]
    assert not upward, (
        f"{rel(path)} (layer {layer!r}) imports {sorted(upward)}; the layering is "
        f"ir <- transforms <- lowering. Move the code to the layer it needs."
    )


def test_each_door_is_there() -> None:
    for door in DOORS:
        assert (ROOT / door).is_file(), f"the door {door} is gone; update DOORS"


def test_no_module_imports_a_door() -> None:
    """A door is for users: the library imports the implementation, so a door's upward import
    never closes a cycle."""
    modules = module_files()
    doors = {module_name(ROOT / d) for d in DOORS}
    faults = sorted(f"{name} imports {door}" for name, path in modules.items()
                    for door in doors & set(import_edges(path, modules)))
    assert faults == [], "import the implementation, not the door"


def test_the_door_checker_has_teeth(tmp_path: Path) -> None:
    probe = tmp_path / "transforms" / "door.py"  # outside the tree, as the probes below
    probe.parent.mkdir()
    probe.write_text("from lowering.pass_laws import *\nimport lowering.cli\nimport ir.graph\n")
    assert upward_modules(probe, root=tmp_path) == {"lowering.pass_laws", "lowering.cli"}


# --- no two modules share a base name -------------------------------------------------------------


def shared_base_names(paths: Iterable[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Base name -> the modules (``__init__`` aside) that have it, for names more than one has."""
    by_name: dict[str, list[str]] = {}
    for p in paths:
        if p.name != "__init__.py":
            by_name.setdefault(p.stem, []).append(p.relative_to(root).as_posix())
    return {name: sorted(found) for name, found in sorted(by_name.items()) if len(found) > 1}


def test_no_two_modules_share_a_base_name() -> None:
    """A module's base name says which module is meant (``docs/architecture.md``)."""
    assert shared_base_names(layer_files()) == {}, "rename one of each pair"


def test_the_base_name_checker_has_teeth(tmp_path: Path) -> None:
    paths = [tmp_path / "ir" / "laws.py", tmp_path / "lowering" / "laws.py",
             tmp_path / "ir" / "__init__.py", tmp_path / "lowering" / "__init__.py"]
    assert shared_base_names(paths, root=tmp_path) == {"laws": ["ir/laws.py", "lowering/laws.py"]}


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


# --- the floors inside ir -------------------------------------------------------------------------

IR_VALUES = frozenset({
    "ir.args", "ir.errors", "ir.graph", "ir.memo", "ir.module", "ir.module_stack", "ir.node",
    "ir.program", "ir.signature", "ir.slot_init", "ir.staged", "ir.state",
})
"""The IR values and what they are made of: the bottom floor of ``ir``."""

IR_TEST_SUPPORT = ("ir.strategies", "ir.harness")
"""The top floor of ``ir``: hypothesis strategies, the laws' loop and runner."""


def ir_floor_faults(root: Path = ROOT) -> list[str]:
    """Imports across ``ir``'s floors: an IR value importing beyond the values, a module of
    ``ir`` below the test support importing it (``transforms`` and ``lowering`` may: the rule
    checker and the laws draw with it)."""
    modules = module_files(root)
    faults = []
    for name, path in modules.items():
        reached = set(import_edges(path, modules, root))
        if name in IR_VALUES and reached - IR_VALUES:
            faults.append(f"{name}, an IR value, imports {sorted(reached - IR_VALUES)}")
        elif name.split(".")[0] == "ir" and not _inside(name, IR_TEST_SUPPORT):
            support = sorted(m for m in reached if _inside(m, IR_TEST_SUPPORT))
            if support:
                faults.append(f"{name} imports the test support {support}")
    return faults


def test_the_floors_inside_ir() -> None:
    """The IR values import only each other (no analysis, import, printing or seam); no module
    of ``ir`` below the test support imports it."""
    assert ir_floor_faults() == [], "move the code to the floor it needs"


def test_the_floor_checker_has_teeth(tmp_path: Path) -> None:
    files = {  # outside the tree, as the probes above
        "ir/node.py": "def f():\n    from ir.ops import facts\n",
        "ir/ops.py": "from ir.node import Node\nfrom ir.strategies import programs\n",
        "ir/strategies/__init__.py": "from ir.ops import facts\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert ir_floor_faults(tmp_path) == [
        "ir.node, an IR value, imports ['ir.ops']",
        "ir.ops imports the test support ['ir.strategies']",
    ]


def _inside(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


# --- no import cycle ------------------------------------------------------------------------------


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the three layers by dotted name (a package's ``__init__`` is the package)."""
    return {module_name(p, root): p
            for layer in LAYERS for p in sorted((root / layer).rglob("*.py"))}


def _packages(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages Python runs before the module ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_edges(path: Path, modules: Mapping[str, Path], root: Path = ROOT) -> dict[str, int]:
    """The modules of ``modules`` that ``path`` imports, each with the line of its first import,
    inside functions too.

    Importing ``a.b.c`` (``import a.b.c``, ``from a.b.c import x``, ``from a.b import c``) runs
    ``a``'s and ``a.b``'s ``__init__`` and then ``a.b.c``: an edge to each, but for the packages
    that hold ``path`` (they run before it whatever it imports). ``from a.b import x``, ``x``
    no module, reads ``a.b``'s ``__init__``: an edge to ``a.b``, also from inside ``a.b``."""
    own = module_name(path, root)
    skip = {own, *_packages(own)}
    found: dict[str, int] = {}

    def load(name: str, line: int) -> None:
        for m in (*_packages(name), name):
            if m in modules and m not in skip:
                found.setdefault(m, line)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                load(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package holding ``path``
                package = own.split(".") if path.name == "__init__.py" else own.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            load(base, node.lineno)
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    load(f"{base}.{a.name}", node.lineno)
                elif base in modules and base != own:
                    found.setdefault(base, node.lineno)
    return found


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` (module -> the modules it imports) with
    more than one module, each sorted, in order: Tarjan's algorithm, O(modules + imports)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycle() -> None:
    """No two modules of the layers import each other, however indirectly (imports inside
    functions and the package ``__init__`` files an import runs count): each idea sits on the
    floor it needs, and any module can be imported first."""
    modules = module_files()
    edges = {name: import_edges(path, modules) for name, path in modules.items()}
    cycles = import_cycles(edges)
    said = [
        "an import cycle: " + "; ".join(
            f"{m} imports " + ", ".join(f"{w} (line {edges[m][w]})"
                                        for w in sorted(edges[m]) if w in cycle)
            for m in cycle)
        for cycle in cycles
    ]
    assert not cycles, "\n".join(said) + "\nmove the code that closes each cycle to its floor"


def test_the_cycle_checker_has_teeth(tmp_path: Path) -> None:
    # outside the tree, as the probes above
    files = {
        # a cycle through a package's __init__ and an import inside a function
        "transforms/__init__.py": "from transforms.a import f\n",
        "transforms/a.py": "def f():\n    from transforms.sub import helper\n    return helper\n",
        "transforms/sub/__init__.py": "from transforms.sub.b import g\n",
        "transforms/sub/helper.py": "",
        "transforms/sub/b.py": "def g():\n    from transforms import a\n    return a\n",
        # a module of a package importing a sibling through the package: no cycle ...
        "ir/__init__.py": "from ir.names import name\nfrom ir.graph import Graph\nLIMIT = 3\n",
        "ir/names.py": "from ir import ops\n\n\ndef name():\n    return ops\n",
        "ir/ops.py": "",
        # ... but reading a name its package's __init__ defines is one
        "ir/graph.py": "class Graph:\n    def f(self):\n        from ir import LIMIT\n",
        "lowering/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = module_files(tmp_path)
    edges = {m: import_edges(path, modules, root=tmp_path) for m, path in modules.items()}
    assert edges["transforms.a"] == {"transforms.sub": 2, "transforms.sub.helper": 2}
    assert import_cycles(edges) == [
        ["ir", "ir.graph"], ["transforms.a", "transforms.sub", "transforms.sub.b"]
    ]


# --- bench/ never imports tests/ ------------------------------------------------------------------


def test_bench_never_imports_tests() -> None:
    """``tests/`` may use ``bench/`` (the stage cases live in ``bench/stage_cases.py``), never
    the other way: a benchmark must run from a tree without the test suite."""
    for path in sorted((ROOT / "bench").rglob("*.py")):
        reached = {m for m in imported_modules(path) if m.split(".")[0] == "tests"}
        assert not reached, f"{rel(path)} imports {sorted(reached)}; move the shared code to bench/"
