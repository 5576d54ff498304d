"""``functional_to_inplace``: functional buffer / user-input mutations become ``copy_`` nodes."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given, settings

from ir import Graph, Node, PassError, Program, format_graph, format_program, import_ep, ref, verify
from ir.signature import (
    BUFFER_MUTATION,
    USER_INPUT_MUTATION,
    USER_OUTPUT,
    ExportSignature,
    OutputSpec,
)
from ir.strategies.module_trees import (
    AssignBuffer,
    ModuleSpec,
    SequentialSpec,
    UpdateBuffer,
    example_inputs,
    export_spec,
    program_specs,
    realize,
)
from lowering.lower import lower
from transforms.passes.mutations import COPY, functional_to_inplace
from transforms.pipeline import transform

try:
    from .zoo import CASES, Case, eager_model, export_case, fresh_export
except ImportError:  # tests/ is not a package
    from zoo import CASES, Case, eager_model, export_case, fresh_export

MUTATING = {"buffer_mutation", "input_mutation"}
# Mutations are functional (extra outputs) only after run_decompositions.
MUTATION_CASES = sorted(n for n, c in CASES.items() if c.features & MUTATING and c.decompose)
PLAIN_CASES = sorted(
    n
    for n, c in CASES.items()
    if not c.strict and not (c.decompose and c.features & MUTATING) and "big" not in c.features
)


# --- local models -----------------------------------------------------------------------------


class _TwoBuffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.zeros(3))
        self.register_buffer("b", torch.ones(3))


class SameValueTwice(_TwoBuffers):
    """One value written into two buffers and returned."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        self.a.copy_(y)
        self.b.copy_(y)
        return y


class CopyOldThenMutate(_TwoBuffers):
    """``a`` takes ``b``'s old value, then ``b`` changes: the mutation value is a placeholder."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a.copy_(self.b)
        self.b.add_(x)
        return self.a * 2


class BufferAndInput(torch.nn.Module):
    """A buffer and a user input mutated, both returned."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.a.add_(x)
        x.mul_(2)
        return self.a, x


class ReadThenMutate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.arange(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.a
        self.a.add_(x)
        return y


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, generator=torch.Generator().manual_seed(seed))


def _export(cls: type[torch.nn.Module]) -> torch.export.ExportedProgram:
    return torch.export.export(cls(), (_x(),)).run_decompositions()


def _versions(ep: torch.export.ExportedProgram) -> dict[str, int]:
    tensors = {**ep.state_dict, **ep.constants}
    return {k: v._version for k, v in tensors.items() if isinstance(v, torch.Tensor)}


def _buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_buffers()}


def _with_root(p: Program, nodes: list[Node], outputs: tuple | None = None) -> Program:
    root = p.root_module.replace(graphs=(Graph.of(nodes),))
    signature = p.signature if outputs is None else ExportSignature(p.signature.inputs, outputs)
    return p.replace(modules=p.modules.set(p.root, root), signature=signature)


def _graph(p: Program) -> str:
    return format_graph(p.root_module.graph)


def _lines(*lines: str) -> str:
    return "\n".join(lines)


# --- Before / Expected ------------------------------------------------------------------------


def test_input_mutation_before_expected():
    p = import_ep(export_case(CASES["input_mutation[decomp]"]))
    assert [s.kind for s in p.signature.outputs] == [USER_INPUT_MUTATION, USER_OUTPUT]
    after = functional_to_inplace(p)
    assert _graph(after) == _lines(
        "%p_lin_weight = placeholder",
        "%p_lin_bias = placeholder",
        "%x = placeholder",
        "%y = placeholder",
        "%add = call_function[aten.add.Tensor](%x, 1)",
        "%copy_ = call_function[aten.copy_.default](%x, %add)",
        "%permute = call_function[aten.permute.default](%p_lin_weight, [1, 0])",
        "%addmm = call_function[aten.addmm.default](%p_lin_bias, %copy_, %permute)",
        "%add_1 = call_function[aten.add.Tensor](%addmm, %y)",
        "return (%add_1,)",
    )
    assert after.signature.outputs == (OutputSpec(USER_OUTPUT, "add_1"),)
    assert after.signature.inputs == p.signature.inputs


