"""Parity suite for the default pipeline: ``lower(transform(import_ep(ep)))``.

Every test compares the lowered module with the eager model and/or ``ep.module()`` (numerics,
state after each call, exact module structure, exact error types). Where ``torch.export.unflatten``
gets a case wrong, the test also asserts torch's behaviour, so the suite documents what purefx
fixes. Exports come from the zoo's ``export_case`` cache; torch's unflatten is only ever given a
``copy.deepcopy`` of a cached program (it writes to the program it is given).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import pickle
import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import attrs
import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.export.unflatten import FlatArgsAdapter, InterpreterModule, InterpreterModuleDispatcher
from zoo import (  # tests/ is on sys.path (conftest)
    CASES,
    Case,
    CondModel,
    D,
    MapModel,
    WhileModel,
    eager_model,
    export_case,
    fresh_export,
    randn,
    register,
    seeded,
    zoo_ops,
)

import ir
from ir import import_ep
from lowering import lower
from lowering.hop_bodies import held_bodies
from transforms import transform
from transforms.pipeline import pipeline

MUTATING = {"buffer_mutation", "input_mutation"}
VARIANTS = ("", "[decomp]", "[strict]", "[strict,decomp]")
by_variant = pytest.mark.parametrize(
    "variant", VARIANTS, ids=["plain", "decomp", "strict", "strict,decomp"]
)


# --- helpers ------------------------------------------------------------------------------------


def purefx(ep: torch.export.ExportedProgram, **kw: Any) -> nn.Module:
    """The default pipeline, end to end."""
    return lower(transform(import_ep(ep)), **kw)


def lowered(name: str, **kw: Any) -> tuple[torch.export.ExportedProgram, nn.Module, nn.Module]:
    """``(ep, purefx module, fresh eager model)`` for zoo case ``name`` (cached export)."""
    case = CASES[name]
    ep = export_case(case)
    return ep, purefx(ep, **kw), eager_model(case)


def torch_unflatten(ep: torch.export.ExportedProgram, **kw: Any) -> nn.Module:
    """torch's unflatten on a copy (it writes to the program it is given); stdout swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        return torch.export.unflatten(copy.deepcopy(ep), **kw)


def call(mod: Callable, case: Case, alt: bool = False) -> Any:
    """Call ``mod`` with fresh inputs of ``case`` (alternative inputs with ``alt``)."""
    args = case.alt_args if alt else case.args
    kwargs = (case.alt_kwargs or case.kwargs) if alt else case.kwargs
    return mod(*args(), **kwargs())


def assert_same(got: Any, want: Any, **tol: Any) -> None:
    """Equal values and the same pytree structure (tuple vs list, dict keys, None, ints)."""
    assert pytree.tree_structure(got) == pytree.tree_structure(want)
    torch.testing.assert_close(got, want, **tol)


def buffers(mod: nn.Module) -> dict[str, torch.Tensor]:
    return dict(mod.named_buffers(remove_duplicate=False))


def tree(mod: nn.Module, prefix: str = "") -> list[str]:
    """Child paths, recursively, each module's children in registration order."""
    out = []
    for name, child in mod.named_children():
        out.append(prefix + name)
        out += tree(child, f"{prefix}{name}.")
    return out


HOP_GRAPH = re.compile(r"(true|false|body|cond)_graph_\d+$|while_loop_(cond|body)_graph_\d+$")


def user_tree(mod: nn.Module) -> list[str]:
    """``tree`` without higher-order-op subgraph modules (eager models do not have them)."""
    return [p for p in tree(mod) if not any(HOP_GRAPH.match(part) for part in p.split("."))]


def eager_type(mod: nn.Module) -> str:
    return f"{type(mod).__module__}.{type(mod).__qualname__}"


def runs_graph(mod: nn.Module) -> bool:
    return isinstance(getattr(mod, "graph", None), torch.fx.Graph)


def graphs_of(mod: nn.Module) -> list[torch.fx.Graph]:
    """Every fx graph ``mod`` runs (one per call variant), via its public attributes."""
    found = getattr(mod, "graphs", None) or [getattr(mod, "graph", None)]
    return [g for g in found if isinstance(g, torch.fx.Graph)]


def call_targets(graph: torch.fx.Graph) -> list[str]:
    return [n.target for n in graph.nodes if n.op == "call_module"]


def strip_stack(program: ir.Program, index: int) -> tuple[ir.Program, str]:
    """``program`` with the ``nn_module_stack`` of its ``index``-th compute node removed."""
    root = program.root_module
    nodes = list(root.graph.nodes)
    at = [
        i for i, n in enumerate(nodes) if n.op == "call_function" and n.meta.get("nn_module_stack")
    ]
    i = at[index]
    meta = {k: v for k, v in nodes[i].meta.items() if k != "nn_module_stack"}
    nodes[i] = nodes[i].replace(meta=MappingProxyType(meta))
    new_root = root.replace(graphs=(ir.Graph(tuple(nodes)),) + root.graphs[1:])
    return program.replace(modules=program.modules.set(program.root, new_root)), nodes[i].name


# --- local models (cases the zoo does not have) ------------------------------------------------


class CallsHop(nn.Module):
    """A submodule ``body`` runs the control-flow op, so its subgraphs belong to ``body``."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.pre = nn.Identity()
        self.body = body

    def forward(self, *args: torch.Tensor) -> Any:
        return self.body(*args)


class LSTMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size=D, hidden_size=8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, (h, c) = self.rnn(x)
        return self.head(out), h, c


class OtherTwoArg(nn.Module):
    """A user's replacement for ``PreserveKwargs.sub``: same signature, different computation."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, D))

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, *, gate: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * self.w - y
        if gate is not None:
            h = h + gate
        return h, h.mean(-1)


def _full_transformer() -> nn.Module:
    return nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
        dim_feedforward=32, dropout=0.0, batch_first=True,
    ).eval()  # fmt: skip


