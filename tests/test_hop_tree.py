"""Higher-order-op bodies are not modules of the lowered tree (issue #12, item 5).

``cond`` branches, ``map`` / ``while_loop`` bodies and the ``wrap_with_set_grad_enabled`` /
``wrap_with_autocast`` bodies that export makes are held by the module whose code runs them
(``lowering/hop_bodies.py``): the lowered module's ``named_modules()``, ``named_parameters()``,
``named_buffers()`` and ``state_dict()`` are the eager model's, calls still run the bodies (with
grad mode and autocast restored after), and copies, pickles, ``print_readable`` and
``interpreter=True`` keep working. torch's unflatten registers the bodies as submodules.
"""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from zoo import (  # tests/ is on sys.path (conftest)
    CASES,
    Case,
    CondModel,
    MapModel,
    WhileModel,
    eager_model,
    export_case,
    randn,
    register,
    seeded,
)

from ir import import_ep
from lowering import lower
from lowering.hop_bodies import held_bodies
from transforms import transform


class Calls(nn.Module):
    """Runs ``body`` one level down, so the HOP bodies belong to a submodule, not the root."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.body = body

    def forward(self, *args: torch.Tensor) -> Any:
        out = self.body(*args)
        return pytree.tree_map(lambda t: t * 2 if t.is_floating_point() else t, out)


LOCAL: dict[str, Case] = {}
_PLAIN = ((False, False),)
register(
    Case("sub_cond", seeded(lambda: Calls(CondModel())), lambda: (randn(3, 4),)),
    ((False, False), (False, True)),
    into=LOCAL,
)
register(
    Case(
        "sub_map",
        seeded(lambda: Calls(MapModel())),
        lambda: (randn(3, 2, 4), randn(2, 4, seed=1)),
    ),
    _PLAIN,
    into=LOCAL,
)
register(
    Case("sub_while", seeded(lambda: Calls(WhileModel())), lambda: (torch.tensor(0), randn(2, 4))),
    _PLAIN,
    into=LOCAL,
)

# The HOP each base case exports (training IR; run_decompositions inlines set-grad/autocast).
HOPS = {
    "cond": "cond",
    "map": "map_impl",
    "while_loop": "while_loop",
    "grad_body": "wrap_with_set_grad_enabled",
    "autocast_body": "wrap_with_autocast",
    "sub_cond": "cond",
    "sub_map": "map_impl",
    "sub_while": "while_loop",
}
# Training IR, strict and not (decomposed: cond only; the set-grad/autocast bodies are inlined)
ZOO = [f"{b}{v}" for b in ("cond", "map", "while_loop", "grad_body") for v in ("", "[strict]")]
ZOO += ["cond[decomp]", "grad_body[decomp]", "autocast_body"]
TABLE = {**{n: CASES[n] for n in ZOO}, **LOCAL}
NAMES = sorted(TABLE)


def purefx(ep: torch.export.ExportedProgram, **kw: Any) -> nn.Module:
    return lower(transform(import_ep(ep)), **kw)


def call(mod: Any, case: Case) -> Any:
    return mod(*case.args(), **case.kwargs())


def assert_same(got: Any, want: Any) -> None:
    assert pytree.tree_structure(got) == pytree.tree_structure(want)
    torch.testing.assert_close(got, want)


def tree_names(mod: nn.Module) -> dict[str, list[str]]:
    """Every name the tree shows: modules, parameters, buffers (duplicates kept), state dict."""
    return {
        "modules": [n for n, _ in mod.named_modules(remove_duplicate=False)],
        "parameters": [n for n, _ in mod.named_parameters(remove_duplicate=False)],
        "buffers": [n for n, _ in mod.named_buffers(remove_duplicate=False)],
        "state_dict": list(mod.state_dict()),
    }


def hops_of(ep: torch.export.ExportedProgram) -> set[str]:
    return {
        n.target.name()
        for gm in ep.graph_module.modules()
        if isinstance(gm, torch.fx.GraphModule)
        for n in gm.graph.nodes
        if isinstance(n.target, torch._ops.HigherOrderOperator)
    }


def all_bodies(mod: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(owner path.body name, body)`` for every held body, nested bodies included."""
    found = []
    stack = [(p, m) for p, m in mod.named_modules()]
    while stack:
        path, owner = stack.pop()
        for name, body in held_bodies(owner):
            full = f"{path}.{name}" if path else name
            found.append((full, body))
            stack.append((full, body))
    return found


