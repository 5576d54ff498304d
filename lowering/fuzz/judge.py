"""One program run by eager and by one backend, and the verdict: agree, mismatch or crash.

Both sides get fresh inputs and a freshly built module (programs write their inputs and buffers
in place), run under ``torch.no_grad()`` with the random state seeded alike
(``ir.harness.outcome``). What is compared, leaf by leaf, in this order: the outputs (the
result's pytree leaves), the inputs after the call (what the call wrote in place), the state
after the call (every fqn of the program's state, read where the backend keeps it). A floating
leaf is compared within ``lowering.fuzz.error_bounds.bounds``; where that finds a difference,
again against a float64 run, with eager's own error against it allowed twice over and ``rtol``
of the magnitude of the operands the value was computed from (``lowering.fuzz.magnitude``: a
cancelling subtraction is judged on its operands' scale).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from ir.effects import written_args
from ir.harness import fresh, outcome, state_value
from ir.node import CALL_FUNCTION, OUTPUT
from ir.program import Program
from ir.strategies.programs import program_inputs
from ir.torch_seam import pytree
from lowering.fuzz.error_bounds import MOST_ULPS, bounds, error_budget
from lowering.fuzz.magnitude import Magnitudes
from lowering.lower import lower

KINDS = ("mismatch", "crash", "grad", "grad_crash")
"""The kinds of finding: a value that differs (or an input eager refuses that the backend
accepts), a backend that raises where eager runs; under ``grad=True`` also a gradient that
differs (``grad``) and a backward that raises where eager's runs (``grad_crash``)."""

GRAD_KINDS = frozenset({"grad", "grad_crash"})
"""The kinds only a run with gradients gives."""

ACCEPTS_WHAT_EAGER_REFUSES = "the backend accepts an input eager refuses"
"""How the detail of a mismatch where eager raised and the backend ran begins."""


@attrs.frozen
class Side:
    """One run: ``outputs``, ``inputs`` (after the call) and the state's values, as flat tuples
    of detached copies, or ``error`` (the exception's type name and first line);
    ``magnitudes``: where the run was watched (``run(..., watch=True)``), a ``Side`` of the
    same leaves holding each floating leaf's magnitude (``lowering.fuzz.magnitude``), ``None``
    for the others. A run with gradients (``lowering.fuzz.gradients``) also has ``grads``
    (``"input i"`` / ``"parameter 'fqn'"`` -> gradient), or ``grad_error`` (the backward's
    error), and ``positions`` (the outputs weighted)."""

    outputs: tuple = ()
    inputs: tuple = ()
    state: Mapping[str, Any] = attrs.field(factory=dict)
    error: tuple[str, str] | None = None
    magnitudes: Side | None = None
    grads: Mapping[str, Any] = attrs.field(factory=dict)
    grad_error: tuple[str, str] | None = None
    positions: tuple[int, ...] = ()


@attrs.frozen
class Verdict:
    """Why a backend's run is a finding: ``kind`` (:data:`KINDS`), ``detail`` (one sentence),
    ``where`` (``("output", i)``, ``("input", i)``, ``("state", fqn)`` or ``("call", "")``),
    ``error`` (largest difference over the output scale; 0 for a crash), ``cause`` (the
    operator held to be at the cause: ``"aten.add.Tensor"``, or an exception's type name),
    ``call`` (which call of the compiled callable showed it, 0 the first) and ``sizes`` (the
    dynamic sizes of that call, symbol -> size; empty at one size)."""

    kind: str
    detail: str
    where: tuple[str, Any]
    error: float = 0.0
    cause: str = ""
    call: int = 0
    sizes: Mapping[str, int] = attrs.field(factory=dict)


@attrs.frozen
class Setup:
    """How an example is run: ``device`` (the program is moved there first), ``dtype`` (floating
    state and inputs cast to it after lowering; ``None``: as drawn), ``seed`` (inputs and the
    random state), ``sizes`` (how many sizes of its dynamic dimensions a program is called at,
    one compiled callable for all: ``lowering.fuzz.call_sizes``), ``grad`` (inputs and parameters
    require grad, a weighting of the outputs is backpropagated and the gradients compared:
    ``lowering.fuzz.gradients``)."""

    device: str = "cpu"
    dtype: torch.dtype | None = None
    seed: int = 0
    sizes: int = 1
    grad: bool = False


