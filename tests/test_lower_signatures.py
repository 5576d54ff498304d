"""Lowered submodules: named ``forward`` signatures (fx tracing) and per-variant spec attributes.

Every graph-running submodule's ``forward`` unwraps to named parameters, so
``torch.fx.symbolic_trace`` works on any submodule and gives the eager submodule's numbers; the
classes that carry the names are shared per signature. Call variants of one module that hold
different pytree ``TreeSpec``s keep them under different attribute names.
"""

from __future__ import annotations

import inspect
import operator
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from test_pipeline import _deepcopy, _pickle, _torch_save  # tests/ is on sys.path
from torch import nn
from zoo import CASES, Case, D, eager_model, export_case, randn, seeded

from bench.models import build_deep, export_plain, export_preserved
from ir import InputError, import_ep
from ir.args import ref
from ir.graph import Graph
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from lowering import lower
from lowering.modules import LoweredModule, forward_names
from transforms import transform

VARIANTS = ("", "[decomp]", "[strict]", "[strict,decomp]")


def lowered(case: Case, **kw: Any) -> tuple[nn.Module, nn.Module]:
    """``(purefx module, fresh eager model)`` for ``case`` (cached export)."""
    return lower(transform(import_ep(export_case(case))), **kw), eager_model(case)


def assert_same(got: Any, want: Any) -> None:
    assert pytree.tree_structure(got) == pytree.tree_structure(want)
    torch.testing.assert_close(got, want)


def params(mod: nn.Module) -> list[str]:
    return list(inspect.signature(mod.forward).parameters)


# --- a preserved submodule with keyword and pytree inputs ---------------------------------------


class PytreeSub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(
        self, xs: list[torch.Tensor], d: dict[str, torch.Tensor], *, scale: torch.Tensor
    ) -> dict[str, Any]:
        h = self.lin(xs[0]) + xs[1] * d["b"]
        return {"h": h * scale, "parts": (h.sum(-1), d["a"] - 1)}


class PreservePytree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = PytreeSub()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # every flat input a distinct tensor: the export cannot tell which use of an input
        # passed twice into a preserved call came from which argument
        out = self.sub([x, y], {"a": x * 2, "b": y - 3}, scale=y + 1)
        return out["h"] + out["parts"][0].unsqueeze(-1) * out["parts"][1]


def _pytree_case(strict: bool) -> Case:
    return Case(
        "preserve_pytree" + ("[strict]" if strict else ""),
        seeded(PreservePytree),
        lambda: (randn(3, D), randn(3, D, seed=1)),
        strict=strict,
        preserve=("sub",),
    )


PYTREE_CASES = {strict: _pytree_case(strict) for strict in (False, True)}


# ================================================================================================
# fx symbolic tracing of submodules
# ================================================================================================


def running(mod: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(p, s) for p, s in mod.named_modules() if p and isinstance(s, LoweredModule)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["mlp_nested", "preserve_nested"])
def test_symbolic_trace_nested_submodules(name: str, variant: str) -> None:
    """Every submodule at every depth traces and computes what the eager submodule does."""
    m, eager = lowered(CASES[name + variant])
    x = randn(3, D, seed=3)
    subs = running(m)
    assert len(subs) >= 4
    for path, sub in subs:
        gm = torch.fx.symbolic_trace(sub)
        assert isinstance(gm, torch.fx.GraphModule), path
        assert_same(gm(x), eager.get_submodule(path)(x))
        assert_same(sub(x), eager.get_submodule(path)(x))  # tracing left the module as it was


def test_submodule_signature_names_its_placeholders() -> None:
    m, _ = lowered(CASES["mlp_nested"])
    assert params(m.block) == ["x"]
    gm = torch.fx.symbolic_trace(m.block)
    assert [n.target for n in gm.graph.nodes if n.op == "placeholder"] == ["x"]
    x = randn(3, D)
    assert_same(m.block(x=x), m.block(x))


@pytest.mark.parametrize("variant", VARIANTS)
def test_symbolic_trace_preserved_kwargs(variant: str) -> None:
    m, eager = lowered(CASES["preserve_kwargs" + variant])
    # positional names are not recorded by the export; keywords keep theirs
    assert params(m.sub) == ["arg0", "arg1", "gate"]
    gm = torch.fx.symbolic_trace(m.sub)
    x, y = randn(3, D, seed=5), randn(3, D, seed=6)
    assert_same(gm(x, y, gate=y * 2), eager.sub(x, y, gate=y * 2))
    assert_same(gm(x, y, y - 1), eager.sub(x, y, gate=y - 1))
    assert_same(m.sub(x, arg1=y, gate=y), eager.sub(x, y, gate=y))
    assert_same(m.sub(gate=y, _positional_arg_1=y, arg0=x), eager.sub(x, y, gate=y))


