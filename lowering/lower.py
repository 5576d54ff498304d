"""``lower(program)``: the one place that builds torch objects from a Program."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.export import graph_signature as gs
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.unflatten import FlatArgsAdapter

from ir import signature as sg
from ir import state as st
from ir.devices import move_device_literals
from ir.errors import LoweringError, shorten
from ir.gcpause import gc_paused
from ir.module import LEAF, SUBGRAPH, Module, ModuleId, split_call_target
from ir.node import CALL_MODULE, GET_ATTR
from ir.program import Program, require_program
from ir.torch_seam import module_children, tensor_version
from ir.verify import verify
from lowering import tree_watch
from lowering.codegen import compile_graph, compiled, share_key, spec_constants, to_fx_graph
from lowering.direct import direct_function, locate
from lowering.hop_bodies import hold_body
from lowering.identifiers import check_graph
from lowering.leaf import finish_leaf, leaf_shell
from lowering.lowering_seam import (
    BUFFER_TABLE,
    MODULE_TABLE,
    NON_PERSISTENT_BUFFERS,
    PARAMETER_TABLE,
    global_registration_hooks_set,
    new_parameter,
    sync_parameter_list,
)
from lowering.meta import complete_meta
from lowering.modules import (
    HOLDER_CLASSES,
    LOWERED_CLASSES,
    LoweredDispatcher,
    LoweredModule,
    PlainHolder,
    SharedSignatures,
    build_lowered,
)
from lowering.root import LoweredRoot, RootPlan, attach_call_path, root_class
from lowering.unloaded import empty_like_on, is_meta, watch_loading


@gc_paused
def lower(
    program: Program,
    *,
    interpreter: bool = False,
    device: torch.device | str | None = None,
    flat_args_adapter: FlatArgsAdapter | None = None,
    share_state: bool = False,
) -> LoweredRoot:
    """Build an ``nn.Module`` tree from ``program``; ``program`` itself is left as it was.

    One torch module per ModuleId (shared ModuleIds become one object under every path), state
    registered at its fqns (copies of the Program's tensors, moved to ``device`` if given; tied
    state stays one tensor), and generated code for every graph. With ``device``, every device
    literal the export recorded (``torch.arange(n, device=x.device)`` traced on CPU, ``full``,
    ``zeros``, ``to(device)``, ...) runs on ``device`` too (``ir.devices``). State of a program
    exported on ``meta`` is made empty (uninitialized) on a non-meta ``device`` under its fqns;
    the module then raises ``UnloadedStateError`` naming the first fqn never loaded
    (``load_state_dict``, ``torch.distributed.checkpoint.load``) at its first call
    (``lowering.unloaded``) (``interpreter=True`` runs
    ``torch.fx.Interpreter`` instead). The root behaves like ``torch.export.unflatten``'s result.
    ``share_state=True`` registers new tensor objects over the Program's storage instead of
    copies (no second copy of a large model's weights, as torch's unflatten does); then in-place
    buffer updates and weight changes through the module reach the ``ExportedProgram`` too.
    Raises ``VerifyError`` for a malformed Program and ``LoweringError`` for one that cannot be
    built, for a ``device`` torch cannot use here, or for anything that is not a Program (an
    ``ExportedProgram``: ``import_ep`` it).
    """
    require_program(program, "lower")  # a LoweringError (NotAProgramError)
    verify(program)
    device = _usable_device(device)
    if device is not None:  # the device literals recorded at export run on ``device`` too
        program = move_device_literals(program, device)
    table = program.module_table()
    walked = list(program.walk())
    root = _build_root(program, interpreter, flat_args_adapter)
    objects: dict[ModuleId, torch.nn.Module] = {program.root: root}
    with_fx: list[LoweredModule] = []  # the modules built with fx graphs, in build order
    shared: dict[tuple, _Shared] = {}  # by the share keys of a module's graphs
    group_of: dict[ModuleId, _Shared] = {}
    for _, mid in walked:
        if mid not in objects:
            objects[mid], group = _build_module(table[mid], interpreter, with_fx, shared)
            if group is not None:
                group_of[mid] = group
    on_class: dict[tuple[type, str], bool] = {}  # hasattr(class, name), asked once per pair
    for mid, obj in objects.items():
        mod = table[mid]
        for name, child in mod.children:
            if table[child].kind == SUBGRAPH:
                hold_body(obj, name, objects[child])  # not a submodule of the eager model
            else:
                _check_free(obj, name, "submodule", mid, program, on_class)
                module_children(obj)[name] = objects[child]
        for name, peer in mod.peers:
            # held by reference, as an eager module keeps another in a plain attribute: outside
            # ``_modules``, so no ``named_modules()`` or ``state_dict()`` path goes through it
            obj.__dict__[name] = objects[peer]
    made_empty = _register_state(program, objects, device, share_state, walked, on_class)
    for mid, obj in objects.items():
        mod = table[mid]
        if mod.kind == LEAF:
            finish_leaf(obj, mod.leaf.value)
    root.__dict__["_device_probe"] = _device_probe(program)
    _complete_built_meta(with_fx)
    if not interpreter:
        _attach_direct_code(program, objects, group_of)
    attach_call_path(root)
    _check_unshadowed(program, objects)
    watch_loading(root, made_empty)
    return root


def _check_unshadowed(program: Program, objects: dict[ModuleId, torch.nn.Module]) -> None:
    """No parameter, buffer or child of a built module is hidden by a plain attribute that
    ``lower`` set on it later (``_direct``, ``_device_probe``, ...). O(state + children)."""
    for mid, obj in objects.items():
        attributes = obj.__dict__
        for table in (PARAMETER_TABLE, BUFFER_TABLE, MODULE_TABLE):
            for name in attributes[table]:
                if name in attributes:
                    path = program.first_path(mid) or ""
                    raise LoweringError(_taken_message(
                        obj, name, f"{(path + '.' if path else '') + name!r}"
                    ))


def _usable_device(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a ``torch.device``, after making one empty tensor there (a CPU build has
    no CUDA; an index may be past the last device)."""
    if device is None:
        return None
    try:
        found = torch.device(device)
        torch.empty(0, device=found)
    except Exception as err:  # noqa: BLE001 - torch raises Runtime/Assertion/TypeError here
        raise LoweringError(
            f"device {device!r} cannot be used by this torch build ({type(err).__name__}: "
            f"{shorten(' '.join(str(err).split()), 200)}); pass a device it has, e.g. 'cpu'"
        ) from None
    return found