EXTRA: dict[str, Case] = {}
_PLAIN_DECOMP = ((False, False), (False, True))
_ALL = ((False, False), (False, True), (True, False), (True, True))
register(
    Case("hop_cond", seeded(lambda: CallsHop(CondModel())), lambda: (randn(3, D),)), _ALL, EXTRA
)
register(
    Case(
        "hop_map",
        seeded(lambda: CallsHop(MapModel())),
        lambda: (randn(3, 2, D), randn(2, D, seed=1)),
    ),
    _ALL,
    EXTRA,
)
register(
    Case(
        "hop_while",
        seeded(lambda: CallsHop(WhileModel())),
        lambda: (torch.tensor(0), randn(2, D)),
    ),
    _ALL,
    EXTRA,
)
_tf_args = lambda: (randn(2, 5, 16), randn(2, 3, 16, seed=1))
register(Case("nn_transformer", seeded(_full_transformer), _tf_args), _PLAIN_DECOMP, EXTRA)
register(
    Case(
        "nn_transformer_preserve_layer",
        seeded(_full_transformer),
        _tf_args,
        preserve=("encoder.layers.0", "decoder.layers.0"),
    ),
    _PLAIN_DECOMP,
    EXTRA,
)
register(
    Case(
        "nn_transformer_preserve_attn",
        seeded(_full_transformer),
        _tf_args,
        preserve=("decoder.layers.0.multihead_attn",),
    ),
    _PLAIN_DECOMP,
    EXTRA,
)
for _base, _paths in (
    ("transformer_encoder", ("layers.0",)),
    ("transformer_encoder", ("layers.0.self_attn",)),
    ("mha", ("attn",)),
):
    _suffix = _paths[0].replace(".", "_")
    register(
        attrs.evolve(CASES[_base], name=f"{_base}_preserve_{_suffix}", preserve=_paths),
        _PLAIN_DECOMP,
        EXTRA,
    )
register(
    Case("lstm_preserve_rnn", seeded(LSTMHead), lambda: (randn(2, 5, D),), preserve=("rnn",)),
    ((False, False),),
    EXTRA,
)
for _paths in (("writer",), ("reader",), ("writer", "reader")):
    register(
        attrs.evolve(
            CASES["buffer_mutation_cross"],
            name=f"buffer_mutation_cross_preserve_{'_'.join(_paths)}",
            preserve=_paths,
        ),
        _PLAIN_DECOMP,
        EXTRA,
    )

TABLE = {**CASES, **EXTRA}


# ================================================================================================
# Semantics: every zoo case, every variant
# ================================================================================================


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_and_ep_module(name: str) -> None:
    """Outputs equal eager's and ``ep.module()``'s, calls repeat, state dict keys as eager."""
    case = CASES[name]
    ep = export_case(case)
    m, eager = purefx(ep), eager_model(case)
    mutates = bool(case.features & MUTATING)
    # ep.module() shares state with ep: run a copy's when the case mutates
    reference = (copy.deepcopy(ep) if mutates else ep).module()
    for _ in range(2):
        got = call(m, case)
        assert_same(got, call(eager, case))
        assert_same(got, call(reference, case))
    if case.alt_args is not None:
        assert_same(call(m, case, alt=True), call(eager, case, alt=True))
    assert list(m.state_dict()) == list(eager.state_dict())


@pytest.mark.parametrize("name", sorted(CASES))
def test_module_tree_matches_eager(name: str) -> None:
    """Children in eager registration order, recursively (HOP subgraph modules aside)."""
    case = CASES[name]
    m = purefx(export_case(case))
    assert user_tree(m) == tree(eager_model(case))


@pytest.mark.parametrize("name", sorted(CASES))
def test_graphs_reference_existing_attributes(name: str) -> None:
    """Generated code stays consistent: every call_module / get_attr target of every graph
    resolves on the lowered module (no stale ``foo@1`` after merging repeated calls)."""
    m = purefx(export_case(CASES[name]))
    checked = 0
    for path, mod in m.named_modules():
        for graph in graphs_of(mod):
            checked += 1
            for node in graph.nodes:
                if node.op == "call_module":
                    assert "@" not in node.target, (path, node.format_node())
                    assert isinstance(mod.get_submodule(node.target), nn.Module)
                elif node.op == "get_attr":
                    obj = mod
                    for part in node.target.split("."):
                        obj = getattr(obj, part)
    assert checked >= 1  # at least the root graph


# ================================================================================================
# Hierarchy
# ================================================================================================


@by_variant
def test_deep_nesting_structure(variant: str) -> None:
    _, m, eager = lowered("mlp_nested" + variant)
    assert call_targets(m.graph) == ["block", "head"]
    assert call_targets(m.block.graph) == ["middle", "proj"]
    assert call_targets(m.block.middle.graph) == ["inner", "norm"]
    assert call_targets(m.block.middle.inner.graph) == ["lin"]
    assert isinstance(m.block.middle.inner.lin, InterpreterModule)
    assert m.block.middle.inner.lin.weight.shape == eager.block.middle.inner.lin.weight.shape


@by_variant
def test_submodule_called_without_parent_forward(variant: str) -> None:
    """``outer``'s forward never runs; root calls ``outer.inner`` and reads ``outer.scale``."""
    name = "parent_never_runs" + variant
    _, m, eager = lowered(name)
    assert call_targets(m.graph) == ["outer.inner"]
    assert not runs_graph(m.outer)
    assert runs_graph(m.outer.inner)
    assert isinstance(m.outer.scale, nn.Parameter)
    torch.testing.assert_close(m.outer.scale, eager.outer.scale)
    with torch.no_grad():  # the lowered module reads the parameter it holds
        m.outer.scale.mul_(2)
        eager.outer.scale.mul_(2)
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))


@by_variant
def test_helper_methods(variant: str) -> None:
    """``codec.encode``/``decode`` are not forward: their submodule calls are made by the root."""
    name = "helper_method" + variant
    _, m, eager = lowered(name)
    assert call_targets(m.graph) == ["codec.enc", "codec.dec", "codec"]
    assert call_targets(m.codec.graph) == ["enc", "dec"]
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))


