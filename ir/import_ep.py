"""Import a ``torch.export.ExportedProgram`` (or a plain fx ``GraphModule``) into a ``Program``.

The importer reads its input and never writes it: not the graph, node meta, signature, state dict,
constants, nor any tensor. Tensors are held by reference in the Program's opaque table; ``lower``
copies them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.fx
from pyrsistent import pmap
from torch.export import graph_signature as gs

from ir import state as st
from ir.args import EMPTY_DICT, IList, freeze, ref
from ir.check_ep import check_call_graph, check_node, check_state_fqns, check_state_value
from ir.errors import UnsupportedProgramError
from ir.gcpause import gc_paused
from ir.graph import Graph
from ir.module import PLAIN, SUBGRAPH, Module, kind_of_type
from ir.node import CALL_FUNCTION, GET_ATTR, frozen_meta, new_node
from ir.op_known import meet_node
from ir.program import NO_CONSTRAINTS, Program
from ir.signature import (
    BUFFER,
    BUFFER_MUTATION,
    CONSTANT,
    CONSTANT_TENSOR,
    CUSTOM_OBJ,
    OBJECT,
    PARAMETER,
    PARAMETER_MUTATION,
    SYM_BOOL,
    SYM_FLOAT,
    SYM_INT,
    TENSOR,
    TOKEN,
    TOKEN_ARG,
    USER_INPUT,
    USER_INPUT_MUTATION,
    ArgSpec,
    CallSignature,
    ExportSignature,
    InputSpec,
    OutputSpec,
)
from ir.slot_init import slot_constructor
from ir.state import Opaque, Slot
from ir.torch_seam import OpOverload, storage_identity
from ir.tree_calls import own_equivalent
from ir.verify import signature_fault, verify

_INPUT_KINDS = {
    gs.InputKind.USER_INPUT: USER_INPUT,
    gs.InputKind.PARAMETER: PARAMETER,
    gs.InputKind.BUFFER: BUFFER,
    gs.InputKind.CONSTANT_TENSOR: CONSTANT_TENSOR,
    gs.InputKind.CUSTOM_OBJ: CUSTOM_OBJ,
    gs.InputKind.TOKEN: TOKEN,
}
# ``_INPUT_KINDS`` by the identity of the enum member: ``Enum.__hash__`` runs Python code, and an
# import looks a kind up for each placeholder (members live as long as their class)
_INPUT_KIND_OF_MEMBER = {id(member): kind for member, kind in _INPUT_KINDS.items()}
_OUTPUT_KINDS = {kind: kind.name.lower() for kind in gs.OutputKind}
_ARG_KINDS = (
    (gs.TensorArgument, TENSOR),
    (gs.SymIntArgument, SYM_INT),
    (gs.SymFloatArgument, SYM_FLOAT),
    (gs.SymBoolArgument, SYM_BOOL),
    (gs.CustomObjArgument, OBJECT),
    (gs.TokenArgument, TOKEN_ARG),
    (gs.ConstantArgument, CONSTANT),
)
# ``Module(...)``, ``InputSpec(...)`` and ``Slot(...)`` for the holders, specs and slots built in bulk
_new_module = slot_constructor(Module)
_new_input_spec = slot_constructor(InputSpec)
_new_slot = slot_constructor(Slot)
_STATE_KIND_OF_INPUT = {
    PARAMETER: st.PARAMETER,
    BUFFER: st.BUFFER,
    CONSTANT_TENSOR: st.CONSTANT,
    CUSTOM_OBJ: st.CUSTOM_OBJ,
}


@gc_paused
def import_ep(ep: torch.export.ExportedProgram) -> Program:
    """Import ``ep`` into an immutable ``Program`` without touching ``ep``.

    The result is flat: the root module holds the whole graph; holder modules stand at every path
    that state or the module call graph names. Raises ``UnsupportedProgramError`` naming the node,
    spec, call graph entry or state fqn at fault for a program it cannot represent or that is
    malformed (a joint forward/backward program, a corrupt signature or module call graph, state
    that does not match its placeholder, an argument that cannot be frozen; ``ir.check_ep``), and
    ``VerifyError`` if the result is not well formed. O(size of the program).
    """
    if not isinstance(ep, torch.export.ExportedProgram):
        raise UnsupportedProgramError(
            f"import_ep expects a torch.export.ExportedProgram, got {type(ep).__name__}"
        )
    sig = ep.graph_signature
    gradients = (gs.OutputKind.GRADIENT_TO_PARAMETER, gs.OutputKind.GRADIENT_TO_USER_INPUT)
    if any(spec.kind in gradients for spec in sig.output_specs):
        raise UnsupportedProgramError(
            "joint forward/backward programs (backward_signature set) are not supported; "
            "export the forward program only"
        )
    fqns = [*ep.state_dict, *(c for c in ep.constants if c not in ep.state_dict)]
    check_state_fqns(fqns)
    signature = _import_signature(ep)
    counts = (len(signature.user_inputs()), len(signature.user_outputs()))
    check_call_graph(ep, set(fqns), counts)
    modules: dict[str, Module] = {}
    root_graph = import_graph(ep.graph, ep.graph_module, "", modules)
    _check_signature_matches_graph(signature, root_graph)
    state, order, tensors = _import_state(ep, signature, root_graph)
    types = _module_types(ep.graph_module)
    call_order = tuple(e.fqn for e in ep.module_call_graph)
    root_children = holder_tree(call_order, order, types, modules)
    subgraph_children = tuple((n, n) for n in subgraph_names(root_graph, modules))
    modules[""] = Module(
        type_name=types.get(""),
        kind=PLAIN,
        children=root_children + subgraph_children,
        graphs=(root_graph,),
    )
    return verify(Program(
        root="",
        modules=pmap(modules),
        state=pmap(state),
        state_order=order,
        tensors=pmap(tensors),
        signature=signature,
        call_signatures=pmap(_import_call_signatures(ep)),
        call_order=call_order,
        # no constraints (a static export): the one shared empty value, so two imports of
        # equal exports are equal Programs (``Opaque`` compares by identity)
        range_constraints=Opaque(ep.range_constraints) if ep.range_constraints else NO_CONSTRAINTS,
    ))


# --- graphs -------------------------------------------------------------------------------------


def import_graph(
    graph: torch.fx.Graph,
    owner: torch.nn.Module,
    prefix: str,
    modules: dict[str, Module],
    exported: bool = True,
) -> Graph:
    """An fx ``graph`` owned by ``owner`` as an IR ``Graph`` (the walk ``import_ep`` uses), its
    higher-order-op subgraphs put into ``modules`` by path under ``prefix``; ``exported=False``
    checks nodes as a plain ``GraphModule``'s. Raises ``UnsupportedProgramError`` naming a node
    it cannot import. O(n) in the graph's nodes."""
    nodes = []
    accepted: set[Any] = set()
    for fx_node in graph.nodes:
        args, kwargs = fx_node.args, fx_node.kwargs  # each read once: fx properties
        check_node(fx_node, args, kwargs, exported=exported, accepted=accepted)
        frozen = _freeze_plain(args)  # the common tuple of nodes and scalars, directly
        args = frozen if frozen is not None else _freeze_args(fx_node, args)
        if kwargs or not isinstance(kwargs, dict):
            kwargs = _freeze_args(fx_node, kwargs)
        else:  # most nodes have none
            kwargs = EMPTY_DICT
        meta = fx_node.meta
        tag = getattr(fx_node, "tag", None)
        if tag is not None:
            meta = {**meta, "tag": tag}
        op, target = fx_node.op, fx_node.target
        if op == GET_ATTR:
            value = get_path(owner, target, fx_node.name)
            if isinstance(value, torch.fx.GraphModule):
                _import_subgraph(value, f"{prefix}{target}", modules)
        elif op == CALL_FUNCTION and type(target) is not OpOverload:  # an operator stays itself
            target = own_equivalent(target)
        elif op == CALL_FUNCTION:  # an operator the verified table lacks is observed here
            meet_node(target, fx_node.args, fx_node.kwargs)
        nodes.append(new_node(op, fx_node.name, target, args, kwargs, frozen_meta(meta)))
    return Graph(tuple(nodes))


