"""The rewriting kernel (``transforms.kernel``) as ``rewrite_nodes`` drives it, and
``verify(p, vals=True)``: an emitted in-place write is refused unless the edit created what it
writes; values a visit creates and does not use leave nothing behind (their metadata asserts
included); a change of dtype or shape inside a module is derived again in its callers, or
refused where a signature names the value. Before/Expected on the IR text, flat and outlined,
numerics against eager, and a law on generated programs."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from kernel_support import Heard

from ir import PassError, VerifyError, format_program, import_ep, verify
from ir.args import EMPTY_DICT as EMPTY
from ir.args import Ref
from ir.graph import Graph
from ir.node import CALL_FUNCTION
from ir.strategies.programs import programs
from lowering import lower
from tests.outlined_programs import outlined_programs
from transforms import kernel as kn
from transforms import rewrite_nodes, transform

aten = torch.ops.aten


class Inner(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


class Top(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Inner()

    def forward(self, x):
        return self.a(x).sum(0, keepdim=True)


class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


def _top(level: str):
    x = torch.randn(3, 4)
    p = import_ep(torch.export.export(Top(), (x,)))
    return x, (p if level == "flat" else transform(p))


def _val(p, graph_nodes, name):
    return next(n for n in graph_nodes if n.name == name).meta["val"]


# --- item 3: an edit that writes is a write the editor knows ---------------------------------------


def sigmoid_in_place_of_input(node, e):
    if node.target is aten.relu.default:
        e.call(aten.sigmoid_.default, e.args[0])


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_an_emitted_in_place_write_of_a_user_input_is_refused(level):
    _, p = _top(level)
    what = "a user input" if level == "flat" else "an input of the module's graph"
    with pytest.raises(PassError, match=(
        rf"aten.sigmoid_.default emitted at node 'relu' writes %x in place, which is {what}; "
        r".*use the functional operator.*e.write_buffer"
    )):
        rewrite_nodes(p, sigmoid_in_place_of_input)


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_an_out_form_or_copy_into_a_value_the_program_reads_is_refused(level):
    _, p = _top(level)

    def add_out(node, e):
        if node.target is aten.mul.Tensor:
            e.call(aten.add.out, e.args[0], e.args[0], out=e.args[0])  # relu, read by mul

    with pytest.raises(PassError, match="aten.add.out emitted at node 'mul' writes %relu.*"
                       "a value the program computes"):
        rewrite_nodes(p, add_out)

    def copy_through_a_view(node, e):
        if node.target is aten.mul.Tensor:
            view = e.call(aten.view.default, e.args[0], [-1])  # a view of relu: not fresh
            e.call(aten.copy_.default, view, view)

    with pytest.raises(PassError, match="aten.copy_.default emitted at node 'mul' writes %view"):
        rewrite_nodes(p, copy_through_a_view)


def test_writing_a_parameter_in_place_is_refused_with_the_buffer_advice():
    p = import_ep(torch.export.export(Lin(), (torch.randn(2, 4),)))

    def zero_weight(node, e):
        if node.target is aten.linear.default:
            e.call(aten.zero_.default, e.args[1])

    with pytest.raises(PassError, match="writes %p_lin_weight in place, which is parameter "
                       "'lin.weight'.*e.write_buffer"):
        rewrite_nodes(p, zero_weight)


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_an_in_place_write_of_a_fresh_value_is_kept_and_computes_what_eager_does(level):
    x, p = _top(level)

    def relu_in_place_of_a_copy(node, e):
        if node.target is aten.relu.default:
            fresh = e.call(aten.clone.default, e.args[0])
            return e.call(aten.relu_.default, fresh)
        return None

    q = rewrite_nodes(p, relu_in_place_of_a_copy)
    verify(q, vals=True)
    text = format_program(q, vals=False)
    assert "%clone = call_function[aten.clone.default](%x)" in text
    assert "%relu_ = call_function[aten.relu_.default](%clone)" in text
    assert "%mul = call_function[aten.mul.Tensor](%relu_, 2)" in text
    before = x.clone()
    torch.testing.assert_close(lower(q)(x), Top()(x))
    assert torch.equal(x, before)  # the caller's tensor is not written


class ReluCosNeg(torch.nn.Module):
    def __init__(self, neg_first: bool):
        super().__init__()
        self.neg_first = neg_first

    def forward(self, x):
        a = torch.relu(x)
        if self.neg_first:
            d = torch.neg(x)
            return torch.cos(a), d
        c = torch.cos(a)
        return c, torch.neg(x)


def _neg_becomes_relu_and_cos_writes_it(node, e):
    if node.target is aten.neg.default:
        return Ref("relu")  # the readers of neg (an output) read relu now
    if node.target is aten.cos.default:
        return e.call(aten.sigmoid_.default, e.args[0])  # relu: its only reader was cos
    return None


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_a_write_through_a_value_that_replaced_another_node_is_refused(level):
    # neg is replaced by relu first: relu is read by neg's readers too, so cos may not write it
    p = import_ep(torch.export.export(ReluCosNeg(True), (torch.randn(3, 4),)))
    p = p if level == "flat" else transform(p)
    with pytest.raises(PassError, match=(
        r"aten.sigmoid_.default emitted at node 'cos' writes %relu in place, which is a value "
        "the program computes that another node reads"
    )):
        rewrite_nodes(p, _neg_becomes_relu_and_cos_writes_it)


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_a_replacement_by_a_value_written_in_place_before_is_refused(level):
    # cos writes relu in place (its only reader), then neg is replaced by relu: it would read
    # the written value
    p = import_ep(torch.export.export(ReluCosNeg(False), (torch.randn(3, 4),)))
    p = p if level == "flat" else transform(p)
    with pytest.raises(PassError, match=(
        r"visit replaces node 'neg' with %relu, which aten.sigmoid_.default emitted at node "
        r"'cos' wrote in place before; read the result of that write"
    )):
        rewrite_nodes(p, _neg_becomes_relu_and_cos_writes_it)


def test_a_private_write_read_again_or_kept_by_its_node_is_refused():
    p = import_ep(torch.export.export(ReluCosNeg(False), (torch.randn(3, 4),)))

    def write_then_read(node, e):
        if node.target is aten.cos.default:
            e.call(aten.sigmoid_.default, e.args[0])
            return e.call(aten.cos.default, e.args[0])  # reads relu after the write

    with pytest.raises(PassError, match=r"a node emitted at node 'cos' reads %relu, which "
                       r"aten.sigmoid_.default emitted at node 'cos' wrote in place before"):
        rewrite_nodes(p, write_then_read)

    def write_and_keep(node, e):
        if node.target is aten.cos.default:
            e.call(aten.sigmoid_.default, e.args[0])
            return node.ref  # cos stays and reads the written relu

    with pytest.raises(PassError, match=r"node 'cos' writes %relu in place"):
        rewrite_nodes(p, write_and_keep)


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_a_write_through_a_set_alias_of_an_input_is_refused(level):
    # set_ makes the fresh clone a view of x: the write reaches x (ir.effects.aliased_args)
    _, p = _top(level)
    what = "a user input" if level == "flat" else "an input of the module's graph"

    def write_through_set(node, e):
        if node.target is aten.relu.default:
            fresh = e.call(aten.clone.default, e.args[0])
            return e.call(aten.relu_.default, e.call(aten.set_.source_Tensor, fresh, e.args[0]))
        return None

    with pytest.raises(PassError, match=rf"aten.relu_.default emitted at node 'relu' writes "
                       rf"%set_ in place, which is {what}"):
        rewrite_nodes(p, write_through_set)


def test_a_private_write_of_an_unshared_intermediate_is_kept():
    x = torch.randn(3, 4)
    p = import_ep(torch.export.export(ReluCosNeg(False), (x,)))

    def cos_in_place(node, e):
        if node.target is aten.cos.default:
            return e.call(aten.cos_.default, e.args[0])  # relu: read by cos only
        return None

    q = rewrite_nodes(p, cos_in_place)
    assert "%cos_ = call_function[aten.cos_.default](%relu)" in format_program(q, vals=False)
    got = lower(q)(x)
    torch.testing.assert_close(got[0], torch.cos(torch.relu(x)))
    torch.testing.assert_close(got[1], -x)


# --- item 2: values a visit creates and does not use leave nothing --------------------------------


def _fake_quant(w):
    s = w.abs().max() / 127
    return (w / s).round().clamp(-128, 127).to(torch.int8).to(torch.float32) * s


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_an_unused_apply_leaves_nothing_its_asserts_included(level):
    p = import_ep(torch.export.export(Lin(), (torch.randn(2, 4),)))
    p = p if level == "flat" else transform(p)

    def quantize_and_forget(node, e):
        if node.target is aten.linear.default:
            e.apply(_fake_quant, e.args[1])

    assert rewrite_nodes(p, quantize_and_forget) is p


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_a_used_apply_keeps_its_asserts(level):
    torch.manual_seed(0)
    m = Lin()
    x = torch.randn(2, 4)
    p = import_ep(torch.export.export(m, (x,)))
    p = p if level == "flat" else transform(p)

    def quantize(node, e):
        if node.target is aten.linear.default:
            e.args = (e.args[0], e.apply(_fake_quant, e.args[1]), *e.args[2:])

    q = rewrite_nodes(p, quantize)
    verify(q, vals=True)
    text = format_program(q, vals=False)
    assert "%to = call_function[aten.to.dtype](%clamp, torch.int8)" in text
    assert "_assert_tensor_metadata" in text  # the cast is kept, so are its checks
    want = torch.nn.functional.linear(x, _fake_quant(m.lin.weight), m.lin.bias)
    torch.testing.assert_close(lower(q)(x), want)


# --- item 2: metadata never lies ------------------------------------------------------------------


def first_row(node, e):
    if node.target is aten.relu.default:
        return e.call(aten.slice.Tensor, e.args[0], 0, 0, 1)
    return None


def test_a_shape_change_inside_a_module_reaches_its_call_in_the_parent():
    x, p = _top("outlined")
    q = rewrite_nodes(p, first_row)
    assert format_program(q, vals=False).split("  module a:")[1].split("\n", 1)[1] == """\
    graph 0:
      %x = placeholder
      %slice = call_function[aten.slice.Tensor](%x, 0, 0, 1)
      %mul = call_function[aten.mul.Tensor](%slice, 2)
      return[output_1] %mul"""
    root = q.root_module.graph.nodes
    assert tuple(_val(q, root, "mul").shape) == (1, 4)  # the call's val: was (3, 4)
    assert tuple(_val(q, root, "sum_1").shape) == (1, 4)
    verify(q, vals=True)
    got = lower(q)(x)
    assert got.shape == _val(q, root, "sum_1").shape
    torch.testing.assert_close(got, (x[:1] * 2).sum(0, keepdim=True))
    with pytest.raises(VerifyError, match="node 'mul' in module '<root>' has val "
                       r"float32\[3, 4\], but its inputs' vals give float32\[1, 4\]"):
        verify(_stale(q, "mul", _val(p, p.root_module.graph.nodes, "mul")), vals=True)


def _stale(q, name, val):
    """``q`` with the root node ``name``'s val set back to ``val`` (what the bug left)."""
    nodes = tuple(
        n.replace(meta={**n.meta, "val": val}) if n.name == name else n
        for n in q.root_module.graph.nodes
    )
    root = q.root_module.replace(graphs=(Graph.of(list(nodes)),))
    return q.replace(modules=q.modules.set(q.root, root))


