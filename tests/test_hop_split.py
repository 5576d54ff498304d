"""Set-grad and autocast bodies belong to the modules that made their nodes (issue #12, item 5).

``transforms.split_hop_bodies`` cuts each ``wrap_with_set_grad_enabled`` / ``wrap_with_autocast``
body into its module runs, so that after lowering every operator of a body sits in the graph (or
a body held by the graph) of the module whose code made it: a rotary table computed under
``no_grad`` inside an attention layer is in the rotary module, not in the layer's caller. The
models here are exported as training IR (non-strict and strict) and decomposed, lowered, and
checked against eager and ``ep.module()``: outputs, ``requires_grad``, gradients, dtypes, grad
mode and autocast state after the call, ``named_modules()``, where the body's operators went,
and the laws of the pass on these programs.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import strategies as st
from torch import nn
from zoo import Case, export_case, randn, register, seeded

from ir import import_ep
from lowering import export_ep, lower
from lowering.hop_bodies import held_bodies
from lowering.pass_laws import check_laws
from transforms import split_hop_bodies, transform

D = 4
MODES = ("wrap_with_set_grad_enabled", "wrap_with_autocast")


class Rope(nn.Module):
    """A rotary table from a buffer (no grad needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, D // 2), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.outer(torch.arange(x.shape[-2], dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class Attention(nn.Module):
    """Calls its ``rope`` child under ``no_grad``: the body spans ``attn`` and ``attn.rope``."""

    def __init__(self) -> None:
        super().__init__()
        self.rope = Rope()
        self.q = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            cos, sin = self.rope(x)
            cos = cos * 0.5
        return self.q(x) * cos + x * sin


class NoGradInChild(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.attn(x))


class AutocastBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.lin(x).relu()
        return h.float() + x


class AutocastInChild(nn.Module):
    """An autocast region inside a child: its ``Linear`` runs in bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        self.block = AutocastBlock()
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(x))


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x).relu()


class SpanParentChild(nn.Module):
    """A ``no_grad`` body that starts in the root, enters ``sub`` and ``sub.l``, and returns."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = Inner()
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            a = x * 2
            z = self.sub(a) + a
        return self.out(x) + z


class Nested(nn.Module):
    """An autocast region inside a ``no_grad`` region, each spanning several modules."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = Inner()
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            a = self.out(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = self.sub(a)
            z = y.float() + a
        return z + x


def _x() -> tuple[torch.Tensor]:
    return (randn(3, D),)


LOCAL: dict[str, Case] = {}
# (strict, decomposed); strict autocast exports fail in torch 2.13 (see tests/zoo.py)
for model, combos in (
    (NoGradInChild, ((False, False), (True, False), (False, True))),
    (AutocastInChild, ((False, False), (False, True))),
    (SpanParentChild, ((False, False), (True, False), (False, True))),
    (Nested, ((False, False), (False, True))),
):
    register(Case(model.__name__, seeded(model), _x), combos, into=LOCAL)
NAMES = sorted(LOCAL)


def purefx(ep: torch.export.ExportedProgram) -> nn.Module:
    return lower(transform(import_ep(ep)))


def body_ops(ep: torch.export.ExportedProgram) -> set[tuple[str, str]]:
    """``(module path, operator)`` for each operator inside a set-grad / autocast body (nested
    bodies included), where the path is the innermost module of the node's stack."""
    found = set()
    stack = [(ep.graph_module, False)]
    while stack:
        gm, inside = stack.pop()
        for node in gm.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
                is_mode = node.target.name() in MODES
                for arg in node.args:
                    if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                        stack.append((getattr(gm, arg.target), inside or is_mode))
            elif inside and isinstance(node.target, torch._ops.OpOverload):
                path = list(node.meta["nn_module_stack"].values())[-1][0]
                found.add((path, str(node.target)))
    return found


def ops_held(module: nn.Module) -> set[str]:
    """The operators of ``module``'s own graph and of every body it holds (nested too)."""
    found: set[str] = set()
    todo = [module]
    while todo:
        mod = todo.pop()
        if isinstance(getattr(mod, "graph", None), torch.fx.Graph):
            found.update(str(n.target) for n in mod.graph.nodes if n.op == "call_function")
        todo.extend(body for _, body in held_bodies(mod))
    return found


@pytest.fixture(scope="module", params=NAMES)
def built(request: pytest.FixtureRequest) -> tuple[Case, Any, nn.Module, nn.Module]:
    case = LOCAL[request.param]
    ep = export_case(case)
    return case, ep, purefx(ep), case.make()


def test_the_programs_have_mode_bodies(built) -> None:
    """The test is about something: training IR keeps the bodies (decomposing inlines them)."""
    case, ep, _, _ = built
    assert bool(body_ops(ep)) != case.decompose


def test_every_body_operator_is_in_the_module_that_made_it(built) -> None:
    _, ep, m, _ = built
    for path, op in sorted(body_ops(ep)):
        assert op in ops_held(m.get_submodule(path)), (path, op)
        text = m.get_submodule(path).print_readable(print_output=False)
        assert op.rpartition(".")[0] in text


def test_the_bodies_leave_the_caller(built) -> None:
    """Before: a body made in ``attn.rope`` ran from ``attn``'s graph (or the root's)."""
    case, ep, m, _ = built
    if case.decompose:
        pytest.skip("no body")
    made_in = {path for path, _ in body_ops(ep)}
    for path, _ in m.named_modules():
        if path not in made_in:
            continue
        held = held_bodies(m.get_submodule(path))
        assert held, f"{path!r} made body nodes but holds no body"


def test_tree_equals_eager(built) -> None:
    _, _, m, eager = built
    assert [n for n, _ in m.named_modules()] == [n for n, _ in eager.named_modules()]
    assert list(m.state_dict()) == list(eager.state_dict())


def test_numerics_gradients_and_modes(built) -> None:
    case, ep, m, eager = built
    for outer in (torch.enable_grad, torch.no_grad):
        xs = [case.args()[0].requires_grad_() for _ in range(3)]
        with outer():
            before = torch.is_grad_enabled()
            got, want, ref = m(xs[0]), eager(xs[1]), ep.module()(xs[2])
            assert torch.is_grad_enabled() == before
            assert not torch.is_autocast_enabled("cpu")
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got, ref)
        assert got.dtype == want.dtype == ref.dtype
        assert got.requires_grad == ref.requires_grad
        if got.requires_grad:
            got.sum().backward()
            ref.sum().backward()
            torch.testing.assert_close(xs[0].grad, xs[2].grad)
        if case.decompose:
            continue  # run_decompositions drops the grad mode of a body (torch's semantics)
        assert got.requires_grad == want.requires_grad
        if got.requires_grad:
            want.sum().backward()
            torch.testing.assert_close(xs[0].grad, xs[1].grad)


