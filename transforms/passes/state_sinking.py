"""Sinking: state that arrives as a placeholder becomes a ``get_attr`` in the module owning it.

The one home of sinking: ``sink_state`` (the pass), ``finish_sinking`` (its last step, shared
with ``outline_and_sink``; the peer reads of ``transforms.passes.foreign_state``), ``StateOwners`` and
the pieces ``outline_and_sink`` uses to sink while outlining (at the end of this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyrsistent import pmap

from ir.errors import PassError
from ir.graph import Graph
from ir.module import ModuleId, split_call_target
from ir.node import CALL_MODULE, GET_ATTR, Node
from ir.program import Program
from ir.signature import STATE_INPUT_KINDS
from transforms import kernel as kn
from transforms.machinery.call_builder import OpenCall
from transforms.passes.foreign_state import carried_state, hold_foreign_state


def sink_state(program: Program) -> Program:
    """Replace every placeholder that carries state with a ``get_attr`` in its module.

    A placeholder carries state fqn ``f`` when every call of its graph passes a value that comes
    (through placeholders of callers, up to the root) from the root's input of ``f``. It is sunk
    when ``f``, or a tied alias of ``f``, lies below the module's path; the callers then stop
    passing it, and the root's signature drops state inputs. Placeholders of state owned
    elsewhere stay (a module reading a sibling's tensor keeps it as an argument), except in a
    preserved call, which must take only its signature's arguments: there the state is read
    through a peer that holds its owner (``transforms.passes.foreign_state.hold_foreign_state``, the
    last step).

    **Laws:** idempotent; never changes the number of compute nodes; the lowered module computes
    the same. Complexity: O(n + S) for n nodes and S state fqns.
    """
    return finish_sinking(_Sinker(program).run())


def finish_sinking(program: Program) -> Program:
    """The last step of ``sink_state`` (and of ``outline_and_sink``, which sinks while
    outlining): state that a preserved call reads but does not own is read through a peer that
    holds its owner (``transforms.passes.foreign_state.hold_foreign_state``).

    **Laws:** ``sink_state(p) == finish_sinking(<the sinking walk>(p))``; idempotent.
    Complexity: that of ``hold_foreign_state``, O(n + S).
    """
    return hold_foreign_state(program)


class StateOwners:
    """Which module path may read each state input as a ``get_attr``, and under which name."""

    def __init__(self, program: Program) -> None:
        state = program.state_table()
        by_tensor: dict[str, list[str]] = {}
        # fqn -> every fqn holding the same tensor (itself included), in registration order:
        # one list per tensor, shared by its fqns and complete once the loop is done
        self.aliases: dict[str, list[str]] = {}
        for fqn in program.state_order:
            tied = by_tensor.setdefault(state[fqn].tensor, [])
            tied.append(fqn)
            self.aliases[fqn] = tied
        # root placeholder name -> the state fqn it carries
        self.fqn_of: dict[str, str] = {
            s.name: s.target for s in program.signature.inputs if s.kind in STATE_INPUT_KINDS
        }

    def local_name(self, fqn: str, path: str) -> str | None:
        """``fqn``'s name relative to module ``path`` (through the first tied alias below it),
        or ``None`` when the tensor lives elsewhere."""
        prefix = path + "." if path else ""
        for alias in self.aliases.get(fqn, (fqn,)):
            if alias.startswith(prefix):
                return alias[len(prefix) :]
        return None

    def local_names(self, names: Sequence[str], path: str) -> dict[str, str]:
        """``{name: local_name(fqn, path)}`` for each of ``names`` (root placeholder names) that
        carries a state fqn with a local name below module ``path``, in ``names`` order. One
        loop with the path's prefix made once: a call's inputs are read together when it
        closes."""
        fqn_of, aliases = self.fqn_of, self.aliases
        prefix = path + "." if path else ""
        found = {}
        for name in names:
            fqn = fqn_of.get(name)
            if fqn is not None:
                for alias in aliases.get(fqn) or (fqn,):
                    if alias.startswith(prefix):
                        found[name] = alias[len(prefix) :]
                        break
        return found


def sunk_reads(
    placeholders: Sequence[Node], sunk: dict[str, str], body: Sequence[Node]
) -> list[Node]:
    """The ``get_attr`` nodes that replace the ``sunk`` placeholders (name -> local fqn) which
    ``body`` reads, in placeholder order; an unread one is dropped."""
    return input_reads([n.name for n in placeholders], sunk, body, {n.name: n for n in placeholders})


def input_reads(
    inputs: Sequence[str], sunk: dict[str, str], body: Sequence[Node], nodes: Mapping[str, Node]
) -> list[Node]:
    """The ``get_attr`` nodes that replace the ``sunk`` values among ``inputs`` (name -> local
    fqn) which ``body`` reads, in ``inputs`` order, each named as its node in ``nodes`` and
    carrying that node's meta (``kernel.carried``: the value keeps its name, none is drawn); an
    unread one is dropped. A plain call's placeholders need not be made first (``sunk_reads``
    is this for placeholders made already)."""
    read = {r.name for node in body for r in node.inputs()}
    return [
        kn.carried(GET_ATTR, name, sunk[name], meta=nodes[name].meta)
        for name in inputs
        if name in sunk and name in read
    ]


class _Sinker:
    def __init__(self, program: Program) -> None:
        self.p = program
        self.owners = StateOwners(program)
        # (module, variant) -> per placeholder: the state fqn it carries, or None
        self.carried: dict[tuple[ModuleId, int], list[str | None]] = {}
        self.sunk: dict[tuple[ModuleId, int], dict[int, str]] = {}

    def run(self) -> Program:
        p = self.p
        root_graph = p.root_module.graph
        if not self.owners.fqn_of:
            return p  # state reaches modules only from the root's inputs
        order, self.carried, _ = carried_state(p, through_attrs=False)
        for mid, variant in order:
            self._decide(mid, variant)
        modules = dict(p.module_table())
        for mid, variant in order:
            mod = modules[mid]
            graphs = list(mod.graphs)
            graphs[variant] = self._rewrite(mid, variant, graphs[variant])
            modules[mid] = mod.replace(graphs=tuple(graphs))
        signature = p.signature
        dropped = self.sunk.get((p.root, 0), {})
        if dropped:
            names = {root_graph.placeholders[i].name for i in dropped}
            signature = signature.__class__(
                tuple(s for s in signature.inputs if s.name not in names), signature.outputs
            )
        return p.replace(modules=pmap(modules), signature=signature)

    def _decide(self, mid: ModuleId, variant: int) -> None:
        path = self.p.first_path(mid) or ""
        decisions: dict[int, str] = {}
        for i, fqn in enumerate(self.carried[(mid, variant)]):
            if fqn is None:
                continue
            local = self.owners.local_name(fqn, path)
            if local is not None:
                decisions[i] = local
        self.sunk[(mid, variant)] = decisions

    def _rewrite(self, mid: ModuleId, variant: int, graph: Graph) -> Graph:
        decisions = self.sunk[(mid, variant)]
        placeholders = graph.placeholders
        body = []
        for node in graph.nodes[len(placeholders):]:
            if node.op == CALL_MODULE:
                node = self._drop_sunk_args(node, mid)
            body.append(node)
        sunk = {placeholders[i].name: local for i, local in decisions.items()}
        return sunk_graph(list(placeholders), sunk, body)

    def _drop_sunk_args(self, node: Node, mid: ModuleId) -> Node:
        path, k = split_call_target(node.target)
        child = self.p.resolve(path, mid)
        if child is None or (child, k) not in self.sunk:
            return node
        dropped = self.sunk[(child, k)]
        if not dropped:
            return node
        n_args = len(node.args)
        if any(i >= n_args for i in dropped):
            raise PassError(
                f"call {node.name!r} passes state to {node.target!r} by keyword; cannot sink it"
            )
        args = tuple(a for i, a in enumerate(node.args) if i not in dropped)
        return node.replace(args=args)


# --- sinking while outlining (``outline_and_sink``) -------------------------------------------
# ``sink_state`` after ``outline`` rebuilds every module graph a second time. When each module
# sits at one path and no preserved signature passes state, the same decision is made when
# ``outline`` closes a call: a state input owned below the call's module (``StateOwners``) is
# read with a ``get_attr`` instead of a placeholder. These are the three pieces of that decision.


def sinks_in_one_pass(program: Program) -> bool:
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


def sunk_inputs(owners: StateOwners | None, call: OpenCall) -> dict[str, str]:
    """The state inputs of ``call`` read as ``get_attr`` (name -> fqn local to the call's
    module) when sinking (``owners`` given); state owned elsewhere stays an input."""
    if owners is None:
        return {}
    if call.frame is None:
        return owners.local_names([n.name for n in call.placeholders], call.path)
    if call.extra_inputs:
        return owners.local_names(call.inputs + call.extra_inputs, call.path)
    return owners.local_names(call.inputs, call.path)


def sunk_graph(placeholders: list[Node], sunk: dict[str, str], body: list[Node]) -> Graph:
    """A call's graph (``kernel.built``) with its ``sunk`` placeholders turned into reads of
    the state."""
    if not sunk:
        return kn.built(placeholders + body)
    kept = [n for n in placeholders if n.name not in sunk]
    return kn.built(kept + sunk_reads(placeholders, sunk, body) + body)