# --- modules ------------------------------------------------------------------------------------


class _Shared:
    """What the graph-running modules whose graphs have equal share keys have in common, within
    one ``lower`` call: found for the first of them, then reused (a stack of N blocks computes
    it once, not N times).

    ``codes`` and ``constants``: each graph's compiled code and ``spec_constants``;
    ``classes``: the modules' classes, by module kind (``SharedSignatures``);
    ``reads``: the ``get_attr`` targets (``_read_targets``);
    ``direct``: the direct functions, by where the modules' reads resolve.
    """

    __slots__ = ("classes", "codes", "constants", "direct", "holds", "reads")

    def __init__(self, graphs: tuple, codes: list, constants: list[dict[str, Any]]) -> None:
        self.codes = codes
        self.constants = constants
        self.holds = any(constants)  # most graphs read no spec
        self.classes: dict[str, SharedSignatures] = {}
        self.reads = _read_targets(graphs)
        self.direct: dict[tuple, list] = {}


def _build_module(
    mod: Module,
    interpreter: bool,
    with_fx: list[LoweredModule],
    shared: dict[tuple, _Shared],
) -> tuple[torch.nn.Module, _Shared | None]:
    """The torch module for ``mod``, unwired, and what it shares with the modules of equal
    share keys (``None`` for a module without graphs). A graph whose share key was compiled
    before (``codegen.compiled``) reuses that code; ``shared`` maps the share keys of a module's graphs to
    their ``_Shared`` (only without ``interpreter``, where every module builds its fx graphs);
    a module built with fx graphs is appended to ``with_fx``."""
    if mod.kind == LEAF:
        return leaf_shell(mod.leaf.value), None
    graphs = mod.graphs
    if not graphs:
        return HOLDER_CLASSES.get(mod.kind, PlainHolder)(mod.type_name), None
    keys = tuple(map(share_key, graphs))
    group = None if interpreter else shared.get(keys)
    if group is not None:  # the codes and constants of every graph are known
        signatures = group.classes.get(mod.kind)
        if signatures is None:
            signatures = group.classes[mod.kind] = SharedSignatures(_base_class(mod), graphs)
        cls = signatures.class_of(graphs)
        made_module = build_lowered(
            cls, graphs, list(group.codes), mod.type_name, interpreter, [None] * len(graphs)
        )
        if group.holds:
            _hold_constants(made_module, group.constants)
        return made_module, group
    codes = []
    fx_graphs: list[torch.fx.Graph | None] = []
    constants: list[dict[str, Any]] = []
    for graph, key in zip(graphs, keys):
        check_graph(graph, f"module {mod.type_name or '(unnamed)'}")  # O(1) for a key seen before
        code = compiled(key)
        fx_graph = None
        if code is None or interpreter:
            fx_graph, made = to_fx_graph(graph)
            code = code or compile_graph(fx_graph, key)
            constants.append(made)
        else:
            constants.append(spec_constants(graph))
        codes.append(code)
        fx_graphs.append(fx_graph)
    made_module = _base_class(mod)(graphs, codes, mod.type_name, interpreter, fx_graphs)
    if fx_graphs.count(None) < len(fx_graphs):
        with_fx.append(made_module)
    if any(constants):  # most graphs read no spec
        _hold_constants(made_module, constants)
    if not interpreter:
        group = shared[keys] = _Shared(graphs, list(codes), constants)
    return made_module, group


