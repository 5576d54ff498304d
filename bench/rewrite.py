"""Bench: ``transforms.rewrite`` against ``torch.fx.subgraph_rewriter.replace_pattern``.

Three simple rules (``relu(relu(x)) -> relu(x)``, ``x * 1 -> x``, ``sigmoid(x) * x -> silu(x)``)
run to a fixpoint on flat aten graphs of N nodes (a chain of 6-node blocks, each holding one site
of every rule). purefx: ``rewrite(p, rules)`` on the IR (rules traced and checked before the
clock starts). fx: the same graph as a ``GraphModule``; patterns traced with ``make_fx`` (aten
level, as export's graphs are); ``replace_pattern`` looped per rule until it finds nothing, and
the rules looped until none matches. Both in this process; both results are checked to hold the
same operators. Prints times, the ratio fx / purefx, and each side's log-log slope.

    python -m bench.rewrite                 # N = 1k, 10k, 100k (fx skipped past --fx-max)
    python -m bench.rewrite --sizes 1000    # the smoke size
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter

import torch
import torch.fx
from pyrsistent import pmap

from ir.args import ref
from ir.graph import Graph
from ir.module import Module
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node
from ir.program import Program
from ir.signature import USER_INPUT, USER_OUTPUT, ExportSignature, InputSpec, OutputSpec
from transforms.rewrite import Rule, rewrite

aten = torch.ops.aten
BLOCK = 6  # nodes per block


def rules() -> list[Rule]:
    """The three rules, trusted (the bench times matching, not ``check_rule``)."""
    x = (torch.randn(4, 4),)
    return [
        Rule(lambda a: torch.relu(torch.relu(a)), torch.relu, x, name="relu_relu", trusted=True),
        Rule(lambda a: a * 1, lambda a: a, x, name="times_one", trusted=True),
        Rule(lambda a: torch.sigmoid(a) * a, torch.nn.functional.silu, x, name="silu",
             trusted=True),
    ]


def _block_ops(i: int, prev: str) -> list[tuple[str, object, tuple]]:
    """One block: relu, relu, *1, sigmoid, mul, add to the previous value."""
    return [
        (f"r{i}", aten.relu.default, (prev,)),
        (f"s{i}", aten.relu.default, (f"r{i}",)),
        (f"o{i}", aten.mul.Tensor, (f"s{i}", 1)),
        (f"g{i}", aten.sigmoid.default, (f"o{i}",)),
        (f"m{i}", aten.mul.Tensor, (f"g{i}", f"o{i}")),
        (f"a{i}", aten.add.Tensor, (f"m{i}", prev)),
    ]


def purefx_program(n: int) -> Program:
    """A flat Program of about ``n`` nodes."""
    nodes = [Node(PLACEHOLDER, "x", "x")]
    prev = "x"
    for i in range(max(1, n // BLOCK)):
        for name, target, args in _block_ops(i, prev):
            frozen = tuple(ref(a) if isinstance(a, str) else a for a in args)
            nodes.append(Node(CALL_FUNCTION, name, target, frozen))
        prev = f"a{i}"
    nodes.append(Node(OUTPUT, "output", "output", ((ref(prev),),)))
    sig = ExportSignature((InputSpec(USER_INPUT, "x"),), (OutputSpec(USER_OUTPUT, prev),))
    return Program(root="", modules=pmap({"": Module(graphs=(Graph.of(nodes),))}), signature=sig)


def fx_module(n: int) -> torch.fx.GraphModule:
    """The same graph as an fx ``GraphModule``."""
    g = torch.fx.Graph()
    env = {"x": g.placeholder("x")}
    prev = "x"
    for i in range(max(1, n // BLOCK)):
        for name, target, args in _block_ops(i, prev):
            env[name] = g.call_function(target, tuple(env[a] if isinstance(a, str) else a
                                                      for a in args))
        prev = f"a{i}"
    g.output(env[prev])
    return torch.fx.GraphModule(torch.nn.Module(), g)


def fx_patterns() -> list[tuple[torch.fx.GraphModule, torch.fx.GraphModule]]:
    """The rules' (pattern, replacement) pairs traced with ``make_fx``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 4)
    pairs = [
        (lambda a: torch.relu(torch.relu(a)), lambda a: torch.relu(a)),
        (lambda a: a * 1, lambda a: a + 0),  # make_fx cannot trace an identity function
        (lambda a: torch.sigmoid(a) * a, lambda a: torch.nn.functional.silu(a)),
    ]
    return [(make_fx(p)(x), make_fx(r)(x)) for p, r in pairs]


def run_fx(gm: torch.fx.GraphModule, patterns) -> None:
    """``replace_pattern`` per rule until nothing matches, rules until none matches."""
    from torch.fx.subgraph_rewriter import replace_pattern

    changed = True
    while changed:
        changed = False
        for pat, rep in patterns:
            while replace_pattern(gm, pat, rep):
                changed = True


def op_counts(p: Program) -> Counter:
    """How many calls of each operator the root graph holds."""
    return Counter(str(n.target) for n in p.root_module.graph.nodes if n.op == CALL_FUNCTION)


def fx_op_counts(gm: torch.fx.GraphModule) -> Counter:
    """How many calls of each operator an fx graph holds."""
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def loglog_slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log t against log N."""
    pts = [(math.log(n), math.log(t)) for n, t in points if t > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / var if var else None


def measure(sizes: list[int], fx_max: int, repeat: int = 3, out=sys.stdout) -> list[dict]:
    """Time both sides at each size; print a table; return the rows."""
    rs = rules()
    warm = purefx_program(60)
    rewrite(warm, rs)  # trace the rules once, outside the clock
    patterns = fx_patterns()
    rows = []
    print(f"{'N':>8} {'purefx s':>10} {'fx s':>10} {'fx/purefx':>10}", file=out)
    for n in sizes:
        p = purefx_program(n)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            q = rewrite(p, rs)
            times.append(time.perf_counter() - t0)
        ours = min(times)
        theirs = None
        if n <= fx_max:
            gm = fx_module(n)
            t0 = time.perf_counter()
            run_fx(gm, patterns)
            theirs = time.perf_counter() - t0
            want = fx_op_counts(gm)
            want.pop("aten.add.Tensor", None)  # fx's identity stand-in adds `+ 0` per site
            got = op_counts(q)
            got.pop("aten.add.Tensor", None)
            if got != want:
                raise SystemExit(f"N={n}: results differ: purefx {got}, fx {want}")
        ratio = f"{theirs / ours:10.2f}" if theirs else f"{'-':>10}"
        fx_text = f"{theirs:10.3f}" if theirs else f"{'skipped':>10}"
        print(f"{n:>8} {ours:10.3f} {fx_text} {ratio}", file=out)
        rows.append({"n": n, "purefx_s": ours, "fx_s": theirs})
    ours_slope = loglog_slope([(r["n"], r["purefx_s"]) for r in rows])
    fx_slope = loglog_slope([(r["n"], r["fx_s"]) for r in rows if r["fx_s"]])
    if ours_slope is not None:
        print(f"purefx log-log slope: {ours_slope:.2f}", file=out)
    if fx_slope is not None:
        print(f"fx log-log slope: {fx_slope:.2f}", file=out)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--fx-max", type=int, default=10000,
                        help="largest N to run fx's replace_pattern on (it is slow)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    measure(sizes, args.fx_max, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
