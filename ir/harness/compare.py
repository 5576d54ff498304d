"""Comparing what two runs computed: position by position, every difference seen.

``value_difference`` is the one comparison of the laws (``check_laws``, ``check_rule``,
``check_rule_in_context``): a NaN equals only a NaN, ±inf only itself, -0.0 differs from +0.0
(unless an assumption of ``SIGNLESS_ZEROS`` is declared), finite values are close within the
tolerance of the dtype the result is computed in (``ir.harness.tolerance``). ``same_bits`` is
the stricter equality of the determinism law.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from ir.harness.tolerance import tolerance

SIGNLESS_ZEROS = frozenset({"no_signed_zeros", "reassociate"})
"""The assumptions under which a zero result's sign is not judged (-0.0 equals +0.0):
``no_signed_zeros`` says so; ``reassociate`` implies it, since regrouping flips the sign of an
exact zero by nature (``a*b - a*c`` is +0.0 where ``a*(b - c)`` is -0.0 at ``a = -1, b = c``),
as every compiler's reassociation assumes (LLVM's ``reassoc`` is used with ``nsz``). ``no_nans``
and ``no_infs`` do not: they speak of other values (``0.0 * x -> 0.0`` stays wrong under them
at negative ``x``). Inputs keep their drawn sign: only the comparison of results changes."""


def signless_zeros(assumes: frozenset[str]) -> bool:
    """Whether ``assumes`` makes -0.0 equal +0.0 in a comparison (one of ``SIGNLESS_ZEROS``).
    O(1)."""
    return not SIGNLESS_ZEROS.isdisjoint(assumes)


FINITE_TOLERANCE = frozenset({"no_nans", "no_infs"})
"""What a user's tolerance (``atol``/``rtol`` given to ``check_laws``' semantics law) means at
the IEEE specials: a tolerance speaks of finite values. Where the wanted side (the input
program, or ``reference=``) is NaN or ±inf the position is not judged (a pass that
approximates gives a finite value where the reference overflowed, NaN where it gave inf, ...);
where the wanted side is finite the result must be finite and within the tolerance. As a
comparison's ``assumes`` this is the relaxation of ``no_nans`` and ``no_infs``; nothing about
drawing. Without a tolerance the comparison stays exact (NaN equals NaN, ±inf itself).
``judged_positions`` counts what it leaves unjudged."""


@attrs.define
class Judged:
    """How many output positions a law judged by value (``judged``: the wanted side finite,
    or an integer or bool) and how many a tolerance left unjudged (``excused``: the wanted
    side NaN or ±inf and the result other than it), summed over the calls it is given to
    (``judged_positions``). A pass judged on no position while some were excused was not put
    to the test by value."""

    judged: int = 0
    excused: int = 0

    def add(self, got: Any, want: Any) -> None:
        """Count the positions of ``got`` against ``want`` (``judged_positions``)."""
        j, e = judged_positions(got, want)
        self.judged += j
        self.excused += e


def judged_positions(got: Any, want: Any) -> tuple[int, int]:
    """``(judged, excused)`` over the tensors of ``want`` (recursive over tuples, lists and
    dicts, as ``value_difference``): judged, the positions of an integer or bool tensor and
    those where a floating ``want`` is finite; excused, those where it is NaN or ±inf and
    ``got`` (same shape) is not the same special (``FINITE_TOLERANCE`` leaves them unjudged).
    Leaves of other kinds, or of other shapes, count nothing. O(elements)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return 0, 0
        w = want.detach().cpu()
        if w.is_complex():
            w = torch.view_as_real(w.resolve_conj())
        if not w.is_floating_point():
            return w.numel(), 0
        g = got.detach().cpu()
        if g.is_complex():
            g = torch.view_as_real(g.resolve_conj())
        if g.shape != w.shape:
            return 0, 0
        w64, g64 = w.to(torch.float64), g.to(torch.float64)
        finite = torch.isfinite(w64)
        same = (torch.isnan(w64) & torch.isnan(g64)) | (w64 == g64)
        return int(finite.sum()), int((~finite & ~same).sum())
    items: list[tuple[Any, Any]] = []
    if isinstance(want, (tuple, list)) and isinstance(got, (tuple, list)):
        items = list(zip(got, want))
    elif isinstance(want, Mapping) and isinstance(got, Mapping):
        items = [(got[k], want[k]) for k in want if k in got]
    judged = excused = 0
    for g, w in items:
        j, e = judged_positions(g, w)
        judged += j
        excused += e
    return judged, excused


