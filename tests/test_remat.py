"""Values that cross a preserved call boundary outside its signature (``transforms.preserved.remat``).

One small program per class of crossing read: a no-op cast a block and its preserved norm share
(inside -> outside, read as an alias), a tensor a parent hands its preserved child as an
attribute (outside -> inside, recomputed), symbolic-size arithmetic made in one preserved call
and read in another (call -> call, from the reader's own sizes), and the reads that cannot be
recomputed (a random value, a user input the call is not given, a buffer updated in between).
Each has a Before/Expected test on the flat root graph and a numeric test of the whole pipeline
against eager, also after the preserved module is swapped for the user's own copy.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from ir import format_program, import_ep
from ir.args import EMPTY_DICT, IList, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.node import CALL_FUNCTION, Node
from ir.program import Program
from ir.verify import verify
from lowering import lower
from lowering.pass_laws import check_program
from transforms import transform
from transforms.passes.outline import outline
from transforms.preserved.remat import rematerialize

D = 4


class CastNorm(nn.Module):
    """An RMS norm that first casts its input to float32 (a no-op on a float32 input: export
    then reads the cast wherever the caller reads the input)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class CastBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = CastNorm()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.lin(self.norm(x))


class Scaled(nn.Module):
    """Reads a tensor its parent sets as an attribute: not one of its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.scale: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class SetsScale(nn.Module):
    def __init__(self, make_scale=lambda x, y: x.sum(-1, keepdim=True)) -> None:
        super().__init__()
        self.sub = Scaled()
        self.make_scale = make_scale

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.sub.scale = self.make_scale(x, y)
        return self.sub(x) + 1


class Halves(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0] // 2, -1)


class TwoHalves(nn.Module):
    """``a`` and ``b`` see the same derived batch size: export computes ``floordiv`` once, in
    ``a``, and ``b`` reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Halves()
        self.b = Halves()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x).sum(0) + self.b(y).sum(0)


def export(model: nn.Module, args: tuple, preserve: tuple[str, ...], **kw):
    return torch.export.export(model, args, preserve_module_call_signature=preserve, **kw)


def with_root_nodes(p: Program, nodes: list[Node]) -> Program:
    root = p.root_module.replace(graphs=(Graph.of(nodes),))
    return p.replace(modules=p.modules.set(p.root, root))


def replaced(p: Program, name: str, **changes) -> Program:
    """``p`` with root node ``name`` changed."""
    nodes = [n.replace(**changes) if n.name == name else n for n in p.root_module.graph.nodes]
    return with_root_nodes(p, nodes)


def inserted(p: Program, before: str, node: Node) -> Program:
    nodes = []
    for n in p.root_module.graph.nodes:
        if n.name == before:
            nodes.append(node)
        nodes.append(n)
    return with_root_nodes(p, nodes)


def assert_program(actual: Program, expected: Program) -> None:
    assert format_program(actual, vals=False) == format_program(expected, vals=False)
    assert actual == expected


def swapped(m: nn.Module, fqn: str, replacement: nn.Module) -> nn.Module:
    parent, _, name = fqn.rpartition(".")
    setattr(m.get_submodule(parent) if parent else m, name, replacement)
    return m


# --- inside -> outside: an alias of what the caller may read --------------------------------


def test_noop_cast_read_by_the_caller_reads_its_input() -> None:
    """Before: the residual ``add_1`` reads ``to`` (made inside preserved ``norm``).
    Expected: it reads ``x``, of which ``to`` is a no-op copy."""
    before = import_ep(export(CastBlock(), (torch.randn(2, D),), ("norm",)))
    expected = replaced(before, "add_1", args=(ref("x"), ref("linear")))
    assert_program(rematerialize(before), expected)


def test_noop_cast_block_runs_and_swaps() -> None:
    torch.manual_seed(0)
    model, x = CastBlock(), torch.randn(3, D)
    p = transform(import_ep(export(model, (x,), ("norm",))))
    verify(p)
    torch.testing.assert_close(lower(p)(x), model(x))
    user_norm = CastNorm()
    user_norm.forward = lambda t: torch.zeros_like(t)  # the swap must be seen by every reader
    got = swapped(lower(p), "norm", user_norm)(x)
    torch.testing.assert_close(got, x + model.lin(torch.zeros_like(x)))


# --- outside -> inside: recompute from what the call is given -------------------------------


