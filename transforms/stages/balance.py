"""Balanced pipeline cuts: where ``split_stages(p, n=K, balance=...)`` cuts a flat program.

A stage begins where a module's first call begins (the ``at=`` rule), so the candidate cut
points are the distinct first nodes of the program's module paths, in graph order. Each
non-state node has a cost (``params``: the bytes of the state tensors it is the first to read
within its module, so a tensor tied across modules is charged once per module;
``flops``: an estimate from the node's ``val`` and its inputs' ``val``s, ``FLOP_RULES``); a stage
costs the sum over its nodes. The cut points are chosen in two exact passes over the candidates:

1. the smallest possible largest stage ``B*`` (min-max partition of a sequence into ``K``
   contiguous parts at allowed points), by dynamic programming whose split point moves one way
   (both terms are monotone), so each of the ``K`` rows costs O(candidates);
2. among the cuts whose every stage costs at most ``B*``, those whose stages are closest to the
   mean (least ``sum |K * stage - total|``, so no stage is needlessly tiny), then those sending
   the fewest activation bytes between stages, by dynamic programming with sliding-window
   minima (the allowed previous cuts, and each side of the mean, are windows that move one
   way), again O(candidates) per row.

A candidate is left out when no tensor value crosses it (a stage must send something) or a
non-tensor value other than a symbolic size does (``PipelineStage`` sends tensors only; a size
is read off the later stage's own inputs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import torch

from ir import signature as sg
from ir.errors import PassError
from ir.node import OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from transforms.rewrite.cost import nbytes, numel, size_hint
from transforms.stages.plan import frame_paths

BALANCES = ("params", "flops")
INF = float("inf")


def _arg_val(node: Node, i: int, vals: dict[str, Any]) -> Any:
    arg = node.args[i] if i < len(node.args) else None
    name = getattr(arg, "name", None)
    return vals.get(name) if name is not None else None


def _last_dim(val: Any) -> int:
    if isinstance(val, torch.Tensor) and val.dim() > 0:
        return size_hint(val.shape[-1])
    return 1


def _contracting(i: int) -> Callable[[Node, Any, dict[str, Any]], int]:
    """2 * out elements * the contracted size (the last dim of argument ``i``)."""

    def rule(node: Node, out: Any, vals: dict[str, Any]) -> int:
        return 2 * numel(out) * _last_dim(_arg_val(node, i, vals))

    return rule


def _conv(node: Node, out: Any, vals: dict[str, Any]) -> int:
    weight = _arg_val(node, 1, vals)
    per = 1
    if isinstance(weight, torch.Tensor):
        for d in weight.shape[1:]:
            per *= size_hint(d)
    return 2 * numel(out) * per


def _attention(node: Node, out: Any, vals: dict[str, Any]) -> int:
    key = _arg_val(node, 1, vals)
    length = size_hint(key.shape[-2]) if isinstance(key, torch.Tensor) and key.dim() > 1 else 1
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    return 4 * numel(first) * length  # q @ k^T and p @ v


_aten = torch.ops.aten
# op -> FLOPs of one call; every other op costs its output elements.
FLOP_RULES: dict[Any, Callable[[Node, Any, dict[str, Any]], int]] = {
    _aten.mm.default: _contracting(0),
    _aten.addmm.default: _contracting(1),
    _aten.bmm.default: _contracting(0),
    _aten.baddbmm.default: _contracting(1),
    _aten.matmul.default: _contracting(0),
    _aten.linear.default: _contracting(0),
    _aten.einsum.default: lambda node, out, vals: numel(out),
    _aten.convolution.default: _conv,
    _aten.conv1d.default: _conv,
    _aten.conv2d.default: _conv,
    _aten.conv3d.default: _conv,
    _aten.scaled_dot_product_attention.default: _attention,
    _aten._scaled_dot_product_flash_attention_for_cpu.default: _attention,
    _aten._scaled_dot_product_efficient_attention.default: _attention,
    _aten._scaled_dot_product_flash_attention.default: _attention,
}


def node_flops(node: Node, vals: dict[str, Any]) -> int:
    """The estimated FLOPs of one call: ``FLOP_RULES[node.target]`` or its output elements.
    ``vals``: value name -> ``meta['val']``. O(1)."""
    out = node.meta.get("val")
    rule = FLOP_RULES.get(node.target)
    return rule(node, out, vals) if rule is not None else numel(out)


class Plan:
    """What the cut search reads of a flat program: the compute nodes in order, the candidate
    cut points, and each node's costs. Built once in O(n + s)."""

    def __init__(self, p: Program, state_reads: dict[str, str]) -> None:
        graph = p.root_module.graph
        table, tensors = p.state_table(), p.tensor_table()
        self.nodes = [
            nd for nd in graph.nodes
            if nd.op not in (PLACEHOLDER, OUTPUT) and nd.name not in state_reads
        ]
        index = {nd.name: i for i, nd in enumerate(self.nodes)}
        self.n = len(self.nodes)
        vals = {nd.name: nd.meta.get("val") for nd in graph.nodes}
        # a state tensor costs its bytes at its first read in each module that reads it: a tied
        # embedding and lm head are charged twice, as two stages usually hold a copy each
        seen: set[tuple[str, str]] = set()
        self.params = [0] * self.n
        self.flops = [0] * self.n
        for i, nd in enumerate(self.nodes):
            self.flops[i] = node_flops(nd, vals)
            paths = frame_paths(nd)
            where = paths[-1] if paths else ""
            for r in nd.inputs():
                fqn = state_reads.get(r.name)
                if fqn is None or (table[fqn].tensor, where) in seen:
                    continue
                seen.add((table[fqn].tensor, where))
                self.params[i] += nbytes(tensors[table[fqn].tensor].value)
        # candidates: the first node of each module path, outermost path first on a tie
        first: dict[int, str] = {}
        begun: set[str] = set()
        for i, nd in enumerate(self.nodes):
            for path in frame_paths(nd):
                if path and path not in begun:
                    begun.add(path)
                    if p.resolve(path) is not None:
                        first.setdefault(i, path)
        # activation bytes crossing each position; a non-tensor crossing makes it no cut
        last = {}
        for nd in graph.nodes:
            if nd.name in index:
                for r in nd.inputs():
                    if r.name in index:
                        last[r.name] = index[nd.name]
        outputs = graph.outputs or ()
        kinds = [s.kind for s in p.signature.outputs]
        for value, kind in zip(outputs, kinds):
            name = getattr(value, "name", None)
            if name in index and kind not in sg.MUTATION_KINDS:
                last[name] = self.n
        size = self.n + 2  # difference arrays over positions 0 .. n (cut before node i)
        delta, bad, count = [0] * size, [0] * size, [0] * size
        for name, end in last.items():
            start = index[name] + 1
            if end < start:
                continue
            val = vals.get(name)
            if val is not None and not isinstance(val, (torch.Tensor, torch.SymInt)):
                bad[start] += 1
                bad[end + 1] -= 1
            else:
                moved = nbytes(val)
                delta[start] += moved
                delta[end + 1] -= moved
                count[start] += 1
                count[end + 1] -= 1
        crossing, crossing_bad, crossing_count = (
            list(accumulate(d[: self.n + 1])) for d in (delta, bad, count)
        )
        self.candidates = [
            (i, path) for i, path in sorted(first.items())
            if 0 < i and crossing_count[i] > 0 and crossing_bad[i] == 0
        ]
        self.crossing = crossing

    def costs(self, balance: str) -> list[int]:
        """Per compute node, its cost under ``balance``."""
        return self.params if balance == "params" else self.flops