@pytest.fixture(scope="module", params=NAMES)
def built(request: pytest.FixtureRequest) -> tuple[Case, Any, nn.Module, nn.Module]:
    case = TABLE[request.param]
    ep = export_case(case)
    return case, ep, purefx(ep), eager_model(case)


def test_the_program_has_bodies(built) -> None:
    """The test is about something: training IR keeps the HOP, and lowering holds its bodies."""
    case, ep, m, _ = built
    if case.decompose and HOPS[case.name.partition("[")[0]].startswith("wrap_with"):
        assert not hops_of(ep)  # run_decompositions inlines set-grad / autocast bodies
        return
    assert HOPS[case.name.partition("[")[0]] in hops_of(ep)
    assert all_bodies(m)


def test_tree_equals_eager(built) -> None:
    _, _, m, eager = built
    assert tree_names(m) == tree_names(eager)
    assert [n for n, _ in m.named_children()] == [n for n, _ in eager.named_children()]


def test_torch_registers_bodies_as_modules(built) -> None:
    """What purefx fixes: torch's unflatten shows the bodies as submodules."""
    _, ep, _, eager = built
    if not all_bodies(purefx(ep)):
        pytest.skip("no body in this program")
    with contextlib.redirect_stdout(io.StringIO()):
        u = torch.export.unflatten(copy.deepcopy(ep))
    assert tree_names(u)["modules"] != tree_names(eager)["modules"]


def test_numerics_match_eager_and_ep_module(built) -> None:
    case, ep, m, eager = built
    for _ in range(2):
        got = call(m, case)
        assert_same(got, call(eager, case))
        assert_same(got, call(ep.module(), case))


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save", "interpreter"])
def test_copies_and_interpreter_run_the_bodies(built, how: str) -> None:
    case, ep, m, eager = built
    if how == "deepcopy":
        other = copy.deepcopy(m)
    elif how == "pickle":
        other = pickle.loads(pickle.dumps(m))
    elif how == "torch.save":
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        other = torch.load(buf, weights_only=False)
    else:
        other = purefx(ep, interpreter=True)
    assert tree_names(other) == tree_names(eager)
    assert [p for p, _ in all_bodies(other)] == [p for p, _ in all_bodies(m)]
    for (_, a), (_, b) in zip(all_bodies(other), all_bodies(m)):
        assert a is not b or how == "interpreter"
    assert_same(call(other, case), call(eager, case))


def test_print_readable_shows_the_bodies(built) -> None:
    _, _, m, _ = built
    text = m.print_readable(print_output=False)
    for path, _ in all_bodies(m):
        assert f"class {path.rpartition('.')[2]}(torch.nn.Module):" in text


class NoGradGate(nn.Module):
    """A gate computed from ``x`` under ``no_grad``: gradients flow through ``x`` only directly."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            g = self.gate(x).sigmoid()
        return x * g


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("outer", [torch.enable_grad, torch.no_grad])
def test_grad_mode_inside_the_body_and_restored_after(strict: bool, outer: Any) -> None:
    """The no_grad body runs without grad (the gradient equals eager's, which has no path
    through the gate), the rest with the caller's mode, and the caller's mode is restored."""
    eager = seeded(NoGradGate)()
    ep = torch.export.export(seeded(NoGradGate)(), (randn(3, 4),), strict=strict)
    assert "wrap_with_set_grad_enabled" in hops_of(ep)
    m = purefx(ep)
    assert tree_names(m) == tree_names(eager)
    x1, x2 = randn(3, 4).requires_grad_(), randn(3, 4).requires_grad_()
    with outer():
        before = torch.is_grad_enabled()
        got, want = m(x1), eager(x2)
        assert torch.is_grad_enabled() == before
    torch.testing.assert_close(got, want)
    assert got.requires_grad == want.requires_grad == before
    if before:
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad)


def test_autocast_restored_after_the_body() -> None:
    case = CASES["autocast_body"]
    m = purefx(export_case(case))
    assert not torch.is_autocast_enabled("cpu")
    call(m, case)
    assert not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        call(m, case)
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")


def test_assigning_a_module_to_a_body_name_registers_it() -> None:
    """``setattr`` works as on any module: the new value is an ordinary child."""
    _, m, eager = None, purefx(export_case(CASES["cond"])), eager_model(CASES["cond"])
    name, body = held_bodies(m)[0]
    replacement = copy.deepcopy(body)
    setattr(m, name, replacement)
    assert dict(m.named_children())[name] is replacement
    assert_same(call(m, CASES["cond"]), call(eager, CASES["cond"]))
