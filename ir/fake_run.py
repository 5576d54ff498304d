"""Running an operator on fake values: the one fake propagation of purefx.

A new or re-argued node's ``val`` is its operator run on its arguments' ``val`` s, under their
fake mode (``meta`` tensors run as they are), with torch's fake-tensor log quieted. Used by the
rewriting kernel (``transforms.kernel``: every pass that emits nodes) and by
``verify(p, vals=True)`` (every node's ``val`` derived again and compared).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ir.args import Ref, thaw
from ir.errors import first_line
from ir.names import target_name
from ir.torch_seam import fake_failures_unlogged, pytree

__all__ = ["META", "FakeRunFailed", "describe", "fake_value", "same_val"]


class FakeRunFailed(Exception):
    """The operator raised on the fake values of its arguments (all known); ``cause`` is what
    it raised; ``on_meta``, whether the values were meta tensors rather than fake ones."""

    def __init__(self, target: Any, cause: BaseException, on_meta: bool = False) -> None:
        self.cause_line = first_line(cause)
        super().__init__(f"{target_name(target)}: {type(cause).__name__}: {self.cause_line}")
        self.target = target
        self.cause = cause
        self.on_meta = on_meta

    @property
    def no_kernel(self) -> bool:
        """Whether the operator has no kernel for these values (not the arguments' fault)."""
        return isinstance(self.cause, NotImplementedError)


META: Any = contextlib.nullcontext()  #: the "mode" of programs whose vals are meta tensors


def fake_value(
    target: Any,
    args: Any,
    kwargs: Any,
    val_of: Callable[[Ref], Any],
    *,
    method: bool = False,
    mode: Any = None,
    meta: bool = True,
) -> Any:
    """``target(*args, **kwargs)`` run on fake values: each ``Ref`` is replaced by
    ``val_of(ref)``, under the fake mode of those values (``mode`` when none of them has one;
    ``meta`` tensors run as they are when ``meta``).

    Returns the result, or ``None`` when an argument's value is unknown (``val_of`` gives
    ``None``) or no mode is found. ``method``: ``target`` names a Tensor method of the first
    argument. Raises ``FakeRunFailed`` when the operator raises on the known values.

    **Laws:** never runs an operator on real data; torch's fake-tensor log stays quiet
    (``ir.torch_seam.fake_failures_unlogged``). O(arguments) plus one run.
    """
    missing = False
    found: list[Any] = []

    def read(r: Ref) -> Any:
        nonlocal missing
        v = val_of(r)
        if v is None:
            missing = True
        elif not found:
            for t in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(t, torch.Tensor):
                    m = getattr(t, "fake_mode", None)
                    if m is not None:
                        found.append(m)
                        break
                    if meta and t.device.type == "meta":
                        found.append(META)
                        break
        return v

    a, k = thaw(args, read), thaw(kwargs, read)
    run_in = found[0] if found else mode
    if missing or run_in is None:
        return None
    try:
        with fake_failures_unlogged(), run_in:
            if method:
                return getattr(a[0], target)(*a[1:], **dict(k))
            return target(*a, **dict(k))
    except Exception as exc:  # torch's errors share no base class
        on_meta = run_in is META or any(
            isinstance(x, torch.Tensor) and x.device.type == "meta"
            for x in pytree.tree_leaves((a, k))
        )
        raise FakeRunFailed(target, exc, on_meta=on_meta) from exc


def same_val(a: Any, b: Any) -> bool:
    """Same dtype, shape and device, tensor by tensor through tuples and lists; a value that
    is not a tensor (a size, ``None``) is not compared. O(size of the values)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.device == b.device
            and len(a.shape) == len(b.shape)
            and all(_same_dim(x, y) for x, y in zip(a.shape, b.shape))
        )
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_val(x, y) for x, y in zip(a, b))
    return True


def _same_dim(x: Any, y: Any) -> bool:
    if type(x) is int and type(y) is int:
        return x == y
    ex, ey = getattr(x, "node", None), getattr(y, "node", None)
    ex = ex.expr if ex is not None else x  # sympy expressions compare without a guard
    ey = ey.expr if ey is not None else y
    if ex == ey:
        return True
    # a size a data-dependent operator gives (an unbacked symbol) is named anew by each run
    return any(str(s).startswith("u") for e in (ex, ey) for s in getattr(e, "free_symbols", ()))


def describe(v: Any) -> str:
    """``float32[3, 4]`` for a tensor, else the type's name."""
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(describe(x) for x in v) + ")"
    return type(v).__name__
