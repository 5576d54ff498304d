"""Shared pieces of the law suite: example budgets, input domains of the built-in passes.

Each built-in pass is checked on the programs it meets in the default pipeline: flat programs
as ``import_ep`` gives them (``ir.strategies.programs()``) mapped through the passes that run
before it. Budgets scale with the hypothesis profile (``HYPOTHESIS_PROFILE``): ``ci`` runs the
numbers given here, ``nightly`` ten times as many, ``dev`` a fifth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import settings

from ir.program import Program
from ir.strategies import FEATURES, OPT_IN_FEATURES, program_inputs, programs
from ir.verify import verify
from lowering import lower
from transforms.pipeline import pipeline

Pass = Callable[[Program], Program]

# The default pipeline, in order: the preserved-call stages are listed passes too.
PIPELINE: tuple[Pass, ...] = pipeline()


def examples(n: int) -> int:
    """``n`` examples under the ``ci`` profile (100 examples), scaled for the others."""
    return max(1, n * settings.default.max_examples // 100)


def through(passes: Sequence[Pass]) -> Pass:
    """The composition ``passes[-1] ∘ ... ∘ passes[0]``."""

    def run(p: Program) -> Program:
        for f in passes:
            p = f(p)
        return p

    run.__qualname__ = " ∘ ".join(f.__name__ for f in reversed(passes)) or "identity"
    return run


def before(pass_fn: Pass, features=None, source=programs):
    """Generated programs as ``pass_fn`` meets them in the default pipeline.

    ``source`` is the strategy the programs come from (``programs``, or ``crossing_programs``
    for the preserved-call stages), called with ``features``. A program on which an earlier
    pass raises is skipped here (that pass's own law test reports it), so each test checks its
    own pass only.
    """
    prefix = PIPELINE[: PIPELINE.index(pass_fn)]
    if not prefix:
        return source(features=features)
    return valid(through(prefix), features, source)


def valid(pass_fn: Pass, features=None, source=programs):
    """``pass_fn`` of generated programs (from ``source``), where it returns a Program that
    verifies and whose lowered module runs (so that a later pass's semantics law has a reference
    to compare to).
    """

    def prepared(p: Program) -> Program | None:
        try:
            q = verify(pass_fn(p))
            args, kwargs = program_inputs(q)
            lower(q)(*args, **kwargs)
            return q
        except Exception:  # noqa: BLE001 - reported by the earlier pass's own law test
            return None

    return source(features=features).map(prepared).filter(lambda p: p is not None)


def without(*names: str) -> frozenset[str]:
    """Every default feature but ``names``: what ``programs()`` draws with no ``features``, less
    ``names`` (the opt-in features stay off, as they are by default)."""
    return frozenset(FEATURES) - OPT_IN_FEATURES - set(names)
