"""``check_rule``: a rewrite rule's law, checked on generated inputs before the rule is trusted.

The law: wherever the pattern runs (and the rule's ``where`` holds), the replacement, as
``rewrite`` instantiates it from its traced graph, runs too and agrees with the pattern in the
number, shape and dtype of its results, in aliasing (a result that is a view of an input stays
one) and in value within the dtype's tolerance, NaN where the pattern gives NaN. One
exception: on inputs that hold a non-finite value (±inf, NaN), where the pattern's result is
NaN the replacement may give any value (a fused kernel may define what the unfused ops leave
undefined, as ``scaled_dot_product_attention`` does for a row of ``-inf`` scores). On finite
inputs a NaN is a value like any other: ``exp(log(x)) -> x`` is refused, since the pattern
gives NaN for ``x < 0``. Where the pattern's result is not NaN the replacement's must not be.
Also, the pattern matches its own traced graph exactly once.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from ir.args import Ref, thaw
from ir.errors import PassError, PurefxError
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER
from transforms.law_violation import LawViolation
from transforms.rewrite.match import match_at
from transforms.rewrite.rule import Match, Rule
from transforms.rewrite.trace import TRAINING

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_TOLERANCE = {  # (rtol, atol)
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
_SPECIALS = (0.0, -0.0, math.inf, -math.inf, math.nan)
_FLOATS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -1.5, 1e-3, 1e3)
_INTS = (0, 1, -1, 2, 3)


def check_rule(rule: Rule, *, max_examples: int | None = None) -> None:
    """Raise ``LawViolation`` (law ``"rule"``) with a counterexample when ``rule`` is wrong.

    Hypothesis draws, for the rule's tensor arguments: a dtype (f32, f64, f16, bf16, one for all),
    shapes made from the examples' by mapping each distinct size to another (1, 2, 3 or itself,
    so sizes that must agree still do; 1 tests broadcasting), sometimes one more leading
    dimension, values from a normal distribution with special values (0, -0., ±inf, NaN) put in
    at random; for float and int arguments, values such as 0, -0., 1, 2, -1.5. Each example
    shrinks toward the example inputs' shapes in float32 without special values. Examples
    where the pattern raises or ``where`` is false are skipped.

    Also raises ``LawViolation`` when the pattern does not match its own traced graph exactly
    once, and ``PassError`` naming the rule when it cannot be traced, is malformed or its
    ``where`` raises. Cost: ``max_examples`` (default ``rule.max_examples``) eager runs of both
    functions.
    """
    from hypothesis import HealthCheck, currently_in_test_context, example, given, settings
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    compiled = rule.compiled(TRAINING)
    _check_matches_itself(rule, compiled)
    tensors = [i for i, x in enumerate(rule.example_inputs) if isinstance(x, torch.Tensor)]
    sizes = sorted({s for i in tensors for s in rule.example_inputs[i].shape})
    used = {pos for pos, value in compiled.replacement.sentinels}
    pattern_graph_sentinels = set(compiled.pattern.sentinels.values())
    drawn_scalars = sorted(pattern_graph_sentinels | used)

    def inputs(choose: Any) -> _Args:
        # choose(options) picks one option: hypothesis's draw, or a seeded generator's
        return _draw_args(rule, choose, tensors, sizes, drawn_scalars)

    n = max_examples if max_examples is not None else rule.max_examples

    if currently_in_test_context():
        # inside a hypothesis test (a property suite that calls rewrite): hypothesis cannot
        # nest @given, so the same draws come from a seeded generator, without shrinking
        rng = random.Random(0)
        _check_one(rule, compiled, rule.example_inputs, skip=False)
        for _ in range(n):
            _check_one(rule, compiled, inputs(rng.choice).args, skip=False)
        return

    @st.composite
    def drawn_args(draw: Any) -> _Args:
        return inputs(lambda options: draw(st.sampled_from(options)))

    @settings(
        max_examples=n, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
    )
    @given(drawn_args())
    @example(_Args(tuple(rule.example_inputs)))
    def law(drawn: _Args) -> None:
        _check_one(rule, compiled, drawn.args)

    try:
        law()
    except Unsatisfiable:
        pass  # the pattern ran on the examples only: nothing more to compare


def _draw_args(rule: Rule, choose: Any, tensors: list, sizes: list, scalars: list) -> _Args:
    """One draw of the rule's arguments (see ``check_rule``); ``choose(options)`` picks."""
    dtype = choose(DTYPES)
    remap = {s: choose((s, 1, 2, 3)) for s in sizes}
    lead = choose((0, 0, 1, 2))
    specials = rule.specials and choose((False, True))
    gen = torch.Generator().manual_seed(choose(range(2**16)))
    args = list(rule.example_inputs)
    for i in tensors:
        ex = rule.example_inputs[i]
        shape = tuple(remap[s] for s in ex.shape)
        if lead and ex.dim() > 0:
            shape = (lead, *shape)
        if ex.is_floating_point():
            t = torch.randn(shape, generator=gen, dtype=torch.float64)
            if specials and t.numel():
                flat = t.view(-1)
                count = max(1, flat.numel() // 4)
                picks = torch.randint(0, flat.numel(), (count,), generator=gen)
                for k, j in enumerate(picks.tolist()):
                    flat[j] = _SPECIALS[k % len(_SPECIALS)]
            args[i] = t.to(dtype)
        else:
            args[i] = torch.randint(-3, 4, shape, generator=gen).to(ex.dtype)
    for pos in scalars:
        ex = rule.example_inputs[pos]
        pool = _FLOATS if isinstance(ex, float) else _INTS
        args[pos] = choose((ex, *pool))
    return _Args(tuple(args))


class _Args:
    """Drawn arguments that hypothesis prints by shape and dtype, not by value."""

    __slots__ = ("args",)

    def __init__(self, args: tuple) -> None:
        self.args = args

    def __repr__(self) -> str:
        return _describe(self.args)


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


def _check_one(rule: Rule, compiled: Any, args: tuple, skip: bool = True) -> None:
    """Check the law on ``args``; where it does not apply, ``assume(False)`` under hypothesis
    (``skip``), else return."""
    from hypothesis import assume

    def not_here() -> None:
        if skip:
            assume(False)

    try:
        want = rule.pattern(*args)
    except Exception:  # noqa: BLE001 - the law speaks only of inputs the pattern runs on
        not_here()
        return
    if rule.where is not None:

        try:
            ok = rule.where(Match(rule.name, {}, args))
        except PurefxError:
            raise
        except Exception as exc:
            raise PassError(
                f"rule {rule.name!r}: its where() raised {type(exc).__name__}: {exc}; make "
                "where() return a bool for every Match"
            ) from exc
        if not ok:
            not_here()
            return
    want = want if isinstance(want, tuple) else (want,)
    try:
        got = run_replacement(compiled, args, rule)
    except Exception as exc:
        raise LawViolation(
            "rule", rule, f"the replacement raised {type(exc).__name__}: {exc} on "
            f"{_describe(args)} where the pattern ran", None,
        ) from exc
    if len(got) != len(want):
        raise LawViolation("rule", rule, f"{len(got)} results, the pattern gives {len(want)}",
                           None)
    for k, (g, w) in enumerate(zip(got, want)):
        problem = _difference(g, w, args)
        if problem:
            raise LawViolation(
                "rule", rule, f"result {k}: {problem} on {_describe(args)}", None
            )


def run_replacement(compiled: Any, args: tuple, rule: Rule | None = None) -> tuple:
    """Run the replacement's traced graph as ``rewrite`` instantiates it: placeholders are the
    tensor arguments, sentinel literals the scalar arguments. A replacement that computes on its
    scalars in Python (``compiled.concrete``) is traced per match with the match's scalars, which
    computes what calling ``rule.replacement`` does: that is what runs here."""
    if compiled.concrete and rule is not None:
        # the trace holds values computed from the example scalars: run what the rule says
        out = rule.replacement(*args)
        return out if isinstance(out, tuple) else (out,)
    rep = compiled.replacement
    sentinels = {value: pos for pos, value in rep.sentinels}
    env: dict[str, Any] = {}
    placeholders = [n for n in rep.graph.nodes if n.op == PLACEHOLDER]
    for n, pos in zip(placeholders, rep.tensor_args):
        env[n.name] = args[pos]

    def scalar(tree: Any) -> Any:
        if isinstance(tree, (tuple, list)):
            return type(tree)(scalar(x) for x in tree)
        if isinstance(tree, dict):
            return {k: scalar(v) for k, v in tree.items()}
        if isinstance(tree, (int, float)) and not isinstance(tree, bool) and tree in sentinels:
            return args[sentinels[tree]]
        return tree

    for n in rep.graph.nodes:
        if n.op in (PLACEHOLDER, OUTPUT):
            continue
        a = scalar(thaw(n.args, lambda r: env[r.name]))
        k = scalar(thaw(n.kwargs, lambda r: env[r.name]))
        env[n.name] = n.target(*a, **k)
    return tuple(env[o.name] if type(o) is Ref else o for o in rep.outputs)


def _difference(got: Any, want: Any, args: tuple) -> str:
    if not isinstance(want, torch.Tensor):
        return "" if got == want else f"got {got!r}, the pattern gives {want!r}"
    if not isinstance(got, torch.Tensor):
        return f"got a {type(got).__name__}, the pattern gives a tensor"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, the pattern gives {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, the pattern gives {want.dtype}"
    for i, x in enumerate(args):
        if isinstance(x, torch.Tensor) and _aliases(want, x) and not _aliases(got, x):
            return f"the pattern's result is a view of argument {i}, the replacement's is not"
    if want.is_floating_point():
        rtol, atol = _TOLERANCE.get(want.dtype, (1e-5, 1e-6))
        a, b = got.double(), want.double()
        if _holds_non_finite(args):  # the pattern's NaN leaves the value open
            a = torch.where(torch.isnan(b), b, a)
        if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            j = int(bad.view(-1).nonzero()[0])
            return (
                f"values differ ({int(bad.sum())} of {bad.numel()}; at flat index {j}: got "
                f"{a.view(-1)[j].item()}, the pattern gives {b.view(-1)[j].item()})"
            )
        return ""
    if not torch.equal(got, want):
        return "values differ"
    return ""


def _holds_non_finite(args: tuple) -> bool:
    for x in args:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            if not bool(torch.isfinite(x).all()):
                return True
        elif isinstance(x, float) and not math.isfinite(x):
            return True
    return False


def _aliases(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _describe(args: tuple) -> str:
    parts = []
    for x in args:
        if isinstance(x, torch.Tensor):
            parts.append(f"tensor{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}")
        else:
            parts.append(repr(x))
    return "inputs (" + ", ".join(parts) + ")"


__all__ = ["DTYPES", "check_rule", "run_replacement"]
