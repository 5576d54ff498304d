"""``Module``: one module object of the lowered tree, as an immutable value.

Modules live in the Program's table ``PMap[ModuleId, Module]``; a parent names its children by
ModuleId, so sharing is explicit: two paths that reach one ModuleId are one module object after
lowering.
"""

from __future__ import annotations

from typing import Any

import attrs

from ir.graph import Graph
from ir.memo import NOT_COMPUTED, memoized
from ir.slot_init import slot_init
from ir.state import Opaque

ModuleId = str

PLAIN = "module"
SEQUENTIAL = "sequential"
MODULE_LIST = "module_list"
MODULE_DICT = "module_dict"
PARAMETER_LIST = "parameter_list"
PARAMETER_DICT = "parameter_dict"
SUBGRAPH = "subgraph"
LEAF = "leaf"  # an opaque module object called as it is (an fx ``call_module`` leaf)
KINDS = (PLAIN, SEQUENTIAL, MODULE_LIST, MODULE_DICT, PARAMETER_LIST, PARAMETER_DICT, SUBGRAPH, LEAF)

_CONTAINER_KINDS = {
    "torch.nn.modules.container.Sequential": SEQUENTIAL,
    "torch.nn.modules.container.ModuleList": MODULE_LIST,
    "torch.nn.modules.container.ModuleDict": MODULE_DICT,
    "torch.nn.modules.container.ParameterList": PARAMETER_LIST,
    "torch.nn.modules.container.ParameterDict": PARAMETER_DICT,
}


def split_call_target(target: str) -> tuple[str, int]:
    """``"a.b@2"`` -> ``("a.b", 2)``; ``"a.b"`` -> ``("a.b", 0)``: the path and the graph variant."""
    path, sep, k = target.rpartition("@")
    if sep and k.isdigit():
        return path, int(k)
    return target, 0


def call_target(path: str, variant: int) -> str:
    """The ``call_module`` target that runs graph ``variant`` of the module at ``path``."""
    return path if variant == 0 else f"{path}@{variant}"


def kind_of_type(type_name: str | None) -> str:
    """The container kind that an original class name calls for (``PLAIN`` for any other class)."""
    return _CONTAINER_KINDS.get(type_name or "", PLAIN)


@slot_init
@attrs.frozen(cache_hash=True)
class Module:
    """One module.

    - ``type_name``: the original class's qualified name (``None`` when unknown);
    - ``kind``: container behaviour to keep (``sequential``, ``module_list``, ...), ``subgraph`` for
      a higher-order-op body, else ``module``;
    - ``children``: ``(local name, ModuleId)`` pairs in registration order;
    - ``graphs``: the distinct graphs its calls run (empty: never called, a plain holder). A
      ``call_module`` node whose target is ``path@k`` runs ``graphs[k]``; a bare ``path`` runs
      ``graphs[0]``;
    - ``leaf``: for kind ``leaf``, the original module object (an ``ir.state.Opaque``), held by
      reference and never written; ``lower`` builds a copy of it without its parameters, buffers
      and submodules, which come from the Program's state and module table;
    - ``peers``: ``(local name, ModuleId)`` pairs of modules this one holds by reference outside
      its children, as an eager module keeps another module in a plain attribute. A graph reads
      a peer's state as ``get_attr`` ``name.attr``; ``lower`` holds the peer's object as a plain
      attribute, so it is in no ``named_modules()``/``state_dict()`` path below this module.
    """

    type_name: str | None = None
    kind: str = PLAIN
    children: tuple[tuple[str, ModuleId], ...] = ()
    graphs: tuple[Graph, ...] = ()
    leaf: Opaque | None = None
    peers: tuple[tuple[str, ModuleId], ...] = ()

    @property
    def graph(self) -> Graph | None:
        """The graph of the first call, or ``None`` for a module that is never called."""
        return self.graphs[0] if self.graphs else None

    def child(self, name: str) -> ModuleId | None:
        """The ModuleId registered under local ``name``, or ``None`` (O(1) after the first call)."""
        found = self._memo_child_table  # the memo's field: read on every path step
        return (self._child_table if found is NOT_COMPUTED else found).get(name)

    @memoized
    def _child_table(self) -> dict[str, ModuleId]:
        return dict(self.children)

    def peer(self, name: str) -> ModuleId | None:
        """The ModuleId held by reference under local ``name``, or ``None``. O(peers)."""
        return next((mid for n, mid in self.peers if n == name), None)

    def replace(self, **changes: Any) -> Module:
        """A copy with ``changes``; ``self`` when nothing changes."""
        if all(getattr(self, k) is v for k, v in changes.items()):
            return self
        if not changes.keys() <= _FIELDS:
            raise TypeError(f"Module has no fields {sorted(changes.keys() - _FIELDS)}")
        get = changes.get
        return Module(
            get("type_name", self.type_name),
            get("kind", self.kind),
            get("children", self.children),
            get("graphs", self.graphs),
            get("leaf", self.leaf),
            get("peers", self.peers),
        )

    def with_child(self, name: str, mid: ModuleId) -> Module:
        """A copy with child ``name`` set to ``mid`` (kept in place if present, else appended)."""
        if self.child(name) is not None:
            kids = tuple((n, mid if n == name else m) for n, m in self.children)
        else:
            kids = self.children + ((name, mid),)
        return attrs.evolve(self, children=kids)


_FIELDS = frozenset(("type_name", "kind", "children", "graphs", "leaf", "peers"))
