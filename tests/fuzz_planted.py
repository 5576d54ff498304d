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
        self.wide = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.rule(self, func, args, dict(kwargs or {}))


def _drop_alpha(mode, func, args, kwargs):
    # add(x, y, alpha=a) computes x + y when the operands' shapes differ (one broadcasts)
    if func is aten.add.Tensor and kwargs.get("alpha", 1) != 1 \
            and isinstance(args[1], torch.Tensor) and args[0].shape != args[1].shape:
        kwargs = {k: v for k, v in kwargs.items() if k != "alpha"}
    return func(*args, **kwargs)


def is_keepdim_mean(func, args, kwargs):
    """Whether a dispatched call is ``mean(x, dims, keepdim=True)``."""
    return func is aten.mean.dim and bool(args[2] if len(args) > 2 else kwargs.get("keepdim"))


def _keepdim_mean(mode, func, args, kwargs):
    # mean(x, dims, keepdim=True) computes the sum instead
    if is_keepdim_mean(func, args, kwargs):
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


def _integer_off_by_one(mode, func, args, kwargs):
    # a pointwise arithmetic operator on integer tensors (integer operands, integer result; not
    # in place, not a copy) is one too high
    out = func(*args, **kwargs)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if torch.Tag.pointwise in func.tags and func not in _COPIES \
            and func._schema.returns[0].alias_info is None and isinstance(out, torch.Tensor) \
            and tensors and all(_integer(t) for t in (out, *tensors)):
        return out + 1
    return out


_COPIES = {aten.clone.default, aten._to_copy.default, aten.copy_.default}


def _integer(t):
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


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
integer_off_by_one = _compiler(_integer_off_by_one)


def eager(module):
    """A correct backend: the module itself."""
    return module


def _gelu_one_ulp_up(mode, func, args, kwargs):
    # every exact gelu (not the tanh approximation) one float ulp above eager's: a rounding
    # difference, no bug
    out = func(*args, **kwargs)
    if func is aten.gelu.default and kwargs.get("approximate", "none") == "none" \
            and out.is_floating_point():
        return torch.nextafter(out, torch.full_like(out, float("inf")))
    return out


def _nudged(amount):
    def _sub_nudged(mode, func, args, kwargs):
        # every sub (and mul) result off by a fixed amount: a miscompile of that size
        out = func(*args, **kwargs)
        if func in (aten.sub.Tensor, aten.mul.Tensor) and out.is_floating_point():
            return out + amount
        return out

    return _sub_nudged


gelu_one_ulp_up = _compiler(_gelu_one_ulp_up)


def sub_and_mul_off_by(amount):
    """A backend whose every ``sub`` and ``mul`` result is ``amount`` off."""
    return _compiler(_nudged(amount))


def _elide_half_round_trip(mode, func, args, kwargs):
    # a fused chain float32 -> float16 -> mul -> float32 keeps its intermediates in float32 (the
    # roundings to float16 eager makes are elided), as inductor does without
    # emulate_precision_casts
    out = func(*args, **kwargs)
    low = (torch.float16, torch.bfloat16)
    if func is aten._to_copy.default and isinstance(out, torch.Tensor):
        if out.dtype in low and args[0].dtype == torch.float32:
            mode.wide[id(out)] = (out, args[0])
        elif out.dtype == torch.float32 and id(args[0]) in mode.wide:
            return mode.wide[id(args[0])][1].clone()
    elif func in (aten.mul.Tensor, aten.mul.Scalar) and id(args[0]) in mode.wide \
            and not isinstance(args[1], torch.Tensor):
        mode.wide[id(out)] = (out, mode.wide[id(args[0])][1] * args[1])
    return out


elide_half_round_trip = _compiler(_elide_half_round_trip)


class _FirstSize(TorchDispatchMode):
    # each add after the first call computes only as many rows as it had at the first call (a
    # kernel whose loop bound was the first call's batch); the rows beyond are left zero
    def __init__(self, seen):
        super().__init__()
        self.seen = seen
        self.index = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.add.Tensor and isinstance(out, torch.Tensor) and out.dim() >= 1:
            rows = self.seen.setdefault(self.index, out.shape[0])
            self.index += 1
            if out.shape[0] > rows:
                out = out.clone()
                out[rows:] = 0
        return out


def rows_of_first_call(module):
    """A backend right at the first call's sizes and wrong at larger ones: every ``add``
    (counted in call order) computes only as many rows as at the first call."""
    seen = {}

    def run(*args, **kwargs):
        with _FirstSize(seen):
            return module(*args, **kwargs)

    return run


_SCALED_GRAD = {aten.relu.default, aten.tanh.default, aten.sigmoid.default, aten.neg.default}


class _GradOnly(torch.overrides.TorchFunctionMode):
    # the value eager computes, its gradient 1.5 times eager's: out + 0.5 * (out - out) is out
    # exactly (where finite), and its derivative 1.5 times out's
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _SCALED_GRAD and isinstance(out, torch.Tensor) and out.requires_grad \
                and bool(torch.isfinite(out).all()):
            return out + 0.5 * (out - out.detach())
        return out


def scaled_activation_grad(module):
    """A backend whose forward is eager's and whose backward of ``relu``, ``tanh``,
    ``sigmoid`` and ``neg`` is 1.5 times eager's (a backward formula with a slip)."""

    def run(*args, **kwargs):
        with _GradOnly():
            return module(*args, **kwargs)

    return run
