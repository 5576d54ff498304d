"""Law checkers: test a pass ``Program -> Program`` against the laws every purefx pass obeys.

The laws (``DESIGN.md``), each a public function usable without hypothesis:

- **purity** (:func:`check_purity`): the input Program is ``==`` to a snapshot taken before the
  call, its node meta is as it was, no tensor it holds was written (``_version``), and nothing
  was printed;
- **verify** (:func:`check_verify`): the result is a Program and ``ir.verify`` accepts it;
- **determinism** (:func:`check_determinism`): two calls on the same input give ``==`` results
  that print the same;
- **semantics** (:func:`check_semantics`): ``lower(result)`` returns what ``lower(input)``
  returns, and leaves the same state and the same (mutated) inputs, over several calls;
- **idempotence** (:func:`check_idempotence`), for normalizing passes: ``T(T(p)) == T(p)``;
- **inverse** (:func:`check_inverse`): ``inverse(forward(p))`` is alpha-equivalent to ``p``;
- **metric** (:func:`check_metric`): a measure of the result relates to that of the input
  (e.g. deduplication never adds modules).

:func:`check_program` runs the first five on one program, sharing the work; :func:`check_laws`
runs it under hypothesis over generated programs and raises :class:`LawViolation` (an
``AssertionError``) naming the law, with the shrunk program printed::

    from transforms.laws import check_laws
    check_laws(my_pass)                      # purity, verify, determinism, semantics
    check_laws(my_pass, idempotent=True)     # ... and T(T(p)) == T(p)
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Collection
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir.alpha import alpha_equivalent
from ir.args import IDict, IList, ISlice
from ir.errors import VerifyError
from ir.graph import Graph
from ir.module import Module
from ir.node import Node
from ir.printer import format_program
from ir.program import Program
from ir.purity import program_tensor_versions
from ir.signature import CallSignature, ExportSignature
from ir.torch_seam import pytree
from ir.verify import verify
from transforms.law_violation import LawViolation, describe, pass_name

__all__ = [
    "LAWS",
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
]

Pass = Callable[[Program], Program]
Inputs = Callable[[Program], "tuple[tuple, dict]"]

LAWS = ("purity", "verify", "determinism", "semantics", "idempotence")
"""The laws :func:`check_program` knows, in the order it checks them."""

CORE_LAWS = ("purity", "verify", "determinism", "semantics")


# --- single laws --------------------------------------------------------------------------------


def check_purity(pass_fn: Pass, program: Program) -> Program:
    """Run ``pass_fn(program)`` and check that it left ``program`` as it was; return the result.

    Checks that ``program`` is ``==`` to a structural copy taken before the call, that every
    node's meta has the same keys, module stack and values (by identity), that no tensor of its
    table was written (``_version``), and that nothing was printed to stdout. Raises
    ``LawViolation("purity")`` otherwise, or ``LawViolation("raises")`` when the pass raises.
    """
    before = _copy_program(program)
    meta = _meta_fingerprint(program)
    versions = program_tensor_versions(program)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = _call(pass_fn, program)
    problems = []
    if program != before:
        problems.append("the input Program is no longer == to its snapshot")
    if _meta_fingerprint(program) != meta:
        problems.append("the input's node meta changed")
    after = program_tensor_versions(program)
    if after != versions:
        written = sorted(k for k, a, b in _version_diff(program, versions, after) if a != b)
        problems.append(f"tensors of the input were written: {written}")
    if printed.getvalue():
        problems.append(f"it printed {printed.getvalue()[:200]!r}")
    if problems:
        raise LawViolation("purity", pass_fn, "; ".join(problems), program)
    return result


def check_verify(pass_fn: Pass, program: Program, result: Program | None = None) -> Program:
    """Check that ``pass_fn(program)`` (or the given ``result``) is a Program that verifies."""
    if result is None:
        result = _call(pass_fn, program)
    if not isinstance(result, Program):
        raise LawViolation(
            "verify", pass_fn, f"returned a {type(result).__name__}, not a Program", program
        )
    try:
        verify(result)
    except VerifyError as e:
        raise LawViolation("verify", pass_fn, f"the result does not verify: {e}", program) from e
    return result


def check_determinism(pass_fn: Pass, program: Program, result: Program | None = None) -> Program:
    """Check that a second call gives a result ``==`` to the first and printed the same."""
    first = _call(pass_fn, program) if result is None else result
    second = _call(pass_fn, program)
    if first != second:
        raise LawViolation("determinism", pass_fn, "two calls gave results that are not ==",
                           program)
    if isinstance(first, Program) and format_program(first) != format_program(second):
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
) -> Program:
    """Check that ``lower(result)`` behaves as ``lower(program)`` over ``calls`` calls.

    Both modules get equal copies of ``inputs(program)`` (default:
    ``ir.strategies.program_inputs``) on every call; after each call the outputs (values and
    pytree structure, taken right after the call), the inputs (which a program may mutate) and
    every state fqn of ``program`` must be equal (``torch.testing.assert_close``, NaN equal to
    NaN). Lowering or running ``program`` itself must work: an error there is not the pass's
    and propagates as is.
    """
    # the one law that needs torch modules; imported here so that importing ``transforms``
    # never imports ``lowering`` (which may import ``transforms`` for its default pipeline)
    from lowering import lower

    if inputs is None:
        from ir.strategies.programs import program_inputs as inputs
    result = _call(pass_fn, program) if result is None else result
    reference = lower(program)
    try:
        lowered = lower(result)
    except Exception as e:  # any failure to lower the result breaks the law
        raise LawViolation(
            "semantics", pass_fn, f"lowering the result raised {type(e).__name__}: {e}", program
        ) from e
    args, kwargs = inputs(program)
    fqns = program.state_order
    for i in range(calls):
        want = _run(reference, args, kwargs, fqns)
        try:
            got = _run(lowered, args, kwargs, fqns)
        except Exception as e:
            raise LawViolation(
                "semantics", pass_fn,
                f"call {i + 1} of the lowered result raised {type(e).__name__}: {e}", program,
            ) from e
        for what, a, b in zip(("outputs", "inputs after the call", "state after the call"),
                              got, want):
            problem = _difference(a, b)
            if problem:
                raise LawViolation(
                    "semantics", pass_fn, f"call {i + 1}: {what} differ: {problem}", program
                )
    return result


# --- all laws on one program --------------------------------------------------------------------


def check_program(
    pass_fn: Pass,
    program: Program,
    *,
    idempotent: bool = False,
    laws: Collection[str] | None = None,
    inputs: Inputs | None = None,
    allowed_errors: tuple[type[BaseException], ...] = (),
) -> Program | None:
    """Check every law in ``laws`` (default: purity, verify, determinism, semantics, and
    idempotence when ``idempotent``) for ``pass_fn`` on ``program``; return the result.

    The pass runs twice (three times with idempotence) and each law reuses those results.
    An error of a type in ``allowed_errors`` means the pass declines this program: nothing more
    is checked and ``None`` is returned. Raises ``LawViolation`` naming the first law broken.
    """
    chosen = _check_laws_arg(laws, idempotent)
    try:
        if "purity" in chosen:
            result = check_purity(pass_fn, program)
        else:
            result = _call(pass_fn, program)
    except LawViolation as e:
        cause = e.__cause__
        if e.law == "raises" and allowed_errors and isinstance(cause, allowed_errors):
            return None
        raise
    if "verify" in chosen or "semantics" in chosen or "idempotence" in chosen:
        check_verify(pass_fn, program, result)
    if "determinism" in chosen:
        check_determinism(pass_fn, program, result)
    if "semantics" in chosen:
        check_semantics(pass_fn, program, result, inputs=inputs)
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
) -> None:
    """Run hypothesis over ``programs`` and check ``pass_fn`` against the laws on each.

    Parameters:
        pass_fn: the pass, ``Program -> Program``.
        programs: a hypothesis strategy of Programs (default: ``ir.strategies.programs()``, flat
            programs as ``import_ep`` gives them). Map it through earlier passes to check a pass
            that expects their output, e.g. ``programs().map(outline)``.
        max_examples: how many programs (default: the active hypothesis profile's).
        idempotent: also check ``pass_fn(pass_fn(p)) == pass_fn(p)``.
        laws: a subset of :data:`LAWS` to check instead of the default.
        inputs: ``program -> (args, kwargs)`` for the semantics law.
        allowed_errors: exception types with which the pass may decline a program.
        settings: hypothesis settings to start from (default: the active profile); deadline,
            the too-slow health check and multi-bug reporting are always turned off.

    Returns normally when every law holds on every program tried. Raises ``LawViolation`` for the
    shrunk program that breaks one (its message names the law and prints the program).
    """
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings

    _check_laws_arg(laws, idempotent)
    if programs is None:
        from ir.strategies.programs import programs as default

        programs = default()
    base = settings if settings is not None else hsettings.default
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples must be a positive int, got {max_examples!r}")
    chosen = hsettings(
        base,
        max_examples=max_examples if max_examples is not None else base.max_examples,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=list(base.suppress_health_check)
        + [HealthCheck.too_slow, HealthCheck.data_too_large],
    )

    def laws_hold(example: _Shown) -> None:
        check_program(
            pass_fn, example.program, idempotent=idempotent, laws=laws, inputs=inputs,
            allowed_errors=allowed_errors,
        )

    # one example-database key (and derandomized seed) per pass and set of laws, rather than
    # one shared by every check_laws call: a failure saved for one pass is not replayed for another
    laws_hold._hypothesis_internal_add_digest = repr(
        (pass_name(pass_fn), sorted(_check_laws_arg(laws, idempotent)))
    ).encode()
    chosen(given(programs.map(_Shown))(laws_hold))()


class _Shown:
    """A drawn program that hypothesis prints as text, not as a nested attrs repr."""

    __slots__ = ("program",)

    def __init__(self, program: Program) -> None:
        self.program = program

    def __repr__(self) -> str:
        return "\n" + describe(self.program) + "\n"

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
    except Exception as e:  # a pass raising on a valid program breaks it
        raise LawViolation(
            "raises", pass_fn, f"the pass raised {type(e).__name__}: {e}", program
        ) from e


def _run(module: torch.nn.Module, args: tuple, kwargs: dict, fqns: tuple[str, ...]) -> tuple:
    """Call ``module`` on fresh copies of the inputs; ``(outputs, inputs, state)`` as copies."""
    args, kwargs = pytree.tree_map(_fresh, (args, kwargs))
    out = module(*args, **kwargs)
    outputs = pytree.tree_map(_fresh, out)
    state = {fqn: _fresh(_state_value(module, fqn)) for fqn in fqns}
    return outputs, pytree.tree_map(_fresh, (args, kwargs)), state


def _fresh(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    return x


_MISSING = object()


def _state_value(module: torch.nn.Module, fqn: str) -> Any:
    obj: Any = module
    for part in fqn.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def _difference(got: Any, want: Any) -> str | None:
    """``None`` when ``got`` equals ``want`` (structure and values), else what differs."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    if got_spec != want_spec:
        return f"structure {got_spec} instead of {want_spec}"
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves)):
        if a is _MISSING or b is _MISSING:
            if a is not b:
                return f"leaf {i} is missing" if a is _MISSING else f"leaf {i} is unexpected"
            continue
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"leaf {i} is a {type(a).__name__}, expected a tensor"
            try:
                torch.testing.assert_close(a, b, equal_nan=True)
            except AssertionError as e:
                return f"leaf {i}: {e}".replace("\n", " ")
        elif a != b:
            return f"leaf {i} is {a!r}, expected {b!r}"
    return None


def _version_diff(program: Program, before: tuple, after: tuple) -> list:
    keys = sorted(program.tensors.keys())
    tensor_keys = [k for k in keys if isinstance(program.tensors[k].value, torch.Tensor)]
    return [(k, a, b) for k, a, b in zip(tensor_keys, before, after)]


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
