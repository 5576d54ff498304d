"""Running one side of a law: a function called on copies of its arguments, what it returned
or the error it raised captured as a value.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import attrs
import torch

from ir.errors import first_line
from ir.torch_seam import pytree


@attrs.frozen
class Outcome:
    """What one run gave: ``results`` (what the function returned) or ``error`` (the exception's
    type name and the first line of its message, ``None`` when it returned); ``args`` /
    ``kwargs``: the copies it ran on, as they were after the run (writes in place visible,
    aliasing with ``results`` observable)."""

    results: Any = None
    error: tuple[str, str] | None = None
    args: tuple = ()
    kwargs: dict = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the run returned (no error)."""
        return self.error is None


def fresh(tree: Any) -> Any:
    """``tree`` with every tensor replaced by a detached copy of the same layout (strides kept:
    a transposed or expanded input stays so; an expanded one becomes a real expand of a copy).
    O(elements)."""
    if isinstance(tree, torch.Tensor):  # one state tensor, the common case: no tree to walk
        return _copy(tree)
    return pytree.tree_map(_copy, tree)


def _copy(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    expanded = [d for d, (n, s) in enumerate(zip(x.shape, x.stride())) if s == 0 and n > 1]
    if expanded:  # copy what an expanded tensor reads, expand the copy the same way
        small = x
        for d in expanded:
            small = small.narrow(d, 0, 1)
        return _copy(small).expand(x.shape)
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    out.copy_(x)
    return out


def widen(tree: Any, *, absolute: bool = False) -> Any:
    """``tree`` with every floating tensor made float64 (complex ones complex128), strides
    kept; other leaves as they are. Tensors that are one object in ``tree`` stay one object
    (a state tensor named twice is widened once). What a law's float64 reference runs on
    (``ir.harness.regrouped_difference``). With ``absolute``, each floating (not complex)
    tensor is also made its absolute value: run on those, a sum of products gives the sum of
    its terms' magnitudes, the scale of a regrouped sum's rounding (``ir.harness.with_terms``).
    ``tree`` is not written. O(elements)."""
    done: dict[int, Any] = {}

    def wide(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or not (x.is_floating_point() or x.is_complex()):
            return x
        if id(x) not in done:
            to = torch.complex128 if x.is_complex() else torch.float64
            made = x.detach().to(to, memory_format=torch.preserve_format)
            done[id(x)] = made.abs() if absolute and not made.is_complex() else made
        return done[id(x)]

    return pytree.tree_map(wide, tree)


def outcome(fn: Callable, *args: Any, seed: int | None = 0, **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)`` run on copies of the arguments (``fresh``: the caller's tensors
    are never written), under a forked random state seeded with ``seed`` (``None``: the current
    state, not forked), warnings silenced; its results or its error as an ``Outcome``.

    Both sides of a law run with the same ``seed`` see the same random numbers. Any
    ``Exception`` is captured (a ``BaseException`` such as ``KeyboardInterrupt`` propagates).

    Laws: ``outcome(f, *a)`` leaves ``a`` unchanged. Complexity: one call of ``fn`` plus a copy
    of the arguments.
    """
    args, kwargs = fresh((args, kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if seed is None:
                out = fn(*args, **kwargs)
            else:
                with seeded(seed):
                    out = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - an error is one of the outcomes
            return Outcome(error=(type(exc).__name__, first_line(exc)), args=args,
                           kwargs=kwargs)
    return Outcome(results=out, args=args, kwargs=kwargs)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with every random generator a run can draw from seeded with ``seed``, and
    their states as they were restored afterwards.

    On a machine without an accelerator that is the CPU generator alone, seeded directly:
    ``torch.manual_seed`` would also queue a lazy seeding for each accelerator kind, recording
    the Python stack every time (milliseconds per call under a test runner's deep stacks; most
    of a law's run time on small programs). Where CUDA is initialised its generators are forked
    and seeded too; where an accelerator is present but not initialised ``torch.manual_seed``
    seeds it at its first use, as before.

    Laws: the same ``seed`` gives the same random numbers; the caller's random state is the same
    after as before (CPU and initialised CUDA devices). Complexity: O(devices).
    """
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    with torch.random.fork_rng(devices=devices):
        if devices or not _accelerator_present():
            torch.default_generator.manual_seed(seed)
            for d in devices:
                torch.cuda.default_generators[d].manual_seed(seed)
        else:
            torch.manual_seed(seed)
        yield


def _accelerator_present() -> bool:
    """Whether some accelerator torch seeds lazily is there (CUDA, XPU, MTIA)."""
    return bool(torch.cuda.is_available() or torch.xpu.is_available()
                or torch.mtia.is_available())


class OutOfTime(BaseException):
    """Raised by ``ShrinkLimit.run`` once its limit is spent, through hypothesis (which lets a
    ``BaseException`` pass at once); ``failure`` is the smallest counterexample's error."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__(str(failure))
        self.failure = failure


class ShrinkLimit:
    """A limit on shrinking a counterexample inside a hypothesis test (the ``budget`` of an
    ``ir.harness.Trial``); a subclass says when it is spent.

    ``run(key, check)`` runs ``check()``. Once some run has raised ``failure`` (the law's
    error type) and the limit is spent (:meth:`_spent`, asked before each later run), the next
    ``run`` raises ``OutOfTime`` carrying the latest failure (while shrinking, hypothesis runs
    only candidates smaller than the best so far, so the latest failure is the smallest).
    ``guard(test)`` runs the hypothesis test and raises that failure in its place, with the
    limit's note (:meth:`_note`) where it has one.

    Laws: a run with no failure before it is never stopped; the failure raised is the latest.
    O(1) per run besides ``check`` and :meth:`_spent`.
    """

    def __init__(self, failure: type[BaseException] = AssertionError) -> None:
        self.failure = failure
        self.latest: BaseException | None = None

    def _spent(self) -> bool:
        """Whether the limit is spent, asked before each run once a failure is known (a limit
        counted in runs counts this run here)."""
        raise NotImplementedError

    def _failed(self) -> None:
        """A run raised ``failure`` (the limit may start counting from the first)."""

    def _note(self) -> str | None:
        """A note for the failure raised when the limit is spent (None: no note)."""
        return None

    def run(self, key: Hashable, check: Callable[[], None]) -> None:
        """Run ``check()`` under the limit (see the class docstring); ``key`` names the draw
        (kept for reports). O(1) besides ``check``."""
        if self.latest is not None and self._spent():
            raise OutOfTime(self.latest)
        try:
            check()
        except self.failure as exc:
            self._failed()
            self.latest = exc
            raise

    def guard(self, test: Callable[[], None]) -> None:
        """Run the hypothesis test ``test()``; when the limit was spent, raise the smallest
        failure found (without hypothesis's report of it), with the limit's note."""
        try:
            test()
        except OutOfTime as stop:
            note = self._note()
            if note is not None:
                stop.failure.add_note(note)
            raise stop.failure from None


class ShrinkBudget(ShrinkLimit):
    """A time limit on shrinking (:class:`ShrinkLimit`): spent ``seconds`` after the first
    failure. A refused law so reports within about ``seconds`` of its first counterexample."""

    def __init__(self, seconds: float, failure: type[BaseException] = AssertionError) -> None:
        super().__init__(failure)
        self.seconds = seconds
        self.first: float | None = None

    def _spent(self) -> bool:
        return time.monotonic() > (self.first or 0.0) + self.seconds

    def _failed(self) -> None:
        if self.first is None:
            self.first = time.monotonic()


__all__ = ["OutOfTime", "Outcome", "ShrinkBudget", "ShrinkLimit", "fresh", "outcome", "widen"]
