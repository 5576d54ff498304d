"""Models for the pipeline-stage tests and benchmarks (in one process and on spawned gloo groups;
``tests/`` imports them from here, ``bench/`` never imports ``tests/``).

Each case gives a float64 model (seeded), one micro-batch of inputs, which inputs the
schedule passes by keyword, the ``at`` paths per stage count, and the loss.
"""

from __future__ import annotations

import torch
from torch import nn

MB = 2  # rows per micro-batch (the shape the model is exported with)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class MLP(nn.Module):
    def __init__(self, d: int = 6, n: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])
        self.out = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


class TiedLM(nn.Module):
    """Embedding tied to the lm head; an attention-like mask read by the last stage only."""

    def __init__(self, vocab: int = 13, d: int = 6, n: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tok: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.emb(tok)
        for layer in self.layers:
            h = layer(h)
        logits = self.head(self.norm(h))
        return {"logits": logits * mask[..., None]}


class TiedPlain(TiedLM):
    """The tied LM without a mask and with a tensor output (isolates the tied weights)."""

    def forward(self, tok: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        h = self.emb(tok)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


class Stats(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.register_buffer("running", torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.running.mul_(0.5).add_(x.detach().mean(0) * 0.5)
        return x


class CrossBuffer(nn.Module):
    """A buffer updated in stage 0 and read in stage 1: split_stages refuses it."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.stats = Stats(d)
        self.layers = nn.ModuleList([Block(d) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](self.stats(x))
        return self.layers[1](x) - self.stats.running


class NoGradEdge(nn.Module):
    """Stage 1 reads a detached value and an integer tensor made in stage 0 (edges that carry
    no gradient) next to one that does."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[0](x)
        scale = h.detach().abs().mean(-1, keepdim=True)
        idx = h.argmax(-1)
        h = self.layers[1](h)
        return self.layers[2](h) * scale + idx[:, None].to(h.dtype)


class FanOut(nn.Module):
    """An activation of stage 0 read by stages 2 and 3 (relayed through the stages between)."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.inp = Block(d)
        self.layers = nn.ModuleList([Block(d) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = self.inp(x)
        h = self.layers[0](h0)
        h = self.layers[1](h) + h0
        return self.layers[2](h) * h0


class Twice(nn.Module):
    """One block called twice inside one stage."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.blk = Block(d)
        self.layers = nn.ModuleList([Block(d) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blk(self.blk(x))
        for layer in self.layers:
            x = layer(x)
        return x


class Counting(nn.Module):
    """A buffer read and updated inside one stage (a running mean, as BatchNorm keeps)."""

    def __init__(self, d: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(3)])
        self.register_buffer("running", torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        x = self.layers[1](x)
        self.running.mul_(0.5).add_(x.detach().mean(0) * 0.5)
        return self.layers[2](x - self.running)


def _mse(out, target):
    if isinstance(out, dict):
        out = out["logits"]
    return ((out - target) ** 2).mean()


def _cases():
    d = 6
    return {
        # name: (factory, inputs (one micro-batch), keyword names, at by stage count, target)
        "mlp": (
            MLP,
            lambda: (torch.randn(MB, d),),
            (),
            {2: ["layers.2"], 4: ["layers.1", "layers.2", "layers.3"]},
            lambda: torch.randn(MB, 3),
        ),
        "tied_lm": (
            TiedLM,
            lambda: (torch.randint(0, 13, (MB, 5)), (torch.rand(MB, 5) > 0.3).double()),
            ("mask",),
            {2: ["layers.2"], 4: ["layers.1", "layers.2", "layers.3"]},
            lambda: torch.randn(MB, 5, 13),
        ),
        "tied_plain": (
            TiedPlain,
            lambda: (torch.randint(0, 13, (MB, 5)),),
            (),
            {2: ["layers.2"], 4: ["layers.1", "layers.2", "layers.3"]},
            lambda: torch.randn(MB, 5, 13),
        ),
        "cross_buffer": (
            CrossBuffer,
            lambda: (torch.randn(MB, d),),
            (),
            {2: ["layers.1"]},
            lambda: torch.randn(MB, d),
        ),
        "nograd_edge": (
            NoGradEdge,
            lambda: (torch.randn(MB, d),),
            (),
            {2: ["layers.1"]},
            lambda: torch.randn(MB, d),
        ),
        "fan_out": (
            FanOut,
            lambda: (torch.randn(MB, d),),
            (),
            {2: ["layers.1"], 4: ["layers.0", "layers.1", "layers.2"]},
            lambda: torch.randn(MB, d),
        ),
        "twice": (
            Twice,
            lambda: (torch.randn(MB, d),),
            (),
            {2: ["layers.1"], 4: ["layers.0", "layers.1", "layers.2"]},
            lambda: torch.randn(MB, d),
        ),
        "local_buffer": (
            Counting,
            lambda: (torch.randn(MB, d),),
            (),
            {2: ["layers.2"], 4: ["layers.0", "layers.1", "layers.2"]},
            lambda: torch.randn(MB, d),
        ),
    }


CASES = _cases()


def build(name: str, n_stages: int, n_mb: int, seed: int = 0):
    """(eager model, exported program, at, full-batch positional args, kwargs, target, loss_fn).

    The model is exported with one micro-batch; the batch holds ``n_mb`` of them."""
    factory, inputs, keywords, at, target = CASES[name]
    torch.manual_seed(seed)
    model = factory().double()
    mbs = [inputs() for _ in range(n_mb)]
    mbs = [tuple(t.double() if t.is_floating_point() else t for t in mb) for mb in mbs]
    ep = torch.export.export(model, mbs[0])
    # the export's tracing leaves the model's buffers as they were (it runs on fakes)
    full = tuple(torch.cat([mb[j] for mb in mbs]) for j in range(len(mbs[0])))
    names = list(ep.module_call_graph[0].signature.forward_arg_names or [])
    pos = tuple(t for nm, t in zip(names, full, strict=True) if nm not in keywords)
    kw = {nm: t for nm, t in zip(names, full, strict=True) if nm in keywords}
    tgt = torch.cat([target().double() for _ in range(n_mb)])
    return model, ep, at[n_stages], pos, kw, tgt, _mse


def eager_step(model, args, kwargs, names, target, loss_fn, n_mb):
    """Eager reference of one schedule step: micro-batches in order, losses scaled by 1/n_mb
    (the schedules' default grad scaling). Returns the per-micro-batch losses."""
    chunks = [torch.tensor_split(t, n_mb) for t in args]
    kchunks = {k: torch.tensor_split(v, n_mb) for k, v in kwargs.items()}
    tchunks = torch.tensor_split(target, n_mb)
    losses = []
    for i in range(n_mb):
        a = [c[i] for c in chunks]
        kw = {k: v[i] for k, v in kchunks.items()}
        full = []
        ai = iter(a)
        for nm in names:
            full.append(kw[nm] if nm in kw else next(ai))
        loss = loss_fn(model(*full), tchunks[i])
        (loss / n_mb).backward()
        losses.append(loss.detach())
    return losses


def schedule_step(sched, rank: int, world: int, pos, kw, target, losses: list) -> None:
    """One step of a pipelining schedule as rank ``rank`` of ``world`` takes it: the first stage
    gets the positional inputs, the last the target (and collects the losses), every stage the
    keyword inputs."""
    if rank == 0:
        sched.step(*pos, **kw)
    elif rank == world - 1:
        sched.step(**kw, target=target, losses=losses)
    else:
        sched.step(**kw)