@pytest.mark.parametrize("variant", ["", "[decomp]"])
def test_ancestor_sibling_call_repairs_stacks(
    variant: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """``a.leaf`` calls ``norm``: the stack ``['', a, a.leaf, norm]`` does not nest."""
    name = "ancestor_sibling" + variant
    ep = export_case(CASES[name])
    with caplog.at_level(logging.WARNING, logger="purefx"):
        m = purefx(ep)
    warned = [r for r in caplog.records if r.name == "purefx" and r.levelno == logging.WARNING]
    assert warned and all("norm" in r.getMessage() for r in warned)
    assert capsys.readouterr().out == ""
    eager = eager_model(CASES[name])
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))
    with torch.no_grad():  # the norm that runs is the one registered at ``norm``
        m.norm.weight.add_(1.5)
        eager.norm.weight.add_(1.5)
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))


@pytest.mark.parametrize(
    "name",
    [
        "mlp_nested", "containers", "helper_method", "parent_never_runs", "ancestor_sibling",
        "ancestor_sibling[strict]", "shared_two_parents[strict]", "preserve_nested",
        "repeated_diff_flag", "transformer_encoder", "mha", "cond", "param_zoo[strict]",
    ],
)  # fmt: skip
def test_type_names(name: str) -> None:
    """``type_name()`` is the original class for every module that runs; never a wrong one."""
    _, m, eager = lowered(name)
    assert m.type_name() == eager_type(eager)
    for path, sub in m.named_modules():
        if not path or HOP_GRAPH.search(path):
            continue
        try:
            want = eager_type(eager.get_submodule(path))
        except AttributeError:  # a path eager does not have: test_module_tree_matches_eager
            continue
        if runs_graph(sub):
            assert sub.type_name() == want, path
        else:
            assert sub.type_name() in (None, want), path


def test_type_names_torch_is_wrong_for_module_list() -> None:
    """torch reports the never-called ``ModuleList`` as a ``Linear``; purefx does not."""
    ep, m, _ = lowered("containers")
    assert torch_unflatten(ep).layers.type_name() == "torch.nn.modules.linear.Linear"
    assert m.layers.type_name() in (None, "torch.nn.modules.container.ModuleList")


@pytest.mark.parametrize("name", ["mlp_nested", "mlp_nested[decomp]", "helper_method[strict]"])
@pytest.mark.parametrize("index", [0, 1, -1])
def test_missing_module_stack_is_a_purefx_error(name: str, index: int) -> None:
    program, victim = strip_stack(import_ep(export_case(CASES[name])), index)
    with pytest.raises(ir.PurefxError) as err:
        lower(transform(program))
    assert repr(victim) in str(err.value) or victim in str(err.value)
    assert not isinstance(err.value, AssertionError)


# ================================================================================================
# State
# ================================================================================================


@by_variant
def test_parameters_buffers_constants(variant: str) -> None:
    _, m, eager = lowered("param_zoo" + variant)
    params = dict(m.named_parameters())
    want = dict(eager.named_parameters())
    assert list(params) == list(want)
    for fqn, p in want.items():
        assert isinstance(params[fqn], nn.Parameter)
        assert params[fqn].requires_grad == p.requires_grad, fqn
        torch.testing.assert_close(params[fqn], p)
    assert m.frozen.requires_grad is False
    torch.testing.assert_close(m.unused, eager.unused)  # unused parameter restored
    have = buffers(m)
    assert set(have) == set(buffers(eager)) == {"scale", "offset", "unused_buf"}
    torch.testing.assert_close(have, buffers(eager))
    sd = m.state_dict()
    assert "offset" not in sd and "offset" in have  # non-persistent
    assert list(sd) == list(eager.state_dict())
    torch.testing.assert_close(dict(sd), dict(eager.state_dict()))
    # a plain tensor attribute: an attribute, not state
    assert type(m.const) is torch.Tensor
    torch.testing.assert_close(m.const, eager.const)
    assert "const" not in sd and "const" not in have


@by_variant
def test_named_buffers_in_eager_order(variant: str) -> None:
    _, m, eager = lowered("param_zoo" + variant)
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in eager.named_buffers()]


@by_variant
def test_parameter_list_and_dict(variant: str) -> None:
    _, m, eager = lowered("param_zoo" + variant)
    assert isinstance(m.plist, nn.ParameterList)
    assert len(m.plist) == 2
    torch.testing.assert_close(m.plist[1], eager.plist[1])
    torch.testing.assert_close(list(m.plist), list(eager.plist))
    # A never-called ParameterDict leaves no class name in the program, so its class cannot be
    # rebuilt; it comes back as a holder that still indexes and lists like one.
    assert set(m.pdict.keys()) == {"gain", "bias"} and len(m.pdict) == 2
    torch.testing.assert_close(m.pdict["gain"], eager.pdict["gain"])


@by_variant
def test_custom_object_is_an_attribute(variant: str) -> None:
    """The opaque object is held under the name export lifted it to; torch cannot unflatten it."""
    name = "opaque_object" + variant
    ep, m, eager = lowered(name)
    (fqn,) = [k for k, v in ep.constants.items() if isinstance(v, zoo_ops().Scaler)]
    held = getattr(m, fqn)
    assert isinstance(held, zoo_ops().Scaler) and held.k == 3.0
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))
    with pytest.raises(AssertionError):
        torch_unflatten(ep)


@by_variant
def test_tied_weights_stay_one_parameter(variant: str) -> None:
    name = "tied_weights" + variant
    _, m, eager = lowered(name)
    assert m.dec.weight is m.enc.weight
    assert m.lm_head.weight is m.emb.weight
    assert isinstance(m.emb.weight, nn.Parameter)
    assert len(list(m.parameters())) == len(list(eager.parameters()))
    with torch.no_grad():
        m.emb.weight.mul_(-1)
        eager.emb.weight.mul_(-1)
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))


