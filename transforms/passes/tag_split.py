"""Splitting by tags: one child module per tag, as ``torch.fx.passes.split_utils`` does it.

A tag is a partition key for ``outline_by``, next to the module stack: the flat root graph is
reordered so that each tag's nodes form one run (in the order the tags are given), each run is
outlined into one call of the child named after its tag, and ``get_attr`` nodes are copied into
every child that reads them. Calls of leaf modules (``call_module`` nodes of a ``symbolic_trace``d
``GraphModule``, imported by ``import_graph_module``) go with their tag like any other node: the
child that calls a leaf holds it at its path, the leaf module object itself (shared between
children, as in torch, where it is the original object).

What is left is torch's layout: each child holds the state and leaves its nodes read (at
``<tag>.<fqn>``), the root takes every placeholder, reads the attributes its output reads, calls
the children in tag order and unpacks their tuples with ``getitem``; a child returns the values
other children or the output read, in the order they are first read. Node names are the ones
torch's split gives (calls after their tag, ``get_attr`` copies after their target).

``move_non_tensor_nodes_on_boundary`` moves tags (not yet modules) so that fewer non-tensor values
cross a boundary; run it before ``split_by_tags``.
"""

from __future__ import annotations

import logging
import operator
import re
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir.args import EMPTY_DICT, map_refs, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.module import LEAF, SUBGRAPH, Module, ModuleId
from ir.names import Names
from ir.node import (
    CALL_FUNCTION,
    CALL_METHOD,
    CALL_MODULE,
    GET_ATTR,
    OUTPUT,
    PLACEHOLDER,
    Node,
)
from ir.program import Program
from ir.signature import STATE_INPUT_KINDS
from ir.state import BUFFER, CONSTANT, PARAMETER, Slot
from transforms import kernel as kn
from transforms.machinery.call_walk import node_positions
from transforms.machinery.each_graph import with_root_graph
from transforms.passes.outline import outline_parts, reachable_modules

log = logging.getLogger("purefx")

TagOf = Callable[[Node], Hashable]

# the nodes torch tags and places; placeholders, get_attr and output are placed by their uses
_TAGGED_OPS = (CALL_FUNCTION, CALL_METHOD, CALL_MODULE)


def node_tag(node: Node) -> Hashable:
    """The tag torch set on the node (``node.tag``, kept by ``import_graph_module`` in meta)."""
    return node.meta.get("tag")


def split_by_tags(
    program: Program,
    tags: Sequence[Hashable],
    *,
    tag_of: TagOf | None = None,
    return_tuple: bool = False,
    return_fqn_mapping: bool = False,
) -> Program | tuple[Program, dict[str, str]]:
    """Split the flat root graph into one child module per tag, as torch's ``split_by_tags``.

    Parameters
    ----------
    program:
        A flat Program (``import_graph_module`` / ``import_ep`` output, before ``outline``).
    tags:
        The tags in the order their children run; child ``i`` is named ``str(tags[i])`` and
        registered ``i``-th. A tag with no node still gets a child (returning ``()``), as in torch.
    tag_of:
        The tag of a ``call_*`` node (default ``node_tag``: torch's ``node.tag``). Placeholders,
        ``get_attr`` and the output carry no tag: ``get_attr`` is copied into every child that
        reads it.
    return_tuple:
        Every child returns a tuple, even of one value (torch's ``return_tuple``).
    return_fqn_mapping:
        Also return ``{original fqn: fqn after the split}`` for every attribute a child
        reads and every leaf module it calls (the last child in tag order wins, as in torch).

    Returns
    -------
    The split Program (and the mapping). Each child holds the state it reads at
    ``<tag>.<original fqn>``, tied to the original tensor; tensors that are not parameters become
    buffers, as torch's ``GraphModule`` registers them. A leaf module a child calls is held at
    ``<tag>.<its path>`` whole (all its state, in its own order); two children that call one leaf
    share it. An attribute the output reads directly is held by the root under the ``get_attr``
    node's name. Placeholders are passed on in order of first use; a child returns what other
    children or the output read, in the order first read. The root graph and node names are
    torch's (see the module docstring). State that an exported program passes as root inputs is
    passed to children as arguments.

    Raises ``PassError`` naming the node for a ``call_*`` node without a tag or with a tag not in
    ``tags``, and for a node that reads a value of a tag later in ``tags`` (torch raises
    ``AssertionError`` there); also for a program that is not flat (calls modules other than
    leaves), and repeated, empty or dotted tag names.

    **Laws:** ``lower(split_by_tags(import_graph_module(gm), tags))`` computes what torch's
    ``split_by_tags(gm, tags)`` computes, with the same children, module and state paths, root
    graph, node names, placeholders and outputs (tests/test_split_gm.py checks it on generated
    ``symbolic_trace``d hierarchies); compute nodes are neither added nor removed; ``verify``
    holds; the input is not changed. Complexity: O(n log n) for n nodes (one stable sort), plus
    O(n) for the outlining and naming, plus O(s · d) for s state fqns of depth d.
    """
    tags = tuple(tags)
    _check_tags(tags)
    graph = _flat_root_graph(program)
    part = _partition(graph, tags, tag_of or node_tag)
    names = tuple(str(t) for t in tags)
    outlined, graphs = outline_parts(_runs(program, graph, part, names), part, names)
    children = _child_graphs(graphs, names, _first_reads(graph, part), len(graph), return_tuple)
    root = _root_graph(graph, children, names)  # reads the children by the original names
    children = {name: _torch_child_names(g) for name, g in children.items()}
    result, mapping = _place(program, outlined, root, children)
    return (result, mapping) if return_fqn_mapping else result


