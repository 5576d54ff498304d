"""Before/Expected examples for ``functional_to_inplace``: a ``buffer_mutation`` or
``user_input_mutation`` output ``v`` becomes ``copy_(target, v)`` right after ``v`` (later when a
node still reads the target's old value), later reads of ``v`` read the copy, and the mutation
outputs and their specs are dropped."""

from __future__ import annotations

from beforeafter import program

from ir import verify
from transforms import functional_to_inplace


def check(before_text: str, expected_text: str) -> None:
    before = program(before_text)
    after = functional_to_inplace(before)
    verify(after)
    assert after == program(expected_text, like=before)  # no node is renamed: exact equality


def test_a_buffer_update_waits_for_the_last_read_of_the_old_value():
    check(
        """\
program:
  inputs:
    %b_n: buffer n persistent=True
    %x: user_input
  outputs:
    %add: buffer_mutation n
    %mul: user_output
  state:
    n: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %add = call_function[aten.add.Tensor](%b_n, %x)
      %neg = call_function[aten.neg.default](%b_n)
      %mul = call_function[aten.mul.Tensor](%add, %neg)
      %sin = call_function[aten.sin.default](%x)
      return (%add, %mul)""",
        """\
program:
  inputs:
    %b_n: buffer n persistent=True
    %x: user_input
  outputs:
    %mul: user_output
  state:
    n: buffer <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %b_n = placeholder
      %x = placeholder
      %add = call_function[aten.add.Tensor](%b_n, %x)
      %neg = call_function[aten.neg.default](%b_n)
      %copy_ = call_function[aten.copy_.default](%b_n, %add)
      %mul = call_function[aten.mul.Tensor](%copy_, %neg)
      %sin = call_function[aten.sin.default](%x)
      return (%mul,)""",
    )


def test_a_user_input_update_and_a_user_output_of_the_new_value_read_the_copy():
    check(
        """\
program:
  inputs:
    %x: user_input
  outputs:
    %add: user_input_mutation x
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %add = call_function[aten.add.Tensor](%x, 1)
      return (%add, %add)""",
        """\
program:
  inputs:
    %x: user_input
  outputs:
    %copy_: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %add = call_function[aten.add.Tensor](%x, 1)
      %copy_ = call_function[aten.copy_.default](%x, %add)
      return (%copy_,)""",
    )


def test_a_program_without_mutation_outputs_is_returned_as_it_is():
    p = program(
        "program:\n  inputs:\n    %x: user_input\n  outputs:\n    %x: user_output\n"
        "  module <root>: Top\n    graph 0:\n      %x = placeholder\n      return (%x,)"
    )
    assert functional_to_inplace(p) is p