def _import_subgraph(gm: torch.fx.GraphModule, mid: str, modules: dict[str, Module]) -> None:
    if mid in modules:
        return
    graph = import_graph(gm.graph, gm, f"{mid}.", modules)
    children = tuple((n, f"{mid}.{n}") for n in subgraph_names(graph, modules, f"{mid}."))
    modules[mid] = Module(type_name=None, kind=SUBGRAPH, children=children, graphs=(graph,))


def subgraph_names(graph: Graph, modules: dict[str, Module], prefix: str = "") -> list[str]:
    """The ``get_attr`` targets of ``graph`` that name a subgraph module of ``modules``, in
    graph order. O(n)."""
    names = []
    for node in graph.nodes:
        if node.op == GET_ATTR and f"{prefix}{node.target}" in modules and (
            node.target not in names
        ):
            names.append(node.target)
    return names


def _freeze_args(fx_node: torch.fx.Node, tree: Any) -> Any:
    """``freeze`` of an argument tree ``_freeze_plain`` did not take (``import_graph`` tries it
    first), naming the node when a leaf cannot be held immutably."""
    try:
        return freeze(tree, _frozen_leaf)
    except _Unhashable as bad:
        raise UnsupportedProgramError(
            f"node {fx_node.name!r} ({fx_node.format_node()}) has an argument of type "
            f"{bad.args[0]} that cannot be represented immutably"
        ) from None


