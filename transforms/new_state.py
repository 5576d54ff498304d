"""New state a pass adds to a Program: buffers and lifted constants.

A pass that adds state (``Edit.constant`` / ``Edit.add_buffer``, ``fold_constants``,
``fold_into_state``) makes one ``NewState`` for its run and asks it, through the rewriting
kernel (``transforms.kernel.WorkingGraph.state_read``), for each new entry: on the
root graph of a flat program ``root_input`` (state of the module the node runs in, read by a
placeholder with its ``InputSpec``), in any other graph ``attribute`` (an attribute of the
graph's module, state under each of its paths, read by a ``get_attr``). Both are a fresh
attribute name (``name``), the slot and the tensor (``add``); the kernel names and makes the
node that reads them (a root placeholder's spec is ``read_by``).
``place`` puts the new placeholders among the root graph's nodes and ``apply`` puts the state
and the input specs in the Program, once, at the end.

Where the new root inputs go is torch.export's order (its lifting pass inserts new constants
before the first user input): a new buffer after the tokens, parameters and buffers; a new
constant after every state input (tokens, parameters, buffers, constants, custom objects);
both before the user inputs, several of a kind in the order they were added. In
``state_order`` a new buffer goes after the last parameter or buffer and a new constant last,
then all of it is put where ``import_ep`` puts it when it reads the program ``export_ep`` makes
(the state dict first, then the constants, with each non-persistent buffer after the buffer
before it, and a first buffer that is non-persistent, when no buffer is persistent, last), so
a round trip keeps the order. (A hand-built program whose order ``import_ep`` would not give
keeps its order and gets the new state as above.)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs
import torch
from pyrsistent import pmap

from ir import signature as sg
from ir import state as st
from ir.import_ep import registration_order
from ir.module import ModuleId
from ir.node import PLACEHOLDER, Node
from ir.program import Program

__all__ = ["NewState"]

# the root inputs a new input of each kind goes after
_AFTER = {
    st.BUFFER: (sg.TOKEN, sg.PARAMETER, sg.BUFFER),
    st.CONSTANT: (sg.TOKEN, *sg.STATE_INPUT_KINDS),
}
_REGISTERED = (st.PARAMETER, st.BUFFER)  # a new buffer goes after these in state_order
_INPUT_KIND = {st.BUFFER: sg.BUFFER, st.CONSTANT: sg.CONSTANT_TENSOR}
_PREFIX = {st.BUFFER: "b_", st.CONSTANT: "c_"}


class NewState:
    """The state one pass run adds to ``p``: fresh names, slots, tensors and root inputs.

    Names are fresh against ``p`` and everything added before: an attribute name is no child
    of its module and no state under any path that reaches it; a tensor key is no key of
    ``p``'s tensor table (the kernel names the nodes that read them). ``p`` is
    never written. Each method is O(1) amortized but the first ``name`` (O(state + modules),
    once), ``drop`` (O(new state)), ``place`` and ``apply`` (O(inputs + nodes + state)).
    """

    __slots__ = ("_below", "_names", "inputs", "order", "p", "slots", "tensors")

    def __init__(self, p: Program) -> None:
        self.p = p
        self.slots: dict[str, st.Slot] = {}  # new fqn -> its slot (every path's fqn)
        self.tensors: dict[str, st.Opaque] = {}  # new tensor key -> the tensor
        self.order: list[str] = []  # new fqns, in the order added
        self.inputs: dict[str, sg.InputSpec] = {}  # new root placeholder name -> its spec
        self._below: dict[str, set[str]] | None = None
        self._names: dict[ModuleId, set[str]] = {}

    def owner(self, node: Node) -> tuple[str, ModuleId]:
        """The path and id of the module a flat root graph's ``node`` runs in: the innermost
        entry of its ``nn_module_stack`` when that path names a module of ``p``, else the root
        (``""``)."""
        stack = node.meta.get("nn_module_stack")
        path = list(stack.values())[-1][0] if stack else ""
        mid = self.p.resolve(path) if path else None
        return (path, mid) if mid is not None else ("", self.p.root)

    def name(self, mid: ModuleId, base: str) -> str:
        """``base``, or ``base_1``, ``base_2``, ...: the first attribute name of module ``mid``
        that no child, no state of ``p`` under any of its paths and nothing added here takes;
        it is taken from then on."""
        taken = self._names.get(mid)
        if taken is None:
            if self._below is None:
                self._below = {}
                for fqn in self.p.state_table():
                    parts = fqn.split(".")
                    for i in range(len(parts)):
                        self._below.setdefault(".".join(parts[:i]), set()).add(parts[i])
            taken = {name for name, _ in self.p.module_table()[mid].children}
            for path in self.p.module_paths(mid):
                taken |= self._below.get(path, set())
            self._names[mid] = taken
        local, i = base, 1
        while local in taken:
            local, i = f"{base}_{i}", i + 1
        taken.add(local)
        return local

    def add(
        self, kind: str, fqns: Sequence[str], tensor: torch.Tensor, persistent: bool = True
    ) -> str:
        """Hold ``tensor`` (as it is, never written) as new ``kind`` state (``st.BUFFER`` or
        ``st.CONSTANT``) at each of ``fqns`` (one tensor: a module reached by several paths
        holds it under each); return its tensor key, the first fqn (``_1``, ... when ``p``
        holds that key). ``persistent`` is a buffer's; a constant is outside the state dict."""
        key, i = fqns[0], 1
        while key in self.p.tensor_table() or key in self.tensors:
            key, i = f"{fqns[0]}_{i}", i + 1
        slot = st.Slot(kind, key, persistent if kind == st.BUFFER else True, False)
        self.tensors[key] = st.Opaque(tensor)
        for fqn in fqns:
            self.slots[fqn] = slot
            self.order.append(fqn)
        return key

    def placeholder_base(self, kind: str, fqn: str) -> str:
        """What the root placeholder reading new state ``fqn`` is named after: ``b_<fqn>`` or
        ``c_<fqn>``, dots as ``_`` (the kernel makes it fresh in its graph)."""
        return _PREFIX[kind] + fqn.replace(".", "_")

    def read_by(self, kind: str, fqn: str, name: str) -> None:
        """Root placeholder ``name`` reads new state ``fqn`` (added by ``add``): its
        ``InputSpec`` goes in the signature at ``apply``."""
        slot = self.slots[fqn]
        persistent = slot.persistent if kind == st.BUFFER else None
        self.inputs[name] = sg.InputSpec(_INPUT_KIND[kind], name, fqn, persistent)

    def root_input(
        self, kind: str, base: str, tensor: torch.Tensor, node: Node, persistent: bool = True,
    ) -> str:
        """New state on the root graph of a flat program: ``tensor`` at ``<owner>.<name>``
        (``owner(node)``; ``name`` fresh from ``base``); returns that fqn, which a placeholder
        then reads (``read_by``)."""
        path, mid = self.owner(node)
        local = self.name(mid, base)
        fqn = f"{path}.{local}" if path else local
        self.add(kind, (fqn,), tensor, persistent)
        return fqn

    def attribute(
        self, kind: str, mid: ModuleId, base: str, tensor: torch.Tensor, persistent: bool = True,
    ) -> tuple[str, str]:
        """New state of module ``mid`` (a graph that is not a flat root): ``tensor`` as
        attribute ``name`` (fresh from ``base``) of the module, state under every path that
        reaches it. Returns the attribute name (the ``get_attr``'s target) and the fqn under
        the module's first path."""
        local = self.name(mid, base)
        fqns = [f"{path}.{local}" if path else local for path in self.p.module_paths(mid)]
        self.add(kind, fqns, tensor, persistent)
        return local, fqns[0]

    def drop(self, fqns: Collection[str]) -> None:
        """Forget the new state at ``fqns``: their tensors, every fqn holding one of them and
        their placeholders' specs. O(new state)."""
        keys = {self.slots[f].tensor for f in fqns}
        gone = {f for f, s in self.slots.items() if s.tensor in keys}
        for key in keys:
            del self.tensors[key]
        self.slots = {f: s for f, s in self.slots.items() if f not in gone}
        self.order = [f for f in self.order if f not in gone]
        self.inputs = {n: s for n, s in self.inputs.items() if s.target not in gone}

    def input_specs(self, specs: Sequence[sg.InputSpec]) -> tuple[sg.InputSpec, ...]:
        """``specs`` (the root's) with the new inputs where torch.export puts them (see the
        module docstring). O(inputs)."""
        if not self.inputs:
            return tuple(specs)
        new = {kind: [s for s in self.inputs.values() if s.kind == _INPUT_KIND[kind]]
               for kind in _AFTER}
        at = {kind: max((i + 1 for i, s in enumerate(specs) if s.kind in kinds), default=0)
              for kind, kinds in _AFTER.items()}
        b, c = at[st.BUFFER], at[st.CONSTANT]  # b <= c: a buffer's kinds are a constant's too
        return (*specs[:b], *new[st.BUFFER], *specs[b:c], *new[st.CONSTANT], *specs[c:])

    def place(self, nodes: Sequence[Node], specs: Sequence[sg.InputSpec], new: Sequence[Node]
              ) -> list[Node]:
        """A root graph's ``nodes`` (whose placeholders ``specs`` describe) with the ``new``
        placeholders among the old, in the order of ``input_specs(specs)``; a placeholder
        without a spec (a hand-built program) stays after them. O(nodes)."""
        by_name = {n.name: n for n in nodes if n.op == PLACEHOLDER}
        by_name.update((n.name, n) for n in new)
        placed = [by_name.pop(s.name) for s in self.input_specs(specs) if s.name in by_name]
        return placed + list(by_name.values()) + [n for n in nodes if n.op != PLACEHOLDER]

    def apply(self, q: Program) -> Program:
        """``q`` (the pass's result before the new state: ``p`` with its graphs edited) with the
        new state slots, tensors, ``state_order`` entries (see the module docstring; several of
        a kind in the order added) and root input specs; ``q`` itself when nothing was added.
        O(state + inputs)."""
        if not self.slots:
            return q
        old, state = q.state_order, q.state_table()
        at = max((i + 1 for i, f in enumerate(old) if state[f].kind in _REGISTERED), default=0)
        buffers = [f for f in self.order if self.slots[f].kind == st.BUFFER]
        constants = [f for f in self.order if self.slots[f].kind != st.BUFFER]
        inputs = self.input_specs(q.signature.inputs)
        state = {**state, **self.slots}
        order = _as_imported(old, (*old[:at], *buffers, *old[at:], *constants), state)
        return q.replace(
            state=q.state.update(pmap(self.slots)),
            tensors=q.tensors.update(pmap(self.tensors)),
            state_order=order,
            signature=attrs.evolve(q.signature, inputs=inputs) if self.inputs else q.signature,
        )


def _as_imported(
    old: Sequence[str], order: Sequence[str], state: dict[str, st.Slot]
) -> tuple[str, ...]:
    """``order`` (``old`` with the new state put in) as ``import_ep`` reads it back from the
    program ``export_ep`` makes: the state dict (parameters, persistent buffers) then the rest,
    each in ``order``, with the non-persistent buffers put back by ``registration_order``.

    That moves old entries only where a round trip would move them too: non-persistent
    buffers, last when no buffer was persistent, go before a new persistent one. ``order``
    itself when ``old`` is no order ``import_ep`` gives (a hand-built program): a pass never
    reorders such state. O(state)."""

    def imported(fqns: Sequence[str]) -> tuple[str, ...]:
        held = [f for f in fqns if registered(f)] + [f for f in fqns if not registered(f)]
        buffers = [f for f in fqns if state[f].kind == st.BUFFER]
        return registration_order(held, buffers, {f for f in buffers if not state[f].persistent})

    def registered(fqn: str) -> bool:
        slot = state[fqn]
        return slot.kind == st.PARAMETER or (slot.kind == st.BUFFER and slot.persistent)

    if imported(old) != tuple(old):
        return tuple(order)
    return imported(order)
