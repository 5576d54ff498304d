"""``rewrite_nodes`` on a node that writes state: a visit that re-does every write of the node it
replaces (or drops) removes it, one that re-does some is refused, one that re-does none keeps it
for its writes. Real exported models (train-mode batch and instance norm, in-place ops on
buffers and inputs), at the training IR and after ``run_decompositions()``, Before/Expected on
the IR text, numerics and running statistics against eager at several batch sizes, and the
laws on ``programs_like`` with a planted bug that bakes a batch size in."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim

from docs.examples.edit.batch_norm import explicit_batch_norm
from ir import PassError, format_program, import_ep, verify
from lowering import lower
from lowering.like import programs_like
from lowering.pass_laws import LawViolation, check_laws
from transforms import functional_to_inplace, rewrite_nodes, transform
from transforms.edit import Edit

aten = torch.ops.aten
_BATCHES = (2, 5, 9)


# --- the passes, as a user writes them ---------------------------------------------------------------


def _shape_of_channels(e: Edit, x) -> list[int]:
    """[1, -1, 1, ...]: a per-channel vector viewed to broadcast over ``x``."""
    return [1, -1] + [1] * (e.val(x).dim() - 2)


def _running(e: Edit, old, new, momentum: float):
    """(1 - momentum) * old + momentum * new, as BatchNorm updates its statistics."""
    return e.call(aten.add.Tensor, e.call(aten.mul.Tensor, old, 1 - momentum),
                  e.call(aten.mul.Tensor, new, momentum))


def _normalized(e: Edit, x, mean, var, weight, bias, eps: float, shape):
    """(x - mean) / sqrt(var + eps) * weight + bias, ``mean`` / ``var`` of ``x``'s rank."""
    y = e.call(aten.mul.Tensor, e.call(aten.sub.Tensor, x, mean),
               e.call(aten.rsqrt.default, e.call(aten.add.Tensor, var, eps)))
    if weight is not None:
        y = e.call(aten.mul.Tensor, y, e.call(aten.view.default, weight, shape))
    if bias is not None:
        y = e.call(aten.add.Tensor, y, e.call(aten.view.default, bias, shape))
    return y


def batch_norm_variant(baked_batch: int | None = None, write: tuple[int, ...] = (3, 4)):
    """``docs/examples/edit/batch_norm.py``'s pass with a bug: only the running statistics at
    ``write`` are written (argument 3 running_mean, 4 running_var), or (``baked_batch``, a
    planted bug) the unbiased variance is the biased one times ``n / (n - 1)`` for that batch,
    a constant, instead of at the batch the program runs at."""

    def visit(node, e: Edit):
        if node.target is not aten.batch_norm.default:
            return None
        x, weight, bias, rmean, rvar, training, momentum, eps = e.args[:8]
        if training is not True or rmean is None:
            return None
        shape = _shape_of_channels(e, x)
        dims = [0, *range(2, e.val(x).dim())]
        mean = e.call(aten.mean.dim, x, dims)
        var = e.call(aten.var.correction, x, dims, correction=0)
        if baked_batch is None:
            unbiased = e.call(aten.var.correction, x, dims, correction=1)
        else:
            n = baked_batch * int(torch.Size(e.val(x).shape[2:]).numel())
            unbiased = e.call(aten.mul.Tensor, var, n / (n - 1))
        if 3 in write:
            e.write_buffer(rmean, _running(e, rmean, mean, momentum))
        if 4 in write:
            e.write_buffer(rvar, _running(e, rvar, unbiased, momentum))
        return _normalized(e, x, e.call(aten.view.default, mean, shape),
                           e.call(aten.view.default, var, shape), weight, bias, eps, shape)

    def pass_fn(p):
        return rewrite_nodes(p, visit)

    return pass_fn


