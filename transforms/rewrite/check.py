"""``check_rule``: a rewrite rule's law, checked on generated inputs before the rule is trusted.

The law: wherever the pattern runs and ``rewrite`` takes the rule, the program ``rewrite`` makes
computes what the pattern does. Concretely, for each drawn *signature* (the tensor arguments'
shapes and dtypes, the scalar arguments' values) the pattern is traced into a program at that
signature, that program is rewritten with ``transforms.rewrite.engine.apply_rules(p, [rule])``
(the one path that instantiates replacements, the one ``rewrite`` runs), and the rewritten graph
is run on drawn values. Its results must agree with the pattern run eagerly in number, shape,
dtype, aliasing (a result that is a view of an argument or of another result stays one; a fresh
result stays fresh) and value within the dtype's tolerance, NaN where the pattern gives NaN.
One exception: on inputs that hold a non-finite value (±inf, NaN), where the pattern's result
is NaN the replacement may give any value (a fused kernel may define what the unfused ops leave
undefined, as ``scaled_dot_product_attention`` does for a row of ``-inf`` scores). On finite
inputs a NaN is a value like any other: ``exp(log(x)) -> x`` is refused, since the pattern
gives NaN for ``x < 0``.

Also: the pattern matches its own traced graph exactly once, and ``rewrite`` takes the rule on
its own pattern at one signature at least (a rule whose ``where`` holds on no draw is refused:
it would pass having checked nothing).
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from ir.errors import PassError, PurefxError
from ir.import_ep import import_ep
from ir.node import CALL_FUNCTION
from ir.program import Program
from transforms.law_violation import LawViolation
from transforms.rewrite.interpret import run_graph
from transforms.rewrite.match import match_at
from transforms.rewrite.rule import Rule
from transforms.rewrite.trace import TRAINING

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
"""The float dtypes drawn for a floating tensor argument."""
ALL_DTYPES = (*DTYPES, torch.int64, torch.int32, torch.bool)
"""Every dtype tried for a tensor argument; drawn where the pattern runs on it."""
SIGNATURES = 16
"""At most this many signatures (each one trace of the pattern) per ``check_rule``."""
PAIRS = 400
"""At most this many pairs of size changes tried (eagerly) when drawing signatures."""

_TOLERANCE = {  # (rtol, atol)
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
_SPECIALS = (0.0, -0.0, math.inf, -math.inf, math.nan)
_FLOATS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -1.5, 1e-3, 1e3)
_INTS = (0, 1, -1, 2, 3)


@attrs.frozen
class Signature:
    """What one trace of a rule's pattern is specialized to: ``args`` gives, per rule argument,
    ``(shape, dtype)`` for a tensor and the value for a scalar."""

    args: tuple

    def tensors(self) -> tuple[int, ...]:
        """The positions of the tensor arguments."""
        return tuple(i for i, a in enumerate(self.args) if isinstance(a, tuple))

    def key(self) -> tuple:
        """A hashable key telling signatures apart (``0.0`` from ``-0.0``, ``1`` from ``1.0``)."""
        return tuple(a if isinstance(a, tuple) else (type(a).__name__, repr(a)) for a in self.args)

    def describe(self) -> str:
        parts = []
        for a in self.args:
            if isinstance(a, tuple):
                parts.append(f"tensor{a[0]} {str(a[1]).replace('torch.', '')}")
            else:
                parts.append(repr(a))
        return "(" + ", ".join(parts) + ")"


Apply = Callable[[Program, list], tuple]
"""``apply_rules(p, rules) -> (program, report)``: ``transforms.rewrite.engine.apply_rules``."""


def check_rule(
    rule: Rule, *, max_examples: int | None = None, apply: Apply | None = None
) -> None:
    """Raise ``LawViolation`` (law ``"rule"``) with a counterexample when ``rule`` is wrong.

    ``apply`` is the rewrite that instantiates replacements, ``engine.apply_rules``: the engine
    passes it (this module sits below the engine, which runs this check), and
    ``transforms.rewrite.check_rule`` binds it for users.

    What is drawn: up to ``SIGNATURES`` signatures where the pattern runs (``signatures``): the
    example's, then each dtype of ``ALL_DTYPES`` (ints and bools included) for all tensor
    arguments and for one at a time, sizes changed consistently (each distinct size mapped to
    another, 1 included: broadcasting), one leading dimension more, and sizes changed in one
    argument only or in all arguments but one (``k``/``v`` with fewer heads than ``q``), dtype
    and size changes combined, scalar arguments drawn from 0, -0., 1, -1, 2, 0.5, ... Per
    example hypothesis draws a signature and the values: normal for floats (special values 0,
    -0., ±inf, NaN put in when ``rule.specials``), small ints, random bools. Each example
    shrinks toward the example signature without special values.

    What is checked (the module docstring states the law): on each signature the pattern's
    program is rewritten by ``apply_rules`` (so ``where`` sees a real match: nodes and
    ``val``s of the drawn shapes and dtypes) and run. Draws where the pattern raises, or where
    rewrite declines the match (``where`` false, a guard), check nothing; when that is every
    draw, the rule is refused.

    Raises:
        LawViolation: a counterexample (the signature and what differs), the pattern not
            matching its own trace exactly once, or no draw rewritten.
        PassError: naming the rule, when it cannot be traced, is malformed, or its ``where``
            raises. Nothing else escapes: an error while rewriting or running is reported as a
            ``LawViolation`` naming the draw.

    Cost: at most ``SIGNATURES`` exports of the pattern and rewrites, plus ``max_examples``
    (default ``rule.max_examples``) eager runs of the pattern and of the rewritten graph.
    """
    if apply is None:
        raise PassError(
            "check.check_rule needs apply=transforms.rewrite.engine.apply_rules (the rewrite it "
            "checks); call transforms.rewrite.check_rule, which passes it"
        )
    compiled = rule.compiled(TRAINING)
    _check_matches_itself(rule, compiled)
    sigs = signatures(rule)
    n = max_examples if max_examples is not None else rule.max_examples
    state = _State(rule, sigs, apply)
    try:
        _search(state, n)
    except (LawViolation, PassError):
        raise
    except PurefxError as exc:
        raise PassError(f"rule {rule.name!r}: {exc}") from exc
    except Exception as exc:  # the contract: no raw error escapes
        raise LawViolation(
            "rule", rule, f"checking the rule raised {type(exc).__name__}: {exc}", None
        ) from exc
    if state.rewritten == 0:
        why = _why_never(rule, sigs[0], apply)
        raise LawViolation(
            "rule", rule,
            f"rewrite took the rule on its own pattern on none of the {state.ran} draws where "
            f"the pattern ran ({why}), so nothing was checked; a rule must apply somewhere "
            "(widen its where(), or give example_inputs where it holds)", None,
        )


def _why_never(rule: Rule, sig: Signature, apply: Apply) -> str:
    """Why no draw was rewritten, judged at ``sig``: by the rule's ``where`` (when the same
    rule without it rewrites the pattern's program) or by the matching and rewrite's guards."""
    if rule.where is not None:
        bare = Rule(rule.pattern, rule.replacement, rule.example_inputs, name=rule.name,
                    trusted=True)
        if _rewritten_site(bare, sig, apply) is not None:
            return "its where() held on none of them"
    return ("the pattern does not match its own exported program, or one of rewrite's guards "
            "(aliasing, dtypes, preserved calls) declines every match")


def _search(state: _State, n: int) -> None:
    from hypothesis import HealthCheck, currently_in_test_context, example, given, settings
    from hypothesis import strategies as st

    rule = state.rule
    if currently_in_test_context():
        # inside a hypothesis test (a property suite that calls rewrite): hypothesis cannot
        # nest @given, so the same draws come from a seeded generator, without shrinking
        rng = random.Random(0)
        state.check(_Draw(0, 0, False))
        for _ in range(n):
            state.check(_Draw(rng.randrange(len(state.sigs)), rng.randrange(2**16),
                              rule.specials and rng.random() < 0.5))
        return

    draws = st.builds(
        _Draw, st.integers(0, len(state.sigs) - 1), st.integers(0, 2**16 - 1),
        st.booleans() if rule.specials else st.just(False),
    )

    @settings(
        max_examples=n, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
    )
    @given(draws)
    @example(_Draw(0, 0, False))
    def law(draw: _Draw) -> None:
        state.check(draw)

    law()


@attrs.frozen
class _Draw:
    sig: int
    seed: int
    specials: bool


class _State:
    """One ``check_rule`` call's work: its signatures, their rewritten programs (traced once
    each, on first use) and counts of the draws that ran and that were rewritten."""

    def __init__(self, rule: Rule, sigs: tuple[Signature, ...], apply: Apply) -> None:
        self.rule = rule
        self.sigs = sigs
        self.apply = apply
        self.sites: dict[int, Any] = {}
        self.ran = 0
        self.rewritten = 0

    def site(self, i: int) -> _Site | None:
        if i not in self.sites:
            try:
                self.sites[i] = _rewritten_site(self.rule, self.sigs[i], self.apply)
            except LawViolation as exc:
                self.sites[i] = exc
        found = self.sites[i]
        if isinstance(found, LawViolation):
            raise found
        return found

    def check(self, draw: _Draw) -> None:
        rule, sig = self.rule, self.sigs[draw.sig]
        args = draw_values(rule, sig, draw.seed, draw.specials)
        pattern_args = _fresh(args)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = rule.pattern(*pattern_args)
        except Exception:  # noqa: BLE001 - the law speaks only of inputs the pattern runs on
            return
        want = want if isinstance(want, tuple) else (want,)
        if _all_nan(want):
            return  # the pattern computes no value here: any replacement (or none) will do
        self.ran += 1
        q = self.site(draw.sig)
        if q is None:
            return
        self.rewritten += 1
        if q.copies:
            want = tuple(w.clone() if isinstance(w, torch.Tensor) else w for w in want)
        given_args = _fresh(args)
        try:
            got = run_graph(q.program.root_module.graph,
                            [given_args[i] for i in sig.tensors()])
        except Exception as exc:  # any error of the rewritten program
            raise LawViolation(
                "rule", rule, f"the rewritten program raised {type(exc).__name__}: "
                f"{_first_line(exc)} on inputs {sig.describe()} where the pattern ran", None,
            ) from exc
        problem = differences(got, want, given_args, pattern_args, precision=q.precision)
        if "values differ" in problem:
            # rounding: judged against the pattern run in float64, the replacement may err as
            # much as the pattern itself does (a folded or fused form rounds elsewhere)
            ref = _reference(rule, args, q.copies)
            if ref is not None:
                problem = differences(got, want, given_args, pattern_args, ref, q.precision)
        if problem:
            raise LawViolation("rule", rule, f"{problem} on inputs {sig.describe()}", None)


def _reference(rule: Rule, args: tuple, copies: bool) -> tuple | None:
    """The pattern's results on ``args`` with floating tensors made float64 (``None`` where it
    does not run so)."""
    wide = tuple(
        x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in args
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = rule.pattern(*wide)
    except Exception:  # noqa: BLE001 - no reference: the plain comparison stands
        return None
    return out if isinstance(out, tuple) else (out,)


def _all_nan(results: tuple) -> bool:
    floats = [r for r in results if isinstance(r, torch.Tensor) and r.is_floating_point()]
    return bool(floats) and len(floats) == len(results) and all(
        r.numel() > 0 and bool(torch.isnan(r).all()) for r in floats
    )


def _rewritten_site(rule: Rule, sig: Signature, apply_rules: Apply) -> _Site | None:
    """The pattern's program at ``sig`` rewritten by ``apply_rules``; ``None`` where the pattern
    cannot be exported at ``sig`` or rewrite declines the match."""
    # the results returned as they are (aliasing observable), else (rewrite may decline a
    # match that would return an alias of an input) each read by a copy: values still checked
    for copies in (False, True):
        p = pattern_program(rule, sig, copies=copies)
        if p is None:
            return None
        try:
            q, report = apply_rules(p, [rule])
        except PurefxError as exc:
            if "where()" in str(exc):
                raise  # a where() that raises: a malformed rule, a PassError
            raise LawViolation(
                "rule", rule, f"rewriting the pattern's own program at {sig.describe()} "
                f"failed: {_first_line(exc)}", None,
            ) from exc
        except Exception as exc:  # rewrite must never raise a raw error
            raise LawViolation(
                "rule", rule, f"rewriting the pattern's own program at {sig.describe()} "
                f"raised {type(exc).__name__}: {_first_line(exc)}", None,
            ) from exc
        if any(report.counts.values()):
            return _Site(q, copies, _loosest_float(p))
    return None


def _loosest_float(p: Program) -> torch.dtype | None:
    """The float dtype with the loosest tolerance among the values the pattern computes (a
    pattern that computes in float32 on float64 inputs is as precise as float32)."""
    found = None
    for n in p.root_module.graph.nodes:
        v = n.meta.get("val")
        for t in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(t, torch.Tensor) and t.dtype in _TOLERANCE and (
                found is None or _TOLERANCE[t.dtype] > _TOLERANCE[found]
            ):
                found = t.dtype
    return found


@attrs.frozen
class _Site:
    """The pattern's program at one signature, rewritten; ``copies``: its results are read by
    copies before they are returned."""

    program: Program
    copies: bool
    precision: torch.dtype | None = None  #: the loosest float dtype the pattern computes in


def pattern_program(rule: Rule, sig: Signature, *, copies: bool = False) -> Program | None:
    """The rule's pattern exported at ``sig`` (scalar arguments as the literals ``sig`` gives)
    and imported: a flat Program whose user inputs are the tensor arguments in order (its
    tensor results returned as fresh copies when ``copies``); ``None`` when ``torch.export``
    cannot trace it there."""
    tensors = sig.tensors()
    fixed = list(sig.args)
    pattern = rule.pattern

    class Pattern(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> Any:
            args = list(fixed)
            for i, x in zip(tensors, xs):
                args[i] = x
            out = pattern(*args)
            if copies:  # a fresh copy of any dtype and rank (stack, then select)
                many = isinstance(out, tuple)
                out = tuple(torch.stack([o])[0] if isinstance(o, torch.Tensor) else o
                            for o in (out if many else (out,)))
                out = out if many else out[0]
            return out

    example = draw_values(rule, sig, 0, False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(Pattern(), tuple(example[i] for i in tensors))
        return import_ep(ep)
    except Exception:  # noqa: BLE001 - export's errors share no base class: not a program here
        return None


# --- signatures and values ------------------------------------------------------------------------


def signatures(rule: Rule, limit: int = SIGNATURES) -> tuple[Signature, ...]:
    """Up to ``limit`` signatures where ``rule.pattern`` runs (tried eagerly on small values),
    the example's first (see ``check_rule`` for what varies). Deterministic.

    Complexity: about ``(2 + tensor arguments) · len(ALL_DTYPES)`` plus a few per distinct size
    eager runs of the pattern."""
    base = example_signature(rule)
    rng = random.Random(0)
    tensors = base.tensors()
    seen = {base.key()}
    found = [base]
    dtype_ok: list[Signature] = []
    shape_ok: list[Signature] = []

    def add(sig: Signature, into: list) -> bool:
        if sig.key() in seen:
            return False
        seen.add(sig.key())
        if _runs(rule, sig):
            into.append(sig)
            return True
        return False

    for d in ALL_DTYPES:
        add(_with(base, {i: (base.args[i][0], d) for i in tensors}), dtype_ok)
    for i in tensors:
        for d in ALL_DTYPES:
            add(_with(base, {i: (base.args[i][0], d)}), dtype_ok)
    sizes = sorted({s for i in tensors for s in base.args[i][0]})
    for s in sizes:
        for new in (1, s + 1, max(2, s // 2)):
            if new == s:
                continue
            add(_resized(base, tensors, {s: new}), shape_ok)
            for i in tensors:
                if s in base.args[i][0]:
                    add(_resized(base, (i,), {s: new}), shape_ok)
                    if len(tensors) > 2:
                        add(_resized(base, [j for j in tensors if j != i], {s: new}), shape_ok)
    # two size changes at once (k and v with fewer heads while the mask broadcasts), where
    # the pattern runs: a bounded, seeded sample of the pairs
    pairs = [(a, b) for a in shape_ok for b in shape_ok if a is not b]
    rng.shuffle(pairs)
    both: list[Signature] = []
    for a, b in pairs[:PAIRS]:
        add(_with(a, {i: b.args[i] for i in tensors if b.args[i] != base.args[i]}), both)
    # the most telling first: where the functions disagree when run eagerly (only a hint of
    # where to look: the verdict is the rewritten program's), then arguments resized each
    # their own way
    both.sort(key=lambda sig: (-_disagree(rule, sig), -len({sig.args[i] for i in tensors})))
    rest_first = sorted(dtype_ok + shape_ok, key=lambda sig: -_disagree(rule, sig))
    lead = _with(base, {i: ((2, *base.args[i][0]), base.args[i][1]) for i in tensors
                        if base.args[i][0]})
    add(lead, shape_ok)
    remap = {s: rng.choice((1, 2, 3, s)) for s in sizes}
    add(_resized(base, tensors, remap), shape_ok)
    # one of each kind first, then the rest in a seeded order, then combinations
    firsts = [s for s in dtype_ok if len({base.args[i][1] for i in tensors}) <= 1]
    rest = dtype_ok + shape_ok
    rng.shuffle(rest)
    rest = [s for s in rest_first if _disagree(rule, s)] + rest
    combos = max(1, limit // 4)  # slots kept for dtype x size x scalar combinations
    for sig in firsts[:3] + shape_ok[:2] + both[:combos] + rest:
        if len(found) >= limit - combos:
            break
        if sig not in found:
            found.append(sig)
    scalars = _drawn_scalars(rule)
    for _ in range(8 * limit):
        if len(found) >= limit:
            break
        d = rng.choice(dtype_ok) if dtype_ok else base
        s = rng.choice(shape_ok) if shape_ok else base
        combo = _with(s, {i: (s.args[i][0], d.args[i][1]) for i in tensors})
        combo = _with(combo, {i: rng.choice((base.args[i], *_scalar_pool(base.args[i])))
                              for i in scalars})
        add(combo, found)
    return tuple(found[:limit])


def example_signature(rule: Rule) -> Signature:
    """The signature of ``rule.example_inputs``."""
    return Signature(tuple(
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x
        for x in rule.example_inputs
    ))


def _drawn_scalars(rule: Rule) -> list[int]:
    c = rule.compiled(TRAINING)
    used = {pos for pos, _ in c.replacement.sentinels}
    return sorted(set(c.pattern.sentinels.values()) | used)


def _scalar_pool(x: Any) -> tuple:
    return _FLOATS if isinstance(x, float) else _INTS


def _with(sig: Signature, changes: dict) -> Signature:
    args = list(sig.args)
    for i, a in changes.items():
        args[i] = a
    return Signature(tuple(args))


def _resized(sig: Signature, where: Sequence[int], remap: dict) -> Signature:
    return _with(sig, {
        i: (tuple(remap.get(d, d) for d in sig.args[i][0]), sig.args[i][1]) for i in where
    })


def _disagree(rule: Rule, sig: Signature) -> bool:
    """Whether the replacement, run eagerly at ``sig``, raises or gives other results than the
    pattern (a hint for which signatures to trace first)."""
    args = draw_values(rule, sig, 0, False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = rule.pattern(*_fresh(args))
            got = rule.replacement(*_fresh(args))
    except Exception:  # noqa: BLE001 - a replacement that raises here is worth a look
        return True
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    return len(got) != len(want) or any(
        bool(_difference(g, w, args)) for g, w in zip(got, want)
    )


def _runs(rule: Rule, sig: Signature) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rule.pattern(*draw_values(rule, sig, 0, False))
        return True
    except Exception:  # noqa: BLE001 - "the pattern runs or not: try"
        return False


def draw_values(rule: Rule, sig: Signature, seed: int, specials: bool) -> tuple:
    """Arguments of signature ``sig``: normal floats (with special values 0, -0., ±inf, NaN put in
    when ``specials``), ints in [-3, 3], random bools; from a generator seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    args = []
    for a in sig.args:
        if not isinstance(a, tuple):
            args.append(a)
            continue
        shape, dtype = a
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float64)
            if specials and t.numel():
                flat = t.view(-1)
                count = max(1, flat.numel() // 4)
                picks = torch.randint(0, flat.numel(), (count,), generator=gen)
                for k, j in enumerate(picks.tolist()):
                    flat[j] = _SPECIALS[k % len(_SPECIALS)]
            args.append(t.to(dtype))
        elif dtype == torch.bool:
            args.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            args.append(torch.randint(-3, 4, shape, generator=gen).to(dtype))
    return tuple(args)


def _fresh(args: tuple) -> tuple:
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in args)