def _check_tags(tags: tuple[Hashable, ...]) -> None:
    names: set[str] = set()
    for tag in tags:
        name = str(tag)
        if not name or "." in name:
            raise PassError(f"tag {tag!r} cannot name a child module: it is empty or has a '.'")
        if name in names:
            raise PassError(f"tags {list(tags)!r} name the child {name!r} twice")
        names.add(name)


def _is_leaf(p: Program, target: str) -> bool:
    mid = p.resolve(target)
    return mid is not None and p.modules[mid].kind == LEAF


def _flat_root_graph(p: Program) -> Graph:
    """The root graph, which may call leaf modules only (else ``PassError``)."""
    graph = p.root_module.graph
    if graph is None or any(
        n.op == CALL_MODULE and not _is_leaf(p, n.target) for n in graph.nodes
    ):
        raise PassError(
            "split_by_tags expects a flat program (as imported, before outline): its root "
            "graph may call leaf modules only"
        )
    return graph


# --- 1. which child each node goes to -----------------------------------------------------------


def _partition(graph: Graph, tags: tuple[Hashable, ...], tag_of: TagOf) -> dict[str, int]:
    """Each ``call_*`` node's tag index; ``PassError`` for a missing or unknown tag and for a
    node that reads a later tag."""
    index = {t: i for i, t in enumerate(tags)}
    part: dict[str, int] = {}
    for node in graph.nodes:
        if node.op not in _TAGGED_OPS:
            continue
        tag = tag_of(node)
        if tag is None:
            raise PassError(
                f"node {node.name!r} ({node.op} {node.target}) has no tag; tag every "
                "call_function / call_method node before split_by_tags"
            )
        i = index.get(tag)
        if i is None:
            raise PassError(
                f"node {node.name!r} has tag {tag!r}, which is not one of the tags "
                f"{list(tags)!r}"
            )
        for r in node.inputs():
            j = part.get(r.name)
            if j is not None and j > i:
                raise PassError(
                    f"node {node.name!r} has tag {tag!r} but reads %{r.name} of tag "
                    f"{tags[j]!r}, which comes later in the tags {list(tags)!r}; "
                    "order the tags so that each comes after the tags it reads from"
                )
        part[node.name] = i
    return part


# --- 2. a flat program whose tags form runs, without holder modules -----------------------------