class _WindowMin:
    """The smallest key over a window of indices whose both ends only move forward (a monotone
    deque): ``push`` indices in increasing order, ``drop_before`` the left end, ``best`` the
    index of the smallest key (the earliest on a tie), or ``None``. O(1) amortized each."""

    def __init__(self, key: Callable[[int], Any]) -> None:
        self.key = key
        self.window: deque[int] = deque()

    def push(self, i: int) -> None:
        k = self.key(i)
        while self.window and self.key(self.window[-1]) > k:
            self.window.pop()
        self.window.append(i)

    def drop_before(self, lo: int) -> None:
        while self.window and self.window[0] < lo:
            self.window.popleft()

    def best(self) -> int | None:
        return self.window[0] if self.window else None


def best_cuts(prefix: Sequence[int], cuts: Sequence[int], traffic: Sequence[int],
              k: int) -> tuple[int, list[int]] | None:
    """The ``k - 1`` cut indices (into ``cuts``, increasing) that minimise the largest part of a
    sequence with prefix sums ``prefix`` (``prefix[x]``: the cost of items ``< x``; the last entry
    is the total), cut only at positions ``cuts`` (increasing, inside ``(0, len)``).

    Among the cuts reaching that smallest largest part ``B``, the ones whose parts are closest
    to the mean (least ``sum |k * part - total|``: no needlessly tiny stage), then the smallest
    total ``traffic`` (``traffic[j]``: the cost of cutting at ``cuts[j]``), then the earliest.
    Returns ``(B, chosen indices)``, or ``None`` when ``len(cuts) < k - 1``.

    Exact: (1) ``B`` by dynamic programming over (parts, last cut) whose best previous cut only
    moves forward (the best largest part of a prefix grows with the prefix, the last part
    shrinks as the previous cut moves), (2) the tie-breaks by dynamic programming where the
    allowed previous cuts (last part ``<= B``) and the two sides of the mean (where ``|k * part -
    total|`` is linear) are windows that only move forward, each kept by a monotone deque.
    O(len(cuts) * k) time.
    """
    c = len(cuts)
    if c < k - 1:
        return None
    total = prefix[-1]
    if k == 1:
        return total, []
    at = [prefix[x] for x in cuts]  # cost before each cut point
    # 1. the bottleneck: f[j] = best largest part of the prefix ending at cut j, in r parts
    f = list(at)
    for r in range(2, k):
        g = [INF] * c
        i = r - 2  # the previous cut; the r-th cut needs r - 1 cuts before it
        for j in range(r - 1, c):
            while i + 1 < j and max(f[i + 1], at[j] - at[i + 1]) <= max(f[i], at[j] - at[i]):
                i += 1
            g[j] = max(f[i], at[j] - at[i])
        f = g
    bound = min(max(f[j], total - at[j]) for j in range(k - 2, c))
    # 2. tie-breaks: cost[j] = (deviation, traffic) of the best r parts ending at cut j
    none = (INF, INF)

    def dev(part: int) -> int:
        return abs(k * part - total)

    cost = [(dev(at[j]), traffic[j]) if at[j] <= bound else none for j in range(c)]
    back: list[list[int]] = []
    for _r in range(2, k):
        prev = cost
        # below the mean (k * part >= total): deviation k*at[j] - total - k*at[i]
        low = _WindowMin(lambda i, prev=prev: (prev[i][0] - k * at[i], prev[i][1], i))
        # above it: deviation total - k*at[j] + k*at[i]
        high = _WindowMin(lambda i, prev=prev: (prev[i][0] + k * at[i], prev[i][1], i))
        g = [none] * c
        links = [-1] * c
        lo = split = pushed_low = pushed_high = 0
        for j in range(c):
            while lo < j and at[j] - at[lo] > bound:
                lo += 1
            while split < j and k * at[split] <= k * at[j] - total:
                split += 1  # indices < split are below the mean for this j
            while pushed_low < split:
                if prev[pushed_low] is not none:
                    low.push(pushed_low)
                pushed_low += 1
            while pushed_high < j:
                if prev[pushed_high] is not none:
                    high.push(pushed_high)
                pushed_high += 1
            low.drop_before(lo)
            high.drop_before(max(lo, split))
            options = []
            i = low.best()
            if i is not None:
                options.append((prev[i][0] + k * at[j] - total - k * at[i],
                                prev[i][1] + traffic[j], i))
            i = high.best()
            if i is not None:
                options.append((prev[i][0] + total - k * at[j] + k * at[i],
                                prev[i][1] + traffic[j], i))
            if options:
                d, t, i = min(options)
                g[j] = (d, t)
                links[j] = i
        cost = g
        back.append(links)
    ends = [
        ((cost[j][0] + dev(total - at[j]), cost[j][1]), j)
        for j in range(c) if total - at[j] <= bound and cost[j] is not none
    ]
    j = min(ends)[1]
    chosen = [j]
    for links in reversed(back):
        j = links[j]
        chosen.append(j)
    chosen.reverse()
    return int(bound), chosen