# --- comparing results ----------------------------------------------------------------------------


def differences(got: Sequence, want: Sequence, got_args: Sequence, want_args: Sequence,
                reference: Sequence | None = None, precision: torch.dtype | None = None) -> str:
    """What differs between results ``got`` (run on ``got_args``) and ``want`` (run on
    ``want_args``, equal values): count, shape, dtype, aliasing both ways (of the arguments
    and of earlier results), value; ``""`` when nothing does. With ``reference`` (the pattern's
    results computed in float64), a float result's values may differ from ``want`` as long as
    their error against the reference is at most twice ``want``'s own, plus the tolerance.
    The tolerance is the result dtype's, or ``precision``'s when that is looser (the pattern
    computes in a less precise dtype)."""
    if len(got) != len(want):
        return f"{len(got)} results, the pattern gives {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        ref = reference[k] if reference is not None and k < len(reference) else None
        problem = _difference(g, w, want_args, ref, precision)
        if not problem:
            problem = _aliasing(k, got, want, got_args, want_args)
        if problem:
            return f"result {k}: {problem}"
    return ""


def _aliasing(k: int, got: Sequence, want: Sequence, got_args: Sequence,
              want_args: Sequence) -> str:
    g, w = got[k], want[k]
    if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
        return ""
    named = [(f"argument {i}", a, b) for i, (a, b) in enumerate(zip(got_args, want_args))]
    named += [(f"result {j}", got[j], want[j]) for j in range(k)]
    for what, a, b in named:
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        was, now = aliases(w, b), aliases(g, a)
        if was and not now:
            return f"the pattern's result is a view of {what}, the replacement's is not"
        if now and not was:
            return f"the pattern's result is fresh, the replacement's is an alias of {what}"
    return ""


