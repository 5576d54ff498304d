"""``split_by_tags`` and ``move_non_tensor_nodes_on_boundary`` against torch's ``split_utils``.

torch's functions are the reference: on hypothesis-generated tagged fx graphs, the purefx passes
(``lower(split_by_tags(import_graph_module(gm), tags))``) must give the same outputs, the same
children (names, order, placeholders, outputs, state), the same fqn mapping, and fail where torch
fails (with a purefx error instead of ``AssertionError``).
"""

from __future__ import annotations

import contextlib
import io
import operator

import pytest
import torch
import torch.fx
from hypothesis import given
from hypothesis import strategies as st
from torch.fx.passes import split_utils
from torch.fx.passes.shape_prop import ShapeProp
from torch.fx.passes.splitter_base import Subgraph

from ir import PassError, format_graph, format_program, import_ep, import_graph_module, verify
from lowering import lower
from lowering.hop_bodies import held_bodies
from transforms import move_non_tensor_nodes_on_boundary, split_by_tags
from transforms.passes.tag_split import node_tag

SHAPE = (3, 4)

# --- a hypothesis strategy for tagged fx graphs --------------------------------------------------

# (op, target, argument kinds, result kind); kinds: t tensor, s torch.Size, i int
_OPS = [
    ("call_function", torch.add, "tt", "t"),
    ("call_function", operator.mul, "tt", "t"),
    ("call_function", torch.sub, "tt", "t"),
    ("call_function", torch.maximum, "tt", "t"),
    ("call_function", torch.relu, "t", "t"),
    ("call_function", torch.tanh, "t", "t"),
    ("call_method", "neg", "t", "t"),
    ("call_method", "sigmoid", "t", "t"),
    ("call_method", "size", "t", "s"),
    ("call_function", operator.getitem, "s", "i"),
    ("call_function", operator.add, "ii", "i"),
    ("call_function", operator.mul, "ti", "t"),
    ("call_method", "view", "ts", "t"),
]
_STATE = ["w0", "sub.w1", "sub.inner.b0", "c0", "sub.tied"]
_TAG_NAMES = ["a", "main", "ro", "t3"]


def _root_module() -> torch.nn.Module:
    """A module holding every attribute ``_STATE`` names: parameters, a buffer, a plain tensor
    constant and a parameter tied to ``w0``."""
    gen = torch.Generator().manual_seed(0)
    root = torch.nn.Module()
    root.sub = torch.nn.Module()
    root.sub.inner = torch.nn.Module()
    root.w0 = torch.nn.Parameter(torch.randn(SHAPE, generator=gen))
    root.sub.w1 = torch.nn.Parameter(torch.randn(SHAPE, generator=gen))
    root.sub.inner.register_buffer("b0", torch.randn(SHAPE, generator=gen))
    root.c0 = torch.randn(SHAPE, generator=gen)
    root.sub.tied = root.w0
    return root