@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
def test_symbolic_trace_preserved_pytree_inputs(strict: bool) -> None:
    case = PYTREE_CASES[strict]
    m, eager = lowered(case)
    x, y = randn(3, D, seed=7), randn(3, D, seed=8)
    assert_same(m(x, y), eager(x, y))
    assert params(m.sub) == ["arg0", "arg1", "scale"]
    gm = torch.fx.symbolic_trace(m.sub)
    xs, d, scale = [x, y], {"a": x + 1, "b": y * 3}, y - 2
    want = eager.sub(xs, d, scale=scale)
    assert_same(gm(xs, d, scale=scale), want)
    assert_same(gm(xs, {"b": d["b"], "a": d["a"]}, scale), want)  # dict keys in another order
    assert_same(m.sub(xs, d, scale=scale), want)


@pytest.mark.parametrize("variant", VARIANTS)
def test_symbolic_trace_dispatched_module(variant: str) -> None:
    """A module whose calls run different graphs traces the graph its next call would run."""
    m, eager = lowered(CASES["repeated_diff_flag" + variant])
    assert len(m.block.graphs) == 2
    assert params(m.block) == ["x"]
    x = randn(3, D, seed=9)
    gm = torch.fx.symbolic_trace(m.block)  # a fresh module's next call is its first one
    assert_same(gm(x), eager.block(x))
    assert_same(torch.fx.symbolic_trace(m)(x), eager(x))
    assert_same(m(x), eager(x))


@pytest.mark.parametrize("variant", VARIANTS)
def test_symbolic_trace_repeated_module(variant: str) -> None:
    m, eager = lowered(CASES["repeated_same_graph" + variant])
    x = randn(3, D, seed=10)
    gm = torch.fx.symbolic_trace(m.block)
    for _ in range(3):
        assert_same(gm(x), eager.block(x))
    assert_same(torch.fx.symbolic_trace(m)(x), eager(x))


@pytest.mark.parametrize("interpreter", [False, True], ids=["codegen", "interpreter"])
def test_keyword_binding(interpreter: bool) -> None:
    m, eager = lowered(CASES["preserve_kwargs"], interpreter=interpreter)
    x, y = randn(3, D, seed=11), randn(3, D, seed=12)
    assert_same(m.sub(x, arg1=y, gate=y), eager.sub(x, y, gate=y))
    with pytest.raises(InputError, match="unexpected keyword"):
        m.sub(x, y, gate=y, other=y)
    with pytest.raises(InputError, match="no value"):
        m.sub(x, gate=y)


# ================================================================================================
# Classes: one per signature, kept by copies
# ================================================================================================


@pytest.mark.parametrize("export", [export_plain, export_preserved], ids=["plain", "preserved"])
def test_signature_classes_are_shared(export: Callable) -> None:
    model, args = build_deep(48)
    m = lower(transform(import_ep(export(model, args))))
    classes = {type(mod) for mod in m.modules() if isinstance(mod, LoweredModule)}
    assert len(classes) <= 5  # a few signatures (blocks, preserved blocks, linear, norm), not 144
    assert type(m.blocks[5]) is type(m.blocks[7])
    assert type(m.blocks[4]) is type(m.blocks[6])
    again = lower(transform(import_ep(export(*build_deep(3)))))
    assert type(again.blocks[1]) is type(m.blocks[1])  # and across lowerings
    for i in (0, 1, 2, 47):
        block = m.blocks[i]
        torch.testing.assert_close(torch.fx.symbolic_trace(block)(args[0]), block(args[0]))


@pytest.mark.parametrize(
    "how", [_deepcopy, _pickle, _torch_save], ids=["deepcopy", "pickle", "save"]
)
@pytest.mark.parametrize("name", ["preserve_kwargs", "repeated_diff_flag", "mlp_nested"])
def test_copies_keep_signature_classes(name: str, how: Callable) -> None:
    m, eager = lowered(CASES[name])
    twin = how(m)
    for (path, sub), (_, copied) in zip(running(m), running(twin), strict=True):
        assert type(copied) is type(sub), path
        assert params(copied) == params(sub), path
    sub = {"preserve_kwargs": "sub", "repeated_diff_flag": "block", "mlp_nested": "block"}[name]
    x = randn(3, D, seed=13)
    gm = torch.fx.symbolic_trace(twin.get_submodule(sub))
    if name == "preserve_kwargs":
        assert_same(gm(x, x, gate=x), eager.sub(x, x, gate=x))
    else:
        assert_same(gm(x), eager.get_submodule(sub)(x))
    assert_same(twin(*CASES[name].args()), eager(*CASES[name].args()))


