"""``ir.effects``: the one effect and alias analysis. Before/Expected examples: a program as text
and the facts the analysis gives for one of its graphs (written values, what each writer writes,
alias groups, written inputs, effects, random nodes, asserts), plus the single-node predicates,
``state_written``, and a law on generated programs: what the analysis says is written holds
every tensor that running the lowered program writes (read from tensor versions)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).parent / "examples"))
from beforeafter import program

from ir import effects, ops
from ir import signature as sg
from ir.errors import PassError
from ir.strategies import programs
from ir.strategies.programs import program_inputs
from lowering import lower
from lowering.pass_laws import check_program
from transforms import cse, transform


def facts(p, path: str = "", graph: int = 0) -> dict:
    """The analysis of graph ``graph`` of the module at ``path``, as plain data."""
    mid = p.resolve(path)
    g = p.module(mid).graphs[graph]
    e = effects.graph_effects(p, mid, g)
    names = [n.name for n in g.nodes]
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(e.group(name), []).append(name)
    return {
        "written": [n for n in names if e.is_written(n)],
        "writes": {w: e.writes(w) for w in e.writers},
        "groups": sorted(v for v in groups.values() if len(v) > 1),
        "inputs": sorted(e.written_inputs),
        "effect": [n for n in names if e.has_effect(n)],
        "random": [n for n in names if e.is_random(n)],
        "asserts": [n for n in names if e.is_assert(n)],
    }


def expect(**given_facts) -> dict:
    out = {"written": [], "writes": {}, "groups": [], "inputs": [], "effect": [], "random": [],
           "asserts": []}
    out.update(given_facts)
    return out


VIEW_THEN_WRITE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %v = call_function[aten.view.default](%x, [4])
      %add_ = call_function[aten.add_.Tensor](%v, 1)
      %mul = call_function[aten.mul.Tensor](%x, 2)
      return (%mul,)"""


def test_a_view_then_a_write_through_it_writes_its_base():
    """``add_`` writes ``v``, a view of ``x``: ``x`` is written too (one alias group); ``mul``,
    a functional op, has memory of its own."""
    assert facts(program(VIEW_THEN_WRITE)) == expect(
        written=["x", "v", "add_"],
        writes={"add_": ("v",)},
        groups=[["x", "v", "add_"]],
        inputs=[0],
        effect=["add_"],
    )


CALLEE_WRITES = """\
program:
  inputs:
    %x: user_input
    %y: user_input
  outputs:
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %y = placeholder
      %a = call_module[a](%x, %y)
      %z = call_function[aten.mul.Tensor](%y, 3)
      %out = call_function[aten.add.Tensor](%a, %z)
      return (%out,)
  module a: A
    graph 0:
      %p = placeholder
      %q = placeholder
      %add_ = call_function[aten.add_.Tensor](%p, 1)
      %mul = call_function[aten.mul.Tensor](%q, 2)
      return %mul"""


def test_a_module_call_writes_the_arguments_whose_placeholders_its_callee_writes():
    """``a`` writes its first placeholder: the call writes ``x``. Its second placeholder is
    written too, conservatively (a caller may pass one tensor twice), so the call writes
    ``y`` as well; a module call's result may alias its arguments."""
    p = program(CALLEE_WRITES)
    assert facts(p, "a") == expect(
        written=["p", "q", "add_"],
        writes={"add_": ("p",)},
        groups=[["p", "q", "add_"]],
        inputs=[0, 1],
        effect=["add_"],
    )
    assert facts(p) == expect(
        written=["x", "y", "a"],
        writes={"a": ("x", "y")},
        groups=[["x", "y", "a"]],
        inputs=[0, 1],
        effect=["a"],
    )


def test_a_pure_callee_makes_a_call_without_writes_or_effect():
    p = program(CALLEE_WRITES.replace("      %add_ = call_function[aten.add_.Tensor](%p, 1)\n", ""))
    assert facts(p) == expect(groups=[["x", "y", "a"]])


TIED = """\
program:
  inputs:
    %b_u: buffer u persistent=True
    %b_v: buffer v persistent=True
    %b_w: buffer w persistent=True
    %x: user_input
  outputs:
    %out: user_output
  state:
    u: buffer <Tensor (2,) torch.float32>
    v: buffer <Tensor (2,) torch.float32> = u
    w: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %b_u = placeholder
      %b_v = placeholder
      %b_w = placeholder
      %x = placeholder
      %add_ = call_function[aten.add_.Tensor](%b_u, %x)
      %out = call_function[aten.mul.Tensor](%b_v, %b_w)
      return (%out,)"""


