"""``check_rule``: a rewrite rule's law, checked on generated inputs before the rule is trusted.

The law: wherever the pattern runs and ``rewrite`` takes the rule, the program ``rewrite`` makes
computes what the pattern does. Concretely, for each drawn *signature* (the tensor arguments'
shapes and dtypes, the scalar arguments' values) the pattern is traced into a program at that
signature, that program is rewritten with ``transforms.rewrite.engine.apply_rules(p, [rule])``
(the one path that instantiates replacements, the one ``rewrite`` runs), and the rewritten graph
is run on drawn values (``ir.strategies.values``: IEEE edge values, four memory layouts). Its
results must agree with the pattern run eagerly on the same values in number, shape, dtype,
aliasing (a result that is a view of an argument or of another result stays one; a fresh
result stays fresh) and value, compared by ``ir.harness.value_difference``: position by
position, NaN only equal to NaN, ±inf exact, -0.0 not +0.0, finite values within the tolerance
of the dtype each result is computed in.

Assumptions (``Rule.assumes``, after LLVM's fast-math flags) hold for inputs, intermediates and
results alike: only inputs they admit are drawn, and a position where the pattern's result
breaks one (NaN under ``no_nans``, ±inf under ``no_infs``) may hold anything, as LLVM makes such
a result poison; ``no_signed_zeros`` makes -0.0 equal +0.0; ``reassociate`` does too (regrouping
flips the sign of an exact zero: ``ir.harness.SIGNLESS_ZEROS``) and widens the tolerance
(``ir.harness.tolerance.REASSOCIATE``). A rule with ``specials=False`` is checked as if it
assumed ``no_nans``, ``no_infs`` and ``no_signed_zeros``.

Also: a pattern holding an in-place operator is refused when the rule is compiled (a PassError:
rewrite matches functional programs); the pattern matches its own traced graph exactly once; and
``rewrite`` takes the rule on its own pattern at one signature at least (a rule whose ``where`` holds on no draw is refused: it
would pass having checked nothing).
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from ir.args import iter_refs
from ir.errors import PassError, PurefxError, first_line
from ir.harness import (
    Law,
    Observed,
    Ran,
    ShrinkBudget,
    Trial,
    hold,
    judge,
    outcome,
    regrouped,
    run_side,
    same_layout,
    value_difference,
    widen,
)
from ir.import_ep import import_ep
from ir.memo import NOT_COMPUTED, BoundedMemo
from ir.node import CALL_FUNCTION
from ir.program import Program
from ir.strategies.rewrite_sites import is_spec
from ir.strategies.seeded_values import seeded_tensor
from ir.strategies.values import (
    FLOAT_DTYPES,
    ORDINARY,
    WHOLE,
    conversions_edges,
    edges,
    int_edges,
    scalar_values,
    size_variants,
    tensors,
)
from transforms.machinery.law_violation import LawViolation
from transforms.machinery.trace import TRAINING
from transforms.rewrite.engine import apply_rules
from transforms.rewrite.interpret import run_graph
from transforms.rewrite.match import match_at
from transforms.rewrite.rule import Rule, sharing_traces
from transforms.rewrite.rule_key import rule_seed

DTYPES = FLOAT_DTYPES
"""The float dtypes drawn for a floating tensor argument."""
ALL_DTYPES = (*DTYPES, torch.int64, torch.int32, torch.bool)
"""Every dtype tried for a tensor argument; drawn where the pattern runs on it."""
SIGNATURES = 16
ALSO_AT_SHARE = 4
"""An ``also_at`` example set's variants get ``1/ALSO_AT_SHARE`` of the signatures and
examples the first set's get (``check_rule``)."""
"""At most this many signatures (each one trace of the pattern, made when first drawn) per
``check_rule``."""
PAIRS = 60
"""At most this many pairs of size changes tried (eagerly) when drawing signatures."""
SCALAR_PAIRS = 100
"""At most this many pairs of values of two scalar arguments tried (eagerly) when drawing
signatures (two float scalars' pools: 81)."""
SHRINK_SECONDS = 6.0
"""Once a counterexample is found, shrinking it stops after this many seconds (the smallest
counterexample found by then is reported): a refused rule reports within seconds."""
_INTERLEAVED = (torch.float64, torch.int64, torch.float16, torch.bool, torch.bfloat16,
                torch.int32, torch.float32)
FINITE = frozenset({"no_nans", "no_infs", "no_signed_zeros"})
"""What a rule with ``specials=False`` is checked under: finite values, one zero."""


@attrs.frozen
class Signature:
    """What one trace of a rule's pattern is specialized to: ``args`` gives, per rule argument,
    ``(shape, dtype)`` for a tensor and the value for a scalar."""

    args: tuple  #: a tensor's ``(shape, dtype)`` (``is_spec``), a scalar, ``None``, a hyper value

    def tensors(self) -> tuple[int, ...]:
        """The positions of the tensor arguments."""
        return tuple(i for i, a in enumerate(self.args) if is_spec(a))

    def key(self) -> tuple:
        """A hashable key telling signatures apart (``0.0`` from ``-0.0``, ``1`` from ``1.0``)."""
        return tuple(a if is_spec(a) else (type(a).__name__, repr(a)) for a in self.args)

    def describe(self) -> str:
        """The signature in words: ``(tensor(3, 4) float32, 2.0)``."""
        parts = []
        for a in self.args:
            if is_spec(a):
                parts.append(f"tensor{a[0]} {str(a[1]).replace('torch.', '')}")
            else:
                parts.append(repr(a))
        return "(" + ", ".join(parts) + ")"


def assumed(rule: Rule) -> frozenset[str]:
    """The assumptions ``rule`` is checked under: its ``assumes``, plus ``FINITE`` when it says
    ``specials=False``. O(1)."""
    return rule.assumes | (frozenset() if rule.specials else FINITE)


@attrs.frozen
class Checked:
    """What ``check_rule`` saw of a rule it accepts.

    - ``ran``: draws where the pattern ran; ``rewritten``: those where ``rewrite`` took the
      rule on the pattern's own program (each one checked);
    - ``restrided``: the signatures (``Signature.describe``) where a result of the rewritten
      program, equal in value, has other strides than the pattern's (``ir.harness.same_layout``:
      ``b.t() @ a.t() -> (a @ b).t()``). The law in isolation does not refuse a rule for that
      (a caller that returns the result sees the same values); in a program, ``rewrite``'s
      ``layout`` guard takes such a match only where no reader depends on the strides, and
      ``check_rule_in_context`` draws such a reader (``view(-1)``).
    """

    ran: int
    rewritten: int
    restrided: tuple[str, ...] = ()

    @property
    def changes_layout(self) -> bool:
        """Whether the rewrite changed a result's strides on some draw."""
        return bool(self.restrided)


