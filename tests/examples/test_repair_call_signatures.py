"""Before/Expected examples for ``repair_call_signatures``: a preserved call's signature that
names a value the call does not use as such (an input defined after the call starts or never read
by it nor passed on to a preserved call it makes; an output defined outside the call or itself
state traffic) names instead
the one value that crosses the boundary unsigned, preferring the same provenance, else the same
shape and dtype, else the only value of the same kind. A name that is only unused (an output the
caller drops) is matched after the names that cannot be right, with what they leave. The graph
never changes; a signature is the only difference, so each Expected text is its Before text with
the repaired signature line.

The text carries no ``val`` or ``from_node`` meta: ``meta(p, name=...)`` attaches it."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from beforeafter import program

from ir import Program
from transforms.preserved.signatures import repair_call_signatures

SPEC = "tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])"


def flat(inputs: str, outputs: str, body: str, state: bool = False) -> str:
    """A flat program: user input ``x``, preserved call ``a`` with signature ``inputs`` ->
    ``outputs``, root output ``mul``; with ``state``, buffer ``n`` updated to ``add``."""
    text = f"""\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: {SPEC}
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: {inputs}
      outputs: {outputs}
      in_spec: {SPEC}
      out_spec: leaf
  call order: ('', 'a')
  module <root>: Top
    graph 0:
      %x = placeholder
{body}
      return (%mul,)
  module a: A"""
    if not state:
        return text
    return (
        text.replace("  inputs:\n", "  inputs:\n    %b_n: buffer n persistent=True\n", 1)
        .replace("  outputs:\n", "  outputs:\n    %add: buffer_mutation n\n", 1)
        .replace("  preserved", "  state:\n    n: buffer <Tensor (2,) torch.float32>\n  preserved")
        .replace("      %x = placeholder", "      %b_n = placeholder\n      %x = placeholder")
        .replace("return (%mul,)", "return (%add, %mul)")
    )


def meta(p: Program, **entries: dict) -> Program:
    """``p`` whose nodes named in ``entries`` carry that meta (``val``, ``from_node``)."""
    root = p.root_module
    nodes = [n.with_meta(**entries[n.name]) if n.name in entries else n for n in root.graph.nodes]
    return p.replace(
        modules=p.modules.set(p.root, root.replace(graphs=(root.graph.of(nodes),)))
    )


def tensor(*shape: int, origin: str | None = None) -> dict:
    """Meta of a float tensor value of ``shape`` made by ``run_decompositions`` from ``origin``."""
    made = {"val": torch.empty(shape)}
    return made | {"from_node": [SimpleNamespace(name=origin)]} if origin else made


def check(before: Program, expected_text: str) -> None:
    after = repair_call_signatures(before)
    assert after == program(expected_text, like=before)  # the graph is the same: exact equality
    assert repair_call_signatures(after) is after  # idempotent


# a reads sin (made before it) and hands neg to the root
BODY = """\
      %sin = call_function[aten.sin.default](%x)
      %exp = call_function[aten.exp.default](%x)
      %cos = call_function[aten.cos.default](%sin)  # stack: a
      %neg = call_function[aten.neg.default](%cos)  # stack: a
      %mul = call_function[aten.mul.Tensor](%neg, %exp)"""


def test_an_input_defined_after_the_call_starts_is_renamed():
    check(program(flat("(%cos,)", "(%neg,)", BODY)), flat("(%sin,)", "(%neg,)", BODY))


def test_an_input_the_call_never_reads_is_renamed():
    check(program(flat("(%exp,)", "(%neg,)", BODY)), flat("(%sin,)", "(%neg,)", BODY))


def test_an_output_defined_outside_the_call_is_renamed():
    check(program(flat("(%sin,)", "(%mul,)", BODY)), flat("(%sin,)", "(%neg,)", BODY))


# as for a train-mode batch norm after run_decompositions: a's signature names add, the buffer's
# new value (written back, never read by the root), as its output; relu is what crosses to the root
STATE_BODY = """\
      %add = call_function[aten.add.Tensor](%b_n, %x)  # stack: a
      %relu = call_function[aten.relu.default](%add)  # stack: a
      %mul = call_function[aten.mul.Tensor](%relu, %x)"""


def test_an_output_read_only_as_a_state_write_is_renamed():
    before = program(flat("(%x,)", "(%add,)", STATE_BODY, state=True))
    check(before, flat("(%x,)", "(%relu,)", STATE_BODY, state=True))


# a reads sin and exp, both made before it and both unsigned; its signature names tanh, made
# inside it: which of sin and exp it stands for is up to the meta
TWO_BODY = """\
      %sin = call_function[aten.sin.default](%x)
      %exp = call_function[aten.exp.default](%x)
      %tanh = call_function[aten.tanh.default](%x)  # stack: a
      %add = call_function[aten.add.Tensor](%sin, %exp)  # stack: a
      %mul = call_function[aten.mul.Tensor](%add, %tanh)"""
TWO = flat("(%tanh,)", "(%add,)", TWO_BODY)


def test_same_provenance_comes_first():
    before = meta(
        program(TWO),
        tanh=tensor(2, origin="old"),
        sin=tensor(3, origin="old"),
        exp=tensor(2, origin="other"),
    )
    check(before, flat("(%sin,)", "(%add,)", TWO_BODY))  # not exp, though of tanh's shape


def test_else_same_shape_and_dtype():
    before = meta(program(TWO), tanh=tensor(2), sin=tensor(3), exp=tensor(2))
    check(before, flat("(%exp,)", "(%add,)", TWO_BODY))


def test_else_the_only_value_of_the_same_kind():
    # exp, never read by a, is the only suspect; sin, of another shape, the only candidate
    before = flat("(%exp,)", "(%neg,)", BODY)
    check(meta(program(before), exp=tensor(2), sin=tensor(3)), flat("(%sin,)", "(%neg,)", BODY))
    sin_is_a_size = meta(program(before), exp=tensor(2), sin={"val": 2})
    assert repair_call_signatures(sin_is_a_size) is sin_is_a_size


def test_no_unique_candidate_leaves_the_signature():
    # sin and exp both cross into a unsigned, with the same shape and no provenance
    ambiguous = meta(program(TWO), tanh=tensor(2), sin=tensor(2), exp=tensor(2))
    assert repair_call_signatures(ambiguous) is ambiguous


def test_a_user_input_is_never_renamed():
    # a does not read x, but x keeps its name through run_decompositions: not a stale name
    p = program(flat("(%x,)", "(%neg,)", BODY))
    assert repair_call_signatures(p) is p


def test_a_consistent_signature_or_no_preserved_call_is_returned_as_it_is():
    p = program(flat("(%sin,)", "(%neg,)", BODY))
    assert repair_call_signatures(p) is p
    no_call = program(NO_CALL)
    assert repair_call_signatures(no_call) is no_call


NO_CALL = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)  # stack: a
      return (%neg,)
  module a: A"""