# ================================================================================================
# forward_names on hand-built graphs
# ================================================================================================


def _graph(*names: str) -> Graph:
    nodes = [Node(PLACEHOLDER, n, n) for n in names]
    return Graph((*nodes, Node(OUTPUT, "output", "output", (ref(names[0]),))))


@pytest.mark.parametrize(
    "graphs,expected",
    [
        ((("x",),), ("x",)),
        ((("add_3", "mask_12"),), ("add", "mask")),
        ((("add", "add_1"),), ("add", "add_1")),  # stripping would make two equal
        ((("self", "x"),), None),  # not usable as a Python parameter
        ((("x",), ("x",)), ("x",)),  # variants agree
        ((("x",), ("y_2",)), ("arg0",)),  # same arity, other names
        ((("x",), ("x", "y")), None),  # no single signature
    ],
)
def test_forward_names(graphs: tuple, expected: tuple | None) -> None:
    assert forward_names([_graph(*names) for names in graphs]) == expected


# ================================================================================================
# Call variants holding different TreeSpecs
# ================================================================================================


def _wrap_output(graph: Graph, specs: list[tuple[pytree.TreeSpec, Any]]) -> Graph:
    """``graph`` whose result goes through ``tree_unflatten((v,), spec)[key]`` per spec."""
    *body, out = graph.nodes
    value = out.args[0]
    for i, (spec, key) in enumerate(specs):
        packed, unpacked = f"_packed_{i}", f"_unpacked_{i}"
        body.append(Node(CALL_FUNCTION, packed, pytree.tree_unflatten, ((value,), spec)))
        body.append(Node(CALL_FUNCTION, unpacked, operator.getitem, (ref(packed), key)))
        value = ref(unpacked)
    return Graph((*body, out.replace(args=(value,))))


def _with_graphs(program: Program, path: str, graphs: tuple[Graph, ...]) -> Program:
    mid = program.resolve(path)
    mod = program.module_table()[mid].replace(graphs=graphs)
    return program.replace(modules=program.modules.set(mid, mod))


def test_call_variants_with_different_specs() -> None:
    """``block`` and ``block@1`` run graphs that each read a different TreeSpec."""
    case = CASES["repeated_diff_flag"]
    program = transform(import_ep(export_case(case)))
    first, second = program.module_table()[program.resolve("block")].graphs
    as_list = pytree.tree_structure([0])
    as_dict = pytree.tree_structure({"a": 0})
    graphs = (_wrap_output(first, [(as_list, 0)]), _wrap_output(second, [(as_dict, "a")]))
    m = lower(_with_graphs(program, "block", graphs))
    held = {k: v for k, v in vars(m.block).items() if k.startswith("_spec_")}
    assert sorted(map(str, held.values())) == sorted(map(str, [as_list, as_dict]))
    eager = eager_model(case)
    x = randn(3, D, seed=14)
    for _ in range(2):
        assert_same(m(x), eager(x))
    assert_same(m.block(x), eager.block(x))  # a call that names no graph runs graph 0
    assert_same(m.block(x), eager.block(x))
    assert_same(m.block(x, _purefx_graph=1), eager.block(x, negate=True))
    twin = pickle.loads(pickle.dumps(m))
    assert_same(twin(x), eager(x))


def test_equal_specs_are_one_attribute_across_shared_code() -> None:
    """Alpha-equal graphs share compiled code: equal specs get one name whether or not they are
    one object, so a graph with two equal spec objects and one with a single object both run."""
    model, args = build_deep(2)
    program = transform(import_ep(export_plain(model, args)))
    spec = pytree.tree_structure((0,))
    twins = [(pytree.tree_structure((0,)), 0), (pytree.tree_structure((0,)), 0)]
    paths = ("blocks.0", "blocks.1")
    graphs = [program.module_table()[program.resolve(p)].graphs[0] for p in paths]
    program = _with_graphs(program, paths[0], (_wrap_output(graphs[0], twins),))
    program = _with_graphs(program, paths[1], (_wrap_output(graphs[1], [(spec, 0), (spec, 0)]),))
    m = lower(program)
    reference = lower(transform(import_ep(export_plain(*build_deep(2)))))
    for path in paths:
        assert len([k for k in vars(m.get_submodule(path)) if k.startswith("_spec_")]) == 1
    torch.testing.assert_close(m(*args), reference(*args))