def _runs(p: Program, graph: Graph, part: dict[str, int], names: tuple[str, ...]) -> Program:
    """``p`` with the root graph reordered so that each tag's nodes form one run (leaf calls
    as stand-ins), and only the subgraph modules kept below the root."""
    nodes = graph.nodes
    placeholders = [n for n in nodes if n.op == PLACEHOLDER]
    rest = [n for n in nodes[:-1] if n.op != PLACEHOLDER]
    # stable: within a tag the original order; get_attr first (it is only ever copied)
    rest.sort(key=lambda n: part.get(n.name, -1))
    w = kn.WorkingGraph(graph, indexed=False)
    for n in (*placeholders, *rest, nodes[-1]):
        w.add(n.replace(op=CALL_FUNCTION, target=_LeafCall(n.target)) if n.op == CALL_MODULE else n)
    runs = w.finish()[0]
    root = p.root_module
    kept = tuple((n, c) for n, c in root.children if p.modules[c].kind == SUBGRAPH)
    for name, _ in kept:
        if name in names:
            raise PassError(f"tag {name!r} is also the name of the subgraph module {name!r}")
    modules = {p.root: root.replace(children=kept, graphs=(runs,))}
    for _, c in kept:
        for mid in reachable_modules(p.modules.__getitem__, c):
            modules.setdefault(mid, p.modules[mid])
    signatures = {k: v for k, v in p.call_signatures.items() if k == ""}
    return p.replace(
        modules=pmap(modules),
        call_signatures=pmap(signatures),
        call_order=tuple(f for f in p.call_order if f == ""),
    )


# --- 3. outputs in torch's order, tuples where asked, calls of empty tags -----------------------


def _first_reads(graph: Graph, part: dict[str, int]) -> dict[str, tuple[int, int]]:
    """For each value another tag (or the output) reads: where it is first read so."""
    first: dict[str, tuple[int, int]] = {}
    for k, node in enumerate(graph.nodes):
        mine = part.get(node.name)
        if mine is None and node.op != OUTPUT:
            continue
        for j, r in enumerate(node.inputs()):
            theirs = part.get(r.name)
            if theirs is not None and theirs != mine:
                first.setdefault(r.name, (k, j))
    return first


def _child_graphs(
    outlined: list[Graph | None],
    names: tuple[str, ...],
    first: dict[str, tuple[int, int]],
    end: int,
    return_tuple: bool,
) -> dict[str, Graph]:
    """Each tag's child graph (leaf calls restored; ``return ()`` for a tag with no node),
    returning in torch's order."""
    graphs: dict[str, Graph] = {}
    for name, graph in zip(names, outlined):
        if graph is not None:
            graph = _restore_leaf_calls(graph)
        else:
            graph = kn.built((kn.carried(OUTPUT, "output", "output", ((),)),))
        graphs[name] = _order_returns(graph, first, end, return_tuple)
    return graphs


def _order_returns(
    graph: Graph, first: dict[str, tuple[int, int]], end: int, return_tuple: bool
) -> Graph:
    """The child returns the values others read in the order first read (torch's
    ``used_in_main`` order; values never read so at ``end``), as a tuple unless it is one value
    (and not ``return_tuple``)."""
    returned = graph.outputs
    values = [r.name for r in (returned if type(returned) is tuple else (returned,))]
    position = {v: i for i, v in enumerate(values)}
    values.sort(key=lambda v: first.get(v, (end, position[v])))
    as_tuple = return_tuple or len(values) != 1
    out = graph.output_node
    w = kn.WorkingGraph(graph, indexed=False)
    w.leave_out((out.name,))
    w.add(out.replace(args=(tuple(map(ref, values)) if as_tuple else ref(values[0]),)))
    return w.finish()[0]


@attrs.frozen
class _Root:
    """The root graph as torch builds it, with what the placement needs to know of it."""

    graph: Graph
    attributes: dict[str, str]  # root get_attr node -> the attribute (node) the output read
    renamed: dict[str, str]  # original value -> the root node that now carries it