def explicit_instance_norm(node, e: Edit):
    """A train-mode ``aten.instance_norm`` with running statistics by explicit ops: each
    instance normalized by its own statistics; the running ones move towards their mean over
    the batch (the unbiased variance, as InstanceNorm does)."""
    if node.target is not aten.instance_norm.default:
        return None
    x, weight, bias, rmean, rvar, use_input_stats, momentum, eps = e.args[:8]
    if use_input_stats is not True or rmean is None:
        return None
    dims = list(range(2, e.val(x).dim()))
    mean = e.call(aten.mean.dim, x, dims, True)
    var = e.call(aten.var.correction, x, dims, correction=0, keepdim=True)
    unbiased = e.call(aten.var.correction, x, dims, correction=1)
    batch_mean = e.call(aten.mean.dim, e.call(aten.mean.dim, x, dims), [0])
    e.write_buffer(rmean, _running(e, rmean, batch_mean, momentum))
    e.write_buffer(rvar, _running(e, rvar, e.call(aten.mean.dim, unbiased, [0]), momentum))
    return _normalized(e, x, mean, var, weight, bias, eps, _shape_of_channels(e, x))


def explicit_decomposed_batch_norm(node, e: Edit):
    """The same at core aten (``run_decompositions()``): ``_native_batch_norm_legit_functional``
    returns the new statistics as results 3 and 4, so the visit replaces the ``getitem`` s
    (values only: the node writes nothing, and goes once nothing reads it)."""
    if node.target is not operator.getitem:
        return None
    source = e.graph.by_name()[node.args[0].name]
    if source.target is not aten._native_batch_norm_legit_functional.default:
        return None
    x, weight, bias, rmean, rvar, training, momentum, eps = source.args
    if training is not True:
        return None
    shape = _shape_of_channels(e, x)
    dims = [0, *range(2, e.val(x).dim())]
    mean = e.call(aten.mean.dim, x, dims)
    if node.args[1] == 3:
        return _running(e, rmean, mean, momentum)
    if node.args[1] == 4:
        return _running(e, rvar, e.call(aten.var.correction, x, dims, correction=1), momentum)
    var = e.call(aten.var.correction, x, dims, correction=0)
    return _normalized(e, x, e.call(aten.view.default, mean, shape),
                       e.call(aten.view.default, var, shape), weight, bias, eps, shape)


# --- models and checks -----------------------------------------------------------------------------


def _export(model: nn.Module, sample: torch.Tensor):
    """``model`` in train mode exported with a dynamic batch (2..16)."""
    return torch.export.export(model.train(), (sample,),
                               dynamic_shapes=({0: Dim("batch", min=2, max=16)},))


def _snapshot(ep) -> dict:
    return {k: (v.clone(), v._version) for k, v in ep.state_dict.items()}


def _assert_untouched(ep, before: dict) -> None:
    for k, (value, version) in before.items():
        now = ep.state_dict[k]
        assert now._version == version, k
        torch.testing.assert_close(now, value, rtol=0, atol=0)


def _against_eager(model: nn.Module, q, sample_shape: tuple[int, ...]) -> None:
    """``lower(q)`` and a copy of ``model`` agree on outputs and every buffer after one and two
    calls, at each batch of ``_BATCHES``."""
    for batch in _BATCHES:
        eager = copy.deepcopy(model).train()
        lowered = lower(q)
        for call in range(2):
            torch.manual_seed(10 * batch + call)
            x = torch.randn(batch, *sample_shape[1:]) * (call + 1) + call
            torch.testing.assert_close(lowered(x.clone()), eager(x.clone()))
            for name, want in eager.named_buffers():
                got = lowered.get_buffer(name)
                torch.testing.assert_close(got, want, msg=f"{name} after call {call + 1}, "
                                                          f"batch {batch}")


def _graph_text(p) -> str:
    text = format_program(p, vals=False)
    return text[text.index("    graph 0:"):]


_MODELS = {
    "BatchNorm1d": (lambda: nn.BatchNorm1d(3), (4, 3)),
    "BatchNorm1d-3d": (lambda: nn.BatchNorm1d(3, momentum=0.3), (4, 3, 6)),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3), (4, 3, 5, 5)),
}


# --- Before / Expected -------------------------------------------------------------------------------


