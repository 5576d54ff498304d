"""Before/Expected examples for ``rematerialize`` on values one preserved call makes and another
reads: as an argument its caller passes (resolved in the caller before the call starts, and the
call's signature renamed), inside its body (recomputed from its own arguments), as an alias of
the other call's output (read from that output), with a parent and child both preserved (the
parent passing or returning what its child made inside), with
repeated calls, and a value that cannot be recomputed (a named ``PassError``)."""

from __future__ import annotations

import pytest
import torch
from beforeafter import program

from ir import format_program, verify
from ir.errors import PassError
from lowering.pass_laws import check_program
from transforms import outline, transform
from transforms.pipeline import pipeline
from transforms.preserved.remat import rematerialize

IN1 = "tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])"
IN2 = "tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [], [])])"


def text(body: str, calls: str, order: str, modules: str, out: str = "mul") -> str:
    return f"""\
program:
  inputs:
    %x: user_input
  outputs:
    %{out}: user_output
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%{out},)
      in_spec: {IN1}
      out_spec: tree(tuple, [leaf])
{calls}
  call order: {order}
  module <root>: Top
    graph 0:
      %x = placeholder
{body}
      return (%{out},)
{modules}"""


def call(name: str, inputs: str, outputs: str) -> str:
    spec = IN2 if "," in inputs.strip("(,)") else IN1
    return f"""\
    '{name}':
      inputs: {inputs}
      outputs: {outputs}
      in_spec: {spec}
      out_spec: leaf"""


SIBLINGS = "  module a: A\n  module b: B"
A = call("a", "(%x,)", "(%div,)")
MADE_IN_A = """\
      %abs_1 = call_function[aten.abs.default](%x)  # stack: a
      %add = call_function[aten.add.Tensor](%abs_1, 1)  # stack: a
      %div = call_function[aten.div.Tensor](%x, %add)  # stack: a"""


def check(before_text: str, expected_text: str) -> None:
    before = program(before_text)
    after = rematerialize(before)
    verify(after)
    expected = program(expected_text, like=before)
    assert format_program(after, vals=False) == format_program(expected, vals=False)
    assert rematerialize(after) == after  # idempotent
    verify(outline(before))  # the outliner takes what was rematerialized


def test_argument_made_inside_a_sibling_is_recomputed_by_the_caller():
    """``b`` is passed ``%add``, made inside ``a`` and not returned by it: the root computes
    it again from ``x`` before ``b`` starts, and passes that."""
    before = text(
        MADE_IN_A + "\n      %mul = call_function[aten.mul.Tensor](%div, %add)  # stack: b",
        A + "\n" + call("b", "(%div, %add)", "(%mul,)"),
        "('', 'a', 'b')",
        SIBLINGS,
    )
    expected = text(
        MADE_IN_A
        + """
      %abs_1_1 = call_function[aten.abs.default](%x)
      %add_1 = call_function[aten.add.Tensor](%abs_1_1, 1)
      %mul = call_function[aten.mul.Tensor](%div, %add_1)  # stack: b""",
        A + "\n" + call("b", "(%div, %add_1)", "(%mul,)"),
        "('', 'a', 'b')",
        SIBLINGS,
    )
    check(before, expected)
    after = rematerialize(program(before))
    copy = after.root_module.graph.node("add_1")
    assert list(copy.meta["nn_module_stack"]) == ["L__self__"], "the copy runs in the caller"


def test_value_read_inside_a_sibling_is_recomputed_from_its_own_argument():
    """``b`` takes ``x`` and reads ``%add`` (made inside ``a``) in its body: ``b`` computes it
    again from its own ``x``; its signature is unchanged."""
    calls = A + "\n" + call("b", "(%x,)", "(%mul,)")
    before = text(
        MADE_IN_A + "\n      %mul = call_function[aten.mul.Tensor](%x, %add)  # stack: b",
        calls, "('', 'a', 'b')", SIBLINGS,
    )
    expected = text(
        MADE_IN_A
        + """
      %abs_1_1 = call_function[aten.abs.default](%x)  # stack: b
      %add_1 = call_function[aten.add.Tensor](%abs_1_1, 1)  # stack: b
      %mul = call_function[aten.mul.Tensor](%x, %add_1)  # stack: b""",
        calls, "('', 'a', 'b')", SIBLINGS,
    )
    check(before, expected)