def _root_graph(graph: Graph, children: dict[str, Graph], names: tuple[str, ...]) -> _Root:
    """The root as torch builds it: every placeholder, a ``get_attr`` per attribute the
    output reads, then one call per tag in order (named after the tag) and a ``getitem``
    per value of a tuple it returns, then the output."""
    nodes = graph.nodes
    w = kn.FxWorkingGraph(graph)
    renamed: dict[str, str] = {}
    for n in nodes:
        if n.op == PLACEHOLDER:
            w.add(made := w.copy(n))
            renamed[n.name] = made.name
    attributes: dict[str, str] = {}
    by_name = graph.by_name()
    output = nodes[-1]
    for r in output.inputs():
        node = by_name[r.name]
        if node.op == GET_ATTR:
            w.add(made := w.copy(node, _snake(r.name)))
            attributes[made.name] = r.name
            renamed[r.name] = made.name
    for name in names:
        child = children[name]
        args = tuple(ref(renamed[p.name]) for p in child.placeholders)
        w.add(call := w.make(CALL_MODULE, name, args, EMPTY_DICT, base=_snake(name)))
        returned = child.outputs
        if type(returned) is not tuple:
            renamed[returned.name] = call.name
            continue
        for i, value in enumerate(returned):
            w.add(item := w.make(CALL_FUNCTION, operator.getitem, (call.ref, i), EMPTY_DICT,
                                 base="getitem"))
            renamed[value.name] = item.name
    w.add(output.replace(args=map_refs(output.args, lambda r: ref(renamed.get(r.name, r.name)))))
    return _Root(w.finish()[0], attributes, renamed)


# --- 4. state and module table -------------------------------------------------------------------


def _place(
    p: Program, outlined: Program, root: _Root, children: dict[str, Graph]
) -> tuple[Program, dict[str, str]]:
    """State and modules as torch's ``GraphModule`` registers them: each child holds what it
    reads at ``<tag>.<path>`` (a called leaf module whole, at its path), the root holds the
    attributes its output reads under the name of the node that read them; and the fqn
    mapping."""
    layout = _Layout(p, Names(set(p.modules) | set(outlined.modules) | {""}))
    tag_ids: dict[ModuleId, str] = {}
    for name in children:
        mid = name if name not in p.modules else kn.fresh_id(name, layout.taken)
        layout.kids_of[""][name] = mid
        layout.kids_of[mid] = {}
        tag_ids[mid] = name
    for spec in p.signature.inputs:  # state an exported program passes in stays at the root
        if spec.kind in STATE_INPUT_KINDS and spec.target in p.state:
            layout.hold(spec.target, p.state[spec.target])
            layout.attach("", spec.target)
    root_graph = _place_root(root, children, layout)
    leaf_state = _leaf_state(p) if any(
        n.op == CALL_MODULE for g in children.values() for n in g.nodes
    ) else {}
    mapping: dict[str, str] = {}
    for mid, name in tag_ids.items():
        mapping.update(_place_child(name, mid, children[name], layout, leaf_state))
    modules: dict[ModuleId, Module] = {}
    for mid, kids in layout.kids_of.items():
        if mid == "":
            base = p.root_module.replace(graphs=(root_graph,))
        elif mid in tag_ids:
            name = tag_ids[mid]
            base = (outlined.modules.get(name) or Module()).replace(graphs=(children[name],))
        else:
            base = Module()
        modules[mid or p.root] = base.replace(children=tuple(kids.items()))

    def module(mid: ModuleId) -> Module:
        return modules.get(mid) or p.modules.get(mid) or outlined.modules[mid]

    table = {mid: module(mid) for mid in reachable_modules(module, p.root)}
    state = layout.state
    keys = dict.fromkeys(s.tensor for s in state.values())
    return p.replace(
        signature=kn.renamed_outputs(p.signature, root.renamed),
        modules=pmap(table),
        state=pmap(state),
        state_order=tuple(state),
        tensors=pmap({k: p.tensors[k] for k in keys}),
        call_signatures=outlined.call_signatures,
        call_order=outlined.call_order,
    ), mapping


@attrs.define
class _Layout:
    """The state and holder modules being registered (a local builder of ``_place``)."""

    p: Program
    taken: Names  # module ids in use: new holders get fresh ones (a leaf may be "rnn")
    state: dict[str, Slot] = attrs.Factory(dict)
    kids_of: dict[ModuleId, dict[str, ModuleId]] = attrs.Factory(lambda: {"": {}})

    def hold(self, fqn: str, slot: Slot) -> None:
        if fqn in self.state and self.state[fqn] != slot:
            raise PassError(f"split_by_tags would register two values at {fqn!r}")
        self.state[fqn] = slot

    def attach(self, owner: ModuleId, path: str, leaf: ModuleId | None = None) -> None:
        """Holders from ``owner`` down to the module that owns the last name of ``path``; with
        ``leaf``, that name becomes the leaf module (in place of a holder made before). Below a
        leaf nothing is made: the leaf holds it already."""
        *parents, last = path.split(".")
        here = owner
        for part in parents:
            mid = self.kids_of[here].get(part)
            if mid is not None and mid not in self.kids_of:
                return  # a leaf module
            if mid is None:
                mid = kn.fresh_id(f"{here}.{part}" if here else part, self.taken)
                self.kids_of[here][part] = mid
                self.kids_of[mid] = {}
            here = mid
        if leaf is not None:
            self.kids_of[here][last] = leaf