def test_a_batch_norm_whose_writes_are_redone_goes():
    torch.manual_seed(0)
    ep = _export(nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5))
    before = import_ep(ep)
    assert _graph_text(before) == """\
    graph 0:
      %p_weight = placeholder
      %p_bias = placeholder
      %b_running_mean = placeholder
      %b_running_var = placeholder
      %b_num_batches_tracked = placeholder
      %input = placeholder
      %add_ = call_function[aten.add_.Tensor](%b_num_batches_tracked, 1)
      %batch_norm = call_function[aten.batch_norm.default](%input, %p_weight, %p_bias, \
%b_running_mean, %b_running_var, True, 0.1, 1e-05, False)
      return (%batch_norm,)"""
    after = explicit_batch_norm(before)
    verify(after, vals=True)
    assert _graph_text(after) == """\
    graph 0:
      %p_weight = placeholder
      %p_bias = placeholder
      %b_running_mean = placeholder
      %b_running_var = placeholder
      %b_num_batches_tracked = placeholder
      %input = placeholder
      %add_ = call_function[aten.add_.Tensor](%b_num_batches_tracked, 1)
      %mean = call_function[aten.mean.dim](%input, [0, 2, 3])
      %var = call_function[aten.var.correction](%input, [0, 2, 3], correction=0)
      %var_1 = call_function[aten.var.correction](%input, [0, 2, 3], correction=1)
      %mul = call_function[aten.mul.Tensor](%b_running_mean, 0.9)
      %mul_1 = call_function[aten.mul.Tensor](%mean, 0.1)
      %add = call_function[aten.add.Tensor](%mul, %mul_1)
      %copy_ = call_function[aten.copy_.default](%b_running_mean, %add)
      %mul_2 = call_function[aten.mul.Tensor](%b_running_var, 0.9)
      %mul_3 = call_function[aten.mul.Tensor](%var_1, 0.1)
      %add_1 = call_function[aten.add.Tensor](%mul_2, %mul_3)
      %copy__1 = call_function[aten.copy_.default](%b_running_var, %add_1)
      %view = call_function[aten.view.default](%mean, [1, -1, 1, 1])
      %sub = call_function[aten.sub.Tensor](%input, %view)
      %add_2 = call_function[aten.add.Tensor](%var, 1e-05)
      %rsqrt = call_function[aten.rsqrt.default](%add_2)
      %view_1 = call_function[aten.view.default](%rsqrt, [1, -1, 1, 1])
      %mul_4 = call_function[aten.mul.Tensor](%sub, %view_1)
      %view_2 = call_function[aten.view.default](%p_weight, [1, -1, 1, 1])
      %mul_5 = call_function[aten.mul.Tensor](%mul_4, %view_2)
      %view_3 = call_function[aten.view.default](%p_bias, [1, -1, 1, 1])
      %add_3 = call_function[aten.add.Tensor](%mul_5, %view_3)
      return (%add_3,)"""


def test_a_batch_norm_whose_writes_are_not_redone_stays_for_them():
    def value_only(node, e: Edit):  # replaces the normalized value, writes no statistics
        if node.target is aten.batch_norm.default:
            x, weight, bias, _, _, _, _, eps = e.args[:8]
            shape, dims = _shape_of_channels(e, x), [0, 2, 3]
            mean = e.call(aten.mean.dim, x, dims, True)
            var = e.call(aten.var.correction, x, dims, correction=0, keepdim=True)
            return _normalized(e, x, mean, var, weight, bias, eps, shape)
        return None

    torch.manual_seed(0)
    model = nn.BatchNorm2d(3)
    ep = _export(model, torch.randn(4, 3, 5, 5))
    after = rewrite_nodes(import_ep(ep), value_only)
    verify(after, vals=True)
    text = _graph_text(after)
    # the node stays where it was, for its writes of the running statistics; nothing reads it
    assert ("%batch_norm = call_function[aten.batch_norm.default](%input, %p_weight, %p_bias, "
            "%b_running_mean, %b_running_var, True, 0.1, 1e-05, False)") in text
    assert text.endswith("return (%add_1,)")
    _against_eager(model, after, (4, 3, 5, 5))


# --- numerics against eager: outputs and running statistics ----------------------------------------