def test_tied_state_is_written_under_both_names():
    """``u`` and ``v`` are one tensor: writing ``u`` writes ``v``; ``w`` is not written, nor
    ``x``, which ``add_`` only reads."""
    p = program(TIED)
    assert facts(p) == expect(
        written=["b_u", "b_v", "add_"],
        writes={"add_": ("b_u",)},
        groups=[["b_u", "b_v", "add_"]],
        inputs=[0, 1],
        effect=["add_"],
    )
    assert effects.state_written(p, "u") and effects.state_written(p, "v")
    assert not effects.state_written(p, "w")
    assert effects.written_state(p) == frozenset({p.state["u"].tensor})


RANDOM = """\
program:
  inputs:
    %x: user_input
  outputs:
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %rand = call_function[aten.rand.default]([2])
      %bern = call_function[aten.bernoulli.default](%x)
      %a = call_module[a](%x)
      %b = call_module[b](%x)
      %add = call_function[aten.add.Tensor](%rand, %bern)
      %out = call_function[aten.add.Tensor](%add, %a)
      return (%out,)
  module a: A
    graph 0:
      %p = placeholder
      %r = call_function[aten.randn_like.default](%p)
      return %r
  module b: B
    graph 0:
      %p = placeholder
      %n = call_function[aten.neg.default](%p)
      return %n"""


def test_random_nodes_and_the_calls_of_graphs_that_hold_one():
    """Random operators draw from the generator: they have an effect and are random; so is a
    call of ``a``, whose graph draws; ``b``'s call is neither."""
    p = program(RANDOM)
    assert facts(p) == expect(
        groups=[["x", "a", "b"]],
        effect=["rand", "bern", "a"],
        random=["rand", "bern", "a"],
    )


ASSERTS = """\
program:
  inputs:
    %x: user_input
  outputs:
    %to: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %check = call_function[aten._assert_tensor_metadata.default](%x, None, None, torch.float32)
      %to = call_function[aten._to_copy.default](%x, dtype=torch.float32)
      %sym = call_function[aten.sym_size.int](%x, 0)
      %ge = call_function[_operator.ge](%sym, 1)
      %scalar = call_function[aten._assert_scalar.default](%ge, "size")
      %range = call_function[aten.sym_constrain_range_for_size.default](%sym)
      %async = call_function[aten._assert_async.msg](%x, "x")
      return (%to,)"""


def test_asserts_are_effects_that_write_nothing():
    p = program(ASSERTS)
    assert facts(p) == expect(
        effect=["check", "scalar", "range", "async"],
        asserts=["check", "scalar", "range", "async"],
    )
    node = p.root_module.graph.node("check")
    assert effects.is_assert(node) and not effects.is_pure(node)
    assert not effects.is_assert(p.root_module.graph.node("to"))


OUT_AND_COPY = """\
program:
  inputs:
    %b_buf: buffer buf persistent=True
    %b_acc: buffer acc persistent=True
    %x: user_input
    %y: user_input
  outputs:
    %mul: user_output
  state:
    buf: buffer <Tensor (2,) torch.float32>
    acc: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %b_buf = placeholder
      %b_acc = placeholder
      %x = placeholder
      %y = placeholder
      %add = call_function[aten.add.out](%x, %y, out=%b_buf)
      %copy_ = call_function[aten.copy_.default](%b_acc, %x)
      %mul = call_function[aten.mul.Tensor](%y, 2)
      return (%mul,)"""


def test_out_forms_write_their_out_and_copy_writes_its_destination():
    """``add.out`` writes ``out=`` (not ``x`` nor ``y``, though its result may alias them:
    conservatively, a mutating op's result joins every argument's group); ``copy_`` writes
    its destination. Both buffers are written state."""
    p = program(OUT_AND_COPY)
    e = effects.graph_effects(p, p.root, p.root_module.graph)
    assert e.writes("add") == ("b_buf",)
    assert e.writes("copy_") == ("b_acc",)
    assert e.writers == ("add", "copy_")
    assert e.aliases("b_buf", "add") and e.aliases("b_acc", "copy_")
    assert not e.aliases("mul", "y")
    assert effects.state_written(p, "buf") and effects.state_written(p, "acc")
    node = p.root_module.graph.node("add")
    assert effects.written_args(node) == ("b_buf",)
    assert effects.written_args(p.root_module.graph.node("copy_")) == ("b_acc",)


