"""Hypothesis strategies for the values the laws run programs on: elements at the IEEE edges,
tensors in several memory layouts, sizes that broadcast along any dimension, scalar arguments.

Each strategy shrinks toward ordinary values (small finite numbers, contiguous layout, the
example's sizes), so a counterexample found at an edge is reported at the simplest edge that
still breaks the law.

Assumptions (``transforms.rewrite.rule.ASSUMPTIONS``, given as plain strings here) narrow what
is drawn, after LLVM's fast-math flags: ``no_nans`` draws no NaN; ``no_infs`` no ±inf and no
magnitude at or past an overflow point (of ``exp``, ``square``, cubing, the largest finite);
``no_signed_zeros`` no -0.0. ``reassociate`` changes nothing drawn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from hypothesis import strategies as st

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
"""The floating dtypes the laws draw tensors and scalars in."""

LAYOUTS = ("contiguous", "transposed", "strided", "expanded")
"""The memory layouts ``tensors`` draws (``laid_out`` makes each): contiguous; transposed (the
last two dimensions swapped over a contiguous tensor of the swapped shape); strided (every
second element of the last dimension of a larger tensor); expanded (stride 0 along the first
dimension larger than 1, whose values are then equal along it)."""

ORDINARY = (0.0, 1.0, -1.0, 0.5, 2.0, -2.0, 3.0, 0.1, -0.75, 10.0)
"""Ordinary finite values, the first the simplest (the shrink target)."""

SMALL_INTS = (0, 1, -1, 2, -2, 3, -3)
"""Integer elements."""

SCALARS = {
    "float": (0.0, -0.0, -1.0, 0.1, 0.5, 2.0, -1.5, 1e4, 1e30),
    "int": (0, 1, -1, 2, 3, 7),
}
"""Scalar arguments per kind: zero, -0.0, negative, fractional, above one, large."""

KNOWN = frozenset({"no_nans", "no_infs", "no_signed_zeros", "reassociate"})


def check_assumes(assumes: Sequence[str] | frozenset[str]) -> frozenset[str]:
    """``assumes`` as a frozenset, checked to be a set out of :data:`KNOWN` (``ValueError``
    naming the allowed ones otherwise; a bare string is refused, not split). O(len(assumes))."""
    if isinstance(assumes, str) or not set(assumes) <= KNOWN:
        raise ValueError(f"assumes must be a set out of {sorted(KNOWN)}, got {assumes!r}")
    return frozenset(assumes)


def overflow_points(dtype: torch.dtype) -> dict[str, float]:
    """The smallest magnitudes at which ``exp`` (``log(max)``), ``square`` (``sqrt(max)``) and
    cubing (``max ** (1/3)``) overflow to inf in floating ``dtype``. O(1)."""
    top = torch.finfo(dtype).max
    return {"exp": math.log(top), "square": math.sqrt(top), "cube": top ** (1 / 3)}


def edges(dtype: torch.dtype, *, assumes: frozenset[str] = frozenset()) -> tuple[float, ...]:
    """The edge values of floating ``dtype`` that ``assumes`` admits: -0.0; ±inf; NaN; ±a
    subnormal; ±the largest finite; ±just past each overflow point (``overflow_points``), and
    the negated ``exp`` one (``exp`` underflows to 0 there). O(1)."""
    assumes = check_assumes(assumes)
    info = torch.finfo(dtype)
    out: list[float] = []
    if "no_signed_zeros" not in assumes:
        out.append(-0.0)
    sub = info.smallest_normal / 4
    out += [sub, -sub]
    if "no_infs" not in assumes:
        out += [math.inf, -math.inf, info.max, -info.max]
        for v in overflow_points(dtype).values():
            out += [v * 1.01, -v * 1.01]
    if "no_nans" not in assumes:
        out.append(math.nan)
    return tuple(out)


def int_edges(dtype: torch.dtype) -> tuple[int, ...]:
    """The edge values of integer ``dtype``: its largest and smallest, and ± the smallest
    magnitude whose square overflows it (``2 ** (bits // 2)``: ``(i * j) // j`` is not ``i``
    there, the product wraps). O(1)."""
    info = torch.iinfo(dtype)
    half = 2 ** (info.bits // 2)
    return (info.max, info.min, half, -half) if info.min < 0 else (info.max, info.min, half)


def conversion_edges(src: torch.dtype, dst: torch.dtype) -> tuple[float | int, ...]:
    """Values of ``src`` at the edges of a conversion of ``src`` to ``dst``, in both directions
    (``.to(dst)``, ``_to_copy(dtype=dst)``, ``type_as``, an integer cast): where ``dst`` is an
    integer type, its smallest and largest and one past each (``-129, -128, 127, 128`` for
    int8), and for a floating ``src`` also half past each (``127.5``: rounds or truncates) and
    ``±2 ** bits`` (a float far outside the range, which a cast wraps or saturates); where
    ``dst`` is a narrower float, its largest finite and just past it (``65504``, ``65536`` for
    float16: rounds to inf) and half its smallest normal (underflows to a subnormal); where an
    integer ``src`` goes to a float, the first integer that float cannot hold
    (``2 ** 24 + 1`` for float32). Only values ``src`` holds (an int in its range, a finite
    float within its largest) are kept; ``()`` for bool and complex either side, or
    ``src == dst``. O(1).

    Laws: every value is exactly representable in ``src`` when ``src`` is an integer type and
    finite in ``src`` when it is a float."""
    if src == dst or torch.bool in (src, dst) or src.is_complex or dst.is_complex:
        return ()
    out: list[float | int] = []
    if not dst.is_floating_point:
        info = torch.iinfo(dst)
        out += [info.min, info.max, info.min - 1, info.max + 1]
        if src.is_floating_point:
            out += [info.min - 0.5, info.max + 0.5, -(2.0 ** info.bits), 2.0 ** info.bits]
    elif src.is_floating_point:
        narrow, wide = torch.finfo(dst), torch.finfo(src)
        if narrow.max < wide.max or narrow.eps > wide.eps:
            out += [narrow.max, -narrow.max, narrow.max * (1 + 2 * narrow.eps),
                    -narrow.max * (1 + 2 * narrow.eps), narrow.smallest_normal / 2]
    else:
        info = torch.finfo(dst)
        mantissa = round(-math.log2(info.eps))  # 23 for float32
        first = 2 ** (mantissa + 1) + 1
        out += [first, -first]
        if info.max < torch.iinfo(src).max:
            past = int(info.max) + 2 ** (round(math.log2(info.max)) - mantissa)
            out += [past, -past]
    return tuple(dict.fromkeys(v for v in out if _holds(src, v)))


def _holds(dtype: torch.dtype, v: float) -> bool:
    if dtype.is_floating_point:
        return math.isfinite(v) and abs(v) <= torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    return float(v).is_integer() and info.min <= v <= info.max


def conversions_edges(dtype: torch.dtype,
                      conversions: Sequence[tuple[torch.dtype, torch.dtype]]) -> tuple:
    """The values of ``dtype`` at the edges of every conversion in ``conversions`` (``(src,
    dst)`` pairs, as a pattern performs them), whatever its source: a value reaches a
    conversion through the ops before it, so each edge ``dtype`` holds is offered to every
    argument (``conversion_edges(dtype, dst)`` and ``conversion_edges(src, dst)`` kept where
    ``dtype`` holds it). O(len(conversions))."""
    out: list[float | int] = []
    for src, dst in conversions:
        out += conversion_edges(dtype, dst) + conversion_edges(src, dst)
    if dtype == torch.bool or dtype.is_complex:
        return ()
    return tuple(dict.fromkeys(v for v in out if _holds(dtype, v)))


def elements(dtype: torch.dtype, *, assumes: frozenset[str] = frozenset(),
             extra: Sequence[float | int] = ()) -> st.SearchStrategy:
    """One element of a tensor of ``dtype``: for a floating dtype an ordinary value
    (``ORDINARY`` or a float in [-4, 4]) or an edge value (``edges``: ±0.0, ±inf, NaN,
    subnormals, the largest finite, magnitudes past ``exp``'s / ``square``'s / cubing's overflow
    in ``dtype``), only those ``assumes`` admits; for an int dtype a small int, one up to
    ±100, or an edge (``int_edges``: its bounds, ± where a square overflows); for bool a bool.
    ``extra``: more edge values drawn as often as the dtype's own (the edges of the
    conversions a pattern performs: ``conversions_edges``).

    Shrinks toward ordinary values, ``0.0`` first (edges shrink to ordinary values)."""
    assumes = check_assumes(assumes)
    if dtype == torch.bool:
        return st.booleans()
    more = (st.sampled_from(tuple(extra)),) if extra else ()
    if not (dtype.is_floating_point or dtype.is_complex):
        return st.one_of(st.sampled_from(SMALL_INTS), st.integers(-100, 100),
                         st.sampled_from(int_edges(dtype)), *more)
    real = dtype if dtype.is_floating_point else _real(dtype)
    ordinary = st.one_of(
        st.sampled_from(ORDINARY),
        st.floats(-4.0, 4.0, allow_nan=False, allow_infinity=False).map(
            lambda v: 0.0 if v == 0 else v),
    )
    if "no_signed_zeros" in assumes:
        ordinary = ordinary.map(lambda v: 0.0 if v == 0 else v)
    return st.one_of(ordinary, st.sampled_from(edges(real, assumes=assumes)), *more)


def _real(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(
        dtype, torch.float32)


WHOLE = 64
"""Tensors of at most this many elements are drawn element by element; larger ones are a
seeded fill with up to ``OVERRIDES`` positions drawn by ``elements``."""
OVERRIDES = 8
PALETTE = 3
"""A tensor drawn whole is, a quarter of the time, made of at most this many values drawn by
``elements``, each repeated at positions drawn (so edges meet edges along a reduction)."""


@st.composite
def tensors(
    draw: st.DrawFn,
    shape: Sequence[int],
    dtype: torch.dtype,
    *,
    assumes: frozenset[str] = frozenset(),
    layout: str | None = None,
    extra: Sequence[float | int] = (),
) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` whose elements come from ``elements(dtype,
    assumes=assumes, extra=extra)``, laid out per ``layout`` (one of ``LAYOUTS``; ``None``: drawn).

    Up to ``WHOLE`` elements each is drawn, or (a quarter of the time) a palette of up to ``PALETTE``
    values is drawn and each element picks one of them; a larger tensor is a seeded fill (normal values,
    or one element everywhere) with up to ``OVERRIDES`` positions drawn. An ``"expanded"``
    tensor's values are drawn for the shape with its first dimension above 1 made 1, then
    expanded (stride 0 there).

    Shrinks toward zeros (then ordinary values), elements drawn each on its own, the normal
    fill with seed 0, and the contiguous layout (``LAYOUTS`` in order)."""
    assumes = check_assumes(assumes)
    shape = tuple(int(s) for s in shape)
    if layout is None:
        layout = draw(st.sampled_from(LAYOUTS))
    elif layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return in_layout(lambda values_shape: _values(draw, values_shape, dtype, assumes,
                                                  tuple(extra)), shape, layout)


