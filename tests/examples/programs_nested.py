"""Before programs shared by the outline / sink / dedup / inline examples (flat, as
``import_ep`` gives them, with module stacks as ``# stack:`` comments)."""

NESTED = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %x: user_input
  outputs:
    %add: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: a, a.b
      %mul = call_function[aten.mul.Tensor](%relu, %p_a_w)  # stack: a
      %neg = call_function[aten.neg.default](%mul)  # stack: a, a.b@1
      %add = call_function[aten.add.Tensor](%neg, %x)
      return (%add,)
  module a: A
  module a.b: B"""

# a.b called twice with the same body: two graphs that deduplicate merges
TWICE_SAME = """\
program:
  inputs:
    %x: user_input
  outputs:
    %relu_1: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %relu = call_function[aten.relu.default](%x)  # stack: b
      %relu_1 = call_function[aten.relu.default](%relu)  # stack: b@1
      return (%relu_1,)
  module b: B"""

# a and b are one module object (all their state tied, one class): torch.export shows two paths
SHARED = """\
program:
  inputs:
    %p_a_w: parameter a.w
    %p_b_w: parameter b.w
    %p_a_v: parameter a.v
    %p_b_v: parameter b.v
    %x: user_input
  outputs:
    %mul_1: user_output
  state:
    a.w: parameter <Parameter (2,) torch.float32> requires_grad
    b.w: parameter <Parameter (2,) torch.float32> = a.w requires_grad
    a.v: parameter <Parameter (2,) torch.float32>
    b.v: parameter <Parameter (2,) torch.float32> = a.v
  module <root>: Top
    graph 0:
      %p_a_w = placeholder
      %p_b_w = placeholder
      %p_a_v = placeholder
      %p_b_v = placeholder
      %x = placeholder
      %mul = call_function[aten.mul.Tensor](%x, %p_a_w)  # stack: a
      %mul_1 = call_function[aten.mul.Tensor](%mul, %p_b_w)  # stack: b
      return (%mul_1,)
  module a: Scale
  module b: Scale"""
