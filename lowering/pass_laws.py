"""Law checkers: test a pass ``Program -> Program`` against the laws every purefx pass obeys.

The laws (``DESIGN.md``), each a public function usable without hypothesis:

- **purity** (:func:`check_purity`): the input Program is ``==`` to a snapshot taken before the
  call, its node meta is as it was, no tensor it holds was written (``_version``), nothing
  was printed, and, where it has dynamic dimensions, it runs as before at other sizes of them
  (no guard added to the shape env it shares with its ``val`` s: :func:`other_sizes`);
- **verify** (:func:`check_verify`): the result is a Program and ``ir.verify(result,
  vals=True)`` accepts it: well formed, and every compute node's ``val`` is what its inputs'
  ``val`` s give (a pass that changed a node's shape and left its ``val`` stale breaks it);
- **determinism** (:func:`check_determinism`): two calls on the same input give equal results
  that print the same (``==``, except that tensors compare by value: dtype, shape, device, bits,
  so a pass may make new constants);
- **semantics** (:func:`check_semantics`): ``lower(result)`` returns what ``lower(input)``
  returns (or, given ``reference=``, what that eager function returns), within ``atol`` /
  ``rtol`` when given, and leaves the same state and the same (mutated) inputs, over several
  calls, no output a view of an input, of state or of another output where the input's was
  fresh, and also at other sizes of each dynamic dimension (:func:`other_sizes`: a result that
  baked a size in fails there); both sides run under one seed per call, so random ops draw
  alike;
- **idempotence** (:func:`check_idempotence`), for normalizing passes: ``T(T(p)) == T(p)``;
- **inverse** (:func:`check_inverse`): ``inverse(forward(p))`` is alpha-equivalent to ``p``;
- **metric** (:func:`check_metric`): a measure of the result relates to that of the input
  (e.g. deduplication never adds modules).

:func:`check_program` runs the first five on one program, sharing the work; :func:`check_laws`
runs it under hypothesis over generated programs and raises :class:`LawViolation` (an
``AssertionError``) naming the law, with the shrunk program printed; it also fails as
*vacuous* when the pass changed none of the programs it ran on, and returns a
:class:`LawReport` (how many programs were tried, changed, declined)::

    from transforms.laws import check_laws
    check_laws(my_pass)                      # purity, verify, determinism, semantics
    check_laws(my_pass, idempotent=True)     # ... and T(T(p)) == T(p)
    check_laws(fake_quant, atol=1e-2, rtol=1e-2)   # changes numerics on purpose
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Callable, Collection, Iterator
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir.alpha import alpha_equivalent
from ir.args import IDict, IList, ISlice
from ir.effects import state_written
from ir.errors import EditRefused, PurefxError, VerifyError, shorten
from ir.fake_run import guards_refused, refused_guard
from ir.graph import Graph
from ir.harness import (
    FINITE_TOLERANCE,
    MISSING,
    Difference,
    Judged,
    Law,
    Observed,
    Trial,
    hold,
    judge,
    run_side,
    same_bits,
    state_value,
)
from ir.harness.shrink_calls import ShrinkCalls
from ir.module import Module
from ir.node import Node
from ir.printer import NodeLines, format_program
from ir.program import Program
from ir.purity import program_tensor_versions
from ir.signature import CallSignature, ExportSignature
from ir.verify import verify
from lowering.lower import lower
from transforms.kernel import dynamic_sizes, size_range
from transforms.machinery.law_violation import Example, LawViolation, describe, pass_name

__all__ = [
    "LAWS",
    "SEED",
    "SHRINK_CALLS",
    "Example",
    "LawReport",
    "LawViolation",
    "check_determinism",
    "check_idempotence",
    "check_inverse",
    "check_laws",
    "check_metric",
    "check_program",
    "check_purity",
    "check_semantics",
    "check_verify",
    "describe",
    "dynamic_symbols",
    "other_sizes",
    "same_program",
]

Pass = Callable[[Program], Program]
Inputs = Callable[[Program], "tuple[tuple, dict]"]

LAWS = ("purity", "verify", "determinism", "semantics", "idempotence")
"""The laws :func:`check_program` knows, in the order it checks them."""

CORE_LAWS = ("purity", "verify", "determinism", "semantics")

SHRINK_CALLS = 200
"""``check_laws``' default shrink budget: the calls after the first failure before shrinking
stops and the smallest failure found is raised (``ir.harness.shrink_calls.ShrinkCalls``).
Measured on the operator floor's programs: a semantics failure of a 62-node program shrank to
39 nodes in 171 calls (36 s), then took 1,324 more calls (210 s) to reach 27."""

SEED = 1_234_567
"""Call ``i`` of the semantics law runs both sides under ``torch.manual_seed(SEED + i)`` (a seed
no test sets by habit, so a pass that draws at pass time under ``manual_seed(0)`` is still seen
drawing other numbers than the program does at run time)."""


@attrs.frozen
class LawReport:
    """What :func:`check_laws` saw: programs ``tried``, how many the pass ``changed`` (its
    result is not :func:`same_program` as its input) and how many it ``declined`` (raised one
    of ``allowed_errors``); with ``atol``/``rtol``, ``unjudged``: the programs whose outputs
    the semantics law judged at no position, every one it compared excused because
    the reference was NaN or ±inf there (``ir.harness.FINITE_TOLERANCE``), and ``excused``:
    the output positions so excused over all programs and calls. With the default programs,
    ``targets``: the forms the pass was found to change (``lowering.law_targets``), and
    ``note``: what ``str`` adds about them (that it changed fewer than one default program in
    five, what it changes, where the rest of the budget went)."""

    tried: int
    changed: int
    declined: int
    unjudged: int = 0
    excused: int = 0
    targets: tuple[str, ...] = ()
    note: str = ""

    def __str__(self) -> str:
        return (f"{self.changed} of {self.tried} programs changed"
                + (f", {self.declined} declined" if self.declined else "")
                + (f", {self.unjudged} judged nowhere (the reference not finite)"
                   if self.unjudged else "")
                + (f"; {self.note}" if self.note else ""))


# --- single laws --------------------------------------------------------------------------------



def check_purity(pass_fn: Pass, program: Program) -> Program:
    """Run ``pass_fn(program)`` and check that it left ``program`` as it was; return the result.

    Checks that ``program`` is ``==`` to a structural copy taken before the call, that every
    node's meta has the same keys, module stack and values (by identity), that no tensor of its
    table was written (``_version``), that nothing was printed to stdout, and, for a program
    with dynamic dimensions, that the shape env its ``val`` s share gained no guard, replacement
    or narrower range, and that ``lower(program)`` does at other sizes of those dimensions
    (:func:`other_sizes`) after the call what it did before (runs to the same values, or raises
    the same error). Raises ``LawViolation("purity")`` otherwise, or ``LawViolation("raises")``
    when the pass raises. Cost: with dynamic dimensions, two more lowerings of ``program`` and
    a run per size set before and after the pass. The pass runs with guards on that shape env
    refused (``ir.fake_run.guards_refused``): a pass that asks for one (``int()`` of a dynamic
    size, outside the editor) breaks the law there, its input untouched, so the law fails
    alike on every run.
    """
    before = _copy_program(program)
    meta = _meta_fingerprint(program)
    versions = program_tensor_versions(program)
    bits = _tensor_snapshot(program)
    mode = _fake_mode(program)
    env = getattr(mode, "shape_env", None)
    guards = _guard_state(env)
    sizes = other_sizes(program)
    made = [_inputs_at(program, s) for s in sizes]
    runs = _runs_at(program, made)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), guards_refused(mode):
        try:
            result = _call(pass_fn, program)
        except LawViolation as e:
            guard = refused_guard(e.__cause__) if e.law == "raises" else None
            if guard is None or isinstance(e.__cause__, PurefxError):
                raise  # a PassError of the editor names the node itself: the pass refused
            raise LawViolation(
                "purity", pass_fn, f"the pass asked the shape env its input shares for "
                f"{guard.text} ({_symbols_text(program, guard.symbols)}), which would fix "
                "that size of the input too; keep sizes symbolic (no int() or comparison of a "
                "size: e.call, docs/passes.md)", program) from e.__cause__
    problems = _changed_at(program, sizes, made, runs)
    added = _guards_added(env, guards)
    if added:
        problems.insert(0, f"the shape env the input shares with its vals gained {added}: a "
                        "guard fixes a dynamic size of the input too (keep sizes symbolic: "
                        "e.call, no int() of a size; docs/passes.md)")
    if program != before:
        problems.append("the input Program is no longer == to its snapshot")
    if _meta_fingerprint(program) != meta:
        problems.append("the input's node meta changed")
    after = program_tensor_versions(program)
    if after != versions:
        keys = [k for k in sorted(program.tensors.keys())
                if isinstance(program.tensors[k].value, torch.Tensor)]  # versions' order
        written = sorted(k for k, a, b in zip(keys, versions, after) if a != b)
        problems.append(f"tensors of the input were written: {written}")
    else:
        written = _written_behind_versions(program, bits)
        if written:
            problems.append(f"tensors of the input were written behind autograd's version "
                            f"counter (through .data, say): {written}")
    if printed.getvalue():
        problems.append(f"it printed {shorten(printed.getvalue(), 200)!r}")
    if problems:
        raise LawViolation("purity", pass_fn, "; ".join(problems), program)
    return result


def check_verify(pass_fn: Pass, program: Program, result: Program | None = None) -> Program:
    """Check that ``pass_fn(program)`` (or the given ``result``) is a Program that verifies.

    Verifies is ``ir.verify(result, vals=True)``: well formed, and the ``val`` of every compute
    node re-derived from its inputs' ``val`` s has the recorded shape, dtype and device. A
    stale ``val`` the input already had is not the pass's fault and is let pass. Raises
    ``LawViolation("verify")`` with ``ir.verify``'s message (naming the node) otherwise.
    The law checks what the pass changed: a node whose op, arguments, ``val`` and inputs'
    ``val`` s are those of its namesake in ``program`` is not fake-run again
    (``ir.verify.verify(..., since=program)``): its check gives what it gives on ``program``,
    whose own stale ``val`` s are excused, so the verdict is that of the whole check.
    Complexity: O(nodes) comparisons plus a fake run per node the pass changed or whose
    inputs it changed.
    """
    if result is None:
        result = _call(pass_fn, program)
    if not isinstance(result, Program):
        raise LawViolation(
            "verify", pass_fn, f"returned a {type(result).__name__}, not a Program", program
        )
    try:
        verify(result, vals=True, since=program)
    except VerifyError as e:
        if _stale_before(program, result):
            return result  # the input's own metadata was stale: not the pass's fault
        raise LawViolation("verify", pass_fn, f"the result does not verify: {e}", program) from e
    return result


def _stale_before(program: Program, result: Program) -> bool:
    """Whether ``result`` fails ``verify(vals=True)`` only by a stale ``val`` that ``program``
    already had: it verifies without the metadata check, and ``program`` fails that check
    too. Run only when the result fails, so a law that holds costs one check."""
    try:
        verify(result)
    except VerifyError:
        return False
    try:
        verify(program, vals=True)
    except VerifyError:
        return True
    return False


def check_determinism(pass_fn: Pass, program: Program, result: Program | None = None) -> Program:
    """Check that a second call gives a result equal to the first that prints the same.

    Equal is :func:`same_program`: ``==``, except that the tensor tables compare by value, so a
    pass that makes a new constant (a new tensor on each call) is deterministic when the two
    tensors have the same dtype, shape, device and bits. ``==`` alone ignores node ``meta``
    (shapes included: see ``Program``), so results that differ only there are also equal.
    """
    first = _call(pass_fn, program) if result is None else result
    second = _call(pass_fn, program)
    if not same_program(first, second):
        raise LawViolation("determinism", pass_fn,
                           f"two calls gave results that differ: {_program_difference(first, second)}",
                           program)
    lines = NodeLines()  # the nodes the two results share (all the pass kept) print once
    if (isinstance(first, Program) and first is not second
            and format_program(first, lines=lines) != format_program(second, lines=lines)):
        raise LawViolation("determinism", pass_fn, "two calls gave results that print differently",
                           program)
    return first


def check_idempotence(pass_fn: Pass, program: Program, result: Program | None = None) -> Program:
    """Check ``pass_fn(pass_fn(program)) == pass_fn(program)``."""
    once = _call(pass_fn, program) if result is None else result
    try:
        twice = _call(pass_fn, once)
    except LawViolation as e:
        raise LawViolation(
            "idempotence", pass_fn, f"applying the pass to its own result: {e.detail}", program
        ) from e.__cause__
    if twice != once:
        raise LawViolation(
            "idempotence", pass_fn, "applying the pass to its own result changed it", program
        )
    return once


def check_inverse(forward: Pass, inverse: Pass, program: Program) -> Program:
    """Check that ``inverse(forward(program))`` is alpha-equivalent to ``program``; return it.

    ``forward``'s result must verify first (``LawViolation("verify")`` naming ``forward``).
    """
    back = _call(inverse, check_verify(forward, program))
    if not alpha_equivalent(back, program):
        raise LawViolation(
            "inverse",
            inverse,
            f"{pass_name(inverse)}({pass_name(forward)}(p)) is not alpha-equivalent to p; it "
            f"is:\n{format_program(back)}",
            program,
        )
    return back


def check_metric(
    pass_fn: Pass,
    program: Program,
    metric: Callable[[Program], Any],
    holds: Callable[[Any, Any], bool],
    name: str,
    result: Program | None = None,
) -> Program:
    """Check ``holds(metric(program), metric(result))``; ``name`` says which relation it is."""
    result = _call(pass_fn, program) if result is None else result
    before, after = metric(program), metric(result)
    if not holds(before, after):
        raise LawViolation(
            "metric", pass_fn, f"{name}: {before!r} before, {after!r} after", program
        )
    return result


def check_semantics(
    pass_fn: Pass,
    program: Program,
    result: Program | None = None,
    *,
    inputs: Inputs | None = None,
    calls: int = 2,
    atol: float | None = None,
    rtol: float | None = None,
    reference: Callable[..., Any] | None = None,
    judged: Judged | None = None,
) -> Program:
    """Check that ``lower(result)`` behaves as ``lower(program)`` over ``calls`` calls.

    Each side runs through the law harness (``ir.harness.outcome``) on equal copies of
    ``inputs(program)`` (default: ``ir.strategies.program_inputs``), call ``i`` with the random
    state seeded ``SEED + i``, so random ops draw the same numbers on both sides and a pass that
    merges, folds or reorders them is seen. After each call the outputs (values and structure,
    taken right after the call), the inputs (which a program may mutate) and every state fqn of
    ``program`` must be equal by ``ir.harness.value_difference`` (NaN equal to NaN only, -0.0
    not +0.0, within the result dtype's tolerance ``ir.harness.tolerance``, or ``atol`` /
    ``rtol`` when given, for a pass that changes numerics on purpose, such as fake
    quantization: then -0.0 equals +0.0); then aliasing: an output that is fresh in ``lower(program)``'s run must
    not share storage with an input, a state tensor or an earlier output in the result's
    (``"outputs [0]: an alias of input 0, the input program's output is fresh"``); an alias the
    input program had may be lost, and two outputs may become one tensor returned twice (a
    merge the result's signature shows, as ``cse`` makes). Both runs go through the law runner
    (``ir.harness.run_side``, ``ir.harness.judge``). The message names the first difference (a
    state one by its fqn). With
    ``reference``, an eager function of the model (``reference(*args, **kwargs)``, run under
    the same seed), the
    outputs are compared with what it returns instead of with ``lower(program)``'s (a pass that
    changes numerics by design); inputs and state are still compared with ``lower(program)``.
    Lowering or running ``program`` itself must work: an error there is not the pass's and
    propagates (running it: a ``RuntimeError`` naming it).

    A tolerance speaks of finite values (``ir.harness.FINITE_TOLERANCE``): with ``atol`` or
    ``rtol`` given, a position where the wanted side (``lower(program)``, or ``reference``)
    is NaN or ±inf is not judged, whatever the result holds there (an approximation gives a
    finite value where the exact function overflowed: exact ``gelu`` of ``inf`` is NaN, its
    tanh form ``inf``); where the wanted side is finite, a result that is not finite or not
    within the tolerance breaks the law. Without a tolerance the comparison is exact at the
    specials (NaN equals NaN only, ±inf itself). ``judged`` (a ``ir.harness.Judged``), when
    given, counts the output positions judged and those excused so, over the calls.

    A pass that returned ``program`` itself (the same object) has no side of its own: the
    result's run would be the input program's again, lowered alike and run under one seed, so
    nothing could differ; the input program is still lowered and run at every call and size
    (an error there propagates), and nothing is compared (with neither ``reference`` nor a
    tolerance; with one, both sides run, so that the positions a tolerance excuses are
    counted).
    """
    _check_tolerance(atol, rtol)
    if inputs is None:
        from ir.strategies.programs import program_inputs as inputs
    result = _call(pass_fn, program) if result is None else result
    # the pass returned its input itself: the result's side would be this very run again
    itself = result is program and reference is None and atol is None and rtol is None
    original = lower(program)
    try:
        lowered = None if itself else lower(result)
    except Exception as e:  # any failure to lower the result breaks the law
        raise LawViolation(
            "semantics", pass_fn, f"lowering the result raised {type(e).__name__}: {e}", program
        ) from e
    fqns = program.state_order
    outputs = "outputs (against the reference's)" if reference is not None else "outputs"
    for at, args, kwargs, seed, sized in _semantics_runs(program, inputs, calls):
        example = Example.of(program, args, kwargs)
        # at the example's sizes, the input program and the reference must run; at other
        # sizes, where either does not, nothing is compared (not the pass's fault)
        want = _run(original, args, kwargs, fqns, seed, None if sized else "the input program")
        if reference is not None and not isinstance(want, str):
            eager = _run(reference, args, kwargs, (), seed, None if sized else "the reference")
            want = eager if isinstance(eager, str) else attrs.evolve(want, outputs=eager.outputs)
        if isinstance(want, str) or lowered is None:
            continue
        got = _run(lowered, args, kwargs, fqns, seed, None)
        if isinstance(got, str):
            raise LawViolation(
                "semantics", pass_fn,
                f"{at}, where the input program runs, the lowered result raised {got} (did the "
                "pass bake a dynamic size in?)" if sized
                else f"{at} of the lowered result raised {got}", program, example=example)
        # an output may alias what the input program wrote in place (``_written``)
        problem = judge(SEMANTICS, got, want, atol=atol, rtol=rtol, outputs=outputs,
                        assumes=_tolerated(atol, rtol),
                        written=_written(program, (*args, *kwargs.values()), want))
        if problem:
            raise LawViolation("semantics", pass_fn, f"{at}: {problem}", program,
                               example=example, output=_output_index(problem))
        if judged is not None:
            judged.add(got.outputs, want.outputs)
    return result


def _tolerated(atol: float | None, rtol: float | None) -> frozenset[str]:
    """The comparison's relaxation under a user's tolerance: ``FINITE_TOLERANCE`` and
    ``no_signed_zeros`` when ``atol`` or ``rtol`` is given (a pass that changes numerics on
    purpose may turn -0.0 into +0.0: fake quantization rounds a small negative value to a zero
    of either sign, and the two differ by nothing any bound measures), else none (exact at
    the specials and the sign of zero)."""
    if atol is None and rtol is None:
        return frozenset()
    return FINITE_TOLERANCE | {"no_signed_zeros"}


def _semantics_runs(program: Program, inputs: Inputs, calls: int) -> Iterator[tuple]:
    """The runs of the semantics law, as ``(at, args, kwargs, seed, sized)``: ``calls`` calls
    on ``inputs(program)`` (seeds ``SEED + i``), then one at each of :func:`other_sizes`
    where inputs can be made (``sized``). Lazy: the other sizes are asked for only once the
    example's calls agree."""
    args, kwargs = inputs(program)
    for i in range(calls):
        yield f"call {i + 1}", args, kwargs, SEED + i, False
    for sizes in other_sizes(program):
        args, kwargs = _inputs_at(program, sizes)
        if args is not None:
            yield f"at {_sizes_text(program, sizes)}", args, kwargs, SEED, True


