"""Malformed programs get a purefx error, at import or ``verify``, never a raw Python error.

Example tests for each class of corruption, then a hypothesis fuzzer that corrupts copies of real
exported programs and checks that each either raises a ``PurefxError`` (from ``import_ep``,
``transform``, ``lower`` or the first call) or lowers to a module that matches ``ep.module()``.
"""

from __future__ import annotations

import copy
import functools
import operator
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from torch.export import graph_signature as gs
from zoo import CASES, fresh_export  # tests/ is on sys.path (conftest)

import ir
from ir import LoweringError, PurefxError, UnsupportedProgramError, import_ep
from ir.purity import ep_fingerprint
from lowering import lower
from lowering.example_model import example_program
from transforms import transform


@pytest.mark.parametrize("device", ["nope", "cuda:99", 7])
def test_lower_refuses_a_device_torch_cannot_use(device):
    if device == "cuda:99" and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    program = ir.import_ep(example_program())
    with pytest.raises(LoweringError, match=f"device {device!r} cannot be used"):
        lower(program, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only build or machine")
def test_lower_refuses_cuda_on_a_cpu_machine():
    with pytest.raises(LoweringError, match="device 'cuda' cannot be used"):
        lower(ir.import_ep(example_program()), device="cuda")


# --- one example per class of malformed program -------------------------------------------------


def _spec_index(ep, kind) -> int:
    return next(i for i, s in enumerate(ep.graph_signature.input_specs) if s.kind == kind)


def _first_node(ep, op="call_function") -> torch.fx.Node:
    return next(n for n in ep.graph.nodes if n.op == op and n.meta.get("nn_module_stack"))


def _set_spec(ep, i, **changes):
    specs = ep.graph_signature.input_specs
    specs[i] = _with(specs[i], **changes)


def _set_stack(ep, value):
    _first_node(ep).meta["nn_module_stack"] = value(_first_node(ep).meta["nn_module_stack"])


def _buffer(ep) -> str:
    return next(iter(ep.graph_signature.buffers))


def _parameter(ep) -> str:
    return next(iter(ep.graph_signature.parameters))


MALFORMED = {
    # name: (fixture, corruption of a deep copy, what the error says)
    "call graph entry names a buffer": ("param_zoo", lambda ep: ep._module_call_graph.append(
        _with(ep._module_call_graph[1], fqn=_buffer(ep))), "is a parameter, buffer or constant"),
    "call graph entry inside a parameter": ("param_zoo", lambda ep: ep._module_call_graph.append(
        _with(ep._module_call_graph[1], fqn=_parameter(ep) + ".x")), "not a module"),
    "no root call graph entry": ("param_zoo", lambda ep: ep._module_call_graph.pop(0),
                                 "no root entry"),
    "call graph entry twice": ("param_zoo", lambda ep: ep._module_call_graph.append(
        ep._module_call_graph[1]), "appears twice"),
    "call graph entry not a path": ("param_zoo", lambda ep: ep._module_call_graph.append(
        _with(ep._module_call_graph[1], fqn="a..b")), "not a module path"),
    "root in_spec of another arity": ("kwargs", lambda ep: ep._module_call_graph.__setitem__(
        0, _with(ep._module_call_graph[0], signature=_with(
            ep._module_call_graph[0].signature, in_spec=pytree.tree_structure((1,))))),
        "leaves but the program has"),
    "token input spec with a target": ("param_zoo", lambda ep: _set_spec(
        ep, _spec_index(ep, gs.InputKind.USER_INPUT), kind=gs.InputKind.TOKEN, target="x",
        arg=gs.TokenArgument(ep.graph_signature.user_inputs[0])), "takes none"),
    "state spec without a target": ("param_zoo", lambda ep: _set_spec(
        ep, _spec_index(ep, gs.InputKind.PARAMETER), target=None), "must name the state"),
    "buffer spec without persistence": ("param_zoo", lambda ep: _set_spec(
        ep, _spec_index(ep, gs.InputKind.BUFFER), persistent=None), "not a bool"),
    "two specs read one fqn": ("param_zoo", lambda ep: _set_spec(
        ep, _spec_index(ep, gs.InputKind.BUFFER), target=_parameter(ep)), "both read"),
    "parameter spec with a token": ("param_zoo", lambda ep: _set_spec(
        ep, _spec_index(ep, gs.InputKind.PARAMETER), arg=gs.TokenArgument("t")),
        "a parameter input cannot be"),
    "unknown input kind": ("param_zoo", lambda ep: _set_spec(ep, 0, kind="parameter"),
                           "has kind 'parameter'"),
    "unknown output kind": ("param_zoo", lambda ep: ep.graph_signature.output_specs.__setitem__(
        0, _with(ep.graph_signature.output_specs[0], kind="bogus")), "has kind 'bogus'"),
    "gradient output": ("param_zoo", lambda ep: ep.graph_signature.output_specs.__setitem__(
        0, _with(ep.graph_signature.output_specs[0], kind=gs.OutputKind.GRADIENT_TO_PARAMETER)),
        "joint forward/backward"),
    "user output with a target": ("param_zoo", lambda ep: ep.graph_signature.output_specs.__setitem__(
        0, _with(ep.graph_signature.output_specs[0], target="lin.weight")), "it takes none"),
    "nn_module_stack as a list": ("param_zoo", lambda ep: _set_stack(ep, lambda s: list(s.items())),
                                  "malformed nn_module_stack: a list"),
    "nn_module_stack path not a string": ("param_zoo", lambda ep: _set_stack(
        ep, lambda s: {k: (3, t) for k, (_, t) in s.items()}), "has path 3, not a string"),
    "nn_module_stack entry not a pair": ("param_zoo", lambda ep: _set_stack(
        ep, lambda s: {k: "x" for k in s}), "not \\(path, type\\)"),
    "parameter not a tensor": ("param_zoo", lambda ep: ep._state_dict.__setitem__(
        _parameter(ep), 3.0), "holds a float, not a tensor"),
    "constant tensor not a tensor": ("param_zoo", lambda ep: ep._constants.__setitem__(
        next(iter(ep.graph_signature.lifted_tensor_constants)), "x"), "holds a str, not a tensor"),
    "state of another shape": ("param_zoo", lambda ep: ep._state_dict.__setitem__(
        _parameter(ep), torch.nn.Parameter(torch.zeros(7, 1))), "was traced with shape"),
    "state of another dtype": ("param_zoo", lambda ep: ep._state_dict.__setitem__(
        _parameter(ep), torch.nn.Parameter(ep.state_dict[_parameter(ep)].double())),
        "was traced with torch.float32"),
    "state inside state": ("param_zoo", lambda ep: ep._state_dict.__setitem__(
        _parameter(ep) + ".x", torch.ones(1)), "lies inside state"),
    "placeholder with a default": ("param_zoo", lambda ep: setattr(
        next(iter(ep.graph.nodes)), "args", (1.0,)), "has a default value"),
    "node with an unknown op": ("param_zoo", lambda ep: setattr(_first_node(ep), "op", "bogus"),
                                "unknown op 'bogus'"),
    "node name not an identifier": ("param_zoo", lambda ep: setattr(
        _first_node(ep), "name", "a b"), "not a Python identifier"),
    "call_function of a string": ("param_zoo", lambda ep: setattr(
        _first_node(ep), "target", "relu"), "not a callable"),
    "operator given an unknown keyword": ("param_zoo", lambda ep: setattr(
        _first_node(ep), "kwargs", {"bogus": 1}), "whose schema is"),
    "getitem given a keyword": ("cond", lambda ep: setattr(
        next(n for n in ep.graph.nodes if n.target is operator.getitem), "kwargs", {"i": 0}),
        "with arguments it does not take"),
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_each_class_of_malformed_program_fails_at_import(what):
    name, corrupt, message = MALFORMED[what]
    bad = copy.deepcopy(fixture_ep(name))
    corrupt(bad)
    with pytest.raises(UnsupportedProgramError, match=message):
        import_ep(bad)
    assert ep_fingerprint(fixture_ep(name)) == FINGERPRINTS[name]


# --- the fuzzer ----------------------------------------------------------------------------------
# Each corruption edits a deep copy of a real exported program in place and names what it did.

FIXTURES = (
    "param_zoo", "buffer_mutation_cross", "input_mutation", "preserve_nested", "effect_record",
    "repeated_diff_shapes", "pytree_outputs", "cond", "kwargs", "tied_weights",
)


FINGERPRINTS: dict[str, tuple] = {}


@functools.cache
def fixture_ep(name: str) -> torch.export.ExportedProgram:
    """The zoo's export of ``name``, built once; the fuzzer only ever corrupts deep copies."""
    ep = fresh_export(CASES[name])
    FINGERPRINTS[name] = ep_fingerprint(ep)
    return ep


def _odd_values(draw) -> Any:
    return draw(st.sampled_from([
        None, 0, -1, 3.5, "", "x", "a.b", "1 + 1", "__class__", (), [], {}, ("a",), ["a", 1],
        {"k": "v"}, {1: 2}, torch.ones(1), object(), float("nan"), True,
    ]))


def _with(obj: Any, **changes: Any) -> Any:
    """A copy of the dataclass ``obj`` with ``changes`` set, bypassing its own checks (as a
    hand-edited or deserialized program would)."""
    new = copy.copy(obj)
    for field, value in changes.items():
        object.__setattr__(new, field, value)
    return new


def _pick(draw, items: list) -> Any:
    return items[draw(st.integers(0, len(items) - 1))]


def corrupt_meta(ep, draw) -> str:
    node = _pick(draw, list(_pick(draw, _graphs(ep)).nodes))
    key = draw(st.sampled_from(["nn_module_stack", "val", "stack_trace", "torch_fn", "custom",
                                "tensor_meta", "unbacked_bindings"]))
    how = draw(st.sampled_from(["odd", "delete", "list_stack", "bad_path", "bad_entry"]))
    stack = node.meta.get("nn_module_stack")
    if how == "delete":
        node.meta.pop(key, None)
    elif how == "list_stack" and stack:
        key, node.meta["nn_module_stack"] = "nn_module_stack", list(stack.items())
    elif how == "bad_path" and stack:
        k = _pick(draw, list(stack))
        key = "nn_module_stack"
        node.meta[key] = {**stack, k: (_odd_values(draw), stack[k][1])}
    elif how == "bad_entry" and stack:
        k = _pick(draw, list(stack))
        key = "nn_module_stack"
        node.meta[key] = {**stack, k: _odd_values(draw)}
    else:
        how = "odd"
        node.meta[key] = _odd_values(draw)
    return f"meta {key} of {node.name} ({how})"


def _graphs(ep) -> list[torch.fx.Graph]:
    """The root graph and every HOP subgraph (``cond`` branches, ...)."""
    found = [ep.graph]
    found += [m.graph for _, m in ep.graph_module.named_modules()
              if isinstance(m, torch.fx.GraphModule) and m is not ep.graph_module]
    return found


def corrupt_node(ep, draw) -> str:
    nodes = list(_pick(draw, _graphs(ep)).nodes)
    node = _pick(draw, nodes)
    what = draw(st.sampled_from(["op", "target", "name", "args", "kwargs", "users"]))
    if what == "op":
        node.op = draw(st.sampled_from(
            ["placeholder", "get_attr", "call_function", "call_module", "call_method", "output",
             "bogus", ""]))
    elif what == "target":
        node.target = draw(st.one_of(
            st.sampled_from([torch.ops.aten.relu.default, torch.ops.aten.add.Tensor,
                             operator.getitem, "weight", "nope.nope", "relu", "x y"]),
            st.builds(lambda v: v, st.just(None)),
        )) if draw(st.booleans()) else _odd_values(draw)
    elif what == "name":
        node.name = draw(st.one_of(
            st.sampled_from(["", "a.b", "x y", "1abc", "class", "_", "output"]),
            st.just(_pick(draw, nodes).name),
        ))
    elif what == "args":
        other = _pick(draw, nodes)
        node.args = draw(st.sampled_from(
            [(), (other,), (other, other, other), tuple(node.args) + (other,)]))
    elif what == "kwargs":
        node.kwargs = {**node.kwargs, draw(st.sampled_from(["alpha", "bogus", "out"])):
                       _pick(draw, nodes) if draw(st.booleans()) else 2}
    else:
        node.graph.erase_node(node) if not node.users else node.replace_all_uses_with(
            _pick(draw, nodes))
    return f"node {node.name}: {what}"


def corrupt_signature(ep, draw) -> str:
    sig = ep.graph_signature
    side = draw(st.sampled_from(["input", "output"]))
    specs = sig.input_specs if side == "input" else sig.output_specs
    if not specs:
        return "no specs"
    i = draw(st.integers(0, len(specs) - 1))
    spec = specs[i]
    field = draw(st.sampled_from(["kind", "target", "arg", "persistent", "drop", "dup"]))
    if field == "kind":
        kinds = list(gs.InputKind if side == "input" else gs.OutputKind)
        value = draw(st.sampled_from([*kinds, "user_input", None, 7]))
        specs[i] = _with(spec, kind=value)
    elif field == "target":
        names = [*ep.state_dict, *ep.constants, "nope", "", None, 3]
        specs[i] = _with(spec, target=draw(st.sampled_from(names)))
    elif field == "arg":
        args = [gs.TensorArgument("nope"), gs.TokenArgument("tok"), gs.ConstantArgument("c", 3),
                gs.SymIntArgument("s"), None, "x"]
        specs[i] = _with(spec, arg=draw(st.sampled_from(args)))
    elif field == "persistent" and side == "input":
        specs[i] = _with(spec, persistent=draw(st.sampled_from([None, True, False])))
    elif field == "drop":
        del specs[i]
    else:
        specs.insert(i, spec)
    return f"{side} spec {i}: {field}"


def corrupt_call_graph(ep, draw) -> str:
    entries = ep._module_call_graph
    how = draw(st.sampled_from(["drop", "fqn", "signature", "dup", "inputs", "spec"]))
    i = draw(st.integers(0, len(entries) - 1))
    entry = entries[i]
    if how == "drop":
        del entries[i]
    elif how == "fqn":
        names = [*ep.state_dict, *ep.constants, "nope", "a..b", "", "x@1", ".", None, 3]
        entries[i] = _with(entry, fqn=draw(st.sampled_from(names)))
    elif how == "dup":
        entries.append(copy.deepcopy(entry))
    elif how == "signature" or entry.signature is None:
        entries[i] = _with(entry, signature=None)
    elif how == "inputs":
        sig = entry.signature
        new = draw(st.sampled_from(
            [[], [gs.TensorArgument("nope")], [*sig.inputs, *sig.inputs], ["x"], [None]]))
        entries[i] = _with(entry, signature=_with(sig, inputs=new))
    else:
        sig = entry.signature
        spec = draw(st.sampled_from([None, "x", sig.out_spec, sig.in_spec]))
        field = draw(st.sampled_from(["in_spec", "out_spec"]))
        entries[i] = _with(
            entry, signature=_with(sig, **{field: spec}))
    return f"module_call_graph entry {i}: {how}"


def corrupt_state(ep, draw) -> str:
    table = draw(st.sampled_from(["_state_dict", "_constants"]))
    found = getattr(ep, table)
    if not found:
        return f"empty {table}"
    fqn = _pick(draw, list(found))
    how = draw(st.sampled_from(["drop", "odd", "shape", "plain", "param", "extra"]))
    value = found[fqn]
    if how == "drop":
        del found[fqn]
    elif how == "odd":
        found[fqn] = _odd_values(draw)
    elif how == "shape" and isinstance(value, torch.Tensor):
        found[fqn] = torch.zeros(7, 1)
    elif how == "plain" and isinstance(value, torch.Tensor):
        found[fqn] = value.detach().clone()
    elif how == "param" and isinstance(value, torch.Tensor):
        found[fqn] = torch.nn.Parameter(value.detach().clone().float(), requires_grad=False)
    else:
        found[draw(st.sampled_from(["extra", "a.b.c", fqn + ".x"]))] = torch.ones(2)
    return f"{table} {fqn}: {how}"


CORRUPTIONS = (corrupt_meta, corrupt_node, corrupt_signature, corrupt_call_graph, corrupt_state)


def _outcome(run: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", run()
    except Exception as err:  # noqa: BLE001 - classified by the caller
        return "raised", err


def check_corrupted(bad: torch.export.ExportedProgram, what: str) -> None:
    """``bad`` either raises a PurefxError in purefx or runs as ``bad.module()`` does."""
    built, module = _outcome(lambda: lower(transform(import_ep(bad))))
    if built == "raised":
        assert isinstance(module, PurefxError), (
            f"{what}: {type(module).__name__}: {module} at {_where(module)}"
        )
        return
    if bad.example_inputs is None:
        return
    status, want = _outcome(lambda: _call(bad.module(), bad.example_inputs))
    got_status, got = _outcome(lambda: _call(module, bad.example_inputs))
    if got_status == "raised":
        if isinstance(got, PurefxError):
            return
        assert status == "raised" and type(got) is type(want), (
            f"{what}: purefx raised {type(got).__name__}: {got}; ep.module() "
            + (f"raised {type(want).__name__}" if status == "raised" else "ran")
        )
        return
    if status == "raised":
        return  # nothing to compare with
    _assert_same(got, want, what)


def _where(err: BaseException) -> str:
    frame = traceback.extract_tb(err.__traceback__)[-1]
    return f"{frame.filename.rsplit('/', 2)[-2:]}:{frame.lineno}"


def _call(module: torch.nn.Module, example: tuple) -> Any:
    args, kwargs = copy.deepcopy(example)
    return module(*args, **kwargs), (args, kwargs)


def _assert_same(got: Any, want: Any, what: str) -> None:
    spec_g, spec_w = pytree.tree_structure(got), pytree.tree_structure(want)
    assert spec_g == spec_w, f"{what}: output structure {spec_g} != {spec_w}"
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), f"{what}: {type(g).__name__} for a tensor"
            torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m: f"{what}: {m}")
        else:
            assert g == w, f"{what}: {g!r} != {w!r}"


@settings(max_examples=max(1, settings.default.max_examples))  # ci: 100; nightly: 1000
@given(st.data())
def test_corrupted_programs_raise_a_purefx_error_or_match(data):
    """Derandomized under the ``ci`` profile (about 20 s); ``HYPOTHESIS_PROFILE=nightly`` runs
    ten times as many examples."""
    name = data.draw(st.sampled_from(FIXTURES), label="program")
    original = fixture_ep(name)
    bad = copy.deepcopy(original)
    corruption = data.draw(st.sampled_from(CORRUPTIONS), label="corruption")
    try:
        what = f"{name}: " + corruption(bad, data.draw)
    except (TypeError, ValueError, RuntimeError):  # torch itself refuses to build this one
        reject()
    check_corrupted(bad, what)
    assert ep_fingerprint(original) == FINGERPRINTS[name], "the fixture program was changed"