def test_argument_that_is_the_siblings_output_up_to_an_alias_reads_that_output():
    """``b`` is passed ``%getitem_1``, a second ``getitem`` of the tuple whose first item ``a``
    returns: ``b`` is passed ``a``'s output, so a swapped ``a`` is seen by ``b``."""
    body = """\
      %topk = call_function[aten.topk.default](%x, 2)  # stack: a
      %getitem = call_function[_operator.getitem](%topk, 0)  # stack: a
      %getitem_1 = call_function[_operator.getitem](%topk, 0)  # stack: a
      %mul = call_function[aten.mul.Tensor](%getitem_1, 2)  # stack: b"""
    a = call("a", "(%x,)", "(%getitem,)")
    before = text(body, a + "\n" + call("b", "(%getitem_1,)", "(%mul,)"), "('', 'a', 'b')",
                  SIBLINGS)
    expected = text(
        body.replace("(%getitem_1, 2)", "(%getitem, 2)"),
        a + "\n" + call("b", "(%getitem,)", "(%mul,)"), "('', 'a', 'b')", SIBLINGS,
    )
    check(before, expected)


def test_parent_and_children_preserved_the_parent_recomputes_for_its_child():
    """``p``, ``p.a`` and ``p.b`` preserved; ``p.b`` is passed ``%add`` made inside ``p.a``:
    ``p`` (the caller of ``p.b``) computes it again from its own ``x``."""
    nested = MADE_IN_A.replace("# stack: a", "# stack: p, p.a")
    calls = "\n".join([
        call("p", "(%x,)", "(%mul,)"),
        call("p.a", "(%x,)", "(%div,)"),
        call("p.b", "(%div, %add)", "(%mul,)"),
    ])
    modules = "  module p: P\n  module p.a: A\n  module p.b: B"
    order = "('', 'p', 'p.a', 'p.b')"
    before = text(
        nested + "\n      %mul = call_function[aten.mul.Tensor](%div, %add)  # stack: p, p.b",
        calls, order, modules,
    )
    expected = text(
        nested
        + """
      %abs_1_1 = call_function[aten.abs.default](%x)  # stack: p
      %add_1 = call_function[aten.add.Tensor](%abs_1_1, 1)  # stack: p
      %mul = call_function[aten.mul.Tensor](%div, %add_1)  # stack: p, p.b""",
        calls.replace("(%div, %add)", "(%div, %add_1)"), order, modules,
    )
    check(before, expected)


def test_parent_that_returns_its_childs_inner_value_recomputes_it():
    """``p`` returns ``%add``, made inside its preserved child ``p.a`` and not returned by it:
    ``p`` computes it again from its own ``x`` before it ends, and returns that; the root reads
    what ``p`` returns."""
    nested = MADE_IN_A.replace("# stack: a", "# stack: p, p.a")
    calls = "\n".join([call("p", "(%x,)", "(%div, %add)"), call("p.a", "(%x,)", "(%div,)")])
    modules = "  module p: P\n  module p.a: A"
    order = "('', 'p', 'p.a')"
    before = text(
        nested + "\n      %mul = call_function[aten.mul.Tensor](%div, %add)",
        calls, order, modules,
    )
    expected = text(
        nested
        + """
      %abs_1_1 = call_function[aten.abs.default](%x)  # stack: p
      %add_1 = call_function[aten.add.Tensor](%abs_1_1, 1)  # stack: p
      %mul = call_function[aten.mul.Tensor](%div, %add_1)""",
        calls.replace("(%div, %add)", "(%div, %add_1)"), order, modules,
    )
    check(before, expected)


