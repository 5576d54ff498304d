"""Samples with an operand's sign turned: the other sign of a recorded call, drawn where a
program is asked to be rich in an operator (``programs(ops=...)``, ``check_laws``' targets).

A row's samples are calls recorded from models, and each floating operand keeps the sign of
the values it was recorded with: ``div(-8.5, -1.8, rounding_mode='floor')`` has a positive
quotient, where floor and truncation agree, so a pass that rewrites floor division as
truncation is never wrong on it. What an operator does on the other sign (rounding toward
minus infinity, ``remainder``, ``abs``, a clamp's bound) is what such a pass gets wrong.

:func:`signed_variants` gives, for each sample of a row, up to :data:`MAX_VARIANTS` variants,
each with one one-signed floating operand negated (its range ``[low, high)`` as
``[-high, -low)``, exact values negated). Each variant is run once for real on the CPU beside
the recorded call and kept only where it runs and its floating results are finite wherever
the recorded call's are: inside the operator's domain (``log`` of a negative, ``normal`` with a
negative ``std``, are not calls a model makes). Memoized per row: a bounded table, one entry
per row of the operator table.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import attrs
import torch

from ir.opset import Sample, TensorSpec, sample_args
from ir.torch_seam import pytree

__all__ = ["MAX_VARIANTS", "signed_variants"]

MAX_VARIANTS = 2
"""The most sign variants one sample gets (one per one-signed operand, in argument order)."""


def signed_variants(name: str, op: Any, samples: tuple[Sample, ...]
                    ) -> tuple[tuple[Sample, Sample], ...]:
    """``(sample, variant)`` for each sign variant of ``samples`` (row ``name``'s, all of
    them, called as ``op``) that runs and stays in the operator's domain (module docstring),
    in the samples' order. Deterministic; memoized per row (its samples are fixed);
    O(samples x a real call of tiny tensors)."""
    return _variants(name, op, samples)


@functools.cache
def _variants(name: str, op: Any, samples: tuple[Sample, ...]
              ) -> tuple[tuple[Sample, Sample], ...]:
    out: list[tuple[Sample, Sample]] = []
    for sample in samples:
        for at in _one_signed(sample)[:MAX_VARIANTS]:
            turned = attrs.evolve(sample, args=tuple(
                _negated(a) if i == at else a for i, a in enumerate(sample.args)))
            if turned in samples or any(turned == v for _, v in out):
                continue
            if _in_domain(op, sample, turned):
                out.append((sample, turned))
    return tuple(out)


def _one_signed(sample: Sample) -> list[int]:
    """Positions of the floating tensor operands whose values all have one sign (not all
    zero). Integer operands keep theirs: an integer tensor may be an index or a pivot that a
    kernel reads unchecked (``linalg_ldl_solve`` with negated pivots corrupts the heap), and no
    real call can tell that apart from the process dying."""
    found = []
    for i, a in enumerate(sample.args):
        if not isinstance(a, TensorSpec) or not a.dtype.is_floating_point:
            continue
        if a.values is not None:
            values = [float(v) for v in a.values]
            if any(values) and (min(values) >= 0 or max(values) <= 0):
                found.append(i)
        elif (a.low >= 0 or a.high <= 0) and (a.low, a.high) != (0, 0):
            found.append(i)
    return found


def _negated(spec: TensorSpec) -> TensorSpec:
    if spec.values is not None:
        return attrs.evolve(spec, values=tuple(-v for v in spec.values))
    return attrs.evolve(spec, low=-spec.high, high=-spec.low)


def _in_domain(op: Any, recorded: Sample, turned: Sample) -> bool:
    """``turned`` runs, and its floating results are finite wherever ``recorded``'s are."""
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = _leaves(_call(op, recorded))
            got = _leaves(_call(op, turned))
    except Exception:  # noqa: BLE001 - outside the operator's domain (it refused the values)
        return False
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        if (w.dtype.is_floating_point and w.shape == g.shape
                and bool((torch.isfinite(w) & ~torch.isfinite(g)).any())):
            return False
    return True


def _call(op: Any, sample: Sample) -> Any:
    args, kwargs = sample_args(sample, seed=0)
    return op(*args, **kwargs)


def _leaves(result: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
