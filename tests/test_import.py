"""``import_ep``: every kind of program torch 2.13 exports, read without being written."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch
import zoo
from zoo import ep_fingerprint

from ir import (
    Program,
    UnsupportedProgramError,
    format_program,
    import_ep,
    import_graph_module,
    verify,
)
from ir import signature as sg
from ir import state as st
from lowering import lower

ALL = sorted(zoo.CASES)


@pytest.mark.parametrize("name", ALL)
def test_import_is_pure_verified_and_quiet(name):
    ep = zoo.fresh_export(zoo.CASES[name])
    before = ep_fingerprint(ep)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        program = import_ep(ep)
    assert out.getvalue() == ""
    assert ep_fingerprint(ep) == before
    assert verify(program) is program
    copy.deepcopy(ep)  # torch's unflatten leaves ep un-copyable; import does not


@pytest.mark.parametrize("name", ALL)
def test_import_is_deterministic(name):
    ep = zoo.export_case(zoo.CASES[name])
    a, b = import_ep(ep), import_ep(ep)
    assert a == b and hash(a) == hash(b)
    assert format_program(a, vals=False) == format_program(b, vals=False)


def _state(program: Program, fqn: str) -> st.Slot:
    return program.state[fqn]


def test_state_kinds_flags_and_order():
    case = zoo.CASES["param_zoo"]
    ep = zoo.export_case(case)
    program = import_ep(ep)
    eager = zoo.eager_model(case)
    assert set(eager.state_dict()) <= set(program.state_order)
    assert list(lower(program).state_dict()) == list(eager.state_dict())
    for name, param in eager.named_parameters(remove_duplicate=False):
        slot = _state(program, name)
        assert slot.kind == st.PARAMETER
        assert slot.requires_grad == param.requires_grad
    persistent = set(eager.state_dict())
    for name, _ in eager.named_buffers(remove_duplicate=False):
        slot = _state(program, name)
        assert slot.kind == st.BUFFER
        assert slot.persistent == (name in persistent)


def test_tied_parameters_share_one_tensor_key():
    case = zoo.cases_with("tied_weights")[0]
    program = import_ep(zoo.export_case(case))
    eager = zoo.eager_model(case)
    by_tensor: dict[int, set[str]] = {}
    for name, p in eager.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(p), set()).add(name)
    tied = [names for names in by_tensor.values() if len(names) > 1]
    assert tied, "the zoo's tied case should tie something"
    for names in tied:
        assert len({program.state[n].tensor for n in names}) == 1


def test_constants_and_custom_objects_are_state():
    cases = [zoo.CASES["param_zoo"]] + zoo.cases_with("opaque_object")
    for case in cases:
        ep = zoo.export_case(case)
        assert ep.constants, case.name
        program = import_ep(ep)
        for fqn, value in ep.constants.items():
            slot = program.state[fqn]
            assert program.tensors[slot.tensor].value is value


def test_signature_matches_placeholders_and_outputs():
    ep = zoo.export_case(zoo.CASES["buffer_mutation[decomp]"])
    program = import_ep(ep)
    kinds = [s.kind for s in program.signature.outputs]
    assert sg.BUFFER_MUTATION in kinds
    assert [s.name for s in program.signature.inputs] == [
        n.name for n in ep.graph.nodes if n.op == "placeholder"
    ]


def test_hop_subgraphs_are_modules():
    for feature in ("cond", "map", "while_loop"):
        for case in zoo.cases_with(feature)[:1]:
            ep = zoo.export_case(case)
            program = import_ep(ep)
            subgraphs = [mid for mid, m in program.modules.items() if m.kind == "subgraph"]
            assert subgraphs, feature
            for mid in subgraphs:
                assert program.modules[mid].graph is not None


class _Inner(torch.nn.Module):
    def forward(self, x):
        return x.relu() + 1


class _TwoCallsWithoutGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = _Inner()
        self.b = _Inner()

    def forward(self, x):
        with torch.no_grad():
            y = self.b(self.a(x))
        return y * 2


def test_a_module_called_only_inside_a_region_keeps_its_class_name():
    """The region's ``wrap_with_set_grad_enabled`` node carries one module stack (here ``b``'s);
    ``a``'s class is named on the body's nodes alone."""
    ep = torch.export.export(_TwoCallsWithoutGrad(), (torch.randn(3),))
    program = import_ep(ep)
    inner = f"{__name__}._Inner"
    assert program.modules["a"].type_name == inner
    assert program.modules["b"].type_name == inner


def test_dynamic_shapes_keep_range_constraints():
    case = zoo.cases_with("dynamic_shapes")[0]
    ep = zoo.export_case(case)
    program = import_ep(ep)
    assert program.range_constraints.value is ep.range_constraints
    assert len(ep.range_constraints) >= 1


def test_module_call_graph_and_preserved_signatures():
    case = zoo.cases_with("preserve")[0]
    ep = zoo.export_case(case)
    program = import_ep(ep)
    assert program.call_order == tuple(e.fqn for e in ep.module_call_graph)
    preserved = [e.fqn for e in ep.module_call_graph if e.signature is not None and e.fqn]
    assert preserved
    for fqn in preserved:
        sig = program.call_signatures[fqn]
        torch_sig = next(e.signature for e in ep.module_call_graph if e.fqn == fqn)
        assert sig.in_spec == torch_sig.in_spec and sig.out_spec == torch_sig.out_spec
        assert [a.name for a in sig.inputs] == [getattr(a, "name", None) for a in torch_sig.inputs]


def test_not_an_exported_program():
    with pytest.raises(UnsupportedProgramError, match="expects a torch.export.ExportedProgram"):
        import_ep(torch.nn.Linear(2, 2))




def test_import_graph_module_keeps_tags_and_state():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 3))
            self.register_buffer("b", torch.ones(3))

        def forward(self, x):
            return torch.relu(x @ self.w) + self.b

    gm = torch.fx.symbolic_trace(M())
    for node in gm.graph.nodes:
        node.tag = "t_" + node.op
    program = import_graph_module(gm)
    verify(program)
    tags = {n.name: n.meta.get("tag") for n in program.root_module.graph.nodes}
    assert tags["relu"] == "t_call_function"
    assert program.state["w"].kind == st.PARAMETER and program.state["b"].kind == st.BUFFER
    x = torch.randn(2, 3)
    torch.testing.assert_close(lower(program)(x), gm(x))
    assert all(n.tag for n in gm.graph.nodes)  # the input is untouched


def test_import_graph_module_keeps_leaf_module_calls():  # more in tests/test_split_gm.py
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    program = import_graph_module(gm)
    assert program.modules[program.resolve("0")].kind == "leaf"
    x = torch.randn(3, 2)
    torch.testing.assert_close(lower(program)(x), gm(x))
def test_corrupt_signature_names_the_placeholder():
    program = import_ep(zoo.export_case(zoo.CASES["mlp_nested"]))
    from ir.import_ep import _check_signature_matches_graph

    first = program.signature.inputs[0]
    bad = program.signature.__class__(
        (first.__class__(sg.PARAMETER, "not_a_placeholder", first.target),)
        + program.signature.inputs[1:],
        program.signature.outputs,
    )
    with pytest.raises(UnsupportedProgramError, match="not_a_placeholder"):
        _check_signature_matches_graph(bad, program.root_module.graph)


class _MixedBuffers(torch.nn.Module):
    """Non-persistent buffers first, between persistent ones, twice in a row, and last."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("np_first", torch.ones(2), persistent=False)
        self.register_buffer("p_a", torch.ones(2))
        self.w = torch.nn.Parameter(torch.ones(2))
        self.register_buffer("np_mid1", torch.ones(2), persistent=False)
        self.register_buffer("np_mid2", torch.ones(2), persistent=False)
        self.register_buffer("p_b", torch.ones(2))
        self.register_buffer("np_last", torch.ones(2), persistent=False)

    def forward(self, x):
        return x * self.w + sum(b for b in self.buffers())


@pytest.mark.parametrize("blocks", [1, 3])
def test_non_persistent_buffers_keep_their_eager_registration_order(blocks):
    model = torch.nn.Sequential(*[_MixedBuffers() for _ in range(blocks)])
    ep = torch.export.export(model, (torch.ones(2),), strict=False)
    program = import_ep(ep)
    eager = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    kinds = {fqn: program.state[fqn].kind for fqn in program.state_order}
    order = [f for f in program.state_order if kinds[f] == st.PARAMETER]
    order += [f for f in program.state_order if kinds[f] == st.BUFFER]
    assert order == eager
    lowered = lower(program)
    assert [n for n, _ in lowered.named_buffers()] == [n for n, _ in model.named_buffers()]
