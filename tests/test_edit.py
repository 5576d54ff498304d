"""``transforms.edit.rewrite_nodes``: Before/Expected on the IR text, flat and outlined, numerics
against eager, refusals, ``is p`` when nothing changes, purity and laws on generated programs."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "examples"))

from beforeafter import program
from programs_nested import NESTED

from ir import PassError, alpha_equivalent, format_program, import_ep, verify
from lowering import lower
from lowering.pass_laws import check_laws, check_purity
from tests.outlined_programs import outlined_programs
from transforms import outline, rewrite_nodes, transform
from transforms.edit import Edit

aten = torch.ops.aten


def relu_to_gelu(node, e: Edit):
    if node.target is aten.relu.default:
        return e.call(aten.gelu.default, *e.args)
    return None


def observe_relu(node, e: Edit):
    if node.target is aten.relu.default:
        seen = e.add_buffer("amax", torch.zeros(()))
        now = e.call(aten.amax.default, e.call(aten.abs.default, node.ref))
        e.write_buffer(seen, e.call(aten.maximum.default, seen, now))


# --- Before / Expected ---------------------------------------------------------------------------


def test_a_replaced_node_is_dropped_and_its_uses_rewired():
    after = rewrite_nodes(program(NESTED), relu_to_gelu)
    expected = NESTED.replace(
        "%relu = call_function[aten.relu.default](%x)  # stack: a, a.b",
        "%gelu = call_function[aten.gelu.default](%x)  # stack: a, a.b",
    ).replace("(%relu, %p_a_w)", "(%gelu, %p_a_w)")
    verify(after)
    assert alpha_equivalent(after, program(expected, like=after))
    want = program(expected, like=after)
    assert format_program(after, vals=False) == format_program(want, vals=False)


def test_a_buffer_added_and_written_on_a_flat_program():
    after = rewrite_nodes(program(NESTED), observe_relu)
    verify(after)
    expected = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %b_a_b_amax: buffer a.b.amax persistent=True
    %x: user_input
  outputs:
    %maximum: buffer_mutation a.b.amax
    %add: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
    a.b.amax: buffer <Tensor () torch.float32>
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %b_a_b_amax = placeholder
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a, a.b
      %abs = call_function[aten.abs.default](%relu)  # stack: a, a.b
      %amax = call_function[aten.amax.default](%abs)  # stack: a, a.b
      %maximum = call_function[aten.maximum.default](%b_a_b_amax, %amax)  # stack: a, a.b
      %mul = call_function[aten.mul.Tensor](%relu, %p_a_w)  # stack: a
      %neg = call_function[aten.neg.default](%mul)  # stack: a, a.b@1
      %add = call_function[aten.add.Tensor](%neg, %x)
      return (%maximum, %add)
  module a: A
  module a.b: B"""
    want = program(expected, like=after)
    assert format_program(after, vals=False) == format_program(want, vals=False)
    assert after.state_order == ("a.w", "a.b.amax")


def test_a_buffer_added_and_written_on_an_outlined_program():
    after = rewrite_nodes(outline(program(NESTED)), observe_relu)
    verify(after)
    text = format_program(after, vals=False)
    assert """\
  module a.b: B [module] id='a.b'
    graph 0:
      %x = placeholder
      %amax = get_attr[amax]()
      %relu = call_function[aten.relu.default](%x)
      %abs = call_function[aten.abs.default](%relu)
      %amax_1 = call_function[aten.amax.default](%abs)
      %maximum = call_function[aten.maximum.default](%amax, %amax_1)
      %copy_ = call_function[aten.copy_.default](%amax, %maximum)
      return[output_1] %relu
    graph 1:""" in text
    assert "a.b.amax: buffer <Tensor () torch.float32>" in text
    assert "buffer_mutation" not in text  # outlined: written in place, no output


def test_unused_new_constants_go_with_their_state():
    def twice(node, e):
        if node.target is aten.neg.default:
            e.constant(torch.ones(2))  # never read: dropped with its state
            return e.call(aten.mul.Tensor, e.args[0], e.constant(torch.full((2,), -1.0)))
        return None

    after = rewrite_nodes(program(NESTED), twice)
    verify(after)
    assert list(after.state) == ["a.w", "a.b._constant_1"] or set(after.state) == {
        "a.w", "a.b._constant_1"
    }
    assert [s.target for s in after.signature.inputs] == ["a.w", "a.b._constant_1", None]


