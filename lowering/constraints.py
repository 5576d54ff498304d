"""Input checks of a lowered root, as plain picklable data.

Built once from the root placeholders' fake values at lowering: each input is a tensor with
dimensions (ints or sympy expressions over the export's symbols) and a dtype, or a scalar;
checking a call follows ``ep.module()``'s rules and messages, so errors read as torch's do. One
check goes further than torch: a tensor of another dtype than exported is reported here, naming
the input, instead of failing deep inside an operator; a floating input may also have the
floating dtype the module's state has now, so inputs follow a module converted with
``.double()``, ``.half()`` or ``.to(dtype)``. Valid inputs cost no text: key paths are spelled
only for an error.

A size may be symbolic (a ``torch.SymInt``): ``torch.export.export`` of a lowered module, or of a
model holding one, calls it on fake tensors whose dynamic sizes are symbols. Such a size is never
turned into an ``int`` (that would fix the symbol to the example's size, and export would report
the dimension "specialized to a constant"): each check is the same comparison written on the
``SymInt``, which the tracer reads as a guard. A guard the export's ranges already imply costs
nothing; one they do not (a wider ``Dim`` than the program allows, two sizes the program ties
given two ``Dim`` objects) becomes the tracer's own constraint error, naming the dimension and the fix.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import attrs
import sympy
import torch

from ir.errors import InputConstraintError
from lowering.lowering_seam import get_keystr


@attrs.frozen
class InputCheck:
    """What one flat input must be: a tensor of ``dims`` or the scalar ``value``."""

    is_tensor: bool
    dims: tuple = ()
    value: Any = None
    symbolic: Any = None
    dtype: Any = None


def input_checks(placeholders: Sequence[torch.fx.Node]) -> tuple[InputCheck, ...]:
    """The picklable checks for the given root placeholders (from their ``meta['val']``)."""
    checks = []
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            checks.append(InputCheck(True, tuple(_dim(d) for d in val.shape), dtype=val.dtype))
        elif isinstance(val, torch.SymInt):
            checks.append(InputCheck(False, symbolic=_dim(val)))
        elif isinstance(val, (int, float, str)) and not isinstance(val, bool):
            checks.append(InputCheck(False, value=val))
        else:
            checks.append(InputCheck(False))
    return tuple(checks)


def _dim(d: Any) -> Any:
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if expr.is_number else expr
    return int(d)


def ranges_of(range_constraints: Any) -> dict:
    """``{symbol: (min, max)}`` from an export's range constraints (plain numbers)."""
    ranges = {}
    for symbol, vr in (range_constraints or {}).items():
        ranges[symbol] = (_bound(vr.lower, -math.inf), _bound(vr.upper, math.inf))
    return ranges


def _bound(value: Any, infinite: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, AttributeError):
        return infinite
    return infinite if math.isinf(number) else int(number)


def check_inputs(
    checks: Sequence[InputCheck],
    flat_with_path: Sequence,
    ranges: dict,
    state_dtype: torch.dtype | None = None,
) -> None:
    """Raise ``InputConstraintError`` (torch's wording) for the first input that breaks a check.

    A floating input exported as one dtype may also have ``state_dtype``, the floating dtype of
    the module's state now (after ``.double()``, ``.half()``, ``.to(dtype)``)."""
    if len(flat_with_path) != len(checks):
        raise InputConstraintError(
            f"Unexpected number of inputs (expected {len(checks)}, got {len(flat_with_path)})"
        )
    bound: dict = {}
    for (path, arg), check in zip(flat_with_path, checks):
        if check.is_tensor:
            if _tensor_fits(arg, check, state_dtype):
                for i, (want, got) in enumerate(zip(check.dims, arg.shape)):
                    if not (isinstance(want, int) and want == got):
                        _check_dim(want, _size(got), _Where(path, f".shape[{i}]"), ranges, bound)
                continue
            where = _where(path)
            if not isinstance(arg, torch.Tensor):
                raise InputConstraintError(
                    f"Expected input at {where} to be a tensor, but got {type(arg)}"
                )
            if arg.dim() != len(check.dims):
                expected = ", ".join(str(d) for d in check.dims)
                raise InputConstraintError(
                    f"Unexpected number of dimensions in input at {where}.shape "
                    f"(expected torch.Size([{expected}]), got {arg.shape})"
                )
            accepted = _accepted_dtypes(check.dtype, state_dtype)
            raise InputConstraintError(
                f"Expected input at {where} to have dtype {' or '.join(map(str, accepted))} "
                f"(exported as {check.dtype}), but got {arg.dtype}"
            )
        elif check.symbolic is not None:
            _check_dim(check.symbolic, _size(arg), _Where(path, ""), ranges, bound)
        elif check.value is not None and (type(arg) is not type(check.value) or arg != check.value):
            raise InputConstraintError(
                f"Expected input at {_where(path)} to be equal to {check.value}, but got {arg}"
            )