# --- other sizes of the dynamic dimensions -------------------------------------------------------


def dynamic_symbols(program: Program) -> dict[str, tuple[int, int, int | None]]:
    """Each symbol that is a whole dimension of a root user input: name -> ``(hint, low,
    high)``, ``low`` at least 2 (0 and 1 are sizes torch specializes on), ``high`` ``None``
    when unbounded (the range: ``transforms.kernel.size_range``). Dimensions that are
    expressions of symbols are left out (their sizes follow); ``{}`` for a program without a
    root graph or without dynamic sizes. O(root inputs' dims)."""
    graph = program.root_module.graph
    if graph is None:
        return {}
    users = {s.name for s in program.signature.user_inputs()}
    found: dict[str, tuple[int, int, int | None]] = {}
    for node in graph.placeholders:
        if node.name not in users:
            continue
        val = node.meta.get("val")
        dims = val.shape if isinstance(val, torch.Tensor) else (val,)
        for d in dims:
            if not isinstance(d, torch.SymInt):
                continue
            sym, hint = d.node.expr, d.node.hint
            if not getattr(sym, "is_Symbol", False) or hint is None or str(sym) in found:
                continue
            lo, hi = size_range(program, sym, d.node.shape_env)
            found[str(sym)] = (int(hint), max(lo, 2), hi)
    return found


