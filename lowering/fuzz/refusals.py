"""Refusals that are not findings: what torch documents as unsupported, and what the machinery
below a backend refuses as well.

A backend that raises where eager runs is a crash finding, unless the refusal is not the
backend's own:

- *documented*: its message (the whole chain of causes) matches a row of
  :data:`DOCUMENTED_UNSUPPORTED`, a refusal torch's source or docs call unsupported;
- *shared*: the backend's reference (``lowering.fuzz.backends.Backend.reference``: the identity
  compiler through the same machinery, e.g. an identity ``aot_autograd`` compiler for a custom
  backend, ``backend="eager"`` for ``"aot_eager"``) refuses the same program with the same
  innermost error (its type and first line, numbers masked).

The mirror case is not the backend's own either: a mismatch where eager refuses an input and
the backend runs (``ACCEPTS_WHAT_EAGER_REFUSES``) that the backend's reference runs as well
(*accepted by the reference too*). The machinery below the backend, not the backend, skipped
the refusing operator: dynamo and AOTAutograd drop an operator whose result nothing reads, so a
``float16`` operator that CPU eager refuses, in dead code, raises in eager and not in any
compiled graph, the identity compiler's included.

A refusal is replayed as the finding was made: the callable built once and called at each of
the finding's sizes up to the one that raised (``differential(..., sizes=k)``), with the
backward under ``grad=True`` (a ``grad_crash`` is a refusal too). Such a refusal is
*unsupported*: the fuzzer counts it under its label and never keeps it as a
finding, so it cannot take the key of a real finding of the same backend. Deciding costs at
most two builds and runs of the program (the backend again, for its whole message, then its
reference); :class:`Refusals` remembers each decision per backend and masked message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from ir.errors import first_line
from ir.harness.run import seeded
from ir.program import Program
from ir.torch_seam import pytree
from lowering.fuzz.backends import Backend
from lowering.fuzz.gradients import requiring_grad, weights, written_inputs
from lowering.fuzz.judge import (
    ACCEPTS_WHAT_EAGER_REFUSES,
    Setup,
    example_inputs,
    reference_module,
)


@attrs.frozen
class Documented:
    """A refusal torch documents: ``name``; ``pattern`` (a regular expression searched in the
    exception's whole text, causes included); ``documented`` (where torch says so)."""

    name: str
    pattern: str
    documented: str


DOCUMENTED_UNSUPPORTED: tuple[Documented, ...] = (
    Documented(
        "aot_autograd.set_on_mutated_input",
        r"Encountered a (set_|resize_) on a graph input",
        "torch/_functorch/_aot_autograd/functional_utils.py: 'Encountered a set_ on a graph "
        "input, but the input has other mutations that we cannot keep in the graph. This is "
        "not supported today.' (Note [set_() Input Mutations in AOTAutograd])",
    ),
    Documented(
        "export.data_dependent",
        r"GuardOnDataDependentSymNode|Could not guard on data-dependent|"
        r"DataDependentOutputException|DynamicOutputShapeException",
        "torch.export programming model, 'Data-dependent errors': export cannot trace a "
        "shape or a branch that depends on tensor values without torch._check hints.",
    ),
)
"""Refusals torch documents as unsupported, matched on the whole exception text."""


def refusal(backend: Backend, program: Program, setup: Setup,
            sizes: Sequence[Mapping[str, int]] = ({},)) -> BaseException | None:
    """The exception ``backend`` raises building ``program`` once and calling it on fresh
    inputs at each of ``sizes`` in order (call ``i`` at ``sizes[i]``, inputs drawn as the
    fuzzer draws them: ``example_inputs(program, setup, sizes[i], i)``), under
    ``setup.seed``; under ``torch.no_grad()``, or under ``setup.grad`` with the floating
    inputs and parameters requiring grad and the fuzzer's weighting of the floating outputs
    that require grad backpropagated after each call (:func:`_call`). ``None`` when every call runs. One build and
    ``len(sizes)`` runs."""
    try:
        module = reference_module(program, setup)
        if setup.grad:
            requiring_grad(module, [s.target for s in program.signature.inputs
                                    if s.kind == "parameter"])
        run, _holder = backend.build(program, module, setup)
        names = written_inputs(program)
        written = frozenset(i for i, s in enumerate(program.signature.user_inputs())
                            if s.name in names)
        for i, at in enumerate(sizes or ({},)):
            args, kwargs = example_inputs(program, setup, at, i)
            with seeded(setup.seed):
                _call(run, args, kwargs, setup.grad, written, setup.seed, i)
    except Exception as exc:  # noqa: BLE001 - the refusal is what is asked for
        return exc
    return None


def _call(run: Any, args: tuple, kwargs: dict, grad: bool, written: frozenset[int],
          seed: int, call: int) -> None:
    """One call as the fuzzer's trial makes it (``lowering.fuzz.gradients.run_with_grad``):
    under grad the floating leaves require grad, those the program writes passed as clones,
    and the weighted floating outputs that require grad backpropagated."""
    if not grad:
        with torch.no_grad():
            run(*args, **kwargs)
        return
    leaves, spec = pytree.tree_flatten((args, kwargs))
    passed = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.detach().clone().requires_grad_(True)
            passed.append(x.clone() if i in written else x)
        else:
            passed.append(x)
    args, kwargs = pytree.tree_unflatten(passed, spec)
    with torch.enable_grad():
        outs = pytree.tree_flatten(run(*args, **kwargs))[0]
        positions = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor)
                     and o.is_floating_point() and o.requires_grad]
        if positions:
            ws = weights(outs, positions, seed, call)
            sum((w * outs[i]).sum() for w, i in zip(ws, positions)).backward()