@attrs.frozen
class Regrouped:
    """A reference position set for a regrouped computation: ``exact``, the wanted result
    computed in float64, and ``terms``, the same computation on the absolute values of its
    floating inputs (float64, same shape), which bounds ``sum(|terms|)`` at each position of a
    sum of products. ``None`` for ``terms`` where that run was not possible."""

    exact: torch.Tensor
    terms: torch.Tensor | None = None


def with_terms(exact: Any, terms: Any) -> Any:
    """``exact`` (a reference: the wanted side in float64) with each tensor leaf that has a
    tensor of its shape at the same place in ``terms`` (the run on absolute inputs) made a
    :class:`Regrouped` of the two; other leaves as they are. ``terms`` may be ``None`` or of
    another structure (then the leaves stay plain). O(elements of the structure)."""
    if isinstance(exact, torch.Tensor):
        if (isinstance(terms, torch.Tensor) and terms.shape == exact.shape
                and not exact.is_complex() and not terms.is_complex()):
            return Regrouped(exact, terms)
        return exact
    if isinstance(exact, (tuple, list)):
        fit = isinstance(terms, (tuple, list)) and len(terms) == len(exact)
        items = [with_terms(x, terms[i] if fit else None) for i, x in enumerate(exact)]
        return tuple(items) if isinstance(exact, tuple) else items
    if isinstance(exact, Mapping):
        fit = isinstance(terms, Mapping)
        return {k: with_terms(v, terms.get(k) if fit else None) for k, v in exact.items()}
    return exact


def value_difference(
    got: Any,
    want: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    strides: bool = False,
    assumes: frozenset[str] = frozenset(),
    what: str = "result",
    reference: Any = None,
) -> str | None:
    """``None`` when ``got`` equals ``want``, else one sentence naming where and how they differ.

    Recursive over tuples, lists and dicts (the sentence names the path: ``result [1]['k']``).
    A tensor is compared by type, shape, dtype, device, strides (when ``strides``; sizes of 1
    and tensors of fewer than two elements are layout-free), then position by position:

    - NaN equals NaN only; ±inf equals itself only; -0.0 differs from +0.0;
    - finite values are equal when ``|got - want| <= atol + rtol * |want|``, with ``(rtol,
      atol)`` given or else ``tolerance(want.dtype)`` (the dtype the result is computed in,
      never an input's); ints and bools are compared exactly.

    Python floats compare the same way; ints, bools, strings and other values with ``==``.

    ``assumes`` (``transforms.rewrite.rule.ASSUMPTIONS``) relaxes the comparison as LLVM's
    fast-math flags relax semantics: ``no_nans``, a position where ``want`` is NaN may hold
    anything; ``no_infs``, likewise where ``want`` is ±inf; ``no_signed_zeros``, -0.0 equals
    +0.0; ``reassociate``, -0.0 equals +0.0 too (``SIGNLESS_ZEROS``) and the tolerance is ``ir.harness.tolerance.REASSOCIATE`` times wider,
    and, given ``reference`` (``want`` computed in float64, same structure), a finite position
    is also equal when ``got`` errs from the reference at most twice as much as ``want`` does
    (plus the tolerance): regrouped sums round elsewhere, no worse than the original.

    The sentence gives how many positions differ, the first flat index and both values.

    Laws: ``value_difference(x, x) is None`` for every ``x`` (NaNs included); not symmetric in
    general (the tolerance scales with ``|want|``). Complexity: O(elements).
    """
    found = find_difference(got, want, rtol=rtol, atol=atol, strides=strides, assumes=assumes,
                            what=what, reference=reference)
    return None if found is None else str(found)


