"""The editor examples of ``docs/passes.md`` and ``docs/testing.md`` (``docs/examples/edit``),
so that the docs never rot: each shown as it is in its file, each run on a small model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from docs.examples.edit import buffers, dynamic, effects_here, laws_report
from ir import import_ep, verify
from ir.errors import PassError
from lowering import lower
from transforms import transform

ROOT = Path(__file__).resolve().parents[1]
SHOWN = {"dynamic": "passes", "buffers": "passes", "effects_here": "passes",
         "batch_norm": "passes", "laws_report": "testing"}


@pytest.mark.parametrize(("name", "doc"), SHOWN.items())
def test_the_docs_show_the_files_as_they_are(name, doc):
    text = (ROOT / "docs/examples/edit" / f"{name}.py").read_text()
    body = text.split('"""', 2)[2].strip()  # without the module docstring
    assert f"```python\n{body}\n```" in (ROOT / f"docs/{doc}.md").read_text(), name


class _LinearRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.lin(x))


def _dynamic():
    torch.manual_seed(0)
    model = _LinearRelu()
    ep = torch.export.export(model, (torch.randn(5, 4),),
                             dynamic_shapes={"x": {0: Dim("batch", min=2, max=64)}})
    return model, ep, import_ep(ep)


@pytest.mark.parametrize("fn", [dynamic.per_sample_call, dynamic.per_sample_apply])
def test_call_and_apply_keep_the_batch_dynamic(fn):
    model, _, p = _dynamic()
    q = fn(p)
    for batch in (2, 9):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(lower(q)(x), model(x) / batch)
        assert lower(p)(x).shape == (batch, 3)


def test_int_of_the_batch_is_refused_naming_node_and_dimension():
    _, _, p = _dynamic()
    with pytest.raises(PassError, match=r"visit at node 'relu'.*dimension 0 of input %x, 2\.\.64"):
        dynamic.per_sample_fixed(p)
    assert lower(p)(torch.randn(9, 4)).shape == (9, 3)


class _Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)  # the mul reads the buffer through add_'s result
        return x * self.count


@pytest.mark.parametrize("level", ["training", "core", "outlined"])
def test_write_buffer_takes_the_buffers_own_value(level):
    ep = torch.export.export(_Counter(), (torch.randn(3),))
    ep = ep if level == "training" else ep.run_decompositions()
    p = import_ep(ep)
    p = transform(p) if level == "outlined" else p
    # a functionalized flat program writes count through a buffer_mutation output
    assert buffers.written_by_an_output(p, "count") == (level == "core")
    q = buffers.count_products(p)
    verify(q, vals=True)
    m = lower(q)
    torch.testing.assert_close(m(torch.ones(3)), torch.full((3,), 11.0))
    torch.testing.assert_close(m.count, torch.tensor(11.0))


def test_the_written_once_refusal_that_the_test_first_avoids():
    p = import_ep(torch.export.export(_Counter(), (torch.randn(3),)).run_decompositions())

    def visit(node, e):
        if node.target is torch.ops.aten.mul.Tensor:
            b = next(n.ref for n in e.graph.nodes if e.state(n.ref) is not None)  # %b_count
            e.write_buffer(b, e.call(torch.ops.aten.add.Tensor, b, 10.0))

    with pytest.raises(PassError, match="already has a buffer_mutation output; write it once"):
        buffers.rewrite_nodes(p, visit)


class _Masked(torch.nn.Module):
    def __init__(self, written: bool) -> None:
        super().__init__()
        self.written = written
        self.register_buffer("mask", torch.ones(3))

    def forward(self, x):
        if self.written:
            self.mask.mul_(0.5)
        return x * self.mask


@pytest.mark.parametrize("written", [False, True])
def test_graph_effects_of_the_visited_graph(written):
    model = _Masked(written)
    p = import_ep(torch.export.export(model, (torch.randn(2, 3),)))
    for level in (p, transform(p)):
        q = effects_here.drop_ones_masks(level)
        muls = [n for _, mid in q.walk() for g in q.module_table()[mid].graphs for n in g.nodes
                if n.target is torch.ops.aten.mul.Tensor]
        assert bool(muls) == written  # the mask is kept exactly where a call writes it
        x = torch.randn(2, 3)
        torch.testing.assert_close(lower(q)(x), _Masked(written)(x))


def _times_batch_over_batch(p):
    """``relu * batch / batch``: the same values, the batch read as a value (dynamic)."""

    def visit(node, e):
        if node.target is torch.ops.aten.relu.default:
            return e.apply(lambda x: x * x.shape[0] / x.shape[0], node.ref)
        return None

    return buffers.rewrite_nodes(p, visit)


def test_check_laws_with_settings_and_its_report(capsys):
    _, ep, _ = _dynamic()
    report = laws_report.check_on_my_model(_times_batch_over_batch, ep)
    assert report.tried == 8 and report.changed >= 4
    assert f"{report.changed} of {report.tried} programs changed" in capsys.readouterr().out
