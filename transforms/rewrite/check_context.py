"""``check_rule_in_context``: ``rewrite`` with one rule, checked as a law on programs that hold
the rule's pattern among other code (``ir.strategies.rewrite_sites``).

The law, for every generated program ``p`` and ``q = rewrite(p, [rule])``:

- semantics: run on equal inputs and state, ``q`` returns what ``p`` returns (values within the
  dtype's tolerance, dtypes, shapes), writes the same into its inputs and buffers, and aliases
  the same: each output shares storage with the same inputs, buffers and earlier outputs;
- preserved calls: ``q`` keeps ``p``'s preserved call signatures; each value a call reads or
  returns (by its signature) is still there and still computed on the same side of the call's
  boundary; and ``transform(q)`` (which outlines the calls) works wherever ``transform(p)`` does;
- idempotence: ``rewrite(q, [rule]) is q`` (a fixpoint).

Programs run by interpretation of their root graph (``transforms.rewrite.interpret``): every
aten call as the lowered module makes it, so views, writes in place and aliasing are torch's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ir.errors import PassError, PurefxError
from ir.harness import (
    Law,
    Observed,
    Ran,
    ShrinkBudget,
    Trial,
    hold,
    judge,
    run_side,
    widen,
)
from ir.import_ep import import_ep
from ir.program import Program
from transforms.machinery.law_violation import LawViolation
from transforms.machinery.trace import TRAINING, trace
from transforms.rewrite import rule_check as rule_law
from transforms.rewrite.api import rewrite
from transforms.rewrite.interpret import program_state, run_program
from transforms.rewrite.refusal import check_rule
from transforms.rewrite.rule import Rule
from transforms.rewrite.rule_check import assumed, signatures, wide_reference
from transforms.rewrite.ruleset import ensure_checked


def check_rule_in_context(
    rule: Rule,
    *,
    max_examples: int = 20,
    places: Sequence[str] | None = None,
    levels: Sequence[str] | None = None,
) -> None:
    """Check ``rewrite(·, [rule])`` on ``max_examples`` programs with the rule's pattern planted.

    What is drawn (``ir.strategies.rewrite_sites``): the pattern's arguments at signatures where
    it runs (``transforms.rewrite.rule_check.signatures``: dtypes including ints and bools, sizes
    varied per argument), each taken from a user input, a value computed from one, a view of
    one, a buffer, or an earlier argument's value; each result returned, read by a view,
    written in place (directly or through a view), copied into a buffer; the pattern in the
    root module, inside a child module or split across its boundary, the child preserved
    (``preserve_module_call_signature``) or not; the training or core aten level.

    ``places`` / ``levels`` narrow the draws (``ir.strategies.rewrite_sites.PLACES``: ``root``,
    ``inside``, ``across``, ``perturbed``; ``LEVELS``: ``training``, ``core``; default all).

    What is checked: the law of the module docstring (semantics with dtypes, writes and
    aliasing; preserved calls kept; idempotence). ``check_rule`` runs on the rule first, before
    any program is drawn and outside hypothesis (``ensure_checked``: once, the verdict kept for
    ``rewrite``), so a rule ``check_rule`` refuses raises ``PassError`` at once, with the same
    counterexample ``check_rule`` alone gives. Under ``reassociate`` a difference is judged
    against the original program run in float64, as ``check_rule`` judges one
    (``ir.harness.regrouped_difference``).

    Raises:
        LawViolation: (law ``"rewrite in context"``) naming the rule, what differs, the drawn
            site (``SiteSpec.describe``) and the program.
        PassError: the rule is malformed or wrong by ``check_rule``.

    Cost: per example one ``torch.export`` (plus ``run_decompositions`` at the core level), two
    rewrites and two interpreted runs of the program; hypothesis shrinks a failure.
    """
    from hypothesis import HealthCheck, settings

    from ir.strategies.rewrite_sites import LEVELS, PLACES, export_site, rewrite_sites

    _check_choice("places", places, PLACES)
    _check_choice("levels", levels, LEVELS)
    if not isinstance(max_examples, int) or max_examples < 1:
        raise PassError(f"check_rule_in_context: max_examples must be a positive int, got "
                        f"{max_examples!r}")

    rule.compiled(TRAINING)  # a malformed rule is a PassError before anything is drawn
    # the rule's own law first, outside hypothesis (as check_rule alone runs it, with its
    # shrunk counterexample): a wrong rule is refused at once, not once per drawn program
    ensure_checked(rule)
    sigs = [s.args for s in signatures(rule)]
    n_results = len(rule.compiled(TRAINING).pattern.outputs)
    split = _split_graph(rule)
    strategy = rewrite_sites(rule.pattern, sigs, results=n_results, split=split,
                             places=places or PLACES, levels=levels or LEVELS)

    def one(spec: Any) -> None:
        made = export_site(spec, rule.pattern, split)
        if made is None:
            return  # torch.export refuses this module: no program to rewrite
        ep, inputs = made
        try:
            p = import_ep(ep)
        except PurefxError:
            return  # a program purefx does not represent: nothing to rewrite
        check_site(rule, p, inputs, spec.describe())

    # every health check off: a site's export is slow, and many draws make no program
    base = settings(derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    # one key for every rule: the draws differ by the rule's pattern and signatures (the
    # strategy), never by what its functions are called (``rule_seed`` digests their names)
    hold(Trial(IN_CONTEXT, strategy, one, key="rule in context",
               budget=ShrinkBudget(rule_law.SHRINK_SECONDS, LawViolation)),
         settings=base, max_examples=max_examples)


def _check_choice(name: str, given: Sequence[str] | None, allowed: Sequence[str]) -> None:
    if given is None:
        return
    if isinstance(given, str) or not given or not set(given) <= set(allowed):
        raise PassError(
            f"check_rule_in_context: {name} must be a non-empty list drawn from {allowed}, got "
            f"{given!r}"
        )


def _split_graph(rule: Rule) -> Any:
    try:
        return trace(rule.pattern, rule.example_inputs, TRAINING, rule.name, "pattern",
                     sentinels=False).graph
    except PassError:
        return None


def check_site(
    rules: Rule | Sequence[Rule], p: Program, inputs: tuple, where: str = ""
) -> Program:
    """The law of ``check_rule_in_context`` for ``rewrite(·, rules)`` (one rule or several) on
    one flat program ``p`` with user inputs ``inputs``; returns the rewritten program. Raises
    ``LawViolation`` naming ``where`` (a description of the site) when it breaks, ``PassError``
    for a rule that is malformed or that ``check_rule`` refuses.

    Use it for a program of your own (a model with the pattern, a cascade of rules). Cost: two
    rewrites and two interpreted runs of ``p``."""
    rules = [rules] if isinstance(rules, Rule) else list(rules)
    names = ", ".join(repr(r.name) for r in rules)

    def broken(detail: str, cause: BaseException | None = None) -> LawViolation:
        text = f"rule {names} on {where}: {detail}" if where else f"rule {names}: {detail}"
        exc = LawViolation("rewrite in context", rewrite, text, p)
        exc.__cause__ = cause
        return exc

    granted = frozenset().union(*(r.assumes for r in rules))  # the law checks rules under theirs
    try:
        q = rewrite(p, rules, assume=granted)
    except PassError:
        raise
    except Exception as exc:  # another purefx error or a raw one out of rewrite breaks the law
        raise broken(f"rewrite raised {type(exc).__name__}: {exc}", exc) from exc
    if q is p:
        return q
    _compare(p, q, inputs, frozenset().union(*(assumed(r) for r in rules)), "check_site",
             "rewritten", broken)
    if set(q.call_signatures.keys()) != set(p.call_signatures.keys()):
        raise broken(
            f"preserved calls {sorted(p.call_signatures.keys())} became "
            f"{sorted(q.call_signatures.keys())}"
        )
    problem = _boundaries(p, q)
    if problem:
        raise broken(problem)
    if len(p.call_signatures) > 1:
        from transforms.pipeline import transform

        if _outlines(transform, p):
            try:
                transform(q)
            except Exception as exc:  # the rewrite dissolved a preserved call
                raise broken(
                    f"transform (outlining the preserved calls) refuses the rewritten program: "
                    f"{type(exc).__name__}: {exc}", exc,
                ) from exc
    try:
        again = rewrite(q, rules, assume=granted)
    except Exception as exc:  # rewriting a rewritten program must work too
        raise broken(f"rewriting the result again raised {type(exc).__name__}: {exc}",
                     exc) from exc
    if again is not q:
        raise broken("not a fixpoint: rewriting the result again changed it")
    return q


def check_extracted(p: Program, q: Program, inputs: tuple,
                    assumes: frozenset[str] = frozenset(), where: str = "") -> None:
    """The in-context law's comparison for a program ``q`` that a search (``saturate``)
    derived from the flat program ``p``: both run on ``inputs`` (user inputs) and their state,
    outputs and what they write compared as ``check_site`` compares them (tolerances relaxed
    by ``assumes``; under ``reassociate`` against ``p`` run in float64), aliasing included.
    Raises ``LawViolation`` naming ``where`` when they differ, ``PassError`` when ``p`` does not
    run on ``inputs``. Cost: three interpreted runs."""
    if q is not p:
        _compare(p, q, inputs, assumes, "check_extracted", "derived",
                 lambda detail: LawViolation("saturate in context", rewrite, f"{where}: {detail}", p))


def _compare(p: Program, q: Program, inputs: tuple, assumes: frozenset[str], caller: str,
             made: str, broken: Callable[[str], LawViolation]) -> None:
    """Run ``p`` and ``q`` (the program ``made`` from it) on ``inputs`` and judge them under
    ``IN_CONTEXT``; ``broken(detail)`` is raised when ``q`` fails or differs, a ``PassError``
    naming ``caller`` when ``p`` itself does not run (not the rewrite's fault: the law cannot
    run this program)."""
    want = _run(p, inputs)
    if not want.ok:
        name, line = want.error
        raise PassError(f"{caller}: the original program does not run on the inputs given "
                        f"({name}: {line}); give a flat program and its user inputs")
    got = _run(q, inputs)
    if not got.ok:  # the program made must run where the original does
        name, line = got.error
        raise broken(f"the {made} program raised {name}: {line}")
    # regrouped (``reassociate``): judged against the original run in float64, as
    # ``check_rule`` judges a rule (one runner: ``ir.harness.judge``)
    problem = judge(IN_CONTEXT, got.observed, want.observed, assumes=assumes,
                    reference=lambda: _reference(p, inputs))
    if problem:
        raise broken(str(problem))


def _boundaries(p: Program, q: Program) -> str:
    """What the rewrite did to a preserved call's boundary in a flat program: a value the call
    reads or returns (its signature names it) gone, or one it returns now computed outside the
    call (or one it read now computed inside); ``""`` when nothing."""
    before = {n.name: n for n in p.root_module.graph.nodes}
    after = {n.name: n for n in q.root_module.graph.nodes}
    for call, sig in sorted(q.call_signatures.items()):
        if not call:
            continue
        path = call.split("@")[0]
        for kind, specs in (("reads", sig.inputs), ("returns", sig.outputs)):
            for a in specs:
                if a.name is None or a.name not in before:
                    continue
                if a.name not in after:
                    return (f"the preserved call {call!r} {kind} %{a.name}, which the rewrite "
                            "removed: the match crossed the call's boundary")
                if _inside(before[a.name], path) != _inside(after[a.name], path):
                    return (f"the preserved call {call!r} {kind} %{a.name}, now computed "
                            f"{'inside' if _inside(after[a.name], path) else 'outside'} the "
                            "call: the match crossed the call's boundary")
    return ""


def _inside(node: Any, path: str) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    return any(isinstance(v, tuple) and v and v[0] == path for v in stack.values())


def _outlines(transform: Any, p: Program) -> bool:
    try:
        transform(p)
    except Exception:  # noqa: BLE001 - p itself does not outline: nothing to compare
        return False
    return True


def _run(p: Program, inputs: tuple, *, wide: bool = False, absolute: bool = False) -> Ran:
    """``p`` interpreted on copies of ``inputs`` and of its state, through the law runner
    (``ir.harness.run_side``: outputs, inputs after, state after, aliasing); ``wide``: with
    floating inputs and state made float64 (``ir.harness.widen``), their absolute values with
    ``absolute``."""
    args = tuple(inputs)
    state = program_state(p)
    if wide:
        args, state = widen((args, state), absolute=absolute)
    return run_side(lambda *xs: run_program(p, xs, state), args, state=lambda: state)


def _reference(p: Program, inputs: tuple) -> Observed | None:
    """The original program's run in float64 (``_run(..., wide=True)``, ``rule_check.
    wide_reference``), ``None`` where it does not run so (a dtype fixed in the graph that
    float64 values break)."""
    return wide_reference(lambda absolute: _run(p, inputs, wide=True, absolute=absolute))


IN_CONTEXT = Law("rewrite in context", wanted="the original gives",
                 side="the original's result is")
"""The law of ``check_rule_in_context`` as a value (``ir.harness.Law``): outputs, inputs after
the call, state and aliasing compared; the wanted side is the original program."""


__all__ = ["check_extracted", "check_rule", "check_rule_in_context", "check_site"]
