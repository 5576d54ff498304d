"""The preserved-call stages as listed passes (``transforms.preserved``): in the pipeline and
the pass table, runnable alone (API and command line), each refusing an outlined program with a
``PassError`` that names what to run first; ``outline`` on a raw import runs them itself; the
state-traffic analysis is one memo; ``Program.is_flat`` / ``is_outlined`` is one fact."""

from __future__ import annotations

import re

import pytest
from test_ivals import CASES as IVAL_CASES
from zoo import CASES, export_case

from ir import import_ep
from ir.errors import PassError
from ir.program import Program
from lowering import cli
from transforms.passes.inlining import inline, inline_with_calls
from transforms.passes.outline import outline
from transforms.pipeline import DEFAULT_PIPELINE, named_passes, transform
from transforms.preserved import PRESERVED_STAGES, prepare_outline
from transforms.preserved.state_traffic import (
    mutation_sources,
    state_traffic,
    update_chains,
    written_back_values,
)

STAGES = [s.__name__ for s in PRESERVED_STAGES]
PRESERVED = "twice[decomp]"  # a preserved module that updates a buffer, decomposed


def raw(name: str = PRESERVED) -> Program:
    return import_ep(export_case(IVAL_CASES[name]))


def test_stages_are_listed_in_order_right_before_outline() -> None:
    names = [p.__name__ for p in DEFAULT_PIPELINE]
    at = names.index("outline")
    assert names[at - len(STAGES) : at] == STAGES
    table = named_passes()
    for name in STAGES:
        assert table[name].__name__ == name


@pytest.mark.parametrize("name", STAGES)
def test_a_stage_refuses_an_outlined_program(name: str) -> None:
    outlined = transform(raw())
    assert outlined.is_outlined and not outlined.is_flat
    with pytest.raises(PassError, match=rf"{name} runs on a flat program .*run inline first"):
        transform(outlined, [name])


def test_a_stage_runs_alone_on_a_flat_program() -> None:
    p = raw()
    assert p.is_flat and not p.is_outlined
    for name in STAGES:
        p = transform(p, [name], check=True)
        assert p.is_flat


def test_the_default_pipeline_on_an_outlined_program_starts_at_outline() -> None:
    once = transform(raw())
    assert transform(once) == once


def test_outline_on_a_raw_import_runs_the_stages_it_needs() -> None:
    p = raw()
    prepared = prepare_outline(p)
    assert prepared != p  # the stages had work to do (an ival is written back)
    assert outline(p) == outline(prepared)
    assert prepare_outline(prepared) is prepared  # a prepared program: the stages only check


def test_fusion_law_with_the_listed_stages() -> None:
    names = [p.__name__ for p in DEFAULT_PIPELINE]
    assert names[names.index("outline") + 1] == "sink_state"  # the fused pair stays adjacent
    p = transform(raw(), list(DEFAULT_PIPELINE[: names.index("outline")]))
    assert transform(p, ["outline", "sink_state"]) == transform(
        transform(p, ["outline"]), ["sink_state"]
    )


def test_state_traffic_is_one_memo_of_its_program() -> None:
    p = transform(raw(), list(DEFAULT_PIPELINE[: DEFAULT_PIPELINE.index(outline)]))
    traffic = state_traffic(p)
    assert state_traffic(p) is traffic
    graph = p.root_module.graph
    aliases, sources = mutation_sources(graph, p)
    written_back = written_back_values(p.signature)
    assert (traffic.aliases, traffic.sources) == (aliases, sources)
    assert traffic.chains == update_chains(graph, aliases, written_back)
    assert traffic.aliases  # the case writes a buffer in place: something to describe


def test_cli_runs_each_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--passes", ",".join(STAGES + ["outline"])]) == 0
    out = capsys.readouterr().out
    ran = re.findall(r"^  (\w+) +\d+\.\d\d", out, re.MULTILINE)
    assert ran == ["import_ep", *STAGES, "outline", "lower"]


@pytest.mark.parametrize("name", ["mlp_nested", "shared_two_parents"])
def test_inline_with_calls_is_inline_and_names_each_nodes_calls(name: str) -> None:
    p = transform(import_ep(export_case(CASES[name])))
    flat, chains = inline_with_calls(p)
    assert flat == inline(p)
    nodes = flat.root_module.graph.nodes
    assert len(chains) == len(nodes)
    assert any(chains)  # some node ran inside a call
    for node, chain in zip(nodes, chains):
        if node.op in ("placeholder", "output"):
            assert chain == ()
        for path, mid, number in chain:
            assert p.resolve(path) == mid and number >= 0
    again, none = inline_with_calls(flat)
    assert again is flat and none == [()] * len(nodes)


def test_one_not_a_program_check_with_one_error_class() -> None:
    from ir.errors import LoweringError, NotAProgramError
    from lowering import lower

    for run in (transform, lower, named_passes()["rematerialize"]):
        with pytest.raises(NotAProgramError, match=r"got None; make one with ir\.import_ep") as e:
            run(None)
        assert isinstance(e.value, PassError) and isinstance(e.value, LoweringError)