def test_a_mutation_output_writes_its_state():
    text = OUT_AND_COPY.replace(
        "      %add = call_function[aten.add.out](%x, %y, out=%b_buf)\n"
        "      %copy_ = call_function[aten.copy_.default](%b_acc, %x)\n", ""
    ).replace("    %mul: user_output\n", "    %mul: buffer_mutation acc\n    %y: user_output\n")
    text = text.replace("return (%mul,)", "return (%mul, %y)")
    p = program(text)
    assert p.signature.outputs[0].kind == sg.BUFFER_MUTATION
    assert facts(p) == expect()
    assert effects.state_written(p, "acc") and not effects.state_written(p, "buf")


HOP_BODY = """\
program:
  inputs:
    %x: user_input
  outputs:
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %body = get_attr[submod_1]()
      %hop = call_function[torch.ops.higher_order.wrap_with_set_grad_enabled](False, %body, %x)
      %getitem = call_function[_operator.getitem](%hop, 0)
      %out = call_function[aten.mul.Tensor](%getitem, 2)
      return (%out,)
  module submod_1: ? [subgraph]
    graph 0:
      %p = placeholder
      %add_ = call_function[aten.add_.Tensor](%p, 1)
      return (%add_,)"""


def test_a_higher_order_op_whose_body_writes_an_input_writes_its_arguments():
    """The body writes its placeholder: the call writes ``x`` (not the body it is given)."""
    p = program(HOP_BODY)
    assert facts(p) == expect(
        written=["x", "body", "hop", "getitem"],
        writes={"hop": ("x",)},
        groups=[["x", "body", "hop", "getitem"]],
        inputs=[0],
        effect=["hop"],
    )


def test_a_higher_order_op_with_a_pure_body_writes_nothing():
    p = program(HOP_BODY.replace("aten.add_.Tensor", "aten.add.Tensor"))
    assert facts(p)["written"] == []
    assert facts(p)["effect"] == ["hop"]  # a higher-order op is never pure


def test_a_method_writes_its_receiver_and_an_unknown_callee_everything():
    text = VIEW_THEN_WRITE.replace(
        "call_function[aten.add_.Tensor](%v, 1)", "call_method[add_](%v, %x)"
    )
    p = program(text)
    assert effects.graph_effects(p, p.root, p.root_module.graph).writes("add_") == ("v",)
    node = p.root_module.graph.node("add_")
    assert effects.written_args(node) == ("v",)


def test_the_analysis_is_memoized_per_program_and_graph():
    p = program(CALLEE_WRITES)
    g = p.root_module.graph
    assert effects.graph_effects(p, p.root, g) is effects.graph_effects(p, p.root, g)
    assert effects.written_state(p) is effects.written_state(p)
    q = program(CALLEE_WRITES)
    assert effects.graph_effects(q, q.root, q.root_module.graph) is not (
        effects.graph_effects(p, p.root, g)
    )


def test_an_unresolvable_call_writes_and_does_everything():
    p = program(CALLEE_WRITES)
    graph = p.root_module.graph
    call = graph.node("a")
    bad = graph.of(n.replace(target="nowhere") if n is call else n for n in graph.nodes)
    e = effects.graph_effects(p, p.root, bad)
    assert e.writes("a") == ("x", "y")
    assert e.has_effect("a") and e.is_random("a")
    assert e.is_written("z") is False and e.is_written("y")


# --- single nodes --------------------------------------------------------------------------------


def test_single_node_predicates():
    p = program(CALLEE_WRITES)
    g = p.root_module.graph
    call, mul, x = g.node("a"), g.node("z"), g.node("x")
    assert effects.is_pure(mul) and not effects.is_pure(call) and not effects.is_pure(x)
    assert effects.written_args(call) == ("x", "y")  # conservatively, without the program
    assert effects.written_args(mul) == () and effects.written_args(x) == ()
    assert effects.is_pure(program(HOP_BODY).root_module.graph.node("body"))  # a get_attr
    hop = program(HOP_BODY).root_module.graph.node("hop")
    assert not effects.is_pure(hop) and effects.written_args(hop) == ("body", "x")
    v = program(VIEW_THEN_WRITE).root_module.graph
    assert effects.is_view(v.node("v")) and not effects.is_view(v.node("mul"))
    assert not effects.is_view(v.node("x"))
    assert not effects.binds_symbols(mul)
    bound = mul.replace(meta={**mul.meta, "unbacked_bindings": {"u0": ()}})
    assert effects.binds_symbols(bound)


def test_ops_is_assert():
    assert ops.is_assert(torch.ops.aten._assert_scalar.default)
    assert ops.is_assert(torch.ops.aten._assert_async.msg)
    assert ops.is_assert(torch._check)
    assert not ops.is_assert(torch.ops.aten.add.Tensor)
    assert not ops.is_assert(torch.ops.aten._make_dep_token.default)


