"""Running an operator on fake values: the one fake propagation of purefx.

A new or re-argued node's ``val`` is its operator run on its arguments' ``val`` s, under their
fake mode (``meta`` tensors run as they are), with torch's fake-tensor log quieted. Used by the
rewriting kernel (``transforms.kernel``: every pass that emits nodes) and by
``verify(p, vals=True)`` (every node's ``val`` derived again and compared).

**Nothing a fake run does writes the program.** A program's ``val`` s share one fake mode and
its shape env with the ``ExportedProgram`` it came from and with every program a pass made from
it. A guard recorded there (``s0 == 5``, asked by ``int(size)`` or by an operator that must know
a size) would fix a dynamic size *of the input program too*: its lowering would then reject the
other sizes. So every fake run happens inside ``guards_refused``: a guard the shape env cannot
prove from what it already knows (the program's ranges, its replacements) is refused before the
env changes (``FakeRunFailed.guard`` says which); each caller turns that into its own answer (a
``PassError`` naming the node and the dimension, a rule not taken). A guard that the program's
own constraints imply (a symbol whose range is one value) is proved, not recorded, and passes.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ir.args import Ref, thaw
from ir.errors import first_line
from ir.names import target_name
from ir.op_known import meet
from ir.torch_seam import (
    ShapeEnvGuardError,
    fake_failures_unlogged,
    guard_failures_unlogged,
    pytree,
    refusing_new_guards,
)

__all__ = [
    "META",
    "FakeRunFailed",
    "RefusedGuard",
    "describe",
    "fake_value",
    "guards_refused",
    "refused_guard",
    "same_layout",
    "same_val",
]


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

    @property
    def guard(self) -> RefusedGuard | None:
        """The guard the run would have added to the shape env (``guards_refused``), when that
        is why it failed; else ``None``."""
        return refused_guard(self.cause)


class RefusedGuard:
    """A guard a fake run asked for and ``guards_refused`` refused: ``text`` (``the guard s0 ==
    5``, torch's spelling of the guard), ``symbols`` (the names of the shape env's symbols it
    reads, in order)."""

    __slots__ = ("symbols", "text")

    def __init__(self, text: str, symbols: tuple[str, ...]) -> None:
        self.text = text
        self.symbols = symbols

    def __repr__(self) -> str:
        return f"RefusedGuard({self.text!r})"


_GUARD_TEXT = re.compile(r"frozen:\s*(.*)$", re.DOTALL)
_SYMBOL = re.compile(r"\b[a-z]{1,3}[0-9]+\b")


def refused_guard(exc: BaseException | None) -> RefusedGuard | None:
    """The guard refused (``guards_refused``) that ``exc`` is, or was raised from (its
    ``__cause__`` / ``__context__`` chain: torch wraps errors raised inside an operator);
    ``None`` when it is another error. O(length of the chain)."""
    seen = 0
    while exc is not None and seen < 32:
        if isinstance(exc, ShapeEnvGuardError):
            found = _GUARD_TEXT.search(str(exc))
            text = (found.group(1) if found else str(exc)).strip()
            symbols = tuple(dict.fromkeys(_SYMBOL.findall(text)))
            return RefusedGuard(f"the guard {text}", symbols)
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


_HELD_LOCK = threading.Lock()
_HELD: dict[int, list] = {}  # id(shape env) -> [depth, the entered context, the env]


@contextlib.contextmanager
def guards_refused(*modes: Any) -> Iterator[None]:
    """Within the block, a guard that a run under one of ``modes`` (fake modes; ``META``,
    ``None`` and modes without a shape env are skipped) would record on its shape env raises
    ``ShapeEnvGuardError`` (``ir.torch_seam``) instead, before the env changes: the program's
    dynamic sizes stay as they are. What the env proves from its ranges and replacements is not
    a guard and passes.

    Re-entrant and shared between threads: the env's flags are set by the first block to enter
    and restored by the last to leave (a lock and a depth per env). While any block is open on
    an env, every run on it refuses guards, in any thread.

    **Laws:** the shape env's guards, replacements and ranges are the same after the block as
    before it; the block's own result is unchanged where no guard was asked. O(1) per mode.
    """
    envs = []
    for mode in modes:
        env = getattr(mode, "shape_env", None)
        if env is not None and all(e is not env for e in envs):
            envs.append(env)
    if not envs:
        yield
        return
    quiet = guard_failures_unlogged()
    quiet.__enter__()
    for env in envs:
        with _HELD_LOCK:
            entry = _HELD.get(id(env))
            if entry is None:
                ctx = refusing_new_guards(env)
                ctx.__enter__()
                entry = _HELD[id(env)] = [0, ctx, env]
            entry[0] += 1
    try:
        yield
    finally:
        for env in envs:
            with _HELD_LOCK:
                entry = _HELD[id(env)]
                entry[0] -= 1
                if entry[0] == 0:
                    del _HELD[id(env)]
                    entry[1].__exit__(None, None, None)
        quiet.__exit__(None, None, None)


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
    argument. Raises ``FakeRunFailed`` when the operator raises on the known values, or would
    add a guard to their shape env (``FakeRunFailed.guard``: a result valid at one size of a
    dynamic dimension only).

    **Laws:** never runs an operator on the program's data (an operator the verified table
    lacks is first observed, once per kind of call, on new small real tensors of the
    values' metadata: ``ir.op_known.meet``); never writes the values' shape env
    (``guards_refused``); torch's fake-tensor log stays quiet
    (``ir.torch_seam.fake_failures_unlogged``); runs under ``torch.no_grad()`` (results carry
    no ``grad_fn``; autograd's view/in-place refusals are not the operator's). O(arguments)
    plus one run.
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
    if not method:
        meet(target, a, k)  # an operator the verified table lacks: observed on these values
    try:
        # grad off: a val is dtype, shape, device and strides; autograd's own refusals (an
        # in-place write of one output of a multi-output view such as ``split``, which a
        # rewrite's intermediate state may hold before its visit makes it functional) are not
        # the operator's, and would refuse re-derived vals of parameters' readers
        with fake_failures_unlogged(), guards_refused(run_in), run_in, torch.no_grad():
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


def hint(d: Any) -> Any:
    """A symbolic size or scalar's hint (its value in the example export traced; ``None`` when
    it has none), else ``d``. O(1)."""
    if isinstance(d, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return d.node.hint
    return d


def same_layout(a: Any, b: Any) -> bool:
    """Same strides, tensor by tensor through tuples and lists (compared as ``same_val``
    compares sizes: symbolic ones by expression, never by a guard); a tensor without strides
    (sparse, nested), a rank or a value that is not a tensor is not compared. What a
    replacement of the same dtype and shape may still change for its readers: a ``view`` of
    it may no longer run, another reader's result may take other strides. O(size of the
    values)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.layout != torch.strided or b.layout != torch.strided or a.dim() != b.dim():
            return True
        return all(_same_dim(x, y) for x, y in zip(a.stride(), b.stride()))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) != len(b) or all(same_layout(x, y) for x, y in zip(a, b))
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