_SCALARS = frozenset((int, float, bool, str, type(None)))
_LISTS = frozenset((list, torch.fx.immutable_collections.immutable_list))
_NODE = torch.fx.Node


def _freeze_plain(tree: Any) -> Any:
    """``freeze`` of the common argument trees (tuples and lists of nodes and scalars), done
    without a call per leaf; None for any other tree, which ``freeze`` then handles."""
    kind = type(tree)
    if kind is not tuple and kind not in _LISTS:
        return None
    items = []
    for x in tree:
        leaf = type(x)
        if leaf is _NODE:
            items.append(ref(x.name))
        elif leaf in _SCALARS:
            items.append(x)
        elif leaf is tuple or leaf in _LISTS:
            inner = _freeze_plain(x)
            if inner is None:
                return None
            items.append(inner)
        else:
            return None
    return tuple(items) if kind is tuple else IList(tuple(items))


class _Unhashable(Exception):
    """An argument leaf that cannot be hashed (raised inside ``_freeze_args``, never escapes)."""


def _frozen_leaf(x: Any) -> Any:
    if type(x) is torch.fx.Node or isinstance(x, torch.fx.Node):
        return ref(x.name)
    try:
        hash(x)
    except TypeError:
        raise _Unhashable(type(x).__name__) from None
    return x


def get_path(owner: torch.nn.Module, target: str, node_name: str) -> Any:
    """The attribute at dotted ``target`` below ``owner``; ``UnsupportedProgramError`` naming
    node ``node_name`` when a part is missing. O(depth)."""
    obj: Any = owner
    for part in target.split("."):
        if not hasattr(obj, part):
            raise UnsupportedProgramError(
                f"node {node_name!r} reads attribute {target!r}, which the program does not have"
            )
        obj = getattr(obj, part)
    return obj


# --- signature ----------------------------------------------------------------------------------


