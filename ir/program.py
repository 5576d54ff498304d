"""``Program``: the whole immutable value a pass takes and returns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
from pyrsistent import PMap, pmap

from ir.errors import NotAProgramError, VerifyError
from ir.memo import NOT_COMPUTED, WeakMemo, memoized
from ir.module import Module, ModuleId
from ir.signature import CallSignature, ExportSignature
from ir.slot_init import slot_init
from ir.state import Opaque, Slot

NO_CONSTRAINTS = Opaque({})

# A persistent map's entries as a plain dict, one per live map object: programs that a pass made
# with the same ``state`` or ``tensors`` map (most passes keep them) share one table.
_PLAIN_TABLES: WeakMemo[PMap, dict] = WeakMemo(lambda table: dict(table.items()))


def _plain_table(table: Any) -> dict:
    try:
        return _PLAIN_TABLES(table)
    except TypeError:  # a mapping without weak references (a hand-built program's dict)
        return dict(table.items())


def require_program(value: object, where: str) -> None:
    """The one "is this a Program?" check: raise ``NotAProgramError`` (a ``PassError`` and a
    ``LoweringError``) naming what ``where`` got instead and how to make a Program. O(1)."""
    if isinstance(value, Program):
        return
    kind = type(value)
    got = "None" if value is None else f"{kind.__module__}.{kind.__qualname__}"
    raise NotAProgramError(
        f"{where} takes a purefx Program, got {got}; make one with "
        "ir.import_ep(torch.export.export(model, args)) first"
    )


@slot_init
@attrs.frozen(cache_hash=True)
class Program:
    """An exported program as a value.

    - ``root``: the ModuleId of the root module; ``modules``: the module table;
    - ``state`` / ``state_order``: each state fqn's ``Slot``, and the fqns in registration order
      (maps are never iterated for output order);
    - ``tensors``: tensor key -> ``Opaque`` tensor or script object (read, never written);
    - ``signature``: what the root graph's placeholders and outputs stand for;
    - ``call_signatures``: preserved call signatures by call name (``""`` is the root: its
      ``in_spec``/``out_spec`` are the user-facing pytree specs);
    - ``call_order``: the fqns of the export's module call graph, in its order;
    - ``range_constraints``: the export's symbolic range constraints (opaque, by identity).

    **Equality** (``==`` and ``hash``) is structural over these fields, and ignores, plainly:
    every node's ``meta`` (``Node.meta`` is outside node equality), so ``val`` (shapes, dtypes,
    devices) and module stacks; a program traced at batch 1 and the same program traced at
    batch 3 are ``==``. Tensors and ``range_constraints`` compare by identity (``Opaque``): two
    tensors with the same bits that are different objects make programs that are not ``==``
    (``lowering.pass_laws.same_program`` compares them by value). Memos are never part of it. So
    ``==`` is no key for memoizing anything that depends on shapes.
    """

    root: ModuleId
    modules: PMap
    state: PMap = pmap()  # noqa: RUF009 (immutable: one shared empty map is right)
    state_order: tuple[str, ...] = ()
    tensors: PMap = pmap()  # noqa: RUF009
    signature: ExportSignature = ExportSignature()  # noqa: RUF009 (frozen)
    call_signatures: PMap = pmap()  # noqa: RUF009
    call_order: tuple[str, ...] = ("",)
    range_constraints: Opaque = attrs.field(factory=lambda: NO_CONSTRAINTS)

    def module_table(self) -> dict[ModuleId, Module]:
        """The module table as a plain dict (built once; PMap lookups are pure Python)."""
        found = self._memo_module_table  # the memo's field: read on every module lookup
        return self._module_table if found is NOT_COMPUTED else found

    def state_table(self) -> dict[str, Slot]:
        """The state map as a plain dict (built once), for passes that look up many fqns."""
        return self._state_table

    def tensor_table(self) -> dict[str, Opaque]:
        """The tensor table as a plain dict (built once), for passes that look up many keys."""
        return self._tensor_table

    @memoized
    def _module_table(self) -> dict[ModuleId, Module]:
        return dict(self.modules.items())

    @memoized
    def _state_table(self) -> dict[str, Slot]:
        return _plain_table(self.state)

    @memoized
    def _tensor_table(self) -> dict[str, Opaque]:
        return _plain_table(self.tensors)

    @memoized
    def _resolved(self) -> dict[tuple[str, ModuleId], ModuleId | None]:
        # A cache, filled by ``resolve`` with answers that depend only on the module table.
        return {}

    @memoized
    def is_outlined(self) -> bool:
        """Whether the root graph calls modules: ``outline``, ``outline_by`` or
        ``split_by_tags`` has run (``inline`` undoes it).

        The one definition of a Program's kind that passes read: a pass for flat programs
        raises ``PassError`` on an outlined one (and the reverse) instead of deciding inline.
        **Laws:** ``p.is_flat`` and ``p.is_outlined`` are never both true; neither holds only
        for a root without a graph. Complexity: O(n) in the root graph's nodes, once per
        Program (a memo; never part of ``==``).
        """
        graph = self.root_module.graph
        return graph is not None and any(n.op == "call_module" for n in graph.nodes)

    @property
    def is_flat(self) -> bool:
        """Whether the root module's graph is the whole program (as ``import_ep`` makes it): it
        has a graph and calls no module. See ``is_outlined``; O(1) after the first read."""
        return not self.is_outlined and self.root_module.graph is not None

    def replace(self, **changes: Any) -> Program:
        """A copy with ``changes``; ``self`` when nothing changes."""
        if all(getattr(self, k) is v for k, v in changes.items()):
            return self
        return attrs.evolve(self, **changes)

    @property
    def root_module(self) -> Module:
        """The root ``Module``."""
        return self.modules[self.root]

    def module(self, mid: ModuleId) -> Module:
        """The module with id ``mid``; ``VerifyError`` naming it when absent."""
        found = self.module_table().get(mid)
        if found is None:
            raise VerifyError(f"module id {mid!r} is not in the module table")
        return found

    def resolve(self, path: str, start: ModuleId | None = None) -> ModuleId | None:
        """The ModuleId reached by dotted ``path`` from ``start`` (default: root), or ``None``
        (answers are remembered: passes resolve the same call targets many times)."""
        mid = self.root if start is None else start
        if not path:
            return mid
        memo = self._memo_resolved  # the memo's field: read on every call
        if memo is NOT_COMPUTED:
            memo = self._resolved
        key = (path, mid)
        if key in memo:
            return memo[key]
        found = self._walk_path(path, mid)
        memo[key] = found
        return found

    def _walk_path(self, path: str, mid: ModuleId) -> ModuleId | None:
        table = self.module_table()
        for part in path.split("."):
            mod = table.get(mid)
            if mod is None:
                return None
            mid = mod.child(part)
            if mid is None:
                return None
        return mid

    def first_path(self, mid: ModuleId) -> str | None:
        """The first path (in ``walk`` order) that reaches module ``mid``, or ``None`` when no
        path does (O(modules) once, then O(1))."""
        paths = self._module_paths.get(mid)
        return paths[0] if paths else None

    def module_paths(self, mid: ModuleId) -> tuple[str, ...]:
        """Every path that reaches module ``mid``, in ``walk`` order (a shared module has
        several); ``()`` when none does. O(paths) once, then O(1)."""
        return self._module_paths.get(mid, ())

    @memoized
    def _module_paths(self) -> dict[ModuleId, tuple[str, ...]]:
        found: dict[ModuleId, list[str]] = {}
        for path, m in self.walk():
            found.setdefault(m, []).append(path)
        return {m: tuple(paths) for m, paths in found.items()}

    def attr_fqn(self, mid: ModuleId, path: str, target: str) -> str:
        """The root-relative name that a ``get_attr`` of ``target`` in module ``mid`` (reached
        at ``path``) reads: through the peer named by ``target``'s first part when ``mid`` holds
        one (the peer's first path), else below ``path``. O(peers)."""
        head, dot, rest = target.partition(".")
        peer = self.module_table()[mid].peer(head) if dot else None
        if peer is not None:
            base = self.first_path(peer)
            if base is not None:
                return f"{base}.{rest}" if base else rest
        return f"{path}.{target}" if path else target

    def walk(self) -> Iterator[tuple[str, ModuleId]]:
        """Every ``(path, ModuleId)`` from the root, depth first in registration order.

        A shared module is visited under each path that reaches it (``remove_duplicate=False``).
        """
        table = self.module_table()
        stack: list[tuple[str, ModuleId]] = [("", self.root)]
        while stack:
            path, mid = stack.pop()
            yield path, mid
            kids = table[mid].children
            for name, child in reversed(kids):
                stack.append((f"{path}.{name}" if path else name, child))

    def slot(self, fqn: str) -> Slot:
        """The state slot at ``fqn``; ``VerifyError`` naming it when absent."""
        found = self.state.get(fqn)
        if found is None:
            raise VerifyError(f"no state at {fqn!r}")
        return found

    def tensor(self, fqn: str) -> Any:
        """The tensor (or script object) held for state ``fqn``."""
        return self.tensors[self.slot(fqn).tensor].value

    def call_signature(self, call_name: str) -> CallSignature | None:
        """The preserved signature of call ``call_name`` (``foo`` or ``foo@1``), or ``None``."""
        return self.call_signatures.get(call_name)

    def node_count(self) -> int:
        """Total nodes over every distinct module graph (each ModuleId counted once)."""
        return sum(len(g) for mid in self._module_paths for g in self.modules[mid].graphs)

    def module_count(self) -> int:
        """Number of distinct module objects reachable from the root."""
        return len(self._module_paths)