def test_autocast_outside_is_kept(built) -> None:
    case, _, m, eager = built
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = m(*case.args()), eager(*case.args())
        assert torch.is_autocast_enabled("cpu")
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)


def test_export_ep_round_trip(built) -> None:
    case, ep, _, _ = built
    out = export_ep(transform(import_ep(ep)))
    torch.testing.assert_close(out.module()(*case.args()), ep.module()(*case.args()))


def test_compiles_in_one_graph(built) -> None:
    case, _, m, eager = built
    torch._dynamo.reset()
    try:
        compiled = torch.compile(m, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(*case.args()), eager(*case.args()))
    finally:
        torch._dynamo.reset()


def test_laws_of_the_pass_on_these_programs() -> None:
    programs = [import_ep(export_case(LOCAL[n])) for n in NAMES]
    programs += [  # preserved calls made inside a set-grad body
        import_ep(torch.export.export(seeded(m)(), _x(), preserve_module_call_signature=(f,)))
        for m, f in ((NoGradInChild, "attn.rope"), (SpanParentChild, "sub"))
    ]
    check_laws(
        split_hop_bodies,
        programs=st.sampled_from(programs),
        idempotent=True,
        max_examples=len(programs),
    )


def test_the_pass_changes_each_training_program() -> None:
    """Every training-IR model here has a body away from its call's module: the pass acts."""
    for name in NAMES:
        p = import_ep(export_case(LOCAL[name]))
        assert (split_hop_bodies(p) is p) == LOCAL[name].decompose, name