def _import_signature(ep: torch.export.ExportedProgram) -> ExportSignature:
    inputs = []
    for i, spec in enumerate(ep.graph_signature.input_specs):
        kind = _INPUT_KIND_OF_MEMBER.get(id(spec.kind))  # None for anything but a member
        name = getattr(spec.arg, "name", None)
        if kind is None or not isinstance(name, str):
            raise UnsupportedProgramError(
                f"input spec {i} has kind {spec.kind!r} or argument {spec.arg!r} that "
                "purefx cannot represent; only placeholders of user inputs, state and tokens are "
                "supported"
            )
        _check_input_spec(i, spec, kind)
        inputs.append(_new_input_spec(kind, name, spec.target, spec.persistent))
    outputs = []
    for i, spec in enumerate(ep.graph_signature.output_specs):
        kind = _OUTPUT_KINDS.get(spec.kind) if isinstance(spec.kind, gs.OutputKind) else None
        if kind is None or kind.startswith("gradient_to_"):
            raise UnsupportedProgramError(
                f"output spec {i} has kind {spec.kind!r}; purefx supports user outputs, "
                "losses, tokens and buffer/parameter/user input mutations"
            )
        if not isinstance(spec.arg, _ARGUMENT_TYPES):
            raise UnsupportedProgramError(
                f"output spec {i} has argument {spec.arg!r}, not a torch.export argument"
            )
        wants_target = kind in (BUFFER_MUTATION, PARAMETER_MUTATION, USER_INPUT_MUTATION)
        if wants_target != isinstance(spec.target, str) or spec.target == "":
            raise UnsupportedProgramError(
                f"output spec {i} ({kind}) has target {spec.target!r}; "
                + ("a mutation names what it mutates" if wants_target else "it takes none")
            )
        name = getattr(spec.arg, "name", None)
        outputs.append(OutputSpec(kind, name, spec.target))
    return ExportSignature(tuple(inputs), tuple(outputs))


_ARGUMENT_TYPES = tuple(cls for cls, _ in _ARG_KINDS)
_ARGUMENT_OF_KIND = {
    PARAMETER: gs.TensorArgument,
    BUFFER: gs.TensorArgument,
    CONSTANT_TENSOR: gs.TensorArgument,
    CUSTOM_OBJ: gs.CustomObjArgument,
    TOKEN: gs.TokenArgument,
    USER_INPUT: _ARGUMENT_TYPES,
}


def _check_input_spec(i: int, spec: gs.InputSpec, kind: str) -> None:
    """State specs name their fqn, other specs none; the argument fits the kind. O(1)."""
    if not isinstance(spec.arg, _ARGUMENT_OF_KIND[kind]):
        raise UnsupportedProgramError(
            f"{_input(i, spec, kind)} has a {type(spec.arg).__name__}, which a {kind} input "
            "cannot be"
        )
    if kind in (USER_INPUT, TOKEN):
        if spec.target is not None:
            raise UnsupportedProgramError(
                f"{_input(i, spec, kind)} has target {spec.target!r}; it takes none"
            )
    elif not isinstance(spec.target, str) or not spec.target:
        raise UnsupportedProgramError(
            f"{_input(i, spec, kind)} has target {spec.target!r}; it must name the state it reads"
        )
    if kind == BUFFER and not isinstance(spec.persistent, bool):
        raise UnsupportedProgramError(
            f"{_input(i, spec, kind)} has persistent={spec.persistent!r}, not a bool"
        )


def _input(i: int, spec: gs.InputSpec, kind: str) -> str:
    """How an error names input spec ``i`` (its argument has a string ``name``)."""
    return f"input spec {i} ({kind} %{spec.arg.name})"


def _check_signature_matches_graph(signature: ExportSignature, graph: Graph) -> None:
    fault = signature_fault(signature, graph)
    if fault is not None:
        raise UnsupportedProgramError(f"corrupt signature: the {fault}; re-export the program")


def _import_call_signatures(ep: torch.export.ExportedProgram) -> dict[str, CallSignature]:
    found = {}
    for entry in ep.module_call_graph:
        sig = entry.signature
        if sig is None:
            continue
        found[entry.fqn] = CallSignature(
            inputs=tuple(_arg_spec(a, entry.fqn) for a in sig.inputs),
            outputs=tuple(_arg_spec(a, entry.fqn) for a in sig.outputs),
            in_spec=sig.in_spec,
            out_spec=sig.out_spec,
            forward_arg_names=tuple(sig.forward_arg_names) if sig.forward_arg_names else None,
        )
    return found


