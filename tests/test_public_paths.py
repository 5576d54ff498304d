"""The public paths that issues fixed still resolve: each ``from module import name`` (or
``import module``) a user was told to write. A move inside the packages keeps them (a door
module re-exports what moved); this test fails when one is lost."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

NAMES = [  # (module, name): ``from module import name`` gives a function or a class
    ("transforms.laws", "check_laws"),
    ("transforms.laws", "LawViolation"),
    ("transforms", "named_passes"),
    ("transforms.edit", "rewrite_nodes"),
    ("transforms.edit", "Edit"),
    ("transforms.stacks", "fill_call_gaps"),
    ("transforms.stacks", "fix_module_stacks"),
    ("transforms.sink", "StateOwners"),
    ("transforms.sink", "sink_state"),
    ("transforms.inline", "inline"),
    ("transforms.new_state", "NewState"),
    ("transforms.pipeline", "transform"),
    ("transforms.rewrite", "Rule"),
    ("transforms.rewrite", "rewrite"),
    ("transforms.rewrite", "rewrite_report"),
    ("transforms.rewrite", "check_rule"),
    ("transforms.rewrite", "saturate"),
    ("transforms.rewrite", "check_rule_in_context"),
    ("transforms", "move_to_device"),
    ("transforms", "split_by_tags"),
    ("transforms", "move_non_tensor_nodes_on_boundary"),
    ("transforms", "fold_constants"),
    ("transforms", "eliminate_dead_code"),
    ("transforms", "cse"),
    ("transforms", "transform"),
    ("ir", "import_ep"),
    ("ir.strategies", "programs"),
    ("lowering", "lower"),
]

MODULES = [  # ``import module`` gives a module
    "transforms.kernel",
    "transforms.rewrite_rules",
    "transforms.rewrite.versions",
    "transforms.rewrite.guards",
    "transforms.rewrite.cost",
    "ir.effects",
    "ir.torch_seam",
    "ir.strategies.programs",
]


@pytest.mark.parametrize(("module", "name"), NAMES, ids=[f"{m}.{n}" for m, n in NAMES])
def test_each_public_name_resolves(module: str, name: str) -> None:
    found = getattr(importlib.import_module(module), name, None)
    assert callable(found), f"from {module} import {name} gives {found!r}, not a function or class"


@pytest.mark.parametrize("module", MODULES)
def test_each_public_module_imports(module: str) -> None:
    assert isinstance(importlib.import_module(module), ModuleType)


def test_the_law_door_is_the_implementation() -> None:
    """``transforms.laws`` re-exports every public name of ``lowering.pass_laws``, the same
    objects (an ``except LawViolation`` catches what the checker raises)."""
    door = importlib.import_module("transforms.laws")
    home = importlib.import_module("lowering.pass_laws")
    assert sorted(door.__all__) == sorted(home.__all__)
    assert [n for n in home.__all__ if getattr(door, n) is not getattr(home, n)] == []


def test_the_inline_door_leaves_the_pass_in_the_package() -> None:
    """``transforms.inline`` is a pass and a door module of the same name: importing the door
    (Python binds a submodule on its package at its first import) must leave
    ``from transforms import inline`` the pass."""
    importlib.import_module("transforms.inline")
    transforms = importlib.import_module("transforms")
    home = importlib.import_module("transforms.passes.inlining")
    assert transforms.inline is home.inline


@pytest.mark.parametrize(("door", "home"), [
    ("transforms.sink", "transforms.passes.state_sinking"),
    ("transforms.inline", "transforms.passes.inlining"),
    ("transforms.stacks", "transforms.passes.module_stacks"),
])
def test_each_door_reexports_the_public_names_of_its_home(door: str, home: str) -> None:
    """A door re-exports what users import from the path, the same objects as its home."""
    door_module, home_module = importlib.import_module(door), importlib.import_module(home)
    public = {n for n, v in vars(home_module).items() if not n.startswith("_")
              and getattr(v, "__module__", None) == home}
    assert public <= set(door_module.__all__), f"{door} misses {sorted(public - set(door_module.__all__))}"
    assert [n for n in door_module.__all__ if getattr(door_module, n, None) is None] == []
