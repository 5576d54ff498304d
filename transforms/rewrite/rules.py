"""Five worked rewrite rules (``docs/rewrite.md`` explains each), ready for ``rewrite``::

    from transforms.rewrite import rewrite
    from transforms.rewrite_rules import RULES
    q = rewrite(p, RULES)

or on the command line: ``purefx model.pt2 --rules transforms.rewrite_rules:RULES``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from transforms.rewrite.rule import Rule

_X = (torch.randn(4, 8),)


def _relu_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.relu(x))


def _times_one(x: torch.Tensor) -> torch.Tensor:
    return x * 1


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _sigmoid_times(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * x  # matches x * sigmoid(x) too: mul is commutative


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def _conv_bn(x, w, b, mean, var, gamma, beta, eps: float) -> torch.Tensor:
    return F.batch_norm(F.conv2d(x, w, b), mean, var, gamma, beta, False, 0.1, eps)


def _conv_folded(x, w, b, mean, var, gamma, beta, eps: float) -> torch.Tensor:
    s = gamma * torch.rsqrt(var + eps)
    return F.conv2d(x, w * s.reshape(-1, 1, 1, 1), (b - mean) * s + beta)


_QKV = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8), 0.5)
_C = 4
_CONV_BN = (
    torch.randn(1, 3, 6, 6), torch.randn(_C, 3, 3, 3), torch.randn(_C), torch.randn(_C),
    torch.rand(_C) + 0.5, torch.randn(_C), torch.randn(_C), 1e-5,
)

RELU_RELU = Rule(_relu_relu, torch.relu, _X, name="relu_relu")
"""``relu(relu(x)) -> relu(x)``."""
TIMES_ONE = Rule(_times_one, _identity, _X, name="times_one")
"""``x * 1 -> x`` (matches ``x * 1.0`` too)."""
SILU = Rule(_sigmoid_times, F.silu, _X, name="silu")
"""``sigmoid(x) * x -> silu(x)``, either operand order."""
ATTENTION = Rule(_attention, _sdpa, _QKV, name="attention")
"""``softmax(q @ k.T * scale) @ v -> scaled_dot_product_attention(q, k, v, scale=scale)``."""
CONV_BN = Rule(_conv_bn, _conv_folded, _CONV_BN, name="conv_bn", specials=False)
"""Eval-mode ``batch_norm(conv2d(x, w, b))`` -> one ``conv2d`` with folded weight and bias
(computed in the graph from the same parameters; the state dict is unchanged)."""

RULES = (RELU_RELU, TIMES_ONE, SILU, ATTENTION, CONV_BN)
"""The five rules, for ``rewrite`` and ``purefx --rules``."""

__all__ = ["ATTENTION", "CONV_BN", "RELU_RELU", "RULES", "SILU", "TIMES_ONE"]
