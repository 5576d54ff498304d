"""Laws of the import/lower round trip and of the default pipeline, on generated exports.

For hypothesis-generated module hierarchies exported with torch.export (strict or not,
decomposed or not, with preserved signatures): ``lower(import_ep(ep))`` and
``lower(transform(import_ep(ep)))`` compute what ``ep.module()`` computes, buffers after two calls
included; ``import_ep`` never writes ``ep``; every result verifies; import is deterministic.
"""

from __future__ import annotations

import contextlib
import copy
import io

import torch
from hypothesis import given, settings
from zoo import ep_fingerprint

from ir import format_program, import_ep, verify
from ir.strategies.module_trees import example_inputs, exported_programs
from lowering import lower
from transforms import transform

EXAMPLES = settings(max_examples=25)


def _run(module, spec, calls=2):
    outs = []
    for _ in range(calls):
        args, kwargs = example_inputs(spec)
        outs.append(module(*args, **kwargs))
    return outs, {k: v.detach().clone() for k, v in module.named_buffers()}


def _same(program_module, reference, spec):
    got, got_buffers = _run(program_module, spec)
    want, want_buffers = _run(reference, spec)
    torch.testing.assert_close(got, want)
    shared = {k: v for k, v in got_buffers.items() if k in want_buffers}
    torch.testing.assert_close(shared, {k: want_buffers[k] for k in shared})


@EXAMPLES
@given(exported_programs(max_depth=2, max_ops=5))
def test_round_trip_and_pipeline_match_ep_module(drawn):
    spec, ep = drawn
    before = ep_fingerprint(ep)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        program = verify(import_ep(ep))
        flat = lower(program)
        outlined = verify(transform(program))
        tree = lower(outlined)
    assert out.getvalue() == ""
    assert ep_fingerprint(ep) == before
    _same(flat, copy.deepcopy(ep).module(), spec)
    _same(tree, copy.deepcopy(ep).module(), spec)


@EXAMPLES
@given(exported_programs(max_depth=2, max_ops=4))
def test_import_and_pipeline_are_deterministic(drawn):
    _, ep = drawn
    a, b = import_ep(ep), import_ep(ep)
    assert a == b
    assert format_program(transform(a), vals=False) == format_program(transform(b), vals=False)
