"""The generator's fake runs, kept across programs by what decides their result.

A drawn program gives each operator step a ``val`` by running the operator on its arguments'
fake values under the program's own fake mode (:func:`fake_call`). That dispatch (the mode's
cache key, its output rebuilt from the cache entry, a ``FakeTensor`` made) was about a third of
what ``check_laws`` spent drawing a program, and the generator calls the same operators on the
same shapes in program after program: 2,000 of the 3,000 fake runs of 100 default programs were
of an operator whose one result is a new tensor, on arguments of concrete sizes.

Such a result's metadata is a function of the operator, its literal arguments and its tensor
arguments' metadata (``ir.fake_memo``'s argument, and its test of an operator,
``is_fresh_operator``), not of the mode it runs in nor of the values. So :func:`fake_call`
runs it once per such key, in this process, and for each later call makes a new fake tensor
of the kept metadata in the caller's mode on a storage of its own (``torch_seam.fake_of``):
what the dispatch returns for a fresh operator, without it. A run that raised is kept too, and
raised again at the same key. A run whose result is an argument's storage after all
(``type_as`` to the dtype it has: its schema does not say so) is never kept. Everything else
runs through the mode every time: views and in-place operators, several results, symbolic
sizes (the mode's shape env could be asked a guard), tensors that are constants of the mode
or require grad, arguments that are not plain literals, and calls made inside an active fake
mode, tensors of another mode than the call's.

The process's default dtype is part of every key (a factory, or an integer tensor divided,
makes a tensor of it), whether the mode has a shape env (without one an operator of a
data-dependent size raises, with one it returns an unbacked size), and the default device of
a call without tensor arguments. A kept failure is a copy without traceback, context or cause,
and each raise raises a new copy of it. The table
is bounded (:data:`KEPT_LIMIT` keys; full, it starts again empty), and what it keeps changes
no result: a kept entry gives the metadata the run gives. So a draw is the same program with
or without it (``tests/test_fake_calls.py`` draws both ways and compares the printed
programs).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ir.args import IDict, Ref, thaw
from ir.fake_memo import LITERALS, concrete_metadata, in_an_argument, is_fresh_operator
from ir.torch_seam import active_fake_mode, fake_of

__all__ = ["KEPT_LIMIT", "fake_call", "kept_count"]

KEPT_LIMIT = 16384
"""How many keys the table holds before it starts again empty (a few MB of metadata)."""

_UNKEPT = object()  # a key part that cannot be kept: the call runs
_kept: dict[tuple, tuple | BaseException] = {}


def fake_call(mode: Any, op: Any, args: tuple, kwargs: IDict,
              lookup: Callable[[Ref], Any]) -> Any:
    """``op`` run on the fake values of ``args`` / ``kwargs`` (``lookup`` of each ``Ref``)
    under ``mode``; raises what the operator raises.

    **Laws:** for a fresh operator (one new tensor result) on arguments of concrete sizes, the
    result has the shape, strides, dtype, device and mode the dispatch gives, on a storage of
    its own, whether it was run or made from a kept run; a call that raised raises again at the
    same key. Complexity: O(arguments) plus, on a miss, one dispatch."""
    fa = thaw(args, lookup)
    fk = thaw(kwargs, lookup)
    key = _key(mode, op, fa, fk)
    if key is None:
        with mode:
            return op(*fa, **fk)
    kept = _kept.get(key)
    if isinstance(kept, BaseException):
        raise copy.copy(kept)  # a new one each time: nothing a raise adds is shared
    if kept is not None:
        return fake_of(mode, *kept)
    try:
        with mode:
            out = op(*fa, **fk)
    except Exception as exc:
        _keep_failure(key, exc)
        raise
    metadata = _metadata(out, mode, fa, fk)
    if metadata is not None:
        _keep(key, metadata)
    return out


def kept_count() -> int:
    """How many keys the table holds now (for tests and benchmarks). O(1)."""
    return len(_kept)


def _keep(key: tuple, entry: tuple | BaseException) -> None:
    if len(_kept) >= KEPT_LIMIT:
        _kept.clear()
    _kept[key] = entry


def _keep_failure(key: tuple, exc: Exception) -> None:
    """Keep a copy of ``exc``, without its traceback, context or cause (the frames, the
    builder and the fake values of the program that raised); nothing where it cannot be
    copied (the next call runs again)."""
    try:
        kept = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exception that cannot be rebuilt is not kept
        return
    kept.__traceback__ = kept.__context__ = kept.__cause__ = None
    _keep(key, kept)


def _key(mode: Any, op: Any, fa: tuple, fk: dict) -> tuple | None:
    """The key of a call whose result may be kept; ``None`` where it may not."""
    if not is_fresh_operator(op) or active_fake_mode() is not None:
        return None
    # beside the arguments: the process's default dtype (what a factory or a promotion to
    # floating makes, which a user may change) and whether the mode has a shape env (without
    # one an operator of a data-dependent size raises; with one it returns an unbacked size)
    key = (op, _part(fa, mode), _part(fk, mode), torch.get_default_dtype(),
           getattr(mode, "shape_env", None) is not None)
    if not any(isinstance(t, torch.Tensor) for t in _tensors((fa, fk))):
        key += (torch.get_default_device(),)  # where a factory's result lives
    return None if _UNKEPT in key else key


def _part(x: Any, mode: Any) -> Any:
    kind = type(x)
    if kind in LITERALS:
        return (kind, x)
    if isinstance(x, torch.Tensor):
        return _tensor_part(x, mode)
    if kind is tuple or kind is list:
        parts = tuple(_part(y, mode) for y in x)
        return _UNKEPT if _UNKEPT in parts else (kind, parts)
    if kind is dict:
        parts = tuple((k, _part(v, mode)) for k, v in x.items())
        return _UNKEPT if any(p is _UNKEPT for _, p in parts) else (dict, parts)
    return _UNKEPT


def _tensor_part(t: torch.Tensor, mode: Any) -> Any:
    """A fake tensor's :func:`~ir.fake_memo.concrete_metadata` as a key part; ``_UNKEPT`` for
    a real, symbolic, constant, non-strided or grad-requiring one, or one of another mode than
    the call's (the run would refuse to mix them)."""
    found = concrete_metadata(t)
    if found is None or t.fake_mode is not mode or t.requires_grad:
        return _UNKEPT
    return found


def _metadata(out: Any, mode: Any, fa: tuple, fk: dict) -> tuple | None:
    """``(shape, stride, dtype, device)`` of a result that a kept entry can stand for: a fake
    tensor of ``mode``, concrete, at offset 0 of a storage no argument has
    (:func:`~ir.fake_memo.in_an_argument`), not a constant, no grad."""
    found = concrete_metadata(out)
    if (found is None or out.fake_mode is not mode or out.requires_grad
            or found[2] != 0 or in_an_argument(out, _tensors((fa, fk)))):
        return None
    shape, stride, _, dtype, device = found
    return (shape, stride, dtype, device)


def _tensors(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)
