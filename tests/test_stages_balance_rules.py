"""The rules of the balanced split, pinned to exact numbers (``transforms.stages.balance``).

- per-op FLOPs: which argument of each matmul contracts (``addmm``'s second, ``mm``'s first),
  what a convolution and attention cost, and what every other op costs, on hand-made nodes
  whose argument shapes all differ, so reading another argument gives another number;
- per-node costs and cut points of small exported models: the node each cut lands on, the bytes
  that cross it, which module path names it (the outermost one starting there), and the
  tie-breaks (equal stages: closest to the mean, then least traffic, then the earliest cut).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ir import import_ep
from ir.args import Ref
from ir.graph import Graph
from ir.node import CALL_FUNCTION, Node
from transforms import split_stages
from transforms.stages.balance import FLOP_RULES, Plan, best_cuts, node_flops, stage_costs
from transforms.stages.plan import state_reads

aten = torch.ops.aten


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def _flops(target, args, out) -> int:
    """``node_flops`` of one call of ``target``: ``args`` are shapes (a value named ``a{i}``),
    or anything else (passed as a literal); ``out`` its result's ``val``."""
    vals, refs = {}, []
    for i, a in enumerate(args):
        if isinstance(a, tuple):
            vals[f"a{i}"] = _meta(*a)
            refs.append(Ref(f"a{i}"))
        else:
            refs.append(a)
    node = Node(CALL_FUNCTION, "out", target, tuple(refs), meta={"val": out})
    return node_flops(node, vals)


# (op, argument shapes, output, FLOPs, why): every shape's last dim differs from the contracted
# one (3), so a rule reading another argument gives another number
MATMULS = [
    (aten.mm.default, [(2, 3), (3, 5)], _meta(2, 5), 2 * 10 * 3, "mm(a, b): a's last dim"),
    (aten.addmm.default, [(5,), (2, 3), (3, 5)], _meta(2, 5), 2 * 10 * 3,
     "addmm(bias, a, b): a (the second argument)'s last dim"),
    (aten.bmm.default, [(4, 2, 3), (4, 3, 5)], _meta(4, 2, 5), 2 * 40 * 3, "bmm(a, b): a's"),
    (aten.baddbmm.default, [(4, 2, 5), (4, 2, 3), (4, 3, 5)], _meta(4, 2, 5), 2 * 40 * 3,
     "baddbmm(bias, a, b): a (second)'s"),
    (aten.matmul.default, [(2, 3), (3, 5)], _meta(2, 5), 2 * 10 * 3, "matmul(a, b): a's"),
    (aten.linear.default, [(2, 3), (5, 3), (5,)], _meta(2, 5), 2 * 10 * 3,
     "linear(x, w, b): x's last dim (in_features)"),
    (aten.einsum.default, ["ij,jk->ik", [Ref("a1"), Ref("a2")]], _meta(2, 5), 10,
     "einsum: its output elements"),
    # weight (out, in / groups, *kernel): 2 x out elements x (in / groups x kernel)
    (aten.convolution.default, [(2, 3, 8, 8), (4, 3, 3, 2), (4,)], _meta(2, 4, 6, 7),
     2 * 336 * 18, "convolution(x, w, ...): w's dims after the first"),
    (aten.conv1d.default, [(2, 3, 9), (4, 3, 5)], _meta(2, 4, 5), 2 * 40 * 15, "conv1d"),
    (aten.conv2d.default, [(2, 3, 8, 8), (4, 3, 3, 2)], _meta(2, 4, 6, 7), 2 * 336 * 18,
     "conv2d"),
    (aten.conv3d.default, [(1, 2, 4, 4, 4), (3, 2, 2, 2, 2)], _meta(1, 3, 3, 3, 3),
     2 * 81 * 16, "conv3d"),
    # q (2, 2, 4, 8), k and v of length 6 (their last dim 8 differs from it): 4 x q x len
    (aten.scaled_dot_product_attention.default, [(2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)],
     _meta(2, 2, 4, 8), 4 * 128 * 6, "attention: k's length (dim -2)"),
    (aten._scaled_dot_product_flash_attention_for_cpu.default,
     [(2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)], (_meta(2, 2, 4, 8), _meta(2, 2, 4)),
     4 * 128 * 6, "attention with a tuple result: its first element"),
    (aten._scaled_dot_product_efficient_attention.default,
     [(2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)], [_meta(2, 2, 4, 8), _meta(2, 2, 4)],
     4 * 128 * 6, "a list result too"),
    (aten._scaled_dot_product_flash_attention.default,
     [(2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8)], (_meta(2, 2, 4, 8),), 4 * 128 * 6, "flash"),
]