@pytest.mark.parametrize("name", sorted(_MODELS))
def test_explicit_batch_norm_matches_eager_at_every_batch(name):
    make, shape = _MODELS[name]
    torch.manual_seed(0)
    model = make()
    with torch.no_grad():  # statistics and affine parameters away from their initial values
        for t in (*model.parameters(), model.running_mean, model.running_var):
            t.add_(torch.rand_like(t))
    ep = _export(model, torch.randn(*shape))
    kept = _snapshot(ep)
    p = import_ep(ep)
    q = explicit_batch_norm(p)
    assert "aten.batch_norm" not in format_program(q, vals=False)
    _against_eager(model, q, shape)
    _assert_untouched(ep, kept)


class _Nudged(nn.Module):
    """A BatchNorm1d whose running_var is written in place before the batch norm reads it:
    the batch norm reads (and writes) the in-place write's result, the same tensor."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        self.bn.running_var.add_(0.5)
        return self.bn(x)


def test_explicit_batch_norm_where_a_statistic_was_written_in_place_before():
    torch.manual_seed(0)
    model = _Nudged()
    ep = _export(model, torch.randn(4, 3))
    p = import_ep(ep)
    assert ("%batch_norm = call_function[aten.batch_norm.default](%x, %p_bn_weight, %p_bn_bias, "
            "%b_bn_running_mean, %add_, True, 0.1, 1e-05, False)") in _graph_text(p)
    q = explicit_batch_norm(p)  # write_buffer(%add_, ...): add_ is running_var's own tensor
    verify(q, vals=True)
    text = _graph_text(q)
    assert "aten.batch_norm" not in text
    assert "copy_.default](%add_, " in text
    _against_eager(model, q, (4, 3))


def test_explicit_batch_norm_on_an_outlined_program():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3), nn.ReLU())
    ep = _export(model, torch.randn(4, 3, 5, 5))
    q = explicit_batch_norm(transform(import_ep(ep)))
    verify(q, vals=True)
    assert "aten.batch_norm" not in format_program(q, vals=False)
    _against_eager(model, q, (4, 3, 5, 5))


def test_explicit_batch_norm_after_run_decompositions():
    torch.manual_seed(0)
    model = nn.BatchNorm2d(3)
    ep = _export(model, torch.randn(4, 3, 5, 5)).run_decompositions()
    kept = _snapshot(ep)
    for p in (import_ep(ep), functional_to_inplace(import_ep(ep))):
        q = rewrite_nodes(p, explicit_decomposed_batch_norm)
        verify(q, vals=True)
        assert "_native_batch_norm_legit_functional" in format_program(p, vals=False)
        assert "_native_batch_norm_legit_functional" not in format_program(q, vals=False)
        _against_eager(model, q, (4, 3, 5, 5))
    _assert_untouched(ep, kept)


def test_explicit_instance_norm_matches_eager_at_every_batch():
    torch.manual_seed(0)
    model = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
    ep = _export(model, torch.randn(4, 3, 5, 5))
    kept = _snapshot(ep)
    p = import_ep(ep)
    assert "aten.instance_norm.default" in format_program(p, vals=False)
    q = rewrite_nodes(p, explicit_instance_norm)
    verify(q, vals=True)
    assert "instance_norm" not in format_program(q, vals=False)
    _against_eager(model, q, (4, 3, 5, 5))
    _assert_untouched(ep, kept)


# --- refusals: some writes re-done, writes re-done of a node still read ------------------------------


def test_redoing_some_writes_names_the_node_and_the_writes_left():
    ep = _export(nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5))
    with pytest.raises(PassError) as info:
        batch_norm_variant(write=(3,))(import_ep(ep))
    message = str(info.value)
    assert "'batch_norm'" in message
    assert "buffer 'running_var' would be lost" in message
    assert "re-does the write of buffer 'running_mean' only" in message
    assert "e.write_buffer" in message


def test_dropping_a_node_whose_writes_are_redone_but_that_is_still_read_is_refused():
    def redo_and_drop(node, e: Edit):
        if node.target is aten.batch_norm.default:
            rmean, rvar = e.args[3], e.args[4]
            e.write_buffer(rmean, e.call(aten.mul.Tensor, rmean, 0.5))
            e.write_buffer(rvar, e.call(aten.mul.Tensor, rvar, 0.5))
            e.drop()  # its result is the program's output: it cannot go

    ep = _export(nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5))
    with pytest.raises(PassError, match=r"node 'batch_norm' re-does its writes of buffer "
                                        r"'running_mean' and buffer 'running_var'.*'output' "
                                        r"still reads its result"):
        rewrite_nodes(import_ep(ep), redo_and_drop)


class _UnreadBatchNorm(nn.Module):
    """Calls its batch norm for the running statistics alone: the result, which the preserved
    call ``bn`` returns, is read by nothing."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        self.bn(x)
        return x * 2


