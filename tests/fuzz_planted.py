"""Planted miscompiles for the fuzzer's tests: backends that are wrong only under a narrow
condition, as real compiler bugs are. Imports torch only, so that a repro script run in a
subprocess can use them without purefx.

Each is a callable ``compile(module) -> callable`` that runs ``module`` under a dispatch mode
rewriting one operator call when its condition holds.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class _Planted(TorchDispatchMode):
    def __init__(self, rule):
        super().__init__()
        self.rule = rule
        self.clones = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.rule(self, func, args, dict(kwargs or {}))


def _drop_alpha(mode, func, args, kwargs):
    # add(x, y, alpha=a) computes x + y when the operands' shapes differ (one broadcasts)
    if func is aten.add.Tensor and kwargs.get("alpha", 1) != 1 \
            and isinstance(args[1], torch.Tensor) and args[0].shape != args[1].shape:
        kwargs = {k: v for k, v in kwargs.items() if k != "alpha"}
    return func(*args, **kwargs)


def _keepdim_mean(mode, func, args, kwargs):
    # mean(x, dims, keepdim=True) computes the sum instead
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if func is aten.mean.dim and keep:
        return aten.sum.dim_IntList(*args, **kwargs)
    return func(*args, **kwargs)


def _inplace_on_clone(mode, func, args, kwargs):
    # an in-place add_ on a tensor that clone made writes nothing
    if func is aten.add_.Tensor and id(args[0]) in mode.clones:
        return args[0]
    out = func(*args, **kwargs)
    if func is aten.clone.default:
        mode.clones.add(id(out))
    return out


def _compiler(rule):
    def compile(module):
        def run(*args, **kwargs):
            with _Planted(rule):
                return module(*args, **kwargs)

        return run

    compile.__name__ = rule.__name__.lstrip("_")
    return compile


drop_alpha_when_broadcast = _compiler(_drop_alpha)
sum_for_keepdim_mean = _compiler(_keepdim_mean)
skip_add_on_clone = _compiler(_inplace_on_clone)


def eager(module):
    """A correct backend: the module itself."""
    return module