def test_state_written_names_bad_input():
    p = program(TIED)
    with pytest.raises(PassError, match=r"'nope' is no state of the program; its state is 'u'"):
        effects.state_written(p, "nope")
    with pytest.raises(PassError, match="state_written takes a purefx Program, got builtins.str"):
        effects.state_written("p", "u")


# --- the law -------------------------------------------------------------------------------------


def _versions(tensors):
    return {k: t._version for k, t in tensors.items() if isinstance(t, torch.Tensor)}


def _state_tensors(module, fqns):
    out = {}
    for fqn in fqns:
        obj = module
        for part in fqn.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.Tensor):
            out[fqn] = obj
    return out


def _check_written(p):
    """Every tensor a call of ``lower(p)`` writes (its version moved) is written by the
    analysis: a user input whose root placeholder ``is_written`` (or a user-input mutation
    output names), state that ``state_written`` holds; and a root placeholder a node writes
    directly is written by the call."""
    module = lower(p)
    args, kwargs = program_inputs(p)
    leaves = {f"arg{i}": a for i, a in enumerate(args)}
    leaves.update({f"kw{k}": v for k, v in kwargs.items()})
    state = _state_tensors(module, p.state_order)
    before_in, before_state = _versions(leaves), _versions(state)
    with torch.no_grad():
        module(*args, **kwargs)
    moved_in = {k for k, v in _versions(leaves).items() if v != before_in[k]}
    moved_state = {k for k, v in _versions(state).items() if v != before_state[k]}
    for fqn in moved_state:
        assert effects.state_written(p, fqn), f"state {fqn} was written, unseen"
    graph = p.root_module.graph
    e = effects.graph_effects(p, p.root, graph)
    mutated = {s.target for s in p.signature.outputs if s.kind == sg.USER_INPUT_MUTATION}
    users = [s.name for s in p.signature.user_inputs()]
    written_users = {u for u in users if e.is_written(u) or u in mutated}
    if moved_in and not kwargs:
        ordered = [users[int(k[3:])] for k in moved_in]
        assert set(ordered) <= written_users, (ordered, written_users)
    directly = {v for w in e.writers for v in e.writes(w)}
    specs = {s.name: s for s in p.signature.inputs}
    for name in directly:
        spec = specs.get(name)
        if spec is not None and spec.target in p.state and name not in p.signature.user_inputs():
            assert spec.target in moved_state or p.state[spec.target].tensor in {
                p.state[f].tensor for f in moved_state
            }, f"{name} is written directly, yet {spec.target} kept its version"
    return moved_in, moved_state


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(features={"inplace_mutation", "input_mutation", "inplace_copies", "overwrites",
                          "buffers", "functional_mutation", "nesting", "shared_modules",
                          "tied_parameters", "inplace_ops", "repeated_calls", "constants"}))
def test_law_the_written_set_holds_what_running_writes(p):
    _check_written(p)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(features={"inplace_mutation", "input_mutation", "inplace_copies", "overwrites",
                          "buffers", "functional_mutation", "nesting", "repeated_calls"}))
def test_law_the_written_set_holds_what_running_writes_outlined(p):
    q = transform(p)
    _, moved = _check_written(q)
    for fqn in moved:
        assert effects.state_written(p, fqn)  # the flat program says so too


# --- where the old copies disagreed --------------------------------------------------------------

CLONE_WRITTEN = """\
program:
  inputs:
    %x: user_input
  outputs:
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %m = call_function[aten.mul.Tensor](%x, 2)
      %c = call_function[aten.clone.default](%x)
      %add_ = call_function[aten.add_.Tensor](%c, 1)
      %m_1 = call_function[aten.mul.Tensor](%x, 2)
      %out = call_function[aten.stack.default]([%m, %m_1, %c])
      return (%out,)"""


def test_a_clone_is_new_memory_so_writing_it_leaves_its_input_unwritten():
    """``clone`` returns new memory (its schema says so), so ``add_`` on the clone does not
    write ``x``; ``cse`` merges the two ``x * 2`` around the write. (The old ``graph_writes``
    put every alias-like operator's result, ``clone`` included, in its input's group, and kept
    the two apart.)"""
    p = program(CLONE_WRITTEN)
    assert facts(p) == expect(
        written=["c", "add_"], writes={"add_": ("c",)}, groups=[["c", "add_"]], effect=["add_"]
    )
    q = cse(p)
    assert q == program(
        CLONE_WRITTEN.replace("      %m_1 = call_function[aten.mul.Tensor](%x, 2)\n", "")
        .replace("[%m, %m_1, %c]", "[%m, %m, %c]"), like=p,
    )
    check_program(cse, p, inputs=lambda _: ((torch.randn(2),), {}))


