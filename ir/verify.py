"""``verify(program)``: well-formedness, with a ``VerifyError`` that names what is wrong."""

from __future__ import annotations

import weakref

import torch

from ir import ops
from ir import signature as sg
from ir.alpha import AlphaKey, graph_shape
from ir.args import Ref
from ir.errors import VerifyError
from ir.fake_run import FakeRunFailed, describe, fake_value, same_val
from ir.graph import Graph
from ir.module import KINDS, LEAF, SUBGRAPH, ModuleId, split_call_target
from ir.module_names import (
    attribute_name_fault,
    check_path,
    first_path_fault,
    rename_hint,
)
from ir.names import target_name
from ir.node import (
    CALL_FUNCTION,
    CALL_METHOD,
    CALL_MODULE,
    GET_ATTR,
    OPS,
    OUTPUT,
    PLACEHOLDER,
    Node,
)
from ir.program import Program
from ir.returned_values import output_value
from ir.signature import (
    BUFFER_MUTATION,
    PARAMETER_MUTATION,
    STATE_INPUT_KINDS,
    USER_INPUT_MUTATION,
)
from ir.state import STATE_KINDS

INPUT_KINDS = (sg.USER_INPUT, *STATE_INPUT_KINDS, sg.TOKEN)
OUTPUT_KINDS = (sg.USER_OUTPUT, sg.LOSS_OUTPUT, sg.OUTPUT_TOKEN, *sg.MUTATION_KINDS)


def verify(program: Program, *, vals: bool = False, since: Program | None = None) -> Program:
    """Check ``program`` and return it unchanged; raise ``VerifyError`` naming the first fault.

    Checks: the module table is closed and acyclic; every graph defines names once and before use,
    keeps placeholders first and ends in one output node; ``call_module`` targets reach a child
    whose graph takes that many arguments; ``get_attr`` targets reach state (below the module or
    through a peer it holds) or a subgraph module; peers are modules of the tree;
    the root graph matches the export signature; state slots name held tensors, in order.

    ``vals=True`` also checks the metadata: the ``val`` of every compute node is derived again
    from its inputs' ``val`` s (its operator run on them, ``ir.fake_run``; for a ``call_module``
    whose arguments have the shapes its graph was traced at, the value that graph returns) and
    must have the recorded dtype, shape and device; a node whose operator raises on its
    inputs' values is a fault too. Skipped: nodes without a ``val`` or with an input without
    one (or whose ``val`` is a real tensor, not a fake or meta one), higher-order ops and
    their bodies, writes, nodes that bind unbacked symbols.
    O(nodes) fake runs: a check for tests and laws, not for every pass.

    ``since`` (with ``vals``): a program ``program`` was made from (a pass's input). A compute
    node of ``program`` whose re-derived ``val`` cannot differ from that of its namesake in
    ``since`` is not run again (:func:`unchanged_since`: same module, graph and name, the same
    op, target and arguments, the same ``val`` object, and each input's ``val`` the same object
    as in ``since``): its check gives what it gives on ``since``. So ``verify(p, vals=True,
    since=q)`` raises wherever ``verify(p, vals=True)`` raises except
    where every node failing is such a node (a fault ``p`` inherited from ``q``, which
    ``verify(q, vals=True)`` raises for), and never where it does not. The pass laws call it
    with the pass's input (whose own faults they excuse) and pay fake runs only for what the
    pass changed. O(nodes) comparisons plus a fake run per changed node.
    """
    paths = _check_module_tree(program)
    _check_state(program)
    table = program.module_table()
    for mid, path in paths.items():
        mod = table[mid]
        if mod.kind not in KINDS:
            raise VerifyError(f"module {path or '<root>'!r} has unknown kind {mod.kind!r}")
        if mod.peers:
            _check_peers(mod.peers, mod.children, paths, path)
        for graph in mod.graphs:
            if mid == program.root:  # one graph, often the largest: walked as it is
                _check_graph_nodes(program, graph, mid, path)
            else:
                _check_graph(program, graph, mid, path)
    _check_root_signature(program)
    if vals:
        _check_vals(program, paths, since)
    return program


