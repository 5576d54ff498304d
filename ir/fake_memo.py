"""Fake runs kept by what decides their result: one fake run per operator and metadata.

A pass that emits many nodes runs each one's operator on fake values (``fake_run.fake_value``)
to give it a ``val``. A program of many blocks runs the same operator on the same shapes again
and again, and each fake run costs a dispatch through the fake mode (about 0.2-0.5 ms; 9,370 of
them were a third of greedy ``rewrite`` on a 15k-node program of repeated blocks). The metadata
of a *fresh* result (an operator that writes nothing, returns one tensor and aliases none of
its arguments, whose output shape does not depend on data) is a function of the operator, its
literal arguments and its tensor arguments' metadata; so ``FakeMemo`` runs it once per such
key and, for each later call, makes a new fake tensor of the kept metadata on a storage of its
own (``torch_seam.fresh_fake``): two nodes never share a ``val``'s storage, so what reads
storage identity (``guards.shares_storage``) sees what a run would give.

A run whose result is an argument's storage after all (``type_as`` to the dtype it has: its
schema does not say so) is not kept. Anything else runs as ``fake_value`` runs it, every time:
views and in-place operators (their results share storage with an argument), several results,
meta tensors, symbolic sizes (a shape env may be asked a guard), arguments that are not plain
literals, tensors marked as constants. A failure of a fresh operator is kept too, and raised
again at the same key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ir.args import IDict, IList, ISlice, Ref, iter_refs
from ir.fake_run import FakeRunFailed, fake_value
from ir.torch_seam import OpOverload, fresh_fake, op_schema, storage_identity

__all__ = ["LITERALS", "FakeMemo", "concrete_metadata", "in_an_argument", "is_fresh_operator"]

LITERALS = frozenset((int, float, bool, str, type(None), torch.dtype, torch.device,
                      torch.memory_format, torch.layout))
"""The types of the literal arguments a key holds as themselves (by type and value)."""
_UNKEPT = object()  # a key part that cannot be kept: the call is run


def is_fresh_operator(target: Any) -> bool:
    """Whether ``target`` is an operator overload whose one result is a new tensor: a single
    ``Tensor`` return without alias annotation, no argument it writes or returns a view of,
    and no data-dependent output shape. O(arguments), once per operator (``_fresh_op``)."""
    return isinstance(target, OpOverload) and _fresh_op(target)


@functools.lru_cache(maxsize=4096)
def _fresh_op(target: OpOverload) -> bool:
    schema = op_schema(target)
    if schema is None or len(schema.returns) != 1:
        return False
    ret = schema.returns[0]
    tags = set(getattr(target, "tags", ()))
    return (str(ret.type) == "Tensor" and ret.alias_info is None
            and all(a.alias_info is None for a in schema.arguments)
            and torch.Tag.dynamic_output_shape not in tags
            and torch.Tag.data_dependent_output not in tags)


def concrete_metadata(v: Any) -> tuple | None:
    """``(shape, stride, storage offset, dtype, device)`` of a strided fake tensor of concrete
    sizes that is not a constant of its mode: what decides a fresh result's metadata; ``None``
    for anything else. O(rank)."""
    if (not isinstance(v, torch.Tensor) or getattr(v, "fake_mode", None) is None
            or v.layout != torch.strided or getattr(v, "constant", None) is not None):
        return None
    shape, stride = tuple(v.shape), tuple(v.stride())
    if not all(type(d) is int for d in shape + stride):
        return None
    return (shape, stride, v.storage_offset(), v.dtype, v.device)


def _tensor_key(v: Any) -> Any:
    """:func:`concrete_metadata` with the tensor's mode; ``_UNKEPT`` for anything else."""
    found = concrete_metadata(v)
    return _UNKEPT if found is None else (id(v.fake_mode), *found)


def in_an_argument(out: torch.Tensor, arguments: Iterable[Any]) -> bool:
    """Whether ``out`` is in the storage of one of ``arguments`` (values, tensors or not): an
    operator whose schema says its result is fresh may still return an argument (``type_as``
    to the dtype it has), and a kept result would then stand for a fresh one where the run
    aliases. O(arguments)."""
    storage = storage_identity(out)
    return any(isinstance(v, torch.Tensor) and storage_identity(v) == storage
               for v in arguments)


class FakeMemo:
    """One pass's fake runs, kept by operator, literals and tensor metadata (the module
    docstring). ``runs``: the operators run; ``made``: the results made from a kept one."""

    __slots__ = ("_kept", "made", "runs")

    def __init__(self) -> None:
        self._kept: dict[tuple, torch.Tensor | FakeRunFailed] = {}
        self.runs = 0
        self.made = 0

    def value(self, target: Any, args: Any, kwargs: Any, val_of: Callable[[Ref], Any], *,
              method: bool = False, mode: Any = None, meta: bool = True) -> Any:
        """``fake_run.fake_value(target, args, kwargs, val_of, method=method, mode=mode,
        meta=meta)``, its contract and exceptions; for a fresh operator at metadata seen
        before, a new fake tensor of the result's metadata instead of a run, or the
        ``FakeRunFailed`` it raised there raised again.

        **Laws:** the result has the shape, strides, dtype, device and fake mode that the run
        gives, and a storage of its own (never one kept result returned twice); a call that
        raises raises again at the same key, one that returns ``None`` is never kept (the next
        such call runs again). Complexity: O(arguments) plus, on a miss, one run."""
        key = None if method else self._key(target, args, kwargs, val_of, mode)
        if key is not None:
            kept = self._kept.get(key)
            if type(kept) is FakeRunFailed:
                raise kept.with_traceback(None)  # this raise's frames only, not every earlier one
            if kept is not None:
                self.made += 1
                return fresh_fake(kept)
        self.runs += 1
        try:
            out = fake_value(target, args, kwargs, val_of, method=method, mode=mode, meta=meta)
        except FakeRunFailed as exc:
            if key is not None:
                self._kept[key] = exc.with_traceback(None)
            raise
        if (key is not None and _tensor_key(out) is not _UNKEPT and out.storage_offset() == 0
                and not in_an_argument(out, (val_of(r) for r in iter_refs((args, kwargs))))):
            self._kept[key] = out
        return out

    def _key(self, target: Any, args: Any, kwargs: Any, val_of: Callable[[Ref], Any],
             mode: Any) -> tuple | None:
        """The key of a call whose result may be kept; ``None`` where it may not. A call
        without tensor arguments is keyed by ``mode`` too (the mode its result is made in)."""
        if not is_fresh_operator(target):
            return None
        tensors = [0]

        def part(x: Any) -> Any:
            kind = type(x)
            if kind is Ref:
                tensors[0] += 1
                return _tensor_key(val_of(x))
            if kind in LITERALS:
                return (kind, x)
            if kind is tuple:
                parts = tuple(part(y) for y in x)
            elif kind is IList or kind is list:
                parts = ("list", *(part(y) for y in (x.items if kind is IList else x)))
            elif kind is IDict or kind is dict:
                items = x.items if kind is IDict else tuple(x.items())
                values = tuple(part(v) for _, v in items)
                if any(v is _UNKEPT for v in values):
                    return _UNKEPT
                parts = ("dict", *zip((k for k, _ in items), values))
            elif kind is ISlice:
                parts = ("slice", part(x.start), part(x.stop), part(x.step))
            else:
                return _UNKEPT
            return _UNKEPT if any(p is _UNKEPT for p in parts) else parts

        key = (target, part(args), part(kwargs))
        if _UNKEPT in key[1:]:
            return None
        return key if tensors[0] else (*key, id(mode), mode is not None)