def test_buffer_mutation_before_expected():
    p = import_ep(export_case(CASES["buffer_mutation[decomp]"]))
    after = functional_to_inplace(p)
    assert _graph(after) == _lines(
        "%p_lin_weight = placeholder",
        "%p_lin_bias = placeholder",
        "%b_steps = placeholder",
        "%b_acc_total = placeholder",
        "%x = placeholder",
        "%add = call_function[aten.add.Tensor](%b_steps, 1)",
        "%copy_ = call_function[aten.copy_.default](%b_steps, %add)",
        "%permute = call_function[aten.permute.default](%p_lin_weight, [1, 0])",
        "%addmm = call_function[aten.addmm.default](%p_lin_bias, %x, %permute)",
        "%sum_1 = call_function[aten.sum.dim_IntList](%addmm, [0])",
        "%add_1 = call_function[aten.add.Tensor](%b_acc_total, %sum_1)",
        "%copy__1 = call_function[aten.copy_.default](%b_acc_total, %add_1)",
        "%mul = call_function[aten.mul.Tensor](%addmm, 2)",
        "%add_2 = call_function[aten.add.Tensor](%mul, %copy__1)",
        "%add_3 = call_function[aten.add.Tensor](%add_2, %copy_)",
        "return (%add_3,)",
    )
    assert after.signature.outputs == (OutputSpec(USER_OUTPUT, "add_3"),)


def test_same_value_into_two_buffers():
    after = functional_to_inplace(import_ep(_export(SameValueTwice)))
    assert _graph(after) == _lines(
        "%b_a = placeholder",
        "%b_b = placeholder",
        "%x = placeholder",
        "%add = call_function[aten.add.Tensor](%x, 1)",
        "%copy_ = call_function[aten.copy_.default](%b_a, %add)",
        "%copy__1 = call_function[aten.copy_.default](%b_b, %add)",
        "return (%copy_,)",
    )
    assert after.signature.outputs == (OutputSpec(USER_OUTPUT, "copy_"),)


def test_old_value_copied_before_it_is_overwritten():
    """``a := b_old`` goes right after the placeholders; later reads of ``b_old`` read ``a``; ``b``
    is overwritten only after its last old-value reader."""
    p = import_ep(_export(CopyOldThenMutate))
    assert [s.name for s in p.signature.outputs] == ["b_b", "add", "mul"]
    after = functional_to_inplace(p)
    assert _graph(after) == _lines(
        "%b_a = placeholder",
        "%b_b = placeholder",
        "%x = placeholder",
        "%copy_ = call_function[aten.copy_.default](%b_a, %b_b)",
        "%add = call_function[aten.add.Tensor](%copy_, %x)",
        "%mul = call_function[aten.mul.Tensor](%copy_, 2)",
        "%copy__1 = call_function[aten.copy_.default](%b_b, %add)",
        "return (%mul,)",
    )
    # a placeholder belongs to no module: its copy goes to the root's
    nodes = after.root_module.graph.by_name()
    root_entry = next(iter(nodes["add"].meta["nn_module_stack"].items()))
    assert root_entry[1][0] == ""
    assert nodes["copy_"].meta["nn_module_stack"] == dict([root_entry])
    assert nodes["copy__1"].meta is nodes["add"].meta


def test_copy_waits_for_later_readers_of_the_old_value():
    """If the new value is computed before the old one's last read, the copy_ waits for it."""
    p = import_ep(_export(ReadThenMutate))
    nodes = list(p.root_module.graph.nodes)
    names = [n.name for n in nodes]
    assert names == ["b_a", "x", "mul", "add", "output"]
    reordered = _with_root(p, [nodes[0], nodes[1], nodes[3], nodes[2], nodes[4]])
    verify(reordered)
    after = functional_to_inplace(reordered)
    assert _graph(after) == _lines(
        "%b_a = placeholder",
        "%x = placeholder",
        "%add = call_function[aten.add.Tensor](%b_a, %x)",
        "%mul = call_function[aten.mul.Tensor](%x, %b_a)",
        "%copy_ = call_function[aten.copy_.default](%b_a, %add)",
        "return (%mul,)",
    )
    _check_semantics(reordered, lambda: ReadThenMutate(), lambda: ((_x(),), {}))


def test_copy_carries_the_value_meta():
    p = import_ep(export_case(CASES["buffer_mutation_cross[decomp]"]))
    graph = functional_to_inplace(p).root_module.graph
    copies = [n for n in graph.nodes if n.target is COPY]
    assert len(copies) == 1
    value = graph.node(copies[0].args[1].name)
    assert copies[0].meta["nn_module_stack"] == value.meta["nn_module_stack"]
    assert [path for path, _ in value.meta["nn_module_stack"].values()] == ["", "writer"]
    assert copies[0].meta["stack_trace"] == value.meta["stack_trace"]


# --- semantics --------------------------------------------------------------------------------