def other_sizes(program: Program) -> tuple[dict[str, int], ...]:
    """Size sets, other than the example's, at which the purity and semantics laws also run
    ``program``: for each symbol of a dynamic size of a root user input (``s0``, with its hint
    and its range: ``transforms.kernel.size_range``), one set moves every symbol to a near
    size (hint + 1, else hint - 1) and one to another (the range's low end, hint + 3 or hint -
    2), each within the range and at least 2 (0 and 1 are sizes torch specializes on); a
    symbol whose range holds no other size keeps its hint. ``()`` for a program without
    dynamic sizes. Each set gives every symbol (``{"s0": 6}``), as
    ``ir.strategies.program_inputs(program, sizes=...)`` takes it. O(root inputs' dims)."""
    found = dynamic_symbols(program)
    if not found:
        return ()
    sets = []
    for pick in (_near, _far):
        sizes = {name: pick(*bounds) for name, bounds in found.items()}
        if any(sizes[n] != found[n][0] for n in sizes) and sizes not in sets:
            sets.append(sizes)
    return tuple(sets)


def _near(hint: int, lo: int, hi: int | None) -> int:
    return next((x for x in (hint + 1, hint - 1) if _fits(x, lo, hi)), hint)


def _far(hint: int, lo: int, hi: int | None) -> int:
    near = _near(hint, lo, hi)
    return next((x for x in (lo, hint + 3, hint - 2)
                 if x not in (hint, near) and _fits(x, lo, hi)), hint)


