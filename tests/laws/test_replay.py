"""A ``LawViolation`` can be replayed: its ``example`` holds the program, the inputs and the
state (fqn -> tensor); its message shows the state values that matter, shortened; the program
printed with its vals parses back into one that ``check_program`` accepts and ``lower`` runs,
which, given the example's state and inputs, shows the same difference again."""

from __future__ import annotations

import pytest
import torch

from ir import format_program, import_ep, parse_program
from ir.harness import same_bits
from lowering import lower
from lowering.pass_laws import LawViolation, check_program, check_semantics
from transforms.edit import rewrite_nodes
from transforms.machinery.law_violation import Example, format_value, state_read_by

MUL = torch.ops.aten.mul.Tensor


class Scaled(torch.nn.Module):
    def __init__(self, extra: int = 0) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((3,), 2.0))
        for i in range(extra):
            self.register_buffer(f"b{i}", torch.full((3,), float(i)))
        self.extra = extra

    def forward(self, x):
        shifted = x
        for i in range(self.extra):
            shifted = shifted + getattr(self, f"b{i}")
        return shifted, x * self.scale


def _program(extra: int = 0):
    return import_ep(torch.export.export(Scaled(extra), (torch.randn(3),)))


def drop_mul(p):
    """A planted bug: x * scale -> x, right only where scale is all ones."""
    return rewrite_nodes(p, lambda node, e: e.args[0] if node.target is MUL else None)


def test_the_violation_carries_program_inputs_and_state():
    p = _program()
    with pytest.raises(LawViolation) as caught:
        check_semantics(drop_mul, p)
    example = caught.value.example
    assert isinstance(example, Example) and example.program is p
    assert len(example.args) == 1 and example.args[0].shape == (3,)
    assert same_bits(example.state["scale"], torch.full((3,), 2.0))
    assert caught.value.output == 1  # the second output differs
    text = str(caught.value)
    assert "state:\n  scale = float32[3] [2.0, 2.0, 2.0]" in text
    assert "inputs: float32[3] [" in text


def test_only_the_state_the_differing_output_reads_is_shown_when_there_is_much():
    p = _program(extra=5)
    with pytest.raises(LawViolation) as caught:
        check_semantics(drop_mul, p)
    text = str(caught.value)
    assert "state the differing output reads (1 of 6):\n  scale = " in text
    assert "\n  b0 = " not in text
    assert state_read_by(p, 0) == {f"b{i}" for i in range(5)}
    assert state_read_by(p, None) is None and state_read_by(p, 7) is None


def test_the_printed_counterexample_replays():
    p = _program()
    with pytest.raises(LawViolation) as caught:
        check_program(drop_mul, p)
    example = caught.value.example
    text = format_program(example.program)  # vals included by default
    assert text in str(caught.value)  # the message prints the program with its vals
    assert "%x = placeholder  # float32[3]" in text
    back = parse_program(text)
    assert check_program(lambda q: q, back) is back  # was: "placeholder 'x' has meta['val'] None"
    replay = lower(back)
    replay.load_state_dict(dict(example.state), strict=False)
    want = lower(p)(*example.args)
    got = replay(*example.args)
    assert all(same_bits(g, w) for g, w in zip(got, want))
    with pytest.raises(LawViolation, match="law 'semantics'"):
        check_program(drop_mul, back.replace(tensors=p.tensors))


def test_values_are_shortened_between_words():
    big = torch.arange(1000, dtype=torch.float32)
    assert format_value(big).startswith("float32[1000] [0.0, 1.0,")
    assert format_value(big).endswith(", 15.0, ...]")  # the first 16 elements
    shown = format_value(big * 1e-7)  # long reprs: cut between numbers, never inside one
    assert shown.endswith(" ...") and len(shown) <= 120
    assert shown.removesuffix(" ...").endswith(",")
    assert format_value(torch.empty(2, device="meta")) == "float32[2] on meta"


def test_much_state_and_no_differing_output_prints_a_count():
    p = _program(extra=5)
    text = str(LawViolation("purity", drop_mul, "a detail", p))
    assert "state: 6 tensors (e.example.state)" in text and "\n  scale = " not in text
