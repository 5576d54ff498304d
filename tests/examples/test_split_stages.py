"""Before/Expected examples for ``split_stages``: a flat program (module stacks as ``# stack:``
comments) cut at module paths into stage Programs, each outlined by the default pipeline.

1. A residual input read by the last stage reaches every stage by keyword; stage 0 sends the
   activation made in ``a``.
2. Three stages: a value of stage 0 read by stage 2 is relayed through stage 1 (every edge goes
   to the next stage); a weight tied between ``a`` and ``c`` is held by stages 0 and 2, each
   under its own module's fqn, and listed in ``shared``.
3. An input written in place in stage 0 and read after the write in stage 1: stage 1 is sent
   the written value (the in-place result), since each rank holds its own copy of the input;
   a stage that reads the input itself after the write is refused.
"""

from __future__ import annotations

import pytest
from beforeafter import program

from ir import PassError, alpha_equivalent, format_program, verify
from ir.graph import Graph
from transforms import split_stages

BEFORE_RESIDUAL = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %p_b_w: parameter b.w
    %x: user_input
  outputs:
    %add: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
    b.w: parameter <Parameter (2,) torch.float32> requires_grad
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('x',)
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %p_b_w = placeholder
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_a_w)  # stack: a
      %relu = call_function[aten.relu.default](%mul)  # stack: a
      %mul_1 = call_function[aten.mul.Tensor](%relu, %p_b_w)  # stack: b
      %add = call_function[aten.add.Tensor](%mul_1, %x)
      return (%add,)
  module a: A
  module b: B"""

EXPECTED_RESIDUAL = (
    """\
program:
  inputs:
    %x: user_input
  outputs:
    %relu: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, []), tree(dict, [leaf], ['x'])])
      out_spec: tree(tuple, [leaf])
      forward_arg_names: ('x',)
  module <root>: Top [module] id='<root>'
    graph 0:
      %x = placeholder
      %relu = call_module[a](%x)
      return (%relu,)
  module a: A [module] id='a'
    graph 0:
      %x = placeholder
      %p_a_w = get_attr[w]()
      %mul = call_function[aten.mul.Tensor](%x, %p_a_w)
      %relu = call_function[aten.relu.default](%mul)
      return[output_1] %relu""",
    """\
program:
  inputs:
    %relu: user_input
    %x: user_input
  outputs:
    %add: user_output
  state:
    b.w: parameter <Parameter (2,) torch.float32> requires_grad
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [leaf], ['x'])])
      out_spec: leaf
      forward_arg_names: ('relu', 'x')
  module <root>: Top [module] id='<root>'
    graph 0:
      %relu = placeholder
      %x = placeholder
      %mul_1 = call_module[b](%relu)
      %add = call_function[aten.add.Tensor](%mul_1, %x)
      return (%add,)
  module b: B [module] id='b'
    graph 0:
      %relu = placeholder
      %p_b_w = get_attr[w]()
      %mul_1 = call_function[aten.mul.Tensor](%relu, %p_b_w)
      return[output_1] %mul_1""",
)


def test_residual_input_is_a_keyword_of_every_stage():
    before = program(BEFORE_RESIDUAL)
    text = format_program(before, vals=False)
    stages = split_stages(before, ["b"])
    assert format_program(before, vals=False) == text  # pure
    for got, want in zip(stages.programs, EXPECTED_RESIDUAL, strict=True):
        verify(got)
        assert alpha_equivalent(got, program(want, like=before)), format_program(got, vals=False)
    assert stages.inputs == ((), ("relu",))
    assert stages.root_inputs == ("x",)
    assert [(e.name, e.src, e.origin, e.index) for e in stages.edges] == [("relu", 0, 0, 0)]


BEFORE_RELAY_TIED = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %x: user_input
  outputs:
    %mul_2: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
    c.w: parameter <Parameter (2,) torch.float32> = a.w requires_grad
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('x',)
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_a_w)  # stack: a
      %sin = call_function[aten.sin.default](%mul)  # stack: b
      %cos = call_function[aten.cos.default](%sin)  # stack: c
      %mul_1 = call_function[aten.mul.Tensor](%cos, %p_a_w)  # stack: c
      %mul_2 = call_function[aten.mul.Tensor](%mul_1, %mul)
      return (%mul_2,)
  module a: A
  module b: B
  module c: C"""