def test_repeated_calls_each_recompute_what_they_are_passed():
    """``a`` and ``b`` are called twice; each call of ``b`` is passed what the call of ``a``
    before it made inside: one copy per call, from that call's own argument."""
    second = (
        MADE_IN_A.replace("# stack: a", "# stack: a@1")
        .replace("%abs_1 ", "%abs_2 ").replace("(%abs_1,", "(%abs_2,")
        .replace("%add ", "%add_2 ").replace("(%x, %add)", "(%mul, %add_2)")
        .replace("%div ", "%div_2 ")
    )
    body = (
        MADE_IN_A
        + "\n      %mul = call_function[aten.mul.Tensor](%div, %add)  # stack: b\n"
        + second.replace("(%x)", "(%mul)")
        + "\n      %mul_2 = call_function[aten.mul.Tensor](%div_2, %add_2)  # stack: b@1"
    )
    calls = [
        A,
        call("b", "(%div, %add)", "(%mul,)"),
        call("a@1", "(%mul,)", "(%div_2,)"),
        call("b@1", "(%div_2, %add_2)", "(%mul_2,)"),
    ]
    order = "('', 'a', 'b', 'a@1', 'b@1')"
    before = text(body, "\n".join(calls), order, SIBLINGS, out="mul_2")
    after = rematerialize(program(before))
    verify(after)
    sigs = after.call_signatures
    assert [a.name for a in sigs["b"].inputs] == ["div", "add_1"]
    assert [a.name for a in sigs["b@1"].inputs] == ["div_2", "add_2_1"]
    graph = after.root_module.graph
    assert graph.node("abs_1_1").args[0].name == "x"
    assert graph.node("abs_2_1").args[0].name == "mul"
    assert graph.node("mul_2").args[1].name == "add_2_1"


def test_argument_that_cannot_be_recomputed_is_a_named_error():
    """A random value made inside ``a`` and passed to ``b``: the caller cannot make it again."""
    before = text(
        """\
      %rand_like = call_function[aten.rand_like.default](%x)  # stack: a
      %div = call_function[aten.div.Tensor](%x, %rand_like)  # stack: a
      %mul = call_function[aten.mul.Tensor](%div, %rand_like)  # stack: b""",
        A + "\n" + call("b", "(%div, %rand_like)", "(%mul,)"),
        "('', 'a', 'b')",
        SIBLINGS,
    )
    with pytest.raises(PassError) as info:
        rematerialize(program(before))
    message = str(info.value)
    assert "value %rand_like is produced inside a preserved call 'a'" in message
    assert "passed as an argument to the preserved call 'b' in '<root>'" in message
    assert "is random" in message
    assert "Return it from 'a'" in message


STATE_SPEC = "tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])"


def nested_with_state(body: str, p_out: str) -> str:
    """A preserved parent ``p`` and its preserved child ``p.c``, which updates its buffer ``n``
    twice (``%add``, then ``%add_1``, written back in place)."""
    return f"""\
program:
  inputs:
    %b_n: buffer p.c.n persistent=True
    %x: user_input
  outputs:
    %t: user_output
  state:
    p.c.n: buffer <Tensor (2,) torch.float32>
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%t,)
      in_spec: {STATE_SPEC}
      out_spec: tree(tuple, [leaf])
    'p':
      inputs: (%x,)
      outputs: ({p_out},)
      in_spec: {STATE_SPEC}
      out_spec: leaf
    'p.c':
      inputs: (%x,)
      outputs: (%o,)
      in_spec: {STATE_SPEC}
      out_spec: leaf
  call order: ('', 'p', 'p.c')
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %add = call_function[aten.add.Tensor](%b_n, %x)  # stack: p, p.c
      %o = call_function[aten.mul.Tensor](%x, %add)  # stack: p, p.c
      %add_1 = call_function[aten.add.Tensor](%add, %o)  # stack: p, p.c
      %copy_ = call_function[aten.copy_.default](%b_n, %add_1)  # stack: p, p.c
      %r = call_function[aten.relu.default](%o)  # stack: p, p.c
{body}
      return (%t,)
  module p: P
  module p.c: C"""