def _check_vals(program: Program, paths: dict[ModuleId, str], since: Program | None) -> None:
    """Every compute node's ``val`` is what its inputs' ``val`` s give (``verify(vals=True)``);
    ``paths``: each module's first path, in walk order (``_check_module_tree``); nodes
    :func:`unchanged_since` ``since`` are skipped."""
    table = program.module_table()
    before = since.module_table() if since is not None else {}
    for mid, path in reversed(paths.items()):  # callees first: the fault named is where it starts
        if table[mid].kind == SUBGRAPH:
            continue  # a higher-order op's body runs under its op's context (autocast, grad)
        old = before.get(mid)
        for gi, graph in enumerate(table[mid].graphs):
            was = old.graphs[gi] if old is not None and gi < len(old.graphs) else None
            _check_graph_vals(program, graph, mid, path or "<root>", was)


def unchanged_since(node: Node, graph: Graph, was: Graph) -> bool:
    """Whether re-deriving ``node``'s ``val`` in ``graph`` must give what it gives for the node
    of its name in ``was`` (the same module's graph in an earlier program): that node has the
    same op, target, arguments (``==``), ``unbacked_bindings`` and ``val`` (the same object),
    and every value ``node`` reads has the same ``val`` object in both graphs. A
    ``call_module`` is never unchanged (its callee's graph decides its value). O(arguments)."""
    old = was.by_name().get(node.name)
    if old is None or old.op != node.op or node.op not in (CALL_FUNCTION, CALL_METHOD):
        return False
    if old is not node:
        if old.meta.get("val") is not node.meta.get("val") or (
                old.meta.get("unbacked_bindings") != node.meta.get("unbacked_bindings")):
            return False
        try:
            if not (old.target is node.target and bool(old.args == node.args)
                    and bool(old.kwargs == node.kwargs)):
                return False
        except Exception:  # noqa: BLE001 - arguments that do not compare: changed
            return False
    now, then = graph.by_name(), was.by_name()
    for r in node.inputs():
        a, b = now.get(r.name), then.get(r.name)
        if a is None or b is None or a.meta.get("val") is not b.meta.get("val"):
            return False
    return True


def _check_graph_vals(program: Program, graph: Graph, mid: ModuleId, where: str,
                      was: Graph | None = None) -> None:
    by_name = graph.by_name()

    def val_of(r: Ref) -> object:
        n = by_name.get(r.name)
        v = n.meta.get("val") if n is not None else None
        return v if _runnable(v) else None  # a script object's stand-in: not re-derived

    for node in graph.nodes:
        old = node.meta.get("val")
        if old is None or node.meta.get("unbacked_bindings"):
            continue
        if was is not None and unchanged_since(node, graph, was):
            continue  # its check gives what it gave on ``was``
        if node.op in (CALL_FUNCTION, CALL_METHOD):
            target = node.target
            if node.op == CALL_FUNCTION and (
                not callable(target) or ops.facts(target).kind == ops.HOP or ops.is_mutating(target)
            ):
                continue  # a write is not run on the program's own fake values
            try:
                new = fake_value(target, node.args, node.kwargs, val_of,
                                 method=node.op == CALL_METHOD)
            except FakeRunFailed as exc:
                if exc.guard is not None:
                    raise VerifyError(
                        f"node {node.name!r} in module {where!r} ({target_name(target)}) runs on "
                        f"its inputs' vals only under the guard {exc.guard.text}, which fixes a "
                        "size the program keeps dynamic: its arguments hold a size of one "
                        "example (a pass baked it in); keep the size symbolic"
                    ) from exc
                raise VerifyError(
                    f"node {node.name!r} in module {where!r} ({exc}) raises on its inputs' "
                    "vals: its arguments' metadata and its operator disagree"
                ) from exc
        elif node.op == CALL_MODULE:
            new = _call_val(program, node, mid, val_of)
        else:
            continue
        if new is not None and not same_val(old, new):
            raise VerifyError(
                f"node {node.name!r} in module {where!r} has val {describe(old)}, but its "
                f"inputs' vals give {describe(new)}: a pass left its metadata stale; derive "
                "the val again after changing what the node reads"
            )


def _runnable(v: object) -> bool:
    """Whether ``v`` is a val a fake run takes: fake or meta tensors, numbers, symbols. A real
    tensor (a constant a pass recorded as its own val) is not: the nodes reading it are
    skipped, as those reading a node without a val are."""
    if isinstance(v, (tuple, list)):
        return all(_runnable(x) for x in v)
    if isinstance(v, torch.Tensor):
        return getattr(v, "fake_mode", None) is not None or v.device.type == "meta"
    return v is None or isinstance(v, (int, float, bool, torch.SymInt, torch.SymFloat,
                                       torch.SymBool))


