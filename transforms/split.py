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

import builtins
import keyword
import logging
import operator
import re
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir.args import map_refs, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.module import LEAF, SUBGRAPH, Module, ModuleId
from ir.names import Names, fresh_name
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
from transforms.outline import outline_by, reachable_modules
from transforms.stacks import Frame

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
    split = _TagSplit(program, tags, tag_of or node_tag, return_tuple)
    result = split.run()
    if return_fqn_mapping:
        return result, split.fqn_mapping
    return result


def _check_tags(tags: tuple[Hashable, ...]) -> None:
    names: set[str] = set()
    for tag in tags:
        name = str(tag)
        if not name or "." in name:
            raise PassError(f"tag {tag!r} cannot name a child module: it is empty or has a '.'")
        if name in names:
            raise PassError(f"tags {list(tags)!r} name the child {name!r} twice")
        names.add(name)


class _TagSplit:
    """The worker of ``split_by_tags``: assign, reorder, outline, then place state and outputs."""

    def __init__(
        self, program: Program, tags: tuple[Hashable, ...], tag_of: TagOf, return_tuple: bool
    ) -> None:
        self.p = program
        self.tags = tags
        self.names = [str(t) for t in tags]
        self.index = {t: i for i, t in enumerate(tags)}
        self.tag_of = tag_of
        self.return_tuple = return_tuple
        self.fqn_mapping: dict[str, str] = {}
        self.root_attrs: dict[str, str] = {}  # root get_attr node -> the attribute it reads
        root = program.root_module
        if root.graph is None or any(
            n.op == CALL_MODULE and not self._is_leaf(n.target) for n in root.graph.nodes
        ):
            raise PassError(
                "split_by_tags expects a flat program (as imported, before outline): its root "
                "graph may call leaf modules only"
            )
        self.graph = root.graph

    def _is_leaf(self, target: str) -> bool:
        mid = self.p.resolve(target)
        return mid is not None and self.p.modules[mid].kind == LEAF

    # --- 1. which child each node goes to ------------------------------------------------------

    def _partition(self) -> dict[str, int]:
        part: dict[str, int] = {}
        for node in self.graph.nodes:
            if node.op not in _TAGGED_OPS:
                continue
            tag = self.tag_of(node)
            if tag is None:
                raise PassError(
                    f"node {node.name!r} ({node.op} {node.target}) has no tag; tag every "
                    "call_function / call_method node before split_by_tags"
                )
            i = self.index.get(tag)
            if i is None:
                raise PassError(
                    f"node {node.name!r} has tag {tag!r}, which is not one of the tags "
                    f"{list(self.tags)!r}"
                )
            for r in node.inputs():
                j = part.get(r.name)
                if j is not None and j > i:
                    raise PassError(
                        f"node {node.name!r} has tag {tag!r} but reads %{r.name} of tag "
                        f"{self.tags[j]!r}, which comes later in the tags {list(self.tags)!r}; "
                        "order the tags so that each comes after the tags it reads from"
                    )
            part[node.name] = i
        return part

    # --- 2. a flat program whose tags form runs, without holder modules -------------------------

    def _runs(self, part: dict[str, int]) -> Program:
        p = self.p
        nodes = self.graph.nodes
        placeholders = [n for n in nodes if n.op == PLACEHOLDER]
        rest = [n for n in nodes[:-1] if n.op != PLACEHOLDER]
        # stable: within a tag the original order; get_attr first (it is only ever copied)
        rest.sort(key=lambda n: part.get(n.name, -1))
        rest = [_stand_in(n) if n.op == CALL_MODULE else n for n in rest]
        graph = Graph(tuple(placeholders + rest + [nodes[-1]]))
        root = p.root_module
        kept = tuple((n, c) for n, c in root.children if p.modules[c].kind == SUBGRAPH)
        for name, _ in kept:
            if name in self.names:
                raise PassError(f"tag {name!r} is also the name of the subgraph module {name!r}")
        modules = {p.root: root.replace(children=kept, graphs=(graph,))}
        stack = [c for _, c in kept]
        while stack:
            mid = stack.pop()
            if mid not in modules:
                modules[mid] = p.modules[mid]
                stack.extend(c for _, c in p.modules[mid].children)
        signatures = {k: v for k, v in p.call_signatures.items() if k == ""}
        return p.replace(
            modules=pmap(modules),
            call_signatures=pmap(signatures),
            call_order=tuple(f for f in p.call_order if f == ""),
        )

    # --- driver ---------------------------------------------------------------------------------

    def run(self) -> Program:
        part = self._partition()
        frames = [Frame(name, name, None, 0) for name in self.names]

        def frames_of(node: Node) -> tuple[Frame, ...] | None:
            i = part.get(node.name)
            return None if i is None else (frames[i],)

        outlined = outline_by(
            self._runs(part), frames_of, copied=lambda n: n.op == GET_ATTR
        )
        graphs = {
            name: _restore_leaf_calls(outlined.modules[name].graphs[0])
            for name in self.names
            if name in outlined.modules and outlined.modules[name].graphs
        }
        for name in self.names:
            graphs.setdefault(name, Graph((Node(OUTPUT, "output", "output", ((),)),)))
        first = self._first_reads(part)
        for name in self.names:
            graphs[name] = self._order_returns(graphs[name], first)
        root = self._root_graph(graphs)  # reads the children by the original names
        graphs = {name: _torch_child_names(graph) for name, graph in graphs.items()}
        return self._place(outlined, root, graphs)

    # --- 3. outputs in torch's order, tuples where asked, calls of empty tags -------------------

    def _first_reads(self, part: dict[str, int]) -> dict[str, tuple[int, int]]:
        """For each value another tag (or the output) reads: where it is first read so."""
        first: dict[str, tuple[int, int]] = {}
        nodes = self.graph.nodes
        for k, node in enumerate(nodes):
            mine = part.get(node.name)
            if mine is None and node.op != OUTPUT:
                continue
            for j, r in enumerate(node.inputs()):
                theirs = part.get(r.name)
                if theirs is not None and theirs != mine:
                    first.setdefault(r.name, (k, j))
        return first

    def _order_returns(self, graph: Graph, first: dict[str, tuple[int, int]]) -> Graph:
        """The child returns the values others read in the order first read (torch's
        ``used_in_main`` order), as a tuple unless it is one value (and not ``return_tuple``)."""
        returned = graph.outputs
        values = [r.name for r in (returned if type(returned) is tuple else (returned,))]
        position = {v: i for i, v in enumerate(values)}
        values.sort(key=lambda v: first.get(v, (len(self.graph), position[v])))
        as_tuple = self.return_tuple or len(values) != 1
        out = graph.output_node
        new_out = out.replace(args=(tuple(map(ref, values)) if as_tuple else ref(values[0]),))
        return Graph(graph.nodes[:-1] + (new_out,))

    def _root_graph(self, graphs: dict[str, Graph]) -> Graph:
        """The root as torch builds it: every placeholder, a ``get_attr`` per attribute the
        output reads, then one call per tag in order (named after the tag) and a ``getitem``
        per value of a tuple it returns, then the output."""
        nodes = self.graph.nodes
        taken = _FxNames()
        body = [n.replace(name=taken.create(n.name)) for n in nodes if n.op == PLACEHOLDER]
        renamed: dict[str, str] = {n.name: b.name for n, b in zip(nodes, body)}
        by_name = self.graph.by_name()
        output = nodes[-1]
        for r in output.inputs():
            node = by_name[r.name]
            if node.op == GET_ATTR:
                made = Node(GET_ATTR, taken.create(_snake(r.name)), node.target, (), meta=node.meta)
                self.root_attrs[made.name] = r.name
                renamed[r.name] = made.name
                body.append(made)
        for name in self.names:
            graph = graphs[name]
            args = tuple(ref(renamed[p.name]) for p in graph.placeholders)
            call = Node(CALL_MODULE, taken.create(_snake(name)), name, args)
            body.append(call)
            returned = graph.outputs
            if type(returned) is not tuple:
                renamed[returned.name] = call.name
                continue
            for i, value in enumerate(returned):
                item = Node(CALL_FUNCTION, taken.create("getitem"), operator.getitem,
                            (call.ref, i))
                renamed[value.name] = item.name
                body.append(item)
        body.append(output.replace(args=_renamed(output.args, renamed)))
        self.renamed = renamed
        return Graph(tuple(body))

    # --- 4. state and module table ---------------------------------------------------------------

    def _place(self, outlined: Program, root_graph: Graph, graphs: dict[str, Graph]) -> Program:
        """State and modules as torch's ``GraphModule`` registers them: each child holds what it
        reads at ``<tag>.<path>`` (a called leaf module whole, at its path), the root holds the
        attributes its output reads under the name of the node that read them."""
        p = self.p
        state: dict[str, Slot] = {}
        kids_of: dict[ModuleId, dict[str, ModuleId]] = {"": {}}
        # new modules get ids no module of the input or the outliner has (a leaf may be "rnn")
        self.taken = Names(set(p.modules) | set(outlined.modules) | {""})
        tag_ids: dict[ModuleId, str] = {}

        def hold(fqn: str, slot: Slot) -> None:
            if fqn in state and state[fqn] != slot:
                raise PassError(f"split_by_tags would register two values at {fqn!r}")
            state[fqn] = slot

        for name in self.names:
            mid = name if name not in p.modules else fresh_name(name, self.taken)
            kids_of[""][name] = mid
            kids_of[mid] = {}
            tag_ids[mid] = name
        for spec in p.signature.inputs:  # state an exported program passes in stays at the root
            if spec.kind in STATE_INPUT_KINDS and spec.target in p.state:
                hold(spec.target, p.state[spec.target])
                self._attach("", spec.target, kids_of)
        root_nodes = []
        for node in root_graph.nodes:
            if node.op == GET_ATTR and node.target in p.state:
                attribute = self.root_attrs[node.name]
                if attribute in self.names:
                    raise PassError(
                        f"the output reads attribute {node.target!r} as %{attribute}, which the "
                        f"root would hold next to the child of tag {attribute!r}"
                    )
                hold(attribute, self._held(p.state[node.target]))
                node = node.replace(target=attribute)
            elif node.op == GET_ATTR:
                kids_of[""][node.target] = self._subgraph(node.target)
            root_nodes.append(node)
        for mid, name in tag_ids.items():
            self._place_child(name, mid, graphs[name], hold, kids_of)
        modules: dict[ModuleId, Module] = {}
        for mid, kids in kids_of.items():
            if mid == "":
                base = p.root_module.replace(graphs=(Graph(tuple(root_nodes)),))
            elif mid in tag_ids:
                name = tag_ids[mid]
                base = (outlined.modules.get(name) or Module()).replace(graphs=(graphs[name],))
            else:
                base = Module()
            modules[mid or p.root] = base.replace(children=tuple(kids.items()))

        def module(mid: ModuleId) -> Module:
            return modules.get(mid) or p.modules.get(mid) or outlined.modules[mid]

        table = {mid: module(mid) for mid in reachable_modules(module, p.root)}
        keys = dict.fromkeys(s.tensor for s in state.values())
        outputs = tuple(
            attrs.evolve(spec, name=self.renamed.get(spec.name, spec.name))
            for spec in p.signature.outputs
        )
        return p.replace(
            signature=attrs.evolve(p.signature, outputs=outputs),
            modules=pmap(table),
            state=pmap(state),
            state_order=tuple(state),
            tensors=pmap({k: p.tensors[k] for k in keys}),
            call_signatures=outlined.call_signatures,
            call_order=outlined.call_order,
        )

    def _place_child(
        self,
        name: str,
        mid: ModuleId,
        graph: Graph,
        hold: Callable[[str, Slot], None],
        kids_of: dict[ModuleId, dict[str, ModuleId]],
    ) -> None:
        """Modules and state of the child of tag ``name``: paths in first-use order; a called
        leaf's state first, in the leaf's own order, then the attributes read (torch registers
        these on holders in node order, and a leaf is the original module object)."""
        p = self.p
        for node in graph.nodes:
            if node.op == CALL_MODULE:
                self.fqn_mapping[node.target] = f"{name}.{node.target}"
                self._attach(mid, node.target, kids_of, p.resolve(node.target))
            elif node.op == GET_ATTR:
                self.fqn_mapping[node.target] = f"{name}.{node.target}"
                if node.target in p.state:
                    self._attach(mid, node.target, kids_of)
                else:
                    kids_of[mid][node.target] = self._subgraph(node.target)
        for node in graph.nodes:
            if node.op == CALL_MODULE:
                for fqn in self._leaf_state().get(node.target, ()):
                    hold(f"{name}.{fqn}", p.state[fqn])
        called = {n.target for n in graph.nodes if n.op == CALL_MODULE}
        for node in graph.nodes:
            if node.op == GET_ATTR and node.target in p.state:
                if _below(node.target, called):
                    continue  # the leaf holds it: as state, or as an attribute of its own
                hold(f"{name}.{node.target}", self._held(p.state[node.target]))

    def _leaf_state(self) -> dict[str, list[str]]:
        """For each leaf module's path, the state fqns at and below it (in state order)."""
        found = self.__dict__.get("_leaf_state_index")
        if found is None:
            found = {}
            for fqn in self.p.state_order:
                parts = fqn.split(".")
                for k in range(1, len(parts)):
                    path = ".".join(parts[:k])
                    if self._is_leaf(path):
                        found.setdefault(path, []).append(fqn)
                        break
            self.__dict__["_leaf_state_index"] = found
        return found

    def _held(self, slot: Slot) -> Slot:
        """How torch's ``GraphModule`` registers a copied attribute: tensors that are not
        parameters become (persistent) buffers."""
        if slot.kind == PARAMETER:
            return slot
        tensor = isinstance(self.p.tensors[slot.tensor].value, torch.Tensor)
        if slot.kind in (BUFFER, CONSTANT) and tensor:
            return Slot(BUFFER, slot.tensor, True, slot.requires_grad)
        return slot

    def _attach(
        self,
        owner: ModuleId,
        path: str,
        kids_of: dict[ModuleId, dict[str, ModuleId]],
        leaf: ModuleId | None = None,
    ) -> None:
        """Holders from ``owner`` down to the module that owns the last name of ``path``; with
        ``leaf``, that name becomes the leaf module (in place of a holder made before). Below a
        leaf nothing is made: the leaf holds it already."""
        *parents, last = path.split(".")
        here = owner
        for part in parents:
            mid = kids_of[here].get(part)
            if mid is not None and mid not in kids_of:
                return  # a leaf module
            if mid is None:
                mid = fresh_name(f"{here}.{part}" if here else part, self.taken)
                kids_of[here][part] = mid
                kids_of[mid] = {}
            here = mid
        if leaf is not None:
            kids_of[here][last] = leaf

    def _subgraph(self, target: str) -> ModuleId:
        mid = self.p.resolve(target)
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