def _base_class(mod: Module) -> type:
    """The lowered class for ``mod`` before its forward signature (``lowered_class``)."""
    dispatch = len(mod.graphs) > 1  # each caller names the graph it runs
    return LOWERED_CLASSES.get(mod.kind, LoweredDispatcher if dispatch else LoweredModule)


def _device_probe(program: Program) -> str | None:
    """The fqn of one parameter or buffer (a floating one if any), whose device and dtype the
    input checks compare with (``lowering.inputs.state_probe``)."""
    state, tensors = program.state_table(), program.tensor_table()
    found = None
    for fqn in program.state_order:
        slot = state[fqn]
        value = tensors[slot.tensor].value
        if slot.kind in (st.PARAMETER, st.BUFFER) and isinstance(value, torch.Tensor):
            if value.is_floating_point():
                return fqn
            found = found or fqn
    return found


def _complete_built_meta(modules: list[LoweredModule]) -> None:
    """Give the fx graphs built while the tree was not yet wired their owner and complete their
    meta (the others do both when built; see ``lowering/meta.py``)."""
    for obj in modules:
        for fx_graph, ir_graph in zip(obj.__dict__["_fx_graphs"], obj.__dict__["_ir_graphs"]):
            if fx_graph is not None:
                fx_graph.owning_module = obj
                complete_meta(fx_graph, ir_graph, obj)


def _hold_constants(owner: torch.nn.Module, per_graph: list[dict[str, Any]]) -> None:
    """Set the literal attributes (pytree specs) each graph reads; one name, one value."""
    for constants in per_graph:
        for name, value in constants.items():
            held = owner.__dict__.get(name)
            if held is not None and held != value:
                raise LoweringError(f"two graphs of one module need different {name!r}")
            owner.__dict__[name] = value


def dispatch_orders(program: Program) -> dict[ModuleId, tuple[int, ...]]:
    """For each called module, the graph variant each of its calls runs, in execution order.

    Follows ``call_module`` nodes from the root graph, depth first, as a call would run them; each
    call is visited once, so this is linear in the number of calls of the program.
    """
    orders: dict[ModuleId, list[int]] = {}

    def run(mid: ModuleId, variant: int) -> None:
        for node in program.module_table()[mid].graphs[variant].nodes:
            if node.op != CALL_MODULE:
                continue
            path, k = split_call_target(node.target)
            child = program.resolve(path, mid)
            if child is not None and program.module_table()[child].graphs:
                orders.setdefault(child, []).append(k)
                run(child, k)

    run(program.root, 0)
    return {mid: tuple(order) for mid, order in orders.items()}