@st.composite
def tagged_graphs(draw, *, ordered: bool | None = None):
    """``(gm, tags, inputs)``: a random fx graph over (3, 4) tensors, ints and sizes, with every
    ``call_*`` node tagged. With ``ordered`` (drawn when ``None``) no node reads a later tag.

    Shrinks towards fewer nodes, fewer tags, the first operators and tags in order.
    """
    if ordered is None:
        ordered = draw(st.booleans())
    n_tags = draw(st.integers(1, 4))
    names = _TAG_NAMES[:n_tags]
    graph = torch.fx.Graph()
    values: list[tuple[torch.fx.Node, str, int]] = []  # (node, kind, tag index or -1)
    n_inputs = draw(st.integers(1, 2))
    for i in range(n_inputs):
        values.append((graph.placeholder(f"x{i}"), "t", -1))
    for _ in range(draw(st.integers(1, 10))):
        usable = [op for op in _OPS if all(any(k == v[1] for v in values) for k in op[2])]
        op, target, kinds, result = draw(st.sampled_from(usable))
        args = []
        for kind in kinds:
            if kind == "t" and draw(st.integers(0, 4)) == 0:
                node = graph.get_attr(draw(st.sampled_from(_STATE)))
                args.append((node, -1))
                values.append((node, "t", -1))
                continue
            pool = [v for v in values if v[1] == kind]
            node, _, tag = draw(st.sampled_from(pool))
            args.append((node, tag))
        lo = max([t for _, t in args] + [0]) if ordered else 0
        tag = draw(st.integers(lo, n_tags - 1))
        fx_args = [a for a, _ in args]
        if target is operator.getitem:
            fx_args.append(draw(st.integers(0, 1)))
        kwargs = {"alpha": 2} if target is torch.add and draw(st.booleans()) else {}
        node = graph.create_node(op, target, tuple(fx_args), kwargs)
        node.tag = names[tag]
        values.append((node, result, tag))
    tensors = [v[0] for v in values if v[1] == "t"]
    picked = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=4))
    shape = draw(st.sampled_from(["tuple", "single", "dict"]))
    if shape == "single":
        graph.output(picked[0])
    elif shape == "dict":
        graph.output({f"k{i}": v for i, v in enumerate(picked)})
    else:
        graph.output(tuple(picked))
    gm = torch.fx.GraphModule(_root_module(), graph)
    order = names if ordered else draw(st.permutations(names))
    gen = torch.Generator().manual_seed(1)
    inputs = tuple(torch.randn(SHAPE, generator=gen) for _ in range(n_inputs))
    return gm, list(order), inputs


def _flat(tree):
    return torch.utils._pytree.tree_leaves(tree)


def _same(a, b) -> None:
    assert torch.utils._pytree.tree_structure(a) == torch.utils._pytree.tree_structure(b)
    for x, y in zip(_flat(a), _flat(b)):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        else:
            assert x == y


def _names(tree) -> list:
    if isinstance(tree, (tuple, list)):
        return [_names(x) for x in tree]
    return tree.name


def _torch_split(gm, tags, return_tuple):
    try:
        return split_utils.split_by_tags(
            gm, tags, return_fqn_mapping=True, return_tuple=return_tuple
        )
    except AssertionError:
        return None


# --- Before / Expected ----------------------------------------------------------------------------


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x, y):
        a = torch.relu(x @ self.lin.weight.t())
        b = y * self.scale
        return a + b + self.lin.weight.sum(), self.lin.bias


def _small_tagged() -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(_Small())
    tags = iter(["ro", "ro", "main", "main", "main", "main", "main", "main"])
    for node in gm.graph.nodes:
        if node.op.startswith("call"):
            node.tag = next(tags)
    return gm


def test_split_by_tags_example():
    split, mapping = split_by_tags(
        import_graph_module(_small_tagged()), ["ro", "main"], return_fqn_mapping=True
    )
    verify(split)
    text = format_program(split, vals=False)
    expected_state = """\
  state:
    lin_bias: parameter <Parameter (4,) torch.float32> = lin.bias requires_grad
    ro.lin.weight: parameter <Parameter (4, 4) torch.float32> = lin.weight requires_grad
    main.scale: buffer <Tensor (4,) torch.float32> = scale
    main.lin.weight: parameter <Parameter (4, 4) torch.float32> = lin.weight requires_grad"""
    assert expected_state in text
    root = split.root_module
    assert [n for n, _ in root.children] == ["ro", "main"]
    assert format_graph(root.graph) == """\
%x = placeholder
%y = placeholder
%lin_bias = get_attr[lin_bias]()
%ro = call_module[ro](%x)
%main = call_module[main](%ro, %y)
return (%main, %lin_bias)"""
    assert format_graph(split.modules["ro"].graph) == """\
%x = placeholder
%lin_weight = get_attr[lin.weight]()
%t = call_method[t](%lin_weight)
%matmul = call_function[_operator.matmul](%x, %t)
return[output_1] %matmul"""
    assert mapping == {"lin.weight": "main.lin.weight", "scale": "main.scale"}


