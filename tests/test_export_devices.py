"""``export_ep``'s example inputs follow each user input's device and strides.

torch's AOTInductor compares every example input with the graph's fake input (device, dtype,
strides): a CUDA program whose examples were made on the CPU fails there with "Device mismatch
between fake input and example input". These tests hold the contract on CPU and ``meta`` (which
any machine has) and, where a CUDA device is present, on CUDA (marked ``cuda``: skipped without
one, see ``tests/conftest.py``).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from torch import nn

from ir import Graph, Program, import_ep
from lowering import export_ep, lower
from lowering.lowering_seam import detect_fake_mode


class ConvPlusColumn(nn.Module):
    """A conv on a channels-last image plus a transposed (column-major) matrix's sum."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, image: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
        return self.conv(image) + column.sum()


def _inputs(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    image = torch.randn(2, 3, 8, 8, generator=g).to(memory_format=torch.channels_last)
    column = torch.randn(5, 4, generator=g).t()  # strides (1, 4)
    return image.to(device), column.to(device)


def _exported(device: str) -> torch.export.ExportedProgram:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device(device):
            model = ConvPlusColumn()
    return torch.export.export(model, _inputs(device))


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device.type


def test_example_inputs_keep_strides_on_cpu() -> None:
    ep = _exported("cpu")
    args, kwargs = export_ep(import_ep(ep)).example_inputs
    assert kwargs == {}
    assert [_layout(a) for a in args] == [_layout(a) for a in _inputs()]
    assert args[0].is_contiguous(memory_format=torch.channels_last)
    assert not args[1].is_contiguous()
    assert all(not a.any() for a in args)  # zeros


def test_example_inputs_of_a_meta_program_are_meta() -> None:
    ep = _exported("meta")
    args, _ = export_ep(import_ep(ep)).example_inputs
    assert [_layout(a) for a in args] == [_layout(a) for a in _inputs("meta")]
    assert [a.device.type for a in args] == ["meta", "meta"]


def _with_user_inputs_on(p: Program, device: str) -> Program:
    """``p`` with its user inputs' fake values moved to ``device`` (same size and strides):
    what a program exported on that device carries, made on any machine."""
    graph = p.root_module.graph
    vals = [n.meta["val"] for n in graph.nodes if "val" in n.meta]
    mode = detect_fake_mode(vals)
    nodes = []
    for n in graph.nodes:
        if n.op == "placeholder" and n.name in ("image", "column"):
            val = n.meta["val"]
            with mode:
                moved = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype,
                                            device=device)
            n = n.with_meta(val=moved)
        nodes.append(n)
    root = p.root_module.replace(graphs=(Graph(tuple(nodes)),))
    return p.replace(modules=p.modules.set(p.root, root))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine-without-CUDA path")
def test_cuda_program_without_cuda_leaves_the_examples_out() -> None:
    p = _with_user_inputs_on(import_ep(_exported("cpu")), "cuda")
    ep = export_ep(p)
    assert ep.example_inputs is None
    ph = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "image"]
    assert ph[0].meta["val"].device.type == "cuda"


@pytest.mark.cuda
def test_cuda_program_gets_cuda_examples() -> None:
    ep = _exported("cuda")
    args, _ = export_ep(import_ep(ep)).example_inputs
    assert [_layout(a) for a in args] == [_layout(a) for a in _inputs("cuda")]


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_program_compiles_with_aotinductor() -> None:
    ep = _exported("cuda")
    p = import_ep(ep)
    x = _inputs("cuda")
    want = lower(p)(*x)
    with tempfile.TemporaryDirectory() as folder:
        package = torch._inductor.aoti_compile_and_package(
            export_ep(p), package_path=os.path.join(folder, "conv.pt2")
        )
        got = torch._inductor.aoti_load_package(package)(*x)
    torch.testing.assert_close(got, want)