def example_inputs(program: Program, setup: Setup, sizes: Mapping[str, int] | None = None,
                   call: int = 0) -> tuple[tuple, dict]:
    """Fresh ``(args, kwargs)`` for ``program`` (``ir.strategies.programs.program_inputs``, its
    dynamic sizes at ``sizes``, drawn from ``setup.seed + call``), floating tensors cast to
    ``setup.dtype``, on ``setup.device``. O(input elements)."""
    args, kwargs = program_inputs(program, setup.seed + call, sizes=sizes or None)
    return pytree.tree_map(lambda x: _placed(x, setup), (args, kwargs))


def reference_module(program: Program, setup: Setup) -> torch.nn.Module:
    """``lower(program)``, its floating state cast to ``setup.dtype``: what eager runs, and what
    a callable backend compiles. A new module per call. O(program)."""
    module = lower(program)
    if setup.dtype is not None:
        module = module.to(setup.dtype)
    return module


def run(fn: Callable[..., Any], args: tuple, kwargs: dict, holder: Any,
        fqns: Sequence[str] | None, seed: int, watch: bool = False) -> Side:
    """``fn(*args, **kwargs)`` on copies, under ``torch.no_grad()`` and ``seed``; the state
    ``fqns`` read from ``holder`` after the call (``None``: not observed). ``watch``: the run
    is watched by ``lowering.fuzz.magnitude.Magnitudes`` and the side carries its leaves'
    magnitudes. O(call + copies), watched: O(elements of every operator call) more."""
    watcher = Magnitudes() if watch else None

    def call(*a: Any, **k: Any) -> Any:
        with torch.no_grad(), watcher if watcher is not None else contextlib.nullcontext():
            return fn(*a, **k)

    ran = outcome(call, *args, seed=seed, **kwargs)
    if not ran.ok:
        return Side(error=ran.error)
    outs = pytree.tree_flatten(ran.results)[0]
    ins = pytree.tree_flatten((ran.args, ran.kwargs))[0]
    state = {f: state_value(holder, f) for f in fqns} if fqns is not None else {}
    magnitudes = None
    if watcher is not None:
        magnitudes = Side(tuple(watcher.of(x) for x in outs), tuple(watcher.of(x) for x in ins),
                          {f: watcher.of(v) for f, v in state.items()})
    return Side(tuple(fresh(outs)), tuple(fresh(ins)), {f: fresh(v) for f, v in state.items()},
                magnitudes=magnitudes)


def compare(program: Program, got: Side, want: Side,
            exact: Callable[[], Side | None] | None = None,
            precision: torch.dtype | None = None) -> Verdict | None:
    """The verdict on ``got`` (a backend's run) against ``want`` (eager's), or ``None`` when
    they agree. ``exact()``: eager in float64, asked only where a floating leaf differs.
    ``precision``: a coarser floating dtype every floating leaf is judged at (as if computed in
    it; ``lowering.fuzz.error_bounds.bounds``), ``None``: each at its own.

    A crash is ``got.error`` where ``want`` ran; a backend that returns where eager raised is a
    mismatch; both raising is no finding. Laws: ``compare(p, s, s) is None``.
    Complexity: O(elements), plus one ``exact()`` run at most."""
    if want.error is not None:
        if got.error is not None:
            return None
        name, line = want.error
        return Verdict("mismatch", f"{ACCEPTS_WHAT_EAGER_REFUSES} ({name}: {line})",
                       ("call", ""), cause=name)
    if got.error is not None:
        name, line = got.error
        return Verdict("crash", f"{name}: {line}", ("call", ""),
                       cause=_named_operator(line) or name)
    budget = error_budget(program)
    reference = functools.cache(exact) if exact is not None else (lambda: None)
    groups = (("output", got.outputs, want.outputs, "outputs"),
              ("input", got.inputs, want.inputs, "inputs"))
    for where, g_items, w_items, field in groups:
        if len(g_items) != len(w_items):
            return Verdict("mismatch", f"{len(g_items)} {where}s, eager gives {len(w_items)}",
                           (where, 0), 1.0, _cause(program, (where, 0)))
        for i, (g, w) in enumerate(zip(g_items, w_items)):
            found = _leaf(g, w, budget, lambda f=field, i=i: _at(reference(), f, i),
                          precision)
            if found is not None:
                return _verdict(program, (where, i), found)
    for fqn in sorted(want.state):
        if fqn not in got.state:
            continue
        found = _leaf(got.state[fqn], want.state[fqn], budget,
                      lambda f=fqn: _at(reference(), "state", f), precision)
        if found is not None:
            return _verdict(program, ("state", fqn), found)
    return _gradients(program, got, want, budget, reference, precision)