EXPECTED_RELAY_TIED = (
    """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf])
      forward_arg_names: ('x',)
  module <root>: Top [module] id='<root>'
    graph 0:
      %x = placeholder
      %mul = call_module[a](%x)
      return (%mul,)
  module a: A [module] id='a'
    graph 0:
      %x = placeholder
      %p_a_w = get_attr[w]()
      %mul = call_function[aten.mul.Tensor](%x, %p_a_w)
      return[output_1] %mul""",
    """\
program:
  inputs:
    %mul: user_input
  outputs:
    %mul: user_output
    %sin: user_output
  state:
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf, leaf])
      forward_arg_names: ('mul',)
  module <root>: Top [module] id='<root>'
    graph 0:
      %mul = placeholder
      %sin = call_module[b](%mul)
      return (%mul, %sin)
  module b: B [module] id='b'
    graph 0:
      %mul = placeholder
      %sin = call_function[aten.sin.default](%mul)
      return[output_1] %sin""",
    """\
program:
  inputs:
    %mul: user_input
    %sin: user_input
  outputs:
    %mul_2: user_output
  state:
    c.w: parameter <Parameter (2,) torch.float32> = a.w requires_grad
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('mul', 'sin')
  module <root>: Top [module] id='<root>'
    graph 0:
      %mul = placeholder
      %sin = placeholder
      %mul_1 = call_module[c](%sin)
      %mul_2 = call_function[aten.mul.Tensor](%mul_1, %mul)
      return (%mul_2,)
  module c: C [module] id='c'
    graph 0:
      %sin = placeholder
      %p_c_w = get_attr[w]()
      %cos = call_function[aten.cos.default](%sin)
      %mul_1 = call_function[aten.mul.Tensor](%cos, %p_c_w)
      return[output_1] %mul_1""",
)


def test_relay_through_the_middle_stage_and_a_tied_weight():
    before = program(BEFORE_RELAY_TIED)
    stages = split_stages(before, ["b", "c"])
    for got, want in zip(stages.programs, EXPECTED_RELAY_TIED, strict=True):
        verify(got)
        assert alpha_equivalent(got, program(want, like=before)), format_program(got, vals=False)
    assert [(e.name, e.src, e.origin) for e in stages.edges] == [
        ("mul", 0, 0), ("mul", 1, 0), ("sin", 1, 1)
    ]
    assert stages.state == (("a.w",), (), ("c.w",))
    assert dict(stages.shared) == {"a.w": (0, 2), "c.w": (0, 2)}
    assert stages.owner("a.w", 2) == "c.w" and stages.owner("c.w", 1) is None


BEFORE_INPUT_WRITTEN = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul_1: user_output
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('x',)
  module <root>: Top
    graph 0:
      %x = placeholder
      %add_ = call_function[aten.add_.Tensor](%x, 1.0)  # stack: a
      %mul = call_function[aten.mul.Tensor](%add_, 2.0)  # stack: a
      %mul_1 = call_function[aten.mul.Tensor](%add_, %mul)  # stack: b
      return (%mul_1,)
  module a: A
  module b: B"""

EXPECTED_INPUT_WRITTEN = (
    """\
program:
  inputs:
    %x: user_input
  outputs:
    %x: user_output
    %mul: user_output
  state:
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf, leaf])
      forward_arg_names: ('x',)
  module <root>: Top [module] id='<root>'
    graph 0:
      %x = placeholder
      %mul = call_module[a](%x)
      return (%x, %mul)
  module a: A [module] id='a'
    graph 0:
      %x = placeholder
      %add_ = call_function[aten.add_.Tensor](%x, 1.0)
      %mul = call_function[aten.mul.Tensor](%add_, 2.0)
      return[output_1] %mul""",
    """\
