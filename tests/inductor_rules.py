"""Torch inductor's no-dropout attention rules (``torch/_inductor/fx_passes/fuse_attention.py``,
``_sfdp_pattern_k`` / ``_sfdp_replacement_k``), loaded from the installed torch as ``Rule``s at
inductor's own example shapes, for the tests of ``check_rule`` (a scale inductor passes as a
0-d tensor is a Python float here: a scalar wildcard)."""

from __future__ import annotations

import torch

from transforms.rewrite import Rule

NO_DROPOUT = (1, 2, 5, 8, 10, 11, 14, 15, 21, 22, 23, 24, 29, 30)
"""The rule numbers of inductor's attention rules without dropout."""

HALF = (8, 10)
"""The rules that end in a cast to float16 (right at float16 only: rewrite's dtype guard keeps
them off float32 programs): their examples are float16."""

_G = (2, 4, 8, 16)  # (batch, heads, seq, head size)
_GP = (2, 8, 4, 16)  # (batch, seq, heads, head size): the patterns that permute first
_ARGS = {  # k -> (shapes of the tensors, scale or None)
    1: ((_G, _G, _G), 2.0), 2: ((_G, _G, _G), 0.5), 5: ((_G, _G, _G, (1, 1, 8, 8)), 0.66666),
    8: ((_G, _G, _G), 0.66666), 10: ((_G, _G, _G), 0.66666), 11: ((_G, _G, _G), 2.0),
    14: ((_G, _G, _G, (2, 1, 1, 4)), 2.0), 15: ((_G, _G, _G, (2, 4)), 2.0),
    21: ((_G, _G, _G, (2, 1, 1, 4)), None), 22: ((_G, _G, _G, (2, 1, 1, 4)), None),
    23: ((_G, _G, _G), None), 24: ((_G, _G, _G, (1, 1, 8, 8)), None),
    29: ((_GP, _GP, _GP, (1, 1, 8, 8)), 0.66666), 30: ((_GP, _GP, _GP), 0.66666),
}


def params_check(has_mask: bool):
    """Inductor's ``_sfdp_params_check`` as a ``where``: query, key and value of one dtype; a
    mask (argument 3) of the query's dtype, bool or float32, not 0-d."""

    def where(match) -> bool:
        q, k, v = (match.val(i) for i in range(3))
        if q is None or k is None or v is None or not q.dtype == k.dtype == v.dtype:
            return False
        if has_mask:
            mask = match.val(3)
            return (isinstance(mask, torch.Tensor) and mask.dim() > 0
                    and mask.dtype in (q.dtype, torch.bool, torch.float32))
        return True

    return where


ASSUMES = frozenset({"no_nans", "no_infs", "reassociate"})
"""What inductor's fusions assume (as ``Rule.assumes``): finite values, and sums regrouped. At
the IEEE edges the fused kernel differs from the unfused ops (a row of ±inf scores: NaN unfused,
0 fused; the largest finite values: an overflow inside the fused sum), and in half precision it
rounds elsewhere (in float32 inside, more precisely than the unfused ops)."""


def inductor_rule(k: int, *, checked: bool = True, **options) -> Rule:
    """Inductor's rule ``k`` as a ``Rule`` named ``inductor_k`` (``options`` go to ``Rule``);
    ``checked``: with inductor's own parameter check as its ``where`` (``params_check``)."""
    from torch._inductor.fx_passes import fuse_attention as fa

    shapes, scale = _ARGS[k]
    gen = torch.Generator().manual_seed(k)
    dtype = torch.float16 if k in HALF else torch.float32
    args = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    if scale is not None:
        args.append(scale)
    pattern = getattr(fa, f"_sfdp_pattern_{k}")
    replacement = getattr(fa, f"_sfdp_replacement_{k}")
    if checked:
        options.setdefault("where", params_check(len(shapes) == 4))
    options.setdefault("assumes", ASSUMES)
    return Rule(pattern, replacement, tuple(args), name=f"inductor_{k}", **options)