def test_attribute_tensor_is_recomputed_inside_the_call() -> None:
    """Before: ``mul`` in preserved ``sub`` reads ``sum_1`` computed by the parent.
    Expected: a copy ``sum_1_1`` of it is made in ``sub`` just before ``mul`` and read there."""
    x, y = torch.randn(3, D), torch.randn(3, D)
    before = import_ep(export(SetsScale(), (x, y), ("sub",)))
    old = before.root_module.graph.node("sum_1")
    copy_node = Node(CALL_FUNCTION, "sum_1_1", old.target, old.args, old.kwargs)
    expected = inserted(before, "mul", copy_node)
    expected = replaced(expected, "mul", args=(ref("x"), ref("sum_1_1")))
    after = rematerialize(before)
    assert_program(after, expected)
    mul = after.root_module.graph.node("mul")
    assert after.root_module.graph.node("sum_1_1").meta["nn_module_stack"] == mul.meta[
        "nn_module_stack"
    ], "the copy runs in the reader's module call"
    assert rematerialize(after) == after  # idempotent


def test_attribute_tensor_model_matches_eager() -> None:
    model, x, y = SetsScale(), torch.randn(3, D), torch.randn(3, D)
    p = transform(import_ep(export(model, (x, y), ("sub",))))
    verify(p)
    torch.testing.assert_close(lower(p)(x, y), model(x, y))
    check_program(transform, import_ep(export(model, (x, y), ("sub",))), idempotent=True)


def test_slice_is_reported_in_the_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    p = import_ep(export(SetsScale(), (torch.randn(3, D), torch.randn(3, D)), ("sub",)))
    with caplog.at_level(logging.DEBUG, logger="purefx"):
        rematerialize(p)
    assert "remat: %sum_1 recomputed (read by %mul in 'sub'): 1 node(s) copied" in caplog.text


# --- call -> call: symbolic sizes --------------------------------------------------------------


def two_halves_program() -> tuple[nn.Module, torch.export.ExportedProgram]:
    b = torch.export.Dim("b", min=1, max=64)
    shapes = {"x": {0: 2 * b}, "y": {0: 2 * b}}
    model, args = TwoHalves(), (torch.randn(6, D), torch.randn(6, D))
    return model, export(model, args, ("a", "b"), dynamic_shapes=shapes)


def test_derived_size_read_by_another_call_comes_from_its_own_input() -> None:
    """Before: ``reshape_1`` in ``b`` reads ``floordiv`` of ``sym_size(x, 0)`` made in ``a``.
    Expected: ``b`` takes the size of its own input ``y`` and divides it again."""
    _, ep = two_halves_program()
    before = import_ep(ep)
    floordiv = before.root_module.graph.node("floordiv")
    size = Node(CALL_FUNCTION, "sym_size_int_1", torch.ops.aten.sym_size.int, (ref("y"), 0))
    div = Node(CALL_FUNCTION, "floordiv_1", floordiv.target, (ref("sym_size_int_1"), 2))
    expected = inserted(inserted(before, "reshape_1", size), "reshape_1", div)
    expected = replaced(expected, "reshape_1", args=(ref("y"), IList((ref("floordiv_1"), -1))))
    assert_program(rematerialize(before), expected)


def test_derived_size_program_runs_at_another_size() -> None:
    model, ep = two_halves_program()
    m = lower(transform(import_ep(ep)))
    x, y = torch.randn(10, D), torch.randn(10, D)
    torch.testing.assert_close(m(x, y), model(x, y))
    swapped(m, "b", Halves())
    torch.testing.assert_close(m(x, y), model(x, y))


# --- not recomputable: a PassError that says why and what to do -------------------------------


@pytest.mark.parametrize(
    ("make_scale", "why"),
    [
        (lambda x, y: torch.rand_like(x), r"%rand_like is random"),
        (lambda x, y: y.sum(-1, keepdim=True), r"reads the input %y, which is not passed"),
    ],
    ids=["random", "user_input"],
)
def test_value_that_cannot_be_recomputed_is_a_named_error(make_scale, why: str) -> None:
    model = SetsScale(make_scale)
    p = import_ep(export(model, (torch.randn(3, D), torch.randn(3, D)), ("sub",)))
    with pytest.raises(PassError, match=r"computed outside the preserved call 'sub'") as info:
        outline(p)
    message = str(info.value)
    assert "read by %mul in 'sub'" in message
    assert pytest.importorskip("re").search(why, message), message
    assert "preserve its parent instead" in message


