"""The torch seams: every private torch symbol purefx uses behaves as purefx expects, and no
module outside ``ir/torch_seam.py`` and ``lowering/lowering_seam.py`` reaches a private torch symbol.

One test per symbol (run on whichever torch is installed: 2.13, 2.14 or 2.15), then the source
scan, then the IR's own pytree functions standing in for torch's as node targets.
"""

from __future__ import annotations

import ast
import inspect
import logging
import operator
import pathlib
import re
import threading

import pytest
import torch
from torch import nn
from zoo import CASES, export_case

import ir.torch_seam as ir_seam
from ir import import_ep
from ir.node import CALL_FUNCTION
from ir.tree_calls import flatten_by_spec, own_equivalent, torch_equivalent, unflatten_tree
from lowering import lower, lowering_seam
from lowering.export import export_ep
from transforms import transform

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("ir", "transforms", "lowering")
SEAMS = {pathlib.Path("ir/torch_seam.py"), pathlib.Path("lowering/lowering_seam.py")}
aten = torch.ops.aten
pytree = ir_seam.pytree


# --- ir/torch_seam.py ---------------------------------------------------------------------------


def _used_pytree_names() -> set[str]:
    """Every ``pytree.<name>`` the library reads (so this list cannot go stale)."""
    used = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _chain(node.value) == ["pytree"]:
                used.add(node.attr)
    return used


def test_pytree_has_every_function_purefx_calls():
    used = _used_pytree_names()
    assert {"tree_map", "tree_unflatten", "TreeSpec"} <= used
    assert [n for n in sorted(used) if not hasattr(pytree, n)] == []


def test_pytree_round_trip_keys_and_spec_fields():
    tree = ((1, [2, 3]), {"b": 4, "a": 5})
    leaves, spec = pytree.tree_flatten(tree)
    assert leaves == [1, 2, 3, 4, 5] and pytree.tree_unflatten(leaves, spec) == tree
    assert isinstance(spec, ir_seam.TreeSpec) and spec.num_leaves == 5 and spec.num_children == 2
    assert spec.child(1).context == ["b", "a"]
    assert pytree.tree_structure(tree) == spec and pytree.tree_leaves(tree) == leaves
    assert pytree.TreeSpec(tuple, None, [pytree.treespec_leaf()]) == pytree.tree_structure((0,))
    paths = [p for p, _ in pytree.tree_flatten_with_path(tree)[0]]
    assert paths[3] == (pytree.SequenceKey(idx=1), pytree.MappingKey(key="b"))
    assert pytree.GetAttrKey(name="w").name == "w"
    assert pytree.tree_map(lambda x: x + 1, [1, (2,)]) == [2, (3,)]


def test_operator_classes():
    assert isinstance(aten.add.Tensor, ir_seam.OpOverload)
    assert isinstance(aten.add, ir_seam.OpOverloadPacket)
    assert isinstance(torch.ops.higher_order.cond, ir_seam.HigherOrderOperator)
    assert not isinstance(operator.add, ir_seam.OpOverload)


def test_torch_tree_flatten_spec_reads_dicts_by_the_spec_keys():
    spec = pytree.tree_structure({"a": 0, "b": 0})
    assert ir_seam.torch_tree_flatten_spec({"b": 2, "a": 1}, spec) == [1, 2]


def test_op_schema():
    assert ir_seam.op_schema(aten.add_.Tensor).is_mutable
    assert not ir_seam.op_schema(aten.add.Tensor).is_mutable
    assert [a.name for a in ir_seam.op_schema(aten.add.Tensor).arguments] == [
        "self", "other", "alpha",
    ]
    assert ir_seam.op_schema(operator.add) is None
    assert ir_seam.op_schema(torch.ops.higher_order.cond) is None


def test_packet_name():
    assert ir_seam.packet_name(aten.add) == "aten::add"


def test_has_effects():
    assert ir_seam.has_effects(aten._print.default)
    assert not ir_seam.has_effects(aten.add.Tensor)


def test_torch_side_effectful():
    assert ir_seam.torch_side_effectful(torch._assert)
    assert not ir_seam.torch_side_effectful(aten.add.Tensor)
    assert not ir_seam.torch_side_effectful([])  # unhashable: not in the set


