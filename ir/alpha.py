"""Alpha keys: hashable canonical forms that ignore node names (equality modulo renaming).

Each node name is replaced by its position in its graph. Two graphs with equal alpha keys compute
the same thing in the same order; deduplication groups by this key in O(n).

A position is spelled ``(AT, i)`` and a read of a name no node defines ``(FREE, name)``, with
markers that no program can hold, so a literal argument never looks like a read. Numbers that
Python calls equal but that compute differently keep their type: a ``float`` literal is spelled
``(FLOAT, its hex)`` (``2.0`` is not ``2``, ``-0.0`` is not ``0.0``), a ``bool`` ``(BOOL, b)``
and a ``complex`` ``(COMPLEX, its repr)``; ``int`` and every other literal stand as themselves.
"""

from __future__ import annotations

import weakref
from typing import Any

from ir.args import NESTED, IDict, IList, ISlice, Ref
from ir.graph import Graph
from ir.memo import WeakMemo
from ir.node import PLACEHOLDER
from ir.program import Program
from ir.torch_seam import tensor_version


class _Marker:
    """A marker of the alpha key's own spelling (compared by identity; copied and pickled as
    the module global of that name, so a copied or unpickled key equals the original)."""

    __slots__ = ("_label", "_name")

    def __init__(self, label: str, name: str) -> None:
        self._label = label
        self._name = name

    def __repr__(self) -> str:
        return self._label

    def __reduce__(self) -> str:
        return self._name


AT = _Marker("#", "AT")  # (AT, i): the value of the node at position i
FREE = _Marker("free", "FREE")  # (FREE, name): a read of a name no node of the graph defines
FLOAT = _Marker("float", "FLOAT")  # (FLOAT, x.hex()): a float literal
BOOL = _Marker("bool", "BOOL")  # (BOOL, b): a bool literal
COMPLEX = _Marker("complex", "COMPLEX")  # (COMPLEX, repr(z)): a complex literal
_TYPED = frozenset((float, bool, complex))


def graph_key(graph: Graph) -> tuple:
    """The alpha key of ``graph`` (computed once per Graph object while it lives: the tuple of
    its interned key)."""
    return _SHAPES(graph).key.key


class GraphShape:
    """What one walk over a graph's nodes finds: its interned alpha key, and whether its node
    names are distinct (the key cannot tell: it maps every read of a name to that name's last
    definition)."""

    __slots__ = ("distinct_names", "key")

    def __init__(self, key: AlphaKey, distinct_names: bool) -> None:
        self.key = key
        self.distinct_names = distinct_names


def graph_shape(graph: Graph) -> GraphShape:
    """The ``GraphShape`` of ``graph``, computed once per Graph object while it lives (the same
    walk as its alpha key). O(nodes) once, then O(1)."""
    return _SHAPES(graph)


def _graph_key(graph: Graph) -> tuple[tuple, bool]:
    """The alpha key of ``graph`` and whether its node names are distinct."""
    nodes = graph.nodes
    position = {n.name: (AT, i) for i, n in enumerate(nodes)}
    at = position.get

    def place(r: Ref) -> Any:
        found = at(r.name)
        return found if found is not None else (FREE, r.name)

    key = []
    for n in nodes:
        op, args, kwargs = n.op, n.args, n.kwargs
        if args:
            if type(args) is tuple:  # the common tree, mapped without a call per leaf
                mapped = []
                for a in args:
                    kind = type(a)
                    if kind is Ref:
                        found = at(a.name)
                        mapped.append(found if found is not None else (FREE, a.name))
                    elif kind in NESTED:
                        mapped.append(_spell(a, place))
                    else:
                        mapped.append(_typed(a, kind) if kind in _TYPED else a)
                args = tuple(mapped)
            else:
                args = _spell(args, place)
        if kwargs.items:
            kwargs = _spell(kwargs, place)
        key.append((op, None if op == PLACEHOLDER else n.target, args, kwargs))
    return tuple(key), len(position) == len(nodes)


def _spell(tree: Any, place: Any) -> Any:
    """``tree`` as the key spells it: each ``Ref`` by ``place``, each float, bool and complex
    literal with its type (see the module docstring), containers kept as their own kinds."""
    kind = type(tree)
    if kind is Ref:
        return place(tree)
    if kind is tuple:
        return tuple(_spell(a, place) for a in tree)
    if kind is IList:
        return IList(tuple(_spell(a, place) for a in tree.items))
    if kind is IDict:
        return IDict(tuple((_spell(k, place), _spell(v, place)) for k, v in tree.items))
    if kind is ISlice:
        return ISlice(*(_spell(a, place) for a in (tree.start, tree.stop, tree.step)))
    return _typed(tree, kind) if kind in _TYPED else tree


def _typed(value: Any, kind: type) -> tuple:
    """A float, bool or complex literal spelled with its type."""
    if kind is float:
        return (FLOAT, value.hex())
    if kind is bool:
        return (BOOL, value)
    return (COMPLEX, repr(value))