def _call_val(program: Program, node: Node, mid: ModuleId, val_of) -> object:
    """What the called graph returns, when the call's arguments have the shapes its
    placeholders were traced at (a graph shared by calls at other shapes is not compared)."""
    if type(node.target) is not str or node.kwargs:
        return None
    target, variant = split_call_target(node.target)
    child = program.resolve(target, mid)
    graphs = program.module_table()[child].graphs if child is not None else ()
    if variant >= len(graphs):
        return None
    called = graphs[variant]
    phs = called.placeholders
    for arg, ph in zip(node.args, phs):
        got = val_of(arg) if type(arg) is Ref else arg
        if not same_val(got, ph.meta.get("val")):
            return None
    return output_value(program, child, called)


def _check_peers(
    peers: tuple, children: tuple, paths: dict[ModuleId, str], path: str
) -> None:
    """A peer (a module held by reference) is in the module tree and named unlike a child."""
    kids = {name for name, _ in children}
    for name, peer in peers:
        fault = attribute_name_fault(name)
        if fault is not None:
            raise VerifyError(f"module {path or '<root>'!r} holds peer {name!r}, whose name {fault}")
        if peer not in paths:
            raise VerifyError(
                f"module {path or '<root>'!r} holds peer {name!r}, module id {peer!r}, which no "
                "path of the module tree reaches"
            )
        if name in kids:
            raise VerifyError(
                f"module {path or '<root>'!r} holds peer {name!r} under the name of a child"
            )


def _check_module_tree(program: Program) -> dict[ModuleId, str]:
    """Reach every module from the root; return the first path of each. Fails on cycles."""
    if program.root not in program.modules:
        raise VerifyError(f"root module id {program.root!r} is not in the module table")
    first: dict[ModuleId, str] = {}
    on_stack: set[ModuleId] = set()
    table = program.module_table()

    def visit(mid: ModuleId, path: str) -> None:
        if mid in on_stack:
            raise VerifyError(f"module {path!r} contains itself (module id {mid!r})")
        if mid not in table:
            raise VerifyError(f"module {path!r} refers to missing module id {mid!r}")
        if mid in first:
            return
        first[mid] = path
        on_stack.add(mid)
        names = set()
        for name, child in table[mid].children:
            if name in names:
                raise VerifyError(f"module {path or '<root>'!r} has a repeated child {name!r}")
            fault = attribute_name_fault(name)
            if fault is not None:
                full = f"{path}.{name}" if path else name
                raise VerifyError(
                    f"submodule {full!r}: the name {name!r} {fault}, so torch cannot register a "
                    f"submodule under it; {rename_hint(name)}"
                )
            names.add(name)
            visit(child, f"{path}.{name}" if path else name)
        on_stack.discard(mid)

    visit(program.root, "")
    return first


def _check_state(program: Program) -> None:
    if len(program.state_order) != len(program.state) or set(program.state_order) != set(
        program.state_table()
    ):
        raise VerifyError("state_order does not list exactly the state fqns")
    state, tensors = program.state_table(), program.tensor_table()
    slots = state.values()
    try:
        fine = {slot.kind for slot in slots}.issubset(STATE_KINDS) and (
            tensors.keys() >= {slot.tensor for slot in slots}
        )
    except TypeError:  # an unhashable kind or key: named below
        fine = False
    if not fine:  # name the first fault, in state order
        for fqn in program.state_order:
            slot = state[fqn]
            if slot.kind not in STATE_KINDS:
                raise VerifyError(f"state {fqn!r} has unknown kind {slot.kind!r}")
            if slot.tensor not in tensors:
                raise VerifyError(
                    f"state {fqn!r} names tensor key {slot.tensor!r}, which is not held"
                )
    found = first_path_fault(program.state_order)
    if found is not None:
        check_path(found[0], "state", VerifyError)


def _check_graph(program: Program, graph: Graph, mid: ModuleId, path: str) -> None:
    """Check ``graph`` of module ``mid``: its own form (``_check_graph_nodes``), once per alpha
    key, and each ``get_attr`` and ``call_module`` target against the program, for every graph.
    For the graphs of modules below the root, which repeat (every block of a stack) and whose
    keys ``lower`` computes anyway to share code.

    What the form check reads of a graph (ops, targets, argument counts, which position each read
    names) is all in its alpha key, except whether its node names are distinct, which the key's
    walk reports beside it: a graph with distinct names whose key passed before passes again, so
    for it only the reads and calls are checked, in node order (the first fault found is the
    first in node order either way). O(nodes) for a graph, plus O(reads and calls) when its key
    is new; O(reads and calls) otherwise.
    """
    try:
        shape = graph_shape(graph)
    except TypeError:  # an unhashable target or literal: no key, checked node by node
        shape = None
    resolved = _FORM_CHECKED.get(shape.key) if shape is not None and shape.distinct_names else None
    if resolved is None:
        _check_graph_nodes(program, graph, mid, path)
        if shape is not None and shape.distinct_names:
            _FORM_CHECKED[shape.key] = _resolved_positions(shape.key)
        return
    nodes = graph.nodes
    where = path or "<root>"
    for i in resolved:
        node = nodes[i]
        if node.op == GET_ATTR:
            _check_read(program, node, mid, path)
        else:
            _check_call(program, node, mid, where)