@pytest.mark.parametrize(("op", "args", "out", "want", "why"), MATMULS,
                         ids=[str(row[0]) for row in MATMULS])
def test_flop_rule_of_each_listed_op(op, args, out, want, why):
    assert op in FLOP_RULES
    assert _flops(op, args, out) == want, why


def test_every_listed_op_has_a_pinned_number():
    assert set(FLOP_RULES) == {row[0] for row in MATMULS}


@pytest.mark.parametrize(
    ("op", "args", "out", "want"),
    [
        # the contracted argument's val is unknown (not a value, or missing): 1 per output
        (aten.mm.default, [7, (3, 5)], _meta(2, 5), 2 * 10),
        (aten.addmm.default, [(5,)], _meta(2, 5), 2 * 10),  # fewer arguments than the rule reads
        (aten.mm.default, [(), (3, 5)], _meta(2, 5), 2 * 10),  # a 0-d contracted argument
        # a convolution without a weight value: 2 x out elements
        (aten.convolution.default, [(2, 3, 8, 8), 0], _meta(2, 4, 6, 7), 2 * 336),
        # attention with a 1-d key (no length dim) or none: length 1
        (aten.scaled_dot_product_attention.default, [(2, 4, 8), (8,)], _meta(2, 4, 8), 4 * 64),
        (aten.scaled_dot_product_attention.default, [(2, 4, 8), 1], _meta(2, 4, 8), 4 * 64),
        (aten._scaled_dot_product_flash_attention.default, [(2, 4, 8), (2, 6, 8)], (), 0),
        # any other op: its output elements, summed over a tuple; a non-tensor costs nothing
        (aten.matmul.default, [(3,), (3, 5)], _meta(5), 2 * 5 * 3),  # a 1-d contracted argument
        (aten.scaled_dot_product_attention.default, [(4, 8), (6, 8)], _meta(4, 8), 4 * 32 * 6),
        (aten.relu.default, [(2, 5)], _meta(2, 5), 10),
        (aten.split.Tensor, [(6, 5), 2], (_meta(2, 5), _meta(4, 5)), 30),
        (aten.sym_size.int, [(6, 5), 0], 6, 0),
        (aten.relu.default, [(2, 5)], None, 0),
    ],
)
def test_flop_rule_edges(op, args, out, want):
    assert _flops(op, args, out) == want


class _Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_flops_of_a_dynamic_size_read_its_hint():
    """A symbolic batch counts with its example value (3 rows here)."""
    x = torch.randn(3, 4)
    ep = torch.export.export(_Lin(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("b")}})
    p = import_ep(ep)
    plan = Plan(p, state_reads(p))
    (linear,) = [nd for nd in plan.nodes if nd.target is aten.linear.default]
    assert isinstance(linear.meta["val"].shape[0], torch.SymInt)
    assert plan.flops[plan.nodes.index(linear)] == 2 * (3 * 8) * 4


class _Unbacked(nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()
        torch._check(k >= 1)
        return x.sum() * torch.ones(k)


def test_a_size_without_a_hint_counts_one():
    """A data-dependent size (``item()``) has no example value: it counts 1 per element."""
    p = import_ep(torch.export.export(_Unbacked(), (torch.randn(3), torch.tensor(4))))
    plan = Plan(p, state_reads(p))
    flops = {nd.name: f for nd, f in zip(plan.nodes, plan.flops, strict=True)}
    assert flops["ones"] == 1 and flops["mul"] == 1 and flops["sum_1"] == 1


# --- cut points of small models -------------------------------------------------------------


class _Narrow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., :4]