def _place_root(root: _Root, children: dict[str, Graph], layout: _Layout) -> Graph:
    """The root graph with each attribute its output reads held by the root under the name of
    the node that read it."""
    p = layout.p
    w = kn.WorkingGraph(root.graph, indexed=False)
    for node in root.graph.nodes:
        if node.op == GET_ATTR and node.target in p.state:
            attribute = root.attributes[node.name]
            if attribute in children:
                raise PassError(
                    f"the output reads attribute {node.target!r} as %{attribute}, which the "
                    f"root would hold next to the child of tag {attribute!r}"
                )
            layout.hold(attribute, _held(p, p.state[node.target]))
            node = node.replace(target=attribute)
        elif node.op == GET_ATTR:
            layout.kids_of[""][node.target] = _subgraph(p, node.target)
        w.add(node)
    return w.finish()[0]


def _place_child(
    name: str,
    mid: ModuleId,
    graph: Graph,
    layout: _Layout,
    leaf_state: dict[str, list[str]],
) -> dict[str, str]:
    """Modules and state of the child of tag ``name``: paths in first-use order; a called
    leaf's state first, in the leaf's own order, then the attributes read (torch registers
    these on holders in node order, and a leaf is the original module object). Returns the
    fqn mapping of what it reads."""
    p = layout.p
    mapping: dict[str, str] = {}
    for node in graph.nodes:
        if node.op == CALL_MODULE:
            mapping[node.target] = f"{name}.{node.target}"
            layout.attach(mid, node.target, p.resolve(node.target))
        elif node.op == GET_ATTR:
            mapping[node.target] = f"{name}.{node.target}"
            if node.target in p.state:
                layout.attach(mid, node.target)
            else:
                layout.kids_of[mid][node.target] = _subgraph(p, node.target)
    for node in graph.nodes:
        if node.op == CALL_MODULE:
            for fqn in leaf_state.get(node.target, ()):
                layout.hold(f"{name}.{fqn}", p.state[fqn])
    called = {n.target for n in graph.nodes if n.op == CALL_MODULE}
    for node in graph.nodes:
        if node.op == GET_ATTR and node.target in p.state:
            if _below(node.target, called):
                continue  # the leaf holds it: as state, or as an attribute of its own
            layout.hold(f"{name}.{node.target}", _held(p, p.state[node.target]))
    return mapping


def _leaf_state(p: Program) -> dict[str, list[str]]:
    """For each leaf module's path, the state fqns at and below it (in state order)."""
    found: dict[str, list[str]] = {}
    for fqn in p.state_order:
        parts = fqn.split(".")
        for k in range(1, len(parts)):
            path = ".".join(parts[:k])
            if _is_leaf(p, path):
                found.setdefault(path, []).append(fqn)
                break
    return found


def _held(p: Program, slot: Slot) -> Slot:
    """How torch's ``GraphModule`` registers a copied attribute: tensors that are not
    parameters become (persistent) buffers."""
    if slot.kind == PARAMETER:
        return slot
    tensor = isinstance(p.tensors[slot.tensor].value, torch.Tensor)
    if slot.kind in (BUFFER, CONSTANT) and tensor:
        return Slot(BUFFER, slot.tensor, True, slot.requires_grad)
    return slot


def _subgraph(p: Program, target: str) -> ModuleId:
    mid = p.resolve(target)
    if mid is None or "." in target:
        raise PassError(f"get_attr {target!r} reads neither state nor a subgraph module")
    return mid


@attrs.frozen
class _LeafCall:
    """Stands for ``call_module[path]`` of a leaf while the outliner runs (it outlines graphs of
    functions only); ``_restore_leaf_calls`` turns it back."""

    path: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # never run: the outliner only moves it
        raise PassError(f"the stand-in for the call of leaf module {self.path!r} was run")