GRAD_BUDGET_FACTOR = 2
"""A gradient's error budget is the program's times this: the backward runs about as many
operators again (each a place to round), and regroups the sums a broadcast's gradient makes."""


def _gradients(program: Program, got: Side, want: Side, budget: int,
               reference: Callable[[], Side | None], precision: torch.dtype | None
               ) -> Verdict | None:
    """The verdict on the gradients of two runs whose forwards agree: a ``grad_crash`` where
    eager's backward ran and ``got``'s raised, a ``grad`` mismatch at the first gradient that
    differs (within ``GRAD_BUDGET_FACTOR`` times the budget)."""
    if want.grad_error is not None or not want.grads:
        return None
    if got.grad_error is not None:
        name, line = got.grad_error
        return Verdict("grad_crash", f"the backward raises {name}: {line}", ("grad", ""),
                       cause=_named_operator(line) or name)
    wide = min(budget * GRAD_BUDGET_FACTOR, MOST_ULPS * GRAD_BUDGET_FACTOR)
    for key, w in want.grads.items():
        if key not in got.grads and key.startswith("parameter"):
            continue  # the backend's holder keeps no parameter there (a copy of its own)
        found = _leaf(got.grads.get(key), w, wide,
                      lambda k=key: _at(reference(), "grads", k), precision)
        if found is not None:
            sentence, error = found
            return Verdict("grad", f"gradient of {key}: {sentence}", ("grad", key), error,
                           _grad_cause(program, key))
    return None


def _grad_cause(program: Program, key: str) -> str:
    """The operator first reading the input or parameter whose gradient differs (``key``:
    ``"input i"``, ``"parameter 'fqn'"``); a finding's cause is localized after shrinking."""
    sig = program.signature
    if key.startswith("input "):
        inputs = [s.name for s in sig.user_inputs()]
        i = int(key.split()[1])
        name = inputs[i] if i < len(inputs) else None
    else:
        fqn = key.split(" ", 1)[1].strip("'")
        name = next((s.name for s in sig.inputs if s.target == fqn), None)
    graph = program.root_module.graph
    users = graph.users().get(name, ()) if name is not None else ()
    return operator_of(graph, users[0] if users else None)


def _at(side: Side | None, field: str, key: Any) -> tuple[Any, Any]:
    """The exact run's leaf at ``key`` of ``field`` (an index, or a state fqn) and its
    magnitude (``None`` where absent)."""
    if side is None:
        return None, None
    mags = getattr(side.magnitudes, field) if side.magnitudes is not None else ()
    return _item(getattr(side, field), key), _item(mags, key)


def _item(items: Any, key: Any) -> Any:
    try:
        return items[key]
    except (IndexError, KeyError, TypeError):
        return None


def _leaf(g: Any, w: Any, budget: int, exact: Callable[[], tuple[Any, Any]],
          precision: torch.dtype | None = None) -> tuple[str, float] | None:
    """``(sentence, relative error)`` where leaf ``g`` differs from eager's ``w``, else None.
    ``exact()``: the float64 run's leaf and its magnitude (``lowering.fuzz.magnitude``)."""
    if not isinstance(w, torch.Tensor):
        return None if _same_plain(g, w) else (f"got {g!r}, eager gives {w!r}", 1.0)
    if not isinstance(g, torch.Tensor):
        return f"got a {type(g).__name__}, eager gives a tensor", 1.0
    if g.shape != w.shape or g.dtype != w.dtype:
        return (f"got {g.dtype}{list(g.shape)}, eager gives {w.dtype}{list(w.shape)}", 1.0)
    if g.device != w.device:
        return f"got device {g.device}, eager gives {w.device}", 1.0
    gc, wc = g.detach().cpu(), w.detach().cpu()
    if not (w.is_floating_point() or w.is_complex()):
        bad = gc != wc
        if not bool(bad.any()):
            return None
        return _sentence(bad, gc, wc, 1.0)
    if w.is_complex():
        gc, wc = torch.view_as_real(gc.resolve_conj()), torch.view_as_real(wc.resolve_conj())
    rtol, atol = bounds(wc, budget, precision)
    g64, w64 = gc.to(torch.float64), wc.to(torch.float64)
    allowed = atol + rtol * w64.abs()
    bad = _outside(g64, w64, allowed)
    if not bool(bad.any()):
        return None
    ref, size = exact()
    if isinstance(ref, torch.Tensor) and ref.shape == w.shape and not w.is_complex():
        r64 = ref.detach().cpu().to(torch.float64)
        own = torch.nan_to_num((w64 - r64).abs(), nan=0.0, posinf=0.0)
        wide = allowed + 2 * own
        if isinstance(size, torch.Tensor) and size.shape == w.shape:
            wide = wide + rtol * torch.nan_to_num(size.cpu(), nan=0.0, posinf=0.0)
        bad &= _outside(g64, r64, wide)
        if not bool(bad.any()):
            return None
    scale = atol / rtol if rtol else 1.0
    diff = torch.nan_to_num((g64 - w64).abs(), nan=float("inf"), posinf=float("inf"))
    return _sentence(bad, gc, wc, float(diff[bad].max()) / scale, (rtol, atol))


