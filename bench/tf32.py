"""float32 on CUDA and TF32: which float32 work torch runs in TF32, turning it off, and the
bound a float32 result is judged at.

TF32 (Ampere and later) rounds a float32 matmul's or convolution's inputs to 10 mantissa bits,
float16's, and accumulates in float32. torch runs float32 convolutions so by default
(``torch.backends.cudnn.allow_tf32``) and matmuls only when asked
(``torch.backends.cuda.matmul.allow_tf32``, ``torch.set_float32_matmul_precision("high")``).
Two correct runs of one float32 model that both use TF32 (eager and a compiled module picking
other kernels) then differ by float16-sized errors: judged at float32's bound, correct code
"fails". ``bench.cuda`` either turns TF32 off on both sides or judges at float16's bound where
TF32 is on, and says which (``describe``).

The flags are process-wide: set them before the first CUDA kernel, in every process that runs
one side (``bench.cuda``'s AOTInductor worker is given the same ``--tf32``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tf32:
    """Whether torch runs float32 matmuls (``matmul``) and cuDNN convolutions (``conv``) in
    TF32."""

    matmul: bool
    conv: bool

    @property
    def used(self) -> bool:
        """Whether any float32 work runs in TF32."""
        return self.matmul or self.conv


OFF = Tf32(matmul=False, conv=False)


def state() -> Tf32:
    """The process's TF32 flags as torch holds them now (the same on a machine without CUDA:
    they are plain settings). O(1)."""
    return Tf32(bool(torch.backends.cuda.matmul.allow_tf32),
                bool(torch.backends.cudnn.allow_tf32))


def set_state(wanted: Tf32) -> Tf32:
    """Set the process's TF32 flags to ``wanted``; return the previous ones. Laws: after it,
    ``state() == wanted``; ``set_state(set_state(x))`` restores the flags from before. O(1)."""
    previous = state()
    torch.backends.cuda.matmul.allow_tf32 = wanted.matmul
    torch.backends.cudnn.allow_tf32 = wanted.conv
    return previous


def bound(dtype: torch.dtype, device: str, tf32: Tf32, tolerance: dict[torch.dtype, float]
          ) -> float:
    """The bound (``atol`` and ``rtol``) a result of ``dtype`` on ``device`` is judged at:
    ``tolerance[dtype]``, except float32 on CUDA with TF32 ``used``, judged at
    ``tolerance[torch.float16]`` (the same 10 mantissa bits). O(1)."""
    if dtype == torch.float32 and device.startswith("cuda") and tf32.used:
        return tolerance[torch.float16]
    return tolerance[dtype]


def describe(mode: str, device: str, tf32: Tf32, tolerance: dict[torch.dtype, float]) -> str:
    """One line for a report: how float32 was run and judged. ``mode``: ``"off"`` (TF32
    turned off on both sides) or ``"torch"`` (torch's settings kept). O(1)."""
    f32 = tolerance[torch.float32]
    if not device.startswith("cuda"):
        return f"float32: IEEE on {device} (TF32 is a CUDA mode), judged at {f32:g}"
    if mode == "off":
        return (f"float32: TF32 turned off on both sides (eager and every route), judged at "
                f"float32's bound {f32:g}")
    flags = f"matmul {'on' if tf32.matmul else 'off'}, cuDNN conv {'on' if tf32.conv else 'off'}"
    if not tf32.used:
        return f"float32: TF32 as torch sets it ({flags}), judged at float32's bound {f32:g}"
    return (f"float32: TF32 as torch sets it ({flags}), used by eager and the routes alike, "
            f"so float32 is judged at TF32's bound {bound(torch.float32, device, tf32, tolerance):g}")