def test_module_tables_are_the_live_tables():
    m = nn.Linear(2, 2)
    m.register_buffer("kept", torch.ones(1))
    m.register_buffer("scratch", torch.ones(1), persistent=False)
    m.child = nn.ReLU()
    assert list(ir_seam.module_parameters(m)) == ["weight", "bias"]
    assert list(ir_seam.module_buffers(m)) == ["kept", "scratch"]
    assert ir_seam.non_persistent_buffers(m) == {"scratch"}
    assert ir_seam.module_children(m) == {"child": m.child}
    ir_seam.module_buffers(m)["late"] = torch.zeros(1)  # writing the table registers
    assert "late" in dict(m.named_buffers()) and "late" in m.state_dict()


def test_graph_codegen():
    plain = torch.fx.symbolic_trace(nn.ReLU())
    assert type(ir_seam.graph_codegen(plain.graph)) is torch.fx.graph.CodeGen
    graph, codegen = torch.fx.Graph(), torch.fx.graph.CodeGen()
    graph.set_codegen(codegen)
    assert ir_seam.graph_codegen(graph) is codegen


def test_tensor_version_counts_writes():
    t = torch.zeros(2)
    before = ir_seam.tensor_version(t)
    t.add_(1)
    assert ir_seam.tensor_version(t) == before + 1


def _failing_fake_mm() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    a, b = mode.from_tensor(torch.ones(2, 3)), mode.from_tensor(torch.ones(4, 5))
    with pytest.raises(RuntimeError), mode:
        torch.mm(a, b)


def test_new_fake_mode_makes_fake_tensors_that_run_ops_without_a_meta_kernel():
    mode, other = ir_seam.new_fake_mode(), ir_seam.new_fake_mode()
    assert mode is not other
    with mode:
        x = torch.empty(2, 3)
        y = torch.ops.aten.fake_quantize_per_tensor_affine.default(x, 0.1, 0, -128, 127)
    assert x.fake_mode is mode and x.device.type == "cpu" and y.shape == (2, 3)
    with pytest.raises(NotImplementedError):  # what a meta val did instead
        torch.ops.aten.fake_quantize_per_tensor_affine.default(
            torch.empty(2, 3, device="meta"), 0.1, 0, -128, 127)