class _Net(nn.Module):
    """lin0 (160 B), two modules without state (act, cut), lin1 (80 B); ``cut`` halves the
    activation, so a cut at ``lin1`` sends 32 B where a cut at ``act`` or ``cut`` sends 64 B."""

    def __init__(self) -> None:
        super().__init__()
        self.lin0 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.cut = _Narrow()
        self.lin1 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin1(self.cut(self.act(self.lin0(x))))


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _Nested(nn.Module):
    """``enc`` and ``enc.a`` begin at one node; the root reads ``w`` twice; ``h0`` is both
    read by ``enc`` and returned, so it crosses every later cut."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.enc = _Inner()
        self.head = nn.Linear(4, 2)
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h0 = self.stem(x)
        return self.head(self.enc(h0) * self.w * self.w), h0


def _plan(model: nn.Module) -> tuple:
    p = import_ep(torch.export.export(model, (torch.randn(2, 4),)))
    return p, Plan(p, state_reads(p))


def test_costs_and_cut_points_of_a_chain():
    _p, plan = _plan(_Net())
    assert [nd.name for nd in plan.nodes] == ["linear", "relu", "slice_1", "linear_1"]
    assert plan.params == [160, 0, 0, 80]  # float32 (8 x 4 + 8), (4 x 4 + 4); at the first read
    assert plan.flops == [2 * 8 * 4 * 2, 16, 8, 2 * 8 * 4]  # linear, then output elements
    assert plan.costs("params") is plan.params and plan.costs("flops") is plan.flops
    # a cut before node i (the first node of a module), never before node 0
    assert plan.candidates == [(1, "act"), (2, "cut"), (3, "lin1")]
    assert plan.crossing == [0, 64, 64, 32, 32]  # (2, 8) floats, then (2, 4)


def test_ties_go_to_least_traffic_then_the_earliest_cut():
    p, _ = _plan(_Net())
    # every cut gives (160, 80): the traffic decides, lin1 sends 32 B, act and cut 64 B
    two = split_stages(p, n=2, balance="params")
    assert two.at == ("lin1",) and two.params == (160, 80)
    # (act, lin1) and (cut, lin1) tie in bytes and traffic (96 B): the earliest
    three = split_stages(p, n=3, balance="params")
    assert three.at == ("act", "lin1") and three.params == (160, 0, 80)
    # by FLOPs the largest stage is lin0 (128) in any split; the closest to the mean is act
    assert split_stages(p, n=2, balance="flops").at == ("act",)
    assert split_stages(p, n=2, balance="flops").flops == (128, 88)
    assert split_stages(p, n=4, balance="flops").at == ("act", "cut", "lin1")


def test_nested_paths_state_read_twice_and_outputs_crossing():
    p, plan = _plan(_Nested())
    assert [nd.name for nd in plan.nodes] == [
        "linear", "linear_1", "linear_2", "mul", "mul_1", "linear_3"
    ]
    # ``w`` (16 B) is charged at its first read in the root only
    assert plan.params == [80, 80, 80, 16, 0, 40]
    assert plan.flops == [64, 64, 64, 8, 8, 32]
    # ``enc`` and ``enc.a`` begin at node 1: the outermost path names the cut
    assert plan.candidates == [(1, "enc"), (2, "enc.b"), (5, "head")]
    # h0 (32 B) is returned: it crosses every cut after it, with the value read next
    assert plan.crossing == [0, 32, 64, 64, 64, 64, 48]
    assert split_stages(p, n=2, balance="params").at == ("enc.b",)
    three = split_stages(p, n=3, balance="params")
    assert three.at == ("enc", "enc.b") and three.params == (80, 80, 136)


def _with_val(p, name: str, val):
    """``p`` with node ``name``'s ``val`` replaced (what the cut search reads of it)."""
    root = p.root_module
    nodes = tuple(
        n.replace(meta={**n.meta, "val": val}) if n.name == name else n for n in root.graph.nodes
    )
    graph = Graph(nodes)
    return p.replace(modules=p.modules.set(p.root, root.replace(graphs=(graph, *root.graphs[1:]))))


def test_a_non_tensor_crossing_is_no_cut_and_an_unknown_value_is_a_free_one():
    p, _ = _plan(_Net())
    # relu's value crosses the cut at ``cut`` (into the slice): a list there is no tensor
    listed = _with_val(p, "relu", [1, 2])
    plan = Plan(listed, state_reads(listed))
    assert plan.candidates == [(1, "act"), (3, "lin1")]
    # a value without ``val`` still crosses (the cut is allowed), at 0 bytes
    unknown = _with_val(p, "relu", None)
    plan = Plan(unknown, state_reads(unknown))
    assert plan.candidates == [(1, "act"), (2, "cut"), (3, "lin1")]
    assert plan.crossing == [0, 64, 0, 32, 32]


