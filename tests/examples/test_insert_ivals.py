"""Before/Expected examples for ``insert_ivals``: a value on a buffer's update chain that a
preserved call computes and that is read across its boundary without its signature carrying it
(an *ival*) gets a ``copy_(buffer, value)`` right after it, in the call that computes it (the copy
carries the value's module stack); the reads are not changed (``outline`` then reads the buffer
instead), except where the buffer is written again after the read: the reading call's first
reader reads a snapshot, ``<value>_read = clone(<value>)`` right before it. Nothing else
changes."""

from __future__ import annotations

from beforeafter import program

from ir import Program
from transforms.machinery.frames import node_frames
from transforms.preserved.ivals import insert_ivals

SPEC = "tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])"
HEAD = """\
program:
  inputs:
    %b_n: buffer n persistent=True
    %x: user_input
  outputs:
    %NEW: buffer_mutation n
    %mul: user_output
  state:
    n: buffer <Tensor (2,) torch.float32>
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: SPEC
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%x,)
      outputs: (%relu,)
      in_spec: SPEC
      out_spec: leaf
"""


def text(t: str) -> str:
    """``t`` with its call specs written out."""
    return t.replace("SPEC", SPEC)


def calls(p: Program) -> dict[str, list[str]]:
    """Each computing root node's preserved calls (``a``, ``a@1``), outermost first."""
    return {
        n.name: [f.call_name for f in node_frames(n)]
        for n in p.root_module.graph.nodes
        if "nn_module_stack" in n.meta
    }


def check(before_text: str, expected_text: str) -> None:
    before = program(before_text)
    after = insert_ivals(before)
    expected = program(expected_text, like=before)
    assert after == expected  # no node is renamed: exact equality
    assert calls(after) == calls(expected)  # each copy runs in the call that computes its value
    assert insert_ivals(after) is after  # idempotent


ONCE = HEAD.replace("%NEW", "%add") + """\
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a
      %relu = call_function[aten.relu.default](%add)  # stack: a
      %mul = call_function[aten.mul.Tensor](%relu, %add)
      return (%add, %mul)
  module a: A"""


def test_a_buffer_update_read_after_the_call_is_written_back_in_it():
    # mul reads add, n's new value, but a's signature hands out only relu
    check(
        text(ONCE),
        text(ONCE.replace(
            "%add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a",
            "%add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a\n"
            "      %copy_ = call_function[aten.copy_.default](%b_n, %add)  # stack: a",
        )),
    )


TWICE = HEAD.replace("%NEW", "%add_1") + """\
    'a@1':
      inputs: (%relu,)
      outputs: (%relu_1,)
      in_spec: SPEC
      out_spec: leaf
  call order: ('', 'a', 'a@1')
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a
      %relu = call_function[aten.relu.default](%add)  # stack: a
      %add_1 = call_function[aten.add.Tensor](%add, %relu)  # stack: a@1
      %relu_1 = call_function[aten.relu.default](%add_1)  # stack: a@1
      %mul = call_function[aten.mul.Tensor](%relu_1, %add_1)
      return (%add_1, %mul)
  module a: A"""


def test_a_buffer_updated_by_each_of_two_calls_is_written_back_in_each():
    # a@1 reads a's update of n (add) and the root reads a@1's (add_1): neither is signed;
    # a@1 writes n again after its read, so it reads a snapshot of add (an operator that saved
    # n for the backward would see that write)
    expected = TWICE.replace(
        "%add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a",
        "%add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a\n"
        "      %copy_ = call_function[aten.copy_.default](%b_n, %add)  # stack: a",
    ).replace(
        "%add_1 = call_function[aten.add.Tensor](%add, %relu)  # stack: a@1",
        "%add_read = call_function[aten.clone.default](%add)  # stack: a@1\n"
        "      %add_1 = call_function[aten.add.Tensor](%add_read, %relu)  # stack: a@1\n"
        "      %copy__1 = call_function[aten.copy_.default](%b_n, %add_1)  # stack: a@1",
    )
    check(text(TWICE), text(expected))


def test_a_buffer_update_the_signature_carries_is_no_ival():
    signed = program(text(ONCE.replace("outputs: (%relu,)", "outputs: (%relu, %add)")))
    assert insert_ivals(signed) is signed


def test_a_program_without_preserved_calls_is_returned_as_it_is():
    plain = ONCE[: ONCE.index("  preserved calls:")] + ONCE[ONCE.index("  module <root>"):]
    p = program(plain)
    assert insert_ivals(p) is p


def test_a_call_reading_an_ival_twice_reads_one_snapshot():
    # a@1 reads add twice before it writes n again: one clone, before the first, read by both
    twice_read = TWICE.replace(
        "%add_1 = call_function[aten.add.Tensor](%add, %relu)  # stack: a@1",
        "%pre = call_function[aten.mul.Tensor](%add, %relu)  # stack: a@1\n"
        "      %add_1 = call_function[aten.add.Tensor](%add, %pre)  # stack: a@1",
    )
    expected = twice_read.replace(
        "%add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a",
        "%add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a\n"
        "      %copy_ = call_function[aten.copy_.default](%b_n, %add)  # stack: a",
    ).replace(
        "%pre = call_function[aten.mul.Tensor](%add, %relu)  # stack: a@1\n"
        "      %add_1 = call_function[aten.add.Tensor](%add, %pre)  # stack: a@1",
        "%add_read = call_function[aten.clone.default](%add)  # stack: a@1\n"
        "      %pre = call_function[aten.mul.Tensor](%add_read, %relu)  # stack: a@1\n"
        "      %add_1 = call_function[aten.add.Tensor](%add_read, %pre)  # stack: a@1\n"
        "      %copy__1 = call_function[aten.copy_.default](%b_n, %add_1)  # stack: a@1",
    )
    check(text(twice_read), text(expected))


CALLER_WRITES = HEAD.replace("    %NEW: buffer_mutation n\n", "") + """\
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a
      %made = call_function[aten.neg.default](%relu)  # stack: a
      %copy_ = call_function[aten.copy_.default](%b_n, %made)
      %mul = call_function[aten.mul.Tensor](%relu, %x)
      return (%mul,)
  module a: A"""


def test_a_value_the_caller_writes_into_state_is_written_back_where_it_is_made():
    # the root writes made, which a computes and does not return, into n after the call: it
    # is written back in a (outlining reads it from n outside a, the root's copy_ included)
    check(
        text(CALLER_WRITES),
        text(CALLER_WRITES.replace(
            "%made = call_function[aten.neg.default](%relu)  # stack: a",
            "%made = call_function[aten.neg.default](%relu)  # stack: a\n"
            "      %copy__1 = call_function[aten.copy_.default](%b_n, %made)  # stack: a",
        )),
    )


def test_an_input_a_call_writes_into_state_is_no_ival():
    # a writes the root's input x into n: x is an input of the program, read as one, not a value
    # a call makes
    p = program(text(CALLER_WRITES.replace(
        "%copy_ = call_function[aten.copy_.default](%b_n, %made)",
        "%copy_ = call_function[aten.copy_.default](%b_n, %x)  # stack: a",
    )))
    assert insert_ivals(p) is p
