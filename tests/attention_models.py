"""Tiny transformers models whose eager attention the shipped ``ATTENTION`` rules fuse.

Each model is built from its config class (no downloads), seeded, in eval mode, with
``attn_implementation="eager"``; ``ATTENTION_MODELS[name]`` gives ``(factory, args, kwargs,
attention calls)``. ``program(name, level)`` exports the model at one of three levels:

- ``"flat"``: ``import_ep(torch.export.export(...))`` (training IR);
- ``"decomposed"``: the same after ``ep.run_decompositions()`` (core aten);
- ``"outlined"``: ``transforms.transform(import_ep(ep))`` of the training IR.

Used by ``tests/test_rewrite_attention.py``; importing it needs ``transformers``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn

LEVELS = ("flat", "decomposed", "outlined")
VOCAB = 64


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make().eval()


def _ids(batch: int = 2, seq: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, seq), generator=g)


def _padding_mask(batch: int = 2, seq: int = 6) -> torch.Tensor:
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, seq - 2:] = 0  # some padding in the second row
    return mask


def _bert() -> nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=32, attn_implementation="eager",
    )
    return transformers.BertModel(cfg)


def _gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, use_cache=False,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(cfg)


def _distilbert() -> nn.Module:
    cfg = transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=16, hidden_dim=32, n_layers=2, n_heads=2,
        max_position_embeddings=32, attn_implementation="eager",
    )
    return transformers.DistilBertModel(cfg)


def _t5() -> nn.Module:
    cfg = transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        use_cache=False, attn_implementation="eager",
    )
    return transformers.T5ForConditionalGeneration(cfg)


def _vit() -> nn.Module:
    cfg = transformers.ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, attn_implementation="eager",
    )
    return transformers.ViTModel(cfg)


def _pixels() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, 8, 8, generator=g)


# name: (factory, args, kwargs, attention calls in one forward)
ATTENTION_MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple],
                                  Callable[[], dict], int]] = {
    "bert": (_bert, lambda: (_ids(),), lambda: {"attention_mask": _padding_mask()}, 2),
    "gpt2": (_gpt2, lambda: (_ids(),), lambda: {"attention_mask": _padding_mask()}, 2),
    "distilbert": (_distilbert, lambda: (_ids(),), lambda: {"attention_mask": _padding_mask()}, 2),
    # encoder: 2 self; decoder: 2 self + 2 cross
    "t5": (_t5, lambda: (_ids(),), lambda: {"decoder_input_ids": _ids(seq=4, seed=1)}, 6),
    "vit": (_vit, lambda: (_pixels(),), dict, 2),
}


def model(name: str) -> nn.Module:
    """The seeded eval-mode model ``name``."""
    return _seeded(ATTENTION_MODELS[name][0])


def inputs(name: str) -> tuple[tuple, dict]:
    """The args and kwargs ``name`` runs on."""
    _, args, kwargs, _ = ATTENTION_MODELS[name]
    return args(), kwargs()


def attention_calls(name: str) -> int:
    """How many attention calls one forward of ``name`` makes."""
    return ATTENTION_MODELS[name][3]


def export(name: str, decompose: bool = False) -> tuple[nn.Module, torch.export.ExportedProgram]:
    """The model and its exported program (decomposed to core aten when ``decompose``)."""
    m = model(name)
    args, kwargs = inputs(name)
    ep = torch.export.export(m, args, kwargs)
    if decompose:
        ep = ep.run_decompositions()
    return m, ep


def program(name: str, level: str) -> tuple[nn.Module, Any]:
    """The eager model and its purefx program at ``level`` (one of ``LEVELS``)."""
    from ir import import_ep
    from transforms import transform

    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    m, ep = export(name, decompose=level == "decomposed")
    p = import_ep(ep)
    return m, (transform(p) if level == "outlined" else p)


def tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor of a model output (a ``ModelOutput``, tuple, dict or tensor), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in tensors(x)]
    return []


def fuse(name: str, level: str, rules: Any, assume: Any = None) -> tuple[int, float, Any, Any]:
    """Rewrite ``name`` at ``level`` with ``rules``, granting ``assume`` (default
    ``ATTENTION_ASSUMES``, what fused attention needs): (rewrites, largest difference of the
    lowered module's output tensors from eager's, the rewritten program, the report)."""
    from lowering import lower
    from transforms.rewrite import rewrite_report
    from transforms.rewrite_rules import ATTENTION_ASSUMES

    m, p = program(name, level)
    q, report = rewrite_report(p, rules, ATTENTION_ASSUMES if assume is None else assume)
    args, kwargs = inputs(name)
    with torch.no_grad():
        want = tensors(m(*args, **kwargs))
        got = tensors(lower(q)(*args, **kwargs))
    count = sum(report.counts.values())
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        return count, float("inf"), q, report
    err = max(float((g - w).abs().max()) for g, w in zip(got, want))
    return count, err, q, report


def table(names: Any = None) -> str:
    """The markdown table of ``ATTENTION`` on each model x level: rewrites / attention calls,
    the rules that fired, and whether the lowered outputs equal eager's (within 1e-5)."""
    from transforms.rewrite_rules import ATTENTION

    lines = ["| model | attention calls | " + " | ".join(LEVELS) + " | rules fired |",
             "|---|---:|" + "---:|" * len(LEVELS) + "---|"]
    for name in names or ATTENTION_MODELS:
        cells, fired = [], set()
        for level in LEVELS:
            count, err, _, report = fuse(name, level, ATTENTION)
            fired |= {r for r, n in report.counts.items() if n}
            cells.append(f"{count}" + ("" if err <= 1e-5 else f" (differs by {err:.1e})"))
        lines.append(f"| {name} | {attention_calls(name)} | " + " | ".join(cells)
                     + f" | {', '.join(sorted(fired))} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/attention_models.py
    print(table())