def _values(draw: st.DrawFn, shape: tuple[int, ...], dtype: torch.dtype,
            assumes: frozenset[str], extra: tuple = ()) -> torch.Tensor:
    n = math.prod(shape)
    one = elements(dtype, assumes=assumes, extra=extra)
    wide = torch.float64 if (dtype.is_floating_point or dtype.is_complex) else torch.int64
    if dtype == torch.bool:
        wide = torch.bool
    if n <= WHOLE:
        if draw(st.integers(0, 3)) == 3:
            # a few values repeated: several edges along one reduction (two largest finite
            # values summed in a row overflow), one value everywhere among them
            palette = draw(st.lists(one, min_size=1, max_size=PALETTE))
            picks = st.integers(0, len(palette) - 1)
            drawn = [palette[k] for k in draw(st.lists(picks, min_size=n, max_size=n))]
        else:
            drawn = draw(st.lists(one, min_size=n, max_size=n))
        return torch.tensor(drawn, dtype=wide).reshape(shape).to(dtype)
    fill = draw(st.sampled_from(("normal", "constant")))
    seed = draw(st.integers(0, 2**16 - 1))
    gen = torch.Generator().manual_seed(seed)
    if fill == "constant":
        flat = torch.full((n,), draw(one), dtype=wide)
    elif wide == torch.float64:
        flat = torch.randn(n, generator=gen, dtype=torch.float64)
    elif wide == torch.bool:
        flat = torch.randint(0, 2, (n,), generator=gen).bool()
    else:
        flat = torch.randint(-3, 4, (n,), generator=gen)
    for j, v in draw(st.lists(st.tuples(st.integers(0, n - 1), one), max_size=OVERRIDES)):
        flat[j] = v
    return flat.reshape(shape).to(dtype)