def _fits(x: int, lo: int, hi: int | None) -> bool:
    return x >= lo and (hi is None or x <= hi)


def _sizes_text(program: Program, sizes: dict[str, int]) -> str:
    known = dynamic_sizes(program)
    return "other sizes of its dynamic dimensions (" + ", ".join(
        f"{k}={v}" + (f": {known[k]}" if k in known else "") for k, v in sizes.items()
    ) + ")"


def _inputs_at(program: Program, sizes: dict[str, int]) -> tuple[Any, Any]:
    from ir.strategies.programs import program_inputs

    try:
        return program_inputs(program, sizes=sizes)
    except Exception:  # noqa: BLE001 - no inputs there: nothing to run
        return None, None


def _state_of(module: Any, fqns: tuple[str, ...]) -> Callable[[], dict[str, Any]]:
    return lambda: {fqn: state_value(module, fqn, MISSING) for fqn in fqns}


def _runs_at(program: Program, made: list[tuple[Any, Any]]) -> list[Any]:
    """What ``lower(program)`` does on each of the inputs ``made`` (``_inputs_at``): the
    ``Ran`` (values or error), or ``None`` where no inputs or no lowering could be made."""
    if not made:
        return []
    try:
        module = lower(program)
    except Exception:  # noqa: BLE001 - not lowerable: the semantics law says so
        return [None] * len(made)
    return [None if args is None else run_side(
        module, args, kwargs, seed=SEED, state=_state_of(module, program.state_order))
        for args, kwargs in made]


def _changed_at(program: Program, sets: tuple[dict[str, int], ...], made: list[Any],
                before: list[Any]) -> list[str]:
    """How ``lower(program)`` now differs, on the inputs ``made`` at each size set, from what
    it did (``before``)."""
    if not sets:
        return []
    after = _runs_at(program, made)
    problems = []
    for sizes, was, now in zip(sets, before, after):
        if was is None or now is None:
            continue
        at = _sizes_text(program, sizes)
        if was.ok != now.ok or (not was.ok and was.error != now.error):
            did = "ran" if was.ok else "raised " + ": ".join(was.error)
            does = "runs" if now.ok else "raises " + ": ".join(now.error)
            problems.append(f"at {at} the input program {did} before the pass and {does} "
                            "after it")
        elif was.ok:
            found = judge(SEMANTICS, now.observed, was.observed)
            if found is not None:
                problems.append(f"at {at} the input program computes something else after the "
                                f"pass: {found}")
    return problems


def _fake_mode(program: Program) -> Any:
    """The fake mode of ``program``'s ``val`` s (the first fake tensor's), else ``None``."""
    for _, mid in program.walk():
        for graph in program.module_table()[mid].graphs:
            for node in graph.nodes:
                v = node.meta.get("val")
                if isinstance(v, torch.Tensor):
                    return getattr(v, "fake_mode", None)
    return None


def _symbols_text(program: Program, symbols: tuple[str, ...]) -> str:
    known = dynamic_sizes(program)
    return ", ".join(f"{s}: {known[s]}" if s in known else s for s in symbols) or "a size"


def _guard_state(env: Any) -> Any:
    """What a guard changes in a shape env: how many guards, its replacements and ranges."""
    if env is None:
        return None
    return (len(env.guards), dict(env.replacements), dict(env.var_to_range))