@pytest.mark.parametrize(
    "name",
    ["param_zoo", "tied_weights[strict]", "mlp_nested[decomp]", "shared_two_parents",
     "batchnorm_train", "preserve_nested", "transformer_encoder", "lstm"],
)  # fmt: skip
def test_load_state_dict_from_eager(name: str) -> None:
    case = CASES[name]
    _, m, eager = lowered(name)
    new = {
        k: (v * 0.5 + 0.25 if v.is_floating_point() else v + 1)
        for k, v in eager_model(case).state_dict().items()
    }
    eager.load_state_dict(new)
    result = m.load_state_dict(new)
    assert not result.missing_keys and not result.unexpected_keys
    assert list(m.state_dict()) == list(eager.state_dict())
    torch.testing.assert_close(dict(m.state_dict()), dict(eager.state_dict()))
    assert_same(call(m, case), call(eager, case))


@pytest.mark.parametrize(
    "name",
    ["param_zoo", "param_zoo[decomp]", "tied_weights", "tied_weights[strict]", "mlp_nested",
     "shared_two_parents", "preserve_nested", "preserve_kwargs[decomp]", "repeated_diff_flag",
     "cond", "transformer_encoder", "lstm", "mha[decomp]"],
)  # fmt: skip
def test_gradients_match_eager(name: str) -> None:
    case = CASES[name]
    _, m, eager = lowered(name)

    def loss(out: Any) -> torch.Tensor:
        return sum(
            t.float().pow(2).sum() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
        )

    loss(call(m, case)).backward()
    loss(call(eager, case)).backward()
    got = {n: p.grad for n, p in m.named_parameters()}
    want = {n: p.grad for n, p in eager.named_parameters()}
    assert list(got) == list(want)
    for fqn, grad in want.items():
        if grad is None:
            assert got[fqn] is None, fqn
        else:
            torch.testing.assert_close(got[fqn], grad, msg=fqn)


# ================================================================================================
# Mutations
# ================================================================================================

MUTATION_CASES = sorted(n for n, c in CASES.items() if c.features & MUTATING)


@pytest.mark.parametrize("keep_functional", [False, True], ids=["inplace", "functional"])
@pytest.mark.parametrize("name", MUTATION_CASES)
def test_mutations_after_each_call(name: str, keep_functional: bool) -> None:
    """Buffers, outputs and mutated user inputs equal eager's after each of three calls."""
    case = CASES[name]
    ep = export_case(case)
    passes = pipeline(keep_functional=keep_functional)
    m = lower(transform(import_ep(ep), passes))
    eager = eager_model(case)
    for _ in range(3):
        a_args, e_args = case.args(), case.args()
        assert_same(m(*a_args), eager(*e_args))
        torch.testing.assert_close(a_args, e_args)  # user-input mutation
        have, want = buffers(m), buffers(eager)
        assert set(have) == set(want)
        torch.testing.assert_close(have, want)


@pytest.mark.parametrize("name", sorted(n for n in EXTRA if n.startswith("buffer_mutation_cross")))
def test_preserved_module_and_cross_module_mutation(name: str) -> None:
    """``writer`` mutates its buffer, ``reader`` reads it; either may be preserved."""
    case = EXTRA[name]
    m, eager = purefx(export_case(case)), eager_model(case)
    for _ in range(3):
        assert_same(call(m, case), call(eager, case))
        torch.testing.assert_close(buffers(m), buffers(eager))


def test_buffer_mutation_torch_prints_purefx_does_not(capsys: pytest.CaptureFixture[str]) -> None:
    """torch's unflatten prints "Checking mutability" for a preserved mutating module."""
    ep = export_case(EXTRA["buffer_mutation_cross_preserve_writer"])
    torch.export.unflatten(copy.deepcopy(ep))
    assert "Checking mutability" in capsys.readouterr().out
    m = purefx(ep)
    call(m, EXTRA["buffer_mutation_cross_preserve_writer"])
    assert capsys.readouterr().out == ""


# ================================================================================================
# Preserved signatures
# ================================================================================================


@by_variant
def test_preserved_call_takes_eager_arguments(variant: str) -> None:
    _, m, eager = lowered("preserve_kwargs" + variant)
    x, y = randn(3, D, seed=5), randn(3, D, seed=6)
    assert_same(m.sub(x, y, gate=y * 2), eager.sub(x, y, gate=y * 2))
    assert_same(m.sub(x, y, gate=-y), eager.sub(x, y, gate=-y))


@by_variant
def test_preserved_nested_calls(variant: str) -> None:
    _, m, eager = lowered("preserve_nested" + variant)
    x = randn(3, D, seed=7)
    for path in ("outer", "outer.middle", "outer.middle.inner"):
        assert_same(m.get_submodule(path)(x), eager.get_submodule(path)(x))


@by_variant
def test_preserved_constant_input_and_output(variant: str) -> None:
    ep, m, eager = lowered("preserve_constant" + variant)
    x = randn(3, D, seed=8)
    got = m.sub(x, 2)
    assert_same(got, eager.sub(x, 2))
    assert got[1] == 3 and type(got[1]) is int
    # torch's unflattened module loses the int output
    assert torch_unflatten(ep).sub(x, 2)[1] != 3


@pytest.mark.parametrize("variant", ["", "[strict]"])
def test_preserved_constant_other_value_is_rejected(variant: str) -> None:
    """The program was specialized to ``k=2``: another ``k`` is bad input, not a wrong answer."""
    _, m, _ = lowered("preserve_constant" + variant)
    with pytest.raises(ir.PurefxError):
        m.sub(randn(3, D), 5)


@by_variant
def test_preserved_dynamic_shapes(variant: str) -> None:
    name = "preserve_dynamic" + variant
    _, m, eager = lowered(name)
    for batch in (2, 5, 9):
        x = randn(batch, 2, D, seed=batch)
        assert_same(m.sub(x), eager.sub(x))
        assert_same(m(x), eager(x))


PRESERVED = [
    (name, path) for name, case in sorted(CASES.items()) if case.preserve for path in case.preserve
]


@pytest.mark.parametrize("source", ["eager_copy", "eager_original"])
@pytest.mark.parametrize("name,path", PRESERVED)
def test_swap_preserved_module(name: str, path: str, source: str) -> None:
    """A preserved submodule can be replaced by the eager one (a copy or the object itself)."""
    case = CASES[name]
    _, m, eager = lowered(name)
    replacement = eager.get_submodule(path)
    if source == "eager_copy":
        replacement = copy.deepcopy(replacement)
    parent, _, leaf = path.rpartition(".")
    setattr(m.get_submodule(parent), leaf, replacement)
    assert m.get_submodule(path) is replacement
    assert_same(call(m, case), call(eager, case))
    if case.alt_args is not None:
        assert_same(call(m, case, alt=True), call(eager, case, alt=True))