def _build_root(
    program: Program, interpreter: bool, adapter: FlatArgsAdapter | None
) -> LoweredRoot:
    root = program.root_module
    spec = program.call_signatures.get("")
    raw = spec is None  # a graph without an export signature: the root runs it as it is
    check_graph(root.graph, "the root module")
    cls = LoweredRoot if raw else root_class(spec.in_spec, spec.forward_arg_names)
    made = cls(
        root.graph,
        None if raw else _root_plan(program),
        type_name=root.type_name,
        in_spec=None if raw else spec.in_spec,
        out_spec=None if raw else spec.out_spec,
        range_constraints=program.range_constraints.value,
        module_call_graph=_module_call_graph(program),
        flat_args_adapter=adapter,
        interpreter=interpreter,
    )
    _hold_constants(made, [spec_constants(root.graph)])
    return made


def _root_plan(program: Program) -> RootPlan:
    """State placeholders read module attributes, tokens are made fresh, user outputs are
    returned and mutation outputs become ``copy_`` into their buffer or input. Raises
    ``LoweringError`` for an output kind that cannot be lowered."""
    bound: dict[str, tuple] = {}
    for spec in program.signature.inputs:
        if spec.kind in sg.STATE_INPUT_KINDS:
            bound[spec.name] = ("state", spec.target)
        elif spec.kind == sg.TOKEN:
            bound[spec.name] = ("token",)
    outputs: list[tuple[str, Any]] = []
    for spec in program.signature.outputs:
        if spec.kind in (sg.USER_OUTPUT, sg.LOSS_OUTPUT):
            outputs.append(("return", None))
        elif spec.kind == sg.BUFFER_MUTATION:
            outputs.append(("copy_state", spec.target))
        elif spec.kind == sg.USER_INPUT_MUTATION:
            outputs.append(("copy_input", spec.target))
        elif spec.kind == sg.OUTPUT_TOKEN:
            outputs.append(("drop", None))
        else:
            raise LoweringError(
                f"output {spec.name!r} of kind {spec.kind!r} cannot be lowered; only user "
                "outputs, buffer and user-input mutations and tokens are supported"
            )
    return bound, tuple(outputs)


def _module_call_graph(program: Program) -> list[ModuleCallEntry]:
    entries = []
    signatures = dict(program.call_signatures)  # a plain dict: one lookup per call below
    for fqn in program.call_order:
        sig = signatures.get(fqn)
        entries.append(ModuleCallEntry(fqn=fqn, signature=torch_signature(sig) if sig else None))
    return entries


_ARG_CLASSES = {
    sg.TENSOR: gs.TensorArgument,
    sg.SYM_INT: gs.SymIntArgument,
    sg.SYM_FLOAT: gs.SymFloatArgument,
    sg.SYM_BOOL: gs.SymBoolArgument,
    sg.TOKEN_ARG: gs.TokenArgument,
}


def _torch_argument(arg: sg.ArgSpec) -> Any:
    if arg.kind == sg.CONSTANT:
        return gs.ConstantArgument(name=arg.name or "", value=arg.value)
    if arg.kind == sg.OBJECT:
        return gs.CustomObjArgument(name=arg.name, class_fqn="")
    return _ARG_CLASSES[arg.kind](name=arg.name)


def torch_signature(sig: sg.CallSignature) -> ModuleCallSignature:
    """A preserved call signature as torch's ``ModuleCallSignature`` (for an
    ``ExportedProgram``'s module call graph). O(inputs + outputs)."""
    return ModuleCallSignature(
        inputs=[_torch_argument(a) for a in sig.inputs],
        outputs=[_torch_argument(a) for a in sig.outputs],
        in_spec=sig.in_spec,
        out_spec=sig.out_spec,
        forward_arg_names=list(sig.forward_arg_names) if sig.forward_arg_names else None,
    )


# --- direct code ---------------------------------------------------------------------------------