def test_purefx_fake_modes_take_a_real_constant_as_torch_exports_does():
    """AOTInductor compiles an ``ExportedProgram`` under the mode of its placeholders' vals,
    meeting ``ep.constants`` as real tensors: purefx's modes (generated and parsed programs,
    symbolic sizes, ``export_ep``'s propagation) take them as ``torch.export``'s mode does."""

    class WithConstant(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.arange(4.0)  # a tensor constant

        def forward(self, x):
            return x * self.c

    ep = torch.export.export(WithConstant(), (torch.ones(3, 4),))
    exports = next(n.meta["val"].fake_mode for n in ep.graph.nodes if n.op == "placeholder")
    ours = [ir_seam.new_fake_mode(), ir_seam.new_symbolic_size("b", 3, 2, 8)[0]]
    for mode in [exports, *ours]:
        assert mode.allow_non_fake_inputs
        fake = mode.from_tensor(torch.ones(3, 4))
        with mode:
            out = fake * torch.arange(4.0)  # a real constant met with a fake value
        assert type(out).__name__ == "FakeTensor" and tuple(out.shape) == (3, 4)


def test_new_symbolic_sizes_makes_the_named_symbols_with_their_hints_and_ranges():
    mode, sizes, ranges = ir_seam.new_symbolic_sizes(
        [("s26", 3, 0, None), ("s7", 4, 2, 9), ("u0", None, 0, None)])
    s26, s7 = sizes["s26"], sizes["s7"]
    assert isinstance(s26, torch.SymInt) and not isinstance(sizes["u0"], torch.SymInt)
    # the symbols equal a shape env's own of the same name (``torch.export``'s, the strategies')
    _, batch, theirs = ir_seam.new_symbolic_size("batch", 3, 3, 9)
    assert str(batch) == "s26" and next(iter(theirs)) == next(iter(ranges))
    assert {str(k): (str(v.lower), str(v.upper)) for k, v in ranges.items()} == {
        "s26": ("0", "int_oo"), "s7": ("2", "9"), "u0": ("0", "int_oo")}
    assert ir_seam.size_symbols(s26 * s7) == {"s26": (3, 2, ir_seam.size_symbols(s26)["s26"][2]),
                                              "s7": (4, 2, 9)}
    assert ir_seam.size_symbols(3) == {}
    with mode:
        t = torch.empty((s26, 4))
    assert str(t.view(-1).shape[0]) == "4*s26" and t.view(-1).shape[0].node.hint == 12
    for bad in ([("x1", 2, 2, 4)], [("s1", 2, 2, 4), ("s1", 2, 2, 4)], [("s1", 5, 2, 4)],
                [("u1", 3, 0, None)], [("s1", None, 0, 1)]):
        with pytest.raises(ValueError, match="s1|x1|u1"):
            ir_seam.new_symbolic_sizes(bad)


def test_fake_failures_unlogged_keeps_torchs_traceback_off_the_log(caplog):
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    with caplog.at_level(logging.ERROR):
        _failing_fake_mm()  # torch logs the failed meta kernel: the logger the seam names
        assert [r.name for r in caplog.records] == [logger.name]
        caplog.clear()
        with ir_seam.fake_failures_unlogged():
            _failing_fake_mm()
            assert not caplog.records
            other = threading.Thread(target=_failing_fake_mm)  # another thread: logged
            other.start()
            other.join(timeout=60)
            assert [r.name for r in caplog.records] == [logger.name]
    assert not logger.filters  # the filter is gone after the block


# --- lowering/lowering_seam.py ---------------------------------------------------------------------


def test_refusing_new_guards_raises_before_the_shape_env_changes(caplog):
    from torch.export import Dim

    ep = torch.export.export(torch.nn.ReLU(), (torch.randn(5, 4),),
                             dynamic_shapes=({0: Dim("b", min=2, max=32)},))
    val = next(n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder")
    env = val.fake_mode.shape_env
    guards, replacements, frozen = len(env.guards), dict(env.replacements), env.frozen
    with ir_seam.guard_failures_unlogged(), ir_seam.refusing_new_guards(env):
        assert val.shape[0] >= 2  # the range proves it: no guard
        with pytest.raises(ir_seam.ShapeEnvGuardError, match="frozen: .*== 5"):
            int(val.shape[0])
    assert (len(env.guards), dict(env.replacements)) == (guards, replacements)
    assert "failed during evaluate_expr" not in caplog.text
    assert env.frozen == frozen  # the flags are put back
    assert ep.module()(torch.randn(9, 4)).shape == (9, 4)


def test_get_keystr():
    path = (pytree.SequenceKey(0), pytree.SequenceKey(1), pytree.MappingKey("x"))
    assert lowering_seam.get_keystr(path) == "*args[1]['x']"


def test_verifiers():
    assert lowering_seam.Verifier.dialect == "ATEN"
    assert lowering_seam.TrainingIRVerifier.dialect == "TRAINING"
    assert issubclass(lowering_seam.TrainingIRVerifier, lowering_seam.Verifier)


def test_fake_tensors_and_their_mode():
    mode = lowering_seam.FakeTensorMode()
    fake = mode.from_tensor(torch.ones(2, 3))
    assert isinstance(fake, lowering_seam.FakeTensor) and fake.shape == (2, 3)
    assert lowering_seam.detect_fake_mode([fake]) is mode
    assert lowering_seam.detect_fake_mode([torch.ones(1)]) is None


def test_is_fx_symbolic_tracing():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(lowering_seam.is_fx_symbolic_tracing())
            return x

    torch.fx.symbolic_trace(Probe())
    Probe()(torch.ones(1))
    assert seen == [True, False]


def test_jit_tracing():
    seen = []

    def f(x):
        seen.append(lowering_seam.jit_tracing())
        return x + 1

    torch.jit.trace(f, (torch.ones(1),), check_trace=False)
    f(torch.ones(1))
    assert seen == [True, False]


def test_global_module_hooks_set():
    assert not lowering_seam.global_module_hooks_set()
    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        assert lowering_seam.global_module_hooks_set()
    finally:
        handle.remove()
    assert not lowering_seam.global_module_hooks_set()


def test_global_registration_hooks_set():
    assert not lowering_seam.global_registration_hooks_set()
    register = nn.modules.module.register_module_buffer_registration_hook
    handle = register(lambda m, name, value: None)
    try:
        assert lowering_seam.global_registration_hooks_set()
    finally:
        handle.remove()
    assert not lowering_seam.global_registration_hooks_set()


def test_extract_tensor_metadata():
    meta = lowering_seam.extract_tensor_metadata(torch.ones(2, 3, dtype=torch.float64))
    assert tuple(meta.shape) == (2, 3) and meta.dtype == torch.float64


def test_eval_frame_functions():
    assert lowering_seam.eval_frame_callback() is None  # not inside torch.compile
    prior = lowering_seam.set_eval_frame(None)
    assert lowering_seam.set_eval_frame(prior) is None


def test_run_frame_eagerly_skips_the_frame_and_compiles_its_callees():
    seen = []

    def inner(x):
        seen.append(("inner", torch.compiler.is_compiling()))
        return x * 2

    def outer(x):
        seen.append(("outer", torch.compiler.is_compiling()))
        return inner(x) + 1

    lowering_seam.run_frame_eagerly(outer.__code__)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(outer, backend="eager")(torch.ones(2)), torch.full((2,), 3.0))
    assert seen == [("outer", False), ("inner", True)]


def test_script_object_type_name():
    scripted = torch.jit.script(nn.ReLU())
    obj = scripted._c  # the one way to get a ScriptObject without a custom class
    assert lowering_seam.script_object_type_name(obj).endswith("ReLU")


def test_sync_parameter_list():
    plist = nn.ParameterList()
    ir_seam.module_parameters(plist)["0"] = nn.Parameter(torch.ones(1))
    lowering_seam.sync_parameter_list(plist)
    assert len(plist) == 1
    plist.append(nn.Parameter(torch.zeros(1)))
    assert len(plist) == 2 and list(ir_seam.module_parameters(plist)) == ["0", "1"]


def test_new_parameter_is_the_parameter_torch_makes():
    for requires_grad in (True, False):
        data = torch.arange(4.0)
        made, built = lowering_seam.new_parameter(data, requires_grad), nn.Parameter(data, requires_grad)
        assert type(made) is type(built) is nn.Parameter
        assert made.requires_grad == built.requires_grad == requires_grad
        assert made.data_ptr() == built.data_ptr() == data.data_ptr() and made is not data
        assert made.grad_fn is None and made.is_leaf and made.__dict__ == built.__dict__


def test_init_module_state_sets_what_module_init_sets():
    class Plain(nn.Module):
        pass

    made, built = Plain.__new__(Plain), nn.Module()
    lowering_seam.init_module_state(made)
    assert list(made.__dict__) == list(built.__dict__)
    assert {k: v for k, v in made.__dict__.items()} == built.__dict__
    again = Plain.__new__(Plain)
    lowering_seam.init_module_state(again)
    shared = [k for k, v in made.__dict__.items() if v is again.__dict__[k] and v is not None]
    assert all(type(made.__dict__[k]) is bool for k in shared)  # no table or hook dict shared
    made.register_buffer("b", torch.ones(1))
    made.child = nn.ReLU()
    assert [n for n, _ in made.named_buffers()] == ["b"] and list(made.children()) == [made.child]
    assert list(again.named_buffers()) == [] and list(again.children()) == []


def test_module_table_names():
    m = nn.Linear(2, 2)
    m.register_buffer("scratch", torch.ones(1), persistent=False)
    m.child = nn.ReLU()
    assert m.__dict__[lowering_seam.PARAMETER_TABLE] is ir_seam.module_parameters(m)
    assert m.__dict__[lowering_seam.BUFFER_TABLE] is ir_seam.module_buffers(m)
    assert m.__dict__[lowering_seam.MODULE_TABLE] is ir_seam.module_children(m)
    assert m.__dict__[lowering_seam.NON_PERSISTENT_BUFFERS] == {"scratch"}


def test_interpreter_flag_is_the_one_torch_sets():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def forward(self, x):
            return self.inner(x)

    ep = torch.export.export(Two(), (torch.ones(1, 2),))
    unflat = torch.export.unflatten(ep)
    flag = lowering_seam.INTERPRETER_FLAG
    assert isinstance(getattr(unflat, flag), bool)
    assert isinstance(getattr(unflat.inner, flag), bool)


class _Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.d, self.b = nn.Linear(4, 4), nn.Dropout(0.1), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.d(self.a(x)))