class _Symmetric(nn.Module):
    """m0 and m2 hold 160 B each, m1 144 B: a cut before m1 or before m2 gives the same largest
    stage (304 B) and the same deviation; m1 sends (2, 4) floats, m0 (2, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.m0 = nn.Linear(4, 8)
        self.m1 = nn.Linear(8, 4)
        self.m2 = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m2(self.m1(self.m0(x)))


def test_mirrored_stages_tie_and_the_traffic_decides():
    p, plan = _plan(_Symmetric())
    assert plan.params == [160, 144, 160]
    assert plan.candidates == [(1, "m1"), (2, "m2")] and plan.crossing[1:3] == [64, 32]
    for balance in ("params", "flops"):  # flops: 128 each
        stages = split_stages(p, n=2, balance=balance)
        assert stages.at == ("m2",), balance
    assert split_stages(p, n=2).params == (304, 160)


class _TiedInner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _TiedNested(nn.Module):
    """``enc.a`` and ``enc.b`` hold one weight; a stage boundary may fall between them."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = _TiedInner()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x))


def test_a_tied_tensor_is_charged_once_per_innermost_module():
    _p, plan = _plan(_TiedNested())
    # the weight (64 B) once in enc.a and once in enc.b, each with its bias (16 B)
    assert plan.params == [80, 80, 40]
    assert plan.candidates == [(1, "enc.b"), (2, "head")]


def test_stage_costs_sum_flops_by_stage():
    _p, plan = _plan(_Net())
    stage_of = {"linear": 0, "relu": 1, "slice_1": 1}  # linear_1 unlisted: stage 0
    assert stage_costs(plan, stage_of, 2) == (128 + 64, 16 + 8)


@pytest.mark.parametrize(
    ("prefix", "cuts", "traffic", "k", "want"),
    [
        ([0, 1, 2, 3, 4], [1, 2, 3], [0, 0, 0], 3, (2, [0, 1])),  # a full tie: the earliest
        ([0, 1, 2, 3, 4], [1, 2, 3], [5, 0, 0], 3, (2, [1, 2])),  # the traffic breaks it
        ([0, 4, 4, 4, 8], [1, 2, 3], [0, 0, 0], 2, (4, [0])),  # zero-cost items: the earliest
        ([0, 4, 4, 4, 8], [1, 2, 3], [3, 1, 2], 2, (4, [1])),
        # largest part 3 either way: (2, 2, 3) is closer to the mean than (1, 3, 3), which
        # would send nothing; the deviation comes before the traffic
        ([0, 1, 2, 3, 4, 7], [1, 2, 3, 4], [0, 9, 9, 0], 3, (3, [1, 3])),
        ([0, 3, 6, 9, 12], [1, 2, 3], [9, 9, 9], 2, (6, [1])),  # the exact middle
        ([0, 3, 6, 9, 12], [1, 2, 3], [0, 0, 0], 4, (3, [0, 1, 2])),  # every cut
        ([0, 3, 6], [1], [0], 1, (6, [])),  # one stage: no cut
        ([0, 3, 6], [1], [0], 3, None),  # more stages than cut points allow
        ([0, 0, 0, 0], [1, 2], [1, 0], 2, (0, [1])),  # nothing costs: the traffic decides
        # found by mutation: a last stage over the bound is never an end, however it deviates
        ([0, 0, 4, 9, 11, 17, 21], [1, 2, 3, 4, 5], [3, 0, 1, 2, 3], 3, (9, [2, 4])),
        # and the deviation windows keep their least entry, not the first one pushed
        ([0, 6, 9, 9, 15, 17, 21, 23], [1, 2, 3, 4, 6], [2, 3, 0, 3, 1], 3, (9, [2, 3])),
        # the window above the mean orders by deviation, then traffic
        ([0, 5, 11, 17, 17, 20, 25], [3, 4, 5], [1, 0, 0], 3, (17, [1, 2])),
        ([0, 6, 8, 9, 11, 14, 17, 23], [1, 2, 3, 4, 5, 6], [0, 2, 1, 1, 2, 1], 6,
         (6, [0, 2, 3, 4, 5])),
    ],
)
def test_best_cuts_examples(prefix, cuts, traffic, k, want):
    assert best_cuts(prefix, cuts, traffic, k) == want
