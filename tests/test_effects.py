"""``remove_effect_tokens``: with_effects calls become direct calls; tokens disappear."""

from __future__ import annotations

import operator

import pytest
import torch
from pyrsistent import pmap

from ir import (
    Graph,
    Module,
    Node,
    Opaque,
    PassError,
    Program,
    format_graph,
    format_program,
    import_ep,
    ref,
    verify,
)
from ir.signature import (
    BUFFER_MUTATION,
    OUTPUT_TOKEN,
    TOKEN,
    USER_INPUT,
    USER_OUTPUT,
    ExportSignature,
    InputSpec,
    OutputSpec,
)
from lowering.lower import lower
from transforms.passes.effect_tokens import remove_effect_tokens
from transforms.passes.mutations import functional_to_inplace
from transforms.pipeline import transform

try:
    from .zoo import CASES, eager_model, export_case, zoo_ops
except ImportError:  # tests/ is not a package
    from zoo import CASES, eager_model, export_case, zoo_ops

WITH_EFFECTS = torch.ops.higher_order.with_effects
EFFECT_CASES = sorted(n for n, c in CASES.items() if "effects" in c.features)
TOKEN_CASES = [n for n in EFFECT_CASES if CASES[n].decompose]
# Tokens only appear after run_decompositions: the decomposed variants of everything else, and
# the plain variants of the effect cases, have none.
TOKENLESS_CASES = sorted(
    n
    for n, c in CASES.items()
    if not c.strict and (c.decompose != ("effects" in c.features)) and "big" not in c.features
)


# --- a local model whose effectful ops return one value and two values ----------------------


def _define_ops() -> None:
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

    if hasattr(torch.ops.purefx_test_effects, "one"):
        return

    @torch.library.custom_op("purefx_test_effects::one", mutates_args=())
    def one(x: torch.Tensor) -> torch.Tensor:
        print(f"one {float(x.sum()):.4f}")
        return x * 2

    @one.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @torch.library.custom_op("purefx_test_effects::two", mutates_args=())
    def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        print(f"two {float(x.sum()):.4f}")
        return x + 1, x - 1

    @two.register_fake
    def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty_like(x), torch.empty_like(x)

    _register_effectful_op(torch.ops.purefx_test_effects.one.default, _EffectType.ORDERED)
    _register_effectful_op(torch.ops.purefx_test_effects.two.default, _EffectType.ORDERED)


_define_ops()


class Inner(torch.nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        a, b = torch.ops.purefx_test_effects.two(y)
        return a * b


class Results(torch.nn.Module):
    """``one`` returns a tensor, ``two`` (inside ``inner``) a pair; both print."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.ops.purefx_test_effects.one(x)
        return self.inner(y), y


class PrintAndMutate(torch.nn.Module):
    """Effects and a functionalized buffer mutation in one program."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.ops.aten._print("before")
        self.count.add_(x)
        torch.ops.aten._print("after")
        return x * self.count


def _export(model: torch.nn.Module, *args: torch.Tensor) -> torch.export.ExportedProgram:
    return torch.export.export(model, args).run_decompositions()


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, generator=torch.Generator().manual_seed(seed))


def _versions(ep: torch.export.ExportedProgram) -> dict[str, int]:
    tensors = {**ep.state_dict, **ep.constants}
    return {k: v._version for k, v in tensors.items() if isinstance(v, torch.Tensor)}


def _lines(*lines: str) -> str:
    return "\n".join(lines)


def _with_root(p: Program, nodes: list[Node], signature: ExportSignature | None = None) -> Program:
    root = p.root_module.replace(graphs=(Graph.of(nodes),))
    return p.replace(modules=p.modules.set(p.root, root), signature=signature or p.signature)


# --- Before / Expected ----------------------------------------------------------------------


def test_print_before_expected():
    p = import_ep(export_case(CASES["effect_print[decomp]"]))
    assert "with_effects" in format_graph(p.root_module.graph)
    after = remove_effect_tokens(p)
    assert format_graph(after.root_module.graph) == _lines(
        *[
            "%p_lin_weight = placeholder",
            "%p_lin_bias = placeholder",
            "%x = placeholder",
            "%with_effects = call_function[aten._print.default]('purefx-zoo')",
            "%permute = call_function[aten.permute.default](%p_lin_weight, [1, 0])",
            "%addmm = call_function[aten.addmm.default](%p_lin_bias, %x, %permute)",
            "return (%addmm,)",
        ]
    )
    assert [s.kind for s in after.signature.inputs] == ["parameter", "parameter", "user_input"]
    assert after.signature.outputs == (OutputSpec(USER_OUTPUT, "addmm"),)


