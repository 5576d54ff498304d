"""The built-in example model the ``purefx`` command runs when given no program."""

from __future__ import annotations

import torch


class Block(torch.nn.Module):
    """Linear + LayerNorm + ReLU with a residual, counting its calls in a buffer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x + torch.relu(self.norm(self.linear(x)))


class ExampleModel(torch.nn.Module):
    """A small model with nesting, a shared block, a container and a tied head."""

    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(width, width, bias=False)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.shared = self.blocks[0]
        self.head = torch.nn.Linear(width, width, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> dict[str, torch.Tensor]:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        h = self.shared(h)
        return {"logits": self.head(h) * scale, "hidden": h}


def example_program() -> torch.export.ExportedProgram:
    """Export ``ExampleModel`` with fixed weights and example inputs."""
    torch.manual_seed(0)
    model = ExampleModel()
    return torch.export.export(model, (torch.randn(4, 8),), {"scale": 2.0})
