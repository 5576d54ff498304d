"""``torch.export.export`` of a lowered module, with the program's own dynamic shapes.

A lowered root checks its inputs against the export's ranges. Under ``torch.export`` the inputs
are fake tensors whose dynamic sizes are ``SymInt`` values; a check that turned one into an ``int``
fixed it to the example's size, and export failed with "specialized it to be a constant". The
checks now compare ``SymInt`` values, which the tracer reads as guards the ranges already imply.

Each module kind is exported again with the dynamic shapes its Program holds: ``lower(p)``,
``lower(transform(p))``, ``lower(p, interpreter=True)``, every stage module of a split, and a
user model holding a lowered module as a child (``strict=False``). The result must have the
original ranges (each range's lower and upper bound) and run like the eager model at three other
sizes in range. The zoo's dynamic exports: a sample by default, every case behind ``nightly``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import sympy
import torch
from torch.export import Dim
from zoo import CASES, Case, cases_with, fresh_export

from ir import Program, import_ep
from ir.errors import InputConstraintError
from lowering import lower, stage_module
from lowering.constraints import InputCheck, check_inputs, linear_form
from transforms import split_stages, transform

BATCH = Dim("b", min=2, max=64)


# --- helpers --------------------------------------------------------------------------------------


def _ranges(rc: Any) -> list[tuple[int, float]]:
    """The bounds of each range constraint, sorted (symbols' names differ between exports)."""
    return sorted((int(vr.lower), float(vr.upper)) for vr in rc.values())


def _user_vals(p: Program) -> list[Any]:
    by_name = p.root_module.graph.by_name()
    return [by_name[s.name].meta["val"] for s in p.signature.user_inputs()]


def _dims_of(p: Program) -> dict[Any, tuple[int, int]]:
    """Each symbol of ``p``'s range constraints and its (lower, upper) bounds."""
    return {s: (int(vr.lower), int(vr.upper)) for s, vr in p.range_constraints.value.items()
            if s.is_Symbol}


def _dynamic_shapes(p: Program, m: torch.nn.Module) -> dict[str, Any]:
    """The dynamic shapes ``p`` was exported with, keyed by ``m.forward``'s parameters (the
    flat user inputs, in order): a symbol is one ``Dim`` (its range), ``a * s + b`` derived."""
    made: dict[Any, Any] = {}
    bounds = _dims_of(p)

    def dim(expr: Any) -> Any:
        (symbol,) = expr.free_symbols
        if symbol not in made:
            lo, hi = bounds[symbol]
            made[symbol] = Dim(str(symbol), min=lo, max=hi)
        a, b = linear_form(expr, symbol)
        return made[symbol] if (a, b) == (1, 0) else a * made[symbol] + b

    names = list(inspect.signature(m.forward).parameters)
    vals = _user_vals(p)
    assert len(names) == len(vals), (names, vals)
    shapes = {}
    for name, val in zip(names, vals):
        if isinstance(val, torch.Tensor):
            spec = {i: dim(d.node.expr) for i, d in enumerate(val.shape) if not isinstance(d, int)}
            shapes[name] = spec or None
        else:
            shapes[name] = None
    return shapes


def _sizes(p: Program, example: dict) -> list[dict]:
    """Three assignments of ``p``'s symbols in range, other than the example's: low, middle,
    high (each symbol at the same fraction of its range)."""
    bounds = _dims_of(p)
    picks = []
    for fraction in (0.0, 0.5, 1.0):
        at = {s: lo + round(fraction * (hi - lo)) for s, (lo, hi) in bounds.items()}
        if at == example:
            at = {s: v + 1 if v < bounds[s][1] else v - 1 for s, v in at.items()}
        picks.append(at)
    return picks


def _inputs_at(p: Program, at: dict, seed: int) -> list[Any]:
    """Fresh flat user inputs of ``p`` with each symbolic size at ``at``."""
    gen = torch.Generator().manual_seed(seed)
    made = []
    for val in _user_vals(p):
        shape = [d if isinstance(d, int) else int(d.node.expr.subs(at)) for d in val.shape]
        made.append(torch.randn(shape, generator=gen, dtype=val.dtype))
    return made


def _example_at(p: Program) -> dict:
    return {d.node.expr: int(d.node.hint) for val in _user_vals(p) if isinstance(val, torch.Tensor)
            for d in val.shape if not isinstance(d, int) and d.node.expr.is_Symbol}


def _close(a: Any, b: Any) -> bool:
    flat_a, flat_b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(flat_a) == len(flat_b) and all(
        torch.allclose(x, y, atol=1e-5) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(flat_a, flat_b)
    )


def _call(m: Callable, p: Program, flat: list[Any]) -> Any:
    """``m`` called with ``p``'s flat user inputs as its export took them (args, then kwargs)."""
    args_spec, kwargs_spec = p.call_signatures[""].in_spec.children()
    count = args_spec.num_children
    return m(*flat[:count], **dict(zip(kwargs_spec.context, flat[count:])))


def _reexport(m: torch.nn.Module, p: Program) -> torch.export.ExportedProgram:
    """``m`` exported again at ``p``'s example sizes with ``p``'s dynamic shapes."""
    flat = _inputs_at(p, _example_at(p), seed=0)
    args_spec, kwargs_spec = p.call_signatures[""].in_spec.children()
    count = args_spec.num_children
    return torch.export.export(
        m, tuple(flat[:count]), dict(zip(kwargs_spec.context, flat[count:])),
        dynamic_shapes=_dynamic_shapes(p, m), strict=False,
    )


class _Holder(torch.nn.Module):
    """A user model with a lowered module as a child, run between its own operators."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.scale = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> Any:
        return torch.utils._pytree.tree_map(
            lambda t: t * self.scale if isinstance(t, torch.Tensor) else t, self.inner(x + 0)
        )


KINDS: dict[str, Callable[[Program], torch.nn.Module]] = {
    "flat": lower,
    "outlined": lambda p: lower(transform(p)),
    "interpreter": lambda p: lower(p, interpreter=True),
}


def _check_kind(case: Case, kind: str) -> None:
    ep = fresh_export(case)
    p = import_ep(ep)
    m = KINDS[kind](p)
    again = _reexport(m, p)
    assert _ranges(again.range_constraints) == _ranges(ep.range_constraints)
    runs = again.module()
    for seed, at in enumerate(_sizes(p, _example_at(p))):
        flat = _inputs_at(p, at, seed + 1)
        assert _close(_call(runs, p, flat), _call(case.make(), p, flat)), (case.name, kind, at)


def _check_child(case: Case) -> None:
    ep = fresh_export(case)
    p = import_ep(ep)
    holder = _Holder(lower(transform(p)))
    again = _reexport(holder, p)
    assert _ranges(again.range_constraints) == _ranges(ep.range_constraints)
    runs = again.module()
    for seed, at in enumerate(_sizes(p, _example_at(p))):
        flat = _inputs_at(p, at, seed + 1)
        assert _close(_call(runs, p, flat), _call(case.make(), p, flat)), (case.name, at)


def _check_stages(case: Case, n: int) -> None:
    """Every stage module exported again with its own stage Program's dynamic shapes; the
    exported stages run in sequence compute what the eager model computes."""
    ep = fresh_export(case)
    p = import_ep(ep)
    stages = split_stages(p, n=n)
    modules = [stage_module(stages, k) for k in range(len(stages))]
    again = []
    for k, (m, sp) in enumerate(zip(modules, stages.programs)):
        exported = _reexport(m, sp)
        assert _ranges(exported.range_constraints) == _ranges(ep.range_constraints), k
        again.append(exported.module())
    names = [s.name for s in p.signature.user_inputs()]
    for seed, at in enumerate(_sizes(p, _example_at(p))):
        flat = _inputs_at(p, at, seed + 1)
        named = dict(zip(names, flat))
        keywords = {k: named[k] for k in stages.root_inputs}
        out: Any = tuple(named[k] for k in stages.inputs[0])
        for m in again:
            out = m(*out, **keywords)
        assert _close(out, _call(case.make(), p, flat)), (case.name, at)


DYNAMIC = [c.name for c in cases_with("dynamic_shapes")]
# each module kind once, on a case of each model, flat and decomposed, strict and not
SAMPLE = (
    ("dynamic_batch", "flat"),
    ("dynamic_view[strict,decomp]", "outlined"),
    ("preserve_dynamic[decomp]", "interpreter"),
)
STAGED = {"dynamic_batch": (2, 3), "dynamic_view": (2,)}


# --- the zoo's dynamic exports ---------------------------------------------------------------------


def test_the_sample_is_of_the_zoo() -> None:
    assert {name for name, _ in SAMPLE} <= set(DYNAMIC) and len(DYNAMIC) >= 4
    assert {kind for _, kind in SAMPLE} == set(KINDS)


@pytest.mark.parametrize(("name", "kind"), SAMPLE)
def test_lowered_module_exports_with_its_ranges(name: str, kind: str) -> None:
    _check_kind(CASES[name], kind)


@pytest.mark.nightly
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", DYNAMIC)
def test_every_dynamic_zoo_case_exports_again(name: str, kind: str) -> None:
    _check_kind(CASES[name], kind)


def test_a_lowered_child_exports_in_a_user_model() -> None:
    _check_child(CASES["dynamic_view"])


@pytest.mark.nightly
@pytest.mark.parametrize("name", DYNAMIC)
def test_every_dynamic_zoo_case_exports_as_a_child(name: str) -> None:
    _check_child(CASES[name])


@pytest.mark.parametrize("name", ["dynamic_batch"])
def test_stage_modules_export_with_their_ranges(name: str) -> None:
    _check_stages(CASES[name], 3)


@pytest.mark.nightly
@pytest.mark.parametrize(("name", "n"), [(c, n) for c in DYNAMIC
                                         for n in STAGED.get(c.partition("[")[0], ())])
def test_every_dynamic_zoo_split_exports_again(name: str, n: int) -> None:
    _check_stages(CASES[name], n)


# --- the programs -----------------------------------------------------------------------


class _LinearReluSum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)).sum()


def _exported(model: torch.nn.Module, shapes: Any = (({0: BATCH},))) -> tuple[Any, Program]:
    ep = torch.export.export(copy.deepcopy(model), (torch.randn(5, 4),), dynamic_shapes=shapes)
    return ep, import_ep(ep)


@pytest.mark.parametrize("kind", ["flat", "outlined"])
def test_linear_relu_sum_keeps_its_batch_range(kind: str) -> None:
    torch.manual_seed(0)
    model = _LinearReluSum()
    ep, p = _exported(model)
    again = torch.export.export(KINDS[kind](p), (torch.randn(5, 4),), dynamic_shapes=({0: BATCH},))
    (placeholder,) = [n for n in again.graph.nodes if n.op == "placeholder"
                      and n.name in again.graph_signature.user_inputs]
    batch = placeholder.meta["val"].shape[0]
    assert isinstance(batch, torch.SymInt)  # not specialized to the example's 5
    assert _ranges(again.range_constraints) == [(2, 64.0)] == _ranges(ep.range_constraints)
    for b in (2, 17, 64):
        x = torch.randn(b, 4)
        assert torch.allclose(again.module()(x), model(x), atol=1e-5)


def test_train_mode_batchnorm_exports_again_and_updates_its_stats() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).train()
    _, p = _exported(model)
    runs = torch.export.export(lower(transform(p)), (torch.randn(5, 4),),
                               dynamic_shapes=({0: BATCH},)).module()
    eager = copy.deepcopy(model)
    for b in (2, 17, 64):
        x = torch.randn(b, 4)
        assert torch.allclose(runs(x), eager(x), atol=1e-5)
        assert torch.allclose(runs.get_buffer("1.running_mean"), eager[1].running_mean, atol=1e-6)
    assert int(runs.get_buffer("1.num_batches_tracked")) == 3


def test_auto_and_dynamic_dims_take_the_programs_range() -> None:
    _, p = _exported(_LinearReluSum())
    m = lower(p)
    for hint in (Dim.AUTO, Dim.DYNAMIC):
        again = torch.export.export(m, (torch.randn(5, 4),), dynamic_shapes=({0: hint},))
        assert _ranges(again.range_constraints) == [(2, 64.0)]


def test_a_narrower_dim_is_kept() -> None:
    _, p = _exported(_LinearReluSum())
    again = torch.export.export(lower(p), (torch.randn(5, 4),),
                                dynamic_shapes=({0: Dim("b", min=4, max=32)},))
    assert _ranges(again.range_constraints) == [(4, 32.0)]


def test_a_wider_dim_than_the_program_allows_is_refused_with_the_fix() -> None:
    """The lowered module's own checks are guards: export names the bound the program holds."""
    _, p = _exported(_LinearReluSum())
    with pytest.raises(Exception, match=r"(?s)b.*128.*64"):
        torch.export.export(lower(p), (torch.randn(5, 4),),
                            dynamic_shapes=({0: Dim("b", min=2, max=128)},))


class _Tied(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[1:] + y


def test_derived_and_tied_dims_export_again() -> None:
    b = Dim("b", min=2, max=64)
    shapes = ({0: b + 1}, {0: b})
    ep = torch.export.export(_Tied(), (torch.randn(6, 4), torch.randn(5, 4)), dynamic_shapes=shapes)
    m = lower(import_ep(ep))
    again = torch.export.export(m, (torch.randn(6, 4), torch.randn(5, 4)), dynamic_shapes=shapes)
    assert _ranges(again.range_constraints) == _ranges(ep.range_constraints)
    x, y = torch.randn(10, 4), torch.randn(9, 4)
    assert torch.equal(again.module()(x, y), x[1:] + y)
    with pytest.raises(InputConstraintError, match=r"args\[1\]\.shape\[0\] to be equal to 9"):
        m(x, torch.randn(8, 4))
    untied = ({0: Dim("c", min=3, max=65)}, {0: Dim("d", min=2, max=64)})
    with pytest.raises(Exception, match=r"(?s)c.*d|d.*c"):  # the program ties them: export says so
        torch.export.export(m, (torch.randn(6, 4), torch.randn(5, 4)), dynamic_shapes=untied)


# --- the checks still hold eagerly ----------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_out_of_range_sizes_are_still_refused_eagerly(kind: str) -> None:
    _, p = _exported(_LinearReluSum())
    m = KINDS[kind](p)
    with pytest.raises(InputConstraintError, match=r"shape\[0\] to be <= 64, but got 65"):
        m(torch.randn(65, 4))
    with pytest.raises(InputConstraintError, match=r"shape\[1\] to be equal to 4, but got 5"):
        m(torch.randn(8, 5))
    again = torch.export.export(m, (torch.randn(5, 4),), dynamic_shapes=({0: BATCH},)).module()
    with pytest.raises(Exception, match="64"):  # torch's own check of the exported range
        again(torch.randn(65, 4))


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n + x.shape[0]


def test_a_dynamic_int_input_stays_symbolic() -> None:
    shapes = ({0: BATCH}, Dim.DYNAMIC)
    ep = torch.export.export(_Scaled(), (torch.randn(5, 4), 3), dynamic_shapes=shapes)
    again = torch.export.export(lower(import_ep(ep)), (torch.randn(5, 4), 3), dynamic_shapes=shapes)
    assert _ranges(again.range_constraints) == _ranges(ep.range_constraints)
    x = torch.randn(7, 4)
    assert torch.equal(again.module()(x, 9), x * 9 + 7)


class _Sums(torch.nn.Module):
    """Two inputs whose sizes the graph leaves untied: only the export's derived dim ties them."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum() + y.sum()


def test_a_derived_dim_the_graph_does_not_tie_is_still_checked() -> None:
    b = Dim("b", min=2, max=32)
    shapes = ({0: 2 * b}, {0: b})
    ep = torch.export.export(_Sums(), (torch.randn(6, 4), torch.randn(3, 4)), dynamic_shapes=shapes)
    m = lower(import_ep(ep))
    again = torch.export.export(m, (torch.randn(6, 4), torch.randn(3, 4)), dynamic_shapes=shapes)
    assert _ranges(again.range_constraints) == _ranges(ep.range_constraints)
    with pytest.raises(InputConstraintError, match=r"args\[0\]\.shape\[0\] = 7 to be of the form 2\*"):
        m(torch.randn(7, 4), torch.randn(3, 4))
    with pytest.raises(InputConstraintError, match=r"args\[1\]\.shape\[0\] to be equal to 4, but got 3"):
        m(torch.randn(8, 4), torch.randn(3, 4))
    untied = ({0: Dim("c", min=4, max=64)}, {0: Dim("d", min=2, max=32)})
    with pytest.raises(Exception, match=r"(?s)c.*d|d.*c"):  # the checks tie them as eager calls do
        torch.export.export(m, (torch.randn(6, 4), torch.randn(3, 4)), dynamic_shapes=untied)


def test_a_non_linear_size_form_is_solved_and_tied_eagerly() -> None:
    s = sympy.Symbol("s", integer=True, positive=True)
    checks = [InputCheck(True, (s**2,), dtype=torch.float32), InputCheck(True, (s**2,), dtype=torch.float32)]
    check_inputs(checks, [((), torch.zeros(9)), ((), torch.zeros(9))], {})
    with pytest.raises(InputConstraintError, match="to be equal to 9, but got 16"):
        check_inputs(checks, [((), torch.zeros(9)), ((), torch.zeros(16))], {})
    with pytest.raises(InputConstraintError, match="= 8 to be of the form s\\*\\*2"):
        check_inputs(checks, [((), torch.zeros(8)), ((), torch.zeros(8))], {})


def test_linear_form_reads_derived_dims_only() -> None:
    s, t = sympy.symbols("s t", integer=True, positive=True)
    assert linear_form(s, s) == (1, 0)
    assert linear_form(2 * s + 1, s) == (2, 1)
    assert linear_form(3 - s, s) == (-1, 3)
    for other in (s / 2, s / 2 + 1, s**2, 2 * t + 1, sympy.Integer(4)):
        assert linear_form(other, s) is None, other