def in_layout(make: Callable[[tuple[int, ...]], torch.Tensor], shape: tuple[int, ...],
              layout: str) -> torch.Tensor:
    """The tensor of ``shape`` in ``layout`` (``LAYOUTS``) holding the values ``make`` gives for
    the shape it is asked: ``shape`` itself, then :func:`laid_out`; for ``"expanded"``, the
    shape with its first dimension above 1 made 1, expanded back to ``shape`` (stride 0 there).
    What :func:`tensors` and ``seeded_values`` both lay out. O(elements)."""
    values_shape = shape
    if layout == "expanded":
        big = [d for d, n in enumerate(shape) if n > 1]
        if big:
            values_shape = tuple(1 if d == big[0] else n for d, n in enumerate(shape))
    t = make(values_shape)
    if values_shape != shape:
        return t.expand(shape)
    return laid_out(t, layout)


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A new tensor with ``t``'s values (shape, dtype) in memory layout ``layout`` (``LAYOUTS``):
    ``"contiguous"``; ``"transposed"`` (the last two dimensions of a contiguous tensor of the
    swapped shape, swapped back; as contiguous below 2 dimensions); ``"strided"`` (a slice with
    step 2 of the last dimension of a larger tensor; as contiguous for 0 dimensions);
    ``"expanded"`` (stride 0 along the first dimension above 1 along which ``t`` is constant;
    ``ValueError`` when there is none but such a dimension exists). Never shares ``t``'s
    storage. O(elements)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    t = t.detach()
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided" and t.dim() >= 1:
        bigger = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)
        bigger[..., ::2] = t
        return bigger[..., ::2]
    if layout == "expanded":
        big = [d for d, n in enumerate(t.shape) if n > 1]
        for d in big:
            first = t.narrow(d, 0, 1)
            if bool((_same(t, first.expand(t.shape))).all()):
                return first.clone().expand(t.shape)
        if big:
            raise ValueError(
                f"laid_out: a tensor of shape {tuple(t.shape)} that is constant along no "
                "dimension cannot be expanded with the same values")
    return t.clone(memory_format=torch.contiguous_format)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.is_floating_point():
        return (a == b) & (torch.signbit(a) == torch.signbit(b)) | (a.isnan() & b.isnan())
    return a == b