def test_example_agrees_with_torch():
    gm = _small_tagged()
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    expected, expected_map = split_utils.split_by_tags(gm, ["ro", "main"], return_fqn_mapping=True)
    split, mapping = split_by_tags(
        import_graph_module(gm), ["ro", "main"], return_fqn_mapping=True
    )
    assert mapping == expected_map
    got = lower(split)
    _same(got(x, y), expected(x, y))
    assert [n for n, _ in got.named_children()] == [n for n, _ in expected.named_children()]
    assert list(got.state_dict()) == list(expected.state_dict())


# --- against torch, on generated graphs -----------------------------------------------------------


@given(tagged_graphs(), st.booleans())
def test_split_by_tags_agrees_with_torch(case, return_tuple):
    gm, tags, inputs = case
    program = import_graph_module(gm)
    before = format_program(program, vals=False)
    expected = _torch_split(gm, tags, return_tuple)
    if expected is None:
        with pytest.raises(PassError, match="comes later in the tags"):
            split_by_tags(program, tags, return_tuple=return_tuple)
        return
    expected, expected_map = expected
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        split, mapping = split_by_tags(
            program, tags, return_tuple=return_tuple, return_fqn_mapping=True
        )
        got = lower(split)
    assert out.getvalue() == ""
    assert format_program(program, vals=False) == before  # pure
    verify(split)
    _same(got(*inputs), expected(*inputs))
    assert mapping == expected_map
    assert [n for n, _ in got.named_children()] == [n for n, _ in expected.named_children()] == [
        str(t) for t in tags
    ]
    assert [n for n, _ in got.named_parameters(remove_duplicate=False)] == [
        n for n, _ in expected.named_parameters(remove_duplicate=False)
    ]
    assert [n for n, _ in got.named_buffers()] == [n for n, _ in expected.named_buffers()]
    for name in tags:
        mine = split.modules[split.resolve(name)].graph
        theirs = getattr(expected, name).graph
        assert [n.name for n in mine.placeholders] == [
            n.target for n in theirs.nodes if n.op == "placeholder"
        ]
        assert _names(mine.outputs) == _names(theirs.output_node().args[0])
        assert mine.compute_count() == sum(
            1 for n in theirs.nodes if n.op.startswith("call")
        )


@given(tagged_graphs(ordered=False))
def test_split_by_tags_fails_where_torch_fails(case):
    gm, tags, _ = case
    program = import_graph_module(gm)
    if _torch_split(gm, tags, False) is None:
        with pytest.raises(PassError, match="comes later in the tags"):
            split_by_tags(program, tags)
    else:
        verify(split_by_tags(program, tags))


# --- errors ---------------------------------------------------------------------------------------


def test_untagged_node_is_a_pass_error():
    gm = _small_tagged()
    for node in gm.graph.nodes:
        if node.op == "call_method":
            del node.tag
            break
    with pytest.raises(PassError, match="has no tag"):
        split_by_tags(import_graph_module(gm), ["ro", "main"])


def test_unknown_tag_is_a_pass_error():
    with pytest.raises(PassError, match="not one of the tags"):
        split_by_tags(import_graph_module(_small_tagged()), ["ro"])


@pytest.mark.parametrize("tags", [["ro", "ro", "main"], ["ro", "ma.in"], ["", "ro"]])
def test_bad_tag_names_are_pass_errors(tags):
    with pytest.raises(PassError):
        split_by_tags(import_graph_module(_small_tagged()), tags)


def test_unused_tag_gets_an_empty_child_like_torch():
    gm = _small_tagged()
    tags = ["ro", "spare", "main"]
    expected = split_utils.split_by_tags(gm, tags)
    got = lower(split_by_tags(import_graph_module(gm), tags))
    assert [n for n, _ in got.named_children()] == tags
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    _same(got(x, y), expected(x, y))
    assert got.spare() == expected.spare() == ()


