"""Outlining: split the flat root graph into one graph per module call.

The flat graph's nodes carry module stacks; each maximal run of nodes inside one call of one
module becomes that module's graph (a new graph variant per call), and the caller gets a
``call_module`` node. Values flow into a call as placeholders and out as outputs, except at
preserved call signatures, where the call takes and returns exactly the eager
``(args, kwargs)`` / output pytrees of ``preserve_module_call_signature``, and state (including
intermediate values of state, ``transforms.ivals``) is the only other thing that crosses them.

The partition key is pluggable (``outline_by``): the module stack is one key, tags another.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

from ir.args import IDict, Ref, iter_refs, map_refs, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.module import PLAIN, Module, ModuleId, call_target, kind_of_type
from ir.names import Names, fresh_name
from ir.node import CALL_FUNCTION, CALL_MODULE, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from ir.runtime import expect_constant
from ir.signature import CONSTANT, STATE_INPUT_KINDS, CallSignature
from transforms.foreign_state import hold_foreign_state
from transforms.ival_insertion import insert_ivals
from transforms.ivals import mutation_sources
from transforms.remat import rematerialize
from transforms.sharing import canonical_paths
from transforms.signatures import repair_call_signatures
from transforms.sink import StateOwners, sink_state, sunk_reads
from transforms.stacks import Frame, node_frames

FrameOf = Callable[[Node], "tuple[Frame, ...] | None"]
CopiedWhereRead = Callable[[Node], bool]


def outline(program: Program) -> Program:
    """Split the flat root graph into per-call module graphs following ``nn_module_stack``.

    Modules that state aliasing shows to be one object (every state tensor under two paths tied,
    same class) become one ModuleId. A value read across a preserved call boundary without
    being in the call's signature must be state, and is read from the state:

    - the result of a state mutation (an in-place op, or the value a ``copy_`` writes);
    - an intermediate value of a root input's functional update chain (an "ival", see
      ``transforms.ivals``): a new ``copy_(input, value)`` right after it, in the call that
      computes it, writes it back, and the calls that read it read the input. This is what lets
      a preserved module that updates a buffer run more than once in a decomposed program;

    any other value is first read as an alias or recomputed on the reading side
    (``transforms.remat.rematerialize``).

    **Laws:** ``inline(outline(p))`` is alpha-equivalent to ``p`` (without preserved calls);
    ``outline(outline(p)) == outline(p)``; compute nodes are neither added nor removed except
    the call plumbing, one ``copy_`` per ival and the copies ``rematerialize`` makes. Raises
    ``PassError`` naming the node for a node without a module stack, a value that cannot cross a preserved boundary (neither state
    nor on a state's update chain), or an ival that a read would see after the state has
    changed again. Complexity: O(n) in the number of nodes: the flat-graph passes
    (``repair_call_signatures``, ``rematerialize``, ``transforms.ival_insertion.insert_ivals``)
    run first, then one outlining walk.
    """
    return outline_by(program, node_frames)


def outline_and_sink(program: Program) -> Program:
    """``sink_state(outline(program))``, in one pass over the flat graph where that is exact.

    Sinking while outlining rebuilds each module graph once instead of twice. It is exact when
    each module sits at one path and no preserved call signature names a state input; otherwise
    (and for a program already outlined) the two passes run one after the other.
    ``transform`` runs this for the pair ``outline, sink_state`` in a pipeline.

    **Laws:** ``outline_and_sink(p) == sink_state(outline(p))``. Complexity: O(n).
    """
    if any(n.op == CALL_MODULE for n in program.root_module.graph.nodes):
        return sink_state(program)
    program = _prepare(program, node_frames)
    outliner = _Outliner(program, node_frames, owners=StateOwners(program))
    if outliner.canon or not _sinks_in_one_pass(program):
        outliner.owners = None
        return sink_state(outliner.run())
    return hold_foreign_state(outliner.run())  # the last step of ``sink_state``


def _sinks_in_one_pass(program: Program) -> bool:
    """Whether sinking at each call's close matches ``sink_state``: every module id is its one
    path (``sink_state`` names state from a module's first path), and no preserved signature
    passes state in or out (its value would not come from a placeholder chain)."""
    if any(path and path != mid for path, mid in program.walk()):
        return False
    state = {s.name for s in program.signature.inputs if s.kind in STATE_INPUT_KINDS}
    for sig in program.call_signatures.values():
        if any(arg.name in state for arg in sig.inputs + sig.outputs):
            return False
    return True


def outline_by(
    program: Program, frames_of: FrameOf, *, copied: CopiedWhereRead | None = None
) -> Program:
    """``outline`` with another partition key: ``frames_of(node)`` gives the nested calls a node
    runs in (outermost first), or ``None`` to keep it in the current call.

    ``copied(node)`` marks nodes (without inputs, such as ``get_attr``) that belong to no call:
    each call that reads one gets its own copy instead of an input; none is made where unread.
    """
    root = program.root_module
    if any(n.op == CALL_MODULE for n in root.graph.nodes):
        return program
    program = _prepare(program, frames_of)
    return _Outliner(program, frames_of, copied).run()


def _prepare(program: Program, frames_of: FrameOf) -> Program:
    """The flat-graph passes that make every value crossing a preserved boundary either part
    of its signature or state: repair stale signatures, rematerialize, insert ivals."""
    program = repair_call_signatures(program, frames_of)
    program = rematerialize(program, frames_of)
    return insert_ivals(program, frames_of)


def _never(node: Node) -> bool:
    return False


class _Call:
    """One open module call while outlining: a local builder, frozen when the call closes."""

    def __init__(self, frame: Frame | None, path: str, start: int, sig: CallSignature | None):
        self.frame = frame
        self.path = path
        self.start = start
        self.sig = sig
        self.placeholders: list[Node] = []
        self.body: list[Node] = []
        self.env: dict[str, Any] = {}
        self.inputs: list[str] = []
        self.extra_inputs: list[str] = []
        self.defined: list[str] = []
        self.n_positional = 0


class _Outliner:
    def __init__(
        self,
        program: Program,
        frames_of: FrameOf,
        copied: CopiedWhereRead | None = None,
        *,
        owners: StateOwners | None = None,
    ) -> None:
        self.p = program
        self.frames_of = frames_of
        self.copied = copied or _never
        self.graph = program.root_module.graph
        self.nodes = self.graph.nodes
        self.position = {n.name: i for i, n in enumerate(self.nodes)}
        self.last_use = _last_uses(self.graph)
        self._count_signature_uses()
        self.by_name = self.graph.by_name()
        self.canon = canonical_paths(program, _identity_keys(self.nodes, frames_of))
        self.aliased_state, self.mutated_state = mutation_sources(self.graph, program)
        self.hidden: set[str] = set()
        self.variants: dict[ModuleId, list[Graph]] = {}
        self.types: dict[ModuleId, str | None] = {}
        self.subgraph_owner: dict[str, ModuleId] = {}
        self.state_inputs = {
            s.name for s in program.signature.inputs if s.kind in STATE_INPUT_KINDS
        }
        self.taken: set[str] = Names(n.name for n in self.nodes)
        # sinking while outlining (``outline_and_sink``): where each state input may be a get_attr
        self.owners = owners
        self.root_sunk: dict[str, str] = {}

    def _count_signature_uses(self) -> None:
        """A preserved call reads its signature inputs when it starts and must hand back its
        outputs when it ends, even if no node reads them there: count both as uses."""
        if len(self.p.call_signatures) <= 1:
            return
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.op in (PLACEHOLDER, OUTPUT) or not node.meta.get("nn_module_stack"):
                continue
            for frame in self.frames_of(node) or ():
                first.setdefault(frame.call_name, i)
                last[frame.call_name] = i
        for name, sig in self.p.call_signatures.items():
            if name not in first:
                continue
            for arg in sig.inputs:
                if arg.name:
                    self.last_use[arg.name] = max(self.last_use.get(arg.name, -1), first[name])
            for arg in sig.outputs:
                if arg.name:
                    self.last_use[arg.name] = max(self.last_use.get(arg.name, -1), last[name] + 1)

    # --- driver -----------------------------------------------------------------------------

    def run(self) -> Program:
        return self._finish(self._outline_root())

    def _outline_root(self) -> Graph:
        root = _Call(None, "", 0, None)
        stack = [root]
        for at, node in enumerate(self.nodes):
            if node.op == PLACEHOLDER:
                root.placeholders.append(node)
                root.env[node.name] = node.ref
            elif node.op == OUTPUT:
                while len(stack) > 1:
                    self._close(stack, at)
                root.body.append(node.replace(args=self._args(root, node.args)))
            elif self.copied(node):
                continue  # copied into each call that reads it (``_read``)
            else:
                self._enter(stack, node, at)
                self._copy(stack[-1], node)
        self.root_sunk = self._sunk(root)
        return _sunk_graph(root.placeholders, self.root_sunk, root.body)

    def _enter(self, stack: list[_Call], node: Node, at: int) -> None:
        frames = self.frames_of(node)
        if frames is None:
            return
        depth = 0
        while depth < len(frames) and depth + 1 < len(stack) and stack[depth + 1].frame == frames[depth]:
            depth += 1
        while len(stack) > depth + 1:
            self._close(stack, at)
        for frame in frames[depth:]:
            self._open(stack, frame, at)

    def _open(self, stack: list[_Call], frame: Frame, start: int) -> None:
        sig = self.p.call_signatures.get(frame.call_name) if frame.path else None
        call = _Call(frame, frame.path, start, sig)
        if sig is not None:
            self._open_preserved(call, sig)
        stack.append(call)

    # --- copying nodes ----------------------------------------------------------------------

    def _copy(self, call: _Call, node: Node, define: bool = True) -> None:
        args = self._args(call, node.args)
        kwargs = self._args(call, node.kwargs)
        if node.op == GET_ATTR and self.p.resolve(node.target) is not None:
            self.subgraph_owner[node.target] = self.canon.get(call.path, call.path)
        call.body.append(node.replace(args=args, kwargs=kwargs))
        call.env[node.name] = node.ref
        if define:
            call.defined.append(node.name)

    def _args(self, call: _Call, tree: Any) -> Any:
        return map_refs(tree, lambda r: self._read(call, r.name))

    def _read(self, call: _Call, name: str) -> Any:
        """The local value of flat value ``name`` in ``call``, threading it in if needed."""
        found = call.env.get(name)
        if found is not None:
            return found
        shared = self.by_name.get(name)
        if shared is not None and self.copied(shared):
            self._copy(call, shared, define=False)  # a copy per call: never returned from it
            return call.env[name]
        if name in self.hidden:
            return self._read(call, self._ival_source(name, call))
        if name in self.aliased_state:
            # an in-place result is its mutated state: read the state itself (sinkable)
            return self._read(call, self.aliased_state[name])
        if name not in self.by_name:
            raise PassError(f"a node reads %{name}, which no node of the root graph defines")
        if call.frame is None:
            raise PassError(f"value %{name} is read before it is defined in the root graph")
        node = self.by_name[name]
        if call.sig is not None:
            source = self.mutated_state.get(name)
            if source is not None:
                return self._read(call, source)
            if name not in self.state_inputs:
                raise PassError(
                    f"value %{name} is computed outside the preserved call {call.frame.call_name!r} "
                    "and read inside it without being one of its inputs; purefx can only carry "
                    "state and state mutations across a preserved signature"
                )
            # state threaded into a preserved call goes after its positional placeholders (and
            # before its keyword ones); sinking removes it again
            at = call.n_positional + len(call.extra_inputs)
            call.extra_inputs.append(name)
            call.placeholders.insert(at, Node(PLACEHOLDER, name, name, meta=node.meta))
            call.env[name] = ref(name)
            return call.env[name]
        call.inputs.append(name)
        call.placeholders.append(Node(PLACEHOLDER, name, name, meta=node.meta))
        call.env[name] = ref(name)
        return call.env[name]

    def _ival_source(self, name: str, call: _Call) -> str:
        source = self.mutated_state.get(name)
        if source is None:
            where = call.frame.call_name if call.frame else "<root>"
            raise PassError(
                f"value %{name} is produced inside a preserved call and read in {where!r} "
                "without being an output of that call; only state mutations can be carried"
            )
        return source

    def _mutated_input(self, name: str) -> str | None:
        """The user input (not state) that value ``name`` is a state of, or ``None``."""
        dest = self.mutated_state.get(name)
        return dest if dest is not None and dest not in self.state_inputs else None

    # --- closing calls ----------------------------------------------------------------------

    def _close(self, stack: list[_Call], end: int) -> None:
        call = stack.pop()
        parent = stack[-1]
        mid = self.canon.get(call.path, call.path)
        variant = len(self.variants.setdefault(mid, []))
        self.types.setdefault(mid, call.frame.type_name)
        target = call_target(_relative(parent.path, call.path, call.frame), variant)
        sunk = self._sunk(call)
        if call.sig is not None:
            graph = self._close_preserved(call, parent, target, sunk)
        else:
            graph = self._close_plain(call, parent, target, end, sunk)
        self.variants[mid].append(graph)

    def _sunk(self, call: _Call) -> dict[str, str]:
        """The state inputs of ``call`` read as ``get_attr`` (name -> fqn local to the call's
        module) when sinking; state owned elsewhere stays an input."""
        owners = self.owners
        if owners is None:
            return {}
        if call.frame is None:
            names: list[str] = [n.name for n in call.placeholders]
        else:
            names = call.inputs + call.extra_inputs
        sunk = {}
        for name in names:
            fqn = owners.fqn_of.get(name)
            if fqn is not None:
                local = owners.local_name(fqn, call.path)
                if local is not None:
                    sunk[name] = local
        return sunk

    def _pass_inputs(self, parent: _Call, names: list[str], sunk: dict[str, str]) -> list[Any]:
        """The caller's values for inputs ``names``; a sunk one is still threaded through the
        caller (as ``outline`` alone would, so placeholder order stays the same) but not passed."""
        values = []
        for name in names:
            value = self._read(parent, name)
            if name not in sunk:
                values.append(value)
        return values

    def _close_plain(
        self, call: _Call, parent: _Call, target: str, end: int, sunk: dict[str, str]
    ) -> Graph:
        # in-place results are not returned: readers outside read the mutated state instead
        outputs = [
            v for v in call.defined if self.last_use.get(v, -1) >= end and v not in self.aliased_state
        ]
        local = [call.env[v] for v in outputs]
        returned = local[0] if len(local) == 1 else tuple(local)
        out_name = fresh_name("output", self.taken)
        body = call.body + [Node(OUTPUT, out_name, "output", (returned,))]
        args = tuple(self._pass_inputs(parent, call.inputs, sunk))
        if len(outputs) == 1:
            name = outputs[0]
        else:
            name = fresh_name(_call_base(target), self.taken)
        parent.body.append(Node(CALL_MODULE, name, target, args, meta=_call_meta(call)))
        if len(outputs) == 1:
            parent.env[name] = ref(name)
        else:
            for i, v in enumerate(outputs):
                parent.body.append(Node(CALL_FUNCTION, v, operator.getitem, (ref(name), i)))
                parent.env[v] = ref(v)
        parent.defined.extend(outputs)
        return _sunk_graph(call.placeholders, sunk, body)

    def _open_preserved(self, call: _Call, sig: CallSignature) -> None:
        args_spec, kwargs_spec = _split_in_spec(sig, call.frame.call_name)
        taken = self.taken
        arg_refs = []
        for i in range(args_spec.num_children):
            name = fresh_name(f"_positional_arg_{i}", taken)
            call.placeholders.append(Node(PLACEHOLDER, name, name))
            arg_refs.append(ref(name))
        call.n_positional = len(arg_refs)
        kwarg_refs = []
        keys = {str(k) for k in kwargs_spec.context}
        for key in kwargs_spec.context:
            # keyword placeholders keep their exact names: callers pass them by keyword
            call.placeholders.append(Node(PLACEHOLDER, str(key), str(key)))
            kwarg_refs.append((key, ref(str(key))))
        flat = fresh_name("_flat_args", taken)
        call.body.append(
            Node(
                CALL_FUNCTION,
                flat,
                fx_pytree.tree_flatten_spec,
                ((tuple(arg_refs), IDict(tuple(kwarg_refs))), sig.in_spec),
            )
        )
        for i, arg in enumerate(sig.inputs):
            named = arg.kind != CONSTANT and bool(arg.name)
            if named and arg.name not in keys and arg.name not in call.env:
                name = arg.name
            else:
                name = fresh_name(f"_constant_{i}" if not named else arg.name, taken)
            meta = self.by_name[arg.name].meta if arg.name in self.by_name else {}
            call.body.append(Node(CALL_FUNCTION, name, operator.getitem, (ref(flat), i), meta=meta))
            if named:
                call.env.setdefault(arg.name, ref(name))
                mutated = self._mutated_input(arg.name)
                if mutated is not None:
                    # the caller passes the user input itself (it holds this value now), so
                    # writes to the input in here write to this argument
                    call.env.setdefault(mutated, ref(name))
            elif arg.kind == CONSTANT:
                where = f"input {i} of preserved call {call.frame.call_name!r}"
                checked = fresh_name(f"_checked_{i}", taken)
                call.body.append(
                    Node(CALL_FUNCTION, checked, expect_constant, (ref(name), arg.value, where))
                )

    def _close_preserved(
        self, call: _Call, parent: _Call, target: str, sunk: dict[str, str]
    ) -> Graph:
        sig = call.sig
        taken = self.taken
        leaves = []
        for out in sig.outputs:
            if out.kind == CONSTANT or not out.name:
                leaves.append(out.value)
            elif out.name in self.by_name:
                leaves.append(self._read(call, out.name))
            else:
                leaves.append(None)
        tree = fresh_name("_tree_out", taken)
        out_name = fresh_name("output", taken)
        body = call.body + [
            Node(CALL_FUNCTION, tree, pytree.tree_unflatten, (tuple(leaves), sig.out_spec)),
            Node(OUTPUT, out_name, "output", (ref(tree),)),
        ]
        exported = {out.name for out in sig.outputs if out.name}
        self.hidden.update(v for v in call.defined if v not in exported)
        self._call_preserved(call, parent, target, sunk)
        return _sunk_graph(call.placeholders, sunk, body)

    def _call_preserved(
        self, call: _Call, parent: _Call, target: str, sunk: dict[str, str]
    ) -> None:
        sig = call.sig
        args_spec, kwargs_spec = _split_in_spec(sig, call.frame.call_name)
        taken = self.taken

        def new(base: str, op_target: Any, args: tuple, kwargs: IDict | None = None) -> Ref:
            name = fresh_name(base, taken)
            parent.body.append(Node(CALL_FUNCTION, name, op_target, args, kwargs or IDict(())))
            return ref(name)

        values = []
        for arg in sig.inputs:
            if arg.kind == CONSTANT or not arg.name:
                values.append(arg.value)
            elif arg.name in self.by_name:
                values.append(self._read(parent, arg.name))
            else:
                values.append(None)
        tree = new("_tree_in", pytree.tree_unflatten, (tuple(values), sig.in_spec))
        args_ref = new("_args", operator.getitem, (tree, 0))
        kwargs_ref = new("_kwargs", operator.getitem, (tree, 1))
        call_args = [new("_arg", operator.getitem, (args_ref, i)) for i in range(args_spec.num_children)]
        call_kwargs = [(k, new(f"_kwarg_{k}", operator.getitem, (kwargs_ref, k))) for k in kwargs_spec.context]
        call_args += self._pass_inputs(parent, call.extra_inputs, sunk)
        name = fresh_name(_call_base(target), taken)
        parent.body.append(
            Node(CALL_MODULE, name, target, tuple(call_args), IDict(tuple(call_kwargs)), meta=_call_meta(call))
        )
        flat = new("_flat_out", fx_pytree.tree_flatten_spec, (ref(name), sig.out_spec))
        for i, out in enumerate(sig.outputs):
            if out.kind == CONSTANT or not out.name or out.name not in self.by_name:
                continue
            # an output the caller already holds (an input handed back, or the same value out of
            # two calls) gets a new local name; readers after the call read the call's result
            local = fresh_name(out.name, taken) if out.name in parent.env else out.name
            meta = self.by_name[out.name].meta
            parent.body.append(Node(CALL_FUNCTION, local, operator.getitem, (flat, i), meta=meta))
            if out.name not in parent.env:
                parent.defined.append(out.name)
            parent.env[out.name] = ref(local)
            self.hidden.discard(out.name)

    # --- the new module table ---------------------------------------------------------------

    def _finish(self, root_graph: Graph) -> Program:
        p = self.p
        modules = dict(p.modules)
        for mid, graphs in self.variants.items():
            _ensure_path(modules, p.root, mid)
            mod = modules[mid]
            type_name = mod.type_name or self.types.get(mid)
            kind = mod.kind if mod.kind != PLAIN else kind_of_type(type_name)
            modules[mid] = mod.replace(type_name=type_name, kind=kind, graphs=tuple(graphs))
        root = modules[p.root].replace(graphs=(root_graph,))
        modules[p.root] = root
        signature = _renamed_outputs(p.signature, root_graph)
        if self.root_sunk:
            inputs = tuple(s for s in signature.inputs if s.name not in self.root_sunk)
            signature = attrs.evolve(signature, inputs=inputs)
        _move_subgraphs(modules, p.root, self.subgraph_owner)
        for mid, mod in list(modules.items()):
            kids = tuple((n, self.canon.get(c, c)) for n, c in mod.children)
            if kids != mod.children:
                modules[mid] = mod.replace(children=kids)
        reachable = reachable_modules(modules.__getitem__, p.root)
        keep = set(reachable)
        table = p.modules.evolver()
        for mid in list(p.modules.keys()):
            if mid not in keep:
                del table[mid]
        for mid in reachable:
            if p.modules.get(mid) is not modules[mid]:
                table[mid] = modules[mid]
        return p.replace(modules=table.persistent(), signature=signature)


# --- helpers ----------------------------------------------------------------------------------


def _renamed_outputs(signature: Any, graph: Graph) -> Any:
    """Output specs naming what the root now returns (a read of an in-place result becomes a
    read of the state or input it mutated)."""
    values = graph.outputs if isinstance(graph.outputs, tuple) else (graph.outputs,)
    if len(values) != len(signature.outputs):
        return signature
    specs = tuple(
        attrs.evolve(spec, name=value.name)
        if spec.name is not None and isinstance(value, Ref) and value.name != spec.name
        else spec
        for value, spec in zip(values, signature.outputs)
    )
    if all(a is b for a, b in zip(specs, signature.outputs)):
        return signature
    return attrs.evolve(signature, outputs=specs)


def _sunk_graph(placeholders: list[Node], sunk: dict[str, str], body: list[Node]) -> Graph:
    """A call's graph with its ``sunk`` placeholders turned into reads of the state."""
    if not sunk:
        return Graph(tuple(placeholders + body))
    kept = [n for n in placeholders if n.name not in sunk]
    return Graph(tuple(kept + sunk_reads(placeholders, sunk, body) + body))


def _last_uses(graph: Graph) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for r in iter_refs(node.args):
            last[r.name] = i
        for r in iter_refs(node.kwargs):
            last[r.name] = i
    return last


def _identity_keys(nodes: Sequence[Node], frames_of: FrameOf) -> dict[str, str]:
    """Module path -> identity key, where a key is seen under two paths (strict export's keys
    are object identities; non-strict ones are derived from the path and tell nothing)."""
    paths_of: dict[str, dict[str, None]] = {}
    # frame tuples seen, by identity (``node_frames`` shares one per stack); held so that no
    # id is reused by a later tuple
    seen: dict[int, tuple] = {}
    for node in nodes:
        if node.op in (PLACEHOLDER, OUTPUT) or not node.meta.get("nn_module_stack"):
            continue
        frames = frames_of(node) or ()
        if id(frames) in seen:
            continue
        seen[id(frames)] = frames
        for frame in frames:
            paths_of.setdefault(frame.key, {})[frame.path] = None
    return {path: key for key, paths in paths_of.items() if len(paths) > 1 for path in paths}


def _split_in_spec(sig: CallSignature, call_name: str) -> tuple[Any, Any]:
    spec = sig.in_spec
    children = spec.children() if spec.type is tuple and spec.num_children == 2 else None
    if not children or children[0].type is not tuple or children[1].type is not dict:
        raise PassError(
            f"preserved call {call_name!r} has input spec {spec}, not the (args, kwargs) pair "
            "torch.export records; re-export the program"
        )
    return children[0], children[1]


def _relative(parent: str, child: str, frame: Frame) -> str:
    if parent == "":
        return child
    if not child.startswith(parent + "."):
        raise PassError(
            f"module call {frame.call_name!r} is not inside its caller {parent!r}; run "
            "fix_module_stacks first"
        )
    return child[len(parent) + 1 :]


def _call_base(target: str) -> str:
    return target.replace(".", "_").replace("@", "_")


def _call_meta(call: _Call) -> dict[str, Any]:
    frame = call.frame
    return {"purefx_call": frame.call_name} if frame else {}


def _ensure_path(modules: dict[ModuleId, Module], root: ModuleId, path: str) -> None:
    """Create holder modules so that ``path`` exists (ids are paths)."""
    if not path or path in modules:
        return
    parent, _, name = path.rpartition(".")
    _ensure_path(modules, root, parent)
    parent_id = parent if parent else root
    modules[path] = Module()
    modules[parent_id] = modules[parent_id].with_child(name, path)


def _move_subgraphs(modules: dict[ModuleId, Module], root: ModuleId, owner: dict[str, ModuleId]) -> None:
    """Re-parent higher-order-op subgraph modules under the module whose graph reads them."""
    for name, new_owner in owner.items():
        if new_owner in ("", root):
            continue
        sub = modules[root].child(name)
        if sub is None:
            continue
        kids = tuple((n, c) for n, c in modules[root].children if n != name)
        modules[root] = modules[root].replace(children=kids)
        modules[new_owner] = modules[new_owner].with_child(name, sub)


def reachable_modules(module_of: Callable[[ModuleId], Module], root: ModuleId) -> list[ModuleId]:
    """Every module id reachable from ``root`` through children (``module_of`` looks one up)."""
    seen: dict[ModuleId, None] = {}
    stack = [root]
    while stack:
        mid = stack.pop()
        if mid in seen:
            continue
        seen[mid] = None
        stack.extend(c for _, c in module_of(mid).children)
    return list(seen)