@st.composite
def sizes(draw: st.DrawFn, shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """New shapes for a signature's tensors ``shapes`` (one per tensor argument): each distinct
    size mapped to itself, 1, another size of the signature or one more (equal sizes stay
    equal), then each dimension of each argument on its own kept or made 1 or another size of
    the signature (so broadcasting along any dimension is drawn).

    Shrinks toward ``shapes`` themselves."""
    shapes = [tuple(int(s) for s in sh) for sh in shapes]
    distinct = sorted({s for sh in shapes for s in sh})
    remap = {}
    for s in distinct:
        choices = [s, 1, *[o for o in distinct if o != s], s + 1]
        remap[s] = draw(st.sampled_from(list(dict.fromkeys(choices))))
    out = []
    for sh in shapes:
        new = []
        for s in sh:
            choices = [remap[s], 1, *distinct]
            new.append(draw(st.sampled_from(list(dict.fromkeys(choices)))))
        out.append(tuple(new))
    return tuple(out)


def size_variants(shapes: Sequence[Sequence[int]]) -> list[tuple[tuple[int, ...], ...]]:
    """The deterministic counterpart of ``sizes``, for callers that must enumerate (each variant
    costs a trace): each distinct size mapped everywhere to 1, to each other size of the
    signature and to one more; then each single dimension of each argument made 1 or each other
    size of the signature. In that order, without repeats, ``shapes`` itself excluded.
    O(dimensions · distinct sizes)."""
    shapes = tuple(tuple(int(s) for s in sh) for sh in shapes)
    distinct = sorted({s for sh in shapes for s in sh})
    seen = {shapes}
    out = []

    def add(v: tuple) -> None:
        if v not in seen:
            seen.add(v)
            out.append(v)

    for s in distinct:
        for new in (1, *[o for o in distinct if o != s], s + 1):
            add(tuple(tuple(new if d == s else d for d in sh) for sh in shapes))
    for i, sh in enumerate(shapes):
        for k, s in enumerate(sh):
            for new in (1, *distinct):
                if new != s:
                    changed = list(shapes)
                    changed[i] = sh[:k] + (new,) + sh[k + 1:]
                    add(tuple(changed))
    return out


def scalars(kind: str, *, assumes: frozenset[str] = frozenset(),
            example: float | None = None) -> st.SearchStrategy:
    """A scalar argument of ``kind`` (``"float"`` or ``"int"``): ``example`` first (when given),
    then ``SCALARS[kind]`` (zero, -0.0, negative, fractional 0.1 and 0.5, above one 2.0,
    large 1e4 and 1e30) as ``assumes`` admits (``no_signed_zeros``: no -0.0; ``no_infs``: no
    1e30, past float16's range). Which dtype a scalar meets is the tensors' (drawn apart).

    Shrinks toward ``example``, then toward 0."""
    return st.sampled_from(scalar_values(kind, assumes=assumes, example=example))


def scalar_values(kind: str, *, assumes: frozenset[str] = frozenset(),
                  example: float | None = None) -> tuple:
    """The values ``scalars`` draws from, in order (for callers that enumerate). O(1)."""
    assumes = check_assumes(assumes)
    if kind not in SCALARS:
        raise ValueError(f"kind must be one of {sorted(SCALARS)}, got {kind!r}")
    pool = [v for v in SCALARS[kind]
            if not (kind == "float" and "no_signed_zeros" in assumes and math.copysign(1, v) < 0
                    and v == 0)
            and not (kind == "float" and "no_infs" in assumes and abs(v) > 6e4)]
    if example is not None:
        pool = [example, *[v for v in pool if repr(v) != repr(example)]]
    return tuple(pool)


__all__ = [
    "FLOAT_DTYPES",
    "LAYOUTS",
    "ORDINARY",
    "SCALARS",
    "SMALL_INTS",
    "edges",
    "elements",
    "in_layout",
    "int_edges",
    "laid_out",
    "overflow_points",
    "scalar_values",
    "scalars",
    "size_variants",
    "sizes",
    "tensors",
]