def test_tags_from_a_function_split_an_exported_program():
    from lowering.example_model import example_program

    ep = example_program()

    def stage(node):  # the embedding and first block, then the rest
        stack = node.meta.get("nn_module_stack") or {}
        early = any(path in ("embed", "blocks.0") for path, _ in stack.values())
        return "early" if early else "late"

    program = import_ep(ep)
    split = split_by_tags(program, ["early", "late"], tag_of=stage)
    verify(split)
    got = lower(split)
    assert [n for n, _ in got.named_children()][:2] == ["early", "late"]
    (args, kwargs) = ep.example_inputs
    _same(got(*args, **kwargs), ep.module()(*args, **kwargs))


def test_higher_order_subgraphs_go_with_the_child_that_reads_them():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y):
        z = torch.cond(x.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (x,))
        return z + y

    gm = make_fx(f)(torch.randn(3), torch.randn(3))
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    for node in calls:
        node.tag = "a" if node is not calls[-1] else "b"
    expected = split_utils.split_by_tags(gm, ["a", "b"])
    split = split_by_tags(import_graph_module(gm), ["a", "b"])
    verify(split)
    got = lower(split)
    x, y = torch.randn(3), torch.randn(3)
    _same(got(x, y), expected(x, y))
    _same(got(-x.abs(), y), expected(-x.abs(), y))
    # torch registers the branches as submodules; lower holds them in their reader, off the tree
    shown = [n for n, _ in got.named_modules()]
    held = [f"{p}.{b}" if p else b for p, m in got.named_modules() for b, _ in held_bodies(m)]
    assert held and not set(held) & set(shown)
    assert sorted(shown + held) == sorted(n for n, _ in expected.named_modules())


# --- move_non_tensor_nodes_on_boundary ------------------------------------------------------------


def _torch_moved(gm, tags, acc):
    by_tag = {t: [] for t in tags}
    for node in gm.graph.nodes:
        if node.op.startswith("call"):
            by_tag[node.tag].append(node)
    subgraphs = [Subgraph(is_acc=a, nodes=by_tag[t]) for t, a in zip(tags, acc)]
    with contextlib.redirect_stdout(io.StringIO()):
        split_utils.move_non_tensor_nodes_on_boundary(subgraphs)
    return {n.name: tags[i] for i, s in enumerate(subgraphs) for n in s.nodes}


@given(tagged_graphs(ordered=True), st.data())
def test_move_non_tensor_nodes_agrees_with_torch(case, data):
    gm, tags, inputs = case
    ShapeProp(gm).propagate(*inputs)
    acc = data.draw(st.lists(st.booleans(), min_size=len(tags), max_size=len(tags)))
    program = import_graph_module(gm)
    movable = dict(zip(tags, acc))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        moved = move_non_tensor_nodes_on_boundary(program, tags, movable=movable.__getitem__)
    assert out.getvalue() == ""
    assert moved == program
    expected = _torch_moved(gm, tags, acc)
    got = {n.name: node_tag(n) for n in moved.root_module.graph.nodes if n.name in expected}
    assert got == expected
    # still splittable, and the split still computes the same
    split = lower(split_by_tags(moved, tags))
    _same(split(*inputs), gm(*inputs))


def test_move_non_tensor_nodes_moves_a_size_to_its_reader():
    gm = torch.fx.symbolic_trace(lambda x: x.view(x.size()) * 2)
    tags = iter(["a", "b", "b"])
    for node in gm.graph.nodes:
        if node.op.startswith("call"):
            node.tag = next(tags)
    ShapeProp(gm).propagate(torch.randn(3, 4))
    program = import_graph_module(gm)
    moved = move_non_tensor_nodes_on_boundary(program)
    assert [node_tag(n) for n in moved.root_module.graph.nodes if n.op.startswith("call")] == [
        "b", "b", "b",
    ]
    assert move_non_tensor_nodes_on_boundary(moved) is moved