def test_dropping_a_writing_node_a_signature_names_is_refused():
    """Its writes re-done and nothing reading it, the node would go but for call bn's
    signature, which names its result: it stays (it would not leave the signature naming a
    missing value), so its writes would run twice; refused, naming the signature."""

    def redo_and_drop(node, e: Edit):
        if node.target is aten.batch_norm.default:
            rmean, rvar = e.args[3], e.args[4]
            e.write_buffer(rmean, e.call(aten.mul.Tensor, rmean, 0.5))
            e.write_buffer(rvar, e.call(aten.mul.Tensor, rvar, 0.5))
            e.drop()

    ep = torch.export.export(_UnreadBatchNorm().train(), (torch.randn(4, 3, 5, 5),),
                             preserve_module_call_signature=("bn",))
    p = import_ep(ep)
    assert [a.name for a in p.call_signatures["bn"].outputs] == ["batch_norm"]
    with pytest.raises(PassError, match=r"node 'batch_norm' re-does its writes of buffer "
                                        r"'bn.running_mean' and buffer 'bn.running_var'.*a "
                                        r"signature names its result"):
        rewrite_nodes(p, redo_and_drop)


class _LegitBatchNorm(nn.Module):
    """A BatchNorm1d computed by ``aten._native_batch_norm_legit`` called directly: a node with
    three results (normalized, saved mean, saved inverse std) that writes the statistics."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        bn = self.bn
        out, mean, _ = aten._native_batch_norm_legit.default(
            x, bn.weight, bn.bias, bn.running_mean, bn.running_var, True, 0.1, 1e-5)
        return out, mean


def explicit_legit_batch_norm(replace=(0, 1, 2)):
    """At the writing node: its statistics re-done with ``e.write_buffer`` and ``e.drop()``;
    at each ``getitem`` of it whose index is in ``replace``: the value computed there."""
    made: dict = {}

    def visit(node, e: Edit):
        if node.target is aten._native_batch_norm_legit.default:
            x, weight, bias, rmean, rvar, _, momentum, eps = e.args
            mean = e.call(aten.mean.dim, x, [0])
            var = e.call(aten.var.correction, x, [0], correction=0)
            unbiased = e.call(aten.var.correction, x, [0], correction=1)
            e.write_buffer(rmean, _running(e, rmean, mean, momentum))
            e.write_buffer(rvar, _running(e, rvar, unbiased, momentum))
            invstd = e.call(aten.rsqrt.default, e.call(aten.add.Tensor, var, eps))
            y = _normalized(e, x, mean, var, weight, bias, eps, [1, -1])
            made[(id(e.graph), node.name)] = (y, mean, invstd)
            e.drop()  # goes once its getitems are replaced
        elif node.target is operator.getitem and node.args[1] in replace:
            values = made.get((id(e.graph), node.args[0].name))
            return values[node.args[1]] if values is not None else None
        return None

    return lambda p: rewrite_nodes(p, visit)


def test_a_writing_node_with_several_results_dropped_and_its_results_replaced_goes():
    torch.manual_seed(0)
    model = _LegitBatchNorm()
    p = import_ep(torch.export.export(model.train(), (torch.randn(4, 3),)))
    q = explicit_legit_batch_norm()(p)
    verify(q, vals=True)
    text = _graph_text(q)
    assert "_native_batch_norm_legit" not in text and "getitem" not in text
    assert "%copy_ = call_function[aten.copy_.default](%b_bn_running_mean, " in text
    eager, lowered = copy.deepcopy(model), lower(q)
    for _ in range(2):
        x = torch.randn(4, 3)
        torch.testing.assert_close(lowered(x), eager(x))
        for name, want in eager.named_buffers():
            torch.testing.assert_close(lowered.get_buffer(name), want)
    with pytest.raises(PassError, match=r"node '_native_batch_norm_legit' re-does its writes .* "
                                        r"but 'getitem_2' still reads its result"):
        explicit_legit_batch_norm(replace=(0, 1))(p)  # the unread getitem_2 still reads it


# --- in-place ops on buffers and inputs -------------------------------------------------------------


class Counter(nn.Module):
    """An in-place write of a buffer (``add_``), of a user input (``mul_``), and a ``relu_`` on a
    buffer whose result is read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.register_buffer("level", torch.tensor([-1.0, 0.5, 2.0]))

    def forward(self, x):
        self.count.add_(1)
        x.mul_(2)
        return x * self.count + self.level.relu_()