def _arg_spec(arg: Any, fqn: str) -> ArgSpec:
    """``arg`` as an ``ArgSpec``; its type is one of ``_ARG_KINDS`` (``check_call_graph``)."""
    kind = next(kind for cls, kind in _ARG_KINDS if isinstance(arg, cls))
    if kind != CONSTANT:
        return ArgSpec(kind, arg.name)
    try:
        hash(arg.value)
    except TypeError:
        raise UnsupportedProgramError(
            f"preserved call {fqn!r} has an unhashable constant argument {arg.value!r}"
        ) from None
    return ArgSpec(kind, getattr(arg, "name", None), arg.value)


# --- state --------------------------------------------------------------------------------------


def _import_state(
    ep: torch.export.ExportedProgram, signature: ExportSignature, graph: Graph
) -> tuple[dict[str, Slot], tuple[str, ...], dict[str, Opaque]]:
    """State slots in registration order: the state dict first, then the remaining constants;
    each value checked against the placeholder of ``graph`` (the imported root graph) that its
    input spec names. O(state + placeholders)."""
    declared = _declared_state(signature)
    placeholders = {n.name: n for n in graph.placeholders}
    state: dict[str, Slot] = {}
    tensors: dict[str, Opaque] = {}
    aliases = _Aliases()

    def add(fqn: str, value: Any, kind: str, persistent: bool, spec: InputSpec | None) -> None:
        check_state_value(fqn, value, kind, placeholders.get(spec.name) if spec else None)
        key = aliases.key(fqn, value, kind != st.CUSTOM_OBJ)  # a checked tensor unless custom
        if key not in tensors:
            tensors[key] = Opaque(value)
        requires_grad = bool(getattr(value, "requires_grad", False))
        state[fqn] = _new_slot(kind, key, persistent, requires_grad)

    for fqn, value in ep.state_dict.items():
        spec = declared.get(fqn)
        if spec is not None:
            add(fqn, value, _STATE_KIND_OF_INPUT[spec.kind], spec.persistent is not False, spec)
        elif isinstance(value, torch.nn.Parameter):
            add(fqn, value, st.PARAMETER, True, spec)
        else:
            add(fqn, value, st.BUFFER, True, spec)
    for fqn, value in ep.constants.items():
        if fqn in state:
            continue
        spec = declared.get(fqn)
        if spec is not None:  # the spec says what it is: a tensor is checked to be one
            kind = _STATE_KIND_OF_INPUT[spec.kind]
            add(fqn, value, kind, kind != st.BUFFER, spec)
        elif isinstance(value, torch.Tensor):
            add(fqn, value, st.CONSTANT, True, spec)
        else:
            add(fqn, value, st.CUSTOM_OBJ, True, spec)
    for fqn, spec in declared.items():
        if fqn not in state:
            raise UnsupportedProgramError(
                f"input {spec.name!r} reads {spec.kind} {fqn!r}, which is neither in the state "
                "dict nor in the constants; the program is incomplete"
            )
    return state, _registration_order(list(state), signature, state), tensors


class _Aliases:
    """The tensor key of each state value: the fqn of the first value added whose
    ``alias_key`` equals its own (tied weights share one key).

    Equal alias keys imply one storage pointer (for a tensor with bytes; one object
    otherwise), so values are first sorted by that pointer, which costs three tensor calls
    where ``alias_key`` costs nine: a value alone at its pointer keys itself, and only values
    that share one have their ``alias_key``s compared. O(1) per value.
    """

    __slots__ = ("first", "keys")

    def __init__(self) -> None:
        # storage pointer -> (fqn, value) of the one value there, or None once a second came
        self.first: dict[int, tuple[str, Any] | None] = {}
        self.keys: dict[Any, str] = {}  # alias_key -> fqn, for the values at shared pointers

    def key(self, fqn: str, value: Any, is_tensor: bool) -> str:
        """The key of ``value``, added as ``fqn`` (``is_tensor``: ``value`` is a tensor)."""
        pointer: Any = id(value)
        if is_tensor:
            storage = value.untyped_storage()
            if storage.nbytes() > 0:
                pointer = _storage_pointer(value, storage)
        if pointer not in self.first:
            self.first[pointer] = (fqn, value)
            return fqn
        held = self.first[pointer]
        if held is not None:  # the first value there gets its alias_key now
            self.keys.setdefault(alias_key(held[1]), held[0])
            self.first[pointer] = None
        return self.keys.setdefault(alias_key(value), fqn)


