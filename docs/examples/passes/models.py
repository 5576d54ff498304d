"""Small models the pass examples run on (an MLP, a tiny GPT-2), with example inputs."""

import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 8)
        self.small = torch.nn.Linear(8, 8)  # 64 weights: below the quantization threshold

    def forward(self, x):
        scale = torch.arange(8, dtype=x.dtype) / 8 + 1  # constant: folded
        h = torch.relu(self.up(x))
        y = self.down(h) * scale
        return self.small(torch.nn.functional.silu(y)) + torch.nn.functional.silu(y)


def mlp():
    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(4, 32),)


def gpt2():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=1, use_cache=False, attn_implementation="eager",
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    return model, (torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0)),)