HOP_CSE = HOP_BODY.replace(
    "      %body = get_attr[submod_1]()\n",
    "      %m = call_function[aten.mul.Tensor](%x, 2)\n      %body = get_attr[submod_1]()\n",
).replace(
    "      %out = call_function[aten.mul.Tensor](%getitem, 2)\n",
    "      %m_1 = call_function[aten.mul.Tensor](%x, 2)\n"
    "      %out = call_function[aten.stack.default]([%getitem, %m, %m_1])\n",
)


def test_a_value_a_higher_order_body_writes_is_not_merged_across_the_call():
    """The body of the set-grad call writes its input in place: ``x * 2`` after the call
    reads another value than before it, so ``cse`` keeps both. (The old ``graph_writes`` saw
    no write in a higher-order op but ``triton_kernel_wrapper_mutation``, and merged them.)"""
    p = program(HOP_CSE)
    assert cse(p) is p
    check_program(cse, p, inputs=lambda _: ((torch.randn(4),), {}))
    assert effects.graph_effects(p, p.root, p.root_module.graph).writes("hop") == ("x",)


# --- the remaining facts, one by one -------------------------------------------------------------

MODULE_STATE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %out: user_output
  state:
    a.w: buffer <Tensor (4,) torch.float32>
    a.k: buffer <Tensor (4,) torch.float32>
  module <root>: Top
    graph 0:
      %x = placeholder
      %a = call_module[a](%x)
      %out = call_function[aten.relu.default](%a)
      return (%out,)
  module a: A
    graph 0:
      %p = placeholder
      %w = get_attr[w]()
      %k = get_attr[k]()
      %body = get_attr[submod_1]()
      %hop = call_function[torch.ops.higher_order.wrap_with_set_grad_enabled](False, %body, %w)
      %r = call_method[reshape](%k, [4])
      %s = call_function[torch.nn.functional.relu](%p)
      %m = call_function[aten.mul](%p, %r)
      return %m
  module a.submod_1: ? [subgraph]
    graph 0:
      %q = placeholder
      %add_ = call_function[aten.add_.Tensor](%q, 1)
      return (%add_,)"""


def test_state_a_module_writes_through_a_higher_order_body():
    """``a`` hands its buffer ``w`` to a set-grad call whose body writes its input: ``a.w`` is
    written state, ``a.k`` (only reshaped) is not. A method that may return its input
    (``reshape``) and a Python function (``F.relu``) alias their arguments; a packet
    (``aten.mul``) returns new memory."""
    p = program(MODULE_STATE)
    e = effects.graph_effects(p, p.resolve("a"), p.module(p.resolve("a")).graphs[0])
    assert e.writes("hop") == ("w",)
    assert e.is_written("w") and not e.is_written("k") and not e.is_written("p")
    assert e.aliases("r", "k") and e.aliases("s", "p") and not e.aliases("m", "p")
    assert e.aliases("q", "q") and not e.aliases("w", "k")
    assert effects.state_written(p, "a.w") and not effects.state_written(p, "a.k")
    assert effects.written_state(p) == frozenset({p.state["a.w"].tensor})
    root = facts(p)
    assert root["written"] == [] and root["effect"] == ["a"]  # a call of a higher-order op


def test_a_random_body_makes_its_higher_order_op_random():
    p = program(HOP_BODY.replace("call_function[aten.add_.Tensor](%p, 1)",
                                 "call_function[aten.rand_like.default](%p)"))
    assert facts(p)["random"] == ["hop"] and facts(p)["written"] == []


def test_a_call_of_a_graph_variant_that_does_not_exist_is_unresolvable():
    p = program(CALLEE_WRITES.replace("call_module[a](%x, %y)", "call_module[a@3](%x, %y)"))
    e = effects.graph_effects(p, p.root, p.root_module.graph)
    assert e.writes("a") == ("x", "y") and e.has_effect("a") and e.is_random("a")


def test_an_outlined_module_writing_its_buffer_is_written_state():
    text = CALLEE_WRITES.replace(
        "  module <root>: Top", "  state:\n    a.b: buffer <Tensor (2,) torch.float32>\n"
        "  module <root>: Top",
    ).replace(
        "      %add_ = call_function[aten.add_.Tensor](%p, 1)\n",
        "      %b = get_attr[b]()\n      %copy_ = call_function[aten.copy_.default](%b, %q)\n",
    )
    p = program(text)
    assert effects.state_written(p, "a.b")
    a = facts(p, "a")
    # ``copy_`` reads ``q`` and writes the module's own buffer: no input of ``a`` is written
    assert a["writes"] == {"copy_": ("b",)} and a["inputs"] == []


def test_arguments_a_schema_does_not_take_make_every_argument_written():
    p = program(VIEW_THEN_WRITE.replace("aten.add_.Tensor](%v, 1)", "aten.add_.Tensor](%v, %x, 1, 2)"))
    node = p.root_module.graph.node("add_")
    assert effects.written_args(node) == ("v", "x")


def test_a_method_that_may_return_its_input_is_a_view_and_others_are_not():
    text = VIEW_THEN_WRITE.replace("call_function[aten.view.default](%x, [4])",
                                   "call_method[view](%x, [4])")
    g = program(text).root_module.graph
    assert effects.is_view(g.node("v"))
    relu = g.node("v").replace(target="relu")
    assert not effects.is_view(relu)
    assert not effects.is_assert(g.node("x")) and not effects.is_pure(g.node("output"))


def test_the_message_lists_five_state_fqns_at_most():
    text = TIED.replace("  state:\n", "  state:\n" + "".join(
        f"    s{i}: buffer <Tensor (2,) torch.float32>\n" for i in range(4)
    ))
    with pytest.raises(PassError, match=r"its state is 's0', 's1', 's2', 's3', 'u', \.\.\.: pass"):
        effects.state_written(program(text), "nope")
    with pytest.raises(PassError, match="its state is 'u', 'v', 'w': pass one of those fqns"):
        effects.state_written(program(TIED), "nope")
    with pytest.raises(PassError, match="its state is empty"):
        effects.state_written(program(VIEW_THEN_WRITE), "nope")


FOLDABLE = """\
program:
  inputs:
    %p_w: parameter w
    %x: user_input
  outputs:
    %out: user_output
  state:
    w: parameter <Parameter (2,) torch.float32>
  module <root>: Top
    graph 0:
      %p_w = placeholder
      %x = placeholder
      %c = call_function[aten.neg.default](%p_w)
      %out = call_function[aten.add.Tensor](%x, %c)
      return (%out,)"""


@pytest.fixture
def stamp():
    """A custom operator ``purefx_effects_test::stamp`` registered as effectful."""
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

    lib = torch.library.Library("purefx_effects_test", "FRAGMENT")
    lib.define("stamp(Tensor x) -> Tensor")
    lib.impl("stamp", lambda x: -x, "CompositeExplicitAutograd")
    handle = _register_effectful_op(torch.ops.purefx_effects_test.stamp.default,
                                    _EffectType.ORDERED)
    yield torch.ops.purefx_effects_test.stamp.default
    handle.destroy()
    lib._destroy()


def test_fold_into_state_keeps_an_operator_registered_as_effectful(stamp):
    """``fold_into_state`` asked ``OpFacts.recomputable``, which does not read torch's effect
    registry, and folded such a call away with its effect; it now asks ``is_pure``, as every
    other pass does. The same program with ``neg`` folds."""
    from transforms.rewrite.state_fold import fold_into_state

    p = program(FOLDABLE)
    assert fold_into_state(p, {"c"}) is not p
    graph = p.root_module.graph
    nodes = [n.replace(target=stamp) if n.name == "c" else n for n in graph.nodes]
    q = p.replace(modules=p.modules.set(p.root, p.root_module.replace(graphs=(graph.of(nodes),))))
    assert ops.is_effectful(stamp) and not effects.is_pure(q.root_module.graph.node("c"))
    assert fold_into_state(q, {"c"}) is q


ADD_INTO = """\
program:
  inputs:
    %x: user_input
    %y: user_input
  outputs:
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %y = placeholder
      %c = call_function[aten.clone.default](%x)
      %r = call_function[aten.relu.default](%y)
      %add_ = call_function[aten.add_.Tensor](%c, %r)
      %out = call_function[aten.mul.Tensor](%r, 2)
      return (%out,)"""


def test_an_in_place_result_aliases_what_it_writes_not_what_it_reads():
    """``add_(c, r)`` returns ``c``: ``r`` is only read, so it stays out of the written group
    (before, every argument of an in-place operator joined its result's group, and a value
    merely added into another counted as written)."""
    p = program(ADD_INTO)
    assert facts(p) == expect(
        written=["c", "add_"], writes={"add_": ("c",)}, groups=[["c", "add_"]], effect=["add_"]
    )


def test_set_makes_its_first_argument_a_view_of_its_source():
    """``set_(c, r)`` makes ``c`` share ``r``'s storage: a later write of the result writes
    ``r``, so ``set_``'s result is grouped with every argument."""
    p = program(
        ADD_INTO.replace("aten.add_.Tensor](%c, %r)", "aten.set_.source_Tensor](%c, %r)")
        .replace("      %out = call_function[aten.mul.Tensor](%r, 2)\n",
                 "      %w = call_function[aten.mul_.Tensor](%add_, 2)\n"
                 "      %out = call_function[aten.mul.Tensor](%r, 2)\n")
    )
    found = facts(p)
    assert "r" in found["written"]
    assert ["add_", "c", "r", "w"] in [sorted(g) for g in found["groups"]]


