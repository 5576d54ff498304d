"""fx metadata on the lowered graphs: ``val`` on every node (``call_module`` outputs, placeholders,
outputs included), ``tensor_meta`` where torch's unflatten has it, the program's
``nn_module_stack``/``stack_trace`` carried; torch's ``ShapeProp`` and ``FakeTensorProp`` run on
every graph and agree with the meta we wrote."""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.fx.passes.shape_prop import ShapeProp
from zoo import CASES, export_case

from ir import import_ep
from ir.args import ref
from ir.tree_calls import flatten_by_spec
from lowering import lower
from lowering.inputs import flatten_inputs
from lowering.modules import LoweredModule
from transforms import transform

META_CASES = (
    "mlp_nested", "kwargs", "nested_inputs", "pytree_outputs", "repeated_diff_shapes",
    "buffer_mutation", "tied_weights", "preserve_nested", "preserve_twice", "dynamic_batch",
    "lstm", "mlp_nested[decomp]", "preserve_kwargs", "preserve_dynamic", "preserve_constant",
    "autocast_body[decomp]",
)


def _graphs(m: torch.nn.Module):
    """``(path, module, fx graph)`` for the root and every graph-running submodule variant."""
    yield "", m, m.graph
    seen = set()
    for path, mod in m.named_modules():
        if isinstance(mod, LoweredModule) and id(mod) not in seen:
            seen.add(id(mod))
            for g in mod.graphs:
                yield path, mod, g


def _is_subgraph_or_token(node: torch.fx.Node) -> bool:
    return (node.op == "get_attr" and "graph" in node.name) or (
        node.op == "call_function" and "token" in str(node.target)
    )


def _shapes(val: Any) -> Any:
    """Shapes as text: comparing a SymInt with an int would add a guard to the program's
    ShapeEnv (specializing its symbol for every later user of the cached export)."""
    return pytree.tree_map(
        lambda v: tuple(str(d) for d in v.shape) if isinstance(v, torch.Tensor) else str(v), val
    )


@pytest.mark.parametrize("name", META_CASES)
def test_every_node_has_val_and_torch_meta(name: str) -> None:
    ep = export_case(CASES[name])
    m = lower(transform(import_ep(ep)))
    program_stacks = {n.name for n in ep.graph.nodes if "nn_module_stack" in n.meta}
    for path, _, g in _graphs(m):
        for node in g.nodes:
            if _is_subgraph_or_token(node):
                continue
            assert "val" in node.meta, f"{path or '<root>'}: {node.op} {node.name} has no val"
            val = node.meta["val"]
            if node.op in ("placeholder", "get_attr") and isinstance(val, torch.Tensor):
                assert str(node.meta["tensor_meta"].shape) == str(val.shape)
            if node.op == "call_function" and node.name in program_stacks:
                assert node.meta["nn_module_stack"] and "stack_trace" in node.meta


def test_preserved_call_arguments_get_vals() -> None:
    m = lower(transform(import_ep(export_case(CASES["preserve_kwargs"]))))
    placeholders = {n.name: n.meta["val"] for n in m.sub.graph.nodes if n.op == "placeholder"}
    assert {k: tuple(v.shape) for k, v in placeholders.items()} == {
        "_positional_arg_0": (3, 4), "_positional_arg_1": (3, 4), "gate": (3, 4)
    }


def test_call_module_val_is_the_callee_output() -> None:
    case = CASES["mlp_nested"]
    m = lower(transform(import_ep(export_case(case))))
    calls = [n for n in m.graph.nodes if n.op == "call_module"]
    assert [n.target for n in calls] == ["block", "head"]
    assert [tuple(n.meta["val"].shape) for n in calls] == [(3, 4), (3, 2)]
    assert "tensor_meta" not in calls[0].meta  # as torch's unflatten: val only


def test_a_shared_graph_called_with_other_shapes_gets_the_val_of_its_call() -> None:
    """The second call of a deduplicated module at another shape runs a graph traced at the
    first call's shapes; its ``val`` is still the output of *its* call (``deduplicate`` reads it
    from the dropped graph, ``ir.returned_values.output_value``)."""
    program = transform(import_ep(export_case(CASES["repeated_diff_shapes"])))
    m = lower(program)
    calls = {n.name: n.meta.get("val") for n in m.graph.nodes if n.op == "call_module"}
    assert [n.target for n in m.graph.nodes if n.op == "call_module"] == ["block", "block"]
    assert tuple(calls["relu"].shape) == (2, 4)
    assert tuple(calls["relu_1"].shape) == (5, 4)