def test_decompositions_drop_eval_dropout_says_what_torch_does():
    ep = torch.export.export(
        _Dropping().eval(), (torch.ones(2, 4),), preserve_module_call_signature=("b",)
    )
    assert [e.signature.inputs[0].name for e in ep.module_call_graph if e.fqn == "b"] == [
        "dropout"
    ]
    if lowering_seam.decompositions_drop_eval_dropout():
        with pytest.raises(Exception, match="Input dropout does not exist in the graph"):
            ep.run_decompositions()
    else:
        decomposed = ep.run_decompositions()
        (entry,) = [e for e in decomposed.module_call_graph if e.fqn == "b"]
        assert entry.signature.inputs[0].name == "clone"


# --- every seam symbol documented ---------------------------------------------------------------


@pytest.mark.parametrize("seam", [ir_seam, lowering_seam], ids=["ir", "lowering"])
def test_every_seam_symbol_says_what_it_is_for_and_how_versions_differ(seam):
    text = inspect.getsource(seam)
    for name in seam.__all__:
        value = getattr(seam, name)
        own = inspect.isfunction(value) and value.__module__ == seam.__name__
        said = value.__doc__ if own else _comment_about(text, name)
        assert said, f"{seam.__name__}.{name} is not documented"
        assert re.search(r"2\.1[345]", said), f"{seam.__name__}.{name}: no torch version named"