def test_a_slice_reads_what_a_parent_now_returns_not_its_childs_stale_state():
    """``p`` returns ``%r``, made inside its child ``p.c``, and computes ``%s`` from it, which
    the root reads (``%u`` reads ``p.c``'s output, so its signature is not stale). ``p`` now returns its own copy ``%r_1``, and the root's copy of ``%s`` reads
    that: recomputing ``%r`` from ``p.c``'s insides instead would read ``%add``, a value of
    ``p.c.n`` that ``%add_1`` has replaced, which no stage after can carry (found by
    ``crossing_programs``: the pipeline raised a ``PassError`` from ``insert_ivals``)."""
    before = nested_with_state(
        """\
      %u = call_function[aten.sigmoid.default](%o)  # stack: p
      %s = call_function[aten.neg.default](%r)  # stack: p
      %t = call_function[aten.add.Tensor](%s, %r)""",
        "%r",
    )
    expected = nested_with_state(
        """\
      %u = call_function[aten.sigmoid.default](%o)  # stack: p
      %r_1 = call_function[aten.relu.default](%o)  # stack: p
      %s = call_function[aten.neg.default](%r_1)  # stack: p
      %s_1 = call_function[aten.neg.default](%r_1)
      %t = call_function[aten.add.Tensor](%s_1, %r_1)""",
        "%r_1",
    )
    check(before, expected)
    p = program(before)
    x = (torch.randn(2),)
    check_program(transform, p, inputs=lambda _: (x, {}), idempotent=True)


def functional_update(body: str, out: str) -> str:
    """A preserved ``c`` that reads its buffer ``n`` (``%m``) and makes its next value
    functionally, ``%upd = x + n`` (a ``buffer_mutation`` output: no first-argument update
    chain, no in-place write), before the root reads ``body``."""
    return f"""\
program:
  inputs:
    %b_n: buffer c.n persistent=True
    %x: user_input
  outputs:
    %{out}: buffer_mutation c.n
    %t: user_output
  state:
    c.n: buffer <Tensor (2,) torch.float32>
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%t,)
      in_spec: {STATE_SPEC}
      out_spec: tree(tuple, [leaf])
    'c':
      inputs: (%x,)
      outputs: (%o,)
      in_spec: {STATE_SPEC}
      out_spec: leaf
  call order: ('', 'c')
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %m = call_function[aten.mul.Tensor](%b_n, 2)  # stack: c
      %o = call_function[aten.add.Tensor](%x, %m)  # stack: c
      %upd = call_function[aten.add.Tensor](%x, %b_n)  # stack: c
{body}
      return (%{out}, %t)
  module c: C"""



def test_a_buffer_updated_functionally_is_read_as_it_was_before_the_update():
    """The root reads ``%m``, made inside ``c`` from ``n`` before ``c`` makes ``n``'s next
    value functionally (``x + n``: no first-argument update chain). With the update kept
    functional (written back after the program), ``n`` is its old value everywhere in the
    graph, so ``%m`` is recomputed from it, and the update, which the root writes back, is
    copied there too; the result computes what the flat program does. In the default pipeline
    (``functional_to_inplace`` first) the same read is declined, by ``rematerialize``, naming
    the buffer and the reason, not later by ``insert_ivals``."""
    before = functional_update("      %t = call_function[aten.sub.Tensor](%o, %m)", "upd")
    expected = functional_update(
        """      %m_1 = call_function[aten.mul.Tensor](%b_n, 2)
      %t = call_function[aten.sub.Tensor](%o, %m_1)
      %upd_1 = call_function[aten.add.Tensor](%x, %b_n)""",
        "upd_1",
    )
    check(before, expected)
    p = program(before)
    x = (torch.randn(2),)
    check_program(lambda q: transform(q, pipeline(keep_functional=True)), p,
                  inputs=lambda _: (x, {}), idempotent=True)
    with pytest.raises(PassError) as caught:
        transform(p)
    message = str(caught.value)
    assert "its slice (%m) reads %b_n, which is updated before the reader runs" in message
    assert "re-export" not in message


def test_a_written_back_value_is_copied_to_where_it_is_written_back():
    """The same update read only by the root's ``buffer_mutation`` output: it is copied there
    and computes what the flat program does."""
    body = "      %t = call_function[aten.sub.Tensor](%o, %x)"
    before = functional_update(body, "upd")
    expected = functional_update(
        body + "\n      %upd_1 = call_function[aten.add.Tensor](%x, %b_n)", "upd_1")
    check(before, expected)
    p = program(before)
    x = (torch.randn(2),)
    check_program(transform, p, inputs=lambda _: (x, {}), idempotent=True)