def _restore_leaf_calls(graph: Graph) -> Graph:
    w = kn.WorkingGraph(graph, indexed=False)
    for n in graph.nodes:
        w.add(n.replace(op=CALL_MODULE, target=n.target.path) if type(n.target) is _LeafCall else n)
    return w.finish()[0]


def _below(fqn: str, paths: set[str]) -> bool:
    """Whether one of ``paths`` is a proper prefix of ``fqn`` (O(depth of fqn))."""
    parts = fqn.split(".")
    return any(".".join(parts[:k]) in paths for k in range(1, len(parts)))


def _snake(name: str) -> str:
    """fx's name for a target: ``pascalCase`` -> ``pascal_case``, lower case."""
    return re.sub(r"(?<=[a-z])([A-Z])", r"_\1", name).lower()


def _torch_child_names(graph: Graph) -> Graph:
    """Rename a child's nodes as torch's split names them: nodes are made in the order of the
    original graph, each preceded by the placeholders and ``get_attr`` copies it is the first
    to read; a ``get_attr`` is named after its target, every other node after itself. O(n)."""
    by_name = graph.by_name()
    w = kn.FxWorkingGraph(graph)
    names: dict[str, str] = {}

    def claim(node: Node) -> None:
        if node.name not in names:
            names[node.name] = w.fresh(
                _snake(node.target) if node.op == GET_ATTR else node.name
            )

    for node in graph.nodes:
        if node.op in (PLACEHOLDER, GET_ATTR, OUTPUT):
            continue
        for r in node.inputs():
            if by_name[r.name].op in (PLACEHOLDER, GET_ATTR):
                claim(by_name[r.name])
        claim(node)
    for node in graph.nodes[:-1]:
        claim(node)
    if all(k == v for k, v in names.items()):
        return graph
    for n in graph.nodes:
        w.keep(w.renamed(n, names.get(n.name, n.name)))
    return w.finish()[0]



# --- moving non-tensor values off the boundaries -----------------------------------------------


def move_non_tensor_nodes_on_boundary(
    program: Program,
    tags: Sequence[Hashable] | None = None,
    *,
    tag_of: TagOf | None = None,
    movable: Callable[[Hashable], bool] | None = None,
) -> Program:
    """Re-tag nodes so that non-tensor values stop crossing from one tag to another.

    The tag-level form of torch's ``move_non_tensor_nodes_on_boundary`` (which moves nodes
    between the splitter's subgraph lists): for each tag in order whose nodes may move
    (``movable(tag)``, default every tag; torch moves out of accelerator subgraphs only), a
    non-tensor node read by nodes of exactly one other tag moves to that tag, together with its
    same-tag descendants, unless a descendant lies in a third tag; then its non-tensor parents
    are tried too. A node is a tensor when its meta ``type`` (torch's ``ShapeProp``) is a
    ``Tensor`` class or, without one, when its meta ``val`` is a tensor; a node with neither is
    not a tensor, as in torch. Nodes that cannot move are logged on the ``purefx`` logger, never
    printed.

    Parameters
    ----------
    program: a flat, tagged Program. tags: the tags in order (default: order of first use).
    tag_of: the tag of a node (default: meta ``"tag"``). movable: which tags may give nodes up.

    Returns the Program whose ``call_*`` nodes carry their (possibly moved) tag in meta
    ``"tag"``, ready for ``split_by_tags``; ``program`` itself when no tag changes. Only meta
    changes, so the result is ``==`` to ``program``.

    **Laws:** ``==`` its input; moves never make a node read a later tag, so a program that
    ``split_by_tags`` accepts stays accepted. Complexity: O(n · q) for n nodes and q non-tensor
    nodes tried (each try walks the nodes it would move); O(n) when few values cross.
    """
    graph = program.root_module.graph
    if graph is None:
        raise PassError("move_non_tensor_nodes_on_boundary: the root module has no graph")
    order, where = _tag_indices(graph, tags, tag_of or node_tag)
    return _retagged(program, graph, order, _moved(graph, order, where, movable))


