"""Synthetic model builders for the purefx benchmark.

Every model takes a size parameter ``n`` and has small widths, so large ``n``
stresses the number of modules and graph nodes rather than arithmetic. Weights
and inputs are deterministic: each builder runs under :func:`_seeded`, which
seeds torch's global RNG and restores its previous state afterwards.

The registry :data:`MODELS` maps a short name to a :class:`ModelSpec`, which
knows how to build the eager module with its example inputs and how to export
it (non-strict ``torch.export.export``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

WIDTH = 16
BATCH = 4
VOCAB = 64
SEQ = 8
SEED = 0

Args = tuple[torch.Tensor, ...]


@contextlib.contextmanager
def _seeded(seed: int = SEED) -> Iterator[None]:
    """Run the body with the global torch RNG seeded, restoring it afterwards."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


class ResidualBlock(nn.Module):
    """``x + relu(layer_norm(linear(x)))``, optionally counting its calls in a buffer."""

    def __init__(self, width: int = WIDTH, count_calls: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.count_calls = count_calls
        if count_calls:
            self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.count_calls:
            self.steps.add_(1)
        return x + torch.relu(self.norm(self.linear(x)))


class DeepStack(nn.Module):
    """``n`` distinct :class:`ResidualBlock` s in an ``nn.ModuleList`` named ``blocks``."""

    def __init__(self, n: int, width: int = WIDTH) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class RepeatedBlock(nn.Module):
    """One :class:`ResidualBlock` object called ``n`` times in a loop."""

    def __init__(self, n: int, width: int = WIDTH) -> None:
        super().__init__()
        self.n = n
        self.block = ResidualBlock(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = self.block(x)
        return x


class SelfAttention(nn.Module):
    """Single-head causal self-attention written with matmul and softmax."""

    def __init__(self, width: int = WIDTH, seq: int = SEQ) -> None:
        super().__init__()
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width)
        self.value = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.scale = 1.0 / math.sqrt(width)
        causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query(x), self.key(x), self.value(x)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        t = x.shape[-2]
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        return self.proj(torch.matmul(torch.softmax(scores, dim=-1), v))


class GPTLayer(nn.Module):
    """Pre-norm transformer layer: attention and a 4x MLP, each with a residual."""

    def __init__(self, width: int = WIDTH, seq: int = SEQ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, seq)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token embedding, ``n`` :class:`GPTLayer` s, final norm, and a tied ``lm_head``."""

    def __init__(self, n: int, width: int = WIDTH, vocab: int = VOCAB, seq: int = SEQ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Parameter(torch.randn(seq, width) * 0.02)
        self.layers = nn.ModuleList(GPTLayer(width, seq) for _ in range(n))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe[: tokens.shape[-1]]
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


def build_deep(n: int) -> tuple[nn.Module, Args]:
    """Deep stack of ``n`` residual blocks with an in-place step counter each."""
    with _seeded():
        model = DeepStack(n)
        x = torch.randn(BATCH, WIDTH)
    return model.eval(), (x,)


def build_gpt(n: int) -> tuple[nn.Module, Args]:
    """Tiny GPT with ``n`` layers and tied input/output embeddings."""
    with _seeded():
        model = TinyGPT(n)
        tokens = torch.randint(0, VOCAB, (2, SEQ))
    return model.eval(), (tokens,)


def build_repeat(n: int) -> tuple[nn.Module, Args]:
    """One residual block (with its counter) called ``n`` times."""
    with _seeded():
        model = RepeatedBlock(n)
        x = torch.randn(BATCH, WIDTH)
    return model.eval(), (x,)


def every_other_block(n: int) -> tuple[str, ...]:
    """Fqns ``blocks.0``, ``blocks.2``, ... of a :class:`DeepStack` of size ``n``."""
    return tuple(f"blocks.{i}" for i in range(0, n, 2))


def export_plain(model: nn.Module, args: Args) -> torch.export.ExportedProgram:
    """Non-strict ``torch.export.export``."""
    return torch.export.export(model, args, strict=False)


def export_decomposed(model: nn.Module, args: Args) -> torch.export.ExportedProgram:
    """Non-strict export followed by ``run_decompositions()`` (core ATen)."""
    return export_plain(model, args).run_decompositions()


def export_preserved(model: nn.Module, args: Args) -> torch.export.ExportedProgram:
    """Non-strict export preserving the call signature of every other block."""
    n = len(model.blocks)
    return torch.export.export(
        model, args, strict=False, preserve_module_call_signature=every_other_block(n)
    )


@dataclass(frozen=True)
class ModelSpec:
    """How to build, export and size one benchmark model.

    ``sizes`` is the full sweep, ``quick_sizes`` the smoke-run sweep.
    """

    name: str
    description: str
    build: Callable[[int], tuple[nn.Module, Args]]
    export: Callable[[nn.Module, Args], torch.export.ExportedProgram]
    sizes: tuple[int, ...]
    quick_sizes: tuple[int, ...] = field(default=(4, 8))

    def make(self, n: int) -> tuple[nn.Module, Args, torch.export.ExportedProgram]:
        """Build the eager model of size ``n``, its inputs, and its exported program."""
        model, args = self.build(n)
        return model, args, self.export(model, args)


DEEP_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "deep",
            "N x (Linear, LayerNorm, ReLU, residual) + in-place step counter per block",
            build_deep,
            export_plain,
            DEEP_SIZES,
            (8, 16, 32),
        ),
        ModelSpec(
            "deep_decomp",
            "deep stack, exported then run_decompositions()",
            build_deep,
            export_decomposed,
            DEEP_SIZES,
            (8, 16),
        ),
        ModelSpec(
            "gpt",
            "tiny GPT: Embedding + N x (LN, 1-head attention, MLP) + LN + tied lm_head",
            build_gpt,
            export_plain,
            (2, 4, 8, 16, 32, 64, 128),
            (2, 4),
        ),
        ModelSpec(
            "repeat",
            "one residual block object called N times in a loop",
            build_repeat,
            export_plain,
            (4, 8, 16, 32, 64, 128, 256),
            (4, 8),
        ),
        ModelSpec(
            "preserved",
            "deep stack with preserve_module_call_signature on every other block",
            build_deep,
            export_preserved,
            DEEP_SIZES,
            (8, 16),
        ),
    )
}