def test_buffer_updated_between_is_not_recomputed() -> None:
    """``stale = total * 2`` made in a call, read after the buffer is updated in place."""

    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.zeros(D))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.total.add_(x.sum(0))
            return x * 2

    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = Counter()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(x)

    p = import_ep(export(Reads(), (torch.randn(3, D),), ("c",)))
    graph = p.root_module.graph
    first = next(n for n in graph.nodes if n.op == CALL_FUNCTION)
    stale = Node(CALL_FUNCTION, "stale", torch.ops.aten.mul.Tensor, (ref("b_c_total"), 2.0),
                 EMPTY_DICT, first.meta)
    nodes = list(graph.nodes)
    nodes.insert(nodes.index(first), stale)
    out = nodes[-1]
    nodes[-1] = out.replace(args=(tuple(out.args[0][:-1]) + (ref("stale"),),))
    p = with_root_nodes(p, nodes)
    p = p.replace(signature=p.signature)
    with pytest.raises(PassError, match=r"reads %b_c_total, which is updated before the reader runs"):
        rematerialize(p)


# --- sets of preserved modules -----------------------------------------------------------------


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = CastNorm()
        self.inner = Inner()
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.inner(self.norm(x))
        return self.out(self.inner(h)) + h


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


SETS = [
    ("blocks.0.norm", "blocks.0.inner"),  # siblings
    ("blocks.0", "blocks.0.norm"),  # parent and child
    ("blocks.0", "blocks.0.inner", "blocks.0.inner.lin"),  # nested
    ("blocks.0.inner",),  # called twice
    ("blocks.0.norm", "blocks.1.norm", "blocks.0.out", "blocks.1.out"),  # across blocks
]


@pytest.mark.parametrize("decompose", [False, True], ids=["training", "decomposed"])
@pytest.mark.parametrize("fqns", SETS, ids=["+".join(s) for s in SETS])
def test_any_set_of_preserved_modules_runs_and_swaps(fqns: tuple[str, ...], decompose: bool):
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(3, D)
    ep = export(copy.deepcopy(model), (x,), fqns)
    if decompose:
        ep = ep.run_decompositions()
    p = transform(import_ep(ep))
    verify(p)
    m = lower(p)
    for _ in range(2):
        torch.testing.assert_close(m(x), model(x))
    for fqn in fqns:
        swapped(m, fqn, copy.deepcopy(model.get_submodule(fqn)))
        torch.testing.assert_close(m(x), model(x), msg=f"after swapping {fqn}")


def test_an_alias_of_a_name_defined_nowhere_makes_no_alias_class():
    """A malformed graph (``clone(%nowhere)``, drawn by ``test_bad_input``'s malformed
    programs once views were read through a copy) gave a raw ``KeyError`` in the alias
    analysis; a name defined nowhere is in no class (the pass then raises a purefx error or
    returns, as the bad-input law asks)."""
    from transforms.preserved.remat import _alias_classes

    aten = torch.ops.aten
    x = Node("placeholder", "x", "x", (), EMPTY_DICT)
    a = Node(CALL_FUNCTION, "a", aten.clone.default, (ref("nowhere"),), EMPTY_DICT)
    b = Node(CALL_FUNCTION, "b", aten.clone.default, (ref("x"),), EMPTY_DICT)
    assert _alias_classes((x, a, b)) == _alias_classes((x, b))


class ReluCall(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class CopiedBeside(nn.Module):
    """Returns a call's output, a copy of it and a view of the copy."""

    def __init__(self):
        super().__init__()
        self.m0 = ReluCall()

    def forward(self, x):
        r = self.m0(x)
        c = r.clone()
        return c, r, c.view(-1)


def test_a_copy_made_inside_a_call_and_returned_beside_its_source_stays_a_copy() -> None:
    """Found by the pipeline's laws (torch 2.14.1, a generated program): ``%clone =
    clone(%relu)`` made inside preserved call ``m0`` (its module stack), which returns
    ``%relu`` only, and the root returning ``(%clone, %relu, view(%clone))``. The root's
    crossing read of ``%clone`` was resolved to its alias ``%relu``, the call's output: two
    outputs became one tensor (and the view of the copy a view of the output). A copy is no
    alias of its source: it is made again where it is read."""
    p = import_ep(export(CopiedBeside(), (torch.randn(2, 4),), ("m0",)))
    graph = p.root_module.graph
    relu = next(n for n in graph.nodes if n.target is torch.ops.aten.relu.default)
    clone = next(n for n in graph.nodes if n.target is torch.ops.aten.clone.default)
    inside = replaced(p, clone.name, meta=pmap_meta(clone, relu.meta["nn_module_stack"]))
    after = rematerialize(inside)
    outputs = after.root_module.graph.nodes[-1].args[0]
    assert outputs[0].name != outputs[1].name  # the copy is not the call's output
    check_program(rematerialize, inside, laws={"semantics"})


def pmap_meta(node: Node, stack) -> dict:
    return {**dict(node.meta), "nn_module_stack": stack}