class Leaf(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


class TopOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Leaf()

    def forward(self, x):
        return self.a(x) + 1


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_a_shape_change_that_reaches_an_output_spec_is_refused(level):
    p = import_ep(torch.export.export(TopOut(), (torch.randn(3, 4),)))
    p = p if level == "flat" else transform(p)
    with pytest.raises(PassError, match=r"changes node 'add' from float32\[3, 4\] to "
                       r"float32\[1, 4\], and a signature names it"):
        rewrite_nodes(p, first_row)


def test_a_shape_change_that_reaches_a_preserved_call_is_refused():
    x = torch.randn(3, 4)
    ep = torch.export.export(TopOut(), (x,), preserve_module_call_signature=("a",))
    p = transform(import_ep(ep))
    with pytest.raises(PassError, match="a signature names it"):
        rewrite_nodes(p, first_row)


def test_a_dtype_change_that_reaches_an_argument_of_a_module_call_is_refused():
    class Caller(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Leaf()

        def forward(self, x):
            return self.a(torch.neg(x)).sum()

    p = transform(import_ep(torch.export.export(Caller(), (torch.randn(3, 4),))))

    def to_double(node, e):
        if node.target is aten.neg.default:
            return e.call(aten._to_copy.default, node.ref, dtype=torch.float64)
        return None

    with pytest.raises(PassError, match="which call '.*' of module 'a' reads .*traced at the old "
                       "shapes"):
        rewrite_nodes(p, to_double)


# --- verify(vals=True) ----------------------------------------------------------------------------


def test_verify_vals_names_a_stale_node_in_a_module():
    _, p = _top("outlined")
    a = p.module_table()[p.resolve("a")]
    g = a.graphs[0]
    wrong = torch.empty(5, device="meta")
    nodes = [n.replace(meta={**n.meta, "val": wrong}) if n.name == "mul" else n for n in g.nodes]
    bad = p.replace(modules=p.modules.set(p.resolve("a"), a.replace(graphs=(Graph.of(nodes),))))
    verify(bad)  # the structure is fine
    with pytest.raises(VerifyError, match=r"node 'mul' in module 'a' has val float32\[5\]"):
        verify(bad, vals=True)


def test_verify_vals_checks_device_and_dtype():
    _, p = _top("flat")
    old = _val(p, p.root_module.graph.nodes, "mul")
    for wrong, said in ((old.to(torch.float64), "float64"), (None, None)):
        if wrong is None:
            continue
        with pytest.raises(VerifyError, match=said):
            verify(_stale(p, "mul", wrong), vals=True)
    assert not kn.same_val(torch.empty(2, device="meta"), torch.empty(2))


# --- the law: after any rewrite_nodes edit, the vals are true ---------------------------------------


_SHAPERS = (
    lambda e, a: e.call(aten.neg.default, a),  # same shape
    lambda e, a: e.call(aten.sum.dim_IntList, a, [0], True),  # fewer rows
    lambda e, a: e.call(aten._to_copy.default, a, dtype=torch.float64),  # another dtype
)


def _edit(choice: int, every: int):
    def visit(node, e):
        v = node.meta.get("val")
        if node.op != CALL_FUNCTION or not isinstance(v, torch.Tensor) or v.dim() == 0:
            return None
        if v.dtype != torch.float32 or hash(node.name) % every:
            return None
        return _SHAPERS[choice](e, node.ref)

    return visit


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(hst.one_of(programs(), outlined_programs()), hst.integers(0, 2), hst.integers(1, 3))
def test_law_vals_are_true_after_any_edit(p, choice, every):
    try:
        q = rewrite_nodes(p, _edit(choice, every))
    except PassError as exc:
        assert "signature names" in str(exc) or "no longer runs" in str(exc) \
            or "raises on its arguments" in str(exc) or "traced at the old shapes" in str(exc) \
            or "other shapes" in str(exc)
        return
    verify(q, vals=True)


def test_kernel_finalisation_renames_output_specs_and_keeps_the_rest():
    _, p = _top("flat")
    sig = p.signature
    assert kn.renamed_outputs(sig, {}) is sig
    assert kn.renamed_outputs(sig, {"nothing": "else"}) is sig
    out = sig.outputs[0].name
    renamed = kn.renamed_outputs(sig, {out: "other"})
    assert renamed.outputs[0] == attrs.evolve(sig.outputs[0], name="other")
    assert renamed.inputs == sig.inputs
    assert kn.renamed_calls(p, {}) is p.call_signatures


def test_the_editor_asks_the_effect_analysis_what_an_emitted_node_writes():
    # the editor's write check reads ir.effects.written_args (positions, out= and keywords)
    import operator

    from ir.args import EMPTY_DICT, Ref, freeze
    from ir.effects import written_args
    from ir.node import CALL_FUNCTION, new_node

    x, y = Ref("x"), Ref("y")

    def same(v):
        return v

    def writes(target, args, kwargs=None):
        node = new_node(CALL_FUNCTION, "n", target, freeze(args, same), freeze(kwargs or {}, same),
                        EMPTY_DICT)
        return written_args(node)

    assert writes(aten.sigmoid_.default, (x,)) == ("x",)
    assert writes(aten.add.out, (x, x), {"out": y}) == ("y",)
    assert writes(aten.add.Tensor, (x, y)) == ()
    assert writes(aten.copy_.default, (), {"self": x, "src": y}) == ("x",)  # by keyword
    assert writes(operator.setitem, (x, 0, y)) == ("x",)  # no schema: by position
    assert writes(operator.setitem, ()) == ()
    assert kn.base_name(aten.add.Tensor) == "add"
    assert kn.base_name(torch.relu) == "relu"


class Twice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Inner()

    def forward(self, x, y):
        return self.a(x).sum() + self.a(y).sum()


def test_a_graph_shared_by_calls_at_two_shapes_is_not_re_derived_for_either():
    x, y = torch.randn(3, 4), torch.randn(2, 4)
    p = transform(import_ep(torch.export.export(Twice(), (x, y))))
    text = format_program(p, vals=False)
    assert "%mul = call_module[a](%x)" in text and "%mul_1 = call_module[a](%y)" in text
    verify(p, vals=True)  # the call at (2, 4) is not compared with the graph traced at (3, 4)
    with pytest.raises(PassError, match="what module 'a' returns, and its call 'mul_1' runs it "
                       "at other shapes"):
        rewrite_nodes(p, first_row)
    q = rewrite_nodes(p, lambda n, e: e.call(aten.neg.default, n.ref)
                      if n.target is aten.relu.default else None)  # same shape: fine
    verify(q, vals=True)
    torch.testing.assert_close(lower(q)(x, y), (-torch.relu(x) * 2).sum() + (-torch.relu(y) * 2).sum())


# --- the working graph (kernel.WorkingGraph) -----------------------------------------------------


class ReluMul(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


class WriteThroughView(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        y.view(-1)[:2].mul_(2.0)
        return y * 3


def _work(listener=None):
    p = import_ep(torch.export.export(ReluMul(), (torch.randn(3, 4),)))
    return p, kn.WorkingGraph(p.root_module.graph, listener=listener)


def _named(graph):
    return [(n.name, n.op, n.target) for n in graph.nodes]


def test_working_graph_indexes_readers_and_operators_and_finishes_unchanged():
    p, w = _work()
    graph = p.root_module.graph
    assert list(w.users["relu"]) == ["mul"]
    assert [n.name for n in w.candidates(aten.relu.default)] == ["relu"]
    assert w.candidates(aten.neg.default) == []
    assert w.val("relu") is graph.node("relu").meta["val"]
    assert not any(w.is_written(n) for n in w.node) and not w.mutations
    out, renames = w.finish()
    assert out == graph and renames == {}


def test_working_graph_make_names_after_the_policy_and_gives_meta_and_val():
    heard = Heard()
    _, w = _work(heard)
    relu = w.node["relu"]
    val = relu.meta["val"]
    a = w.make(CALL_FUNCTION, aten.neg.default, (relu.ref,), EMPTY, val=val,
               stack=relu.meta.get("nn_module_stack"), anchor_meta=relu.meta)
    b = w.make(CALL_FUNCTION, aten.neg.default, (relu.ref,), EMPTY)
    named = w.make(CALL_FUNCTION, aten.neg.default, (relu.ref,), EMPTY, name="mine")
    assert (a.name, b.name, named.name) == ("neg", "neg_1", "mine")
    assert a.meta["val"] is val and "val" not in b.meta
    assert a.meta.get("stack_trace") == relu.meta.get("stack_trace")
    assert heard.events == [("emitted", "neg"), ("emitted", "neg_1"), ("emitted", "mine")]
    assert "neg" not in w.node  # made, not placed
    w.add(a, (w.key["relu"][0], 0))  # right after relu
    assert list(w.users["relu"]) == ["mul", "neg"]
    assert [n.name for n in w.candidates(aten.neg.default)] == ["neg"]
    out, _ = w.finish()
    names = [n.name for n in out.nodes]
    assert names.index("relu") < names.index("neg") < names.index("mul")


def test_working_graph_replace_uses_rewires_readers_and_records_the_rename():
    _, w = _work()
    relu = w.node["relu"]
    neg = w.make(CALL_FUNCTION, aten.neg.default, (relu.ref,), EMPTY, val=relu.meta["val"])
    w.add(neg, (w.key["relu"][0], 0))
    rewired = w.replace_uses("relu", "neg", readers=["mul", "gone"])
    assert rewired == ["mul"]  # a reader no longer in the graph is passed over
    assert w.node["mul"].args[0].name == "neg"
    assert list(w.users["neg"]) == ["mul"] and list(w.users["relu"]) == ["neg"]
    w.replace_uses("neg", "abs", readers=[])  # a chain: relu -> neg -> abs
    _, renames = w.finish()
    assert renames == {"relu": "abs", "neg": "abs"}
    assert kn.resolved({"a": "b", "b": "c"}) == {"a": "c", "b": "c"}


def test_working_graph_erase_drops_the_node_from_every_index_and_is_heard():
    heard = Heard()
    p, w = _work(heard)
    x = next(n for n in p.root_module.graph.nodes if n.op == "placeholder")
    copy = w.make(CALL_FUNCTION, aten.copy_.default, (x.ref, w.node["relu"].ref), EMPTY)
    w.add(copy, (w.key["relu"][0], 0))
    assert w.is_written(x.name) and not w.is_written("mul")
    assert w.mutates_between(w.key["relu"], w.key["mul"])
    assert not w.mutates_between(w.key["mul"], (99,))
    erased = w.erase(copy.name)
    assert erased is copy and copy.name not in w.node
    assert not w.mutates_between(w.key["relu"], w.key["mul"])
    assert copy.name not in w.users["relu"]
    assert heard.events[-1] == ("erased", copy.name)
    w.erase("mul")
    assert "mul" not in w.users["relu"] and w.candidates(aten.mul.Tensor) == []
    assert "mul" in w.taken  # an erased node's name stays taken until given back


def test_working_graph_rolls_back_the_names_a_listener_heard():
    drawn = kn.Drawn()
    _, w = _work(drawn)
    relu = w.node["relu"]
    for _ in range(2):
        w.make(CALL_FUNCTION, aten.neg.default, (relu.ref,), EMPTY)
    assert drawn.names == ["neg", "neg_1"]
    w.release(drawn.names)  # the edit is not taken: its names are given back
    assert "neg" not in w.taken and "neg_1" not in w.taken
    assert w.make(CALL_FUNCTION, aten.neg.default, (relu.ref,), EMPTY).name == "neg"
    w.reserve(["abs"])
    assert w.fresh("abs") == "abs_1"


def test_unindexed_working_graph_takes_the_names_and_places_as_told():
    p, _ = _work()
    graph = p.root_module.graph
    w = kn.WorkingGraph(graph, indexed=False)
    assert w.node == {} and w.users == {}
    assert w.fresh("relu") == "relu_1"  # the graph's names are taken
    w.add(graph.node("relu"))
    assert w.node["relu"] is graph.node("relu") and w.users == {}


def test_the_engine_working_copy_is_the_kernel_working_graph():
    from transforms.rewrite import engine

    assert issubclass(engine._Work, kn.WorkingGraph)


def test_working_graph_is_written_counts_writes_through_views_of_placed_nodes():
    # a view of relu placed after the graph was built, then a write of the view: relu is
    # written (ir.effects' definition, AliasSets over the graph's Effects), x and mul are not
    p, w = _work()
    x = next(n for n in p.root_module.graph.nodes if n.op == "placeholder")
    relu = w.node["relu"]
    v = w.make(CALL_FUNCTION, aten.view.default, (relu.ref, [-1]), EMPTY)
    w.add(v, (w.key["relu"][0], 0))
    assert not w.is_written("relu")
    write = w.make(CALL_FUNCTION, aten.add_.Tensor, (v.ref, 1.0), EMPTY)
    w.add(write, (w.key["relu"][0], 1))
    assert w.is_written("relu") and w.is_written(v.name) and w.is_written(write.name)
    assert not w.is_written(x.name) and not w.is_written("mul")


def test_working_graph_over_effects_answers_as_graph_effects():
    from ir.effects import graph_effects

    p = import_ep(torch.export.export(WriteThroughView(), (torch.randn(3, 4),)))
    graph = p.root_module.graph
    e = graph_effects(p, p.root, graph)
    with_effects = kn.WorkingGraph(graph, effects=e)
    without = kn.WorkingGraph(graph)
    names = [n.name for n in graph.nodes]
    assert any(e.is_written(n) and not e.writes(n) for n in names)  # written through a view
    assert [with_effects.is_written(n) for n in names] == [e.is_written(n) for n in names]
    assert [without.is_written(n) for n in names] == [e.is_written(n) for n in names]
    assert with_effects.mutations == without.mutations


def test_working_graph_written_after_leaves_out_writes_before_the_value():
    # x is written (copy_) after relu: relu's memory is not written after relu exists only if
    # the write lands before it; a write of relu through a view placed before mul is after relu
    p, w = _work()
    x = next(n for n in p.root_module.graph.nodes if n.op == "placeholder")
    relu = w.node["relu"]
    early = w.make(CALL_FUNCTION, aten.add_.Tensor, (x.ref, 1.0), EMPTY)
    w.add(early, (w.key[x.name][0], 0))  # before relu
    assert w.is_written(x.name) and w.written_after(x.name)
    assert not w.written_after(early.name)  # nothing writes x after this write
    v = w.make(CALL_FUNCTION, aten.view.default, (relu.ref, [-1]), EMPTY)
    w.add(v, (w.key["relu"][0], 0))
    assert not w.written_after("relu")
    write = w.make(CALL_FUNCTION, aten.mul_.Tensor, (v.ref, 2.0), EMPTY)
    w.add(write, (w.key["relu"][0], 1))
    assert w.written_after("relu") and not w.written_after(write.name)