class AlphaKey:
    """A graph's alpha key as a dict key: hashed once and interned, so that lookups neither
    rehash the nested tuple nor compare it item by item (graphs with equal keys share one)."""

    __slots__ = ("__weakref__", "_hash", "key")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self._hash = hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return type(other) is AlphaKey and self._hash == other._hash and self.key == other.key

    def __repr__(self) -> str:
        return f"AlphaKey(#{self._hash & 0xFFFFFF:06x})"

    def twin(self) -> AlphaKey:
        """An equal key that is another object (sharing the tuple): the interning table's key,
        so that the table does not keep alive the key it holds weakly."""
        made = AlphaKey.__new__(AlphaKey)
        made.key, made._hash = self.key, self._hash
        return made


# Interned keys, held weakly: an entry goes when no graph or cache uses its key any more.
_INTERNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def interned_key(graph: Graph) -> AlphaKey:
    """The interned ``AlphaKey`` of ``graph`` (remembered per Graph object): equal keys are one
    object."""
    return _SHAPES(graph).key


def _shape(graph: Graph) -> GraphShape:
    key, distinct = _graph_key(graph)
    made = AlphaKey(key)
    found = _INTERNED.get(made)
    if found is None:
        found = _INTERNED.setdefault(made.twin(), made)
    return GraphShape(found, distinct)


_SHAPES: WeakMemo[Graph, GraphShape] = WeakMemo(_shape)


def tensor_content(value: Any) -> Any:
    """A state value as ``program_key`` keys it: for a tensor with storage, its content
    ``(dtype, shape, strides, device, digest of its bits)`` (``-0.0`` apart from ``0.0``, NaN
    payloads apart); anything else (a script object, a meta or fake tensor) by identity, as
    ``Opaque`` compares it (a tensor subclass too). The digest is kept per tensor while its ``_version`` holds (program
    tensors are never written). O(bytes) the first time, O(1) after."""
    import hashlib

    import torch

    if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.is_meta:
        return ("object", id(value))
    version = tensor_version(value)
    held = _DIGESTS.get(id(value))
    if held is not None and held[0]() is value and held[1] == version:
        return held[2]
    t = value.detach()
    if t.layout != torch.strided:
        return ("object", id(value))
    flat = t.contiguous().reshape(-1).cpu()
    try:
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    except (RuntimeError, TypeError):  # a dtype without a byte view: by identity
        return ("object", id(value))
    key = (str(t.dtype), tuple(t.shape), tuple(t.stride()), str(t.device),
           hashlib.blake2b(data, digest_size=16).hexdigest())
    ident = id(value)
    _DIGESTS[ident] = (weakref.ref(value, lambda _r: _DIGESTS.pop(ident, None)), version, key)
    return key


_DIGESTS: dict[int, tuple] = {}  # id -> (weak ref, _version, key); by identity, not tensor ==


def program_key(program: Program) -> tuple:
    """The alpha key of a whole Program: module tree, graphs, state and signatures.

    Module ids and node names do not count; paths, targets, state fqns and state tensors'
    contents (``tensor_content``: dtype, shape, strides, device, bits) do, and which fqns
    share one tensor. So two runs of the same pass that each make new constant tensors (a
    ``fold_state`` rewrite) give equal keys.
    """
    root_graph = program.root_module.graph
    position = {n.name: i for i, n in enumerate(root_graph.nodes)} if root_graph else {}
    inputs = tuple((s.kind, position.get(s.name), s.target, s.persistent) for s in program.signature.inputs)
    outputs = tuple((s.kind, s.target) for s in program.signature.outputs)
    first_path: dict[str, str] = {}
    modules = []
    for path, mid in program.walk():
        if mid in first_path:
            modules.append((path, "same-as", first_path[mid]))
            continue
        first_path[mid] = path
        mod = program.module_table()[mid]
        modules.append(
            (
                path,
                mod.type_name,
                mod.kind,
                tuple(name for name, _ in mod.children),
                tuple(graph_key(g) for g in mod.graphs),
                mod.leaf,
                tuple((name, program.first_path(peer)) for name, peer in mod.peers),
            )
        )
    tensor_groups: dict[str, int] = {}
    state = tuple(
        (
            fqn,
            program.state[fqn].kind,
            tensor_groups.setdefault(program.state[fqn].tensor, len(tensor_groups)),
            tensor_content(program.tensors[program.state[fqn].tensor].value),
            program.state[fqn].persistent,
            program.state[fqn].requires_grad,
        )
        for fqn in program.state_order
    )
    calls = tuple(
        (name, tuple((a.kind, a.value) for a in sig.inputs), tuple((a.kind, a.value) for a in sig.outputs), sig.in_spec, sig.out_spec)
        for name, sig in sorted(program.call_signatures.items())
    )
    return (inputs, outputs, tuple(modules), state, calls, program.call_order)


def alpha_equivalent(a: Program, b: Program) -> bool:
    """Whether ``a`` and ``b`` are equal up to the names of their nodes and module ids."""
    return program_key(a) == program_key(b)
