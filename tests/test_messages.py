"""Quoted messages are shortened between words (``ir.errors.shorten``, ``first_line``), never
inside one, and the editor's advice on an operator without a kernel for the vals points at the
vals, not at the arguments."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ir import PassError, parse_program
from ir.errors import ELLIPSIS, first_line, shorten
from transforms.edit import rewrite_nodes

TORCH_MESSAGE = (
    "aten::fake_quantize_per_tensor_affine_cachemask: attempted to run this operator with Meta "
    "tensors, but there was no fake impl or Meta kernel registered. You may have run into this "
    "message while using an operator with PT2 compilation APIs (torch.compile/torch.export); in "
    "order to use this operator with those APIs you'll need to add a fake impl."
)


def test_the_message_of_the_issue_is_cut_between_words():
    cut = first_line(NotImplementedError(TORCH_MESSAGE))
    assert cut.endswith(" ...") and len(cut) <= 300
    kept = cut.removesuffix(ELLIPSIS)
    assert TORCH_MESSAGE.startswith(kept) and TORCH_MESSAGE[len(kept)] == " "
    assert kept.endswith("in order to use this")  # was cut at "...to use this operator wi"


@given(st.text(alphabet="ab .", max_size=60), st.integers(0, 40))
def test_shorten_keeps_whole_words(text, limit):
    cut = shorten(text, limit)
    if len(text) <= limit:
        assert cut == text
        return
    assert len(cut) <= limit
    kept = cut.removesuffix(ELLIPSIS)
    assert text.startswith(kept)
    space = text.rfind(" ", 0, limit - len(ELLIPSIS) + 1)
    if limit > len(ELLIPSIS) and space > 0 and text[:space].strip():
        assert cut.endswith(ELLIPSIS) and text[len(kept)] == " "  # the last word kept is whole


META_PROGRAM = """\
program:
  inputs:
    %x: user_input
  outputs:
    %r: user_output
  module <root>: ?
    graph 0:
      %x = placeholder  # float32[2, 3](device='meta')
      %r = call_function[aten.relu.default](%x)  # float32[2, 3](device='meta')
      return (%r,)"""


def test_an_operator_without_a_meta_kernel_is_blamed_on_the_vals_not_the_arguments():
    p = parse_program(META_PROGRAM)
    fq = torch.ops.aten.fake_quantize_per_tensor_affine.default

    def quantize(node, e):
        if node.name == "r":
            return e.call(fq, node.ref, 0.1, 0, -128, 127)
        return None

    with pytest.raises(PassError) as caught:
        rewrite_nodes(p, quantize)
    text = str(caught.value)
    assert "no kernel for the program's vals, which are meta tensors" in text
    assert "shapes and dtypes" not in text and "FakeTensor vals" in text