def _guards_added(env: Any, before: Any) -> str:
    """What ``env`` gained since ``before`` (``_guard_state``): guards, replacements, narrower
    ranges of the symbols it had; ``""`` when nothing."""
    if env is None or before is None:
        return ""
    count, replacements, ranges = before
    found = [f"guard {g.expr}" for g in env.guards[count:]]
    found += [f"replacement {k} -> {v}" for k, v in env.replacements.items()
              if replacements.get(k) != v]
    found += [f"range {k}: {ranges[k]} -> {v}" for k, v in env.var_to_range.items()
              if k in ranges and ranges[k] != v]
    return ", ".join(found[:4]) + (f" (and {len(found) - 4} more)" if len(found) > 4 else "")


# --- all laws on one program --------------------------------------------------------------------


def check_program(
    pass_fn: Pass,
    program: Program,
    *,
    idempotent: bool = False,
    laws: Collection[str] | None = None,
    inputs: Inputs | None = None,
    allowed_errors: tuple[type[BaseException], ...] = (),
    atol: float | None = None,
    rtol: float | None = None,
    reference: Callable[..., Any] | None = None,
    judged: Judged | None = None,
) -> Program | None:
    """Check every law in ``laws`` (default: purity, verify, determinism, semantics, and
    idempotence when ``idempotent``) for ``pass_fn`` on ``program``; return the result.

    The pass runs twice (three times with idempotence) and each law reuses those results.
    An error of a type in ``allowed_errors`` means the pass declines this program: nothing more
    is checked and ``None`` is returned. An ``ir.errors.EditRefused`` (purefx's editor refusing
    an edit the pass asked for: a write left undone, a dynamic size fixed) is not declined but
    broken (law ``"edit_refused"``), even where ``allowed_errors`` admit ``PassError``, unless
    they name ``EditRefused`` itself. ``atol``, ``rtol``, ``reference`` and ``judged`` go
    to :func:`check_semantics`. Raises ``LawViolation`` naming the first law broken.
    """
    chosen = _check_laws_arg(laws, idempotent)
    try:
        result = (check_purity if "purity" in chosen else _call)(pass_fn, program)
    except LawViolation as e:
        cause = e.__cause__
        if e.law == "raises" and allowed_errors and isinstance(cause, allowed_errors):
            return None
        if e.law == "edit_refused" and any(issubclass(t, EditRefused) for t in allowed_errors):
            return None  # named outright: the user declines what the editor refuses
        raise
    if "verify" in chosen or "semantics" in chosen or "idempotence" in chosen:
        check_verify(pass_fn, program, result)
    if "determinism" in chosen:
        check_determinism(pass_fn, program, result)
    if "semantics" in chosen:
        check_semantics(pass_fn, program, result, inputs=inputs, atol=atol, rtol=rtol,
                        reference=reference, judged=judged)
    if "idempotence" in chosen:
        check_idempotence(pass_fn, program, result)
    return result


