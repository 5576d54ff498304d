"""``Node``: one operation of a graph, as an immutable value."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from ir.args import EMPTY_DICT, IDict, Ref, collect_refs, ref
from ir.memo import NOT_COMPUTED, memoized
from ir.module_stack import Frame, meta_frames
from ir.slot_init import slot_constructor, slot_init

PLACEHOLDER = "placeholder"
GET_ATTR = "get_attr"
CALL_FUNCTION = "call_function"
CALL_MODULE = "call_module"
CALL_METHOD = "call_method"
OUTPUT = "output"
OPS = (PLACEHOLDER, GET_ATTR, CALL_FUNCTION, CALL_MODULE, CALL_METHOD, OUTPUT)

EMPTY_META: Mapping[str, Any] = MappingProxyType({})


def frozen_meta(meta: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only shallow copy of an fx ``node.meta`` dict (values are shared, never written)."""
    if not meta:
        return EMPTY_META
    return MappingProxyType(dict(meta))


@slot_init
@attrs.frozen(cache_hash=True)
class Node:
    """One fx-style operation.

    ``op`` is one of ``OPS``; ``target`` is what fx stores there (an operator, a qualified name, a
    method name); ``args``/``kwargs`` are immutable argument trees (see ``ir.args``). ``meta`` (fake
    tensor ``val``, ``nn_module_stack``, ``stack_trace``, ...) is carried read-only and is excluded
    from equality and hashing.
    """

    op: str
    name: str
    target: Any
    args: tuple = ()
    kwargs: IDict = EMPTY_DICT
    meta: Mapping[str, Any] = attrs.field(default=EMPTY_META, eq=False, repr=False)

    @property
    def ref(self) -> Ref:
        """The ``Ref`` naming this node's value."""
        return ref(self.name)

    def inputs(self) -> tuple[Ref, ...]:
        """Every ``Ref`` this node reads, args first, in order (duplicates kept; computed once)."""
        found = self._memo_inputs  # the memo's field: this is the IR's hottest read
        return self._inputs if found is NOT_COMPUTED else found

    @property
    def module_frames(self) -> tuple[Frame, ...] | None | object:
        """The module calls this node runs in, outermost first, from its ``nn_module_stack``
        meta (``ir.module_stack.stack_frames``); ``NO_STACK`` when it has none. Computed once."""
        found = self._memo_frames
        return self._frames if found is NOT_COMPUTED else found

    @memoized
    def _frames(self) -> tuple[Frame, ...] | None | object:
        return meta_frames(self.meta)

    @memoized
    def _inputs(self) -> tuple[Ref, ...]:
        args = self.args
        if not self.kwargs.items and type(args) is tuple:
            for item in args:
                if type(item) is not Ref:
                    break
            else:  # the common node, whose arguments are all values: its inputs are its args
                return args
        refs: list[Ref] = []
        collect_refs(args, refs)
        if self.kwargs.items:
            collect_refs(self.kwargs, refs)
        return tuple(refs)

    def replace(self, **changes: Any) -> Node:
        """A copy with ``changes`` applied; ``self`` itself when nothing changes."""
        if all(getattr(self, k) is v for k, v in changes.items()):
            return self
        if not changes.keys() <= _FIELDS:
            raise TypeError(f"Node has no fields {sorted(changes.keys() - _FIELDS)}")
        get = changes.get
        return new_node(
            get("op", self.op),
            get("name", self.name),
            get("target", self.target),
            get("args", self.args),
            get("kwargs", self.kwargs),
            get("meta", self.meta),
        )

    def with_meta(self, **entries: Any) -> Node:
        """A copy whose meta has ``entries`` added or replaced (meta is never written in place)."""
        return self.replace(meta=MappingProxyType({**self.meta, **entries}))


_FIELDS = frozenset(("op", "name", "target", "args", "kwargs", "meta"))
# ``Node(...)`` for code that builds nodes in bulk: the same value, built without the class call
new_node = slot_constructor(Node)