def test_dead_code_is_dropped_only_when_asked():
    text = NESTED.replace(
        "      %add = call_function",
        "      %dead = call_function[aten.tanh.default](%mul)  # stack: a\n      %add = call_function",
    )
    before = program(text)
    assert rewrite_nodes(before, lambda n, e: None) is before

    def dce(node, e):
        if not e.graph.users()[node.name]:
            e.drop()

    assert alpha_equivalent(rewrite_nodes(before, dce), program(NESTED, like=before))


# a's signature returns sin, which the caller drops: nothing reads it
UNREAD_RESULT = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%x,)
      outputs: (%cos, %sin)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf, leaf])
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %x = placeholder
      %cos = call_function[aten.cos.default](%x)  # stack: a
      %sin = call_function[aten.sin.default](%x)  # stack: a
      %tanh = call_function[aten.tanh.default](%cos)
      %mul = call_function[aten.mul.Tensor](%cos, %x)
      return (%mul,)
  module a: A"""


def test_an_unused_read_goes_alone():
    """The visit reads sin (a signature names it) and tanh (dead): its reads, unused, go, and
    what they read stays, as nothing read it before the edit."""
    before = program(UNREAD_RESULT)

    def reads(node, e):
        if node.target in (aten.sin.default, aten.tanh.default):
            e.call(aten.neg.default, node.ref)

    assert rewrite_nodes(before, reads) is before


# a's signature takes add and returns relu, which the caller drops: nothing reads relu
UNREAD_CALL_CHAIN = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%add,)
      outputs: (%relu,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %x = placeholder
      %add = call_function[aten.add.Tensor](%x, %x)
      %relu = call_function[aten.relu.default](%add)  # stack: a
      %tanh = call_function[aten.tanh.default](%x)
      %mul = call_function[aten.mul.Tensor](%x, %x)
      return (%mul,)
  module a: A"""


def _dce(node, e):
    if not e.graph.users()[node.name]:
        e.drop()


def test_a_value_a_signature_names_stays_when_dropped():
    """``e.drop()`` of relu, which call a returns and nothing reads, keeps it (as the add it
    reads, which the call takes, stays): dropping it would leave the signature naming a value
    the program no longer has, and a second run would then drop add. Only tanh goes, and the
    result is a fixpoint."""
    before = program(UNREAD_CALL_CHAIN)
    expected = program(UNREAD_CALL_CHAIN.replace(
        "      %tanh = call_function[aten.tanh.default](%x)\n", ""))
    after = rewrite_nodes(before, _dce)
    verify(after)
    assert format_program(after, vals=False) == format_program(expected, vals=False)
    assert rewrite_nodes(after, _dce) is after


# --- flat and outlined, numerics -------------------------------------------------------------------


class Shared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(torch.relu(self.lin(x)))) * 2


def _shared():
    torch.manual_seed(0)
    m = Shared().eval()
    args = (torch.randn(3, 8),)
    return m, args, import_ep(torch.export.export(m, args))


def test_a_graph_called_twice_is_visited_once():
    _, _, p = _shared()
    for q, linears in ((p, 2), (transform(p), 1)):
        seen: list[str] = []

        def count(node, e, seen=seen):
            if node.target is aten.linear.default:
                seen.append(node.name)

        rewrite_nodes(q, count)
        assert len(seen) == linears


def _half_weights(node, e):
    if node.target is aten.linear.default:
        held = e.state(e.args[1])
        assert held is not None and held[0] == "lin.weight"
        e.args = (e.args[0], e.apply(lambda w: w * 0.5, e.args[1]), *e.args[2:])


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_numerics_against_eager(level):
    m, args, p = _shared()
    p = p if level == "flat" else transform(p)
    q = rewrite_nodes(rewrite_nodes(p, _half_weights), relu_to_gelu)
    verify(q)
    m = copy.deepcopy(m)  # the program holds m's tensors
    with torch.no_grad():
        m.lin.weight.mul_(0.5)
        gelu = torch.nn.functional.gelu
        want = gelu(m.lin(gelu(m.lin(args[0])))) * 2
    torch.testing.assert_close(lower(q)(*args), want)


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_observer_buffer_holds_the_running_abs_max(level):
    m, args, p = _shared()
    p = p if level == "flat" else transform(p)
    q = rewrite_nodes(p, observe_relu)
    verify(q)
    g = lower(q)
    g(*args)
    g(args[0] * 0.5)
    with torch.no_grad():
        first = torch.relu(m.lin(args[0])).abs().max()
    buffers = dict(g.named_buffers())
    assert any(torch.equal(b.detach(), first) for b in buffers.values())
    torch.testing.assert_close(g(*args), m(*args))


# --- refusals -------------------------------------------------------------------------------------