def _attach_direct_code(
    program: Program,
    objects: dict[ModuleId, torch.nn.Module],
    group_of: dict[ModuleId, _Shared],
) -> None:
    """Give every graph-running module its direct code and every module its snapshot, then mark
    the root's tree as checked (see ``lowering/tree_watch.py``). Leaves the root without direct
    code when some state read cannot be located on the built modules (the modules before that
    one, in build order, keep a snapshot and ``_direct``, which nothing runs then).

    ``group_of`` holds what each graph-running module shares with others (``_build_module``):
    modules of one group whose reads resolve alike share their direct functions. Direct code
    looks each child's function up at call time, so the order of the modules does not matter.
    O(paths + reads), plus one compile per distinct function."""
    table = program.module_table()
    if any(table[mid].kind == LEAF for mid in objects):
        return  # direct code calls lowered modules only: with leaves, run module by module
    root_id = program.root
    root = objects[root_id]
    for mid, obj in objects.items():
        group = group_of.get(mid)
        if group is not None:
            reads = _locate_all(obj, group.reads)
        elif mid == root_id:
            reads, root_direct = _root_direct_code(program, obj)
        else:
            reads = {}
        if reads is None:
            root.__dict__.pop("_direct", None)  # the root runs module by module
            return
        if group is not None:
            # equal keys read equal targets in one order: the values tell modules apart
            key = tuple(reads.values())
            direct = group.direct.get(key)
            if direct is None:
                label = table[mid].type_name or "module"
                direct = group.direct[key] = [
                    direct_function(g, reads, label=label) for g in table[mid].graphs
                ]
            obj.__dict__["_direct"] = list(direct)  # each module its own list
        elif mid == root_id:
            obj.__dict__["_direct"] = root_direct
        else:
            obj.__dict__["_direct"] = None
        tree_watch.snapshot(obj, reads)
    root.__dict__["_direct_checked"] = (tree_watch.epoch(), True)


def _read_targets(graphs: tuple) -> tuple[str, ...]:
    """The ``get_attr`` targets of ``graphs``, each once, in order of first use."""
    reads: dict[str, None] = {}
    for graph in graphs:
        for node in graph.nodes:
            if node.op == GET_ATTR:
                reads.setdefault(node.target)
    return tuple(reads)


def _locate_all(owner: torch.nn.Module, targets: tuple[str, ...]) -> dict[str, Any] | None:
    """Where each target lives below ``owner`` (``direct.locate``); ``None`` if one is nowhere."""
    reads: dict[str, Any] = {}
    for target in targets:
        found = locate(owner, target)
        if found is None:
            return None
        reads[target] = found
    return reads


def _root_direct_code(program: Program, root: torch.nn.Module) -> tuple[dict | None, Any]:
    """Where the root graph's state reads live (its ``get_attr`` targets, then the state its
    plan binds to placeholders and copies outputs into), and its direct function reading them
    there; ``(None, None)`` if one is nowhere."""
    bound, outputs = root.__dict__["_plan"] or ({}, None)
    graph = program.root_module.graph
    targets = [*_read_targets((graph,))]
    targets += [b[1] for b in bound.values() if b[0] == "state"]
    targets += [t for kind, t in outputs or () if kind == "copy_state"]
    reads = _locate_all(root, tuple(targets))
    if reads is None:
        return None, None
    return reads, direct_function(graph, reads, bound=bound, outputs=outputs, label="root")


# --- state --------------------------------------------------------------------------------------


def _register_state(
    program: Program,
    objects: dict[ModuleId, torch.nn.Module],
    device: Any,
    share: bool,
    walked: list[tuple[str, ModuleId]],
    on_class: dict[tuple[type, str], bool],
) -> list[tuple[str, str, torch.Tensor, int]]:
    """Register every state fqn on its owner; tied fqns get one shared tensor object.
    ``walked`` is ``list(program.walk())``; ``on_class`` caches ``hasattr(class, name)``.
    A ``meta`` tensor lowered to another device is made empty there (``lowering.unloaded``);
    returns those, as ``(fqn, kind, tensor, version)`` in state order, for the load check.
    Raises ``LoweringError`` for a name the owner's class already uses (``_check_free``)."""
    made: dict[tuple[str, str], Any] = {}
    empty: list[tuple[str, str, torch.Tensor, int]] = []
    by_path = {path: objects[mid] for path, mid in walked}
    state, tensors = program.state_table(), program.tensor_table()
    # without global registration hooks, writing nn.Module's tables directly does exactly what
    # ``register_parameter``/``register_buffer`` would (minus their per-call checks)
    direct = not global_registration_hooks_set()
    with torch.no_grad():
        for fqn in program.state_order:
            slot = state[fqn]
            owner_path, _, name = fqn.rpartition(".")
            owner = by_path.get(owner_path)
            if owner is None:
                raise LoweringError(
                    f"state {fqn!r} belongs to module {owner_path!r}, which the program does "
                    "not have"
                )
            key = (slot.tensor, slot.kind)
            value = made.get(key)
            if value is None:
                held = tensors[slot.tensor].value
                value = made[key] = copy_state(held, slot, device, share)
                if is_meta(held) and isinstance(value, torch.Tensor) and not is_meta(value):
                    empty.append((fqn, slot.kind, value, tensor_version(value)))
            _register(owner, name, fqn, value, slot, direct, on_class)
    for obj in objects.values():
        if isinstance(obj, torch.nn.ParameterList):
            sync_parameter_list(obj)
    return empty