def _check_semantics(p: Program, make_model, make_inputs, exported=None, calls: int = 2) -> None:
    """``lower(f(p))`` agrees with ``lower(p)``, the eager model and ``ep.module()`` (if given) on
    outputs, buffers after each call and the caller's (mutated) inputs; ``p`` is untouched."""
    text = format_program(p, vals=False)
    after = functional_to_inplace(p)
    verify(after)
    assert not any(
        s.kind in (BUFFER_MUTATION, USER_INPUT_MUTATION) for s in after.signature.outputs
    )
    n_mutations = sum(s.kind in (BUFFER_MUTATION, USER_INPUT_MUTATION) for s in p.signature.outputs)
    assert len(after.root_module.graph) == len(p.root_module.graph) + n_mutations
    copies = [sum(n.target is COPY for n in q.root_module.graph.nodes) for q in (p, after)]
    assert copies[1] - copies[0] == n_mutations
    assert functional_to_inplace(after) is after
    modules = {"after": lower(after), "before": lower(p), "eager": make_model()}
    if exported is not None:
        modules["exported"] = exported
    for _ in range(calls):
        seen = {}
        for label, module in modules.items():
            args, kwargs = make_inputs()
            out = module(*args, **kwargs)
            seen[label] = (out, args, kwargs, _buffers(module))
        for label in modules:
            torch.testing.assert_close(seen["after"], seen[label], msg=f"lowered vs {label}")
    assert format_program(p, vals=False) == text


@pytest.mark.parametrize("name", MUTATION_CASES)
def test_zoo_cases_behave_like_ep_module(name: str, capfd):
    case: Case = CASES[name]
    ep = fresh_export(case)  # never run: its tensors must stay as they are
    versions = _versions(ep)
    p = import_ep(ep)
    snapshot = import_ep(ep)
    capfd.readouterr()
    assert functional_to_inplace(p) == functional_to_inplace(snapshot)
    assert capfd.readouterr().out == ""
    _check_semantics(
        p,
        lambda: eager_model(case),
        lambda: (case.args(), case.kwargs()),
        exported=fresh_export(case).module(),
    )
    assert p == snapshot
    assert _versions(ep) == versions


@pytest.mark.parametrize("model", [SameValueTwice, CopyOldThenMutate, ReadThenMutate])
def test_local_models_behave_like_ep_module(model):
    p = import_ep(_export(model))
    _check_semantics(p, model, lambda: ((_x(),), {}), exported=_export(model).module(), calls=3)


def test_buffer_and_input_mutation_alias_like_eager():
    """Outputs that were mutated values read the ``copy_``: the buffer and the caller's tensor."""
    p = import_ep(_export(BufferAndInput))
    after = functional_to_inplace(p)
    assert _graph(after) == _lines(
        "%b_a = placeholder",
        "%x = placeholder",
        "%add = call_function[aten.add.Tensor](%b_a, %x)",
        "%copy_ = call_function[aten.copy_.default](%b_a, %add)",
        "%mul = call_function[aten.mul.Tensor](%x, 2)",
        "%copy__1 = call_function[aten.copy_.default](%x, %mul)",
        "return (%copy_, %copy__1)",
    )
    _check_semantics(
        p, BufferAndInput, lambda: ((_x(),), {}), exported=_export(BufferAndInput).module()
    )
    lowered, x = lower(after), _x()
    a, y = lowered(x)
    assert y is x and a is lowered.a


def test_default_pipeline_puts_copies_in_their_modules():
    """Integration: outlining after this pass writes the buffer where eager code did."""
    after = transform(import_ep(export_case(CASES["buffer_mutation_cross[decomp]"])))
    writer = after.modules[after.resolve("writer")].graph
    assert [n.args[0] for n in writer.nodes if n.target is COPY] == [ref("b_writer_state")]
    assert not any(n.target is COPY for n in after.root_module.graph.nodes)


@pytest.mark.parametrize(
    "model", [SameValueTwice, CopyOldThenMutate, BufferAndInput, ReadThenMutate]
)
def test_default_pipeline_behaves_like_ep_module(model):
    lowered, exported = lower(transform(import_ep(_export(model)))), _export(model).module()
    for seed in range(3):
        args, want_args = (_x(seed),), (_x(seed),)
        torch.testing.assert_close(lowered(*args), exported(*want_args))
        torch.testing.assert_close(args, want_args)
        torch.testing.assert_close(_buffers(lowered), _buffers(exported))


# --- laws -------------------------------------------------------------------------------------

_MUTATING_FEATURES = (
    "binary", "children", "repeat_calls", "buffers", "buffer_updates", "buffer_assign",
    "non_persistent",
)  # fmt: skip


def _writes_buffers(spec: object) -> bool:
    if isinstance(spec, SequentialSpec):
        return any(_writes_buffers(item) for item in spec.items)
    if not isinstance(spec, ModuleSpec):
        return False
    return any(isinstance(op, (UpdateBuffer, AssignBuffer)) for op in spec.ops) or any(
        _writes_buffers(child.spec) for child in spec.children
    )


