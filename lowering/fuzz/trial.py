"""One example of the differential fuzzer: a program run by eager and by each backend, judged.

The reference is the lowered program run eagerly; each backend gets its own freshly lowered
module and its own copies of the inputs (programs write their buffers and inputs in place),
both run under ``torch.no_grad()`` with the random state seeded alike
(``lowering.fuzz.judge.run``), or with gradients (``lowering.fuzz.gradients``). Under
``sizes=k`` each side's module (or compiled callable) is built once and called ``k`` times, at
the sizes of ``lowering.fuzz.call_sizes``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir.program import Program
from lowering.fuzz.backends import Backend
from lowering.fuzz.call_sizes import size_sets
from lowering.fuzz.gradients import requiring_grad, run_with_grad, skip_reason, written_inputs
from lowering.fuzz.judge import (
    Setup,
    Side,
    Verdict,
    compare,
    example_inputs,
    reference_module,
    run,
)
from transforms import kernel as kn
from transforms.passes.move_device import move_to_device


@attrs.frozen
class Call:
    """One call of a compiled callable: the dynamic ``sizes`` it is at (symbol -> size; empty
    at the drawn sizes of a program without dynamic dimensions) and its fresh ``args`` /
    ``kwargs``."""

    sizes: Mapping[str, int]
    args: tuple
    kwargs: dict


@attrs.frozen
class Trial:
    """What one example gave: the ``program`` as run (moved to the device), ``args`` /
    ``kwargs`` (the first call's inputs, before any call), ``eager`` (the reference's first
    run), ``verdicts`` (per backend name: its :class:`~lowering.fuzz.judge.Verdict`, ``None``
    when it agrees; a verdict's ``call`` says which call showed it), ``calls`` (every call
    made, in order: :class:`Call`) and ``skipped`` (why nothing was compared: under
    ``grad=True``, eager's backward could not run; else ``None``)."""

    program: Program
    args: tuple
    kwargs: dict
    eager: Side
    verdicts: dict
    calls: tuple[Call, ...] = ()
    skipped: str | None = None


def placed(program: Program, setup: Setup, keep_calls: bool = False) -> Program:
    """``program`` as the fuzzer runs it: its preserved module call signatures dropped (the
    root's kept: they say how to unflatten, not what to compute), unless ``keep_calls`` (a
    backend reads them: ``Backend.wants_calls``), and moved to ``setup.device``. O(program)."""
    calls = program.call_signatures
    if not keep_calls and any(path != "" for path in calls):
        program = program.replace(call_signatures=pmap({k: v for k, v in calls.items()
                                                         if k == ""}))
    if setup.dtype is not None:
        program = with_input_dtype(program, setup.dtype)
    if torch.device(setup.device).type == "cpu":
        return program
    return move_to_device(program, setup.device)


def with_input_dtype(program: Program, dtype: torch.dtype) -> Program:
    """``program`` whose floating user inputs are declared ``dtype`` (their placeholders'
    ``val``), so that the lowered module's input check takes inputs cast to it (the state is
    cast after lowering). O(placeholders)."""
    graph = program.root_module.graph
    users = {s.name for s in program.signature.user_inputs()}
    nodes, changed = [], False
    for node in graph.nodes:
        val = node.meta.get("val")
        if node.name in users and isinstance(val, torch.Tensor) and val.is_floating_point() \
                and val.dtype != dtype:
            mode = getattr(val, "fake_mode", None)
            with mode if mode is not None else contextlib.nullcontext():
                node = node.with_meta(val=val.to(dtype))
            changed = True
        nodes.append(node)
    if not changed:
        return program
    root = program.root_module
    modules = program.modules.set(program.root,
                                  root.replace(graphs=(kn.built(nodes),) + root.graphs[1:]))
    return program.replace(modules=modules)


def try_program(program: Program, backends: Sequence[Backend], setup: Setup,
                precision: torch.dtype | None = None) -> Trial:
    """Run ``program`` (already :func:`placed`) by eager and by each of ``backends``; judge
    each against eager (``lowering.fuzz.judge.compare``, every floating leaf at least at
    ``precision``'s tolerance where given).

    Each side builds its module (a backend: its callable) once and calls it at each size set of
    ``lowering.fuzz.call_sizes.size_sets(program, setup.sizes)`` in order, on fresh inputs of that
    size (the same for every side); a backend's verdict is that of its first call that differs
    from eager's call. Calls after one eager cannot make are not made. Under ``setup.grad``
    each call also backpropagates (``lowering.fuzz.gradients``); a program whose first eager
    call gives nothing to backpropagate is ``skipped``.
    O(calls * backends * (lower + compile + run)), compiles once per backend.
    """
    fqns = tuple(program.state)
    sets = size_sets(program, setup.sizes) if setup.sizes > 1 else ({},)
    calls = tuple(Call(sizes, *example_inputs(program, setup, sizes, i))
                  for i, sizes in enumerate(sets))
    how = _How(program, setup)
    module = reference_module(program, setup)
    requiring_grad(module, how.params if setup.grad else ())
    eager: list[Side] = []
    for i, call in enumerate(calls):
        side = how.run(module, call, module, fqns, i, None)
        if i and (side.error is not None or side.grad_error is not None):
            break  # eager cannot make this call: it and the later ones are not judged
        eager.append(side)
        if side.error is not None:
            break
    calls = calls[:len(eager)]
    first = eager[0]
    if setup.grad and first.error is None and first.grad_error is not None:
        return Trial(program, calls[0].args, calls[0].kwargs, first,
                     {b.name: None for b in backends}, calls,
                     skipped=skip_reason(first.grad_error))
    exact = _Exact(program, setup, fqns, calls, how)
    verdicts: dict[str, Verdict | None] = {}
    for backend in backends:
        verdicts[backend.name] = _judged(backend, program, setup, fqns, calls, eager, exact,
                                         how, precision)
    return Trial(program, calls[0].args, calls[0].kwargs, first, verdicts, calls)


def _judged(backend: Backend, program: Program, setup: Setup, fqns: tuple,
            calls: tuple[Call, ...], eager: list[Side], exact: _Exact, how: _How,
            precision: torch.dtype | None) -> Verdict | None:
    """``backend`` built once and called at each of ``calls``; the first call's verdict that
    is not ``None``, with its call and sizes."""
    module = reference_module(program, setup)
    requiring_grad(module, how.params if setup.grad else ())
    try:
        fn, holder = backend.build(program, module, setup)
    except Exception as exc:  # noqa: BLE001 - a backend that raises is a finding
        got = Side(error=(type(exc).__name__, (str(exc).splitlines() or [""])[0]))
        return compare(program, got, eager[0], lambda: exact.at(0), precision)
    observed = fqns if backend.observes_state and holder is not None else None
    for i, call in enumerate(calls):
        got = how.run(fn, call, holder, observed, i, eager[i].positions)
        verdict = compare(program, got, eager[i], lambda i=i: exact.at(i), precision)
        if verdict is not None:
            return attrs.evolve(verdict, call=i, sizes=dict(call.sizes))
    return None


def backend_side(backend: Backend, program: Program, setup: Setup, fqns: tuple) -> Side:
    """``backend`` built for ``program`` on a fresh lowered module and run once on fresh inputs
    (the first call of :func:`try_program`); a build that raises is the run's error.
    O(lower + compile + run)."""
    call = Call({}, *example_inputs(program, setup))
    how = _How(program, setup)
    module = reference_module(program, setup)
    requiring_grad(module, how.params if setup.grad else ())
    try:
        fn, holder = backend.build(program, module, setup)
    except Exception as exc:  # noqa: BLE001 - a backend that raises is a finding
        return Side(error=(type(exc).__name__, (str(exc).splitlines() or [""])[0]))
    observed = fqns if backend.observes_state and holder is not None else None
    return how.run(fn, call, holder, observed, 0, None)


class _How:
    """How one call of a side is run: forward only under ``torch.no_grad()``, or with
    gradients (the program's floating parameters, its written inputs)."""

    def __init__(self, program: Program, setup: Setup) -> None:
        self.setup = setup
        sig = program.signature
        self.params = tuple(s.target for s in sig.inputs if s.kind == "parameter")
        self.written = frozenset(i for i, s in enumerate(sig.user_inputs())
                                 if s.name in written_inputs(program))

    def run(self, fn: Any, call: Call, holder: Any, observed: tuple | None, index: int,
            positions: tuple[int, ...] | None, watch: bool = False,
            args: tuple[tuple, dict] | None = None) -> Side:
        a, k = args if args is not None else (call.args, call.kwargs)
        if not self.setup.grad:
            return run(fn, a, k, holder, observed, self.setup.seed, watch=watch)
        params = self.params if holder is not None else ()
        return run_with_grad(fn, a, k, holder, observed, params, self.written,
                             self.setup.seed, index, positions, watch=watch)


class _Exact:
    """The program run eagerly in float64, call after call as the sides run it, each call made
    when first asked for (``at``); ``None`` from the first call it cannot make."""

    def __init__(self, program: Program, setup: Setup, fqns: tuple, calls: tuple[Call, ...],
                 how: _How) -> None:
        self.program, self.setup, self.fqns, self.calls, self.how = (
            program, setup, fqns, calls, how)
        self.sides: list[Side] = []
        self.module: Any = None
        self.failed = False

    def at(self, i: int) -> Side | None:
        while not self.failed and len(self.sides) <= i:
            self._next()
        return self.sides[i] if i < len(self.sides) else None

    def _next(self) -> None:
        if self.module is None:
            wide = attrs.evolve(self.setup, dtype=torch.float64)
            try:
                self.module = reference_module(with_input_dtype(self.program, torch.float64),
                                               wide)
            except Exception:  # noqa: BLE001 - no exact run: judged without it
                self.failed = True
                return
            requiring_grad(self.module, self.how.params if self.setup.grad else ())
        j = len(self.sides)
        call = self.calls[j]
        widened = (_widened(call.args), {k: _widened(v) for k, v in call.kwargs.items()})
        side = self.how.run(self.module, call, self.module, self.fqns, j, None, watch=True,
                            args=widened)
        if side.error is not None:
            self.failed = True
            return
        self.sides.append(side)


def _widened(x):
    if isinstance(x, tuple):
        return tuple(_widened(a) for a in x)
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(torch.float64)
    return x


__all__ = ["Call", "Trial", "backend_side", "placed", "try_program", "with_input_dtype"]