def test_results_before_expected():
    """One result: readers of ``getitem(w, 1)`` read the op node, which takes that name; two
    results: ``getitem(w, i)`` becomes ``getitem(op, i - 1)``."""
    p = import_ep(_export(Results(), _x()))
    after = remove_effect_tokens(p)
    assert format_graph(after.root_module.graph) == _lines(
        *[
            "%x = placeholder",
            "%getitem_1 = call_function[purefx_test_effects.one.default](%x)",
            "%with_effects_1 = call_function[purefx_test_effects.two.default](%getitem_1)",
            "%getitem_3 = call_function[_operator.getitem](%with_effects_1, 0)",
            "%getitem_4 = call_function[_operator.getitem](%with_effects_1, 1)",
            "%mul = call_function[aten.mul.Tensor](%getitem_3, %getitem_4)",
            "return (%mul, %getitem_1)",
        ]
    )
    assert after.signature == ExportSignature(
        (InputSpec(USER_INPUT, "x"),),
        (OutputSpec(USER_OUTPUT, "mul"), OutputSpec(USER_OUTPUT, "getitem_1")),
    )


# Program's default range_constraints is a fresh Opaque per instance (compared by identity), so
# two hand-built Programs share one explicitly to be comparable.
_NO_RANGES = Opaque({})


def _ir_program(nodes: list[Node], inputs: tuple, outputs: tuple) -> Program:
    return Program(
        root="",
        modules=pmap({"": Module(type_name="M", graphs=(Graph.of(nodes),))}),
        signature=ExportSignature(inputs, outputs),
        range_constraints=_NO_RANGES,
    )


def _cf(name: str, target, *args) -> Node:
    return Node("call_function", name, target, tuple(args), meta={"tag": name})


def test_hand_built_before_expected():
    """Repeated ``getitem(w, 1)`` reads and output specs follow the op node's name."""
    aten = torch.ops.aten
    before = _ir_program(
        [
            Node("placeholder", "token", "token"),
            Node("placeholder", "x", "x"),
            _cf("w", WITH_EFFECTS, ref("token"), aten.sin.default, ref("x")),
            _cf("t", operator.getitem, ref("w"), 0),
            _cf("a", operator.getitem, ref("w"), 1),
            _cf("b", operator.getitem, ref("w"), 1),
            _cf("w2", WITH_EFFECTS, ref("t"), aten.var_mean.correction, ref("a")),
            _cf("t2", operator.getitem, ref("w2"), 0),
            _cf("v", operator.getitem, ref("w2"), 1),
            _cf("m", operator.getitem, ref("w2"), 2),
            _cf("y", aten.add.Tensor, ref("b"), ref("v")),
            Node("output", "output", "output", ((ref("t2"), ref("y"), ref("m"), ref("b")),)),
        ],
        (InputSpec(TOKEN, "token"), InputSpec(USER_INPUT, "x")),
        tuple(
            OutputSpec(k, n) for k, n in [(OUTPUT_TOKEN, "t2")] + [(USER_OUTPUT, n) for n in "ymb"]
        ),
    )
    expected = _ir_program(
        [
            Node("placeholder", "x", "x"),
            _cf("a", aten.sin.default, ref("x")),
            _cf("w2", aten.var_mean.correction, ref("a")),
            _cf("v", operator.getitem, ref("w2"), 0),
            _cf("m", operator.getitem, ref("w2"), 1),
            _cf("y", aten.add.Tensor, ref("a"), ref("v")),
            Node("output", "output", "output", ((ref("y"), ref("m"), ref("a")),)),
        ],
        (InputSpec(USER_INPUT, "x"),),
        tuple(OutputSpec(USER_OUTPUT, n) for n in "yma"),
    )
    after = remove_effect_tokens(before)
    assert after == expected, format_program(after, vals=False)
    verify(after)
    # the op node keeps the with_effects node's meta; getitems keep theirs
    by_name = after.root_module.graph.by_name()
    assert by_name["a"].meta["tag"] == "w" and by_name["v"].meta["tag"] == "v"


