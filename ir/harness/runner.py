"""The law runner: one side of a law run and observed, and two runs judged under a law.

The three laws that run two sides (``lowering.pass_laws.check_semantics``: a program and the pass's
result; ``transforms.rewrite.rule_check.check_rule``: a rule's pattern and the program ``rewrite``
makes of it; ``transforms.rewrite.check_context.check_site``: a program and its rewrite), on
each draw of the one law loop (``ir.harness.hold``), go through the same two steps, here:

- :func:`run_side`: what runs on one side (a function, its arguments, the state it reads and
  writes), run once through ``ir.harness.outcome`` (copies of the arguments, a seeded random
  state) and observed through ``ir.harness.observe`` (outputs, inputs after the call, state
  after the call, and the outputs' aliasing, read on the run's own objects before anything is
  copied); the observed values are then copied, so a later run cannot change them;
- :func:`judge`: the first difference between two observed runs under a ``Law`` (what it
  observes, how it names the wanted side, which aliasing changes it allows), a structured
  ``Difference``; under ``reassociate``, judged again against the wanted side run in float64
  (``ir.harness.regrouped_difference``).

Each law is a value: a ``Law`` (what is observed and compared) plus the sides it gives
:func:`run_side`; what is drawn and the loop over the draws are the law's ``ir.harness.Trial``,
run by ``ir.harness.hold``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ir.harness.compare import Difference, regrouped_difference, with_terms
from ir.harness.observe import Law, Observed, observe, observed_difference
from ir.harness.run import fresh, outcome


@attrs.frozen
class Ran:
    """One side run: ``observed`` (an ``Observed`` of copies) when it returned, else ``error``
    (the exception's type name and first line, as ``ir.harness.Outcome`` gives it)."""

    observed: Observed | None = None
    error: tuple[str, str] | None = None

    @property
    def ok(self) -> bool:
        """Whether the side returned (no error)."""
        return self.error is None


def run_side(
    fn: Callable[..., Any],
    args: Sequence = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    seed: int | None = 0,
    state: Callable[[], Mapping[str, Any]] | None = None,
) -> Ran:
    """Run ``fn(*args, **kwargs)`` on copies of the arguments under ``seed``
    (``ir.harness.outcome``) and observe it (``ir.harness.observe``).

    Parameters:
        fn: the side: a lowered module, a pattern, an interpreter closed over a program.
        args, kwargs: the drawn inputs; never written (the run gets copies).
        seed: the random state of the run (``None``: the current one, not forked); both sides
            of a law run with one seed draw the same random numbers.
        state: called after the run, the state it left, fqn -> value (a lowered module's
            buffers, the state dict an interpreter wrote); ``None``: no state.

    Returns a :class:`Ran`: the ``Observed`` (outputs as a tuple, one item per result, a
    single result made a 1-tuple; inputs after the call; state; aliasing of each output with
    the inputs, state and earlier outputs, read on the run's own objects), every tensor copied
    (``ir.harness.fresh``, strides kept), or the run's error. Any ``Exception`` of ``fn`` is
    captured.

    Laws: ``run_side(f, a)`` leaves ``a`` unchanged; two runs of a deterministic ``f`` with one
    ``seed`` observe equal values (``judge`` finds no difference). Complexity: one call of
    ``fn``, copies of its arguments, results and state, and a storage lookup per output,
    input and state tensor for the aliasing.
    """
    ran = outcome(fn, *args, seed=seed, **dict(kwargs or {}))
    if not ran.ok:
        return Ran(error=ran.error)
    results = ran.results if isinstance(ran.results, tuple) else (ran.results,)
    left = dict(state()) if state is not None else {}
    seen = observe(results, (*ran.args, *ran.kwargs.values()), left)
    return Ran(attrs.evolve(seen, outputs=fresh(seen.outputs), inputs=fresh(seen.inputs),
                            state={f: fresh(v) for f, v in left.items()}))


def regrouped(exact: Observed, terms: Observed | None) -> Observed:
    """A float64 reference run ``exact`` with each tensor paired with the same place of
    ``terms`` (the run on absolute values; ``ir.harness.with_terms``), field by field: what
    :func:`judge` takes as the reference under ``reassociate``. O(elements)."""
    if terms is None:
        return exact
    return attrs.evolve(
        exact,
        outputs=tuple(with_terms(exact.outputs, terms.outputs)),
        inputs=tuple(with_terms(exact.inputs, terms.inputs)),
        state=with_terms(dict(exact.state), dict(terms.state)),
    )


def judge(
    law: Law,
    got: Observed,
    want: Observed,
    *,
    assumes: frozenset[str] = frozenset(),
    reference: Callable[[], Observed | None] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    outputs: str = "outputs",
    written: frozenset[str] = frozenset(),
) -> Difference | None:
    """The first difference between two observed runs as ``law`` observes them, or ``None``;
    ``written`` as ``observed_difference`` takes it.

    ``ir.harness.observed_difference`` (outputs, inputs after the call, state, aliasing, as
    ``law.observes`` says; tolerances of the result dtype, ``atol``/``rtol`` when given,
    relaxed by ``assumes``); under ``reassociate``, where that finds a difference, judged again
    against ``reference()`` (the wanted side run in float64, ``None`` where it cannot be:
    ``ir.harness.regrouped_difference``). ``outputs`` names the outputs in the sentence.

    Laws: ``judge(law, o, o) is None`` for every ``o``. Complexity: O(elements), plus one run
    of ``reference`` where the first verdict is a difference under ``reassociate``.
    """

    def difference(ref: Observed | None) -> Difference | None:
        return observed_difference(got, want, law, assumes=assumes, reference=ref, atol=atol,
                                   rtol=rtol, outputs=outputs, written=written)

    return regrouped_difference(difference, reference or (lambda: None), assumes)


def state_value(holder: Any, fqn: str, missing: Any = None) -> Any:
    """The attribute at dotted ``fqn`` of ``holder`` (a module the side ran), what a law reads
    as the state after the call; ``missing`` where there is none. O(depth)."""
    obj = holder
    for part in fqn.split("."):
        obj = getattr(obj, part, missing)
        if obj is missing:
            return missing
    return obj


__all__ = ["Ran", "judge", "regrouped", "run_side", "state_value"]
