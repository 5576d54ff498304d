"""``transforms.new_state.NewState``: fresh names (state, child modules, every path of a shared
module, tensor keys, placeholder names), where new inputs and ``state_order`` entries go, that
``p`` is never written; and the passes that add state through it surviving an ``export_ep`` /
``import_ep`` round trip of a module with a non-persistent buffer and a lifted constant."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "examples"))

from beforeafter import program

from ir import format_program, import_ep, verify
from ir import signature as sg
from ir import state as st
from ir.args import EMPTY_DICT
from ir.node import frozen_meta, new_node
from ir.state import Opaque
from lowering import export_ep, lower
from transforms import fold_constants, rewrite_nodes, transform
from transforms.new_state import NewState

aten = torch.ops.aten

BEFORE = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %b_a_x: buffer a.x persistent=True
    %c_k: constant_tensor k
    %x: user_input
  outputs:
    %mul: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32>
    a.x: buffer <Tensor (2,) torch.float32>
    k: constant <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %b_a_x = placeholder
      %c_k = placeholder
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_a_w)  # stack: a, a.b
      return (%mul,)
  module a: A
  module a.b: B"""

# one module object at two paths: what it owns is state under both
SHARED = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %p_b_w: parameter b.w
    %x: user_input
  outputs:
    %mul: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32>
    b.w: parameter <Parameter (2,) torch.float32> = a.w
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %p_b_w = placeholder
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_a_w)
      return (%mul,)
  module a: Scale
  module b: same object as a"""


def test_a_name_is_fresh_against_state_children_and_earlier_names():
    p = program(BEFORE)
    new = NewState(p)
    a = p.resolve("a")
    assert new.name(a, "x") == "x_1"  # a.x is state
    assert new.name(a, "b") == "b_1"  # a.b is a child module
    assert new.name(a, "x") == "x_2"  # x_1 taken by the first call
    assert new.name(a, "y") == "y"
    assert new.name(p.root, "a") == "a_1"
    assert new.name(p.root, "x") == "x"  # a.x is below a, not at the root


def test_a_name_is_fresh_under_every_path_of_a_shared_module():
    p = program(SHARED)
    assert p.module_paths(p.resolve("a")) == ("a", "b")
    p2 = p.replace(state=p.state.remove("a.w").set("a.w2", p.slot("a.w")),
                   state_order=("a.w2", "b.w"))
    new = NewState(p2)  # b.w alone takes "w" now: a's name must still skip it
    assert new.name(p2.resolve("a"), "w") == "w_1"


def test_a_tensor_key_and_a_placeholder_name_are_fresh():
    p = program(BEFORE)
    p = p.replace(tensors=p.tensors.set("a.y", Opaque(torch.zeros(2))))
    new = NewState(p)
    key = new.add(st.CONSTANT, ["a.y"], torch.ones(2))
    assert key == "a.y_1" and new.slots["a.y"] == st.Slot(st.CONSTANT, "a.y_1", True, False)
    assert new.placeholder_base(st.CONSTANT, "a.y") == "c_a_y"
    new.read_by(st.CONSTANT, "a.y", "c_a_y_1")
    assert new.inputs == {"c_a_y_1": sg.InputSpec(sg.CONSTANT_TENSOR, "c_a_y_1", "a.y")}


def test_new_inputs_go_where_export_puts_them():
    """A buffer after the tokens, parameters and buffers; a constant after all state (custom
    objects too); several of a kind in the order added; both before the user inputs."""
    p = program(BEFORE)
    new = NewState(p)
    for kind, fqn in [(st.CONSTANT, "c1"), (st.BUFFER, "b1"), (st.CONSTANT, "c2"),
                      (st.BUFFER, "b2")]:
        new.add(kind, [fqn], torch.zeros(()), persistent=False)
        new.read_by(kind, fqn, new.placeholder_base(kind, fqn))
    specs = tuple(sg.InputSpec(kind, name) for kind, name in [
        (sg.TOKEN, "t"), (sg.PARAMETER, "p"), (sg.BUFFER, "b"), (sg.CONSTANT_TENSOR, "c"),
        (sg.CUSTOM_OBJ, "o"), (sg.USER_INPUT, "x"),
    ])
    got = [s.name for s in new.input_specs(specs)]
    assert got == ["t", "p", "b", "b_b1", "b_b2", "c", "o", "c_c1", "c_c2", "x"]
    assert new.inputs["b_b1"].persistent is False and new.inputs["c_c1"].persistent is None
    users = (sg.InputSpec(sg.USER_INPUT, "x"),)
    assert [s.name for s in new.input_specs(users)] == ["b_b1", "b_b2", "c_c1", "c_c2", "x"]


def test_apply_places_state_inputs_and_placeholders_and_leaves_p_as_it_is():
    p = program(BEFORE)
    text = format_program(p, vals=False)
    versions = {k: t.value._version for k, t in p.tensors.items()}
    new = NewState(p)
    mul = p.root_module.graph.node("mul")
    path, mid = new.owner(mul)
    assert (path, mid) == ("a.b", p.resolve("a.b"))
    made = []
    for kind, base in [(st.CONSTANT, "_folded_mul"), (st.BUFFER, "seen")]:
        fqn = new.root_input(kind, base, torch.ones(2), mul)
        name = new.placeholder_base(kind, fqn)
        new.read_by(kind, fqn, name)
        assert fqn == f"a.b.{base}" and new.inputs[name].target == fqn
        made.append(new_node("placeholder", name, name, (), EMPTY_DICT,
                             frozen_meta({"val": mul.meta.get("val")})))
    graph = p.root_module.graph
    nodes = new.place(list(graph.nodes), p.signature.inputs, made)
    q = new.apply(p.replace(modules=p.modules.set(
        p.root, p.root_module.replace(graphs=(graph.of(nodes),)))))
    verify(q)
    assert [s.name for s in q.signature.inputs] == [
        "p_a_w", "b_a_x", "b_a_b_seen", "c_k", "c_a_b__folded_mul", "x"]
    assert [n.name for n in q.root_module.graph.placeholders] == [
        s.name for s in q.signature.inputs]
    assert q.state_order == ("a.w", "a.x", "a.b.seen", "k", "a.b._folded_mul")
    assert format_program(p, vals=False) == text  # p is not written
    assert {k: t.value._version for k, t in p.tensors.items()} == versions
    assert NewState(p).apply(p) is p  # nothing added: the program itself


def test_owner_is_the_root_when_the_stack_names_no_module():
    p = program(BEFORE.replace("# stack: a, a.b", "# stack: gone"))
    assert NewState(p).owner(p.root_module.graph.node("mul")) == ("", p.root)


def test_state_under_every_path_is_one_tensor_and_drop_takes_all_of_it():
    p = program(SHARED)
    new = NewState(p)
    a = p.resolve("a")
    assert new.attribute(st.BUFFER, a, "w", torch.ones(2)) == ("w_1", "a.w_1")
    assert new.order == ["a.w_1", "b.w_1"]
    kept = new.add(st.CONSTANT, ["k"], torch.ones(2))
    new.read_by(st.CONSTANT, "k", "c_k")
    assert new.slots["a.w_1"] is new.slots["b.w_1"] and new.slots["a.w_1"].tensor == "a.w_1"
    new.drop(["b.w_1"])
    assert set(new.slots) == {"k"} and set(new.tensors) == {kept} and new.order == ["k"]
    new.drop({"k"})
    assert not new.inputs and new.apply(p) is p


# --- the passes that add state, through export_ep and back ---------------------------------------


class _Mixed(torch.nn.Module):
    """A non-persistent buffer, a persistent one and a lifted constant (a plain tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.rand(4) + 0.5, persistent=False)
        self.register_buffer("shift", torch.randn(4))
        self.table = torch.randn(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale + self.table * 2 + self.shift


def _scale_by(make):
    """A visit that multiplies the buffer ``scale`` by new state ``make(e)`` (ones) where read."""

    def visit(node, e):
        if node.op == "call_function" and node.target is aten.mul.Tensor:
            held = [a for a in e.args if e.state(a) is not None and e.state(a)[0] == "scale"]
            if held:
                scaled = e.call(aten.mul.Tensor, held[0], make(e))
                return e.call(aten.mul.Tensor, *[scaled if a is held[0] else a for a in e.args])
        return None

    return visit


PASSES = {
    "fold_constants": fold_constants,
    "constant": lambda p: rewrite_nodes(p, _scale_by(lambda e: e.constant(torch.ones(4)))),
    "buffer": lambda p: rewrite_nodes(p, _scale_by(lambda e: e.add_buffer("one", torch.ones(4)))),
    "loose_buffer": lambda p: rewrite_nodes(
        p, _scale_by(lambda e: e.add_buffer("one", torch.ones(4), persistent=False))),
}


@pytest.fixture(scope="module")
def mixed():
    model = _Mixed().eval()
    args = (torch.randn(3, 4),)
    return model, args, torch.export.export(model, args)


@pytest.mark.parametrize("outlined", [False, True], ids=["flat", "outlined"])
@pytest.mark.parametrize("name", sorted(PASSES))
def test_new_state_survives_an_export_round_trip(mixed, name, outlined):
    """The ExportedProgram runs and computes what eager does; its signature names each
    placeholder and state entry once; reading it back gives the same state order, and the
    input program's shape environment gets no guard from the new state."""
    model, args, ep = mixed
    p = import_ep(ep)
    p = transform(p) if outlined else p
    guards = _guards(p)
    q = PASSES[name](p)
    assert q is not p and set(q.state) > set(p.state)
    verify(q)
    assert _guards(p) == guards  # a new fake tensor is static: nothing to guard on
    out = export_ep(q)
    torch.testing.assert_close(out.module()(*args), model(*args))
    torch.testing.assert_close(lower(q)(*args), model(*args))
    specs = out.graph_signature.input_specs
    placeholders = [n.name for n in out.graph.nodes if n.op == "placeholder"]
    assert [s.arg.name for s in specs] == placeholders
    assert sorted(s.target for s in specs if s.target) == sorted(q.state)
    back = import_ep(out)
    verify(back)
    assert back.state_order == q.state_order
    assert {f: s.kind for f, s in back.state.items()} == {f: s.kind for f, s in q.state.items()}


def _guards(p) -> int:
    val = next(n.meta["val"] for n in p.root_module.graph.nodes if "val" in n.meta) \
        if p.root_module.graph is not None else None
    env = getattr(getattr(val, "fake_mode", None), "shape_env", None)
    return len(env.guards) if env is not None else 0


class _Buffers(torch.nn.Module):
    """A parameter, a lifted constant and the buffers ``kinds`` names (``"p"``: persistent,
    ``"n"``: non-persistent), in that registration order."""

    def __init__(self, kinds: str) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        for i, kind in enumerate(kinds):
            self.register_buffer(f"b{i}", torch.rand(4) + 0.5, persistent=kind == "p")
        self.table = torch.randn(4)
        self.kinds = kinds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.w + self.table
        for i in range(len(self.kinds)):
            y = y * getattr(self, f"b{i}")
        return y


def _with_buffer(persistent: bool):
    """A visit that multiplies the first ``mul`` by a new buffer (ones)."""
    done: list[bool] = []

    def visit(node, e):
        if done or node.op != "call_function" or node.target is not aten.mul.Tensor:
            return None
        done.append(True)
        one = e.add_buffer("one", torch.ones(4), persistent=persistent)
        return e.call(aten.mul.Tensor, e.call(aten.mul.Tensor, *e.args), one)

    return visit


@pytest.mark.parametrize("persistent", [True, False], ids=["new_persistent", "new_loose"])
@pytest.mark.parametrize("kinds", ["", "pp", "nn", "np", "pn"],
                         ids=["no_buffers", "persistent", "loose", "loose_first", "both"])
def test_a_new_buffer_keeps_the_state_order_through_a_round_trip(kinds, persistent):
    """Wherever the other buffers are (none, persistent, non-persistent, both), a new buffer
    (persistent or not) is in ``state_order`` where ``import_ep`` reads it back from
    ``export_ep``; a non-persistent one with no other buffers stays before the constants (the
    round trip keeps it where the constants list it), and a
    persistent one after the non-persistent ones when those were the only buffers (and last)."""
    model = _Buffers(kinds).eval()
    args = (torch.randn(3, 4),)
    p = import_ep(torch.export.export(model, args))
    q = rewrite_nodes(p, _with_buffer(persistent))
    assert set(q.state) - set(p.state) == {"one"}
    verify(q)
    old = [f for f in q.state_order if f != "one"]
    if kinds == "nn" and persistent:  # torch puts loose buffers before the first persistent one
        assert q.state_order == ("w", "b0", "b1", "one", "table")
    else:
        assert old == list(p.state_order)  # old order kept
    out = export_ep(q)
    torch.testing.assert_close(out.module()(*args), model(*args))
    back = import_ep(out)
    assert back.state_order == q.state_order
    if not kinds and not persistent:
        assert q.state_order == ("w", "one", "table")