# Alpha key of a graph whose form passed -> the positions of its nodes whose targets the program
# resolves (``get_attr`` and ``call_module`` with a string target), for as long as a graph of
# that key lives.
_FORM_CHECKED: weakref.WeakKeyDictionary[AlphaKey, tuple[int, ...]] = weakref.WeakKeyDictionary()


def _resolved_positions(key: AlphaKey) -> tuple[int, ...]:
    return tuple(
        i
        for i, (op, target, _, _) in enumerate(key.key)
        if (op == GET_ATTR or op == CALL_MODULE) and type(target) is str
    )


def _check_graph_nodes(program: Program, graph: Graph, mid: ModuleId, path: str) -> None:
    """One pass over ``graph``: ops, names defined once and before use, placeholders first, one
    output last, and each node's target of its op's kind, reaching what it names."""
    where = path or "<root>"
    defined: set[str] = set()
    define = defined.add
    seen_compute = False
    nodes = graph.nodes
    if not nodes or nodes[-1].op != OUTPUT:
        raise VerifyError(f"graph of module {where!r} does not end with an output node")
    last = nodes[-1]
    for node in nodes:
        op, name = node.op, node.name
        fault = None
        if op == CALL_FUNCTION:  # most nodes: checked inline
            if type(node.target) is not str and not callable(node.target):
                fault = _TARGET_RULES[op](node)
            seen_compute = True
        elif op == GET_ATTR:
            if type(node.target) is str:
                _check_read(program, node, mid, path)
            else:
                fault = _TARGET_RULES[op](node)
            seen_compute = True
        elif op == PLACEHOLDER:
            if seen_compute:
                raise VerifyError(f"placeholder {name!r} in module {where!r} comes after other nodes")
        elif op == CALL_MODULE:
            if type(node.target) is str:
                _check_call(program, node, mid, where)
            else:
                fault = _TARGET_RULES[op](node)
            seen_compute = True
        elif op in OPS:
            fault = _TARGET_RULES[op](node)
            seen_compute = True
            if op == OUTPUT and node is not last:
                raise VerifyError(f"module {where!r} has an output node {name!r} before the end")
        else:
            raise VerifyError(f"node {name!r} in module {where!r} has unknown op {op!r}")
        if name in defined:
            raise VerifyError(f"node name {name!r} is defined twice in module {where!r}")
        if fault is not None:
            raise VerifyError(
                f"{op} node {name!r} in module {where!r} {fault}; rebuild the node with a target "
                "of its kind (see ir.node)"
            )
        for r in node.inputs():
            if r.name not in defined:
                raise VerifyError(
                    f"node {name!r} in module {where!r} reads %{r.name} before it is defined"
                )
        define(name)


# op -> the fault of a node's target and arguments for that op, or None (placeholders: any name)
_TARGET_RULES = {
    # get_attr and call_module targets are resolved in the program (_check_read, _check_call)
    GET_ATTR: lambda n: f"has target {n.target!r}; it reads a dotted attribute path",
    CALL_MODULE: lambda n: f"has target {n.target!r}; it must be a dotted module path",
    CALL_METHOD: lambda n: None if (
        type(n.target) is str and n.target and n.args  # spelling: lowering.identifiers
    ) else f"calls method {n.target!r} on {len(n.args)} arguments; it needs a method name and "
           "the object as its first argument",
    # a string names a function abstractly (IR-only tests); ``lower`` refuses it
    CALL_FUNCTION: lambda n: None if callable(n.target) or type(n.target) is str else (
        f"has target {n.target!r}, which is neither callable nor a name"),
    OUTPUT: lambda n: None if len(n.args) == 1 and not n.kwargs else (
        f"has {len(n.args)} arguments and keywords {list(n.kwargs.keys())}; it returns one tree"),
}