def test_a_preserved_module_that_makes_the_body() -> None:
    """``attn`` preserved: its body runs split inside its preserved graph, and the module can
    be swapped for the eager one."""
    ep = torch.export.export(seeded(NoGradInChild)(), _x(), preserve_module_call_signature=("attn",))
    eager = seeded(NoGradInChild)()
    m = purefx(ep)
    torch.testing.assert_close(m(*_x()), eager(*_x()))
    assert [n for n, _ in m.named_modules()] == [n for n, _ in eager.named_modules()]
    for path, op in body_ops(ep):
        assert op in ops_held(m.get_submodule(path)), (path, op)
    m.attn = eager.attn
    torch.testing.assert_close(m(*_x()), eager(*_x()))


NESTED_GAP = pytest.mark.xfail(
    strict=True, reason="not yet: a preserved call inside a body nested in another body is left "
    "unsplit (it runs, but the preserved module has no graph)",
)
PRESERVED_INSIDE = [
    (NoGradInChild, "attn.rope"),
    (SpanParentChild, "sub"),
    (SpanParentChild, "sub.l"),
    pytest.param(AutocastInChild, "block.lin", marks=pytest.mark.xfail(
        strict=True, reason="not yet: a preserved call inside an autocast body is left unsplit "
        "(a module swapped in for it would have to run under autocast, at the call site)",
    ), id="AutocastInChild-block.lin"),
    pytest.param(Nested, "sub", marks=NESTED_GAP, id="Nested-sub"),
    pytest.param(Nested, "sub.l", marks=NESTED_GAP, id="Nested-sub.l"),
]


def doubled(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose outputs are doubled (a visible swap)."""
    new = copy.deepcopy(module)
    new.register_forward_hook(lambda m, a, out: pytree.tree_map(lambda t: t * 2, out))
    return new


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("model, preserve", PRESERVED_INSIDE)
def test_a_preserved_call_made_inside_a_body(model: type, preserve: str, strict: bool) -> None:
    """Export leaves the signature of a call made inside a body empty (its tracepoints stay in
    the body); the pass reads it from them, so the call is preserved and can be swapped."""
    if strict and model in (Nested, AutocastInChild):
        pytest.skip("torch 2.13 cannot strict-export these autocast regions")
    ep = torch.export.export(
        seeded(model)(), _x(), strict=strict, preserve_module_call_signature=(preserve,)
    )
    entry = next(e for e in ep.module_call_graph if e.fqn == preserve)
    assert not entry.signature.inputs and not entry.signature.outputs  # what torch leaves
    eager = seeded(model)()
    m = purefx(ep)
    torch.testing.assert_close(m(*_x()), eager(*_x()))
    torch.testing.assert_close(m(*_x()), ep.module()(*_x()))
    assert [n for n, _ in m.named_modules()] == [n for n, _ in eager.named_modules()]
    for path, op in body_ops(ep):
        if path == preserve or path.startswith(preserve + "."):
            continue  # a preserved call's graph keeps the call's own structure
        assert op in ops_held(m.get_submodule(path)), (path, op)
    before = eager(*_x())
    swap = doubled(eager.get_submodule(preserve))
    parent, _, name = preserve.rpartition(".")
    setattr(m.get_submodule(parent), name, swap)
    setattr(eager.get_submodule(parent), name, copy.deepcopy(swap))
    want = eager(*_x())
    assert not torch.allclose(want, before)
    torch.testing.assert_close(m(*_x()), want)
