"""One run with gradients, as ``differential(..., grad=True)`` observes it.

The floating (real) user inputs are leaves that require grad (an input the program writes in
place is passed as a clone of its leaf, so that the write is legal and the leaf still gets its
gradient), and so are the floating parameters of the module (:func:`requiring_grad`). The
forward runs with grad enabled; a fixed random weighting of the floating outputs eager can
differentiate (:func:`weights`: uniform in ``[-1, 1)`` from a generator seeded with the seed
and the call's index, drawn in float32 in output order) is summed and backpropagated; the
gradient of every floating input and parameter is read (``None`` read as zeros: a compiler may
materialize a zero gradient eager leaves out). A repro script (``lowering.fuzz.repro``) does
the same with the same weights.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from ir.effects import alias_roots, written_args
from ir.harness import fresh, seeded, state_value
from ir.program import Program
from ir.torch_seam import pytree
from lowering.fuzz.judge import Side
from lowering.fuzz.magnitude import Magnitudes

NOT_DIFFERENTIABLE = "no floating output depends differentiably on an input or parameter"
"""Why eager's run of a program gives nothing to backpropagate."""


def requiring_grad(holder: Any, fqns: Sequence[str]) -> None:
    """Make the floating parameters at ``fqns`` of ``holder`` (a module, else nothing) require
    grad, their ``.grad`` cleared. Acts on the module a side owns and runs. O(len(fqns))."""
    if not isinstance(holder, torch.nn.Module):
        return
    for fqn in fqns:
        p = state_value(holder, fqn)
        if isinstance(p, torch.nn.Parameter) and p.is_floating_point():
            p.requires_grad_(True)
            p.grad = None


def _differentiable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.requires_grad


def weights(outputs: Sequence[Any], positions: Sequence[int], seed: int, call: int
            ) -> list[torch.Tensor]:
    """The fixed weighting of ``outputs`` at ``positions``: per output, a tensor of its shape
    and dtype on its device, uniform in ``[-1, 1)`` from ``torch.Generator().manual_seed(seed
    * 1000 + call)``, drawn in float32 in order. O(elements)."""
    gen = torch.Generator().manual_seed(seed * 1000 + call)
    out = []
    for i in positions:
        o = outputs[i]
        w = torch.rand(tuple(o.shape), generator=gen, dtype=torch.float32) * 2 - 1
        out.append(w.to(device=o.device, dtype=o.dtype))
    return out


def run_with_grad(fn: Callable[..., Any], args: tuple, kwargs: dict, holder: Any,
                  fqns: Sequence[str] | None, params: Sequence[str], written: frozenset[int],
                  seed: int, call: int, positions: Sequence[int] | None,
                  watch: bool = False) -> Side:
    """``fn`` called on copies of ``(args, kwargs)`` that require grad (module docstring) under
    ``seed``, then the weighted sum of its outputs at ``positions`` (``None``: every floating
    output that requires grad: eager's choice, kept in ``Side.positions``) backpropagated.

    Returns a ``lowering.fuzz.judge.Side``: ``error`` (the forward's), else ``outputs``,
    ``inputs`` (the arguments passed, after the call), ``state`` (``fqns`` read from
    ``holder``; ``None``: not observed), ``positions`` and ``grads`` (``"input i"`` per
    floating flat input leaf ``i``, ``"parameter 'fqn'"`` per floating parameter of ``params``
    on ``holder``), or ``grad_error`` (the backward's error, or :data:`NOT_DIFFERENTIABLE`).
    The values are detached copies. ``watch``: the forward is watched by
    ``lowering.fuzz.magnitude.Magnitudes`` (``Side.magnitudes``). ``call`` picks the weights
    (:func:`weights`). O(forward + backward + copies)."""
    leaves, spec = pytree.tree_flatten(fresh((args, kwargs)))
    passed = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x.requires_grad_(True)
            passed.append(x.clone() if i in written else x)
        else:
            passed.append(x)
    call_args, call_kwargs = pytree.tree_unflatten(passed, spec)
    requiring_grad(holder, params)
    watcher = Magnitudes() if watch else None
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.enable_grad(), watcher if watcher is not None else contextlib.nullcontext():
                results = fn(*call_args, **call_kwargs)
        except Exception as exc:  # noqa: BLE001 - an error is one of the outcomes
            return Side(error=(type(exc).__name__, _line(exc)))
        outs = pytree.tree_flatten(results)[0]
        if positions is None:
            positions = tuple(i for i, o in enumerate(outs) if _differentiable(o))
        state = {f: state_value(holder, f) for f in fqns} if fqns is not None else {}
        magnitudes = None
        if watcher is not None:
            magnitudes = Side(tuple(watcher.of(x) for x in outs),
                              tuple(watcher.of(x) for x in passed),
                              {f: watcher.of(v) for f, v in state.items()})
        side = Side(tuple(fresh(outs)), tuple(fresh(passed)),
                    {f: fresh(v) for f, v in state.items()}, magnitudes=magnitudes,
                    positions=tuple(positions))
        try:
            if not positions:
                raise _Nothing(NOT_DIFFERENTIABLE)
            ws = weights(outs, positions, seed, call)
            loss = sum((w * outs[i]).sum() for w, i in zip(ws, positions))
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - the backward's error is an outcome too
            _detach_state(holder)
            return attrs.evolve(side, grad_error=(type(exc).__name__, _line(exc)))
    grads = {}
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            grads[f"input {i}"] = _grad(x)
    if isinstance(holder, torch.nn.Module):
        for fqn in params:
            p = state_value(holder, fqn)
            if isinstance(p, torch.Tensor) and p.is_floating_point():
                grads[f"parameter {fqn!r}"] = _grad(p)
                p.grad = None
    _detach_state(holder)
    return attrs.evolve(side, grads=grads)


def skip_reason(error: tuple[str, str]) -> str:
    """Why eager could not differentiate a program, as the report counts it: the backward's
    error (type and first line) without what varies from program to program (a tensor's
    shape, a version counter, torch's hint). O(len(line))."""
    name, line = error
    if line == NOT_DIFFERENTIABLE:
        return line
    line = line.split(" Hint:")[0]
    line = re.sub(r"\[torch\.\w+ \[[\d, ]*\]\]", "a tensor", line)
    line = re.sub(r"version \d+", "version N", line)
    return f"{name}: {line}"


def written_inputs(program: Program) -> frozenset[str]:
    """The root user inputs ``program`` writes: a mutation output's, and every one an in-place
    node of the root graph writes, directly or through a view (``ir.effects.alias_roots``).
    O(nodes)."""
    sig = program.signature
    graph = program.root_module.graph
    users = [s.name for s in sig.user_inputs()]
    found = {o.target for o in sig.outputs if o.kind == "user_input_mutation"}
    roots = alias_roots(graph, users)
    for node in graph.nodes:
        for name in written_args(node):
            found |= roots.get(name, frozenset())
    return frozenset(found)


class _Nothing(Exception):
    """Nothing to backpropagate."""


def _grad(x: torch.Tensor) -> torch.Tensor:
    g = x.grad
    return torch.zeros_like(x.detach()) if g is None else g.detach().clone()


def _detach_state(holder: Any) -> None:
    # a buffer written with a value that requires grad carries this call's graph into the next
    if isinstance(holder, torch.nn.Module):
        for b in holder.buffers():
            if b.grad_fn is not None and b._base is None:
                b.detach_()  # a view keeps it: a later call's backward fails on both sides


def _line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


__all__ = ["NOT_DIFFERENTIABLE", "requiring_grad", "run_with_grad", "skip_reason", "weights",
           "written_inputs"]