def _register(
    owner: torch.nn.Module,
    name: str,
    fqn: str,
    value: Any,
    slot: st.Slot,
    direct: bool,
    on_class: dict[tuple[type, str], bool],
) -> None:
    # the tables may be written directly only where register_* would not refuse the name
    attributes = owner.__dict__
    taken = (
        name in attributes
        or name in attributes[MODULE_TABLE]
        or _class_has(type(owner), name, on_class)
    )
    if taken:
        if attributes.get(name) is value:
            return  # a module reached under two paths: its tied state is held once already
        raise LoweringError(_taken_message(owner, name, f"state {fqn!r}"))
    free = direct
    kind = slot.kind
    if kind == st.PARAMETER:
        if free and type(value) is torch.nn.Parameter:
            attributes[PARAMETER_TABLE][name] = value
        else:
            owner.register_parameter(name, value)
    elif kind == st.BUFFER:
        if free and isinstance(value, torch.Tensor):
            attributes[BUFFER_TABLE][name] = value
            if not slot.persistent:
                attributes[NON_PERSISTENT_BUFFERS].add(name)
        else:
            owner.register_buffer(name, value, persistent=slot.persistent)
    else:
        setattr(owner, name, value)


def _check_free(
    obj: torch.nn.Module,
    name: str,
    what: str,
    mid: ModuleId,
    program: Program,
    on_class: dict[tuple[type, str], bool],
) -> None:
    """``name`` is not yet an attribute of ``obj`` (its class, or one ``lower`` set): a child
    written to ``_modules`` under it would be shadowed (``obj.name`` would not reach it)."""
    if name in obj.__dict__ or _class_has(type(obj), name, on_class):
        path = program.first_path(mid) or ""
        raise LoweringError(_taken_message(obj, name, f"{what} {(path + '.' if path else '') + name!r}"))


def _taken_message(obj: torch.nn.Module, name: str, what: str) -> str:
    return (
        f"{what}: its module is built as a {type(obj).__name__}, which has its own attribute "
        f"{name!r}, so the name would not reach it; rename it in the eager model (e.g. "
        f"{name.strip('_') + '_'!r}), or use lowering.export_ep / torch.export.unflatten"
    )


def _class_has(kind: type, name: str, on_class: dict[tuple[type, str], bool]) -> bool:
    found = on_class.get((kind, name))
    if found is None:
        found = on_class[(kind, name)] = hasattr(kind, name)
    return found


def copy_state(value: Any, slot: st.Slot, device: Any, share: bool = False) -> Any:
    """A copy of a held state tensor (call under ``no_grad``) for ``slot`` on ``device``, or
    with ``share`` a new tensor object over its storage (still a copy when ``device`` differs);
    other values are shared as they are. O(size of the tensor) for a copy, O(1) shared."""
    if not isinstance(value, torch.Tensor):
        return value
    if device is not None and device.type != "meta" and is_meta(value):
        # a meta tensor has no values to copy: empty on ``device``, filled by a checkpoint load
        copied = empty_like_on(value, device)
    elif share:
        data = value.detach()
        copied = data.to(device) if device is not None else data
    elif device is not None:
        copied = value.detach().to(device, copy=True)
    elif type(value) in _PLAIN_TENSORS:
        copied = value.clone()  # under no_grad: no history, as a clone of .detach() has none
    else:
        copied = value.detach().clone()
    if slot.kind == st.PARAMETER:
        if type(copied) is torch.Tensor:  # as torch.nn.Parameter would, without its frame
            return new_parameter(copied, slot.requires_grad)
        return torch.nn.Parameter(copied, requires_grad=slot.requires_grad)
    return copied


# Classes whose ``clone()`` under ``no_grad`` is a plain tensor like ``detach().clone()``'s.
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