@attrs.frozen
class Difference:
    """A difference between two runs, as a value: ``what`` was compared (``"outputs"``,
    ``"state 'w'"``), ``path`` the indices and keys into it down to the position that differs
    (``(1, 'k')``), ``got`` and ``want`` each side's account (``"shape (2,)"`` and ``"(3,)"``;
    ``"values differ at ...: got 1.0"`` and ``"2.0"``), ``wanted`` how the wanted side is named
    (``"want"``; a law says ``"the pattern gives"``, ``"the original gives"``). ``str`` gives
    the sentence: ``"outputs [1] ['k']: shape (2,), want (3,)"``."""

    what: str
    path: tuple = ()
    got: str = ""
    want: str = ""
    wanted: str = "want"

    def __str__(self) -> str:
        where = self.what + "".join(f" [{k!r}]" for k in self.path)
        return f"{where}: {self.got}, {self.wanted} {self.want}"


def find_difference(
    got: Any,
    want: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    strides: bool = False,
    assumes: frozenset[str] = frozenset(),
    what: str = "result",
    reference: Any = None,
) -> Difference | None:
    """:func:`value_difference` as a structured :class:`Difference` (``None`` when equal):
    the same comparison, with the path to the first difference kept as indices and keys, so a
    law can tell which output, input or state differs without reading its message.
    Complexity: O(elements)."""
    assumes = frozenset(assumes)
    ref = reference if reference is not None and "reassociate" in assumes else None
    found = _difference(got, want, (), rtol, atol, strides, assumes, ref)
    return None if found is None else Difference(what, *found)


def regrouped_difference(
    difference: Callable[[Any], str | None],
    reference: Callable[[], Any],
    assumes: frozenset[str],
) -> str | None:
    """What a law reports for one draw, judged as ``assumes`` allow: ``difference(None)``;
    under ``reassociate``, where that finds a difference, ``difference(ref)`` instead, ``ref =
    reference()`` being the wanted side computed again with its floating values widened to
    float64 (``ir.harness.widen``; ``None`` where it cannot be, and then the first verdict
    stands). ``difference(ref)`` passes ``ref`` on as ``value_difference``'s ``reference``.

    The one place the laws (``check_rule``, ``check_rule_in_context``) judge a regrouped
    computation, so they give the same verdict on the same draw.

    Laws: ``None`` whenever ``difference(None)`` is ``None`` (``reference`` is then not run);
    without ``reassociate``, ``difference(None)``. Complexity: one or two comparisons, plus one
    run of ``reference`` where the first finds a difference.
    """
    problem = difference(None)
    if not problem or "reassociate" not in assumes:
        return problem
    ref = reference()
    if ref is None:
        return problem
    return difference(ref)


Found = tuple[tuple, str, str] | None
"""What the recursive comparison returns: ``(path, got, want)`` of the first difference (each
side's account), or ``None``."""