def _comment_about(text: str, name: str) -> str:
    """The ``# - name ...`` comment (with its continuation lines) or the comment block above
    ``name = ...`` that documents a re-exported name."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# - ") and re.search(rf"\b{re.escape(name)}\b", line.split(":")[0]):
            block = [line]
            for nxt in lines[i + 1:]:
                if not nxt.startswith("#   "):
                    break
                block.append(nxt)
            return "\n".join(block)
        if re.match(rf"{re.escape(name)}\s*=", line):
            block = []
            for prev in reversed(lines[:i]):
                if not (prev.startswith("#") or re.match(r"[A-Z_]+ = ", prev)):
                    break
                block.append(prev)
            return "\n".join(block)
    return ""


# --- the source scan ----------------------------------------------------------------------------

# Private fields of torch objects (nn.Module, Tensor, OpOverload, fx.Graph, ScriptObject,
# ParameterList) that purefx has needed: read only in the seams.
_TORCH_PRIVATE_FIELDS = frozenset(
    {
        "_schema", "_qualified_op_name", "_modules", "_parameters", "_buffers",
        "_non_persistent_buffers_set", "_codegen", "_version", "_size", "_type",
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_state_dict_hooks",
    }
)


def _sources() -> list[pathlib.Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _chain(node: ast.AST) -> list[str] | None:
    """``torch.a.b`` as ``["torch", "a", "b"]``; ``None`` when not a plain dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _torch_aliases(tree: ast.AST) -> dict[str, list[str]]:
    """Local name -> the torch path it is bound to (``import torch.nn.modules.module as m``)."""
    aliases = {"torch": ["torch"]}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    aliases[a.asname or "torch"] = a.name.split(".") if a.asname else ["torch"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                aliases[a.asname or a.name] = [*node.module.split("."), a.name]
    return aliases


def private_torch_uses(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each private torch symbol ``source`` imports or reads: a private
    module or name in an import from torch, a private attribute of a torch path (through any
    alias; ``torch.ops.<ns>.<op>`` names are operators, not private symbols), and the private
    fields of torch objects in ``_TORCH_PRIVATE_FIELDS`` (read as attributes or by name)."""
    tree = ast.parse(source)
    found = []
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    aliases = _torch_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "torch" and any(map(_private, parts)):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "torch" and (
                any(map(_private, parts)) or any(_private(a.name) for a in node.names)
            ):
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Attribute):
            parts = _chain(node)
            if parts and parts[0] in aliases:
                path = aliases[parts[0]] + parts[1:]
                if path[1:2] != ["ops"] and _private(node.attr):
                    found.append((node.lineno, ".".join(path)))
                    continue
            if node.attr in _TORCH_PRIVATE_FIELDS:
                on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
                if not (on_self and id(node) in called):  # a purefx method of that name
                    found.append((node.lineno, f"<object>.{node.attr}"))
        elif _reads_by_name(node):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return sorted(set(found))


def _reads_by_name(node: ast.AST) -> bool:
    """Whether ``node`` is ``getattr``/``hasattr``/``setattr`` of a private torch field."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in _TORCH_PRIVATE_FIELDS
    )


def test_the_scan_finds_each_kind_of_private_use():
    source = """
import torch.utils._pytree as pytree
from torch._ops import OpOverload
from torch.fx.passes.shape_prop import _extract_tensor_metadata
x = torch._C._get_tracing_state()
y = op._schema
z = getattr(op, '_schema', None)
w = torch.ops.aten._to_copy.default  # an operator name: allowed
v = self._modules(1)  # a purefx method of the same name: allowed
"""[1:]
    assert sorted({line for line, _ in private_torch_uses(source)}) == [1, 2, 3, 4, 5, 6]
    aliased = "import torch.nn.modules.module as m\nhooks = m._global_forward_hooks"
    assert [line for line, _ in private_torch_uses(aliased)] == [2]


def test_no_module_outside_the_seams_uses_a_private_torch_symbol():
    offenders = []
    for path in _sources():
        rel = path.relative_to(ROOT)
        if rel in SEAMS:
            continue
        offenders += [f"{rel}:{line}: {what}" for line, what in private_torch_uses(path.read_text())]
    assert offenders == [], "use ir/torch_seam.py or lowering/lowering_seam.py:\n" + "\n".join(
        offenders
    )


# --- purefx's own pytree functions as node targets ----------------------------------------------


def test_tree_calls_behave_like_torchs():
    tree = ((1, [2]), {"b": 3, "a": 4})
    spec = pytree.tree_structure(tree)
    assert unflatten_tree((1, 2, 3, 4), spec) == tree
    assert flatten_by_spec({"a": 4, "b": 3}, spec.child(1)) == [3, 4]
    assert flatten_by_spec(tree, spec) == pytree.tree_leaves(tree)
    assert torch_equivalent(flatten_by_spec) is ir_seam.torch_tree_flatten_spec
    assert torch_equivalent(unflatten_tree) is pytree.tree_unflatten
    assert own_equivalent(pytree.tree_unflatten) is unflatten_tree
    assert own_equivalent(operator.getitem) is operator.getitem
    assert torch_equivalent([]) == []  # unhashable: left as it is


def _function_targets(program) -> set:
    return {
        n.target
        for m in program.module_table().values()
        for g in m.graphs
        for n in g.nodes
        if n.op == CALL_FUNCTION and not isinstance(n.target, (ir_seam.OpOverload, str))
    }


def test_ir_holds_purefx_pytree_functions_and_lowering_torchs():
    case = CASES["preserve_nested"]
    ep = export_case(case)
    p = transform(import_ep(ep))
    targets = _function_targets(p)
    assert {flatten_by_spec, unflatten_tree} <= targets
    private = [
        t for t in targets
        if any(map(_private, (getattr(t, "__module__", "") or "").split(".")))
        and getattr(t, "__module__", "").startswith("torch")
    ]
    assert private == []
    lowered = lower(p)
    fx_targets = {
        n.target for m in lowered.modules() if isinstance(getattr(m, "graph", None), torch.fx.Graph)
        for n in m.graph.nodes if n.op == "call_function"
    }
    assert ir_seam.torch_tree_flatten_spec in fx_targets  # what torch's own tools look for
    assert flatten_by_spec not in fx_targets and unflatten_tree not in fx_targets
    out = export_ep(p)
    assert not {flatten_by_spec, unflatten_tree} & {n.target for n in out.graph.nodes}


def test_fresh_fake_has_the_metadata_and_a_storage_of_its_own():
    mode = ir_seam.new_fake_mode()
    like = mode.from_tensor(torch.ones(4, 6)).t()
    made = ir_seam.fresh_fake(like)
    assert made.fake_mode is like.fake_mode and made.device == like.device
    assert made.shape == like.shape and made.stride() == like.stride() == (1, 6)
    assert made.dtype == like.dtype and made.storage_offset() == 0
    assert ir_seam.storage_identity(made) != ir_seam.storage_identity(like)
    with mode:
        assert (made @ torch.ones(4, 2)).shape == (6, 2)  # it runs in the mode as any other
