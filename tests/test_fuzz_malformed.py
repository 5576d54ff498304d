"""Malformed programs get a purefx error, at import or ``verify``, never a raw Python error.

Example tests for each class of corruption, then a hypothesis fuzzer that corrupts copies of real
exported programs and checks that each either raises a ``PurefxError`` (from ``import_ep``,
``transform``, ``lower`` or the first call) or lowers to a module that matches ``ep.module()``.
"""

from __future__ import annotations

import copy
import functools
import io
import operator
import struct
import traceback
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from torch.export import graph_signature as gs
from zoo import CASES, ep_fingerprint, fresh_export  # tests/ is on sys.path (conftest)

import ir
from ir import (
    LoadError,
    LoweringError,
    PurefxError,
    UnsupportedProgramError,
    import_ep,
    load_program,
)
from ir.module_names import RESERVED_NAMES
from lowering import cli, export_ep, lower
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


def _corrupt_names(ep, draw) -> str:
    return corrupt_names(ep, draw)  # defined with the name tests below


CORRUPTIONS = (corrupt_meta, corrupt_node, corrupt_signature, corrupt_call_graph, corrupt_state,
               _corrupt_names)


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


# --- names that collide with nn.Module's own attributes ------------------------------------------
# torch's register_buffer / register_parameter / add_module refuse any name that is already an
# attribute of the module; writing the tables directly would shadow it silently. Every such name,
# as a state name, a step of a state path, or a step of a module path, is refused at import (and
# by ``verify`` for a Program built directly), naming the fqn and how to rename it.

MODULE_NAMES = sorted(RESERVED_NAMES)
# a sample that always runs in CI: a method, a flag, dunders, the tables, a class attribute
NAME_SAMPLE = ("forward", "training", "__class__", "_modules", "_parameters", "state_dict",
               "T_destination", "__dict__")


def _rename_state(ep, old: str, new: str) -> None:
    ep._state_dict = {(new if k == old else k): v for k, v in ep._state_dict.items()}
    specs = ep.graph_signature.input_specs
    for i, spec in enumerate(specs):
        if spec.target == old:
            specs[i] = _with(spec, target=new)


def _with_name_at(ep, name: str, where: str) -> str:
    """Put ``name`` into the program at ``where``; return the fqn it made."""
    fqn = _parameter(ep)  # 'lin.weight'-like: at least one module step
    owner, _, leaf = fqn.rpartition(".")
    if where == "state":
        new = f"{owner}.{name}" if owner else name
    elif where == "root state":
        new = name
    else:  # a module step of the path
        new = f"{name}.{leaf}"
    _rename_state(ep, fqn, new)
    return new


@pytest.mark.parametrize("where", ["state", "root state", "module step"])
@pytest.mark.parametrize("name", NAME_SAMPLE)
def test_state_named_like_a_module_attribute_fails_at_import(name, where):
    bad = copy.deepcopy(fixture_ep("param_zoo"))
    fqn = _with_name_at(bad, name, where)
    with pytest.raises(UnsupportedProgramError, match=f"state {fqn!r}: the name {name!r} is an "
                       "attribute of every nn.Module.*rename it"):
        import_ep(bad)


@pytest.mark.slow
@pytest.mark.nightly  # every name of dir(nn.Module()); NAME_SAMPLE runs by default
@pytest.mark.parametrize("name", MODULE_NAMES)
def test_every_module_attribute_name_fails_at_import(name):
    for where in ("state", "module step"):
        bad = copy.deepcopy(fixture_ep("param_zoo"))
        _with_name_at(bad, name, where)
        with pytest.raises(UnsupportedProgramError, match="attribute of every nn.Module"):
            import_ep(bad)