def check_laws(
    pass_fn: Pass,
    *,
    programs: Any = None,
    max_examples: int | None = None,
    idempotent: bool = False,
    laws: Collection[str] | None = None,
    inputs: Inputs | None = None,
    allowed_errors: tuple[type[BaseException], ...] = (),
    settings: Any = None,
    atol: float | None = None,
    rtol: float | None = None,
    reference: Callable[..., Any] | None = None,
    allow_vacuous: bool = False,
    seed: int | None = None,
    shrink_calls: int | None = SHRINK_CALLS,
) -> LawReport:
    """Run hypothesis over ``programs`` and check ``pass_fn`` against the laws on each.

    Parameters:
        pass_fn: the pass, ``Program -> Program``.
        programs: a hypothesis strategy of Programs (default: ``ir.strategies.programs()``, flat
            programs as ``import_ep`` gives them, with the ops users' passes target). Map it
            through earlier passes to check a pass that expects their output, e.g.
            ``programs().map(outline)``. ``lowering.like.programs_like(ep)`` draws your own
            model's program and variants of it (``LikeExample`` s, each with its inputs).
            With the default, the budget is spent in two phases (``lowering.law_targets``):
            a first share of default programs (40 %), then the rest on programs rich in the
            operators the pass was found to change (``programs(ops=...)``): found from the
            programs it changed, or, when it changed none, by applying it to probe programs
            of the operator table's forms (no law checked there). The report names the forms
            (``LawReport.targets``) and says when it changed fewer than one default program
            in five. Found from the pass's results alone, never its name.
        max_examples: how many programs (default: the settings' own), over both phases.
        idempotent: also check ``pass_fn(pass_fn(p)) == pass_fn(p)``.
        laws: a subset of :data:`LAWS` to check instead of the default.
        inputs: ``program -> (args, kwargs)`` for the semantics law (default: a
            ``LikeExample``'s own inputs, else ``ir.strategies.program_inputs``).
        allowed_errors: exception types with which the pass may decline a program. An
            ``ir.errors.EditRefused`` (the editor refusing the pass's edit) is a violation
            (law ``"edit_refused"``) whatever they say of ``PassError``, unless they name
            ``EditRefused``: a bug in the pass, not a program it declines.
        settings: hypothesis settings to start from. Default: the active profile (under
            purefx's pytest, ``ci``); outside a test suite, where one of hypothesis's own profiles
            is active (``default``, or its ``ci`` under a ``CI`` variable), derandomized settings without an example database, so a run is
            repeatable and writes no ``.hypothesis`` directory. Deadline, the too-slow health
            check, multi-bug reporting and hypothesis's explain phase (reruns on variations of
            the shrunk program, after it is found) are always turned off (the one law loop's
            policy: ``ir.harness.hold``, ``ir.harness.law_settings``).
        atol, rtol: tolerances of the semantics law, for a pass that changes numerics on purpose
            (fake quantization); default: the result dtype's (``ir.harness.tolerance``). A
            tolerance speaks of finite values: where the reference (the input program, or
            ``reference``) is NaN or ±inf a position is not judged; where it is finite the
            result must be finite and within the tolerance (``check_semantics``). The report
            counts the positions excused (``LawReport.excused``).
        reference: an eager function of the model, ``reference(*args, **kwargs)``; the semantics
            law compares the result's outputs with it instead of with the input program (a pass
            that changes numerics by design). It is called on each draw's inputs, so it fits
            ``programs=programs_like(ep)`` (on the draws that keep the source's signature; on
            a draw with an extra output or reader, which the reference does not return, every
            law but semantics is checked) or ``st.just(program)``.
        allow_vacuous: accept a pass that changed none of the programs tried.
        seed: ``None`` (default): the draws are the settings' (derandomized outside a suite
            and under purefx's ``ci`` profile: the same programs on every run). An int: random
            draws seeded by it, no example database read or written (``ir.harness.hold``):
            run a pass under several seeds to check it on more than one stream of programs.
        shrink_calls: once a program breaks a law, hypothesis shrinks it; shrinking stops
            after this many more calls, and the smallest failure found is raised
            (``ir.harness.shrink_calls.ShrinkCalls``: counted in calls, not seconds, so a
            derandomized run reports the same program on any machine). Default
            :data:`SHRINK_CALLS`; ``None``: hypothesis shrinks as long as it likes (minutes on
            a large program).

    Which programs are drawn never depends on ``pass_fn``: not its name, its source or its
    identity. Derandomized, the stream is keyed by the laws checked alone (``programs``
    decides what the stream builds), so the same bug under another name, or in a function
    spaced otherwise, is checked on the same programs and gets the same verdict. Hypothesis's
    example database (where the settings keep one) is keyed alike: a failure saved for one pass
    is replayed for the next pass checked with the same laws, one more example for it and
    harmless.

    Returns a :class:`LawReport` when every law holds on every program tried. Raises
    ``LawViolation`` for the shrunk program that breaks one (its message names the law and
    prints the program; its ``tried`` counts the programs judged up to it, that one included),
    and ``LawViolation("vacuous")`` when the pass changed none of the
    programs it ran on (its result was :func:`same_program` as its input once dead code is
    removed from both, metadata checks included, or it declined them), unless ``allow_vacuous``: a pass checked on programs it never touches is not checked.
    Likewise, with ``atol``/``rtol``, when on every program it checked the semantics law
    judged no output position (each compared one excused: the reference NaN or ±inf there;
    ``LawReport.unjudged``).
    """
    _check_laws_arg(laws, idempotent)
    _check_tolerance(atol, rtol)
    if shrink_calls is not None:
        ShrinkCalls(shrink_calls)  # a bad value is refused before anything is drawn
    default_programs = programs is None
    if programs is None:
        from ir.strategies.programs import programs as default

        programs = default()
    counts = {"tried": 0, "changed": 0, "declined": 0, "unjudged": 0, "excused": 0}
    targeting = default_programs  # the default programs: a first phase, then the targets
    pairs: list[tuple[Program, Any]] = []
    # what a tolerance left unjudged, counted around each program's check; bound to the name
    # laws_hold calls so that its text, which seeds hypothesis's derandomized draws, is kept
    judged_program = functools.partial(_judged_program, counts)
    latest: list[_Shown] = []  # the draw laws_hold runs on (set as it is drawn)

    def shown(drawn: Any) -> _Shown:
        latest[:] = [_Shown(drawn)]
        return latest[0]

    def check_program(run: Pass, program: Program, **kwargs: Any) -> Program | None:
        # a LikeExample that draws a state write (``steps += 1 before its reads``) computes what
        # the eager reference does not: as on an extra output, every law but semantics (the
        # reference's pass may change numerics on purpose, so the drawn program is no judge
        # either; laws_hold's text is kept as it is: it seeds the draws)
        here = latest[0] if latest and latest[0].program is program else None
        if (kwargs.get("reference") is not None and here is not None
                and not getattr(here.drawn, "matches_reference", True)):
            laws_here = _check_laws_arg(kwargs.get("laws"), kwargs.get("idempotent", False))
            kwargs["laws"] = laws_here - {"semantics"}
        result = judged_program(run, program, **kwargs)
        if targeting:  # the first phase's pairs, where the pass's targets are looked for
            pairs.append((program, result))
        return result

    def laws_hold(example: _Shown) -> None:
        drawn = example.drawn  # a Program, or a LikeExample carrying its inputs
        here_inputs, here_laws = inputs, laws
        if drawn is not example.program:
            here_inputs = inputs or drawn.inputs
            if reference is not None and not drawn.keeps_signature:
                # an extra output the reference does not return: every law but semantics
                here_laws = _check_laws_arg(laws, idempotent) - {"semantics"}
        result = check_program(
            pass_fn, example.program, idempotent=idempotent, laws=here_laws, inputs=here_inputs,
            allowed_errors=allowed_errors, atol=atol, rtol=rtol, reference=reference,
        )
        counts["tried"] += 1
        if result is None:
            counts["declined"] += 1
        elif _changed_live(result, example.program):
            counts["changed"] += 1

    def run(draws: Any, examples: int | None, *more_key: Any) -> None:
        # keyed by the laws (and the targets found) alone, never by the pass: a bug is
        # caught or missed whatever its name
        try:
            hold(Trial(SEMANTICS, draws.map(shown), laws_hold,
                       key=("check_laws", sorted(_check_laws_arg(laws, idempotent)), *more_key),
                       budget=None if shrink_calls is None
                       else ShrinkCalls(shrink_calls, LawViolation)),
                 settings=settings, max_examples=examples, seed=seed)
        except LawViolation as found:
            found.tried = counts["tried"] + 1  # the programs judged up to this one
            raise
        except Exception as flaky:  # hypothesis's FlakyFailure: see _first_violation
            found = _first_violation(flaky)
            if found is None:
                raise
            found.tried = counts["tried"] + 1
            raise found from flaky

    targets, note = None, ""
    if not default_programs:
        run(programs, max_examples)
    else:  # a first phase of default programs, then the rest on the pass's own targets
        from ir.harness.loop import law_settings
        from lowering import law_targets

        total = law_settings(settings, max_examples=max_examples).max_examples
        first = law_targets.first_phase(total)
        run(programs, first)
        targeting = False
        tried, changed = counts["tried"], counts["changed"]
        targets = (law_targets.targets_from_changes(pairs) if changed
                   else law_targets.probe_table(pass_fn))
        pairs.clear()
        rest = total - first
        if rest and targets.operators:
            run(law_targets.targeted_programs(targets.operators), rest, "targets",
                targets.operators)
        elif rest:
            run(programs, rest, "rest")
        note = law_targets.report_note(targets, tried, changed, rest)
    report = LawReport(**counts, targets=targets.forms if targets else (), note=note)
    if not report.changed and not allow_vacuous:
        raise LawViolation(
            "vacuous", pass_fn,
            f"VACUOUS: the pass changed none of the {report.tried} programs it ran on "
            f"({report}; dead code removed from both sides), so no law was put to the test; give programs it changes, or pass "
            "allow_vacuous=True if changing nothing is right"
            + (f" (nor any call of the {targets.probed} forms of the operator table probed)"
               if targets is not None and targets.probed and not targets.forms else ""),
            None,
        )
    if report.unjudged and report.unjudged >= report.tried - report.declined and (
            not allow_vacuous):
        raise LawViolation(
            "vacuous", pass_fn,
            f"VACUOUS: on each of the {report.unjudged} programs checked, the reference's "
            "outputs were NaN or inf wherever they were compared, and a tolerance (atol/rtol) "
            f"judges finite values only ({report}), so the semantics law judged no value; give "
            "programs whose outputs are finite (programs_like(ep, edge_values=False))",
            None,
        )
    return report