def _check_call(program: Program, node: Node, mid: ModuleId, where: str) -> None:
    """A ``call_module`` reaches a module with a graph (or a leaf), a graph it has, with as many
    arguments as that graph takes."""
    target, variant = split_call_target(node.target)
    child = program.resolve(target, mid)
    if child is None:
        raise VerifyError(
            f"node {node.name!r} in module {where!r} calls {node.target!r}, which is not "
            "a submodule"
        )
    callee = program.module_table()[child]
    graphs = callee.graphs
    if callee.kind == SUBGRAPH or (not graphs and callee.kind != LEAF):
        what = "a higher-order op's body" if graphs else "a module with no graph"
        raise VerifyError(
            f"node {node.name!r} in module {where!r} calls {node.target!r}, {what}; only "
            "a module with a graph (or a leaf module) can be called"
        )
    if variant >= max(1, len(graphs)):
        raise VerifyError(
            f"node {node.name!r} in module {where!r} calls graph {variant} of "
            f"{target!r}, which has {len(graphs)} graphs"
        )
    if graphs:
        takes = len(graphs[variant].placeholders)
        arity = len(node.args) + len(node.kwargs)
        if arity != takes:
            raise VerifyError(
                f"node {node.name!r} in module {where!r} passes {arity} arguments to "
                f"{node.target!r}, whose graph takes {takes}"
            )


def _check_read(program: Program, node: Node, mid: ModuleId, path: str) -> None:
    """A ``get_attr`` reaches state (below the module or through a peer) or a submodule."""
    target = node.target
    fqn = program.attr_fqn(mid, path, target)  # below ``path``, or through a peer
    if fqn in program.state_table():  # the common case: checked before the module tree
        return
    if program.resolve(target, mid) is not None:
        return
    if program.module_table()[mid].kind != SUBGRAPH:
        raise VerifyError(
            f"node {node.name!r} in module {path or '<root>'!r} reads {target!r}, which is "
            "neither state nor a submodule"
        )


def signature_fault(
    signature: sg.ExportSignature, graph: Graph, *, outputs: bool = True
) -> str | None:
    """Why root ``graph`` does not fit ``signature``, or ``None``: its placeholders are not the
    input specs' names in order, it returns another number of values than the signature lists
    outputs (checked when ``outputs`` is true or the signature lists some), or an output spec
    names a value other than the one returned there. O(inputs + outputs)."""
    names = [n.name for n in graph.placeholders]
    specs = [s.name for s in signature.inputs]
    if names != specs:
        return f"root placeholders {names} do not match the input specs {specs}"
    values = graph.outputs if isinstance(graph.outputs, tuple) else (graph.outputs,)
    if (outputs or signature.outputs) and len(values) != len(signature.outputs):
        return (f"root graph returns {len(values)} values, the signature lists "
                f"{len(signature.outputs)} outputs")
    for value, spec in zip(values, signature.outputs):
        if spec.name is not None and isinstance(value, Ref) and value.name != spec.name:
            return (f"output spec {spec.kind} names %{spec.name} but the root returns "
                    f"%{value.name} there")
    return None


def _check_root_signature(program: Program) -> None:
    graph = program.root_module.graph
    if graph is None:
        raise VerifyError("the root module has no graph")
    fault = signature_fault(program.signature, graph, outputs=False)
    if fault is not None:
        raise VerifyError(fault)
    for spec in program.signature.inputs:
        if spec.kind not in INPUT_KINDS:
            raise VerifyError(f"input spec %{spec.name} has unknown kind {spec.kind!r}")
        if spec.kind in STATE_INPUT_KINDS and spec.target not in program.state_table():
            raise VerifyError(
                f"input spec %{spec.name} reads {spec.kind} {spec.target!r}, which is not state"
            )
        if spec.kind not in STATE_INPUT_KINDS and spec.target is not None:
            raise VerifyError(
                f"input spec %{spec.name} ({spec.kind}) has target {spec.target!r}; it takes none"
            )
    placeholders = {n.name for n in graph.placeholders}
    for spec in program.signature.outputs:
        if spec.kind not in OUTPUT_KINDS:
            raise VerifyError(f"output spec %{spec.name} has unknown kind {spec.kind!r}")
        if spec.kind in (BUFFER_MUTATION, PARAMETER_MUTATION) and (
            spec.target not in program.state_table()
        ):
            raise VerifyError(f"output %{spec.name} mutates {spec.target!r}, which is not state")
        if spec.kind == USER_INPUT_MUTATION and spec.target not in placeholders:
            raise VerifyError(
                f"output %{spec.name} mutates input {spec.target!r}, which is not a placeholder"
            )
