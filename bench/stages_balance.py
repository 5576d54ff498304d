"""The largest pipeline stage: an even split by block count against ``split_stages(n=K,
balance=...)``, on small models whose embedding and blocks differ in size.

torch 2.13's ``pipeline()`` has no balancing helper (a hand-written ``split_spec`` or a
``split_policy`` callback): the even split by block count is what users write by hand. Each
row gives, for K stages, the largest stage's state bytes (``Stages.params``) and FLOPs
(``Stages.flops``) of both splits, and the cut points. Run:

    PYTHONPATH=. python bench/stages_balance.py
"""

from __future__ import annotations

import time

import torch

from ir import import_ep
from transforms import split_stages


def _gpt2(vocab: int, d: int, layers: int):
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_positions=64, n_embd=d, n_layer=layers, n_head=4,
        use_cache=False, bos_token_id=0, eos_token_id=1,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, vocab, (2, 32))
    return model, (ids,), [f"transformer.h.{i}" for i in range(layers)]


def _bert(vocab: int, d: int, layers: int):
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=4 * d, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(cfg).eval()
    ids = torch.randint(0, vocab, (2, 32))
    return model, (ids,), [f"bert.encoder.layer.{i}" for i in range(layers)]


def _tied_lm():
    from bench import stage_cases as sc

    model = sc.TiedLM(vocab=64, d=16, n=8).double()
    tok = torch.randint(0, 64, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.float64)
    return model, (tok, mask), [f"layers.{i}" for i in range(8)]


MODELS = {
    "TiedLM (vocab 64, d 16, 8 blocks)": _tied_lm,
    "GPT-2 (vocab 8000, d 64, 8 blocks, tied head)": lambda: _gpt2(8000, 64, 8),
    "GPT-2 (vocab 2000, d 128, 12 blocks, tied head)": lambda: _gpt2(2000, 128, 12),
    "BERT MLM (vocab 8000, d 64, 8 layers)": lambda: _bert(8000, 64, 8),
}


def _even(blocks: list[str], k: int) -> list[str]:
    """Cut before block ``round(i * L / K)``, i = 1 .. K-1: K groups of blocks of (nearly)
    equal count, the embedding with the first, the head with the last."""
    n = len(blocks)
    return [blocks[round(i * n / k)] for i in range(1, k)]


def _kib(x: int) -> str:
    return f"{x / 1024:.0f} KiB"


def _mflop(x: int) -> str:
    return f"{x / 1e6:.2f} M"


def main() -> None:
    print("| model | K | even by blocks: largest stage (state / FLOPs) | balance='params' | "
          "balance='flops' | cut points (even / params / flops) |")
    print("|---|---|---|---|---|---|")
    for name, make in MODELS.items():
        model, args, blocks = make()
        p = import_ep(torch.export.export(model, args))
        for k in (2, 4):
            even = split_stages(p, _even(blocks, k))
            t0 = time.perf_counter()
            by_params = split_stages(p, n=k, balance="params")
            by_flops = split_stages(p, n=k, balance="flops")
            seconds = (time.perf_counter() - t0) / 2
            print(
                f"| {name} | {k} | {_kib(max(even.params))} / {_mflop(max(even.flops))} | "
                f"**{_kib(max(by_params.params))}** / {_mflop(max(by_params.flops))} | "
                f"{_kib(max(by_flops.params))} / **{_mflop(max(by_flops.flops))}** | "
                f"{', '.join(even.at)} / {', '.join(by_params.at)} / {', '.join(by_flops.at)} "
                f"({seconds:.2f} s per balanced split) |"
            )


if __name__ == "__main__":
    main()