def test_meta_is_kept_and_val_moves_past_the_token():
    p = import_ep(_export(Results(), _x()))
    old = p.root_module.graph.by_name()
    new = remove_effect_tokens(p).root_module.graph.by_name()
    one, two = new["getitem_1"], new["with_effects_1"]
    assert one.meta["nn_module_stack"] == old["with_effects"].meta["nn_module_stack"]
    assert two.meta["nn_module_stack"] == old["with_effects_1"].meta["nn_module_stack"]
    assert "inner" in [path for path, _ in two.meta["nn_module_stack"].values()]
    assert one.meta["val"] is old["with_effects"].meta["val"][1]
    assert isinstance(two.meta["val"], tuple) and len(two.meta["val"]) == 2
    assert two.meta["stack_trace"] == old["with_effects_1"].meta["stack_trace"]


# --- semantics --------------------------------------------------------------------------------


def _run_twice(module: torch.nn.Module, make_args, capfd) -> tuple[list, str]:
    outs = [module(*make_args(seed)) for seed in (0, 1)]
    return outs, capfd.readouterr().out


@pytest.mark.parametrize("name", TOKEN_CASES)
def test_zoo_cases_behave_like_ep_module(name: str, capfd):
    case = CASES[name]
    ep = export_case(case)
    p = import_ep(ep)
    before_text, versions = format_program(p, vals=False), _versions(ep)
    snapshot = import_ep(ep)
    capfd.readouterr()

    after = remove_effect_tokens(p)
    assert capfd.readouterr().out == ""  # the pass itself prints nothing
    verify(after)
    assert not any(s.kind == TOKEN for s in after.signature.inputs)
    assert not any(s.kind == OUTPUT_TOKEN for s in after.signature.outputs)
    assert not any(n.target is WITH_EFFECTS for n in after.root_module.graph.nodes)

    log = zoo_ops().LOG
    runs = {}
    for label, module in [
        ("lowered", lower(after)),
        ("exported", ep.module()),
        ("eager", eager_model(case)),
    ]:
        start = len(log)
        outs = [module(*a, **case.kwargs()) for a in (case.args(), case.args())]
        runs[label] = (outs, capfd.readouterr().out, log[start:])
    for other in ("exported", "eager"):
        torch.testing.assert_close(runs["lowered"][0], runs[other][0])
        assert runs["lowered"][1] == runs[other][1]  # what was printed
        assert runs["lowered"][2] == pytest.approx(runs[other][2])  # what was recorded
    if "prints" in case.features:
        assert runs["lowered"][1].split() == ["purefx-zoo"] * 2
    else:
        assert len(runs["lowered"][2]) == 4

    assert p == snapshot and format_program(p, vals=False) == before_text
    assert _versions(ep) == versions
    assert remove_effect_tokens(after) is after


def test_local_results_behave_like_ep_module(capfd):
    ep, reference = _export(Results(), _x()), _export(Results(), _x())
    p = import_ep(ep)
    capfd.readouterr()
    lowered = lower(remove_effect_tokens(p))
    got, printed = _run_twice(lowered, lambda s: (_x(s),), capfd)
    want, want_printed = _run_twice(reference.module(), lambda s: (_x(s),), capfd)
    eager, eager_printed = _run_twice(Results(), lambda s: (_x(s),), capfd)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, eager)
    assert printed == want_printed == eager_printed != ""
    assert printed.splitlines()[:2] == [
        f"one {float(_x(0).sum()):.4f}",
        f"two {float(2 * _x(0).sum()):.4f}",
    ]


def test_lowering_with_tokens_matches_lowering_without(capfd):
    """``lower`` binds tokens itself; removing them first changes nothing observable."""
    p = import_ep(_export(Results(), _x()))
    capfd.readouterr()
    outs, printed = _run_twice(lower(p), lambda s: (_x(s),), capfd)
    outs_after, printed_after = _run_twice(
        lower(remove_effect_tokens(p)), lambda s: (_x(s),), capfd
    )
    torch.testing.assert_close(outs_after, outs)
    assert printed_after == printed != ""