def _judged_program(counts: dict[str, int], *args: Any, **kwargs: Any) -> Program | None:
    """``check_program(*args, **kwargs)`` counting in ``counts`` the output positions a
    tolerance excused (``"excused"``) and the program when it judged none (``"unjudged"``)."""
    seen = Judged()
    result = check_program(*args, judged=seen, **kwargs)
    counts["excused"] += seen.excused
    counts["unjudged"] += seen.excused > 0 and seen.judged == 0
    return result


def _first_violation(group: BaseException) -> LawViolation | None:
    """The first ``LawViolation`` in exception group ``group`` (hypothesis's ``FlakyFailure``):
    a pass that damaged its input where the purity law saw it (an in-place write to a table
    the input holds) breaks the law on the first run and not on hypothesis's replay, which
    then reports the run as flaky; the violation is the answer."""
    for exc in getattr(group, "exceptions", ()):
        if isinstance(exc, LawViolation):
            return exc
        found = _first_violation(exc)
        if found is not None:
            return found
    return None


def _changed_live(result: Any, program: Program) -> bool:
    """Whether ``result`` differs from ``program`` once dead code is removed from both
    (``transforms.eliminate_dead_code(p, metadata_checks=False)``: metadata checks such as
    ``_assert_tensor_metadata`` dropped first, they compute nothing): what ``check_laws`` counts as a change, so a pass
    whose only edit is a value nothing reads is vacuous. O(size of the programs)."""
    if same_program(result, program):
        return False
    if not isinstance(result, Program):
        return True
    return not same_program(_live(result), _live(program))


def _live(p: Program) -> Program:
    """``p`` without dead code, metadata checks included (``eliminate_dead_code(p,
    metadata_checks=False)``)."""
    from transforms.passes.dce import eliminate_dead_code

    return eliminate_dead_code(p, metadata_checks=False)


class _Shown:
    """A drawn program (or ``LikeExample``) that hypothesis prints as text, not as a nested
    attrs repr: with its vals (``format_program(p, vals=True)``), so the falsifying example
    parses back into a program that runs."""

    __slots__ = ("drawn", "program")

    def __init__(self, drawn: Any) -> None:
        self.drawn = drawn
        self.program = drawn if isinstance(drawn, Program) else drawn.program

    def __repr__(self) -> str:
        if self.drawn is not self.program:
            return (f"\n{self.drawn.variant}\n" + describe(self.program, vals=True)
                    + f"\ninputs: {self.drawn.args!r} {self.drawn.kwargs!r}\n")
        return "\n" + describe(self.program, vals=True) + "\n"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # hypothesis prints this for the falsifying example


def _check_laws_arg(laws: Collection[str] | None, idempotent: bool) -> frozenset[str]:
    if laws is None:
        return frozenset(CORE_LAWS + (("idempotence",) if idempotent else ()))
    if isinstance(laws, str) or not all(law in LAWS for law in laws):
        raise ValueError(f"laws must be a collection of names from {LAWS}, got {laws!r}")
    return frozenset(laws) | ({"idempotence"} if idempotent else set())


# --- helpers ------------------------------------------------------------------------------------


def _call(pass_fn: Pass, program: Program) -> Program:
    try:
        return pass_fn(program)
    except LawViolation:
        raise
    except EditRefused as e:  # purefx's editor refused the pass's edit: a bug found, not declined
        raise LawViolation(
            "edit_refused", pass_fn, f"purefx's editor refused an edit of the pass (a bug in "
            f"the pass, not a program it declines): {e}", program
        ) from e
    except Exception as e:  # a pass raising on a valid program breaks it
        raise LawViolation(
            "raises", pass_fn, f"the pass raised {type(e).__name__}: {e}", program
        ) from e


def _run(module: Callable[..., Any], args: tuple, kwargs: dict, fqns: tuple[str, ...],
         seed: int, whose: str | None) -> Observed | str:
    """One side of the semantics law through the law runner (``ir.harness.run_side``: copies
    of the inputs, the random state seeded with ``seed``; outputs, inputs after the call, state
    by fqn read from the module, the outputs' aliasing read before anything is copied). When
    the call raises: an error naming ``whose`` run it was, or (``whose`` is ``None``: the
    pass's result) the error's ``"Type: first line"`` as a string."""
    ran = run_side(module, args, kwargs, seed=seed, state=_state_of(module, fqns))
    if not ran.ok:
        name, line = ran.error
        if whose is None:
            return f"{name}: {line}"
        raise RuntimeError(f"running {whose} raised {name}: {line} (not the pass's fault)")
    return ran.observed


SEMANTICS = Law("semantics", side="the input program's output is", alias_may_be_fresh=True,
                repeated_outputs=True)
"""The semantics law as a value (``ir.harness.Law``): outputs, inputs after the call, state and
aliasing compared. An output fresh in the input program's run must stay fresh: a result whose
output is a view of an input, of state or of another output (a caller writing it then writes
that too) breaks the law. An alias the input program had may be lost (a pass may copy a view
it returns), and two outputs that computed one value may become one tensor returned twice
(``cse``'s contract; the result's signature names one value at both output specs)."""


def _written(program: Program, before: tuple, want: Observed) -> frozenset[str]:
    """The inputs (``"input i"``: changed by the input program's call) and state (what
    ``ir.effects.state_written`` says a call may write: mutation outputs, in-place writes at
    either level, tied state) the input program writes in place."""
    inputs = {f"input {i}" for i, (b, a) in enumerate(zip(before, want.inputs))
              if isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor)
              and not _same_bits(b, a)}
    state = {f"state {f!r}" for f in program.state_order if state_written(program, f)}
    return frozenset(inputs | state)


def _output_index(found: Difference) -> int | None:
    """The root output a difference is in (its first index under ``outputs``), else ``None``."""
    if found.what.startswith("outputs") and found.path and type(found.path[0]) is int:
        return found.path[0]
    return None


def _check_tolerance(atol: object, rtol: object) -> None:
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value >= 0):
            raise ValueError(f"{name} must be a non-negative number or None, got {value!r}")


# --- programs compared with tensors by value ----------------------------------------------------