@by_variant
def test_swap_preserved_module_for_users_module(variant: str) -> None:
    name = "preserve_kwargs" + variant
    _, m, eager = lowered(name)
    mine = OtherTwoArg()
    m.sub = mine
    eager.sub = copy.deepcopy(mine)
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))


@by_variant
def test_preserved_module_called_twice(variant: str) -> None:
    name = "preserve_twice" + variant
    _, m, eager = lowered(name)
    assert [n for n, _ in m.named_modules()] == ["", "sub", "sub.lin"]
    assert call_targets(m.graph) == ["sub", "sub"]
    assert len(m.sub.graphs) == 1
    x = randn(3, D, seed=9)
    assert_same(m.sub(m.sub(x) + 1), eager.sub(eager.sub(x) + 1))
    assert_same(call(m, CASES[name]), call(eager, CASES[name]))


# ================================================================================================
# Repeated calls
# ================================================================================================


@by_variant
def test_repeated_same_graph_is_one_graph(variant: str) -> None:
    _, m, _ = lowered("repeated_same_graph" + variant)
    assert call_targets(m.graph) == ["block", "block", "block"]
    assert len(m.block.graphs) == 1
    assert not isinstance(m.block, InterpreterModuleDispatcher)


@pytest.mark.parametrize(
    "base", ["repeated_diff_flag", "buffer_mutation_repeated", "repeated_diff_shapes"]
)
@by_variant
def test_repeated_calls_are_one_module(base: str, variant: str) -> None:
    """No ``foo@1`` anywhere: modules, state dict, parameters, buffers, generated code."""
    name = base + variant
    _, m, eager = lowered(name)
    names = [n for n, _ in m.named_modules(remove_duplicate=False)]
    assert names == [n for n, _ in eager.named_modules(remove_duplicate=False)]
    assert list(m.state_dict()) == list(eager.state_dict())
    assert not any("@" in n for n, _ in m.named_parameters(remove_duplicate=False))
    assert not any("@" in n for n in buffers(m))
    assert "@" not in m.print_readable(print_output=False)
    for _ in range(2):
        assert_same(call(m, CASES[name]), call(eager, CASES[name]))


@pytest.mark.parametrize("base", ["repeated_diff_flag", "buffer_mutation_repeated"])
def test_repeated_calls_torch_makes_at_modules(base: str) -> None:
    """Documents torch's behaviour that purefx fixes: ``block@1`` modules and state."""
    u = torch_unflatten(export_case(CASES[base]))
    assert any("@1" in n for n, _ in u.named_modules(remove_duplicate=False))
    assert any("@1" in k for k in u.state_dict())


# ================================================================================================
# Control flow
# ================================================================================================


@pytest.mark.parametrize("name", sorted(n for n in EXTRA if n.startswith("hop_")))
def test_hop_subgraphs_live_with_their_caller(name: str) -> None:
    """Bodies are held by the module whose graph runs them, outside the module tree (torch's
    unflatten registers them as submodules, so its tree is not eager's)."""
    case = EXTRA[name]
    ep = export_case(case)
    m, eager = purefx(ep), eager_model(case)
    subgraphs = [n for n, _ in held_bodies(m.body) if HOP_GRAPH.match(n)]
    assert subgraphs
    assert not held_bodies(m)
    for sub in subgraphs:
        assert isinstance(getattr(m.body, sub), nn.Module)
    assert [n for n, _ in m.named_modules()] == [n for n, _ in eager.named_modules()]
    assert any(HOP_GRAPH.search(n) for n, _ in torch_unflatten(ep).named_modules())
    assert_same(call(m, case), call(eager, case))


@pytest.mark.parametrize("base", ["cond", "map", "while_loop"])
def test_hop_at_root(base: str) -> None:
    _, m, eager = lowered(base)
    assert any(HOP_GRAPH.match(n) for n, _ in held_bodies(m))
    assert not any(HOP_GRAPH.match(n) for n, _ in m.named_children())
    assert_same(call(m, CASES[base]), call(eager, CASES[base]))
    if base == "cond":  # the other branch too
        x = -randn(3, D).abs() - 1
        assert_same(m(x), eager(x))


# ================================================================================================
# Calling
# ================================================================================================


@by_variant
def test_kwargs_in_any_order(variant: str) -> None:
    _, m, eager = lowered("kwargs" + variant)
    x, b = randn(3, D), randn(D, seed=1)
    assert_same(m(x, scale=2.0, bias=b), eager(x, bias=b, scale=2.0))
    assert_same(m(x, bias=b, scale=2.0), eager(x, bias=b, scale=2.0))


@pytest.mark.parametrize("variant", ["", "[strict]"])
def test_missing_kwarg_is_input_error(variant: str) -> None:
    _, m, _ = lowered("kwargs" + variant)
    with pytest.raises(ir.InputError):
        m(randn(3, D), bias=randn(D))


@by_variant
def test_pytree_inputs_and_outputs(variant: str) -> None:
    _, m, eager = lowered("pytree_outputs" + variant)
    x = randn(3, D, seed=3)
    got = m(x)
    assert_same(got, eager(x))
    assert got["aux"][1] is None and got["n"] == 3 and type(got["aux"][2]) is list
    _, m, eager = lowered("nested_inputs" + variant)
    case = CASES["nested_inputs"]
    assert_same(call(m, case), call(eager, case))