@pytest.mark.parametrize("name", sorted(CASES)[::8])  # a fixed sample of 16 zoo cases
def test_every_node_of_every_lowered_graph_has_a_val_on_the_zoo(name: str) -> None:
    m = lower(transform(import_ep(export_case(CASES[name]))))
    missing = [
        f"{path or '<root>'}: {node.op} {node.name}"
        for path, _, g in _graphs(m) for node in g.nodes
        if not _is_subgraph_or_token(node) and "val" not in node.meta
    ]
    assert not missing, missing


@pytest.mark.parametrize("name", META_CASES)
def test_shape_prop_and_fake_tensor_prop_run_on_lowered_graphs(name: str) -> None:
    case = CASES[name]
    m = lower(transform(import_ep(export_case(case))))
    flat = flatten_inputs(m, case.args(), case.kwargs())
    before = {n.name: _shapes(n.meta["val"]) for n in m.graph.nodes if "val" in n.meta}
    ShapeProp(m).propagate(*flat)
    for node in m.graph.nodes:
        if isinstance(node.meta.get("val"), torch.Tensor) and "tensor_meta" in node.meta:
            shape = tuple(str(d) for d in node.meta["tensor_meta"].shape)
            assert len(shape) == len(before[node.name])
            if "dynamic" not in name:
                assert shape == before[node.name]
    mode = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in flat]
    FakeTensorProp(m, mode).propagate(*fakes)
    for node in m.graph.nodes:
        if node.name in before and node.op != "output" and "dynamic" not in name:
            assert _shapes(node.meta["val"]) == before[node.name], node.name



@pytest.mark.parametrize("name", ["mlp_nested", "pytree_outputs", "repeated_diff_shapes", "kwargs"])
def test_outlined_calls_carry_the_val_of_what_they_stand_for(name: str) -> None:
    """In the IR (before lowering), the ``call_module`` node of a call (no preserved signature)
    carries the ``val`` of the flat-graph value it stands for, or the tuple of them for a call
    with several results, and each ``getitem`` of those results the ``val`` of its value."""
    flat = import_ep(export_case(CASES[name]))
    vals = {n.name: n.meta["val"] for n in flat.root_module.graph.nodes if "val" in n.meta}
    program = transform(flat)
    calls = 0
    for mod in program.modules.values():
        for graph in mod.graphs:
            for node in graph.nodes:
                if node.op != "call_module":
                    continue
                calls += 1
                got = node.meta["val"]
                parts = [
                    n for n in graph.nodes
                    if n.target is operator.getitem and n.args[0] == ref(node.name)
                ]
                if not parts:
                    assert got is vals[node.name]
                    continue
                assert isinstance(got, tuple) and len(got) == len(parts)
                for part in parts:
                    assert part.meta["val"] is got[part.args[1]] is vals[part.name]
    assert calls > 0


@pytest.mark.parametrize(
    "name", ["preserve_nested", "preserve_kwargs", "preserve_constant", "preserve_twice",
             "pytree_outputs", "buffer_mutation[decomp]"],
)
def test_every_ir_node_that_holds_a_value_has_a_val_after_transform(name: str) -> None:
    """After ``transform``, every IR node but the outputs and the reads of higher-order-op
    bodies carries a ``val``: preserved calls and their pytree plumbing (the eager argument and
    output trees, built from the flat values' vals) included."""
    program = transform(import_ep(export_case(CASES[name])))
    missing = [
        (path, node.name)
        for path, mid in program.walk()
        for graph in program.module_table()[mid].graphs
        for node in graph.nodes
        if node.op != "output" and "val" not in node.meta
        and not (node.op == "get_attr" and "graph" in node.name)
    ]
    assert missing == []
    calls = 0
    for mod in program.modules.values():
        for graph in mod.graphs:
            by_name = graph.by_name()
            for node in graph.nodes:
                source = by_name.get(getattr(node.args[0], "name", None)) if node.args else None
                if node.target is not flatten_by_spec or source is None:
                    continue
                if source.op == "call_module":  # a caller takes a preserved call's result apart
                    calls += 1
                    leaves = flatten_by_spec(source.meta["val"], node.args[1])
                    assert all(a is b for a, b in zip(leaves, node.meta["val"], strict=True))
    assert (calls > 0) == name.startswith("preserve")