def balanced_at(p: Program, state_reads: dict[str, str], n: Any, balance: Any) -> tuple[str, ...]:
    """The module paths where ``split_stages(p, n=n, balance=balance)`` cuts the flat ``p``
    (``state_reads``: the names that stand for state, their fqns). Raises ``PassError`` naming
    ``n`` or ``balance`` for a bad value, or ``n`` when the program has fewer usable cut points
    than ``n - 1``. O(n_nodes + candidates * n)."""
    if balance not in BALANCES:
        raise PassError(
            f"split_stages: balance={balance!r} is not one of {', '.join(map(repr, BALANCES))}"
        )
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PassError(f"split_stages: n={n!r} must be an int >= 1 (the number of stages)")
    plan = Plan(p, state_reads)
    costs = plan.costs(balance)
    prefix = [0, *accumulate(costs)]
    cuts = [i for i, _ in plan.candidates]
    found = best_cuts(prefix, cuts, [plan.crossing[i] for i in cuts], n)
    if found is None:
        raise PassError(
            f"split_stages: n={n} needs {n - 1} cut points, but the program has only "
            f"{len(cuts)} module boundaries where a stage can begin (a module's first call that "
            f"some tensor crosses); ask for at most {len(cuts) + 1} stages"
        )
    _bound, chosen = found
    return tuple(plan.candidates[j][1] for j in chosen)


def stage_costs(plan: Plan, stage_of: dict[str, int], k: int) -> tuple[int, ...]:
    """FLOPs per stage (``plan.flops`` summed by ``stage_of``). O(n)."""
    found = [0] * k
    for nd, x in zip(plan.nodes, plan.flops):
        found[stage_of.get(nd.name, 0)] += x
    return tuple(found)


__all__ = ["BALANCES", "FLOP_RULES", "Plan", "balanced_at", "best_cuts", "node_flops"]