def same_program(a: Any, b: Any) -> bool:
    """``a == b`` for Programs, except that their tensor tables compare by value.

    Two Programs are the same when they are ``==`` once their tensor tables and range
    constraints are set aside, their range constraints bound the same symbols alike, and
    their tensor tables have the same keys with, under each key, the same object or two tensors
    of the same dtype, shape, device and bits (NaNs included). So a pass that makes a new
    constant on each call gives the same result twice. Like ``==``, it ignores node ``meta``.
    Anything other than two Programs compares with ``==``. Complexity: O(size of the programs
    + bytes of the tensors that are not shared).
    """
    if a is b:
        return True
    if not isinstance(a, Program) or not isinstance(b, Program):
        return bool(a == b)
    return (_tensor_difference(a, b) is None and _ranges(a) == _ranges(b)
            and a.replace(tensors=b.tensors, range_constraints=b.range_constraints) == b)


def _ranges(p: Program) -> tuple:
    """``p``'s range constraints by value: each symbol's name and bounds, sorted (two exports
    of one program make equal constraints in objects of their own)."""
    found = p.range_constraints.value or {}
    return tuple(sorted((str(k), str(v.lower), str(v.upper)) for k, v in found.items()))


def _tensor_difference(a: Program, b: Program) -> str | None:
    if a.tensors is b.tensors:
        return None
    keys_a, keys_b = set(a.tensors.keys()), set(b.tensors.keys())
    if keys_a != keys_b:
        return f"tensor keys {sorted(keys_a ^ keys_b)} are in one result only"
    for key in sorted(keys_a):
        x, y = a.tensors[key].value, b.tensors[key].value
        if x is not y and not _same_bits(x, y):
            a, b = _describe_value(x), _describe_value(y)
            return f"tensor {key!r} differs: " + (f"{a}s of other values" if a == b
                                                  else f"{a} and {b}")
    return None


def _same_bits(x: Any, y: Any) -> bool:
    """``ir.harness.same_bits`` for two tensors of one type (a Parameter is no plain tensor)
    that agree on ``requires_grad``; meta tensors by dtype, shape and device alone."""
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return False
    if (type(x), x.requires_grad) != (type(y), y.requires_grad):
        return False
    if x.device.type == "meta" or y.device.type == "meta":
        return (x.dtype, x.shape, x.device) == (y.dtype, y.shape, y.device)
    return same_bits(x, y)


def _describe_value(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{type(x).__name__}({tuple(x.shape)}, {x.dtype}, {x.device})"
    return type(x).__name__


def _program_difference(a: Any, b: Any) -> str:
    """A short account of how two results of one pass differ (for the determinism law)."""
    if not isinstance(a, Program) or not isinstance(b, Program):
        return f"{type(a).__name__} and {type(b).__name__}"
    tensors = _tensor_difference(a, b)
    if tensors:
        return tensors
    for field in attrs.fields(Program):
        if getattr(a, field.name) != getattr(b, field.name):
            if field.name == "modules":
                text_a, text_b = format_program(a).splitlines(), format_program(b).splitlines()
                for line_a, line_b in zip(text_a, text_b):
                    if line_a != line_b:
                        return f"the programs print {line_a.strip()!r} and {line_b.strip()!r}"
            return f"their {field.name} differ"
    return "they are not =="


SNAPSHOT_BYTES = 1 << 28
"""The purity law copies the input's tensors (up to this many bytes in all) to see writes that
bump no version counter (``w.data.copy_(...)``); past it, only versions are compared."""


def _tensor_snapshot(program: Program) -> dict[str, torch.Tensor]:
    """A copy of each (non-meta) tensor ``program`` holds, by table key; ``{}`` past
    ``SNAPSHOT_BYTES``. O(bytes of the tensors)."""
    snapshot, total = {}, 0
    for key, held in program.tensors.items():
        x = held.value
        if isinstance(x, torch.Tensor) and x.device.type != "meta" and x.layout == torch.strided:
            total += x.nbytes
            if total > SNAPSHOT_BYTES:
                return {}
            snapshot[key] = x.detach().clone()
    return snapshot


def _written_behind_versions(program: Program, snapshot: dict[str, torch.Tensor]) -> list[str]:
    """Table keys whose tensor no longer has the bits ``snapshot`` holds."""
    return sorted(key for key, copy in snapshot.items()
                  if not same_bits(program.tensors[key].value.detach(), copy))


def _meta_fingerprint(program: Program) -> tuple:
    rows = []
    for mid in sorted(program.modules.keys()):
        for graph in program.modules[mid].graphs:
            for node in graph.nodes:
                rows.append(tuple(
                    (k, tuple(v.items()) if k == "nn_module_stack" and isinstance(v, dict)
                     else id(v))
                    for k, v in node.meta.items()
                ))
    return tuple(rows)


def _copy_tree(tree: Any) -> Any:
    if type(tree) is tuple:
        return tuple(_copy_tree(x) for x in tree)
    if type(tree) is IList:
        return IList(tuple(_copy_tree(x) for x in tree.items))
    if type(tree) is IDict:
        return IDict(tuple((k, _copy_tree(v)) for k, v in tree.items))
    if type(tree) is ISlice:
        return ISlice(_copy_tree(tree.start), _copy_tree(tree.stop), _copy_tree(tree.step))
    return tree


def _copy_node(node: Node) -> Node:
    return Node(node.op, node.name, node.target, _copy_tree(node.args), _copy_tree(node.kwargs),
                node.meta)


def _copy_program(p: Program) -> Program:
    """A structural copy sharing only leaves (strings, targets, tensors, specs): if a pass writes
    into ``p`` (``object.__setattr__`` on a frozen value, say), ``p == copy`` fails."""
    modules = {
        mid: Module(
            mod.type_name, mod.kind, tuple(mod.children),
            tuple(Graph(tuple(_copy_node(n) for n in g.nodes)) for g in mod.graphs), mod.leaf,
            tuple(mod.peers),
        )
        for mid, mod in p.modules.items()
    }
    signature = ExportSignature(
        tuple(attrs.evolve(s) for s in p.signature.inputs),
        tuple(attrs.evolve(s) for s in p.signature.outputs),
    )
    calls = {
        name: CallSignature(
            tuple(attrs.evolve(a) for a in sig.inputs), tuple(attrs.evolve(a) for a in sig.outputs),
            sig.in_spec, sig.out_spec, sig.forward_arg_names,
        )
        for name, sig in p.call_signatures.items()
    }
    return Program(
        root=p.root,
        modules=pmap(modules),
        state=pmap({k: attrs.evolve(v) for k, v in p.state.items()}),
        state_order=tuple(p.state_order),
        tensors=pmap(dict(p.tensors.items())),
        signature=signature,
        call_signatures=pmap(calls),
        call_order=tuple(p.call_order),
        range_constraints=p.range_constraints,
    )
