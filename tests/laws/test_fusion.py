"""Fused passes equal the passes they replace.

``transform`` runs the longest run of adjacent passes that has a fused form:
``prepare_outline_and_sink`` for the preserved-call stages, ``outline`` and ``sink_state``;
``outline_and_sink`` for the pair ``outline, sink_state`` alone. The laws: each fused form equals
its passes run one by one on every program the pipeline can meet, with the same node metadata,
and the same error where the passes raise. Checked on generated programs (both the one-pass path
and the fallback for shared modules) and on zoo cases.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from lawcases import before, examples
from zoo import CASES, export_case

from ir import import_ep
from ir.errors import PurefxError
from ir.program import Program
from transforms.passes.module_stacks import fill_call_gaps
from transforms.passes.outline import outline, outline_and_sink
from transforms.passes.state_sinking import sink_state
from transforms.pipeline import DEFAULT_PIPELINE, _fuse, pipeline

# the module of the pass ``outline`` (``transforms.outline`` is the function)
outline_module = importlib.import_module("transforms.passes.outline")


def graph_metas(p: Program) -> list[tuple[str, dict]]:
    return [
        (n.name, dict(n.meta))
        for _, mod in sorted(p.modules.items())
        for g in mod.graphs
        for n in g.nodes
    ]


def assert_runs_alike(fused, passes, p: Program) -> None:
    """``fused(p)`` equals ``passes`` run one by one on ``p``, node metadata included, or both
    raise the same ``PurefxError`` class."""

    def one_by_one(q: Program) -> Program:
        for f in passes:
            q = f(q)
        return q

    try:
        want = one_by_one(p)
    except PurefxError as exc:
        with pytest.raises(type(exc)):
            fused(p)
        return
    got = fused(p)
    assert got == want
    assert graph_metas(got) == graph_metas(want)


def assert_fused_law(p: Program) -> None:
    assert_runs_alike(outline_and_sink, (outline, sink_state), p)


@settings(max_examples=examples(120))
@given(before(outline))
def test_outline_and_sink_is_sink_after_outline(p):
    assert_fused_law(p)


@settings(max_examples=examples(40))
@given(before(outline, features={"shared_modules", "tied_parameters", "nesting", "buffers"}))
def test_fused_law_with_shared_modules(p):
    assert_fused_law(p)


def test_fused_law_on_an_outlined_program():
    p = _flat(export_case(CASES["mlp_nested"]))
    once = sink_state(outline(p))
    assert outline_and_sink(outline(p)) == once
    assert outline_and_sink(once) == once


def _flat(ep) -> Program:
    p = import_ep(ep)
    for f in DEFAULT_PIPELINE[: DEFAULT_PIPELINE.index(outline)]:
        p = f(p)
    return p


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_law_on_zoo(name):
    assert_fused_law(_flat(export_case(CASES[name])))


@pytest.mark.parametrize("name, one_pass", [("mlp_nested", True), ("shared_two_parents", False)])
def test_zoo_covers_both_fused_paths(name, one_pass, monkeypatch):
    """A shared module makes ``outline_and_sink`` fall back to running ``sink_state``."""
    p = _flat(export_case(CASES[name]))
    calls = []
    monkeypatch.setattr(outline_module, "sink_state", lambda q: calls.append(q) or sink_state(q))
    assert outline_and_sink(p) == sink_state(outline(p))
    assert len(calls) == (0 if one_pass else 1)


@pytest.mark.parametrize("keep_functional", [False, True])
def test_transform_fuses_the_longest_run_and_nothing_else(keep_functional):
    from transforms.passes.outline import prepare_outline_and_sink
    from transforms.preserved import PRESERVED_STAGES

    passes = pipeline(keep_functional=keep_functional)
    i = passes.index(PRESERVED_STAGES[0])
    j = passes.index(sink_state)
    assert _fuse(passes) == [*passes[:i], prepare_outline_and_sink, *passes[j + 1 :]]
    # without the stages in front, only the pair is fused
    assert _fuse(passes[j - 1 :]) == [outline_and_sink, *passes[j + 1 :]]
    assert _fuse([sink_state, outline]) == [sink_state, outline]
    assert _fuse([outline]) == [outline]
    assert _fuse(PRESERVED_STAGES) == list(PRESERVED_STAGES)


class _ReadsChildState(torch.nn.Module):
    """Reads its child's weight itself, after the child ran and after reading its own state:
    the read order of the sunk state must be the one ``sink_state`` gives."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.full((4,), 2.0))
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x) * self.scale
        return self.b(h) + self.a.weight.sum()


class _Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _ReadsChildState()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.inner.scale


def test_fused_law_when_a_parent_reads_its_childs_state():
    ep = torch.export.export(_Outer(), (torch.randn(2, 4),), strict=False)
    p = _flat(ep)
    assert_fused_law(p)
    inner = outline_and_sink(p).modules["inner"].graphs[0]
    reads = [n.target for n in inner.nodes if n.op == "get_attr"]
    assert reads == ["a.weight", "scale"]


def assert_prepared_fusion_law(p: Program) -> None:
    """``transform``'s longest fused run (the preserved-call stages, ``outline``,
    ``sink_state``) equals the six passes run one by one, errors included."""
    from transforms.passes.outline import prepare_outline_and_sink
    from transforms.preserved import PRESERVED_STAGES

    assert_runs_alike(prepare_outline_and_sink, (*PRESERVED_STAGES, outline, sink_state), p)


def _before_stages(ep) -> Program:
    from transforms.preserved import PRESERVED_STAGES

    p = import_ep(ep)
    for f in DEFAULT_PIPELINE[: DEFAULT_PIPELINE.index(PRESERVED_STAGES[0])]:
        p = f(p)
    return p


@settings(max_examples=examples(60))
@given(before(fill_call_gaps))
def test_prepared_fusion_is_the_six_passes_on_generated_programs(p):
    assert_prepared_fusion_law(p)


@pytest.mark.parametrize("name", sorted(CASES)[::4])
def test_prepared_fusion_is_the_six_passes_on_zoo(name):
    assert_prepared_fusion_law(_before_stages(export_case(CASES[name])))


def test_the_default_pipeline_runs_the_prepared_fusion():
    from transforms.passes.outline import prepare_outline_and_sink

    assert prepare_outline_and_sink in _fuse(DEFAULT_PIPELINE)