def _outside(g: torch.Tensor, w: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    nan_g, nan_w = torch.isnan(g), torch.isnan(w)
    inf = torch.isinf(g) | torch.isinf(w)
    close = (g - w).abs() <= allowed
    special = nan_g | nan_w | inf
    same_special = (nan_g & nan_w) | (inf & (g == w))
    return ~torch.where(special, same_special, close)


def _sentence(bad: torch.Tensor, g: torch.Tensor, w: torch.Tensor, error: float,
              tol: tuple[float, float] | None = None) -> tuple[str, float]:
    flat = bad.reshape(-1)
    j = int(flat.nonzero()[0])
    gv, wv = g.reshape(-1)[j].item(), w.reshape(-1)[j].item()
    within = f" (rtol {tol[0]:.2g}, atol {tol[1]:.2g})" if tol else ""
    sentence = (f"{int(flat.sum())} of {flat.numel()} values differ{within}; first at flat "
                f"index {j}: got {gv!r}, eager gives {wv!r}")
    return sentence, error


def _same_plain(g: Any, w: Any) -> bool:
    try:
        nan = isinstance(g, float) and isinstance(w, float) and math.isnan(g) and math.isnan(w)
        return nan or bool(g == w)
    except Exception:  # noqa: BLE001 - an uncomparable value is a difference
        return False


def _verdict(program: Program, where: tuple[str, Any], found: tuple[str, float]) -> Verdict:
    sentence, error = found
    label = f"{where[0]} {where[1]}" if where[0] != "state" else f"state {where[1]!r}"
    return Verdict("mismatch", f"{label}: {sentence}", where, error, _cause(program, where))


def _cause(program: Program, where: tuple[str, Any]) -> str:
    """The operator at the cause of a difference at ``where``: the operator computing that
    output, or the last one writing that input or state (``"?"`` when none is found)."""
    graph = program.root_module.graph
    sig = program.signature
    kind, key = where
    name = None
    if kind == "output":
        users = [o.name for o in sig.outputs if o.kind == "user_output"]
        name = users[key] if key < len(users) else None
    else:
        if kind == "input":
            inputs = [s.name for s in sig.user_inputs()]
            target = inputs[key] if key < len(inputs) else None
            mutation = "user_input_mutation"
            spec_target = target
        else:
            placeholder = [s.name for s in sig.inputs if s.target == key]
            target = placeholder[0] if placeholder else None
            mutation, spec_target = "buffer_mutation", key
        for o in sig.outputs:
            if o.kind == mutation and o.target == spec_target:
                name = o.name
        if name is None and target is not None:
            for node in graph.nodes:
                if node.op == CALL_FUNCTION and target in written_args(node):
                    name = node.name
    return operator_of(graph, name)


def operator_of(graph: Any, name: str | None) -> str:
    """The operator of node ``name`` of ``graph`` (``"aten.add.Tensor"``), looking through
    ``getitem`` to the multi-result operator; ``"?"`` for none. O(1)."""
    seen = 0
    while name is not None and seen < 8:
        node = graph.by_name().get(name)
        if node is None or node.op in (OUTPUT,) or node.op != CALL_FUNCTION:
            return node.op if node is not None else "?"
        target = node.target
        if getattr(target, "__name__", "") == "getitem" and node.args:
            name, seen = getattr(node.args[0], "name", None), seen + 1
            continue
        return str(target)
    return "?"


_OPERATOR = re.compile(r"aten[.:]+([A-Za-z_0-9]+)")


def _named_operator(line: str) -> str | None:
    found = _OPERATOR.search(line)
    return f"aten.{found.group(1)}" if found else None


def _placed(x: Any, setup: Setup) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    if setup.dtype is not None and x.is_floating_point():
        x = x.to(setup.dtype)
    return x.to(setup.device)


__all__ = ["ACCEPTS_WHAT_EAGER_REFUSES", "GRAD_KINDS", "KINDS", "Setup", "Side", "Verdict", "compare", "example_inputs", "operator_of",
           "reference_module", "run", "state_value"]