def _tensor_fits(arg: Any, check: InputCheck, state_dtype: torch.dtype | None) -> bool:
    return (
        isinstance(arg, torch.Tensor)
        and arg.dim() == len(check.dims)
        and (
            check.dtype is None
            or arg.dtype == check.dtype
            or (check.dtype.is_floating_point and arg.dtype == state_dtype)
        )
    )


def _accepted_dtypes(exported: torch.dtype, state_dtype: torch.dtype | None) -> list:
    accepted = [exported]
    if exported.is_floating_point and state_dtype not in (None, exported):
        accepted.append(state_dtype)
    return accepted


def _where(path: Any) -> str:
    return get_keystr(path) if path else "<input>"


@attrs.frozen
class _Where:
    """An input's key path, spelled only when an error names it (building the text on every call
    costs time, and ``torch.compile`` cannot trace it)."""

    path: Any
    suffix: str

    def __str__(self) -> str:
        return _where(self.path) + self.suffix


def _size(value: Any) -> Any:
    """A size as checks compare it: a ``SymInt`` kept symbolic (``int()`` would specialize it),
    anything else as an ``int``."""
    return value if isinstance(value, torch.SymInt) else int(value)


def _check_dim(want: Any, got: Any, where: Any, ranges: dict, bound: dict) -> None:
    """Check the size ``got`` (an ``int`` or a ``SymInt``) against the exported dim ``want``,
    binding ``want``'s symbol in ``bound`` at its first use. Only comparisons touch ``got``, so a
    symbolic size is guarded, never specialized."""
    if isinstance(want, int):
        if want != got:
            raise InputConstraintError(
                f"Expected input at {where} to be equal to {want}, but got {got}. If you meant "
                "for this dimension to be dynamic, please re-export and specify dynamic_shapes "
                "(e.g. with Dim.DYNAMIC)"
            )
        return
    symbols = want.free_symbols
    if len(symbols) != 1:
        return  # a guard deferred to run time, as torch lets it pass
    symbol = next(iter(symbols))
    line = linear_form(want, symbol)
    if symbol in bound:
        expected = _at(want, line, symbol, bound[symbol])
        if expected is not None and got != expected:
            raise InputConstraintError(f"Expected input at {where} to be equal to {expected}, but got {got}")
    elif line is not None:
        scale, offset = line
        if scale != 1 and (got - offset) % scale != 0:
            raise InputConstraintError(
                f"Expected input {where} = {got} to be of the form {want}, where {symbol} is an integer"
            )
        bound[symbol] = got if (scale, offset) == (1, 0) else (got - offset) // scale
    elif not isinstance(got, torch.SymInt):
        solution = sympy.solve(sympy.Eq(want, got), symbol)
        integral = [s for s in solution if getattr(s, "is_integer", False)]
        if not integral:
            raise InputConstraintError(
                f"Expected input {where} = {got} to be of the form {want}, where {symbol} is an integer"
            )
        bound[symbol] = int(integral[0])
    if want in ranges:
        lo, hi = ranges[want]
        if lo > 2 and got < lo:
            raise InputConstraintError(f"Expected input at {where} to be >= {lo}, but got {got}")
        if hi < math.inf and got > hi:
            raise InputConstraintError(f"Expected input at {where} to be <= {hi}, but got {got}")


def linear_form(expr: Any, symbol: Any) -> tuple[int, int] | None:
    """``(a, b)`` with ``expr == a * symbol + b`` over the integers (``a`` nonzero), else
    ``None``: the form export's derived dims take (``2 * b``, ``b + 1``).

    Laws: ``a * symbol + b - expr`` simplifies to 0. Complexity: O(1) for a symbol; a sympy
    ``Poly`` otherwise, memoized (a fact of the expression: the cache changes no answer)."""
    if getattr(expr, "is_Symbol", False):
        return 1, 0
    return _linear_form(expr, symbol)


@functools.lru_cache(maxsize=256)
def _linear_form(expr: Any, symbol: Any) -> tuple[int, int] | None:
    try:
        poly = sympy.Poly(expr, symbol)
    except sympy.PolynomialError:
        return None
    if poly.degree() != 1:
        return None
    a, b = (poly.all_coeffs() + [0])[:2]
    if not (getattr(a, "is_integer", False) and getattr(b, "is_integer", False)) or a == 0:
        return None
    return int(a), int(b)


def _at(want: Any, line: tuple[int, int] | None, symbol: Any, value: Any) -> Any:
    """``want`` with ``symbol`` at ``value`` (an ``int`` or a ``SymInt``); ``None`` where a
    symbolic value meets a non-linear form (left to the graph's own guards, as torch does)."""
    if line is not None:
        scale, offset = line
        return value if (scale, offset) == (1, 0) else scale * value + offset
    if isinstance(value, torch.SymInt):
        return None
    return want.subs(symbol, value)