def _difference(got: Any, want: Any, path: tuple, rtol: float | None, atol: float | None,
                strides: bool, assumes: frozenset[str], ref: Any = None) -> Found:
    if isinstance(want, torch.Tensor):
        return _tensor_difference(got, want, path, rtol, atol, strides, assumes, ref)
    if isinstance(want, (tuple, list)):
        if type(got) is not type(want):
            return path, f"a {type(got).__name__}", f"a {type(want).__name__}"
        if len(got) != len(want):
            return path, f"{len(got)} items", f"{len(want)}"
        refs = ref if isinstance(ref, (tuple, list)) and len(ref) == len(want) else None
        for k, (g, w) in enumerate(zip(got, want)):
            found = _difference(g, w, (*path, k), rtol, atol, strides, assumes,
                                refs[k] if refs is not None else None)
            if found:
                return found
        return None
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return path, f"a {type(got).__name__}", f"a {type(want).__name__}"
        if set(got) != set(want):
            return path, f"keys {sorted(map(repr, got))}", f"{sorted(map(repr, want))}"
        refs = ref if isinstance(ref, Mapping) else {}
        for k in want:
            found = _difference(got[k], want[k], (*path, k), rtol, atol, strides,
                                assumes, refs.get(k))
            if found:
                return found
        return None
    if isinstance(want, float) and not isinstance(want, bool):
        if not isinstance(got, float):
            return path, f"{got!r} ({type(got).__name__})", f"{want!r} (float)"
        r, a = _float_tol(assumes)
        if _float_equal(got, want, r if rtol is None else rtol, a if atol is None else atol,
                        assumes):
            return None
        return path, f"{got!r}", f"{want!r}"
    if isinstance(got, torch.Tensor):
        return path, "a tensor", f"a {type(want).__name__} {want!r}"
    if type(got) is not type(want) or got != want:
        return path, f"{got!r}", f"{want!r}"
    return None


def _float_tol(assumes: frozenset[str]) -> tuple[float, float]:
    return tolerance(torch.float64, reassociate="reassociate" in assumes)


def _float_equal(got: float, want: float, rtol: float, atol: float,
                 assumes: frozenset[str]) -> bool:
    if math.isnan(want):
        return math.isnan(got) or "no_nans" in assumes
    if math.isinf(want) and "no_infs" in assumes:
        return True
    if math.isnan(got) or math.isinf(got) or math.isinf(want):
        return got == want
    if got == 0.0 and want == 0.0 and not signless_zeros(assumes):
        return math.copysign(1.0, got) == math.copysign(1.0, want)
    return abs(got - want) <= atol + rtol * abs(want)


