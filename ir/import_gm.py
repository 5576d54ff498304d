"""Import a plain fx ``GraphModule`` (``symbolic_trace``, ``make_fx``, a split) into a ``Program``.

The graph is kept as it is (flat, in the root module); what it reads becomes IR values:

- ``call_module`` targets are **leaf modules**: a ``Module`` of kind ``leaf`` holding the original
  module object by reference (``Module.leaf``), its parameters and buffers as state at
  ``<path>.<name>``, its submodules as leaf modules too. ``lower`` builds a copy of each leaf
  without its tensors and registers copies of the state on it, so ties between a leaf's weight
  and a ``get_attr`` of it (or of another path) survive, and ``gm`` is never written.
- ``get_attr`` of a (nested) tensor attribute is state; of a ``GraphModule`` a subgraph module.
- Modules on the way to a leaf or to state are holders typed after the original class.

The importer reads ``gm`` and never writes it: not the graph, node meta, modules nor tensors.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from pyrsistent import pmap

from ir import state as st
from ir.errors import UnsupportedProgramError
from ir.gcpause import gc_paused
from ir.import_ep import alias_key, get_path, import_graph, subgraph_names
from ir.module import LEAF, Module, kind_of_type
from ir.node import CALL_MODULE, GET_ATTR
from ir.program import Program
from ir.signature import USER_INPUT, ExportSignature, InputSpec
from ir.state import Opaque, Slot
from ir.torch_seam import (
    graph_codegen,
    module_buffers,
    module_children,
    module_parameters,
    non_persistent_buffers,
)


@gc_paused
def import_graph_module(gm: torch.fx.GraphModule) -> Program:
    """Import a plain fx ``GraphModule`` (not an export) into a flat ``Program``.

    Placeholders become user inputs and the output tree is returned as is (no pytree specs);
    ``node.tag`` is kept in each node's meta under ``"tag"``. Tensors read by ``get_attr`` become
    state (parameters, buffers, or constants for plain tensor attributes); each ``call_module``
    target becomes a leaf module (see the module docstring) with its state at its path. Two paths
    to one module object are one ModuleId; tensors that view the same memory share one key.

    Raises ``UnsupportedProgramError`` naming the node for a ``call_module`` target that is not a
    module, a ``get_attr`` of a missing attribute or of a module that is not a ``GraphModule``;
    also for a graph with its own input/output code (``_PyTreeCodeGen``: pytree concrete_args).
    Complexity: O(n + s) for n nodes and s tensors held by the leaves called.
    """
    if not isinstance(gm, torch.fx.GraphModule):
        raise UnsupportedProgramError(
            f"import_graph_module expects a torch.fx.GraphModule, got {type(gm).__name__}"
        )
    codegen = type(graph_codegen(gm.graph))
    if codegen is not torch.fx.graph.CodeGen:
        raise UnsupportedProgramError(
            f"the graph of this GraphModule flattens its inputs with {codegen.__name__} (traced "
            "with pytree concrete_args); import_graph_module supports flat-argument graphs: "
            "trace with placeholders for tensors, or import the torch.export of the module"
        )
    modules: dict[str, Module] = {}
    graph = import_graph(gm.graph, gm, "", modules, exported=False)
    tree = _Tree(gm)
    for node in graph.nodes:  # leaves first: a leaf keeps its own order of state
        if node.op == CALL_MODULE:
            tree.leaf(node.target, node.name)
    for node in graph.nodes:
        if node.op == GET_ATTR and node.target not in modules:
            tree.attribute(node.target, node.name)
    subgraphs = tuple((n, n) for n in subgraph_names(graph, modules))
    modules.update(tree.modules())
    modules[""] = Module(children=tree.children("") + subgraphs, graphs=(graph,))
    signature = ExportSignature(
        inputs=tuple(InputSpec(USER_INPUT, n.name) for n in graph.placeholders), outputs=()
    )
    return Program(
        root="",
        modules=pmap(modules),
        state=pmap(tree.state),
        state_order=tuple(tree.state),
        tensors=pmap(tree.tensors),
        signature=signature,
    )


def type_name_of(obj: Any) -> str:
    """The qualified class name purefx records for a module object."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class _Tree:
    """The module tree and state an fx graph reads, built path by path, frozen once."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.state: dict[str, Slot] = {}
        self.tensors: dict[str, Opaque] = {}
        self.keys: dict[Any, str] = {}
        self.kids: dict[str, dict[str, str]] = {"": {}}  # path -> {local name: ModuleId}
        self.made: dict[str, Module] = {}  # ModuleId -> Module (children filled at the end)
        self.leaf_ids: dict[int, str] = {}  # id(module object) -> ModuleId of its leaf

    # --- what the graph reads ---------------------------------------------------------------------

    def leaf(self, target: str, node_name: str) -> None:
        """The module at ``target`` is called: a leaf module with all its state below it."""
        obj = get_path(self.gm, target, node_name)
        if not isinstance(obj, torch.nn.Module):
            raise UnsupportedProgramError(
                f"node {node_name!r} calls {target!r}, which is a {type(obj).__name__}, not a "
                "module"
            )
        owner, _, name = target.rpartition(".")
        self._holders(owner)
        known = self.made.get(self.kids[owner].get(name, ""))
        if known is None or known.kind != LEAF:
            self.kids[owner][name] = self._leaf_module(obj, target)

    def attribute(self, target: str, node_name: str) -> None:
        """``get_attr`` of ``target``: state at that fqn (under holders, or a leaf's own)."""
        value = get_path(self.gm, target, node_name)
        if isinstance(value, torch.nn.Module):
            raise UnsupportedProgramError(
                f"node {node_name!r} reads module {target!r} by get_attr; only tensors, script "
                "objects and GraphModule subgraphs can be read so"
            )
        if target in self.state:
            return
        owner, _, name = target.rpartition(".")
        self._holders(owner)
        self._add_state(target, value, self._kind(owner, name, value))

    # --- building ---------------------------------------------------------------------------------

    def _holders(self, path: str) -> None:
        """Holder modules at ``path`` and above it (each typed after the original module)."""
        if path in self.kids:
            return
        owner, _, name = path.rpartition(".")
        self._holders(owner)
        if name not in self.kids[owner]:
            obj = self.gm.get_submodule(path)
            self.kids[owner][name] = path
            self.made[path] = Module(type_name_of(obj), kind_of_type(type_name_of(obj)))
        self.kids.setdefault(path, {})

    def _leaf_module(self, obj: torch.nn.Module, path: str) -> str:
        """The ModuleId of the leaf for ``obj`` (made once per object, its submodules leaves
        below it), with its state registered at ``path``."""
        found = self._leaf_ids(obj, path)
        self._leaf_state(obj, path)
        return found

    def _leaf_ids(self, obj: torch.nn.Module, path: str) -> str:
        found = self.leaf_ids.get(id(obj))
        if found is None:
            found = self.leaf_ids[id(obj)] = path
            self.made[path] = Module(type_name_of(obj), LEAF, leaf=Opaque(obj))
            self.kids[path] = {
                name: self._leaf_ids(child, f"{path}.{name}")
                for name, child in module_children(obj).items()
                if child is not None
            }
        return found

    def _leaf_state(self, obj: torch.nn.Module, path: str) -> None:
        """State at ``path`` and below, in the module's own order (as ``named_parameters`` /
        ``named_buffers`` with ``remove_duplicate=False`` list it, per module)."""
        for sub_path, sub in obj.named_modules(prefix=path, remove_duplicate=False):
            for name, value in module_parameters(sub).items():
                if value is not None:
                    self._add_state(f"{sub_path}.{name}", value, st.PARAMETER)
            for name, value in module_buffers(sub).items():
                if value is not None:
                    persistent = name not in non_persistent_buffers(sub)
                    self._add_state(f"{sub_path}.{name}", value, st.BUFFER, persistent)

    def _kind(self, owner: str, name: str, value: Any) -> str:
        if isinstance(value, torch.nn.Parameter):
            return st.PARAMETER
        if isinstance(value, torch.Tensor):
            module = self.gm.get_submodule(owner) if owner else self.gm
            return st.BUFFER if name in module_buffers(module) else st.CONSTANT
        return st.CUSTOM_OBJ

    def _add_state(self, fqn: str, value: Any, kind: str, persistent: bool = True) -> None:
        if fqn in self.state:
            return
        key = self.keys.setdefault(alias_key(value), fqn)
        self.tensors.setdefault(key, Opaque(value))
        requires_grad = bool(getattr(value, "requires_grad", False))
        self.state[fqn] = Slot(kind, key, persistent, requires_grad)

    # --- freezing ---------------------------------------------------------------------------------

    def children(self, path: str) -> tuple[tuple[str, str], ...]:
        return tuple(self.kids.get(path, {}).items())

    def modules(self) -> dict[str, Module]:
        """Every module made, with its children in first-use order (a leaf: its own order)."""
        return {mid: mod.replace(children=self.children(mid)) for mid, mod in self.made.items()}