def _stand_in(node: Node) -> Node:
    return node.replace(op=CALL_FUNCTION, target=_LeafCall(node.target))


def _restore_leaf_calls(graph: Graph) -> Graph:
    nodes = tuple(
        n.replace(op=CALL_MODULE, target=n.target.path) if type(n.target) is _LeafCall else n
        for n in graph.nodes
    )
    return graph if all(a is b for a, b in zip(nodes, graph.nodes)) else Graph(nodes)


def _below(fqn: str, paths: set[str]) -> bool:
    """Whether one of ``paths`` is a proper prefix of ``fqn`` (O(depth of fqn))."""
    parts = fqn.split(".")
    return any(".".join(parts[:k]) in paths for k in range(1, len(parts)))


class _FxNames:
    """Node names as an fx ``Graph`` gives them when nodes are created one by one: a candidate
    is made an identifier; a taken one (or a Python keyword, builtin or a name fx's code needs)
    gets the next ``_<n>`` suffix counted per base name, a trailing ``_<n>`` being read as one."""

    _ILLEGAL = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | frozenset(
        ("inf", "nan", "NoneType", "torch", "device", "fx_pytree", "pytree")
    )

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.counts: dict[str, int] = {}

    def create(self, candidate: str) -> str:
        candidate = re.sub(r"[^0-9a-zA-Z_]+", "_", candidate) or "_unnamed"
        if candidate[0].isdigit():
            candidate = f"_{candidate}"
        base, number = _NAME.match(candidate).group(1, 2)
        if number is None or candidate in self.used:
            count = self.counts.get(base, 0)
            if candidate in self._ILLEGAL:
                count += 1
                candidate = f"{base}_{count}"
        else:
            count = int(number)
        while candidate in self.used:
            count += 1
            candidate = f"{base}_{count}"
        self.used.add(candidate)
        self.counts[base] = count
        return candidate


