"""Models for the multi-process pipeline tests that need more than ``bench/stage_cases.py``:
a weight tied across three stages (two of them on one rank under an interleaved schedule)."""

from __future__ import annotations

import torch
from torch import nn

from bench import stage_cases as sc


class TiedThree(nn.Module):
    """The embedding's weight read in stage 0 (``emb``), stage 2 (``proj``, with ``back``
    after it) and stage 3 (``head``) of a 4-stage split at ``layers.1, layers.2, layers.3``:
    on 2 ranks with loop placement, stages 0 and 2 share rank 0 and stage 3 is on rank 1."""

    def __init__(self, vocab: int = 13, d: int = 6, n: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([sc.Block(d) for _ in range(n)])
        self.proj = nn.Linear(d, vocab, bias=False)
        self.proj.weight = self.emb.weight
        self.back = nn.Linear(vocab, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = self.emb(tok)
        h = self.layers[1](self.layers[0](h))
        h = self.layers[2](h)
        h = h + self.back(torch.tanh(self.proj(h)))
        return self.head(self.layers[3](h))


CASES = {
    **sc.CASES,
    "tied3": (
        TiedThree,
        lambda: (torch.randint(0, 13, (sc.MB, 5)),),
        (),
        {2: ["layers.2"], 4: ["layers.1", "layers.2", "layers.3"]},
        lambda: torch.randn(sc.MB, 5, 13),
    ),
}


def build(name: str, n_stages: int, n_mb: int, seed: int = 0, export_on_meta: bool = False,
          rows: int | None = None):
    """``stage_cases.build`` over ``CASES`` (the model is exported with one micro-batch, the
    batch holds ``n_mb`` of them); with ``export_on_meta`` the program is exported from a copy
    of the model built under ``torch.device("meta")`` (no values; same fqns and ties). With
    ``rows``, the export has a dynamic batch dim (every input's dim 0, one micro-batch of
    ``MB`` rows) and the batch's micro-batches have ``rows`` rows."""
    factory, inputs, keywords, at, target = CASES[name]
    torch.manual_seed(seed)
    model = factory().double()

    def sized(t: torch.Tensor) -> torch.Tensor:
        if rows is None:
            return t
        return torch.cat([t] * ((rows + sc.MB - 1) // sc.MB))[:rows]

    first = tuple(t.double() if t.is_floating_point() else t for t in inputs())
    mbs = [tuple(sized(t.double() if t.is_floating_point() else t) for t in inputs())
           for _ in range(n_mb)]
    dynamic = None
    if rows is not None:
        b = torch.export.Dim("b", min=2, max=64)
        dynamic = tuple({0: b} for _ in first)
    if export_on_meta:
        with torch.device("meta"):
            shell = factory().double()
        ep = torch.export.export(shell, tuple(t.to("meta") for t in first),
                                 dynamic_shapes=dynamic)
    else:
        ep = torch.export.export(model, first, dynamic_shapes=dynamic)
    full = tuple(torch.cat([mb[j] for mb in mbs]) for j in range(len(mbs[0])))
    names = list(ep.module_call_graph[0].signature.forward_arg_names or [])
    pos = tuple(t for nm, t in zip(names, full, strict=True) if nm not in keywords)
    kw = {nm: t for nm, t in zip(names, full, strict=True) if nm in keywords}
    tgt = torch.cat([sized(target().double()) for _ in range(n_mb)])
    return model, ep, at[n_stages], pos, kw, tgt, sc._mse