def test_writing_a_user_input_is_refused():
    def write_x(node, e):
        if node.target is aten.relu.default:
            e.write_buffer(e.args[0], node.ref)

    with pytest.raises(PassError, match="node 'relu'.*writes %x, which is a user input"):
        rewrite_nodes(program(NESTED), write_x)


def test_writing_a_parameter_is_refused():
    def write_w(node, e):
        if node.target is aten.mul.Tensor:
            e.write_buffer(e.args[1], e.args[1])

    with pytest.raises(PassError, match="node 'mul'.*which is a parameter"):
        rewrite_nodes(program(NESTED), write_w)


def test_a_replacement_of_another_dtype_where_the_signature_names_it_is_refused():
    _, _, p = _shared()
    out = p.signature.outputs[0].name

    def to_half(node, e):
        if node.name == out:
            return e.call(aten._to_copy.default, node.ref, dtype=torch.float16)
        return None

    with pytest.raises(PassError, match=f"node '{out}', which a signature names.*float16"):
        rewrite_nodes(p, to_half)


def test_cycles_are_refused():
    def reads_later(node, e):
        if node.target is aten.relu.default:
            return e.call(aten.neg.default, e.args[0].__class__("add"))
        return None

    with pytest.raises(PassError, match=r"node 'relu' reads %add, which is defined later \(a cycle\)"):
        rewrite_nodes(program(NESTED), reads_later)

    def own_result(node, e):
        if node.target is aten.relu.default:
            e.args = (e.call(aten.neg.default, node.ref),)

    with pytest.raises(PassError, match="node 'relu' an argument %neg_1 computed from its own"):
        rewrite_nodes(program(NESTED), own_result)


def test_a_visit_must_return_a_ref():
    with pytest.raises(PassError, match="visit returned 3 for node"):
        rewrite_nodes(program(NESTED), lambda n, e: 3)


# --- identity and purity --------------------------------------------------------------------------


def test_nothing_changed_gives_p_itself():
    _, _, p = _shared()
    for q in (p, transform(p), program(NESTED)):
        looked = []

        def look(node, e, looked=looked):
            looked.append((e.val(node.ref), e.state(node.ref)))

        assert rewrite_nodes(q, look) is q
        assert looked


def test_it_is_pure():
    _, _, p = _shared()
    for q in (p, transform(p)):
        check_purity(lambda x: rewrite_nodes(x, observe_relu), q)
        check_purity(lambda x: rewrite_nodes(x, _half_weights), q)


# --- laws on generated programs ---------------------------------------------------------------------


def _identity(p):
    def look(node, e):
        e.val(node.ref), e.state(node.ref)

    return rewrite_nodes(p, look)


def _relu_as_clamp(p):
    def visit(node, e):
        if node.target is aten.relu.default:
            return e.call(aten.clamp_min.default, e.args[0], 0.0)
        if node.target is aten.neg.default:  # through a node of its own, kept in place
            e.args = (e.call(aten.mul.Tensor, e.args[0], 1.0),)
        return None

    return rewrite_nodes(p, visit)


def test_laws_identity():
    check_laws(_identity, max_examples=15, idempotent=True, allow_vacuous=True)


def test_laws_real_edit_flat_and_outlined():
    check_laws(_relu_as_clamp, max_examples=20)
    check_laws(_relu_as_clamp, programs=outlined_programs(), max_examples=10)


def test_laws_buffer_writes_flat_and_outlined():
    check_laws(_count_relus, max_examples=15)  # new buffers: determinism compares them by value
    check_laws(_count_relus, programs=outlined_programs(), max_examples=8)


# --- more of the context ---------------------------------------------------------------------------


class TwoRelus(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(torch.relu(x)))


def _count_relus(p):
    held = {}

    def visit(node, e):
        if node.target is aten.relu.default:
            if id(e.graph) not in held:
                held[id(e.graph)] = e.add_buffer("count", torch.zeros(()))
            count = held[id(e.graph)]
            assert e.state(count)[0].rpartition(".")[2].startswith("count")  # after a write too
            e.write_buffer(count, e.call(aten.add.Tensor, count, 1.0))

    return rewrite_nodes(p, visit)


@pytest.mark.parametrize("level", ["flat", "outlined"])
def test_one_buffer_written_twice_in_a_call(level):
    m = TwoRelus()
    args = (torch.randn(2, 4),)
    p = import_ep(torch.export.export(m, args))
    p = p if level == "flat" else transform(p)
    q = _count_relus(p)
    verify(q)
    g = lower(q)
    g(*args)
    g(*args)
    assert float(g.get_buffer("count")) == 4.0  # two relus, two calls
    if level == "flat":
        assert [s.kind for s in q.signature.outputs] == ["buffer_mutation", "user_output"]