_NAME = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")


def _snake(name: str) -> str:
    """fx's name for a target: ``pascalCase`` -> ``pascal_case``, lower case."""
    return re.sub(r"(?<=[a-z])([A-Z])", r"_\1", name).lower()


def _torch_child_names(graph: Graph) -> Graph:
    """Rename a child's nodes as torch's split names them: nodes are made in the order of the
    original graph, each preceded by the placeholders and ``get_attr`` copies it is the first
    to read; a ``get_attr`` is named after its target, every other node after itself. O(n)."""
    by_name = graph.by_name()
    taken = _FxNames()
    names: dict[str, str] = {}

    def claim(node: Node) -> None:
        if node.name not in names:
            names[node.name] = taken.create(
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
    return Graph(tuple(
        n.replace(name=names.get(n.name, n.name), args=_renamed(n.args, names),
                  kwargs=_renamed(n.kwargs, names))
        for n in graph.nodes
    ))


def _renamed(tree: Any, names: dict[str, str]) -> Any:
    return map_refs(tree, lambda r: ref(names.get(r.name, r.name)))


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
    tag_of = tag_of or node_tag
    graph = program.root_module.graph
    if graph is None:
        raise PassError("move_non_tensor_nodes_on_boundary: the root module has no graph")
    where: dict[str, int] = {}
    order: list[Hashable] = list(tags) if tags is not None else []
    index = {t: i for i, t in enumerate(order)}
    for node in graph.nodes:
        if node.op not in _TAGGED_OPS:
            continue
        tag = tag_of(node)
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
    nodes = graph.by_name()
    users = graph.users()
    members: list[list[str]] = [[] for _ in order]
    for node in graph.nodes:
        if node.name in where:
            members[where[node.name]].append(node.name)

    def children(name: str) -> list[str]:
        return [u for u in users[name] if u in where]

    def parents(name: str) -> list[str]:
        return [r.name for r in dict.fromkeys(nodes[name].inputs()) if r.name in where]

    def elsewhere(name: str, i: int) -> bool:
        return any(where[c] != i for c in children(name))

    def tensor(name: str) -> bool:
        return _is_tensor(nodes[name])

    def closure(start: str, source: int, dest: int) -> list[str] | None:
        """``start`` and its descendants in ``source`` (up to ``dest``), or ``None`` when a
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
        return sorted(found, key=position.__getitem__)

    position = {n.name: k for k, n in enumerate(graph.nodes)}
    for i, tag in enumerate(order):
        if movable is not None and not movable(tag):
            continue
        queue = deque(n for n in members[i] if not tensor(n) and elsewhere(n, i))
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
            moving = closure(name, i, dests[0])
            if moving is None:
                continue
            for m in moving:
                members[i].remove(m)
                members[dests[0]].append(m)
                where[m] = dests[0]
                log.info("moved node %s from tag %r to tag %r", m, tag, order[dests[0]])
            for parent in parents(name):
                if not tensor(parent) and parent not in done and where[parent] == i:
                    queue.append(parent)
    new_nodes = list(graph.nodes)
    changed = False
    for k, node in enumerate(new_nodes):
        if node.name in where and node.meta.get("tag") != order[where[node.name]]:
            new_nodes[k] = node.with_meta(tag=order[where[node.name]])
            changed = True
    if not changed:
        return program
    root = program.root_module
    new_root = root.replace(graphs=(Graph(tuple(new_nodes)),) + root.graphs[1:])
    return program.replace(modules=program.modules.set(program.root, new_root))


def _is_tensor(node: Node) -> bool:
    kind = node.meta.get("type")
    if kind is not None:
        return isinstance(kind, type) and issubclass(kind, torch.Tensor)
    return isinstance(node.meta.get("val"), torch.Tensor)