def innermost(exc: BaseException) -> BaseException:
    """The exception at the root of ``exc``'s chain (``__cause__``, then dynamo's
    ``inner_exception``, then ``__context__``), ``exc`` itself when it has none. O(chain)."""
    seen = {id(exc)}
    while True:
        nxt = _below(exc)
        if not isinstance(nxt, BaseException) or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def whole_text(exc: BaseException) -> str:
    """Every exception of ``exc``'s chain as ``Type: message``, one after the other."""
    parts, seen, cur = [], set(), exc
    while isinstance(cur, BaseException) and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}")
        cur = _below(cur)
    return "\n".join(parts)


def _below(exc: BaseException) -> BaseException | None:
    return exc.__cause__ or getattr(exc, "inner_exception", None) or exc.__context__


_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+")


def signature_of(exc: BaseException) -> str:
    """``Type: first line`` of ``exc``'s innermost exception, every number (and hexadecimal
    address) masked as ``N``: what two refusals must share to be one. O(len(message))."""
    root = innermost(exc)
    return f"{type(root).__name__}: {_NUMBER.sub('N', first_line(root))}"


def documented(exc: BaseException) -> Documented | None:
    """The row of :data:`DOCUMENTED_UNSUPPORTED` whose pattern ``exc``'s whole text matches."""
    text = whole_text(exc)
    return next((row for row in DOCUMENTED_UNSUPPORTED if re.search(row.pattern, text)), None)


class Refusals:
    """Decides whether a crash finding is unsupported (module docstring), remembering each
    decision per backend and masked message."""

    def __init__(self) -> None:
        self.decided: dict[tuple[str, str], str | None] = {}

    def classify(self, finding: Any) -> str | None:
        """The label of ``finding`` (a ``lowering.fuzz.Finding``, replayed at the sizes of its
        ``calls``) when it is not the backend's own: a ``crash`` or ``grad_crash`` that is an
        unsupported refusal, ``"documented: <row>"`` or ``"shared with <reference>: <Type:
        line>"``; a mismatch where eager refused and the backend ran that its reference runs
        too, ``"accepted by <reference> too: <eager's error type>"``. ``None`` for a real
        finding (a value that differs, a crash its reference does not share, a crash that does
        not happen again, an input the reference refuses as eager does). Never raises. At most
        two builds and runs per new (backend, masked detail)."""
        backend = getattr(finding, "compiler", None)
        accepts = finding.kind == "mismatch" and finding.detail.startswith(
            ACCEPTS_WHAT_EAGER_REFUSES)
        if (finding.kind not in CRASH_KINDS and not accepts) or backend is None:
            return None
        sizes = tuple(at for at, _args, _kwargs in getattr(finding, "calls", ())) or ({},)
        key = (finding.backend, finding.kind, len(sizes), _NUMBER.sub("N", finding.detail))
        if key not in self.decided:
            decide = _decide_acceptance if accepts else _decide
            self.decided[key] = decide(backend, finding.program, finding.setup, sizes)
        return self.decided[key]


CRASH_KINDS = frozenset({"crash", "grad_crash"})
"""The kinds of finding that are refusals: the forward's, and under ``grad=True`` the
backward's."""


def _decide(backend: Backend, program: Program, setup: Setup,
            sizes: Sequence[Mapping[str, int]]) -> str | None:
    try:
        own = refusal(backend, program, setup, sizes)
        if own is None:
            return None
        row = documented(own)
        if row is not None:
            return f"documented: {row.name}"
        below = backend.reference
        if below is None:
            return None
        theirs = refusal(below, program, setup, sizes)
    except Exception:  # noqa: BLE001 - what cannot be decided stays a finding
        return None
    if theirs is not None and signature_of(theirs) == signature_of(own):
        return f"shared with {below.target}: {signature_of(own)}"
    return None


def _as_is(module: torch.nn.Module) -> torch.nn.Module:
    return module


_EAGER = Backend("eager", "callable", _as_is)
"""Eager itself, replayed as a backend (the lowered module, run as it is)."""


def _decide_acceptance(backend: Backend, program: Program, setup: Setup,
                       sizes: Sequence[Mapping[str, int]]) -> str | None:
    below = backend.reference
    if below is None:
        return None
    try:
        theirs = refusal(below, program, setup, sizes)
        eager = refusal(_EAGER, program, setup, sizes)
    except Exception:  # noqa: BLE001 - what cannot be decided stays a finding
        return None
    if theirs is not None or eager is None:
        return None
    return f"accepted by {below.target} too: {signature_of(eager)}"


__all__ = ["CRASH_KINDS", "DOCUMENTED_UNSUPPORTED", "Documented", "Refusals", "documented", "innermost",
           "refusal", "signature_of", "whole_text"]