def _declared_state(signature: ExportSignature) -> dict[str, InputSpec]:
    """State fqn -> the input spec that reads it; two specs reading one fqn are refused."""
    declared: dict[str, InputSpec] = {}
    for spec in signature.inputs:
        if spec.target is None or spec.kind == USER_INPUT:
            continue
        if spec.target in declared:
            raise UnsupportedProgramError(
                f"input specs %{declared[spec.target].name} and %{spec.name} both read "
                f"{spec.target!r}; each state fqn has one placeholder"
            )
        declared[spec.target] = spec
    return declared


def _registration_order(
    order: list[str], signature: ExportSignature, state: dict[str, Slot]
) -> tuple[str, ...]:
    """``registration_order`` of ``order`` with the buffers ``signature`` reads, in its
    order, and the non-persistent ones among them as ``state`` has them. O(n)."""
    buffers = [s.target for s in signature.inputs if s.kind == BUFFER and s.target in state]
    return registration_order(order, buffers, {f for f in buffers if not state[f].persistent})


def registration_order(
    order: Sequence[str], buffers: Sequence[str], loose: Collection[str]
) -> tuple[str, ...]:
    """Put each non-persistent buffer (``loose``) back among the ``buffers``, where eager
    registered it: the state order ``import_ep`` gives.

    ``order`` is the state dict followed by the constants, as an ``ExportedProgram`` holds them
    (persistent state in eager order; non-persistent buffers among the constants); ``buffers``
    lists the buffers the program reads in eager order, non-persistent ones included (its
    signature's order). Each non-persistent buffer goes right after the buffer before it in
    ``buffers``; the first buffer, when non-persistent, goes before the first persistent one,
    or, with no persistent buffer, where ``order`` has it among the constants (an
    ``ExportedProgram`` does not record where eager registered it relative to them;
    ``export_ep`` lists them in the program's state order, so the round trip keeps it).

    **Laws:** ``order`` itself (as a tuple) when ``loose`` is empty; a permutation of ``order``
    that moves only ``loose`` entries. O(n) in the number of state fqns.
    """
    if not loose:
        return tuple(order)
    follower: dict[str, str] = {}  # buffer -> the non-persistent buffer placed right after it
    leader: dict[str, str] = {}  # persistent buffer -> the non-persistent one placed before it
    trailing: list[str] = []
    for i, fqn in enumerate(buffers):
        if fqn not in loose:
            continue
        if i > 0:
            follower[buffers[i - 1]] = fqn
            continue
        first_persistent = next((b for b in buffers if b not in loose), None)
        if first_persistent is None:
            trailing.append(fqn)
        else:
            leader[first_persistent] = fqn
    placed: list[str] = []

    def place(fqn: str | None) -> None:
        while fqn is not None:
            placed.append(fqn)
            fqn = follower.get(fqn)

    for fqn in order:
        if fqn in loose:
            if fqn in trailing:  # no persistent buffer: where the constants list it
                place(fqn)
            continue
        if fqn in leader:
            place(leader[fqn])
        place(fqn)
    return tuple(placed)