def test_a_placeholder_visit_emits_after_the_placeholders():
    def negate_x(node, e):
        if node.op == "placeholder" and node.name == "x":
            return e.call(aten.neg.default, node.ref)
        return None

    after = rewrite_nodes(program(NESTED), negate_x)
    verify(after)
    ops_ = [n.op for n in after.root_module.graph.nodes]
    assert ops_[:3] == ["placeholder", "placeholder", "call_function"]
    text = format_program(after, vals=False)
    assert "%relu = call_function[aten.relu.default](%neg_1)" in text
    assert "%add = call_function[aten.add.Tensor](%neg, %neg_1)" in text


def test_apply_returns_a_tuple_for_several_results():
    m, args, p = _shared()

    def split(node, e):
        if node.target is aten.relu.default:
            pos, neg = e.apply(lambda a: (torch.relu(a), torch.relu(-a)), e.args[0])
            assert e.val(pos).shape == e.val(neg).shape
            return e.call(aten.sub.Tensor, pos, e.call(aten.mul.Tensor, neg, 0.0))
        return None

    for q in (p, transform(p)):
        torch.testing.assert_close(lower(rewrite_nodes(q, split))(*args), m(*args))


def test_a_constant_on_an_outlined_program_is_a_get_attr_of_the_module():
    def scale(node, e):
        if node.target is aten.neg.default:
            e.args = (e.call(aten.mul.Tensor, e.args[0], e.constant(torch.full((2,), 3.0))),)

    after = rewrite_nodes(outline(program(NESTED)), scale)
    verify(after)
    assert after.state["a.b._constant"].kind == "constant"
    assert "%_constant = get_attr[_constant]()" in format_program(after, vals=False)


class Preserved(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def forward(self, x):
        return self.sub(x) + 1


def test_preserved_call_signatures_are_rewired():
    m = Preserved().eval()
    args = (torch.randn(2, 4),)
    ep = torch.export.export(m, args, preserve_module_call_signature=("sub",))
    p = import_ep(ep)
    named = {a.name for a in p.call_signatures["sub"].outputs}
    q = rewrite_nodes(p, relu_to_gelu)
    verify(q)
    renamed = {a.name for a in q.call_signatures["sub"].outputs}
    assert named != renamed and "gelu" in renamed
    want = torch.nn.functional.gelu(m.sub[0](args[0])) + 1
    for r in (q, transform(q)):
        torch.testing.assert_close(lower(r)(*args), want)


def test_apply_traces_at_the_programs_level():
    m, args, _ = _shared()
    ep = torch.export.export(m, args)
    for p, core in ((import_ep(ep), False), (import_ep(ep.run_decompositions()), True)):

        def square(node, e):
            if node.op == "placeholder" and node.name == "x":
                return e.apply(lambda a: torch.nn.functional.linear(a, torch.ones(8, 8)), node.ref)
            return None

        q = rewrite_nodes(p, square)
        targets = {str(n.target) for n in q.root_module.graph.nodes if n.op == "call_function"}
        assert ("aten.linear.default" in targets) is not core, targets


class Reduce(torch.nn.Module):
    def forward(self, x):
        return (torch.relu(x) * 2).sum()


def test_vals_are_propagated_again_past_a_replacement_of_another_shape():
    x = torch.randn(3, 8)
    p = import_ep(torch.export.export(Reduce(), (x,)))

    def first_column(node, e):
        if node.target is aten.relu.default:
            return e.call(aten.slice.Tensor, e.args[0], 1, 0, 1)
        return None

    q = rewrite_nodes(p, first_column)
    verify(q)
    mul = next(n for n in q.root_module.graph.nodes if n.target is aten.mul.Tensor)
    assert tuple(mul.meta["val"].shape) == (3, 1)  # was (3, 8)
    torch.testing.assert_close(lower(q)(x), (x[:, :1] * 2).sum())

    class AddBack(torch.nn.Module):
        def forward(self, x):
            return (torch.relu(x) + x).sum()

    p = import_ep(torch.export.export(AddBack(), (x,)))

    def transpose(node, e):
        if node.target is aten.relu.default:
            return e.call(aten.t.default, e.args[0])  # (8, 3) + (3, 8) no longer runs
        return None

    with pytest.raises(PassError, match="aten.add.Tensor at node 'add' raises"):
        rewrite_nodes(p, transpose)
