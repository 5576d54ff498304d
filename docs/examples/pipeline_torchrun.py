"""A 2-stage pipeline of a small tied-embedding LM with purefx stages, on one machine.

    torchrun --nproc-per-node 2 docs/examples/pipeline_torchrun.py

(from the repository root, with purefx importable: ``pip install -e .`` or ``PYTHONPATH=.``).
Each rank exports the same model with ONE micro-batch, splits it at ``layers.2``, builds its
stage and runs one GPipe step with 4 micro-batches; then the tied embedding / lm-head gradients
are summed over the stages, every rank takes an SGD step, and rank 0 merges the stages' state
dicts back into the eager model's keys and checks them against an eager step. Gloo on CPU; for
GPUs use backend "nccl" and device f"cuda:{local_rank}" (nothing else changes).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import ScheduleGPipe

from ir import import_ep
from lowering import merge_stage_state_dicts, pipeline_stage, sync_shared_grads
from transforms import split_stages

N_MB, MB, SEQ, VOCAB, D = 4, 2, 5, 13, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, tok, mask):
        h = self.emb(tok)
        for layer in self.layers:
            h = layer(h)
        return {"logits": self.head(h) * mask[..., None]}


def loss_fn(out, target):
    return nn.functional.cross_entropy(out["logits"].flatten(0, 1), target.flatten())


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # same model and data on every rank
    model = TinyLM()
    tok = torch.randint(0, VOCAB, (N_MB * MB, SEQ))
    mask = torch.ones(N_MB * MB, SEQ)
    target = torch.randint(0, VOCAB, (N_MB * MB, SEQ))

    ep = torch.export.export(model, (tok[:MB], mask[:MB]))  # one micro-batch
    stages = split_stages(import_ep(ep), at=["layers.2"])  # world == 2 stages
    assert len(stages) == world, "run with --nproc-per-node 2"
    stage = pipeline_stage(stages, rank, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=N_MB, loss_fn=loss_fn)

    losses: list[torch.Tensor] = []
    if rank == 0:
        schedule.step(tok, mask=mask)  # the mask reaches every stage by keyword
    else:
        schedule.step(mask=mask, target=target, losses=losses)
    sync_shared_grads(stages, rank, stage.submod)  # emb.weight / head.weight: summed grads
    torch.optim.SGD(stage.submod.parameters(), lr=0.1).step()

    sds = [None] * world
    dist.all_gather_object(sds, stage.submod.state_dict())
    if rank == 0:
        merged = merge_stage_state_dicts(stages, sds)
        # eager reference: the same micro-batches, losses averaged as the schedule does
        for t, m, y in zip(tok.chunk(N_MB), mask.chunk(N_MB), target.chunk(N_MB), strict=True):
            (loss_fn(model(t, m), y) / N_MB).backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        for fqn, value in model.state_dict().items():
            torch.testing.assert_close(merged[fqn], value)
        print(f"merged state_dict equals eager's after one step ({len(merged)} entries)")
    if rank == world - 1:
        print(f"losses per micro-batch: {[round(x.item(), 4) for x in losses]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
