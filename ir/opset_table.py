"""PLACEHOLDER rows (branch h/gens): a hand-written sample of the verified table's shape."""

import torch

from ir.opset import OpEntry, Sample, TensorSpec, Write

F = torch.float32
T = frozenset({"training", "core"})
TR = frozenset({"training"})
CO = frozenset({"core"})


def _t(*shape, dtype=F, **kw):
    return TensorSpec(tuple(shape), dtype, **kw)


ROWS = (
    OpEntry("aten.add.Tensor", levels=T, samples=(
        Sample((_t(2, 3), _t(2, 3))), Sample((_t(2, 3, dtype=torch.float16), _t(3, dtype=torch.float16))),
        Sample((_t(3, 2, stride=(1, 3)), _t(3, 2))))),
    OpEntry("aten.mul.Tensor", levels=T, samples=(
        Sample((_t(2, 3, dtype=torch.bfloat16), _t(2, 3, dtype=torch.bfloat16))),
        Sample((_t(4, dtype=torch.int64), _t(4, dtype=torch.int64))))),
    OpEntry("aten.convolution.default", levels=T, samples=(
        Sample((_t(2, 3, 5, 5, stride=(75, 1, 15, 3)), _t(4, 3, 3, 3), _t(4), (1, 1), (1, 1),
                (1, 1), False, (0, 0), 1)),)),
    OpEntry("aten.batch_norm.default", levels=TR, writes=(Write(3, ((5, True),)), Write(4, ((5, True),))),
            hidden="writes running stats when training", samples=(
        Sample((_t(2, 3, 4, 4), _t(3), _t(3), _t(3), _t(3, low=0.5, high=1.5), True, 0.1, 1e-5, False)),
        Sample((_t(2, 3, 4, 4), _t(3), _t(3), _t(3), _t(3, low=0.5, high=1.5), False, 0.1, 1e-5, False)))),
    OpEntry("aten.embedding.default", levels=T, samples=(
        Sample((_t(10, 3), _t(2, 4, dtype=torch.int64, values=(0, 9, 3, 3, 1, 2, 5, 7)))),)),
    OpEntry("aten.index_select.default", levels=T, samples=(
        Sample((_t(5, 3), 0, _t(2, dtype=torch.int64, values=(4, 1)))),)),
    OpEntry("aten.gather.default", levels=T, samples=(
        Sample((_t(3, 4), 1, _t(3, 2, dtype=torch.int64, values=(0, 3, 1, 1, 2, 0)))),)),
    OpEntry("aten.sum.dim_IntList", levels=T, samples=(Sample((_t(3, 4), [1], True)),)),
    OpEntry("aten.permute.default", levels=T, aliases=((0, 0),), samples=(Sample((_t(2, 3, 4), [2, 0, 1])),)),
    OpEntry("aten.view.default", levels=T, aliases=((0, 0),), samples=(Sample((_t(2, 6), [3, 4])),)),
    OpEntry("aten.add_.Tensor", levels=TR, writes=(Write(0),), aliases=((0, 0),),
            samples=(Sample((_t(2, 3), _t(2, 3))),)),
    OpEntry("aten.dropout.default", levels=TR, random=True, samples=(Sample((_t(3, 4), 0.5, True)),)),
    OpEntry("aten.native_dropout.default", levels=CO, random=True, samples=(Sample((_t(3, 4), 0.5, True)),)),
    OpEntry("aten.where.self", levels=T, samples=(
        Sample((_t(2, 3, dtype=torch.bool), _t(2, 3), _t(2, 3))),)),
    OpEntry("aten.logical_and.default", levels=T, samples=(
        Sample((_t(2, 3, dtype=torch.bool), _t(2, 3, dtype=torch.bool))),)),
    OpEntry("aten._print.default", effectful=True, levels=T, samples=(Sample(("hi",)),)),
)