EVAL_DROPOUT = """\
program:
  inputs:
    %x: user_input
  outputs:
    %out: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %d = call_function[aten.dropout.default](%x, 0.1, False)
      %t = call_function[aten.dropout.default](%x, 0.1, True)
      %z = call_function[aten.dropout.default](%x, 0.0, True)
      %out = call_function[aten.add.Tensor](%x, 1)
      return (%out,)"""


def test_a_dropout_that_keeps_its_input_is_pure_and_not_random():
    """An eval-mode dropout (``train`` false) and one of ``p`` 0 draw nothing: pure, no effect,
    not random, so dead-code elimination drops them; a training dropout stays random."""
    p = program(EVAL_DROPOUT)
    g = p.root_module.graph
    assert [effects.is_pure(g.node(k)) for k in ("d", "t", "z")] == [True, False, True]
    # a dropout may return its very input (``train`` false: observed, ``ir.opset``)
    assert facts(p) == expect(effect=["t"], random=["t"], groups=[["x", "d", "t", "z"]])
    from transforms import eliminate_dead_code

    kept = [n.name for n in eliminate_dead_code(p).root_module.graph.nodes]
    assert "t" in kept and "d" not in kept and "z" not in kept


def test_aliased_args_is_the_step_the_alias_groups_are_joined_by():
    """``aliased_args``: which arguments a node's result may share memory with, without its
    program (what the editor follows through the nodes it made)."""
    import operator

    from ir.args import EMPTY_DICT, Ref, freeze
    from ir.node import CALL_FUNCTION, CALL_MODULE, PLACEHOLDER, new_node

    x, y = Ref("x"), Ref("y")
    aten = torch.ops.aten

    def node(target, *args, op=CALL_FUNCTION, **kwargs):
        return new_node(op, "n", target, freeze(args, _same), freeze(kwargs, _same), EMPTY_DICT)

    assert effects.aliased_args(node(aten.view.default, x, [-1])) == ("x",)
    assert effects.aliased_args(node(aten.reshape.default, x, [-1])) == ("x",)  # may alias
    assert effects.aliased_args(node(operator.getitem, x, 0)) == ("x",)
    assert effects.aliased_args(node(aten.add_.Tensor, x, y)) == ("x",)  # y is only read
    assert effects.aliased_args(node(aten.add.out, x, x, out=y)) == ("y",)
    assert effects.aliased_args(node(aten.set_.source_Tensor, x, y)) == ("x", "y")
    assert effects.aliased_args(node(aten.clone.default, x)) == ()  # new memory
    assert effects.aliased_args(node(aten.add.Tensor, x, y)) == ()
    assert effects.aliased_args(node("a", x, y, op=CALL_MODULE)) == ("x", "y")
    assert effects.aliased_args(node(None, op=PLACEHOLDER)) == ()