def check_rule(rule: Rule, *, max_examples: int | None = None,
               seed: int | None = None) -> Checked:
    """Raise ``LawViolation`` (law ``"rule"``) with a counterexample when ``rule`` is wrong;
    else return what was checked (``Checked``: draws run and rewritten, the signatures where
    the rewrite changed a result's strides).

    Replacements are instantiated by the rewrite ``rewrite`` runs (``engine.apply_rules``).

    What is drawn (``docs/rewrite.md``, "What check_rule draws"): up to ``SIGNATURES``
    signatures where the pattern runs (``signatures``): the example's; each dtype of
    ``ALL_DTYPES`` for all tensor arguments and for one at a time; sizes per dimension
    (``ir.strategies.values.size_variants``: 1, the other sizes of the signature, one more:
    broadcasting along any dimension); each free scalar argument on its own over zero, -0.0,
    negative, fractional, above one and large, crossed with every float dtype; combinations.
    Signatures where the replacement, run eagerly, disagrees with the pattern come first. Per
    example purefx's own seeded generator draws the values at a signature (``drawn``: the
    kinds of ``ir.strategies.values.tensors``, per element ordinary and IEEE edge values as
    ``assumed(rule)`` admits, in a contiguous, transposed, strided or expanded layout), never
    hypothesis, so the verdict is the same on every hypothesis version. Once a draw breaks the
    law, a hypothesis search at its signature looks for a counterexample shrunk toward
    ordinary values and the contiguous layout, for at most ``SHRINK_SECONDS``: it changes the
    counterexample reported, never the verdict.
    Deterministic probes come first at each signature: ordinary values, rows of edge values,
    columns of finite edge values beside their negations (``column_seeds``);
    where the pattern's program or its rewrite converts dtypes (``conversions``: ``.to``, a
    cast), each tensor at the edges of those conversions (``conversion_probe``: a float past
    the integer range, the integer bounds and one past them); where either computes integer
    arithmetic that wraps (``wraps``: ``neg``, ``sub``, ``abs``, ``add``, ``mul`` on integers),
    each integer tensor at its dtype's bounds, every pair of values for two of them
    (``int_edge_probe``: ``-INT_MIN`` is ``INT_MIN``). The draws are seeded by the rule's
    content (``rule_key.rule_seed``), never its name: a renamed rule gets the same verdict.

    ``seed``: ``None`` (the default) draws as described, seeded by the rule's content alone, so
    a verdict is reproducible and can be stored (``transforms.rewrite.verdicts``). An int draws
    another stream of the same kinds (``Draws``): the examples (their generator's seed holds
    it), the ordinary-and-edge probe, which edge value each row of the edge rows gets, and the
    sample of size pairs and combinations among the signatures. Every edge value is still
    probed in each floating tensor on every seed. A right rule is accepted and a wrong one
    refused whatever the seed: that is what ``tests/test_check_rule_seeds.py`` checks on the
    suites' rules (``tests/rule_suites.py``), and how ``bench.power`` measures the checker.

    What is checked (the module docstring states the law): on each signature the pattern's
    program is rewritten by ``apply_rules`` (so ``where`` sees a real match) and run. Draws
    where the pattern raises, or where rewrite declines the match, check nothing; when that is
    every draw, the rule is refused.

    Raises:
        ValueError: naming ``seed`` when it is not ``None`` or an int.
        LawViolation: a counterexample (the values and what differs), a pattern holding an
            in-place operator, the pattern not matching its own trace exactly once, or no draw
            rewritten (saying whether ``where`` held on none).
        PassError: naming the rule, when it cannot be traced, is malformed, or its ``where``
            raises. Nothing else escapes: an error while rewriting or running is reported as a
            ``LawViolation`` naming the draw.

    A rule with hyperparameters (``hyper``) is checked over drawn values of them too (each on
    its own, ``Hyper.values``, as a free scalar is), so a rule right only at its example's
    stride is refused; a rule with ``optional`` tensor arguments is checked once per
    variant (``Rule.variants``: each combination of them ``None`` or a tensor), and what was
    checked is summed.

    A rule traced at more example sets (``Rule.also_at``: other ranks, a string padding) is
    checked at each set's variants too, with a quarter of the signatures and examples
    (``ALSO_AT_SHARE``): the functions are the same, what a set adds is its trace (another
    operator, another rank's reshape), which a wrong rule breaks at most draws.

    Cost: at most ``SIGNATURES`` exports of the pattern and rewrites, plus ``max_examples``
    (default ``rule.max_examples``) eager runs of the pattern and of the rewritten graph, per
    variant of the first example set; a quarter of that per variant of each ``also_at`` set.
    """
    draws = Draws.of(seed)
    every = rule.variants()
    first = 2 ** len(rule.optional) if rule.also_at else len(every)
    n = max_examples if max_examples is not None else rule.max_examples
    found = [_check_variant(v, n, draws=draws) for v in every[:first]]
    found += [_check_variant(v, max(1, n // ALSO_AT_SHARE),
                             max(2, SIGNATURES // ALSO_AT_SHARE), draws=draws)
              for v in every[first:]]
    return Checked(sum(c.ran for c in found), sum(c.rewritten for c in found),
                   tuple(r for c in found for r in c.restrided))


@attrs.frozen
class Draws:
    """Which stream of draws one ``check_rule`` call takes: ``seed`` ``None``, the default one
    (seeded by the rule's content only); an int, another one of the same kinds. Made by
    ``Draws.of``."""

    seed: int | None = None

    @staticmethod
    def of(seed: Any) -> Draws:
        """``Draws(seed)``; ``ValueError`` naming ``seed`` when it is not ``None`` or an int
        (a bool is refused). O(1)."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"check_rule: seed must be None or an int, got {seed!r}")
        return Draws(seed)

    def rng(self) -> random.Random:
        """A fresh generator for the signatures' sample: ``Random(0)`` by default, else seeded
        by ``seed``."""
        return random.Random(0 if self.seed is None else f"check_rule {self.seed}")

    def probes(self, sig: Signature, assumes: frozenset[str]) -> tuple[int, ...]:
        """The ``probe`` seeds tried first at ``sig``: ordinary values (0), ordinary values
        with edge values among them (1 by default, another positive seed else), then
        ``row_seeds`` and ``column_seeds`` (shifted by the seed: which row or column holds
        which edge value). O(arguments)."""
        if self.seed is None:
            return (0, 1, *row_seeds(sig, assumes), *column_seeds(sig, assumes))
        mixed, shift = 2 + self.seed % (2**31 - 2), self.seed % 2**16
        return (0, mixed, *row_seeds(sig, assumes, shift=shift),
                *column_seeds(sig, assumes, shift=shift))

    def key(self, rule: Rule, sig: Signature) -> tuple:
        """What tells the draws at ``sig`` apart: the rule's content and the signature, and the
        seed when there is one (the examples' seed, and the key of the shrinking search)."""
        base = (rule_seed(rule), sig.describe())
        return base if self.seed is None else (*base, self.seed)

    def examples(self, rule: Rule, sig: Signature) -> random.Random:
        """A fresh generator of the examples drawn at ``sig`` (``drawn``), seeded by ``key``:
        the rule's content, the signature and the seed; one stream per signature, whatever was
        drawn at the others. O(1)."""
        return random.Random("check_rule examples " + repr(self.key(rule, sig)))


def _check_variant(rule: Rule, n: int, limit: int = SIGNATURES, *,
                   draws: Draws = Draws()) -> Checked:
    compiled = rule.compiled(TRAINING)
    _check_matches_itself(rule, compiled)
    sigs, scores = _signatures(rule, limit, draws=draws)
    state = _State(rule, sigs, scores, draws)
    try:
        _search(state, n)
    except _WhereRaised as exc:
        raise PassError(
            f"rule {rule.name!r}: its where() raised {exc.kind}: {exc.text}; make where() "
            "return a bool for every Match"
        ) from exc.__cause__
    except (LawViolation, PassError):
        raise
    except PurefxError as exc:
        raise PassError(f"rule {rule.name!r}: {exc}") from exc
    except Exception as exc:  # the contract: no raw error escapes
        raise LawViolation(
            "rule", rule, f"checking the rule raised {type(exc).__name__}: {exc}", None
        ) from exc
    if state.rewritten == 0:
        why = _why_never(rule, sigs[0])
        raise LawViolation(
            "rule", rule,
            f"rewrite took the rule on its own pattern on none of the {state.ran} draws where "
            f"the pattern ran ({why}), so nothing was checked; a rule must apply somewhere "
            "(widen its where(), or give example_inputs where it holds)", None,
        )
    restrided = tuple(sigs[i].describe() for i in sorted(state.restrided))
    return Checked(state.ran, state.rewritten, restrided)


class _WhereRaised(PurefxError):
    """A rule's ``where`` raised while ``check_rule`` ran it (told apart by type, not text)."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(f"where() raised {kind}: {text}")
        self.kind = kind
        self.text = text


@attrs.frozen
class _GuardedWhere:
    """A rule's ``where``, its errors raised as ``_WhereRaised``."""

    where: Callable

    def __call__(self, match: Any) -> bool:
        try:
            return bool(self.where(match))
        except PurefxError:
            raise
        except Exception as exc:  # a where that raises: the rule is malformed
            raise _WhereRaised(type(exc).__name__, first_line(exc)) from exc


def _why_never(rule: Rule, sig: Signature) -> str:
    """Why no draw was rewritten, judged at ``sig``: by the rule's ``where`` (when the same
    rule without it rewrites the pattern's program) or by the matching and rewrite's guards."""
    if rule.where is not None and _rewritten_site(
        sharing_traces(rule, where=None), sig
    ) is not None:
        return "its where() held on none of them"
    return ("the pattern does not match its own exported program, or one of rewrite's guards "
            "(aliasing, dtypes, preserved calls) declines every match")


def _search(state: _State, n: int) -> None:
    """Search each signature in turn (the example's, then the telling ones): its ``probe``
    values first, then ``budgets(…)[i]`` examples drawn by purefx's own seeded generator
    (``drawn``). A probe or example that breaks the law is followed by a hypothesis search at
    its signature, for a shrunk counterexample (the draw's own is raised when none is found):
    hypothesis only explains a verdict, it never decides one. Except after an integer-edge
    probe of a program that divides integers (``divides``): there the probe's own is raised,
    since a search near ``INT_MIN`` would divide it by -1, which stops the process (SIGFPE),
    not with an error; and inside a hypothesis test (a property suite that calls rewrite),
    where hypothesis cannot nest: there the draw's own is raised."""
    from hypothesis import currently_in_test_context

    nested = currently_in_test_context()
    for i, k in zip(range(len(state.sigs)), budgets(state, n)):
        sig = state.sigs[i]
        at_int_edges = False
        try:
            for seed in state.draws.probes(sig, state.draw_assumes):
                state.check(i, probe(sig, state.draw_assumes, seed))
            found = state.built(i).conversions  # known once a probe has run the pattern
            for start in conversion_starts(sig, found):
                state.check(i, conversion_probe(sig, found, start))
            if state.built(i).wraps:  # integer arithmetic: each integer tensor at its edges
                at_int_edges = True
                divides = state.built(i).divides
                for start in int_edge_starts(sig, divides=divides):
                    state.check(i, int_edge_probe(sig, start, divides=divides))
            at_int_edges = False
            if state.sites.get(i, True) is None:
                continue  # rewrite declines the match at this signature: nothing to check here
            rng = state.draws.examples(state.rule, sig)
            for _ in range(k):
                state.check(i, drawn(sig, state.draw_assumes, state.built(i).conversions, rng))
        except LawViolation:
            if not nested and not (at_int_edges and state.built(i).divides):
                _shrunk(state, i, max(SHRINK_EXAMPLES, k))
            raise


def _shrunk(state: _State, i: int, k: int) -> None:
    """Raise the smaller counterexample a hypothesis search of ``k`` examples at signature
    ``i`` finds; return when it finds none, or when the search itself fails otherwise (its
    draws are hypothesis's, so nothing it does but a counterexample may reach the verdict)."""
    try:
        _hypothesis_search(state, i, k)
    except LawViolation:
        raise
    except Exception:  # noqa: BLE001 - the draw's own counterexample is raised instead
        return


SHRINK_EXAMPLES = 20
"""Examples searched at a signature where a probe broke the law, for a shrunk counterexample."""


def budgets(state: _State, n: int) -> list[int]:
    """How many examples each signature gets out of ``n``: the example's and those
    where the functions disagree eagerly three per round, the others one, round after round
    until ``n`` are given. O(n + signatures)."""
    weights = [3 if i == 0 or i <= state.wrong else 1 for i in range(len(state.sigs))]
    out = [0] * len(weights)
    left = n
    while left > 0:
        for i, w in enumerate(weights):
            give = min(w, left)
            out[i] += give
            left -= give
    return out


def _hypothesis_search(state: _State, i: int, k: int) -> None:
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import strategies as st

    sig = state.sigs[i]
    found = state.built(i).conversions
    args = st.tuples(*(
        tensors(a[0], a[1], assumes=state.draw_assumes, extra=conversions_edges(a[1], found))
        if is_spec(a) else st.just(a)
        for a in sig.args
    ))

    base = settings(derandomize=True, database=None, suppress_health_check=list(HealthCheck),
                    phases=(Phase.explicit, Phase.generate, Phase.shrink))
    hold(Trial(RULE, args, lambda drawn: state._check(i, drawn),
               key=state.draws.key(state.rule, sig), budget=state.budget),
         settings=base, max_examples=k)


ROWS = -1
"""``probe``'s first seed for edge rows: each row (last dimension) one edge value everywhere;
seed ``ROWS - k`` starts ``k`` rows further along the edges (``row_seeds``)."""


def row_seeds(sig: Signature, assumes: frozenset[str], *, shift: int = 0) -> tuple[int, ...]:
    """The ``probe`` seeds whose edge rows give every edge value a row of its own in each
    floating tensor of ``sig`` (at most ``len(edges)`` seeds). ``shift`` starts them ``shift``
    row blocks further along the edges (any shift keeps every edge value in a row: the seeds
    cover a window of consecutive edges at least as long as the pool; what changes is which
    row, and which value of another tensor, each one meets). O(arguments)."""
    need = 0
    for a in sig.args:
        if is_spec(a) and a[1].is_floating_point:
            shape = a[0]
            rows = max(1, math.prod(shape[:-1])) if shape and shape[-1] else 1
            need = max(need, -(-len(edges(a[1], assumes=assumes)) // rows))
    return tuple(ROWS - k - shift for k in range(need))


COLUMNS = -(2**20)
"""``probe``'s first seed for edge columns: each column (a position along the last dimension)
one finite edge value down every row, beside its negation (``column_edges``); seed ``COLUMNS -
k`` starts ``k`` pairs of columns further along (``column_seeds``). A reduction along a leading
dimension meets one edge value repeated, as one along the last dimension does in an edge row,
and the pairs cancel in a sum over everything: a float16 column of 65504s sums to inf beside a
column of -65504s, so ``x.sum(0).sum(0)`` is NaN where ``x.sum()`` is 0. No NaN or inf among
them (one would make every full reduction NaN on both sides, hiding the difference)."""


def column_edges(dtype: torch.dtype, assumes: frozenset[str]) -> tuple[float, ...]:
    """The values of ``probe``'s edge columns for ``dtype``, in pairs: each finite positive
    edge value ``assumes`` admits (``ir.strategies.values.edges``), the largest first, followed
    by its negation; then -0.0 and +0.0 where -0.0 is admitted. O(1)."""
    pool = edges(dtype, assumes=assumes)
    big = sorted({v for v in pool if math.isfinite(v) and v > 0}, reverse=True)
    zeros = (-0.0, 0.0) if any(v == 0 for v in pool) else ()
    return tuple(w for v in big for w in (v, -v)) + zeros


def _column_step(row: int) -> int:
    """How many values of ``column_edges`` one edge-column probe moves on: the row's length
    rounded down to even (a pair stays in two neighbouring columns), 1 for a row of one."""
    return row - row % 2 if row >= 2 else 1


def column_seeds(sig: Signature, assumes: frozenset[str], *,
                 shift: int = 0) -> tuple[int, ...]:
    """The ``probe`` seeds whose edge columns give every value of ``column_edges`` a column
    of its own in each floating tensor of ``sig`` with two rows or more (``()`` where there is
    none), each pair in two neighbouring columns where the last dimension has two or more;
    ``shift`` starts them ``shift`` steps further along (any shift keeps both). O(arguments)."""
    need = 0
    for a in sig.args:
        if is_spec(a) and a[1].is_floating_point and len(a[0]) >= 2 and math.prod(a[0][:-1]) >= 2:
            step = _column_step(a[0][-1])
            need = max(need, -(-len(column_edges(a[1], assumes)) // step))
    return tuple(COLUMNS - k - shift for k in range(need))


def probe(sig: Signature, assumes: frozenset[str], seed: int) -> tuple:
    """Deterministic arguments of signature ``sig`` (contiguous): with ``seed`` 0 ordinary
    values in turn (``ORDINARY``); with a ``seed`` of ``row_seeds`` each row (the last
    dimension) one edge value everywhere, the largest finite first (a row sum overflows where a mean does
    not); with one of ``column_seeds`` each column one edge value down the rows; otherwise the edge values ``assumes`` admits in turn among normal values seeded by
    ``seed``. Used where the pattern is only tried (does it run, do the two functions
    disagree)."""
    gen = torch.Generator().manual_seed(seed)
    args = []
    for a in sig.args:
        if not is_spec(a):
            args.append(a)
            continue
        shape, dtype = a
        n = 1
        for s in shape:
            n *= s
        if dtype == torch.bool:
            flat = torch.arange(n) % 3 == 1
        elif not dtype.is_floating_point:
            flat = torch.tensor([(1, -2, 3, 0, 2, -1)[k % 6] for k in range(n)], dtype=dtype)
        elif seed == 0:
            flat = torch.tensor([ORDINARY[(k + 1) % len(ORDINARY)] for k in range(n)],
                                dtype=torch.float64)
        elif seed <= ROWS:
            pool = edges(dtype, assumes=assumes)
            top = torch.finfo(dtype).max
            start = pool.index(top) if top in pool else 0
            pool = pool[start:] + pool[:start]
            row = shape[-1] if shape and shape[-1] else 1
            if seed <= COLUMNS:  # edge columns: the value follows the last index
                pool = column_edges(dtype, assumes) or pool
                skip = (COLUMNS - seed) * _column_step(row)  # even: pairs stay together
                at = [(k % row + skip) % len(pool) for k in range(n)]
            else:
                skip = (ROWS - seed) * max(1, n // row)
                at = [(k // row + skip) % len(pool) for k in range(n)]
            flat = torch.tensor([pool[j] for j in at], dtype=torch.float64)
        else:
            flat = torch.randn(n, generator=gen, dtype=torch.float64)
            pool = edges(dtype, assumes=assumes)
            for k in range(0, n, 3):
                flat[k] = pool[(k // 3 + seed) % len(pool)]
        args.append(flat.reshape(shape).to(dtype))
    return tuple(args)


def drawn(sig: Signature, assumes: frozenset[str], conversions: Any,
          rng: random.Random) -> tuple:
    """Arguments of ``sig`` drawn from ``rng`` (``ir.strategies.seeded_values.seeded_tensor``:
    the kinds of values and layouts ``ir.strategies.values.tensors`` draws, with the edges of
    the pattern's ``conversions`` among them); scalars as ``sig`` gives them. Depends on
    ``rng``'s state only, never on hypothesis. O(elements)."""
    return tuple(
        seeded_tensor(rng, a[0], a[1], assumes=assumes,
                      extra=conversions_edges(a[1], conversions))
        if is_spec(a) else a
        for a in sig.args
    )


class _State:
    """One ``check_rule`` call's work: its signatures, their rewritten programs (traced once
    each, on first use), counts of the draws that ran and that were rewritten, and the
    counterexamples seen (for the shrink budget)."""

    def __init__(self, rule: Rule, sigs: tuple[Signature, ...], scores: dict,
                 draws: Draws = Draws()) -> None:
        self.rule = rule
        self.draws = draws
        self.checked = sharing_traces(rule, where=_GuardedWhere(rule.where)) if rule.where else rule
        self.sigs = sigs
        self.assumes = assumed(rule)
        self.draw_assumes = self.assumes
        self.telling, self.wrong = _telling(sigs, scores)
        self.sites: dict[int, Any] = {}
        self.ran = 0
        self.rewritten = 0
        self.restrided: set[int] = set()
        self.budget = ShrinkBudget(SHRINK_SECONDS, LawViolation)

    def site(self, i: int) -> _Site | None:
        if i not in self.sites:
            try:
                self.sites[i] = _rewritten_site(self.checked, self.sigs[i], self.rule)
            except LawViolation as exc:
                self.sites[i] = exc
        found = self.sites[i]
        if isinstance(found, LawViolation):
            raise found
        return found

    def built(self, i: int) -> _Site:
        """The rewritten site at signature ``i`` as far as it is known: its ``conversions``,
        ``wraps`` and ``divides``; none of them (``_UNBUILT``) before it was built or where
        rewrite declines it."""
        site = self.sites.get(i)
        return site if isinstance(site, _Site) else _UNBUILT

    def check(self, i: int, args: tuple) -> None:
        self.budget.run(i, lambda: self._check(i, args))

    def _divides(self, i: int, args: tuple) -> bool:
        """Whether signature ``i``'s programs divide integers (``_Site.divides``), asked
        before any value with an integer tensor runs: the site is built first if need be
        (where the pattern raised on every draw so far, no site was built, and a later draw of
        ``INT_MIN`` and -1 would stop the process). ``False`` where rewrite declines or fails
        there (a failure is reported by the draw that meets it)."""
        if not any(isinstance(a, torch.Tensor) and _integral(a.dtype) for a in args):
            return False
        try:
            site = self.site(i)
        except LawViolation:
            return False
        return bool(site is not None and site.divides)

    def _check(self, i: int, args: tuple) -> None:
        rule, sig = self.rule, self.sigs[i]
        if self._divides(i, args):  # INT_MIN // -1 stops the process (SIGFPE): no -1 there
            args = no_minus_one(args)
        want = run_side(rule.pattern, args)  # the law runner: copies, seed 0, observed
        if not want.ok:
            return  # the law speaks only of inputs the pattern runs on
        self.ran += 1
        q = self.site(i)
        if q is None:
            return
        self.rewritten += 1
        where = sig.tensors()
        graph = q.program.root_module.graph
        got = run_side(lambda *xs: run_graph(graph, [xs[j] for j in where]), args)
        if not got.ok:
            kind, text = got.error
            raise LawViolation(
                "rule", rule, f"the rewritten program raised {kind}: {text} on inputs "
                f"{describe(args)} where the pattern ran", None,
            )
        wanted = want.observed
        if q.copies:  # the pattern's program returns copies: every result fresh
            wanted = attrs.evolve(wanted, aliasing=tuple(frozenset() for _ in wanted.aliasing))
        # regrouped (``reassociate``): judged against the pattern run in float64, the
        # replacement may err as much as the pattern itself does, twice over
        problem = judge(RULE, got.observed, wanted, assumes=self.assumes, reference=lambda: (
            wide_reference(lambda wide: run_side(rule.pattern, widen(args, absolute=wide)))))
        if problem:
            raise LawViolation("rule", rule, f"{problem} on inputs {describe(args)}", None)
        if not q.copies and not all(same_layout(g, w) for g, w in
                                    zip(got.observed.outputs, wanted.outputs)):
            self.restrided.add(i)  # right in value, other strides (``Checked.restrided``)


def describe(args: Sequence) -> str:
    """Arguments in words: a tensor's shape, dtype, layout and values (``_values_in_words``)."""
    parts = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            parts.append(repr(a))
            continue
        text = f"tensor{tuple(a.shape)} {str(a.dtype).replace('torch.', '')}"
        layout = _layout_name(a)
        if layout != "contiguous":
            text += f" {layout} (strides {tuple(a.stride())})"
        text += _values_in_words(a)
        parts.append(text)
    return "(" + ", ".join(parts) + ")"


def _values_in_words(t: torch.Tensor) -> str:
    """A tensor's values, shortly: all of them up to 12 elements; else ``all v`` for one value
    everywhere, or the flat positions not zero (``-0.0`` counts) when at most 12, as a
    counterexample shrunk toward zeros mostly is; else all of them up to ``WHOLE`` (64)
    elements (the most drawn one by one); else nothing."""
    flat = t.detach().reshape(-1).tolist()
    if len(flat) <= 12:
        return f" {flat}"
    if all(repr(v) == repr(flat[0]) for v in flat):
        return f" all {flat[0]}"
    others = {k: v for k, v in enumerate(flat) if repr(v) not in ("0", "0.0", "False")}
    if len(others) <= 12:
        return " zeros but {" + ", ".join(f"{k}: {v}" for k, v in others.items()) + "}"
    if len(flat) <= WHOLE:
        return f" {flat}"
    return ""


def _layout_name(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    if any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride())):
        return "expanded"
    if t.dim() >= 2 and t.transpose(-1, -2).is_contiguous():
        return "transposed"
    return "strided"


def _telling(sigs: Sequence[Signature], scores: dict) -> tuple[int, int]:
    """The last index of ``sigs`` that leads with an eager disagreement (``signatures`` puts
    them first), and the last that leads with other values (``_disagree`` 2)."""
    telling = wrong = 0
    for k, sig in enumerate(sigs[1:], 1):
        score = scores.get(sig.key(), 0)
        if not score:
            break
        telling = k
        wrong = k if score == 2 else wrong
    return telling, wrong


def _rewritten_site(rule: Rule, sig: Signature, named: Rule | None = None) -> _Site | None:
    """The pattern's program at ``sig`` rewritten by ``apply_rules``; ``None`` where the pattern
    cannot be exported at ``sig`` or rewrite declines the match. ``named``: the rule to name in
    errors (``rule`` itself by default)."""
    named = named or rule
    # the results returned as they are (aliasing observable), else (rewrite may decline a
    # match that would return an alias of an input) each read by a copy: values still checked
    for copies in (False, True):
        p = pattern_program(rule, sig, copies=copies)
        if p is None:
            return None
        try:
            q, report = apply_rules(p, [rule])
        except _WhereRaised:
            raise
        except PurefxError as exc:
            raise LawViolation(
                "rule", named, f"rewriting the pattern's own program at {sig.describe()} "
                f"failed: {first_line(exc)}", None,
            ) from exc
        except Exception as exc:  # rewrite must never raise a raw error
            raise LawViolation(
                "rule", named, f"rewriting the pattern's own program at {sig.describe()} "
                f"raised {type(exc).__name__}: {first_line(exc)}", None,
            ) from exc
        if any(report.counts.values()):
            return _Site(q, copies, tuple(dict.fromkeys(conversions(p) + conversions(q))),
                         wraps(p) or wraps(q), divides(p) or divides(q))
        if report.skipped and not set(report.skipped) - BLIND_TO_READERS:
            return None  # declined for a reason that reading the results by copies keeps
    return None


BLIND_TO_READERS = frozenset({
    "per_match", "retrace", "absorbed", "pure", "input_written", "write_between", "where",
    "replacement_untraceable", "replacement", "alias_unbound", "runs", "dtype",
})
"""The rows of ``guards.GUARDS`` whose verdict on a match does not depend on who reads the
match's results: a match they decline in the pattern's program is declined again where each
result is read by a copy, so ``_rewritten_site`` does not export the pattern a second time
(an ``alias``, ``shared``, ``layout``, ``placement``, ``interior`` or ``barrier`` decline is
tried again with copies)."""


@attrs.frozen
class _Site:
    """The pattern's program at one signature, rewritten; ``copies``: its results are read by
    copies before they are returned."""

    program: Program
    copies: bool
    conversions: tuple = ()  # (src, dst) dtype pairs either side converts: ``conversions``
    wraps: bool = False  # either side computes integer arithmetic that wraps: ``wraps``
    divides: bool = False  # either side divides integers: ``divides``


_UNBUILT = _Site(None, False)  # a site not built (yet): no conversions, wraps nor divides


WRAPPING = frozenset({"neg", "negative", "sub", "subtract", "rsub", "abs", "absolute", "add",
                      "mul", "multiply"})
"""The operators whose integer results wrap at the dtype's edges (``-INT_MIN == INT_MIN``,
``abs(INT_MIN) < 0``, ``MAX + 1 == MIN``): where a program computes one on an integer tensor,
``check_rule`` probes each integer argument at its dtype's edges (``int_edge_probe``)."""


DIVIDING = frozenset({"div", "divide", "floor_divide", "remainder", "fmod", "floordiv"})
"""The operators that divide integers: ``INT_MIN`` divided by -1 stops the process (the
processor's division overflows: SIGFPE), so where a program holds one with an integer result
``int_edge_probe`` leaves -1 out."""


def wraps(p: Program) -> bool:
    """Whether ``p``'s root graph computes an operator of ``WRAPPING`` whose result is an
    integer tensor (bool excluded). O(nodes)."""
    return _integer_op(p, WRAPPING)


def divides(p: Program) -> bool:
    """Whether ``p``'s root graph computes an operator of ``DIVIDING`` whose result is an
    integer tensor. O(nodes)."""
    return _integer_op(p, DIVIDING)


def _integer_op(p: Program, ops: frozenset[str]) -> bool:
    for node in p.root_module.graph.nodes:
        out = node.meta.get("val")
        if (node.op == CALL_FUNCTION and isinstance(out, torch.Tensor)
                and _integral(out.dtype) and _packet(node) in ops):
            return True
    return False


def _packet(node: Any) -> str:
    name = getattr(node.target, "__name__", "").split(".")[0]
    return getattr(getattr(node.target, "overloadpacket", None), "__name__", name)


def _integral(dtype: torch.dtype) -> bool:
    """An integer dtype, bool excluded."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def no_minus_one(args: Sequence) -> tuple:
    """``args`` with each -1 of an integer tensor (bool excluded) made 1: what every value
    run through a program that ``divides`` integers goes through, since ``INT_MIN`` divided by
    -1 (``div`` with any rounding mode, ``floor_divide``, ``//``, ``remainder``, ``fmod``)
    stops the process with SIGFPE instead of raising, whichever of pattern and replacement
    divides and wherever the values come from (probes, hypothesis, the seeded generator).
    O(elements)."""
    out = []
    for a in args:
        if (isinstance(a, torch.Tensor) and _integral(a.dtype) and a.dtype.is_signed
                and bool((a == -1).any())):
            a = torch.where(a == -1, torch.ones_like(a), a)  # contiguous: only where -1 was
        out.append(a)
    return tuple(out)


def int_pool(dtype: torch.dtype, *, divides: bool = False) -> tuple[int, ...]:
    """The values ``int_edge_probe`` puts into an integer tensor of ``dtype``: its edges
    (``ir.strategies.values.int_edges``: smallest, largest, ± where a square overflows) and
    0, 1, -1 where it holds them (an edge meets an ordinary value); -1 left out where the
    program ``divides``. O(1)."""
    info = torch.iinfo(dtype)
    ordinary = (0, 1) if divides else (0, 1, -1)
    return tuple(dict.fromkeys(v for v in (*int_edges(dtype), *ordinary)
                               if info.min <= v <= info.max))


def _int_tensors(sig: Signature) -> list[int]:
    return [j for j, a in enumerate(sig.args) if is_spec(a) and _integral(a[1])]


def int_edge_starts(sig: Signature, *, divides: bool = False) -> tuple[tuple[int, int], ...]:
    """The ``int_edge_probe`` starts ``(s, t)`` that put every value of ``int_pool`` at each
    integer tensor of ``sig`` and, for two of them, every pair of values at one position:
    ``s`` over the pool's length where ``sig`` has two integer tensors or more, ``t`` in steps
    of the smallest one's size. ``()`` without integer tensors. O(pool length²)."""
    ints = _int_tensors(sig)
    if not ints:
        return ()
    n = max(len(int_pool(sig.args[j][1], divides=divides)) for j in ints)
    step = max(1, min(math.prod(sig.args[j][0]) for j in ints))
    shifts = range(n) if len(ints) > 1 else range(1)
    return tuple((s, t) for s in shifts for t in range(0, n, step))


def int_edge_probe(sig: Signature, start: tuple[int, int], *, divides: bool = False) -> tuple:
    """Deterministic arguments of ``sig`` (contiguous): the ``m``-th integer tensor holds
    ``int_pool`` values in turn, element ``k`` the one at ``(k + t + s·m) mod length`` for
    ``start == (s, t)``; other arguments as ``probe`` seed 0 gives them. O(elements)."""
    s, t = start
    args = list(probe(sig, frozenset(), 0))
    for m, j in enumerate(_int_tensors(sig)):
        shape, dtype = sig.args[j]
        pool = int_pool(dtype, divides=divides)
        flat = [pool[(k + t + s * m) % len(pool)] for k in range(math.prod(shape))]
        args[j] = torch.tensor(flat, dtype=dtype).reshape(shape)
    return tuple(args)


def conversions(p: Program) -> tuple[tuple[torch.dtype, torch.dtype], ...]:
    """The dtype conversions ``p``'s root graph performs, as ``(src, dst)`` pairs in graph
    order, each once: a node that converts (``.to``, ``_to_copy``, ``type_as``,
    ``convert_element_type``, or an op given a ``dtype``) whose result's dtype differs from a
    tensor argument's. Bool and complex dtypes are left out (no range to reach the edges of).
    What ``check_rule`` draws edge values for (``ir.strategies.values.conversions_edges``).
    O(nodes)."""
    found: dict[tuple, None] = {}
    graph = p.root_module.graph
    by_name = graph.by_name()
    for node in graph.nodes:
        out = node.meta.get("val")
        if node.op != CALL_FUNCTION or not isinstance(out, torch.Tensor) or not _converts(node):
            continue
        for r in iter_refs((node.args, node.kwargs)):
            val = by_name[r.name].meta.get("val") if r.name in by_name else None
            if (isinstance(val, torch.Tensor) and val.dtype != out.dtype
                    and torch.bool not in (val.dtype, out.dtype)
                    and not (val.dtype.is_complex or out.dtype.is_complex)):
                found[(val.dtype, out.dtype)] = None
    return tuple(found)


_CONVERTING = frozenset({"to", "_to_copy", "type_as", "convert_element_type", "_to_dtype"})


def _converts(node: Any) -> bool:
    name = getattr(node.target, "__name__", "").split(".")[0]
    if _packet(node) in _CONVERTING or name in _CONVERTING:
        return True
    return node.kwargs.get("dtype") is not None or any(
        isinstance(a, torch.dtype) for a in node.args)


def conversion_probe(sig: Signature, found: Sequence[tuple], start: int) -> tuple:
    """Deterministic arguments of ``sig`` (contiguous) whose tensors hold the edge values of
    the conversions ``found`` (``conversions_edges`` of each tensor's dtype) in turn, from the
    ``start``-th on; other tensors as ``probe`` seed 0 gives them. O(elements)."""
    args = list(probe(sig, frozenset(), 0))
    for j, a in enumerate(sig.args):
        if not is_spec(a):
            continue
        pool = conversions_edges(a[1], found)
        if not pool:
            continue
        n = math.prod(a[0])
        wide = torch.float64 if a[1].is_floating_point else torch.int64
        flat = torch.tensor([pool[(k + start) % len(pool)] for k in range(n)], dtype=wide)
        args[j] = flat.reshape(a[0]).to(a[1])
    return tuple(args)


def conversion_starts(sig: Signature, found: Sequence[tuple]) -> tuple[int, ...]:
    """The ``conversion_probe`` starts that put every edge value into each tensor of ``sig``
    at least once (``()`` without conversions): steps of the smallest tensor's size up to the
    longest pool. O(arguments)."""
    sized = [(max(1, math.prod(a[0])), len(conversions_edges(a[1], found)))
             for a in sig.args if is_spec(a)]
    sized = [(n, k) for n, k in sized if k]
    if not sized:
        return ()
    step = min(n for n, _ in sized)
    return tuple(range(0, max(k for _, k in sized), step))


def pattern_program(rule: Rule, sig: Signature, *, copies: bool = False) -> Program | None:
    """The rule's pattern exported at ``sig`` (scalar arguments as the literals ``sig`` gives)
    and imported: a flat Program whose user inputs are the tensor arguments in order (its
    tensor results returned as fresh copies when ``copies``); ``None`` when ``torch.export``
    cannot trace it there. Kept in a bounded memo keyed by the pattern function's identity,
    ``sig`` and ``copies`` (with the grad mode and default dtype export reads): each check of
    one rule (its variants, a refusal's rechecks under more assumptions) exports a signature
    once."""
    key = (sig.key(), copies, torch.is_grad_enabled(), torch.get_default_dtype())
    hit = _PATTERN_PROGRAMS.get(rule.pattern, key)
    if hit is not NOT_COMPUTED:
        return hit
    return _PATTERN_PROGRAMS.put(rule.pattern, key, _exported_pattern(rule, sig, copies))


_PATTERN_PROGRAMS: BoundedMemo[Program | None] = BoundedMemo(256)
"""``pattern_program``'s memo: per pattern function (held here, so that no other takes its id),
key -> the program, or ``None`` where it cannot be exported (kept too). Emptied when full
(``ir.memo.BoundedMemo``, at most 256 entries). A hit and a miss answer alike (an export is
deterministic and a Program immutable)."""


def _exported_pattern(rule: Rule, sig: Signature, copies: bool) -> Program | None:
    positions = sig.tensors()
    fixed = list(sig.args)
    pattern = rule.pattern

    class Pattern(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> Any:
            args = list(fixed)
            for i, x in zip(positions, xs):
                args[i] = x
            out = pattern(*args)
            if copies:  # a fresh copy of any dtype and rank (stack, then select)
                many = isinstance(out, tuple)
                out = tuple(torch.stack([o])[0] if isinstance(o, torch.Tensor) else o
                            for o in (out if many else (out,)))
                out = out if many else out[0]
            return out

    example = probe(sig, frozenset(), 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(Pattern(), tuple(example[i] for i in positions))
        return import_ep(ep)
    except Exception:  # noqa: BLE001 - export's errors share no base class: not a program here
        return None


# --- signatures ------------------------------------------------------------------------------


def signatures(rule: Rule, limit: int = SIGNATURES, *,
               seed: int | None = None) -> tuple[Signature, ...]:
    """Up to ``limit`` signatures where ``rule.pattern`` runs, the example's first (see
    ``_signatures``); ``seed`` as ``check_rule`` takes it. Deterministic."""
    return _signatures(rule, limit, draws=Draws.of(seed))[0]


def _signatures(rule: Rule, limit: int = SIGNATURES, *,
                draws: Draws = Draws()) -> tuple[tuple[Signature, ...], dict]:
    """Up to ``limit`` signatures where ``rule.pattern`` runs (tried eagerly on ``probe``
    values), the example's first, then those where the replacement run eagerly disagrees with
    the pattern (a hint of where to look; the verdict is the rewritten program's), then one of
    each kind (see ``check_rule``), then combinations. Deterministic.

    Complexity: about ``(2 + tensor arguments) · len(ALL_DTYPES)`` plus the size variants plus
    ``len(DTYPES)`` per scalar value eager runs of the pattern, ``PAIRS`` at most more. Also returns the eager disagreement
    (``_disagree``) found per signature key."""
    base = example_signature(rule)
    assumes = assumed(rule)
    rng = draws.rng()
    tensors_at = base.tensors()
    seen = {base.key()}
    dtype_ok: list[Signature] = []
    shape_ok: list[Signature] = []
    scalar_ok: list[Signature] = []

    def add(sig: Signature, into: list) -> bool:
        if sig.key() in seen:
            return False
        seen.add(sig.key())
        if _runs(rule, sig):
            into.append(sig)
            return True
        return False

    for d in _INTERLEAVED:  # floats and ints in turn: both kinds among the first few
        add(_with(base, {i: (base.args[i][0], d) for i in tensors_at}), dtype_ok)
    for i in tensors_at:
        for d in _INTERLEAVED:
            add(_with(base, {i: (base.args[i][0], d)}), dtype_ok)
    shapes = [base.args[i][0] for i in tensors_at]
    for variant in size_variants(shapes):
        add(_with(base, {i: (sh, base.args[i][1]) for i, sh in zip(tensors_at, variant)}),
            shape_ok)
    lead = _with(base, {i: ((2, *base.args[i][0]), base.args[i][1]) for i in tensors_at
                        if base.args[i][0]})
    add(lead, shape_ok)
    # each free scalar on its own over its pool, crossed with every float dtype the tensors
    # run in
    floats = [base] + [s for s in dtype_ok
                       if len({s.args[i][1] for i in tensors_at}) <= 1
                       and all(s.args[i][1].is_floating_point for i in tensors_at)]
    drawn = _drawn_scalars(rule)
    pools = {}
    for pos in drawn:
        kind = "float" if isinstance(base.args[pos], float) else "int"
        pool = (rule.hypers[pos].values if pos in rule.hypers
                else scalar_values(kind, assumes=assumes, example=base.args[pos]))
        pools[pos] = pool
        for value in pool:
            for d in floats:
                add(_with(d, {pos: value}), scalar_ok)
    # two scalars at once, at the example's dtypes: one overflows or cancels against the
    # other (x / a / b overflows at x / a where x / (a * b) does not: a = 0.5, b = 2.0)
    duos = [(p, u, q, v) for k, p in enumerate(drawn) for q in drawn[k + 1:]
            for u in pools[p] for v in pools[q]]
    if len(duos) > SCALAR_PAIRS:
        duos = rng.sample(duos, SCALAR_PAIRS)
    for p, u, q, v in duos:
        add(_with(base, {p: u, q: v}), scalar_ok)
    # two size changes at once (k and v with fewer heads while the mask broadcasts), where
    # the pattern runs: a bounded, seeded sample of the pairs
    pairs = [(a, b) for a in shape_ok for b in shape_ok if a is not b]
    rng.shuffle(pairs)
    both: list[Signature] = []
    for a, b in pairs[:PAIRS]:
        add(_with(a, {i: b.args[i] for i in tensors_at if b.args[i] != base.args[i]}), both)
    kinds = [dtype_ok, shape_ok, scalar_ok, both]
    # the telling ones first: wrong values before a replacement that raises, one of each kind
    # in turn
    scores = {s.key(): _disagree(rule, s, assumes, draws) for kind in kinds[:3] for s in kind}
    scored = [[(score, k, s) for k, s in enumerate(kind)
               if (score := scores.get(s.key(), 0))] for kind in kinds]
    ranked = [sorted(kind, key=lambda t: (-t[0], t[1])) for kind in scored]
    telling: list[Signature] = []
    for score in (2, 1):
        while any(r and r[0][0] == score for r in ranked) and len(telling) < limit // 3:
            for kind in ranked:
                if kind and kind[0][0] == score and len(telling) < limit // 3:
                    telling.append(kind.pop(0)[2])
    found = [base] + telling
    # then each dtype for all arguments (floats and ints in turn), then one of each kind in
    # turn, then combinations of a dtype, a size and the scalars
    for sig in dtype_ok:
        if sig not in found and len({sig.args[i][1] for i in tensors_at}) == 1 and len(
            found
        ) < limit // 2 + 2:
            found.append(sig)
    queues = [[s for s in k if s not in found] for k in kinds]
    for q in queues[1:]:  # the dtypes in order (all arguments first), the rest shuffled
        rng.shuffle(q)
    while len(found) < limit - limit // 4 and any(queues):
        for q in queues:
            if q and len(found) < limit - limit // 4:
                sig = q.pop(0)
                if sig not in found:
                    found.append(sig)
    for _ in range(8 * limit):
        if len(found) >= limit or not (dtype_ok or shape_ok):
            break
        d = rng.choice(dtype_ok) if dtype_ok else base
        s = rng.choice(shape_ok) if shape_ok else base
        combo = _with(s, {i: (s.args[i][0], d.args[i][1]) for i in tensors_at})
        if scalar_ok:
            sc = rng.choice(scalar_ok)
            combo = _with(combo, {i: sc.args[i] for i in range(len(base.args))
                                  if i not in tensors_at})
        add(combo, found)
    return tuple(found[:limit]), scores


def example_signature(rule: Rule) -> Signature:
    """The signature of ``rule.example_inputs``."""
    return _signature_of(rule.example_inputs)


def _signature_of(args: Sequence) -> Signature:
    return Signature(tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x
                           for x in args))


def _drawn_scalars(rule: Rule) -> list[int]:
    c = rule.compiled(TRAINING)
    used = {pos for pos, _ in c.replacement.sentinels}
    return sorted(set(c.pattern.sentinels.values()) | used | set(c.pattern.holes))


def _with(sig: Signature, changes: dict) -> Signature:
    args = list(sig.args)
    for i, a in changes.items():
        args[i] = a
    return Signature(tuple(args))


def _disagree(rule: Rule, sig: Signature, assumes: frozenset[str],
              draws: Draws = Draws()) -> int:
    """How the replacement, run eagerly at ``sig`` on ``probe`` values (ordinary ones, edge
    values among them, then the edge rows of the default stream: every edge value, whatever
    the seed), disagrees with the pattern: 2, other results; 1, it raises; 0, not at all (a
    hint for which signatures to trace first)."""
    raised = 0
    for seed in (*draws.probes(sig, assumes)[:2], *row_seeds(sig, assumes)):
        args = probe(sig, assumes, seed)
        want = outcome(rule.pattern, *args)
        if not want.ok:
            continue
        got = outcome(rule.replacement, *args)
        if not got.ok:
            raised = 1
            continue
        w = want.results if isinstance(want.results, tuple) else (want.results,)
        g = got.results if isinstance(got.results, tuple) else (got.results,)
        if value_difference(g, w, assumes=assumes) is not None:
            return 2
    return raised


def _runs(rule: Rule, sig: Signature) -> bool:
    return outcome(rule.pattern, *probe(sig, frozenset(), 0)).ok


# --- comparing results ----------------------------------------------------------------------


def wide_reference(run: Callable[[bool], Ran]) -> Observed | None:
    """What ``ir.harness.judge`` takes as the reference under ``reassociate``: ``run(False)``
    (a side run with floating values made float64), each tensor paired with ``run(True)`` (the
    same on their absolute values; ``ir.harness.regrouped``: for a sum of products, the sum of
    its terms' magnitudes, which bounds any regrouping's rounding); ``None`` where the first
    does not run (no reference: the verdict without one stands). ``check_rule``'s and the
    in-context law's. Two runs."""
    exact = run(False)
    if not exact.ok:
        return None
    terms = run(True)  # sum(|terms|), for the bound
    return regrouped(exact.observed, terms.observed if terms.ok else None)


RULE = Law("rule", frozenset({"outputs", "aliasing"}), wanted="the pattern gives",
           side="the pattern's result is", fresh_may_alias=True)
"""The law of ``check_rule`` as a value (``ir.harness.Law``): the results and their aliasing
(of the arguments and of earlier results) compared; the wanted side is the pattern."""


# --- the pattern against its own trace --------------------------------------------------------


def _check_matches_itself(rule: Rule, compiled: Any) -> None:
    pattern = compiled.pattern
    graph = compiled.traced.graph
    table = {n.name: n for n in graph.nodes}
    by_target: dict[int, list] = {}
    for n in graph.nodes:
        if n.op == CALL_FUNCTION:
            by_target.setdefault(id(n.target), []).append(n)
    found = set()
    for n in by_target.get(id(pattern.anchor.target), ()):
        for b in match_at(pattern, n, table.get, lambda t: by_target.get(id(t), [])):
            found.add(frozenset(b.names[k] for k in pattern.nodes if k in b.names))
    if len(found) != 1:
        raise LawViolation(
            "rule", rule,
            f"the pattern matches its own traced graph {len(found)} times, not once (its "
            "operators' arguments may not survive the matching normal form)", None,
        )


def run_replacement(rule: Rule, args: tuple) -> tuple:
    """Run the replacement as ``rewrite`` instantiates it for arguments ``args``: the pattern
    traced at their signature, rewritten by ``engine.apply_rules``, run. Raises
    ``LawViolation`` when rewrite declines the match there."""
    sig = _signature_of(args)
    site = _rewritten_site(rule, sig)
    if site is None:
        raise LawViolation("rule", rule, f"rewrite declines the match at {sig.describe()}", None)
    return run_graph(site.program.root_module.graph, [args[i] for i in sig.tensors()])


__all__ = [
    "ALL_DTYPES",
    "ALSO_AT_SHARE",
    "COLUMNS",
    "DIVIDING",
    "DTYPES",
    "FINITE",
    "SHRINK_SECONDS",
    "SIGNATURES",
    "WRAPPING",
    "Checked",
    "Draws",
    "Signature",
    "assumed",
    "check_rule",
    "column_edges",
    "column_seeds",
    "describe",
    "divides",
    "example_signature",
    "int_edge_probe",
    "int_edge_starts",
    "int_pool",
    "is_spec",
    "pattern_program",
    "probe",
    "run_replacement",
    "signatures",
    "wraps",
]