def _tensor_difference(got: Any, want: torch.Tensor, path: tuple, rtol: float | None,
                       atol: float | None, strides: bool, assumes: frozenset[str],
                       ref: Any = None) -> Found:
    if not isinstance(got, torch.Tensor):
        return path, f"a {type(got).__name__}", "a tensor"
    if got.shape != want.shape:
        return path, f"shape {tuple(got.shape)}", f"{tuple(want.shape)}"
    if got.dtype != want.dtype:
        return path, f"dtype {got.dtype}", f"{want.dtype}"
    if got.device != want.device:
        return path, f"device {got.device}", f"{want.device}"
    if strides and _layout(got) != _layout(want):
        return path, f"strides {tuple(got.stride())}", f"{tuple(want.stride())}"
    g, w = got.detach().cpu(), want.detach().cpu()
    if w.is_complex():
        g, w = torch.view_as_real(g.resolve_conj()), torch.view_as_real(w.resolve_conj())
    if not (w.is_floating_point()):
        bad = g != w
        return _report(path, bad, g, w)
    if _same_bits(g, w):
        return None  # every position equal, NaN to NaN, each zero its sign: nothing differs
    r, a = tolerance(want.dtype, reassociate="reassociate" in assumes)
    r = r if rtol is None else rtol
    a = a if atol is None else atol
    g64, w64 = g.to(torch.float64), w.to(torch.float64)
    nan_g, nan_w = torch.isnan(g64), torch.isnan(w64)
    inf_g, inf_w = torch.isinf(g64), torch.isinf(w64)
    close = (g64 - w64).abs() <= a + r * w64.abs()
    terms = None
    if isinstance(ref, Regrouped):
        ref, terms = ref.exact, ref.terms
    if isinstance(ref, torch.Tensor) and ref.shape == want.shape and not w.is_complex():
        r64 = ref.detach().cpu().to(torch.float64)
        own = (w64 - r64).abs()
        close |= (g64 - r64).abs() <= 2 * torch.nan_to_num(own, nan=0.0, posinf=0.0) + a + \
            r * r64.abs()
        if isinstance(terms, torch.Tensor) and terms.shape == want.shape:
            # the bound of any regrouping: n * eps * sum(|terms|), at the dtype's own tolerance
            own_r, own_a = tolerance(want.dtype)
            scale = torch.nan_to_num(terms.detach().cpu().to(torch.float64).abs(), nan=0.0,
                                     posinf=0.0)
            close |= (g64 - r64).abs() <= own_a + own_r * torch.maximum(scale, r64.abs())
    if not signless_zeros(assumes):
        zeros = (g64 == 0) & (w64 == 0)
        close &= ~(zeros & (torch.signbit(g64) != torch.signbit(w64)))
    special = nan_g | nan_w | inf_g | inf_w
    ok = torch.where(special, (nan_g & nan_w) | (inf_g & inf_w & (g64 == w64)), close)
    if "no_nans" in assumes:
        ok |= nan_w
    if "no_infs" in assumes:
        ok |= inf_w
    return _report(path, ~ok, g, w)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(g: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether two floating tensors of one shape and dtype hold the same bits at every
    position: then no tolerance, assumption or reference can find a difference (a NaN is
    NaN on both sides, an infinity the same, a zero of the same sign), and the position by
    position comparison is skipped. O(elements), one comparison."""
    bits = _BITS.get(w.element_size())
    if bits is None or g.is_neg() or w.is_neg():  # a lazily negated view: compared in full
        return False
    return torch.equal(g.view(bits), w.view(bits))


def same_layout(a: Any, b: Any) -> bool:
    """Whether tensors ``a`` and ``b`` of one shape are laid out alike: equal strides along
    every dimension of size above 1 (a tensor of fewer than two elements has no layout to
    differ in); ``True`` for anything but two tensors of one shape. What ``value_difference``
    compares under ``strides=True``. O(rank)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return True
    return _layout(a) == _layout(b)


def _layout(t: torch.Tensor) -> tuple:
    if t.numel() < 2:
        return ()
    return tuple((i, s) for i, (n, s) in enumerate(zip(t.shape, t.stride())) if n != 1)


def _report(path: tuple, bad: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> Found:
    if not bool(bad.any()):
        return None
    flat = bad.reshape(-1)
    j = int(flat.nonzero()[0])
    gv, wv = g.reshape(-1)[j].item(), w.reshape(-1)[j].item()
    return path, (f"values differ at {int(flat.sum())} of {flat.numel()} positions; first at "
                  f"flat index {j}: got {gv!r}"), repr(wv)


def same_bits(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same bit for bit: tensors of equal dtype, shape and
    device whose elements have equal bit patterns (a NaN equals a NaN of the same payload,
    -0.0 differs from +0.0; strides and storage are not compared: new tensors compare by
    value); tuples, lists and dicts item by item; floats by their bits; anything else by
    ``==`` and type. Complexity: O(elements)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        return bool(torch.equal(_bits(a), _bits(b)))
    if isinstance(a, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_bits(x, y) for x, y in zip(a, b)))
    if isinstance(a, Mapping):
        return (isinstance(b, Mapping) and set(a) == set(b)
                and all(same_bits(a[k], b[k]) for k in a))
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and a == b


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().cpu().reshape(-1).clone(memory_format=torch.contiguous_format)
    if flat.is_complex():
        flat = torch.view_as_real(flat.resolve_conj()).reshape(-1)
    return flat.view(torch.uint8)


__all__ = [
    "FINITE_TOLERANCE",
    "SIGNLESS_ZEROS",
    "Difference",
    "Judged",
    "Regrouped",
    "find_difference",
    "judged_positions",
    "regrouped_difference",
    "same_bits",
    "same_layout",
    "signless_zeros",
    "value_difference",
    "with_terms",
]