def _same(v):
    return v


def test_view_base_follows_views_to_the_memory_they_show():
    """``view_base``: the value whose memory a value is, through a chain of views (the
    rewrite guards, the sharing check and saturation ask it of the graph each holds)."""
    p = program(
        ADD_INTO.replace("      %out = call_function[aten.mul.Tensor](%r, 2)\n",
                         "      %v = call_function[aten.view.default](%r, [-1])\n"
                         "      %t = call_function[aten.t.default](%v)\n"
                         "      %out = call_function[aten.mul.Tensor](%t, 2)\n")
    )
    node_of = p.root_module.graph.by_name().get
    assert effects.view_base("t", node_of) == "r"
    assert effects.view_base("v", node_of) == "r"
    assert effects.view_base("out", node_of) == "out"  # a new tensor
    assert effects.view_base("add_", node_of) == "add_"  # in place: not a view
    assert effects.view_base("nowhere", node_of) == "nowhere"


# --- AliasSets: the union-find graph_effects and the kernel share --------------------------------


def test_alias_sets_grown_node_by_node_agree_with_the_analysis():
    """Every node of ``VIEW_THEN_WRITE`` added in order (each with what ``Effects.writes``
    says) gives the same written values as ``graph_effects``; over the ``Effects`` the answer
    starts there, and a write added later through a new view reaches the view's base."""
    p = program(VIEW_THEN_WRITE)
    g = p.root_module.graph
    e = effects.graph_effects(p, p.root, g)
    grown = effects.AliasSets()
    for n in g.nodes:
        grown.add(n, e.writes(n.name))
    names = [n.name for n in g.nodes]
    assert [n for n in names if grown.is_written(n)] == facts(p)["written"] == [
        "x", "v", "add_"]
    over = effects.AliasSets(e)
    assert [n for n in names if over.is_written(n)] == ["x", "v", "add_"]
    mul = g.node("mul")
    view = mul.replace(name="mv", target=torch.ops.aten.view.default, args=(mul.ref, [4]))
    over.add(view)
    assert not over.is_written("mul")
    over.add(view.replace(name="w", target=torch.ops.aten.mul_.Tensor, args=(view.ref, 2)))
    assert over.is_written("mul") and over.group("mv") == over.group("mul")
    assert not e.is_written("mul")  # the Effects it grew from is not changed