def _counter():
    torch.manual_seed(0)
    model = Counter()
    p = import_ep(torch.export.export(model, (torch.randn(3),)))
    assert _graph_text(p) == _COUNTER
    return model, p


_COUNTER = """\
    graph 0:
      %b_count = placeholder
      %b_level = placeholder
      %x = placeholder
      %add_ = call_function[aten.add_.Tensor](%b_count, 1)
      %mul_ = call_function[aten.mul_.Tensor](%x, 2)
      %mul = call_function[aten.mul.Tensor](%mul_, %add_)
      %relu_ = call_function[aten.relu_.default](%b_level)
      %add = call_function[aten.add.Tensor](%mul, %relu_)
      return (%add,)"""


def _run_counter(model, q) -> None:
    """Two calls of ``lower(q)`` and of eager: outputs, the written input and the buffers."""
    eager, lowered = copy.deepcopy(model), lower(q)
    for call in range(2):
        x = torch.randn(3)
        x_got, x_want = x.clone(), x.clone()
        torch.testing.assert_close(lowered(x_got), eager(x_want))
        torch.testing.assert_close(x_got, x_want)  # the input written in place
        for name, want in eager.named_buffers():
            torch.testing.assert_close(lowered.get_buffer(name), want, msg=f"{name}, {call}")


def test_an_in_place_buffer_write_replaced_by_write_buffer_goes():
    def functional_count(node, e: Edit):
        if node.target is aten.add_.Tensor and e.state(e.args[0]) is not None:
            new = e.call(aten.add.Tensor, *e.args)
            e.write_buffer(e.args[0], new)
            return new
        return None

    model, p = _counter()
    q = rewrite_nodes(p, functional_count)
    verify(q, vals=True)
    assert _graph_text(q) == _COUNTER.replace(
        "      %add_ = call_function[aten.add_.Tensor](%b_count, 1)\n",
        "      %add_1 = call_function[aten.add.Tensor](%b_count, 1)\n"
        "      %copy_ = call_function[aten.copy_.default](%b_count, %add_1)\n",
    ).replace("(%mul_, %add_)", "(%mul_, %add_1)")
    _run_counter(model, q)


def test_an_in_place_write_replaced_by_an_in_place_write_of_the_same_input_goes():
    def times_four(node, e: Edit):  # x.mul_(2) -> x.mul_(2).mul_(2), the same input written
        if node.target is aten.mul_.Tensor:
            x, k = e.args
            once = e.call(aten.mul_.Tensor, x, k)
            return e.call(aten.mul_.Tensor, once, k)
        return None

    class Model(Counter):
        def forward(self, x):
            x.mul_(4)
            return x * self.count

    _, p = _counter()
    q = rewrite_nodes(p, times_four)
    verify(q, vals=True)
    assert _graph_text(q) == _COUNTER.replace(
        "      %mul_ = call_function[aten.mul_.Tensor](%x, 2)\n",
        "      %mul__1 = call_function[aten.mul_.Tensor](%x, 2)\n"
        "      %mul__2 = call_function[aten.mul_.Tensor](%mul__1, 2)\n",
    ).replace("(%mul_, %add_)", "(%mul__2, %add_)")
    eager = Model()
    x = torch.randn(3)
    got, want = x.clone(), x.clone()
    lower(q)(got)
    eager(want)
    torch.testing.assert_close(got, want)