def _difference(got: Any, want: Any, args: Sequence, ref: Any = None,
                precision: torch.dtype | None = None) -> str:
    if not isinstance(want, torch.Tensor):
        return "" if got == want else f"got {got!r}, the pattern gives {want!r}"
    if not isinstance(got, torch.Tensor):
        return f"got a {type(got).__name__}, the pattern gives a tensor"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, the pattern gives {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, the pattern gives {want.dtype}"
    if want.is_floating_point() or want.is_complex():
        rtol, atol = max(_TOLERANCE.get(want.dtype, (1e-5, 1e-6)),
                         _TOLERANCE.get(precision, (0.0, 0.0)))
        a, b = got.detach().double(), want.detach().double()
        if _holds_non_finite(args):  # the pattern's NaN leaves the value open
            a = torch.where(torch.isnan(b), b, a)
        if isinstance(ref, torch.Tensor) and ref.shape == want.shape:
            r = ref.detach().double()
            own = torch.nan_to_num((b - r).abs(), nan=0.0).max() if b.numel() else 0.0
            ok = (a - r).abs() <= 2 * own + atol + rtol * r.abs()
            ok |= torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            if bool(ok.all()):
                return ""
        if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            j = int(bad.reshape(-1).nonzero()[0])
            return (
                f"values differ ({int(bad.sum())} of {bad.numel()}; at flat index {j}: got "
                f"{a.reshape(-1)[j].item()}, the pattern gives {b.reshape(-1)[j].item()})"
            )
        return ""
    if not torch.equal(got, want):
        return "values differ"
    return ""


def _holds_non_finite(args: Sequence) -> bool:
    for x in args:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            if not bool(torch.isfinite(x).all()):
                return True
        elif isinstance(x, float) and not math.isfinite(x):
            return True
    return False


def aliases(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share storage (never for an empty tensor)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


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


def run_replacement(rule: Rule, args: tuple, apply: Apply) -> tuple:
    """Run the replacement as ``rewrite`` instantiates it for arguments ``args``: the pattern
    traced at their signature, rewritten by ``apply`` (``engine.apply_rules``), run. Raises
    ``LawViolation`` when rewrite declines the match there."""
    sig = Signature(tuple(
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in args
    ))
    site = _rewritten_site(rule, sig, apply)
    if site is None:
        raise LawViolation("rule", rule, f"rewrite declines the match at {sig.describe()}", None)
    return run_graph(site.program.root_module.graph, [args[i] for i in sig.tensors()])


__all__ = [
    "ALL_DTYPES",
    "DTYPES",
    "SIGNATURES",
    "Apply",
    "Signature",
    "aliases",
    "check_rule",
    "differences",
    "draw_values",
    "example_signature",
    "pattern_program",
    "run_replacement",
    "signatures",
]