@settings(max_examples=max(1, settings.default.max_examples // 4))
@given(name=st.sampled_from(MODULE_NAMES), where=st.sampled_from(["state", "child"]))
def test_verify_refuses_module_attribute_names_in_a_program(name, where):
    """The same class on a Program built directly (no ExportedProgram to check): ``verify`` (and
    so ``lower``) names it."""
    p = import_ep(fixture_ep("preserve_nested"))
    if where == "state":
        fqn = p.state_order[0]
        new = f"{fqn.rpartition('.')[0]}.{name}".lstrip(".")
        slot = p.state[fqn]
        p = p.replace(state=p.state.remove(fqn).set(new, slot),
                      state_order=tuple(new if f == fqn else f for f in p.state_order))
    else:
        root = p.modules[p.root]
        (_, mid), *rest = root.children
        p = p.replace(modules=p.modules.set(p.root, root.replace(children=((name, mid), *rest))))
    with pytest.raises(ir.VerifyError, match=f"the name {name!r} is an attribute of every"):
        ir.verify(p)
    with pytest.raises(ir.VerifyError):
        lower(p)


@pytest.mark.parametrize("name", ["graph", "type_name", "print_readable", "_plan", "_direct"])
def test_names_of_the_lowered_classes_raise_a_lowering_error(name):
    """Legal in eager, but purefx's lowered module (or root) has its own attribute of that name:
    ``lower`` refuses it naming the fqn instead of a raw KeyError or a silent shadow."""
    bad = copy.deepcopy(fixture_ep("param_zoo"))
    _rename_state(bad, _buffer(bad), name)
    program = transform(import_ep(bad))
    with pytest.raises(LoweringError, match=f"'{name}'.*has its own attribute '{name}'"):
        lower(program)
    export_ep(program)  # an ExportedProgram can hold the name


def corrupt_names(ep, draw) -> str:
    """A state fqn or a module path step renamed to an attribute of every ``nn.Module``."""
    name = draw(st.sampled_from(MODULE_NAMES))
    table = ep._state_dict or ep._constants
    if not table:
        return "no state"
    fqn = _pick(draw, list(table))
    steps = fqn.split(".")
    steps[draw(st.integers(0, len(steps) - 1))] = name
    new = ".".join(steps)
    _rename_state(ep, fqn, new)
    ep._constants = {(new if k == fqn else k): v for k, v in ep._constants.items()}
    return f"state {fqn} renamed {new}"


# --- node kinds ----------------------------------------------------------------------------------
# Export IR holds placeholder, get_attr, call_function and output nodes only. Any other op, on any
# node of an exported program, fails at import; on a Program built directly, ``verify`` or
# ``lower`` names the node, or the program runs as fx would run it.

NOT_EXPORTED = ("call_module", "call_method", "bogus", "", None)


@pytest.mark.parametrize("op", NOT_EXPORTED)
def test_node_kinds_export_never_has_fail_at_import(op):
    bad = copy.deepcopy(fixture_ep("param_zoo"))
    node = _first_node(bad)
    node.op, node.target = op, "lin"
    with pytest.raises(UnsupportedProgramError, match=f"node {node.name!r}"):
        import_ep(bad)


TARGETS = ("lin", "lin.weight", "nope", "", "a..b", "relu", "forward", 3, None,
           torch.relu, torch.ops.aten.relu.default)


@settings(max_examples=max(1, settings.default.max_examples // 2))
@given(st.data())
def test_every_op_and_target_on_a_program_raises_a_purefx_error_or_runs(data):
    """Any op (``ir.node.OPS`` and unknown strings) with any target on any node of an imported
    Program: ``verify``, ``transform``, ``lower`` and the call raise a purefx error, or the call
    raises what Python raises for the same node in fx (a method the tensor does not have)."""
    p = import_ep(fixture_ep("param_zoo"))
    root = p.modules[p.root]
    nodes = list(root.graph.nodes)
    i = data.draw(st.integers(0, len(nodes) - 1), label="node")
    op = data.draw(st.sampled_from([*ir.node.OPS, "bogus"]), label="op")
    target = data.draw(st.sampled_from(TARGETS), label="target")
    nodes[i] = nodes[i].replace(op=op, target=target)
    bad = p.replace(modules=p.modules.set(p.root, root.replace(graphs=(ir.Graph(tuple(nodes)),))))
    example = fixture_ep("param_zoo").example_inputs
    try:
        ir.verify(bad)
        module = lower(transform(bad))
        _call(module, example)
    except PurefxError:
        return
    except AttributeError as err:  # fx runs a method of the name the node gives
        assert op == "call_method", f"{op}[{target!r}]: {err!r}"
    except (TypeError, RuntimeError) as err:  # an operator given arguments its schema refuses:
        # torch raises this for the same fx node (import_ep checks schemas; verify does not)
        assert op in ("call_method", "call_function"), f"{op}[{target!r}]: {err!r}"


# --- damaged .pt2 archives -----------------------------------------------------------------------
# Every member of a real saved program, damaged in its data (CRC), in each field of its local
# header that a reader uses, or cut off, gives a LoadError from ``ir.load_program`` (with and
# without ``trust``) and one line with exit status 2 from the CLI, never a raw zipfile error or a
# silently wrong weight.

_HEADER_FIELDS = {0: "magic", 6: "flags", 8: "method", 14: "crc", 18: "compressed size",
                  22: "size", 26: "name length", 28: "extra length"}


@functools.cache
def _saved_archive() -> bytes:
    buffer = io.BytesIO()
    torch.export.save(fixture_ep("param_zoo"), buffer)
    return buffer.getvalue()


def _damaged(data: bytes, member: int, how: str) -> bytes:
    info = zipfile.ZipFile(io.BytesIO(data)).infolist()[member]
    start = info.header_offset
    bad = bytearray(data)
    if how == "data":
        name_len, extra_len = struct.unpack("<HH", data[start + 26:start + 30])
        if not info.compress_size:
            return data[:start + 30]  # nothing to flip: cut the file there
        bad[start + 30 + name_len + extra_len + info.compress_size // 2] ^= 0xFF
    elif how == "cut":
        return data[:start + 15]
    elif how == "directory":
        directory = data.find(b"PK\x01\x02")
        for _ in range(member):
            directory = data.find(b"PK\x01\x02", directory + 4)
        bad[directory + 20] ^= 0x5A  # its compressed size
    else:
        bad[start + how] ^= 0x5A
    return bytes(bad)


_HOWS = ("data", "cut", "directory", *_HEADER_FIELDS)


def _member_count() -> int:
    return len(zipfile.ZipFile(io.BytesIO(_saved_archive())).infolist())


def _archive_cases() -> list[tuple[int, Any]]:
    return [(m, how) for m in range(_member_count()) for how in _HOWS]


def _assert_load_error(path) -> None:
    for trust in (False, True):
        with pytest.raises(LoadError):
            load_program(path, trust=trust)


@settings(max_examples=max(1, settings.default.max_examples // 5))
@given(member=st.integers(0, 63), how=st.sampled_from(_HOWS))
def test_a_damaged_member_gives_a_load_error(member, how, tmp_path_factory):
    member %= _member_count()
    path = tmp_path_factory.mktemp("pt2") / "bad.pt2"
    path.write_bytes(_damaged(_saved_archive(), member, how))
    _assert_load_error(path)


@pytest.mark.slow
def test_every_member_damaged_every_way_gives_a_load_error(tmp_path):
    for member, how in _archive_cases():
        path = tmp_path / f"bad_{member}_{how}.pt2"
        path.write_bytes(_damaged(_saved_archive(), member, how))
        _assert_load_error(path)


def test_a_weight_with_a_bad_crc_is_one_line_and_status_2_in_the_cli(tmp_path, capfd):
    """torch's own reader loads a weight whose bytes were flipped; purefx checks every CRC."""
    path = tmp_path / "bad.pt2"
    path.write_bytes(_damaged(_saved_archive(), 0, "data"))
    assert cli.main([str(path)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "is damaged" in err and "Traceback" not in err, err