def test_an_in_place_write_replaced_by_a_functional_op_stays_for_its_write():
    def functional_relu(node, e: Edit):  # relu_(level) -> relu(level): the write is not re-done
        if node.target is aten.relu_.default:
            return e.call(aten.relu.default, *e.args)
        return None

    model, p = _counter()
    q = rewrite_nodes(p, functional_relu)
    verify(q, vals=True)
    assert _graph_text(q) == _COUNTER.replace(  # relu_ stays where it was, read by nothing
        "      %relu_ = call_function[aten.relu_.default](%b_level)\n",
        "      %relu = call_function[aten.relu.default](%b_level)\n"
        "      %relu_ = call_function[aten.relu_.default](%b_level)\n",
    ).replace("(%mul, %relu_)", "(%mul, %relu)")
    _run_counter(model, q)


def test_an_in_place_write_of_another_tensor_is_still_refused():
    def writes_elsewhere(node, e: Edit):  # mul_(x) -> add_(count): not what the node wrote
        if node.target is aten.mul_.Tensor:
            count = next(n.ref for n in e.graph.nodes if n.name == "b_count")
            e.call(aten.add_.Tensor, count, 1)
            return e.call(aten.mul.Tensor, *e.args)
        return None

    _, p = _counter()
    with pytest.raises(PassError, match=r"add_.Tensor emitted at node 'mul_' writes %b_count"):
        rewrite_nodes(p, writes_elsewhere)


def test_an_in_place_write_of_the_node_s_tensor_is_refused_where_the_node_stays():
    def write_first(node, e: Edit):  # x.mul_(2) written before the node, which stays
        if node.target is aten.mul_.Tensor:
            e.call(aten.mul_.Tensor, *e.args)

    def write_after(node, e: Edit):  # ... or after it, reading its result: twice either way
        if node.target is aten.mul_.Tensor:
            return e.call(aten.mul_.Tensor, node.ref, 2)
        return None

    _, p = _counter()
    with pytest.raises(PassError, match=r"mul_.Tensor emitted at node 'mul_' writes %x in place, "
                                        r"which the node writes too \(user input %x\), and the "
                                        r"node stays: it would be written twice"):
        rewrite_nodes(p, write_first)
    with pytest.raises(PassError, match=r"mul_.Tensor emitted at node 'mul_' writes %mul_ in "
                                        r"place, which is a value"):
        rewrite_nodes(p, write_after)


def test_a_dropped_in_place_write_goes_when_redone_and_stays_when_not():
    ep = _export(nn.BatchNorm1d(3), torch.randn(4, 3))
    p = import_ep(ep)

    def redo_count(node, e: Edit):  # num_batches_tracked.add_(1), whose result nothing reads
        if node.target is aten.add_.Tensor:
            e.write_buffer(e.args[0], e.call(aten.add.Tensor, *e.args))
            e.drop()

    q = rewrite_nodes(p, redo_count)
    text = _graph_text(q)
    assert "aten.add_" not in text
    assert "%copy_ = call_function[aten.copy_.default](%b_num_batches_tracked, %add)" in text

    def drop_every_node(node, e: Edit):  # a dead-code pass: writing nodes stay
        e.drop()

    assert rewrite_nodes(p, drop_every_node) is p


def test_redoing_the_writes_of_a_random_node_is_refused():
    class Noise(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("noise", torch.zeros(3))

        def forward(self, x):
            self.noise.uniform_()
            return x + self.noise

    p = import_ep(torch.export.export(Noise(), (torch.randn(3),)))

    def redo(node, e: Edit):
        if node.target is aten.uniform_.default:
            new = e.call(aten.mul.Tensor, e.args[0], 0.0)
            e.write_buffer(e.args[0], new)
            return new
        return None

    with pytest.raises(PassError, match=r"node 'uniform_' and re-does its writes of buffer "
                                        r"'noise', but the node draws random numbers \(aten.uniform_.default\) "
                                        r"besides writing: it cannot go"):
        rewrite_nodes(p, redo)


# --- the laws: the pass holds on the model's variants, and a baked-in batch is caught --------------


def _bn_model_ep():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    return _export(model, torch.randn(4, 4))


_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)  # the law's message is what counts
_LAW_SETTINGS = settings(max_examples=6, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck))