def _tag_indices(
    graph: Graph, tags: Sequence[Hashable] | None, tag_of: TagOf
) -> tuple[tuple[Hashable, ...], dict[str, int]]:
    """The tags in order (``tags``, else the order of first use) and each tagged ``call_*``
    node's index in it; ``PassError`` for a tag that ``tags`` does not list."""
    order: list[Hashable] = list(tags) if tags is not None else []
    index = {t: i for i, t in enumerate(order)}
    where: dict[str, int] = {}
    for node in graph.nodes:
        tag = tag_of(node) if node.op in _TAGGED_OPS else None
        if tag is None:
            continue
        if tag not in index:
            if tags is not None:
                raise PassError(
                    f"node {node.name!r} has tag {tag!r}, which is not in the tags {list(tags)!r}"
                )
            index[tag] = len(order)
            order.append(tag)
        where[node.name] = index[tag]
    return tuple(order), where


def _moved(
    graph: Graph, order: tuple[Hashable, ...], where: dict[str, int],
    movable: Callable[[Hashable], bool] | None,
) -> dict[str, int]:
    """``where`` (each tagged node's tag index, ``_tag_indices``'), updated by the moves: the
    tags give nodes up in order, each once (a node moved to a later tag can move again when
    that tag's turn comes)."""
    members: list[list[str]] = [[] for _ in order]
    for node in graph.nodes:
        if node.name in where:
            members[where[node.name]].append(node.name)
    for i, tag in enumerate(order):
        if movable is None or movable(tag):
            for name in _move_out_of(i, members[i], graph, order, where):
                members[where[name]].append(name)
    return where


def _move_out_of(
    i: int, members: list[str], graph: Graph, order: tuple[Hashable, ...], where: dict[str, int]
) -> list[str]:
    """Move non-tensor nodes of tag ``i`` read by one other tag to it (updating ``where``),
    starting from ``members`` that cross and going on to their non-tensor parents; the nodes
    moved, in the order moved."""
    nodes, users, position = graph.by_name(), graph.users(), node_positions(graph)

    def children(name: str) -> list[str]:
        return [u for u in users[name] if u in where]

    def tensor(name: str) -> bool:
        return _is_tensor(nodes[name])

    moved: list[str] = []
    queue = deque(n for n in members if not tensor(n) and any(where[c] != i for c in children(n)))
    done: set[str] = set()
    while queue:
        name = queue.popleft()
        if name in done:
            continue
        done.add(name)
        if where[name] != i:
            continue
        dests = list(dict.fromkeys(where[c] for c in children(name) if where[c] != i))
        if len(dests) != 1:
            log.info(
                "cannot move non-tensor node %s off the boundary: tags %s read it",
                name, [order[d] for d in dests],
            )
            continue
        moving = _descendants_in(name, i, dests[0], children, where)
        if moving is None:
            continue
        for m in sorted(moving, key=position.__getitem__):
            where[m] = dests[0]
            moved.append(m)
            log.info("moved node %s from tag %r to tag %r", m, order[i], order[dests[0]])
        for r in dict.fromkeys(nodes[name].inputs()):
            parent = r.name
            if parent in where and not tensor(parent) and parent not in done and where[parent] == i:
                queue.append(parent)
    return moved


def _descendants_in(
    start: str,
    source: int,
    dest: int,
    children: Callable[[str], list[str]],
    where: dict[str, int],
) -> list[str] | None:
    """``start`` and its descendants in tag ``source`` (up to tag ``dest``), or ``None`` when a
    descendant lies in a third tag."""
    found: dict[str, None] = {}
    stack = [start]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if where[name] == dest:
            continue
        if where[name] != source:
            return None
        found[name] = None
        stack.extend(reversed(children(name)))
    return list(found)


def _retagged(
    program: Program, graph: Graph, order: tuple[Hashable, ...], where: dict[str, int]
) -> Program:
    """``program`` whose tagged nodes carry ``order[where[name]]`` in meta ``"tag"`` (the input
    itself when none changes)."""
    w = kn.WorkingGraph(graph, indexed=False)
    for node in graph.nodes:
        tag = order[where[node.name]] if node.name in where else None
        w.add(node if tag is None or node.meta.get("tag") == tag else node.with_meta(tag=tag))
    return with_root_graph(program, w.finish()[0])


def _is_tensor(node: Node) -> bool:
    kind = node.meta.get("type")
    if kind is not None:
        return isinstance(kind, type) and issubclass(kind, torch.Tensor)
    return isinstance(node.meta.get("val"), torch.Tensor)
