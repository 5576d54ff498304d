"""Bench: ``transforms.edit.rewrite_nodes`` against a plain torch.fx loop doing the same edit.

The edit: every ``relu`` becomes a ``gelu`` of the same argument (a new node with its fake
``val``, every use rewired, the old node dropped), on flat aten graphs of N nodes (the 6-node
blocks of ``bench.rewrite``, two ``relu`` each), every node with a fake ``val``.

- purefx: ``rewrite_nodes(p, visit)`` with ``visit`` returning ``e.call(aten.gelu, *e.args)``;
- fx: the same graph as a ``GraphModule``; one loop over ``graph.nodes`` that inserts
  ``gelu`` before each ``relu``, sets its ``meta["val"]`` by running it on the fake input (as
  purefx does), ``replace_all_uses_with`` and ``erase_node`` (in place: the copy a pure fx pass
  would need first is not timed), and, as a second column, the same loop without the ``val``.

Both in this process; both results are checked to hold the same operators. Prints the times,
the ratios and each side's log-log slope, then the lines of the seven passes of
``docs/passes.md`` (``docs/examples/passes``) written with ``transforms.edit`` and with plain
torch.fx (``docs/examples/passes_fx``).

    python -m bench.edit                  # N = 1k, 10k
    python -m bench.edit --sizes 1000     # the smoke size
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import time
import tokenize
from pathlib import Path
from types import MappingProxyType

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.rewrite import fx_module, fx_op_counts, loglog_slope, op_counts, purefx_program
from ir.graph import Graph
from ir.program import Program
from transforms.edit import rewrite_nodes

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[1]
PASSES = {
    "fake_quant": "weight-only fake quantization of linears with >= 1024 weights",
    "observe": "an abs-max observer buffer after every activation",
    "fold": "constant folding",
    "cse": "CSE + dead code elimination",
    "identities": "fold x * 1, x / 1, x + 0, x - 0",
    "powers": "pow(x, n) for whole n <= 4 as multiplications",
    "lora": "a zero-initialized LoRA adapter on every linear",
}


def code_lines(path: Path) -> int:
    """Lines of ``path`` that hold code: not blank, not only a comment, not a docstring."""
    src = Path(path).read_text()
    docs: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                first.value.value, str
            ):
                docs.update(range(first.lineno, first.end_lineno + 1))
    code: set[int] = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - docs)


def with_vals(p: Program, val: torch.Tensor) -> Program:
    """``p`` with ``val`` as every node's ``meta["val"]`` (all values of the chain are 4x4)."""
    graph = p.root_module.graph
    meta = MappingProxyType({"val": val})
    nodes = [n if n.op == "output" else n.replace(meta=meta) for n in graph.nodes]
    root = p.root_module.replace(graphs=(Graph.of(nodes),))
    return p.replace(modules=p.modules.set(p.root, root))


def relu_to_gelu(node, e):
    if node.target is aten.relu.default:
        return e.call(aten.gelu.default, *e.args)
    return None


def fx_relu_to_gelu(gm: torch.fx.GraphModule, mode: FakeTensorMode | None) -> None:
    g = gm.graph
    for n in list(g.nodes):
        if n.op == "call_function" and n.target is aten.relu.default:
            with g.inserting_before(n):
                new = g.call_function(aten.gelu.default, n.args, n.kwargs)
            new.meta = dict(n.meta)
            if mode is not None:
                with mode:
                    new.meta["val"] = aten.gelu.default(*(a.meta["val"] for a in n.args))
            n.replace_all_uses_with(new)
            g.erase_node(n)


def measure(sizes: list[int], repeat: int = 3, out=sys.stdout) -> list[dict]:
    mode = FakeTensorMode()
    with mode:
        val = torch.empty(4, 4)
    print(f"{'N':>8} {'purefx s':>9} {'fx s':>9} {'fx/purefx':>9} {'fx-noval s':>10} "
          f"{'fx-noval/purefx':>15}", file=out)
    rows = []
    for n in sizes:
        p = with_vals(purefx_program(n), val)
        ours = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            q = rewrite_nodes(p, relu_to_gelu)
            ours.append(time.perf_counter() - t0)
        theirs, noval = [], []
        for times, fake in ((theirs, mode), (noval, None)):
            for _ in range(repeat):
                gm = fx_module(n)
                for node in gm.graph.nodes:
                    node.meta["val"] = val
                t0 = time.perf_counter()
                fx_relu_to_gelu(gm, fake)
                times.append(time.perf_counter() - t0)
        got, want = op_counts(q), fx_op_counts(gm)
        if got != want or got.get("aten.relu.default") or not got.get("aten.gelu.default"):
            raise SystemExit(f"N={n}: results differ: purefx {got}, fx {want}")
        row = {"n": p.node_count(), "purefx_s": min(ours), "fx_s": min(theirs),
               "fx_noval_s": min(noval)}
        rows.append(row)
        print(f"{row['n']:>8} {row['purefx_s']:9.4f} {row['fx_s']:9.4f} "
              f"{row['fx_s'] / row['purefx_s']:9.2f} {row['fx_noval_s']:10.4f} "
              f"{row['fx_noval_s'] / row['purefx_s']:15.2f}", file=out)
    for key, label in (("purefx_s", "purefx"), ("fx_s", "fx"), ("fx_noval_s", "fx-noval")):
        slope = loglog_slope([(r["n"], r[key]) for r in rows])
        if slope is not None:
            print(f"{label} log-log slope: {slope:.2f}", file=out)
    return rows


def lines_table(out=sys.stdout) -> dict[str, tuple[int, int]]:
    """Code lines of each pass of ``docs/passes.md``, with ``transforms.edit`` and with fx."""
    found = {}
    print(f"{'pass':<64} {'purefx':>6} {'fx':>4}", file=out)
    for name, title in PASSES.items():
        ours = code_lines(ROOT / "docs/examples/passes" / f"{name}.py")
        theirs = code_lines(ROOT / "docs/examples/passes_fx" / f"{name}.py")
        found[name] = (ours, theirs)
        print(f"{title:<64} {ours:>6} {theirs:>4}", file=out)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    measure([int(s) for s in args.sizes.split(",") if s], args.repeat)
    print(file=sys.stdout)
    lines_table()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