def _storage_pointer(value: torch.Tensor, storage: Any) -> Any:
    """Where ``value``'s bytes live: the data pointer of its storage; for a storage without one
    (``meta``, whose every storage reports pointer 0) the storage object's own identity
    (``storage_identity``), so that only views of one meta storage alias. A meta tensor has no
    bytes to compare: two meta tensors are one state tensor exactly when the export holds one
    storage for both (tied parameters are one object in ``ep.state_dict``), never because their
    shapes agree. O(1)."""
    pointer = storage.data_ptr()
    if pointer == 0:
        return ("storage", storage_identity(value))
    return pointer


def alias_key(value: Any) -> Any:
    """A key equal for two tensors that view the same memory the same way (tied weights); the
    value itself otherwise. Tensors without a data pointer (``meta``) compare by the identity of
    their storage object instead (``_storage_pointer``). O(1)."""
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        if storage.nbytes() > 0:
            return (
                "tensor",
                value.device,
                _storage_pointer(value, storage),
                value.storage_offset(),
                value.shape,
                value.stride(),
                value.dtype,
            )
    return ("object", id(value))


# --- module tree --------------------------------------------------------------------------------


def _module_types(root: torch.fx.GraphModule) -> dict[str, str]:
    """Original class names by module path, as ``nn_module_stack`` records them: on the nodes of
    the root graph, then of the higher-order-op bodies (a module called only inside a
    ``no_grad`` region that spans several calls is named on the body's nodes alone). O(nodes)."""
    types: dict[str, str] = {}
    graphs = [root.graph] + [
        m.graph for m in root.modules() if m is not root and isinstance(m, torch.fx.GraphModule)
    ]
    for graph in graphs:
        for node in graph.nodes:
            stack = node.meta.get("nn_module_stack")
            if not stack:
                continue
            for path, type_name in stack.values():
                if path not in types and isinstance(type_name, str):
                    types[path] = type_name
    return types


def _holder_kind(
    type_name: str | None, children: list[tuple[str, str]], state_names: list[str] | None
) -> str:
    """The container kind of a holder with ``(local name, path)`` ``children`` and local
    ``state_names`` (``None``: no state).

    Containers are never called, so the module stack never names their class: an untyped holder
    of children ``0..n-1`` (and no state) is taken for a ModuleList, one of state ``0..n-1`` (and
    no children) for a ParameterList. A ModuleDict or ParameterDict cannot be told from a plain
    module this way and stays a plain holder.
    """
    if type_name is None:
        if children and not state_names and _numbered([name for name, _ in children]):
            return kind_of_type("torch.nn.modules.container.ModuleList")
        if state_names and not children and _numbered(state_names):
            return kind_of_type("torch.nn.modules.container.ParameterList")
    return kind_of_type(type_name)


def _numbered(names: list[str]) -> bool:
    return names == [str(i) for i in range(len(names))]


def holder_tree(
    call_order: tuple[str, ...],
    state_order: tuple[str, ...],
    types: dict[str, str],
    modules: dict[str, Module],
) -> tuple[tuple[str, str], ...]:
    """A graph-less holder Module in ``modules`` at every path the call order or a state fqn
    names (``import_ep``'s module tree; class names from ``types``); returns the root's children
    in first-mention order. O(paths + state): each path is split once."""
    children: dict[str, list[tuple[str, str]]] = {"": []}  # path -> its (name, path) children

    def make(path: str) -> None:
        """Add the holder at ``path`` (not made yet), after those above it."""
        parent, _, name = path.rpartition(".")
        if parent not in children:
            make(parent)
        children[parent].append((name, path))
        children[path] = []

    for path in call_order:
        if path not in children and "@" not in path:
            make(path)
    local_state: dict[str, list[str]] = {}  # holder path -> names of its state, in order
    for fqn in state_order:
        owner, _, name = fqn.rpartition(".")
        names = local_state.get(owner)
        if names is None:
            names = local_state[owner] = []
            if owner not in children:
                make(owner)
        names.append(name)
    for path, kids in reversed(children.items()):
        if path:
            type_name = types.get(path)
            kind = _holder_kind(type_name, kids, local_state.get(path))
            modules[path] = _new_module(type_name, kind, tuple(kids))
    return tuple(children[""])