def test_effects_then_mutations(capfd):
    ep, reference = _export(PrintAndMutate(), _x()), _export(PrintAndMutate(), _x())
    p = import_ep(ep)
    kinds = {s.kind for s in p.signature.outputs}
    assert {OUTPUT_TOKEN, BUFFER_MUTATION} <= kinds
    after = functional_to_inplace(remove_effect_tokens(p))
    verify(after)
    assert [s.kind for s in after.signature.outputs] == [USER_OUTPUT]
    assert after == remove_effect_tokens(functional_to_inplace(p))
    capfd.readouterr()
    lowered, exported = lower(after), reference.module()
    got, printed = _run_twice(lowered, lambda s: (_x(s),), capfd)
    want, want_printed = _run_twice(exported, lambda s: (_x(s),), capfd)
    torch.testing.assert_close(got, want)
    assert printed == want_printed and printed.split() == ["before", "after"] * 2
    torch.testing.assert_close(lowered.count.detach(), exported.count.detach())


def test_default_pipeline_puts_effects_in_their_modules(capfd):
    """Integration: after outlining, ``two`` runs inside ``inner``, and the same is printed."""
    after = transform(import_ep(_export(Results(), _x())))
    inner = after.modules[after.resolve("inner")].graph
    assert [n.target for n in inner.nodes if n.op == "call_function"][:1] == [
        torch.ops.purefx_test_effects.two.default
    ]
    capfd.readouterr()
    got, printed = _run_twice(lower(after), lambda s: (_x(s),), capfd)
    want, want_printed = _run_twice(_export(Results(), _x()).module(), lambda s: (_x(s),), capfd)
    torch.testing.assert_close(got, want)
    assert printed == want_printed != ""


# --- laws -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOKENLESS_CASES)
def test_identity_without_tokens(name: str):
    p = import_ep(export_case(CASES[name]))
    assert remove_effect_tokens(p) is p


@pytest.mark.parametrize("name", TOKEN_CASES)
def test_idempotent_and_deterministic(name: str):
    ep = export_case(CASES[name])
    once = remove_effect_tokens(import_ep(ep))
    assert remove_effect_tokens(once) is once
    assert remove_effect_tokens(import_ep(ep)) == once


def test_node_names_and_count():
    """Only tokens, with_effects nodes and absorbed getitems go; everything else keeps its name."""
    p = import_ep(_export(Results(), _x()))
    old = [n.name for n in p.root_module.graph.nodes]
    new = [n.name for n in remove_effect_tokens(p).root_module.graph.nodes]
    assert set(old) - set(new) == {"token", "with_effects", "getitem", "getitem_2"}
    assert set(new) <= set(old)


# --- bad input --------------------------------------------------------------------------------


def test_token_read_by_another_node_is_a_pass_error():
    p = import_ep(export_case(CASES["effect_print[decomp]"]))
    nodes = list(p.root_module.graph.nodes)
    out = nodes[-1]
    peek = Node("call_function", "peek", torch.ops.aten.clone.default, (ref("getitem"),))
    nodes[-1:] = [peek, out]
    with pytest.raises(PassError, match="'peek' reads effect token %getitem"):
        remove_effect_tokens(_with_root(p, nodes))


def test_with_effects_read_other_than_by_getitem_is_a_pass_error():
    p = import_ep(export_case(CASES["effect_print[decomp]"]))
    nodes = list(p.root_module.graph.nodes)
    peek = Node("call_function", "peek", torch.ops.aten.clone.default, (ref("with_effects"),))
    nodes[-1:] = [peek, nodes[-1]]
    with pytest.raises(PassError, match="'peek' reads with_effects node 'with_effects'"):
        remove_effect_tokens(_with_root(p, nodes))


def test_reading_a_result_an_op_does_not_return_is_a_pass_error():
    p = import_ep(export_case(CASES["effect_print[decomp]"]))
    nodes = list(p.root_module.graph.nodes)
    bad = Node("call_function", "bad", operator.getitem, (ref("with_effects"), 1))
    nodes[-1:] = [bad, nodes[-1]]
    with pytest.raises(PassError, match="'bad' reads result 1 .* returns 0 values"):
        remove_effect_tokens(_with_root(p, nodes))