def flat2(outputs: str, body: str) -> str:
    """``flat`` with a call ``a`` of two results (its signature: input ``x``, ``outputs``)."""
    return flat("(%x,)", outputs, body).replace("out_spec: leaf", "out_spec: tree(tuple, [leaf, leaf])")


# as for a decomposed Mixtral MoE block with its router preserved: a returns its logits (cos),
# which the caller drops, and its top-k index (neg), which the caller sorts; the signature names
# getitem, the sort's value made after a ends (torch kept a stale name), not neg
DROPPED_BODY = """\
      %cos = call_function[aten.cos.default](%x)  # stack: a
      %neg = call_function[aten.neg.default](%x)  # stack: a
      %sort = call_function[aten.sort.default](%neg)
      %getitem = call_function[_operator.getitem](%sort, 0)
      %mul = call_function[aten.mul.Tensor](%getitem, %x)"""


def test_a_dropped_output_does_not_hide_a_stale_one():
    # cos, read by nothing after a, is only doubtful: getitem, made after a, is the certain
    # suspect, and neg is left for it alone
    before = program(flat2("(%cos, %getitem)", DROPPED_BODY))
    check(before, flat2("(%cos, %neg)", DROPPED_BODY))


def test_a_dropped_output_takes_only_what_a_stale_one_leaves():
    # cos has neg's shape and dtype, getitem another shape: neg still goes to getitem
    same_as_cos = meta(
        program(flat2("(%cos, %getitem)", DROPPED_BODY)),
        cos=tensor(2), neg=tensor(2), getitem=tensor(3),
    )
    check(same_as_cos, flat2("(%cos, %neg)", DROPPED_BODY))