# --- same_tensor and alias_roots ------------------------------------------------------------------


def test_same_tensor_is_an_in_place_operator_s_first_argument_and_nothing_else():
    g = program(VIEW_THEN_WRITE).root_module.graph
    assert effects.same_tensor(g.node("add_")) == "v"
    assert effects.same_tensor(g.node("v")) is None  # a view is another tensor
    assert effects.same_tensor(g.node("mul")) is None
    assert effects.same_tensor(g.node("x")) is None
    out = g.node("mul").replace(name="o", target=torch.ops.aten.add.out, args=(g.node("x").ref, 1),
                                kwargs=None)
    assert effects.same_tensor(out) is None  # an out= form writes another argument


def test_alias_roots_follow_aliased_args_in_one_direction():
    """``x`` and ``y`` are roots. The view of ``x`` and the write through it reach ``x``; the
    higher-order op's result reaches both of its operands' roots; ``mul`` is new memory. ``x``
    and ``y`` keep their own answers (no grouping)."""
    p = program(HOP_BODY.replace(
        "%x: user_input\n", "%x: user_input\n    %y: user_input\n", 1,
    ).replace(
        "      %x = placeholder\n",
        "      %x = placeholder\n      %y = placeholder\n"
        "      %v = call_function[aten.view.default](%x, [4])\n"
        "      %add_ = call_function[aten.add_.Tensor](%v, 1)\n",
    ).replace("(False, %body, %x)", "(False, %body, %x, %y)"))
    g = p.root_module.graph
    roots = effects.alias_roots(g, ["x", "y"])
    assert roots == {
        "x": {"x"}, "y": {"y"}, "v": {"x"}, "add_": {"x"}, "hop": {"x", "y"},
        "getitem": {"x", "y"},
    }
    assert effects.alias_roots(g, []) == {}


class _Attention(torch.nn.Module):
    def __init__(self, dropout_p: float) -> None:
        super().__init__()
        self.dropout_p = dropout_p

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        F = torch.nn.functional
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p)


@pytest.mark.parametrize(("dropout_p", "draws"), [(0.0, False), (0.25, True)])
def test_attention_draws_only_with_a_dropout_probability(dropout_p, draws):
    # sdpa is tagged random (its dropout); at dropout_p 0 it draws nothing, so it is pure, not
    # random and no effect: a search may merge it and an e-graph need not make it a leaf
    qkv = tuple(torch.randn(1, 2, 4, 8) for _ in range(3))
    from ir import import_ep

    p = import_ep(torch.export.export(_Attention(dropout_p).train(), qkv))
    (node,) = [n for n in p.root_module.graph.nodes if "attention" in str(n.target)]
    assert effects.inert_dropout(node) is not draws and effects.is_pure(node) is not draws
    found = effects.graph_effects(p, p.root, p.root_module.graph)
    assert found.is_random(node.name) is draws
    import attrs

    zero = attrs.evolve(node, args=(*node.args[:3], None, 0), kwargs={})
    assert effects.inert_dropout(zero) and effects.is_pure(zero)  # an int 0 draws nothing too
    once = attrs.evolve(node, args=(*node.args[:3], None, True), kwargs={})
    assert not effects.inert_dropout(once)  # a bool is no probability: not read as 0
