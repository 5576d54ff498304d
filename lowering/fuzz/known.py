"""Documented deviations of torch's compilers from eager, as data: what the fuzzer does not report.

A known deviation is a predicate ``(finding) -> bool``. The built-in ones are :class:`Known`
values: a deviation that a documented ``torch._inductor.config`` setting turns off. The
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
from lowering.torch_seam import inductor_config_patched

LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})


def involves_low_precision(program: Program, dtype: torch.dtype | None = None) -> bool:
    """Whether the run's ``dtype`` is float16 or bfloat16, or a value of ``program``'s root
    graph is, or an operator casts to one of them. O(nodes)."""
    if dtype in LOW_PRECISION:
        return True
    for node in program.root_module.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype in LOW_PRECISION:
            return True
        if any(v in LOW_PRECISION for v in node.kwargs.values()
               if isinstance(v, torch.dtype)):
            return True
    return False


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
                trial = try_program(finding.program, (finding.compiler,), finding.setup)
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

BUILTIN_KNOWN: tuple[Known, ...] = (PRECISION_CASTS, RANDOM_NUMBERS)
"""The known deviations ``lowering.fuzz.differential`` always asks, before the caller's."""


__all__ = ["BUILTIN_KNOWN", "LOW_PRECISION", "PRECISION_CASTS", "RANDOM_NUMBERS", "Known",
           "involves_low_precision", "involves_random"]