# a returns neg, which the caller reads only to compute the buffer's new value (``self.n.copy_(
# a(x) * 2)``); sin, made in a, crosses to the root unsigned (export shared it)
WRITTEN_BODY = """\
      %cos = call_function[aten.cos.default](%x)  # stack: a
      %neg = call_function[aten.neg.default](%cos)  # stack: a
      %sin = call_function[aten.sin.default](%cos)  # stack: a
      %add = call_function[aten.mul.Tensor](%neg, 2.0)
      %mul = call_function[aten.mul.Tensor](%sin, %x)"""


def test_an_output_the_caller_reads_into_state_is_kept():
    # neg is not itself state traffic: the caller reads it, and sin may not take its name
    p = program(flat("(%x,)", "(%neg,)", WRITTEN_BODY, state=True))
    assert repair_call_signatures(p) is p


NESTED = f"""\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  preserved calls:
    '':
      inputs: (%x,)
      outputs: (%mul,)
      in_spec: {SPEC}
      out_spec: tree(tuple, [leaf])
    'a':
      inputs: (%sin,)
      outputs: (%neg,)
      in_spec: {SPEC}
      out_spec: leaf
    'a.b':
      inputs: (%sin, %cos)
      outputs: (%neg,)
      in_spec: tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [], [])])
      out_spec: leaf
  call order: ('', 'a', 'a.b')
  module <root>: Top
    graph 0:
      %x = placeholder
      %sin = call_function[aten.sin.default](%x)
      %exp = call_function[aten.exp.default](%sin)
      %cos = call_function[aten.cos.default](%exp)  # stack: a
      %neg = call_function[aten.neg.default](%cos)  # stack: a, a.b
      %mul = call_function[aten.mul.Tensor](%neg, %x)
      return (%mul,)
  module a: A
  module a.b: B"""


def test_an_argument_passed_on_to_a_preserved_call_is_kept():
    # a reads no sin itself, but hands it to a.b (which ignores it): exp, made by the caller and
    # read by a unsigned, may not take its name, or a.b would name a value a no longer has
    p = program(NESTED)
    assert repair_call_signatures(p) is p


def nested(a_inputs: str, b_inputs: str) -> str:
    """``NESTED`` with ``a``'s and ``a.b``'s signature inputs as given (one each)."""
    return (
        NESTED.replace("inputs: (%sin,)", f"inputs: {a_inputs}", 1)
        .replace("inputs: (%sin, %cos)", f"inputs: {b_inputs}", 1)
        .replace("tree(tuple, [tree(tuple, [leaf, leaf])", "tree(tuple, [tree(tuple, [leaf])", 1)
    )


def test_an_argument_no_longer_passed_on_is_repaired_in_the_same_run():
    # a.b ignores sin and reads cos unsigned, so sin becomes cos there; then a hands sin to no
    # preserved call and never reads it, while exp crosses into it unsigned: one run repairs
    # both, or a second run would change a's signature (the pass would not be idempotent)
    check(program(nested("(%sin,)", "(%sin,)")), nested("(%exp,)", "(%cos,)"))


# a's signature names tanh and cos, both made inside it; a reads sin, exp and log unsigned
RANKED_BODY = """\
      %sin = call_function[aten.sin.default](%x)
      %exp = call_function[aten.exp.default](%x)
      %log = call_function[aten.log.default](%x)
      %tanh = call_function[aten.tanh.default](%x)  # stack: a
      %cos = call_function[aten.cos.default](%x)  # stack: a
      %add = call_function[aten.add.Tensor](%sin, %exp)  # stack: a
      %neg = call_function[aten.neg.default](%log)  # stack: a
      %mul = call_function[aten.mul.Tensor](%add, %neg)"""


def test_a_match_that_takes_a_candidate_settles_an_earlier_ambiguous_name():
    # tanh has the shape of sin and exp (ambiguous) until cos, from sin's old node, takes sin:
    # then exp is tanh's only candidate of its shape, in the same run
    two = "tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [], [])])"
    text = flat("(%tanh, %cos)", "(%add, %neg)", RANKED_BODY).replace(
        f"in_spec: {SPEC}\n      out_spec: leaf", f"in_spec: {two}\n      out_spec: tree(tuple, [leaf, leaf])"
    )
    before = meta(
        program(text),
        tanh=tensor(2), cos=tensor(3, origin="old"),
        sin=tensor(2, origin="old"), exp=tensor(2), log=tensor(3),
    )
    check(before, text.replace("(%tanh, %cos)", "(%exp, %sin)"))