# Decomposed exports of generated modules that update or assign buffers (the generator draws
# ``decompose`` at random; mutations are functional only with it on).
_DECOMPOSED = (
    program_specs(max_depth=2, max_children=2, max_ops=4, features=_MUTATING_FEATURES)
    .filter(lambda spec: _writes_buffers(spec.root))
    .map(lambda spec: attrs.evolve(spec, decompose=True))
)


@settings(max_examples=15)
@given(_DECOMPOSED.map(lambda spec: (spec, export_spec(spec))))
def test_law_semantics_on_generated_programs(drawn):
    """On generated modules that update and assign buffers: ``lower(f(p))`` behaves like
    ``lower(p)`` and the eager module, call after call; ``verify`` and idempotence hold."""
    spec, ep = drawn
    versions = _versions(ep)
    _check_semantics(import_ep(ep), lambda: realize(spec), lambda: example_inputs(spec))
    assert _versions(ep) == versions


@pytest.mark.parametrize("name", PLAIN_CASES)
def test_identity_without_functional_mutations(name: str):
    p = import_ep(export_case(CASES[name]))
    assert functional_to_inplace(p) is p


def test_idempotent_and_deterministic():
    for name in MUTATION_CASES:
        ep = export_case(CASES[name])
        once = functional_to_inplace(import_ep(ep))
        assert functional_to_inplace(once) is once
        assert functional_to_inplace(import_ep(ep)) == once


def test_parameter_mutations_are_left_alone():
    """Only buffer and user-input mutations are rewritten; a parameter mutation output stays."""
    p = import_ep(export_case(CASES["buffer_mutation[decomp]"]))
    outputs = (OutputSpec("parameter_mutation", "add", "steps"),) + p.signature.outputs[1:]
    p = p.replace(signature=ExportSignature(p.signature.inputs, outputs))
    after = functional_to_inplace(p)
    assert [s.kind for s in after.signature.outputs] == ["parameter_mutation", USER_OUTPUT]
    assert [n.args[0].name for n in after.root_module.graph.nodes if n.target is COPY] == [
        "b_acc_total"
    ]


# --- bad input --------------------------------------------------------------------------------


def _bad(p: Program, values: tuple, specs: tuple) -> Program:
    nodes = list(p.root_module.graph.nodes)
    nodes[-1] = nodes[-1].replace(args=(values,))
    return _with_root(p, nodes, specs)


def test_swapping_buffers_is_a_pass_error():
    p = import_ep(_export(CopyOldThenMutate))
    swap = _bad(
        p,
        (ref("b_b"), ref("b_a"), ref("mul")),
        (
            OutputSpec(BUFFER_MUTATION, "b_b", "a"),
            OutputSpec(BUFFER_MUTATION, "b_a", "b"),
            OutputSpec(USER_OUTPUT, "mul"),
        ),
    )
    verify(swap)
    with pytest.raises(PassError, match="cycle"):
        functional_to_inplace(swap)


@pytest.mark.parametrize(
    "values, specs, message",
    [
        ((ref("add"), ref("mul")), ((BUFFER_MUTATION, "add", "nope"), (USER_OUTPUT, "mul", None)),
         "writes 'nope', which is not a buffer"),
        ((ref("add"), ref("mul")),
         ((USER_INPUT_MUTATION, "add", "b_a"), (USER_OUTPUT, "mul", None)),
         "writes 'b_a', which is not a user input"),
        ((1.0, ref("mul")), ((BUFFER_MUTATION, None, "a"), (USER_OUTPUT, "mul", None)),
         "returns the literal 1.0"),
        ((ref("add"), ref("add"), ref("mul")),
         ((BUFFER_MUTATION, "add", "a"), (BUFFER_MUTATION, "add", "a"), (USER_OUTPUT, "mul", None)),
         "'a' is written by two"),
        ((ref("add"), ref("b_a")), ((BUFFER_MUTATION, "add", "a"), (USER_OUTPUT, "b_a", None)),
         "returns %b_a, the value of an input from before the call mutated it"),
        ((ref("add"),), ((BUFFER_MUTATION, "add", "a"), (USER_OUTPUT, "mul", None)),
         "returns 1 values but its signature lists 2"),
    ],
)  # fmt: skip
def test_bad_mutations_are_pass_errors(values, specs, message):
    p = import_ep(_export(ReadThenMutate))
    bad = _bad(p, values, tuple(OutputSpec(*s) for s in specs))
    with pytest.raises(PassError, match=message):
        functional_to_inplace(bad)