program:
  inputs:
    %add_: user_input
    %mul: user_input
  outputs:
    %mul_1: user_output
  state:
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf, leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('add_', 'mul')
  module <root>: Top [module] id='<root>'
    graph 0:
      %add_ = placeholder
      %mul = placeholder
      %mul_1 = call_module[b](%add_, %mul)
      return (%mul_1,)
  module b: B [module] id='b'
    graph 0:
      %add_ = placeholder
      %mul = placeholder
      %mul_1 = call_function[aten.mul.Tensor](%add_, %mul)
      return[output_1] %mul_1""",
)


def test_an_input_written_in_place_is_sent_as_its_written_value():
    before = program(BEFORE_INPUT_WRITTEN)
    stages = split_stages(before, ["b"])
    for got, want in zip(stages.programs, EXPECTED_INPUT_WRITTEN, strict=True):
        verify(got)
        assert alpha_equivalent(got, program(want, like=before)), format_program(got, vals=False)
    assert stages.inputs == (("x",), ("add_", "mul")) and stages.root_inputs == ()


def test_a_later_stage_reading_the_input_itself_after_its_write_is_refused():
    before = program(BEFORE_INPUT_WRITTEN.replace(
        "aten.mul.Tensor](%add_, %mul)", "aten.mul.Tensor](%x, %mul)"
    ))
    with pytest.raises(PassError, match=r"input 'x' is written in place in stage 0 and read "
                       r"in later stage\(s\) \[1\]"):
        split_stages(before, ["b"])


def test_a_non_tensor_value_crossing_a_boundary_is_refused():
    before = program(BEFORE_INPUT_WRITTEN.replace("aten.add_.Tensor](%x, 1.0)",
                                                  "aten.add.Tensor](%x, 1.0)"))
    graph = before.root_module.graph
    nodes = tuple(n.with_meta(val=0.5) if n.name == "mul" else n for n in graph.nodes)
    root = before.root_module.replace(graphs=(Graph(nodes),))
    scalar = before.replace(modules=before.modules.set(before.root, root))
    with pytest.raises(PassError, match=r"value %mul \(float\) is made in stage 0 and read in "
                       r"stage 1; a pipeline stage passes tensors only"):
        split_stages(scalar, ["b"])
    split_stages(before, ["b"])  # the same program with a tensor there splits


# --- writes as ir.effects sees them: views, alias-like operators, higher-order ops --------------

HOP_WRITES_STATE = """\
program:
  inputs:
    %b_n: buffer n persistent=True
    %x: user_input
  outputs:
    %mul_1: user_output
  state:
    n: buffer <Tensor (2,) torch.float32>
  preserved calls:
    '':
      inputs: ()
      outputs: ()
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: leaf
      forward_arg_names: ('x',)
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %body = get_attr[submod_1]()
      %hop = call_function[torch.ops.higher_order.wrap_with_set_grad_enabled](False, %body, %b_n)  # stack: a
      %getitem = call_function[_operator.getitem](%hop, 0)  # stack: a
      %mul = call_function[aten.mul.Tensor](%x, %getitem)  # stack: a
      %mul_1 = call_function[aten.mul.Tensor](%mul, %b_n)  # stack: b
      return (%mul_1,)
  module a: A
  module b: B
  module submod_1: ? [subgraph]
    graph 0:
      %p = placeholder
      %add_ = call_function[aten.add_.Tensor](%p, 1)
      return (%add_,)"""

CROSS_STAGE = r"buffer 'n' is written in stage\(s\) \[0\] and read or written in stage\(s\) \[0, 1\]"


def test_a_higher_order_op_whose_body_writes_state_is_a_write_of_that_state():
    """Stage 0 calls a body that writes buffer ``n`` in place; stage 1 reads ``n``. Each stage
    would hold its own copy of ``n`` and stage 1's would miss the write: refused (the write is
    ``ir.effects``' ``Effects.writes`` of the higher-order op; a split that looked at schema
    writes only accepted it)."""
    with pytest.raises(PassError, match=CROSS_STAGE):
        split_stages(program(HOP_WRITES_STATE), ["b"])


def test_a_higher_order_op_with_a_pure_body_reading_state_splits():
    before = program(HOP_WRITES_STATE.replace("aten.add_.Tensor", "aten.add.Tensor"))
    stages = split_stages(before, ["b"])
    for got in stages.programs:
        verify(got)
    assert len(stages.programs) == 2


def test_a_write_of_a_higher_order_op_result_writes_its_operands():
    """The body is pure, but a higher-order op's results may share memory with its operands
    (``ir.effects.aliased_args``: purefx does not look into what the body returns), so writing
    one in place is taken as a write of ``n``: refused, conservatively (never a divergent
    copy)."""
    text = HOP_WRITES_STATE.replace("aten.add_.Tensor", "aten.add.Tensor").replace(
        "%mul = call_function[aten.mul.Tensor](%x, %getitem)  # stack: a",
        "%w = call_function[aten.add_.Tensor](%getitem, 1)  # stack: a\n"
        "      %mul = call_function[aten.mul.Tensor](%x, %w)  # stack: a",
    )
    with pytest.raises(PassError, match=CROSS_STAGE):
        split_stages(program(text), ["b"])


def test_a_write_through_an_alias_like_reshape_of_state_is_a_write():
    """``reshape`` may return its input (``ir.ops.is_alias_like``): writing its result may
    write buffer ``n``, which stage 1 reads."""
    text = HOP_WRITES_STATE.replace(
        """      %body = get_attr[submod_1]()
      %hop = call_function[torch.ops.higher_order.wrap_with_set_grad_enabled](False, %body, %b_n)  # stack: a
      %getitem = call_function[_operator.getitem](%hop, 0)  # stack: a
""",
        """      %getitem = call_function[aten.reshape.default](%b_n, [2])  # stack: a
      %w = call_function[aten.mul_.Tensor](%getitem, 2)  # stack: a
""",
    )
    with pytest.raises(PassError, match=CROSS_STAGE):
        split_stages(program(text), ["b"])


def test_a_write_through_a_view_of_an_input_read_later_is_refused():
    before = program(BEFORE_INPUT_WRITTEN.replace(
        "%add_ = call_function[aten.add_.Tensor](%x, 1.0)  # stack: a",
        "%v = call_function[aten.view.default](%x, [-1])  # stack: a\n"
        "      %add_ = call_function[aten.add_.Tensor](%v, 1.0)  # stack: a",
    ).replace("aten.mul.Tensor](%add_, %mul)", "aten.mul.Tensor](%x, %mul)"))
    with pytest.raises(PassError, match=r"input 'x' is written in place in stage 0 and read "
                       r"in later stage\(s\) \[1\]"):
        split_stages(before, ["b"])