@by_variant
def test_dict_inputs_in_another_key_order(variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    ep, m, eager = lowered("nested_inputs" + variant)
    case = CASES["nested_inputs"]
    args, kwargs = case.args(), case.kwargs()
    swapped = {"cfg": dict(reversed(list(kwargs["cfg"].items())))}
    assert list(swapped["cfg"]) != list(kwargs["cfg"])
    want = eager(*args, **kwargs)
    assert_same(m(*args, **swapped), want)
    assert_same(ep.module()(*args, **swapped), want)
    assert capsys.readouterr().out == ""
    u = torch_unflatten(ep)
    with pytest.raises(TypeError):  # torch's unflatten rejects it (and prints)
        u(*args, **swapped)
    assert "Input treespec does not match" in capsys.readouterr().out


class DropExtra(FlatArgsAdapter):
    """Keeps the first leaves the exported program takes."""

    def adapt(self, target_spec, input_spec, input_args, metadata=None, obj=None):  # type: ignore[override]
        return list(input_args[: target_spec.num_leaves])


class WrongCount(FlatArgsAdapter):
    def adapt(self, target_spec, input_spec, input_args, metadata=None, obj=None):  # type: ignore[override]
        return list(input_args) + [None]


@pytest.mark.parametrize("variant", ["", "[decomp]", "[strict]"])
def test_flat_args_adapter(variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES["mlp_nested" + variant]
    ep = export_case(case)
    x, eager = randn(3, D), eager_model(case)
    m = purefx(ep, flat_args_adapter=DropExtra())
    assert_same(m(x, randn(2)), eager(x))
    assert_same(m(x), eager(x))
    assert capsys.readouterr().out == ""
    with pytest.raises(ir.InputError):
        purefx(ep)(x, randn(2))
    with pytest.raises(ir.InputError):
        purefx(ep, flat_args_adapter=WrongCount())(x, randn(2))
    u = torch_unflatten(ep, flat_args_adapter=DropExtra())
    assert_same(u(x, randn(2)), eager(x))
    assert "Adapting flat arg" in capsys.readouterr().out  # torch prints while adapting


def _torch_message(ep: torch.export.ExportedProgram, x: torch.Tensor) -> str:
    with pytest.raises(RuntimeError) as err:
        torch_unflatten(ep)(x)
    return str(err.value)


@by_variant
@pytest.mark.parametrize(
    "bad", ["above_max", "static_dim", "rank"], ids=["above_max", "static_dim", "rank"]
)
def test_input_constraint_errors(variant: str, bad: str) -> None:
    ep, m, _ = lowered("dynamic_batch" + variant)
    x = {"above_max": randn(65, D), "static_dim": randn(3, D + 1), "rank": randn(3, D, 1)}[bad]
    with pytest.raises(ir.InputConstraintError) as err:
        m(x)
    assert str(err.value) == _torch_message(ep, x)


@pytest.mark.parametrize("variant", ["", "[strict]"])
def test_input_constraint_errors_static(variant: str) -> None:
    ep, m, _ = lowered("mlp_nested" + variant)
    for x in (randn(4, D), randn(3, D + 2)):
        with pytest.raises(ir.InputConstraintError) as err:
            m(x)
        assert str(err.value) == _torch_message(ep, x)


@pytest.mark.parametrize("variant", ["", "[strict]"])
def test_wrong_dtype_is_a_purefx_error(variant: str) -> None:
    """A float64 input where float32 was exported: torch fails deep inside the graph with a raw
    RuntimeError; purefx's input check should name the input (DESIGN law 8)."""
    ep, m, _ = lowered("dynamic_batch" + variant)
    x = randn(3, D).double()
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        torch_unflatten(ep)(x)
    with pytest.raises(ir.PurefxError):
        m(x)


@pytest.mark.parametrize("variant", ["", "[decomp]"])
def test_check_input_constraints_false(variant: str) -> None:
    _, m, eager = lowered("dynamic_batch" + variant)
    x = randn(65, D, seed=4)
    m.check_input_constraints = False
    assert_same(m(x), eager(x))


@pytest.mark.parametrize(
    "name", ["mlp_nested", "preserve_nested[decomp]", "repeated_diff_flag", "cond"]
)
def test_print_readable(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, m, _ = lowered(name)
    text = m.print_readable(print_output=False)
    assert capsys.readouterr().out == ""
    assert isinstance(text, str)
    for path, sub in m.named_modules():
        if path and runs_graph(sub):
            assert f"class {path.rsplit('.', 1)[-1]}(" in text, path
    assert m.print_readable() == text
    assert text in capsys.readouterr().out


@pytest.mark.parametrize("name", ["mlp_nested", "dynamic_batch", "preserve_kwargs[strict]"])
def test_unflattened_module_attributes(name: str) -> None:
    ep, m, _ = lowered(name)
    assert isinstance(m.graph, torch.fx.Graph)
    assert [e.fqn for e in m.module_call_graph] == [e.fqn for e in ep.module_call_graph]
    for mine, theirs in zip(m.module_call_graph, ep.module_call_graph):
        if theirs.signature is None:
            assert mine.signature is None
        else:
            assert mine.signature.in_spec == theirs.signature.in_spec
            assert mine.signature.out_spec == theirs.signature.out_spec
    assert m.range_constraints == ep.range_constraints


@pytest.mark.parametrize("name", ["mlp_nested", "kwargs", "buffer_mutation"])
def test_symbolic_trace(name: str) -> None:
    case = CASES[name]
    _, m, eager = lowered(name)
    gm = torch.fx.symbolic_trace(m)
    assert isinstance(gm, torch.fx.GraphModule)
    assert_same(call(gm, case), call(eager, case))


def test_symbolic_trace_submodule() -> None:
    """Submodules trace too (more in test_lower_signatures.py); torch's cannot (see below)."""
    _, m, eager = lowered("mlp_nested")
    gm = torch.fx.symbolic_trace(m.block)
    x = randn(3, D)
    assert_same(gm(x), eager.block(x))


def test_symbolic_trace_fails_in_torch() -> None:
    """Documents torch: its unflattened module cannot be symbolically traced."""
    u = torch_unflatten(export_case(CASES["mlp_nested"]))
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(u)


@pytest.mark.parametrize("name", ["mlp_nested", "preserve_kwargs", "repeated_diff_flag"])
def test_torch_compile(name: str) -> None:
    torch._dynamo.reset()
    case = CASES[name]
    _, m, eager = lowered(name)
    assert_same(call(torch.compile(m, backend="eager"), case), call(eager, case))
    sub = {"mlp_nested": "block", "preserve_kwargs": "sub", "repeated_diff_flag": "block"}[name]
    compiled = torch.compile(m.get_submodule(sub), backend="eager")
    x = randn(3, D, seed=2)
    if name == "preserve_kwargs":
        assert_same(compiled(x, x, gate=x), eager.sub(x, x, gate=x))
    elif name == "mlp_nested":
        assert_same(compiled(x), eager.block(x))
    else:
        assert isinstance(compiled(x), torch.Tensor)


@pytest.mark.parametrize(
    "name", ["mlp_nested", "preserve_kwargs", "buffer_mutation", "kwargs", "pytree_outputs", "cond"]
)
def test_reexport(name: str) -> None:
    case = CASES[name]
    _, m, _ = lowered(name)
    again = torch.export.export(m, case.args(), case.kwargs(), strict=False)
    eager = eager_model(case)
    assert_same(call(again.module(), case), call(eager, case))


# ================================================================================================
# Interpreter mode and module classes
# ================================================================================================

INTERP_CASES = [
    "mlp_nested", "containers[decomp]", "preserve_kwargs", "preserve_nested[strict]",
    "repeated_diff_flag", "buffer_mutation[decomp]", "cond", "kwargs", "dynamic_view",
]  # fmt: skip


@pytest.mark.parametrize("interpreter", [True, False], ids=["interpreter", "codegen"])
@pytest.mark.parametrize("name", INTERP_CASES)
def test_modules_are_interpreter_modules(name: str, interpreter: bool) -> None:
    case = CASES[name]
    _, m, eager = lowered(name, interpreter=interpreter)
    running = [(p, s) for p, s in m.named_modules() if p and runs_graph(s)]
    running += [(f"{p}:{n}", b) for p, s in m.named_modules() for n, b in held_bodies(s)]
    assert running
    for path, sub in running:
        assert isinstance(sub, InterpreterModule), path
    assert_same(call(m, case), call(eager, case))
    assert_same(call(m, case), call(eager, case))
    if case.alt_args is not None:
        assert_same(call(m, case, alt=True), call(eager, case, alt=True))


def test_interpreter_preserved_submodule() -> None:
    _, m, eager = lowered("preserve_kwargs", interpreter=True)
    x, y = randn(3, D), randn(3, D, seed=1)
    assert_same(m.sub(x, y, gate=y), eager.sub(x, y, gate=y))


def test_dispatcher_class() -> None:
    _, m, _ = lowered("repeated_diff_flag")
    assert isinstance(m.block, InterpreterModuleDispatcher)


# ================================================================================================
# Where torch is wrong and purefx must be right
# ================================================================================================


def _snapshot(ep: torch.export.ExportedProgram) -> dict[str, Any]:
    tensors = {
        k: (v, v._version, v.detach().clone())
        for k, v in [*ep.state_dict.items(), *ep.constants.items()]
        if isinstance(v, torch.Tensor)
    }
    return {
        "tensors": tensors,
        "code": ep.graph_module.code,
        "nodes": [(n.name, n.op, str(n.target), str(n.args), dict(n.meta)) for n in ep.graph.nodes],
        "stacks": [str(n.meta.get("nn_module_stack")) for n in ep.graph.nodes],
        "gm_meta": dict(ep.graph_module.meta),
        "signature": str(ep.graph_signature),
        "call_graph": str(ep.module_call_graph),
        "state_ids": {k: id(v) for k, v in ep.state_dict.items()},
        "constant_ids": {k: id(v) for k, v in ep.constants.items()},
        "tokens": sum(n.target is torch.ops.higher_order.with_effects for n in ep.graph.nodes),
    }


PURITY_CASES = [
    "buffer_mutation", "buffer_mutation[decomp]", "buffer_mutation_repeated[strict,decomp]",
    "input_mutation[decomp]", "batchnorm_train", "effect_record[decomp]", "opaque_object",
    "tied_weights", "preserve_nested[decomp]", "cond[decomp]", "dynamic_view",
]  # fmt: skip


@pytest.mark.parametrize("name", PURITY_CASES)
def test_never_mutates_ep(name: str) -> None:
    case = CASES[name]
    ep = fresh_export(case)
    before = _snapshot(ep)
    m = purefx(ep)
    for _ in range(3):
        call(m, case)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1)
    call(m, case)
    after = _snapshot(ep)
    for key in ("code", "signature", "call_graph", "state_ids", "constant_ids", "tokens", "stacks"):
        assert after[key] == before[key], key
    for (n1, *rest1), (n2, *rest2) in zip(before["nodes"], after["nodes"], strict=True):
        assert n1 == n2 and rest1[:3] == rest2[:3]
        assert rest1[3].keys() == rest2[3].keys(), n1
        assert all(rest1[3][k] is rest2[3][k] for k in rest1[3]), n1
    assert after["gm_meta"].keys() == before["gm_meta"].keys()
    assert all(after["gm_meta"][k] is before["gm_meta"][k] for k in before["gm_meta"])
    for fqn, (tensor, version, value) in before["tensors"].items():
        assert tensor._version == version, fqn
        assert torch.equal(tensor, value), fqn
    copy.deepcopy(ep)  # still works
    call(ep.module(), case)


@pytest.mark.parametrize("name", ["buffer_mutation", "effect_record[decomp]"])
def test_torch_unflatten_writes_to_ep(name: str) -> None:
    """Documents torch: after its unflatten (and a call) the program is no longer intact."""
    case = CASES[name]
    ep = fresh_export(case)
    tokens = sum(n.target is torch.ops.higher_order.with_effects for n in ep.graph.nodes)
    with contextlib.redirect_stdout(io.StringIO()):
        u = torch.export.unflatten(ep)
        call(u, case)
    if tokens:
        after = sum(n.target is torch.ops.higher_order.with_effects for n in ep.graph.nodes)
        assert after < tokens
    with pytest.raises(RuntimeError):
        copy.deepcopy(ep)


@pytest.mark.parametrize(
    "name",
    ["mlp_nested", "buffer_mutation_cross[decomp]", "preserve_nested", "effect_record[decomp]",
     "repeated_diff_flag", "cond", "dynamic_batch", "nested_inputs"],
)  # fmt: skip
def test_prints_nothing(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[name]
    m = purefx(export_case(case))
    for _ in range(2):
        call(m, case)
    assert capsys.readouterr().out == ""


def _deepcopy(m: nn.Module) -> nn.Module:
    return copy.deepcopy(m)


def _pickle(m: nn.Module) -> nn.Module:
    return pickle.loads(pickle.dumps(m))


def _torch_save(m: nn.Module) -> nn.Module:
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


COPIERS = {"deepcopy": _deepcopy, "pickle": _pickle, "torch_save": _torch_save}


@pytest.mark.parametrize("how", sorted(COPIERS))
@pytest.mark.parametrize(
    "name",
    ["mlp_nested", "buffer_mutation", "repeated_diff_flag", "preserve_kwargs", "tied_weights",
     "shared_two_parents", "dynamic_batch"],
)  # fmt: skip
def test_copies_compute_the_same_and_are_independent(name: str, how: str) -> None:
    case = CASES[name]
    _, m, eager = lowered(name)
    initial = {k: v.clone() for k, v in m.state_dict().items()}
    twin = COPIERS[how](m)
    assert type(twin) is type(m)
    assert list(twin.state_dict()) == list(m.state_dict())
    assert_same(call(twin, case), call(eager, case))
    if name == "tied_weights":
        assert twin.dec.weight is twin.enc.weight and twin.lm_head.weight is twin.emb.weight
    if name == "shared_two_parents":
        assert twin.p1.shared is twin.p2.shared
    # calling (and mutating) the copy leaves the original as it was
    torch.testing.assert_close(dict(m.state_dict()), initial)
    with torch.no_grad():
        for tensor in twin.state_dict().values():
            tensor.add_(10)
    torch.testing.assert_close(dict(m.state_dict()), initial)
    assert_same(call(m, case), call(eager_model(case), case))


@pytest.mark.parametrize("interpreter", [True, False], ids=["interpreter", "codegen"])
def test_deepcopy_with_interpreter(interpreter: bool) -> None:
    _, m, eager = lowered("preserve_nested", interpreter=interpreter)
    assert_same(
        call(copy.deepcopy(m), CASES["preserve_nested"]), call(eager, CASES["preserve_nested"])
    )


@by_variant
def test_shared_modules_stay_shared(variant: str) -> None:
    _, m, _ = lowered("shared_two_parents" + variant)
    assert m.p1.shared is m.p2.shared
    _, m, _ = lowered("aliased_attr" + variant)
    assert m.a is m.b
    _, m, eager = lowered("shared_sequential" + variant)
    assert m.seq[0] is m.seq[2]
    assert len(m.seq) == 3
    assert_same(call(m, CASES["shared_sequential"]), call(eager, CASES["shared_sequential"]))


def test_shared_modules_torch_loses_identity() -> None:
    """Documents torch: ``u.a is u.b`` is false (non-strict export)."""
    u = torch_unflatten(export_case(CASES["aliased_attr"]))
    assert u.a is not u.b
    u = torch_unflatten(export_case(CASES["shared_two_parents"]))
    assert u.p1.shared is not u.p2.shared


@by_variant
def test_sequential_and_module_list(variant: str) -> None:
    _, m, eager = lowered("containers" + variant)
    x = randn(3, D, seed=11)
    assert isinstance(m.seq, nn.Sequential) and len(m.seq) == 3
    assert [layer for layer in m.seq] == [m.seq[0], m.seq[1], m.seq[2]]
    assert_same(m.seq[2](m.seq[1](m.seq[0](x))), eager.seq(x))
    assert_same(m.seq(x), eager.seq(x))
    assert isinstance(m.layers, nn.ModuleList) and len(m.layers) == 2
    assert [p for p, _ in m.layers.named_children()] == ["0", "1"]
    assert m.layers[1] is list(m.layers)[1]
    assert isinstance(m.layers[1], nn.Sequential) and len(m.layers[1]) == 2


@by_variant
def test_module_dict(variant: str) -> None:
    _, m, eager = lowered("containers" + variant)
    # A never-called ModuleDict leaves no class name in the program (see test_parameter_list_and
    # _dict); the holder keeps its behaviour: keys in order, len, string indexing.
    assert list(m.heads.keys()) == list(eager.heads.keys())
    assert len(m.heads) == 2
    assert m.heads["a"] is m.heads.a


def test_containers_torch_loses_behaviour() -> None:
    u = torch_unflatten(export_case(CASES["containers"]))
    with pytest.raises(TypeError):
        len(u.layers)


# ================================================================================================
# torch.nn models: plain, preserved sub-layer, decomposed
# ================================================================================================

NN_CASES = sorted(
    n for n in EXTRA if n.startswith(("nn_transformer", "transformer_encoder_", "mha_", "lstm_"))
)


@pytest.mark.parametrize("name", NN_CASES)
def test_nn_models(name: str) -> None:
    case = EXTRA[name]
    ep = export_case(case)
    m, eager = purefx(ep), eager_model(case)
    assert_same(call(m, case), call(eager, case))
    assert_same(call(m, case), call(ep.module(), case))
    assert list(m.state_dict()) == list(eager.state_dict())
    for path in case.preserve:
        assert runs_graph(m.get_submodule(path)), path


def test_lstm_preserved_decomposed_stale_signature() -> None:
    """``run_decompositions`` leaves the preserved ``rnn`` signature naming other nodes: torch's
    unflatten crashes; purefx must raise a purefx error, never compute something else."""
    case = attrs.evolve(
        EXTRA["lstm_preserve_rnn"], name="lstm_preserve_rnn[decomp]", decompose=True
    )
    ep = export_case(case)
    with pytest.raises(AttributeError):  # 'immutable_list' object has no attribute 'graph'
        torch_unflatten(ep)(*case.args())
    try:
        m = purefx(ep)
    except ir.PurefxError:
        return
    assert_same(call(m, case), call(eager_model(case), case))
