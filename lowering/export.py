"""``export_ep``: a Program, after any rewrite, back to a real ``torch.export.ExportedProgram``.

The way back mirrors ``ir.import_ep`` piece by piece:

- the module tree is inlined (``transforms.inline``) into one flat graph; each inlined node's
  ``nn_module_stack`` is rebuilt from the chain of calls that ran it, so it names the current
  module tree (a graph shared by several calls or paths gets the stack of each call);
- the pytree plumbing that ``outline`` puts around preserved calls is folded away at export time,
  and each preserved call signature names the values that now cross the call;
- state that module graphs read by ``get_attr`` (``sink_state``) is lifted back to placeholders
  with parameter, buffer, constant or custom-object input specs, as torch lifts it;
- nodes without a ``val`` (made by a rewrite) get one by running the graph under the program's
  fake mode, nodes with one keep it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch
import torch.fx
from torch.export import graph_signature as gs
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature

from ir import ops
from ir import signature as sg
from ir import state as st
from ir.args import IDict, Ref, freeze, map_refs, ref, thaw
from ir.errors import ExportError, PassError
from ir.fake_run import guards_refused, hint, refused_guard
from ir.graph import Graph
from ir.module import SUBGRAPH, ModuleId, call_target
from ir.node import CALL_FUNCTION, EMPTY_META, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from ir.runtime import expect_constant
from ir.torch_seam import fake_failures_unlogged, new_fake_mode, pytree
from ir.tree_calls import flatten_by_spec, torch_equivalent, unflatten_tree
from lowering.lower import copy_state, torch_signature
from lowering.lowering_seam import (
    FakeTensor,
    TrainingIRVerifier,
    Verifier,
    detect_fake_mode,
    script_object_type_name,
)
from transforms import kernel as kn
from transforms.passes.inlining import CallChain, inline_with_calls, restacked

# purefx's input and output kinds are the names of torch's kinds, lowercased (as import_ep reads
# them); gradient outputs are not exported.
_INPUT_KINDS = {kind.name.lower(): kind for kind in gs.InputKind}
_OUTPUT_KINDS = {kind.name.lower(): kind for kind in gs.OutputKind if "GRADIENT" not in kind.name}
# State slot kind -> the input kind torch lifts it as, and the placeholder prefix it uses.
_LIFTED = {
    st.PARAMETER: (sg.PARAMETER, "p_"),
    st.BUFFER: (sg.BUFFER, "b_"),
    st.CONSTANT: (sg.CONSTANT_TENSOR, "c_"),
    st.CUSTOM_OBJ: (sg.CUSTOM_OBJ, "obj_"),
}
# Where torch puts each input kind among the placeholders.
_INPUT_RANK = {
    sg.TOKEN: 0, sg.PARAMETER: 1, sg.BUFFER: 2, sg.CONSTANT_TENSOR: 3, sg.CUSTOM_OBJ: 4,
    sg.USER_INPUT: 5,
}
# The meta torch gives a state placeholder (no module stack: state is read outside any call).
_PLACEHOLDER_META = ("val", "tensor_meta")


def export_ep(p: Program, *, share_state: bool = False) -> torch.export.ExportedProgram:
    """An ``ExportedProgram`` that computes what ``p`` computes, built with torch's constructor.

    ``p`` may be flat (as ``import_ep`` gives it) or outlined (modules are inlined back; the
    hierarchy lives on in each node's ``nn_module_stack``). The result has a fresh GraphModule
    whose nodes carry ``p``'s meta (``val``, ``stack_trace``, ``torch_fn``, ...), a graph
    signature with every input and output kind ``p`` uses (state that module graphs read by
    ``get_attr`` is lifted to placeholders again; a program imported functional stays
    functional, in-place ``copy_`` stays in place, as torch's training IR writes it), the state
    dict and constants (copies; with ``share_state=True`` new tensor objects over ``p``'s
    storage), the module call graph with every preserved signature, the range constraints and
    example inputs made from the user inputs' fake values (zeros at the size and stride hints,
    on each input's device: ``meta`` stays ``meta``, ``cuda`` is ``cuda``; left out when that
    device cannot be allocated on in this process). The dialect is ``ATEN`` when every operator is functional, else ``TRAINING``.

    Nodes without a ``val`` (made by a rewrite) get one by running the graph under the fake
    mode of the other values (a fresh one when there are none); values already there are kept.

    **Laws:** ``import_ep(export_ep(import_ep(ep)))`` is alpha-equivalent to ``import_ep(ep)``;
    ``export_ep(q).module()`` computes what ``lower(q)`` computes; pure: ``p`` and its tensors
    are not written. Raises ``ExportError`` naming the node, state or call for what an
    ExportedProgram cannot express. Complexity: O(n log n) in the nodes of the inlined graph
    plus one fake run when values are missing.
    """
    flat, frames = _flatten(p)
    graph = flat.root_module.graph
    nodes, outputs, call_io = _fold_plumbing(graph, frames)
    signature = _output_specs(flat.signature, outputs)
    nodes, inputs = _lift_state(flat, nodes, signature.inputs)
    copies = _copied_state(flat, share_state)
    holder = _subgraph_holder(flat)
    fx_graph, env = _fx_graph(nodes, outputs, holder)
    _fill_vals(holder, fx_graph, inputs, copies)
    ep_signature = gs.ExportGraphSignature(
        input_specs=[_input_spec(s, env, flat, copies) for s in inputs],
        output_specs=_torch_outputs(signature.outputs, outputs, env),
    )
    state_dict, constants = _state_dicts(flat, copies)
    call_graph = _module_call_graph(flat, call_io, inputs, signature.outputs, env)
    try:
        return torch.export.ExportedProgram(
            root=holder,
            graph=fx_graph,
            graph_signature=ep_signature,
            state_dict=state_dict,
            range_constraints=dict(_range_constraints(flat)),
            module_call_graph=call_graph,
            example_inputs=_example_inputs(inputs, env, call_graph),
            constants=constants,
            verifiers=[_verifier(fx_graph, holder)],
        )
    except Exception as err:  # torch's own validation: say what in purefx terms
        raise ExportError(
            f"torch rejected the exported program: {type(err).__name__}: {err}"
        ) from err


def save_ep(p: Program, path: str) -> None:
    """``torch.export.save(export_ep(p), path)``; ``ExportError`` naming ``path`` when it cannot be
    written (a purefx error, so the ``purefx`` command reports it and exits with status 2)."""
    exported = export_ep(p)
    try:
        with open(path, "wb") as f:
            torch.export.save(exported, f)
    except OSError as err:
        raise ExportError(f"{path}: cannot write the program ({err.strerror or err})") from None


# --- inlining, with each node's call chain ------------------------------------------------------

Frames = CallChain  # (path, module id, call number) per call, outermost first


def _flatten(p: Program) -> tuple[Program, list[Frames]]:
    """The flat Program and, per root node, the calls it ran in (empty when ``p`` was flat)."""
    if p.root_module.graph is None:
        raise ExportError("the root module has no graph: there is nothing to export")
    try:
        flat, frames = inline_with_calls(p)
    except PassError as err:
        raise ExportError(f"the module graphs cannot be inlined into one graph: {err}") from err
    if flat is p:
        return p, frames
    return restacked(flat, frames, p), frames


# --- folding the pytree plumbing of preserved calls ---------------------------------------------


def _fold_plumbing(
    graph: Graph, frames: list[Frames]
) -> tuple[list[Node], tuple, dict[str, tuple[tuple, tuple]]]:
    """Evaluate the ``tree_unflatten`` / ``tree_flatten_spec`` / ``getitem`` plumbing around
    preserved calls (and satisfied ``expect_constant`` checks) at export time.

    Returns the remaining non-output nodes, the outputs (a tuple), and per preserved call name the
    values that enter and leave it (its first ``tree_flatten_spec``, its last
    ``tree_unflatten``). O(n).
    """
    folded: dict[str, Any] = {}  # plumbing node -> the Python structure it builds
    alias: dict[str, Any] = {}  # folded node -> the value it stands for
    entered: dict[str, tuple] = {}
    left: dict[str, tuple] = {}

    def look(r: Ref) -> Any:  # what ``r`` stands for: a folded value, or itself
        return alias.get(r.name, folded.get(r.name, r))

    def value(tree: Any) -> Any:
        return thaw(tree, look)

    def rewritten(tree: Any) -> Any:
        def one(r: Ref) -> Any:
            found = look(r)
            return r if found is r else freeze(found, lambda leaf: leaf)
        return map_refs(tree, one)

    kept: list[Node] = []
    for node, chain in zip(graph.nodes, frames):
        if node.op == OUTPUT:
            break
        call = _call_name(chain)
        target = node.target if node.op == CALL_FUNCTION else None
        if target is unflatten_tree:
            leaves, spec = value(node.args)
            folded[node.name] = unflatten_tree(leaves, spec)
            if call is not None:
                left[call] = tuple(leaves)
        elif target is flatten_by_spec:
            tree, spec = value(node.args)
            flat = flatten_by_spec(tree, spec)
            folded[node.name] = flat
            if call is not None and call not in entered:
                entered[call] = tuple(flat)
        elif ops.is_getitem(target) and _reads_folded(node, folded):
            item = value(node.args[0])[node.args[1]]
            (folded if isinstance(item, (tuple, list, dict)) else alias)[node.name] = item
        elif target is expect_constant and not isinstance(value(node.args[0]), Ref):
            alias[node.name] = value(node.args[0])
            expect_constant(*value(node.args))
        else:
            kept.append(
                node.replace(
                    target=torch_equivalent(node.target),  # torch's own, where the EP calls one
                    args=rewritten(node.args),
                    kwargs=rewritten(node.kwargs),
                )
            )
    outputs = rewritten(graph.outputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    io = {c: (entered[c], left[c]) for c in entered.keys() & left.keys()}
    return kept, outputs, io


def _call_name(frames: Frames) -> str | None:
    if not frames:
        return None
    path, _, number = frames[-1]
    return call_target(path, number)


def _reads_folded(node: Node, folded: dict[str, Any]) -> bool:
    return len(node.args) == 2 and type(node.args[0]) is Ref and node.args[0].name in folded


def _output_specs(signature: sg.ExportSignature, values: tuple) -> sg.ExportSignature:
    """Output specs naming the folded outputs ``values`` (all user outputs if none)."""
    given = signature.outputs or tuple(sg.OutputSpec(sg.USER_OUTPUT, None) for _ in values)
    if len(values) != len(given):
        raise ExportError(
            f"the root graph returns {len(values)} values but the signature has "
            f"{len(given)} output specs"
        )
    specs = tuple(
        sg.OutputSpec(s.kind, v.name if isinstance(v, Ref) else None, s.target)
        for s, v in zip(given, values)
    )
    return sg.ExportSignature(signature.inputs, specs)


# --- lifting state to placeholders --------------------------------------------------------------


def _lift_state(
    p: Program, nodes: list[Node], inputs: tuple[sg.InputSpec, ...]
) -> tuple[list[Node], tuple[sg.InputSpec, ...]]:
    """Replace every ``get_attr`` of state by the placeholder of that state (one per tensor,
    made where missing, placed among the inputs where torch puts its kind). When some state was
    read by ``get_attr`` (a sunk program), state that no node reads is lifted too, as
    non-strict torch lifts every parameter and buffer; a program whose state is all
    placeholders keeps its signature's inputs as they are."""
    placeholders = [n for n in nodes if n.op == PLACEHOLDER]
    if len(placeholders) != len(inputs):
        raise ExportError(
            f"the root graph has {len(placeholders)} placeholders but the signature has "
            f"{len(inputs)} input specs; run ir.verify on the Program"
        )
    state = p.state_table()
    holder_of: dict[str, str] = {}  # tensor key -> placeholder name
    for spec in inputs:
        if spec.target is not None and spec.kind in sg.STATE_INPUT_KINDS:
            slot = state.get(spec.target)
            if slot is None:
                raise ExportError(
                    f"input {spec.name!r} reads {spec.kind} {spec.target!r}, which is not in "
                    "the Program's state"
                )
            holder_of.setdefault(slot.tensor, spec.name)
    w = kn.WorkingGraph(p.root_module.graph, indexed=False)  # names the lifted placeholders
    w.take_only(n.name for n in nodes if n.op != GET_ATTR or n.target not in state)
    lifted: list[tuple[sg.InputSpec, Node]] = []
    kept: list[Node] = []

    def lift(fqn: str, slot: st.Slot, meta: Mapping[str, Any] = EMPTY_META) -> str:
        kind, prefix = _LIFTED[slot.kind]
        made = w.make_carrying(PLACEHOLDER, base=prefix + fqn.replace(".", "_"), meta=meta)
        persistent = slot.persistent if kind == sg.BUFFER else None
        lifted.append((sg.InputSpec(kind, made.name, fqn, persistent), made))
        holder_of[slot.tensor] = made.name
        return made.name

    for node in nodes:
        if node.op != GET_ATTR or node.target not in state:
            if node.op == GET_ATTR and not _is_subgraph(p, node.target):
                raise ExportError(
                    f"node {node.name!r} reads {node.target!r}, which is neither state with an "
                    "fqn nor a higher-order-op subgraph of the root"
                )
            kept.append(node)
            continue
        slot = state[node.target]
        name = holder_of.get(slot.tensor)
        if name is None:
            meta = {k: v for k, v in node.meta.items() if k in _PLACEHOLDER_META}
            name = lift(node.target, slot, meta)
        w.read_as(node.name, ref(name))
    for fqn in p.state_order if w.alias else ():  # sunk state: lift all, as non-strict torch does
        slot = state[fqn]
        if slot.tensor not in holder_of:
            lift(fqn, slot)
    if not lifted and not w.alias:
        return nodes, inputs
    renamed = [w.rewired(n) for n in kept if n.op != PLACEHOLDER]
    order = {fqn: i for i, fqn in enumerate(p.state_order)}
    lifted.sort(key=lambda item: (_INPUT_RANK[item[0].kind], order.get(item[0].target, 0)))
    merged = _merge(list(zip(inputs, placeholders)), lifted)
    return [n for _, n in merged] + renamed, tuple(s for s, _ in merged)


def _merge(existing: list, new: list) -> list:
    """``existing`` in its order with each of ``new`` (sorted by rank) before the first existing
    input of a higher rank. O(n)."""
    merged: list = []
    j = 0
    for item in existing:
        while j < len(new) and _INPUT_RANK[new[j][0].kind] < _INPUT_RANK[item[0].kind]:
            merged.append(new[j])
            j += 1
        merged.append(item)
    return merged + new[j:]


def _is_subgraph(p: Program, target: str) -> bool:
    found = p.resolve(target)
    return found is not None and p.modules[found].kind == SUBGRAPH


# --- state --------------------------------------------------------------------------------------


def _copied_state(p: Program, share: bool) -> dict[str, Any]:
    """fqn -> the value the new program holds (one copy per tensor: ties stay tied)."""
    tensors = p.tensor_table()
    by_key: dict[tuple[str, str], Any] = {}
    values: dict[str, Any] = {}
    for fqn in _state_fqns(p):
        slot = p.state[fqn]
        if not isinstance(fqn, str) or not fqn or any(not part for part in fqn.split(".")):
            raise ExportError(
                f"state {fqn!r} ({slot.kind}) has no fully qualified name; an ExportedProgram "
                "keys its state dict and constants by fqn"
            )
        held = tensors.get(slot.tensor)
        if held is None:
            raise ExportError(
                f"state {fqn!r} names tensor {slot.tensor!r}, which the Program does not hold"
            )
        key = (slot.tensor, slot.kind)
        if key not in by_key:
            with torch.no_grad():
                by_key[key] = copy_state(held.value, slot, None, share)
        values[fqn] = by_key[key]
    return values


def _state_fqns(p: Program) -> list[str]:
    order = list(p.state_order)
    listed = set(order)
    return order + sorted(f for f in p.state if f not in listed)


def _state_dicts(p: Program, values: dict[str, Any]) -> tuple[dict, dict]:
    state_dict: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for fqn, value in values.items():
        slot = p.state[fqn]
        persistent = slot.kind == st.PARAMETER or (slot.kind == st.BUFFER and slot.persistent)
        (state_dict if persistent else constants)[fqn] = value
    return state_dict, constants


# --- the fx graph -------------------------------------------------------------------------------


def _subgraph_holder(p: Program) -> torch.nn.Module:
    """A module holding, as fx GraphModules, the higher-order-op subgraphs the root reads."""
    holder = torch.nn.Module()
    made: dict[ModuleId, torch.fx.GraphModule] = {}
    for name, mid in p.root_module.children:
        if p.modules[mid].kind == SUBGRAPH:
            setattr(holder, name, _subgraph_module(p, mid, made))
    return holder


def _subgraph_module(
    p: Program, mid: ModuleId, made: dict[ModuleId, torch.fx.GraphModule]
) -> torch.fx.GraphModule:
    found = made.get(mid)
    if found is not None:
        return found
    mod = p.modules[mid]
    owner = torch.nn.Module()
    for name, child in mod.children:
        setattr(owner, name, _subgraph_module(p, child, made))
    nodes = [n for n in mod.graph.nodes if n.op != OUTPUT]
    made[mid] = torch.fx.GraphModule(owner, _fx_graph(nodes, mod.graph.outputs)[0])
    return made[mid]


def _fx_graph(
    nodes: list[Node], outputs: Any, holder: torch.nn.Module | None = None
) -> tuple[torch.fx.Graph, dict[str, torch.fx.Node]]:
    """An fx graph owned by ``holder``: one fx node per IR node of ``nodes`` (same names, meta
    copied), then the output tree ``outputs``."""
    graph = torch.fx.Graph(owning_module=holder)
    env: dict[str, torch.fx.Node] = {}
    for node in nodes:
        env[node.name] = _fx_node(graph, node, env)
    graph.output(thaw(outputs, lambda r: env[r.name]))
    return graph, env


def _fx_node(graph: torch.fx.Graph, node: Node, env: dict[str, torch.fx.Node]) -> torch.fx.Node:
    def read(r: Ref) -> torch.fx.Node:
        found = env.get(r.name)
        if found is None:
            raise ExportError(f"node {node.name!r} reads %{r.name} before it is defined")
        return found

    args = thaw(node.args, read)
    kwargs = thaw(node.kwargs, read) if isinstance(node.kwargs, IDict) else dict(node.kwargs)
    made = graph.create_node(node.op, node.target, tuple(args), kwargs, name=node.name)
    made.meta = _own_meta(node.meta)
    tag = made.meta.pop("tag", None)
    if tag is not None:
        made.tag = tag
    return made


def _own_meta(meta: Any) -> dict[str, Any]:
    """A copy of a node's meta whose lists and dicts are copies too: torch's passes append to
    ``from_node`` and edit ``nn_module_stack`` in place, which must not reach ``p``."""
    return {k: v.copy() if type(v) in (dict, list) else v for k, v in meta.items()}


class _ValuesWhereMissing(torch.fx.Interpreter):
    """Runs a graph on fake values, keeping each node's ``val`` and filling the missing ones."""

    def run_node(self, n: torch.fx.Node) -> Any:
        if "val" in n.meta and n.op != PLACEHOLDER:
            return n.meta["val"]
        result = super().run_node(n)
        if n.op not in (GET_ATTR, OUTPUT):
            n.meta["val"] = result
        return result


def _fill_vals(
    holder: torch.nn.Module, graph: torch.fx.Graph, inputs: tuple[sg.InputSpec, ...],
    state: dict[str, Any],
) -> None:
    """Give every computing node without a ``val`` one (fake-tensor propagation)."""
    graph_nodes = list(graph.nodes)
    missing = [n for n in graph_nodes if n.op not in (GET_ATTR, OUTPUT) and "val" not in n.meta]
    if not missing:
        return
    gm = torch.fx.GraphModule(holder, graph)
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    known = [n.meta["val"] for n in graph_nodes if "val" in n.meta]
    mode = detect_fake_mode(known) or new_fake_mode(ShapeEnv())
    placeholders = [n for n in graph_nodes if n.op == PLACEHOLDER]
    for n, spec in zip(placeholders, inputs):
        if "val" in n.meta:
            continue
        value = state.get(spec.target) if spec.target is not None else None
        if isinstance(value, torch.Tensor):
            n.meta["val"] = mode.from_tensor(value, static_shapes=True)
        else:
            raise ExportError(
                f"placeholder {n.name!r} ({spec.kind}) has no 'val' meta, so the values of the "
                "nodes that lack one cannot be computed; give it a fake value"
            )
    fakes = [_fake(n.meta["val"], mode) for n in placeholders]
    try:
        # a guard would fix a dynamic size of the program (and its ExportedProgram): refused
        with fake_failures_unlogged(), guards_refused(mode), mode:  # an ExportError below
            _ValuesWhereMissing(gm).run(*fakes)
    except Exception as err:
        guard = refused_guard(err)
        if guard is not None:
            raise ExportError(
                f"computing the missing 'val' of nodes {[n.name for n in missing][:5]} needs "
                f"{guard.text}, which would fix a dynamic size of the program; give those "
                "nodes a 'val', or keep their sizes symbolic"
            ) from err
        raise ExportError(
            f"computing the missing 'val' of nodes {[n.name for n in missing][:5]} failed: "
            f"{type(err).__name__}: {err}"
        ) from err


def _fake(val: Any, mode: Any) -> Any:
    """``val`` as a fake tensor of ``mode`` (a real tensor given as a ``val`` is converted)."""
    if isinstance(val, torch.Tensor) and not isinstance(val, FakeTensor):
        return mode.from_tensor(val, static_shapes=True)
    return val


# --- signature ----------------------------------------------------------------------------------


def _argument(name: str, val: Any) -> Any:
    if isinstance(val, torch.SymInt):
        return gs.SymIntArgument(name=name)
    if isinstance(val, torch.SymFloat):
        return gs.SymFloatArgument(name=name)
    if isinstance(val, torch.SymBool):
        return gs.SymBoolArgument(name=name)
    if val is None or isinstance(val, (int, float, bool, str)):
        return gs.ConstantArgument(name=name, value=val)
    return gs.TensorArgument(name=name)


def _input_spec(
    spec: sg.InputSpec, env: dict[str, torch.fx.Node], p: Program, state: dict[str, Any]
) -> gs.InputSpec:
    name = env[spec.name].name
    if spec.kind == sg.TOKEN:
        arg: Any = gs.TokenArgument(name=name)
    elif spec.kind == sg.CUSTOM_OBJ:
        arg = gs.CustomObjArgument(name=name, class_fqn=_class_fqn(state.get(spec.target)))
    elif spec.kind == sg.USER_INPUT:
        arg = _argument(name, env[spec.name].meta.get("val", _NO_VAL))
    else:
        arg = gs.TensorArgument(name=name)
    persistent = spec.persistent  # as the Program has it (strict export marks constants too)
    if spec.kind == sg.BUFFER and persistent is None:
        persistent = p.state[spec.target].persistent
    return gs.InputSpec(_INPUT_KINDS[spec.kind], arg, spec.target, persistent)


_NO_VAL = object()


def _class_fqn(obj: Any) -> str:
    if isinstance(obj, torch.ScriptObject):
        return script_object_type_name(obj)
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _torch_outputs(
    specs: tuple[sg.OutputSpec, ...], values: tuple, env: dict[str, torch.fx.Node]
) -> list[gs.OutputSpec]:
    found = []
    for spec, value in zip(specs, values):
        kind = _OUTPUT_KINDS.get(spec.kind)
        if kind is None:
            raise ExportError(f"output {spec.name!r} has kind {spec.kind!r}, not exportable")
        if isinstance(value, Ref):
            node = env[value.name]
            arg = (
                gs.TokenArgument(name=node.name)
                if spec.kind == sg.OUTPUT_TOKEN
                else _argument(node.name, node.meta.get("val", _NO_VAL))
            )
        else:
            arg = gs.ConstantArgument(name="", value=value)
        target = spec.target
        if spec.kind == sg.USER_INPUT_MUTATION and target in env:
            target = env[target].name
        found.append(gs.OutputSpec(kind, arg, target))
    return found


def _module_call_graph(
    p: Program, call_io: dict[str, tuple[tuple, tuple]], inputs: tuple[sg.InputSpec, ...],
    outputs: tuple[sg.OutputSpec, ...], env: dict[str, torch.fx.Node],
) -> list[ModuleCallEntry]:
    """One entry per call of ``p.call_order`` (the root first), preserved signatures renamed to
    the values that cross each call now (by the names fx gave their nodes)."""
    order = list(p.call_order)
    if "" not in order:
        order.insert(0, "")
    entries = []
    for fqn in order:
        sig = p.call_signatures.get(fqn)
        if fqn == "" and sig is None:
            sig = _root_signature(inputs, outputs)
        if sig is not None:
            sig = _fx_named(sig, env, *call_io.get(fqn, ((), ())))
        entries.append(ModuleCallEntry(fqn=fqn, signature=torch_signature(sig) if sig else None))
    return entries


def _root_signature(
    inputs: tuple[sg.InputSpec, ...], outputs: tuple[sg.OutputSpec, ...]
) -> sg.CallSignature:
    """The user-facing pytree specs of a Program that has none: positional inputs, a tuple out."""
    n_in = sum(1 for s in inputs if s.kind == sg.USER_INPUT)
    n_out = sum(1 for s in outputs if s.kind in (sg.USER_OUTPUT, sg.LOSS_OUTPUT))
    return sg.CallSignature(
        inputs=(), outputs=(),
        in_spec=pytree.tree_structure(((0,) * n_in, {})),
        out_spec=pytree.tree_structure((0,) * n_out),
    )


def _fx_named(
    sig: sg.CallSignature, env: dict[str, torch.fx.Node], entered: tuple, left: tuple
) -> sg.CallSignature:
    """``sig`` naming the values that cross the call now (``entered`` and ``left``, where there
    are as many as its inputs, outputs; a constant argument keeps its spec), each as fx named
    its node (fx renames a few names, such as Python keywords)."""

    def named(args: tuple[sg.ArgSpec, ...], values: tuple) -> tuple[sg.ArgSpec, ...]:
        if len(args) == len(values):
            args = tuple(
                sg.ArgSpec(a.kind, v.name, a.value)
                if a.kind != sg.CONSTANT and isinstance(v, Ref) else a
                for a, v in zip(args, values)
            )
        return tuple(
            sg.ArgSpec(a.kind, env[a.name].name, a.value) if a.name in env else a for a in args
        )

    return attrs.evolve(sig, inputs=named(sig.inputs, entered), outputs=named(sig.outputs, left))


def _range_constraints(p: Program) -> dict:
    found = p.range_constraints.value
    if not isinstance(found, dict):
        raise ExportError(
            f"range constraints must be a dict of symbols to ranges, got {type(found).__name__}"
        )
    return found


# --- example inputs and dialect -----------------------------------------------------------------


def _example_inputs(
    inputs: tuple[sg.InputSpec, ...], env: dict[str, torch.fx.Node],
    call_graph: list[ModuleCallEntry],
) -> tuple[tuple, dict] | None:
    """Zeros like each user input's fake value (its size hints, strides, dtype and device: a
    program on ``cuda`` gets examples on ``cuda``, one on ``meta`` gets ``meta`` examples), in the
    user's pytree; ``None`` when a user input has no value to copy or lives on a device this
    process cannot allocate on (a CUDA program exported on a machine without CUDA)."""
    leaves = []
    for spec in inputs:
        if spec.kind != sg.USER_INPUT:
            continue
        val = env[spec.name].meta.get("val", _NO_VAL)
        if isinstance(val, torch.Tensor):
            example = _zeros_like_fake(val)
            if example is None:
                return None
            leaves.append(example)
        elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            found = hint(val)
            if found is None:
                return None
            leaves.append(found)
        elif val is _NO_VAL:
            return None
        else:
            leaves.append(val)
    root_sig: ModuleCallSignature | None = call_graph[0].signature
    if root_sig is None or root_sig.in_spec is None:
        return None
    try:
        tree = pytree.tree_unflatten(leaves, root_sig.in_spec)
    except (TypeError, ValueError):  # a pytree spec these leaves do not fit: leave the examples out
        return None
    if not (isinstance(tree, tuple) and len(tree) == 2 and isinstance(tree[1], dict)):
        return None
    return tuple(tree[0]), tree[1]


def _zeros_like_fake(val: torch.Tensor) -> torch.Tensor | None:
    """A real zero tensor with ``val``'s size and stride hints, dtype and device; ``None`` when a
    size or stride has no hint or the device cannot be allocated on here."""
    shape = [hint(d) for d in val.shape]
    strides = [hint(d) for d in val.stride()] if val.layout == torch.strided else None
    if any(d is None for d in shape) or (strides is not None and any(d is None for d in strides)):
        return None
    try:
        if strides is None:  # sparse and other layouts have no strides to keep
            return torch.zeros(shape, dtype=val.dtype, layout=val.layout, device=val.device)
        made = torch.empty_strided(shape, strides, dtype=val.dtype, device=val.device)
    except (RuntimeError, AssertionError):  # "Torch not compiled with CUDA enabled" and kin
        return None
    with torch.no_grad():
        return made.zero_()


def _verifier(graph: torch.fx.Graph, holder: torch.nn.Module) -> type:
    """torch's ATEN verifier for an all-functional graph, its TRAINING verifier otherwise."""
    graphs = [graph] + [m.graph for m in holder.modules() if isinstance(m, torch.fx.GraphModule)]
    for g in graphs:
        for n in g.nodes:
            if n.op == CALL_FUNCTION and ops.is_mutating(n.target):
                return TrainingIRVerifier
    return Verifier


__all__ = ["export_ep", "save_ep"]
