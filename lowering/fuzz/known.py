"""Documented deviations of torch's compilers from eager, as data: what the fuzzer does not report.

A known deviation is a predicate ``(finding) -> bool``. Most built-in ones are :class:`Known`
values: a deviation that a documented ``torch._inductor.config`` setting turns off; one is a
:class:`WithinPrecision`: a difference within the tolerance of the low precision the program
computes in. The
predicate holds for a mismatch when the program involves what the deviation is about (a
float16 / bfloat16 value, a random operator) and the finding's backend, compiled again with
that setting, agrees with eager: then the difference was the documented one, and nothing else.
A real bug in such a program stays a finding (it survives the setting).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

from ir.node import CALL_FUNCTION
from ir.ops import is_random
from ir.program import Program
from lowering.fuzz.trial import try_program
from lowering.lowering_seam import inductor_config_patched

LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})


def involves_low_precision(program: Program, dtype: torch.dtype | None = None) -> bool:
    """Whether the run's ``dtype`` is float16 or bfloat16, or a value of ``program``'s root
    graph is, or an operator casts to one of them (``lowest_precision`` finds one). O(nodes)."""
    return lowest_precision(program, dtype) is not None


def involves_random(program: Program, dtype: torch.dtype | None = None) -> bool:
    """Whether ``program``'s root graph calls a random operator. O(nodes)."""
    return any(n.op == CALL_FUNCTION and is_random(n.target)
               for n in program.root_module.graph.nodes)


@attrs.frozen
class Known:
    """A documented deviation: ``name``; ``documented`` (where torch says so); ``config`` (the
    ``torch._inductor.config`` settings under which the backend matches eager); ``involves``
    (whether a program, run at a dtype, can show it). Called on a finding: whether it is this deviation."""

    name: str
    documented: str
    config: Mapping[str, Any]
    involves: Callable[[Program, torch.dtype | None], bool]

    def __call__(self, finding: Any) -> bool:
        """Whether ``finding`` (a ``lowering.fuzz.Finding``) is this deviation: a mismatch in a
        program that ``involves`` it, gone when its backend compiles again under ``config``.
        Costs one compile and run of the program. Never raises (an error is ``False``)."""
        if finding.kind != "mismatch" or not self.involves(finding.program, finding.setup.dtype):
            return False
        try:
            with inductor_config_patched(dict(self.config)):
                return _gone_when_tried_again(finding)
        except Exception:  # noqa: BLE001 - a setting that cannot be patched: cannot decide
            return False


def _gone_when_tried_again(finding: Any, precision: torch.dtype | None = None) -> bool:
    """Whether ``finding``'s program, tried again by its compiler (under the settings the caller
    holds, judged at ``precision`` where given), runs in eager and gives no verdict. Never raises:
    a predicate that cannot decide says no. One compile and run."""
    try:
        trial = try_program(finding.program, (finding.compiler,), finding.setup, precision)
    except Exception:  # noqa: BLE001 - a predicate that cannot decide says no
        return False
    return trial.eager.error is None and trial.verdicts[finding.compiler.name] is None


PRECISION_CASTS = Known(
    "inductor.precision_casts",
    "torch._inductor.config.emulate_precision_casts (torch/_inductor/config.py): 'Mode to "
    "emulate PyTorch eager numerics when doing lower precision compute (fp16, bf16). PyTorch "
    "eager computes bf16/fp16 by upcasting inputs to fp32 and downcasting after. When two low "
    "precision operators are fused together, Inductor will elide the downcast-upcast pairs "
    "(effectively a precision truncation) that would occur between these two operators.' "
    "Off by default (on only under the TORCHINDUCTOR_EMULATE_PRECISION_CASTS variable).",
    MappingProxyType({"emulate_precision_casts": True}),
    involves_low_precision,
)
"""Inductor keeps a fused float16 / bfloat16 intermediate in float32 (it elides the round trip
eager makes): a difference of about one float16 / bfloat16 ulp of the intermediate."""

RANDOM_NUMBERS = Known(
    "inductor.random_numbers",
    "torch._inductor.config.fallback_random (torch/_inductor/config.py): 'fallback to eager "
    "for random/dropout, this is slow but useful for debugging'. Off by default, so compiled "
    "random operators draw other numbers than eager's generator.",
    MappingProxyType({"fallback_random": True}),
    involves_random,
)
"""Inductor draws random numbers with its own generator: other numbers than eager's."""

def lowest_precision(program: Program, dtype: torch.dtype | None = None) -> torch.dtype | None:
    """The coarsest of float16 and bfloat16 that the run's ``dtype`` or a value or cast of
    ``program``'s root graph has (bfloat16 before float16), ``None`` for neither. O(nodes)."""
    found = {dtype} & LOW_PRECISION
    for node in program.root_module.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype in LOW_PRECISION:
            found.add(val.dtype)
        found |= {v for v in node.kwargs.values() if isinstance(v, torch.dtype)} & LOW_PRECISION
    return max(found, key=lambda d: torch.finfo(d).eps) if found else None


@attrs.frozen
class WithinPrecision:
    """A deviation of size: a mismatch in a program that computes in float16 or bfloat16 that
    is within the tolerance of that dtype (``lowering.fuzz.error_bounds``: ``eps(d)`` times the
    program's error budget, at most ``1e-2`` for float16, ``5e-2`` for bfloat16), every result
    judged as if computed in it. Device-independent: it asks no compiler setting, so it also
    holds where a setting that should remove the deviation does not (CUDA inductor kept fused
    float16 intermediates in float32 under ``emulate_precision_casts=True`` in our GPU run).
    A real bug in such a program stays a finding when it is larger than that tolerance.
    Called on a finding: whether it is this deviation; costs one compile and run."""

    name: str
    documented: str

    def __call__(self, finding: Any) -> bool:
        """Whether ``finding`` is a mismatch of a low-precision program that a run judged at
        that precision does not show. Never raises (an error is ``False``)."""
        coarse = lowest_precision(finding.program, finding.setup.dtype)
        if finding.kind != "mismatch" or coarse is None or finding.compiler is None:
            return False
        return _gone_when_tried_again(finding, coarse)


LOW_PRECISION_ROUNDING = WithinPrecision(
    "low_precision.rounding",
    "torch._inductor.config.emulate_precision_casts (torch/_inductor/config.py), as "
    "PRECISION_CASTS: a compiler that keeps a float16 / bfloat16 intermediate in float32 "
    "differs from eager by the rounding of that intermediate, within the low-precision dtype's "
    "tolerance, whether or not a setting turns it off on the device at hand.",
)
"""A difference in a float16 / bfloat16 program within that dtype's tolerance: the rounding of
a low-precision intermediate a compiler kept wider (asked after the setting-based ones)."""

BUILTIN_KNOWN: tuple[Any, ...] = (PRECISION_CASTS, RANDOM_NUMBERS, LOW_PRECISION_ROUNDING)
"""The known deviations ``lowering.fuzz.differential`` always asks, before the caller's."""


__all__ = ["BUILTIN_KNOWN", "LOW_PRECISION", "LOW_PRECISION_ROUNDING", "PRECISION_CASTS",
           "RANDOM_NUMBERS", "Known", "WithinPrecision", "involves_low_precision",
           "involves_random", "lowest_precision"]
