"""Planted bugs that only the metadata or the aliasing of a result shows, caught by
``check_laws`` with its defaults.

- **verify with vals**: a pass that changes what a node computes (its shape) and leaves the
  node's ``val`` as it was: the ``verify`` law runs ``ir.verify(result, vals=True)`` and names
  the node;
- **aliasing**: a pass that makes an output a view of an input, or of another output, where it
  was a fresh tensor: equal values, but a caller who writes the output now writes the input
  (or the other output). The ``semantics`` law observes aliasing (``ir.harness.observe``) and
  refuses an alias the input program's outputs did not have.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st

from ir import import_ep
from ir.graph import Graph
from ir.program import Program
from lowering.pass_laws import LawViolation, check_laws, check_verify

aten = torch.ops.aten

NO_SHRINK = settings(settings.default, phases=[Phase.explicit, Phase.reuse, Phase.generate])


def _root_nodes(p: Program, nodes) -> Program:
    graph = Graph(tuple(nodes))
    return p.replace(modules=p.modules.set(p.root, p.root_module.replace(graphs=(graph,))))


def mean_flips_keepdim(p: Program) -> Program:
    """Bug: flips ``keepdim`` of every ``mean.dim`` (its rank changes) and keeps its ``val``."""
    nodes = []
    for n in p.root_module.graph.nodes:
        if n.op == "call_function" and n.target is aten.mean.dim:
            x, dims, *rest = n.args
            keep = bool(rest[0]) if rest else bool(n.kwargs.get("keepdim", False))
            n = n.replace(args=(x, dims, not keep), kwargs={})
        nodes.append(n)
    return _root_nodes(p, nodes)


def clone_becomes_alias(p: Program) -> Program:
    """Bug: ``clone(x)`` is computed as ``alias(x)``: the same values, but a view of ``x``."""
    nodes = [n.replace(target=aten.alias.default)
             if n.op == "call_function" and n.target is aten.clone.default and not n.kwargs
             else n
             for n in p.root_module.graph.nodes]
    return _root_nodes(p, nodes)


def test_a_stale_val_is_caught_by_the_verify_law_naming_the_node():
    with pytest.raises(LawViolation) as caught:
        check_laws(mean_flips_keepdim, max_examples=100, settings=NO_SHRINK)
    line = str(caught.value).splitlines()[0]
    assert caught.value.law == "verify", line
    assert re.match(r"law 'verify' broken by mean_flips_keepdim: the result does not verify: "
                    r"node '\w+' in module '<root>' has val .*but its inputs' vals give", line), line


class _Mean(torch.nn.Module):
    def forward(self, x):
        return x.mean(1) + 1


def test_verify_law_on_one_program_names_the_stale_node():
    p = import_ep(torch.export.export(_Mean(), (torch.randn(2, 3),)))
    with pytest.raises(LawViolation, match=r"node 'mean\w*' in module '<root>' has val "):
        check_verify(mean_flips_keepdim, p)


def test_a_stale_val_the_input_already_had_is_not_the_pass_s_fault():
    p = import_ep(torch.export.export(_Mean(), (torch.randn(2, 3),)))
    stale = mean_flips_keepdim(p)
    assert check_verify(lambda q: q, stale) is stale


class _CloneOfInput(torch.nn.Module):
    def forward(self, x):
        return x.clone(), x + 1


class _CloneOfOutput(torch.nn.Module):
    def forward(self, x):
        h = x * 2
        return h, h.clone()


@pytest.mark.parametrize("module, alias", [
    (_CloneOfInput(), "input 0"),
    (_CloneOfOutput(), "output 0"),
], ids=["input", "output"])
def test_an_output_made_a_view_where_it_was_fresh_is_caught(module, alias):
    p = import_ep(torch.export.export(module, (torch.randn(2, 3),)))
    with pytest.raises(LawViolation) as caught:
        check_laws(clone_becomes_alias, programs=st.just(p), max_examples=1)
    line = str(caught.value).splitlines()[0]
    assert caught.value.law == "semantics", line
    assert re.match(rf"law 'semantics' broken by clone_becomes_alias: call 1: outputs \[\d\]: "
                    rf"an alias of {alias}, the input program's output is fresh", line), line


def test_an_alias_made_on_generated_programs_is_caught():
    with pytest.raises(LawViolation) as caught:
        check_laws(clone_becomes_alias, max_examples=100, settings=NO_SHRINK)
    assert caught.value.law == "semantics", str(caught.value).splitlines()[0]


def test_a_real_tensor_val_is_not_re_derived():
    """A pass that records a real tensor as a node's val (a constant it made) is not blamed:
    ``verify(vals=True)`` skips the nodes reading it, as those reading a node without a val."""
    from types import MappingProxyType

    from ir import verify
    from ir.errors import VerifyError

    p = import_ep(torch.export.export(_Mean(), (torch.randn(2, 3),)))
    nodes = [n.replace(meta=MappingProxyType({**n.meta, "val": torch.zeros(2, 3)}))
             if n.op == "placeholder" else n for n in p.root_module.graph.nodes]
    real = _root_nodes(p, nodes)
    assert verify(real, vals=True) is real
    stale = mean_flips_keepdim(p)  # the fake vals are still checked
    with pytest.raises(VerifyError, match=r"node 'mean\w*' in module '<root>' has val"):
        verify(stale, vals=True)
