"""One example of the differential fuzzer: a program run by eager and by each backend, judged.

The reference is the lowered program run eagerly; each backend gets its own freshly lowered
module and its own fresh inputs (programs write their buffers and inputs in place), both run
under ``torch.no_grad()`` with the random state seeded alike (``lowering.fuzz.judge.run``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import attrs
import torch
from pyrsistent import pmap

from ir.program import Program
from lowering.fuzz.backends import Backend
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
class Trial:
    """What one example gave: the ``program`` as run (moved to the device), ``args`` /
    ``kwargs`` (the inputs, before any call), ``eager`` (the reference's run) and ``verdicts``
    (per backend name: its :class:`~lowering.fuzz.judge.Verdict`, ``None`` when it agrees)."""

    program: Program
    args: tuple
    kwargs: dict
    eager: Side
    verdicts: dict


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
    ``precision``'s tolerance where given). O(backends * (lower + compile + run)).
    """
    fqns = tuple(program.state)
    args, kwargs = example_inputs(program, setup)
    module = reference_module(program, setup)
    eager = run(module, args, kwargs, module, fqns, setup.seed)
    exact = functools.cache(lambda: _exact(program, setup, fqns))  # run once, where asked
    verdicts: dict[str, Verdict | None] = {}
    for backend in backends:
        got = backend_side(backend, program, setup, fqns)
        verdicts[backend.name] = compare(program, got, eager, exact, precision)
    return Trial(program, args, kwargs, eager, verdicts)


def backend_side(backend: Backend, program: Program, setup: Setup, fqns: tuple) -> Side:
    """``backend`` built for ``program`` on a fresh lowered module and run on fresh inputs;
    a build that raises is the run's error. O(lower + compile + run)."""
    args, kwargs = example_inputs(program, setup)
    module = reference_module(program, setup)
    try:
        fn, holder = backend.build(program, module, setup)
    except Exception as exc:  # noqa: BLE001 - a backend that raises is a finding
        return Side(error=(type(exc).__name__, (str(exc).splitlines() or [""])[0]))
    observed = fqns if backend.observes_state and holder is not None else None
    return run(fn, args, kwargs, holder, observed, setup.seed)


def _exact(program: Program, setup: Setup, fqns: tuple) -> Side | None:
    wide = attrs.evolve(setup, dtype=torch.float64)
    try:
        module = reference_module(with_input_dtype(program, torch.float64), wide)
    except Exception:  # noqa: BLE001 - no exact run: judged without it
        return None
    args, kwargs = example_inputs(program, setup)
    args, kwargs = _widened(args), {k: _widened(v) for k, v in kwargs.items()}
    side = run(module, args, kwargs, module, fqns, setup.seed, watch=True)
    return None if side.error is not None else side


def _widened(x):
    if isinstance(x, tuple):
        return tuple(_widened(a) for a in x)
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(torch.float64)
    return x


__all__ = ["Trial", "backend_side", "placed", "try_program", "with_input_dtype"]