def _like(ep):
    """``programs_like(ep)`` without inputs at the edges: explicit ops round otherwise than the
    fused kernel, and where a channel's batch variance is 0 (a constant input, which edge values
    draw) both outputs are the mean's rounding error times ``1 / sqrt(eps)``, unequal noise."""
    return programs_like(ep, edge_values=False)


def test_the_pass_holds_by_the_laws_on_programs_like_the_model():
    report = check_laws(explicit_batch_norm, programs=_like(_bn_model_ep()),
                        settings=settings(_LAW_SETTINGS, max_examples=4))
    assert report.changed >= 2  # the flat and outlined forms; the decomposed ones have no batch_norm


@pytest.mark.parametrize("draws", ["just", "like"])
def test_a_baked_in_batch_is_caught_by_the_laws(draws):
    ep = _bn_model_ep()
    programs = st.just(import_ep(ep)) if draws == "just" else _like(ep)
    with pytest.raises(LawViolation) as info:  # not vacuous: caught, at another batch
        check_laws(batch_norm_variant(baked_batch=4), programs=programs,
                   settings=settings(_LAW_SETTINGS, phases=_NO_SHRINK))
    assert info.value.law == "semantics", str(info.value)
    assert "running_var" in str(info.value)


# --- a result of a multi-result op, written in place -------------------------------------------


class _Sorted(nn.Module):
    """``relu`` of each of ``sort``'s values (fresh memory) and of a ``split`` piece (a view)."""

    def __init__(self, twice: bool = False):
        super().__init__()
        self.twice = twice

    def forward(self, x):
        values, order = torch.sort(x * 2)
        y = x + 1
        head, tail = torch.split(y, 2)
        out = values.relu() + order.float() + head.relu().sum() + tail.sum()
        return out + values if self.twice else out


def _relu_in_place(node, e: Edit):
    return e.call(aten.relu_.default, *e.args) if node.target is aten.relu.default else None


def _sort_program(twice: bool):
    model = _Sorted(twice).eval()
    x = torch.tensor([3.0, -1.0, 2.0, -4.0])
    return model, x, import_ep(torch.export.export(model, (x,)))


def test_a_multi_result_ops_result_only_the_node_reads_is_written_in_place():
    """``sort``'s values are fresh memory only ``relu`` reads: ``relu_`` writes them (its
    indices, another tensor of the same node, are read elsewhere); a ``split`` piece is a
    view of ``y``, which the other piece shares: refused."""
    model, x, p = _sort_program(twice=False)
    with pytest.raises(PassError, match=r"writes %getitem_2 in place"):
        rewrite_nodes(p, _relu_in_place)  # the split piece

    def sort_values_only(node, e: Edit):
        reads_values = node.target is aten.relu.default and e.args[0].name == "getitem"
        return _relu_in_place(node, e) if reads_values else None

    q = rewrite_nodes(p, sort_values_only)
    verify(q, vals=True)
    text = _graph_text(q)
    assert "%relu_ = call_function[aten.relu_.default](%getitem)\n" in text, text
    assert "aten.relu.default](%getitem)" not in text
    torch.testing.assert_close(lower(q)(x.clone()), model(x.clone()))


def test_a_multi_result_ops_result_another_node_reads_is_not_written_in_place():
    _, _, p = _sort_program(twice=True)  # the values are returned too

    def sort_values_only(node, e: Edit):
        reads_values = node.target is aten.relu.default and e.args[0].name == "getitem"
        return _relu_in_place(node, e) if reads_values else None

    with pytest.raises(PassError, match=r"writes %getitem in place"):
        rewrite_nodes(p, sort_values_only)
