"""Bench: ``saturate`` (equality saturation + extraction) against greedy ``rewrite`` and an
exhaustive search, on small programs where the order or the choice of rewrites matters.

Suite (25 programs): matrix chains of 3, 4 and 5 at several shapes, chains of transposed
operands, two matmuls sharing an input (factored by ``mm_left``, a rule of one result, and
fused into one matmul of the concatenated weights by ``shared_mm``, a rule of two results:
cheaper where ``x`` is read twice, dearer where the weights are large, and once only after an
association), distributivity, an enabling step (a scale moved so a fusion matches) and
attention whose scale must move onto the scores before it fuses. Rules
are trusted (the tests check them and the extracted programs); two-way rules are
``both_ways=True``. Costs: ``transforms.rewrite.cost.roofline`` (µs).

- ``greedy``: ``apply_rules(p, forward rules)`` (what a user ships without the reverse);
- ``saturate``: ``saturate_report`` (default limits);
- ``exhaustive``: breadth-first over every single-site application of every rule in either
  direction (the greedy engine pinned to one anchor node at a time), programs deduplicated by
  alpha key, until nothing new (capped at ``--states`` programs): the cheapest reached.

Then attention in transformers models (``model_suite``: tiny GPT-2 and BERT, eager attention,
``move_scale`` both ways and the shipped ``ATTENTION`` set), the same three searches.

Each extracted program is checked against the original on random inputs
(``check_extracted``). Then a scaling run: programs of N nodes (blocks of
``relu((h @ a) @ b) * 0.5 + h``), time of ``saturate`` against N and the log-log slope; and two
sizes of blocks ``(h @ a) @ b * h + (h @ a) @ b * x``, where ``assoc`` and ``factor`` both ways
never saturate and the limits stop the search.

    python -m bench.search                    # the suite and N = 100 .. 10k
    python -m bench.search --cases 2 --sizes 100 --states 50   # the smoke size
    python -m bench.search --bound 20 8 3    # the whole call's time against limits.seconds
    python -m bench.search --lowered          # each result lowered and timed against its input
    python -m bench.search --blocks 1000 5000 10000 15000   # many blocks reach one block's best
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from bench.threads import one_thread
from ir import import_ep
from ir.alpha import graph_key
from ir.errors import PassError
from ir.node import CALL_FUNCTION
from transforms.rewrite import Rule, SaturationLimits, saturate_report
from transforms.rewrite.check_context import check_extracted
from transforms.rewrite.cost import program_cost
from transforms.rewrite.engine import apply_rules
from transforms.rewrite.ruleset import reverse_of

R = frozenset({"reassociate"})
M3 = (torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 6))
E3 = (torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5))
S3 = (torch.randn(3, 4), torch.randn(4, 5), 0.5)


def _rule(pattern, replacement, example, name, **kw) -> Rule:
    return Rule(pattern, replacement, example, name=name, trusted=True, specials=False,
                assumes=R, **kw)


def _pair(x, w1, w2):
    return x @ w1, x @ w2


def _fused_pair(x, w1, w2):
    a, b = (x @ torch.cat([w1, w2], dim=-1)).split([w1.shape[-1], w2.shape[-1]], dim=-1)
    return a, b


def rules() -> dict[str, Rule]:
    """The rules of the suite, by name."""
    return {
        "assoc": _rule(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), M3, "assoc",
                       both_ways=True),
        "factor": _rule(lambda a, b, c: a * b + a * c, lambda a, b, c: a * (b + c), E3,
                        "factor", both_ways=True),
        "mm_left": _rule(lambda a, b, c: a @ b + a @ c, lambda a, b, c: a @ (b + c),
                         (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 5)), "mm_left",
                         both_ways=True),
        "move_scale": _rule(lambda a, b, s: (a @ b) * s, lambda a, b, s: (a * s) @ b, S3,
                            "move_scale", both_ways=True),
        "fuse": _rule(lambda a, b, c: a @ b + c, lambda a, b, c: torch.addmm(c, a, b),
                      (torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)), "fuse"),
        "shared_mm": _rule(_pair, _fused_pair,
                           (torch.randn(3, 4), torch.randn(4, 5), torch.randn(4, 6)),
                           "shared_mm"),
        "sdpa": _rule(
            lambda q, k, v, s: torch.softmax(q @ k.transpose(-2, -1) * s, dim=-1) @ v,
            lambda q, k, v, s: F.scaled_dot_product_attention(q, k, v, scale=s),
            (torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), 0.35),
            "sdpa"),
    }


class _Fn(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _chain(n: int) -> Callable:
    def fn(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out @ x
        return out
    return fn


def suite() -> list[tuple[str, Callable, tuple, tuple[str, ...]]]:
    """``(name, function, argument shapes, rule names)`` of each program."""
    def tr(a, b, c):
        return (a.t() @ b.t()) @ c.t()

    def shared(x, w1, w2):
        return x @ w1 + x @ w2

    def heads(x, w1, w2):
        return torch.relu(x @ w1) + torch.sigmoid(x @ w2)

    def heads_chain(x, w1, w2, v):
        return torch.relu((x @ w1) @ v) + torch.sigmoid(x @ w2)

    def dist(a, b, c):
        return a * b + a * c

    def enabling(a, b, c):
        return (a @ b) * 0.125 + c

    def attention(q, k, v):
        return torch.softmax((q * 0.125) @ k.transpose(-2, -1), dim=-1) @ v

    c3 = [
        [(1024, 1024), (1024, 8), (8, 1024)], [(1024, 1024), (1024, 1024), (1024, 8)],
        [(8, 1024), (1024, 1024), (1024, 1024)], [(2048, 16), (16, 2048), (2048, 16)],
        [(16, 2048), (2048, 16), (16, 2048)], [(512, 512), (512, 64), (64, 4096)],
    ]
    c4 = [
        [(512, 8), (8, 2048), (2048, 8), (8, 512)],
        [(1024, 1024), (1024, 1024), (1024, 1024), (1024, 4)],
        [(4, 1024), (1024, 1024), (1024, 1024), (1024, 1024)],
        [(256, 2048), (2048, 8), (8, 2048), (2048, 256)],
    ]
    c5 = [
        [(1024, 16), (16, 1024), (1024, 16), (16, 1024), (1024, 16)],
        [(64, 1024), (1024, 1024), (1024, 16), (16, 1024), (1024, 64)],
    ]
    cases: list[tuple[str, Callable, tuple, tuple[str, ...]]] = []
    for i, s in enumerate(c3):
        cases.append((f"chain3_{i}", _chain(3), tuple(s), ("assoc",)))
    for i, s in enumerate(c4):
        cases.append((f"chain4_{i}", _chain(4), tuple(s), ("assoc",)))
    for i, s in enumerate(c5):
        cases.append((f"chain5_{i}", _chain(5), tuple(s), ("assoc",)))
    cases += [
        ("transposed_0", tr, ((1024, 1024), (8, 1024), (1024, 8)), ("assoc",)),
        ("transposed_1", tr, ((1024, 1024), (1024, 1024), (8, 1024)), ("assoc",)),
        ("shared_input_0", shared, ((1024, 1024), (1024, 1024), (1024, 1024)), ("mm_left",)),
        ("shared_input_1", shared, ((4096, 512), (512, 512), (512, 512)), ("mm_left",)),
        ("shared_heads_0", heads, ((4096, 512), (512, 64), (512, 64)), ("shared_mm",)),
        ("shared_heads_1", heads, ((64, 4096), (4096, 4096), (4096, 4096)), ("shared_mm",)),
        ("shared_heads_2", heads_chain, ((4096, 512), (512, 512), (512, 64), (512, 64)),
         ("shared_mm", "assoc")),
        ("distributive_0", dist, ((1024, 1024),) * 3, ("factor",)),
        ("distributive_1", dist, ((64, 4096),) * 3, ("factor",)),
        ("enabling_0", enabling, ((256, 16), (16, 256), (256, 256)), ("move_scale", "fuse")),
        ("enabling_1", enabling, ((1024, 64), (64, 1024), (1024, 1024)),
         ("move_scale", "fuse")),
        ("attention_0", attention, ((2, 4, 64, 32),) * 3, ("move_scale", "sdpa")),
        ("attention_1", attention, ((1, 12, 128, 64),) * 3, ("move_scale", "sdpa")),
    ]
    return cases


# --- the exhaustive search ---------------------------------------------------------------------


@attrs.define
class _Pin:
    anchor: str | None = None
    left: int = 0


def _pinned(rule: Rule, pin: _Pin, anchor: str) -> Rule:
    """``rule`` taken at the node ``pin.anchor`` only, once."""
    where = rule.where

    def at(m: Any) -> bool:
        node = m.nodes.get(anchor)
        if node is None or node.name != pin.anchor or pin.left <= 0:
            return False
        if where is not None and not where(m):
            return False
        pin.left -= 1
        return True

    return attrs.evolve(rule, where=at, trusted=True, both_ways=False)


def exhaustive(p: Any, chosen: list[Rule], max_states: int, seconds: float,
               frozen_state: bool = False) -> tuple[float, int]:
    """The least cost over programs reached by single-site rule applications (either
    direction of a ``both_ways`` rule), breadth first; and the number of programs seen.
    ``frozen_state``: each program costed as once its values computed from state alone are
    folded (``program_cost(..., frozen_state=True)``), as ``saturate`` costs them then."""
    directed = []
    for r in chosen:
        directed.append(r)
        if r.both_ways:
            directed.append(reverse_of(r))
    level_rules = []
    for r in directed:
        pin = _Pin()
        anchor = r.compiled("training").pattern.anchor
        level_rules.append((_pinned(r, pin, anchor.name), pin, anchor.target))
    seen = {graph_key(p.root_module.graph)}
    frontier = [p]
    best = program_cost(p, frozen_state=frozen_state)
    deadline = time.monotonic() + seconds
    while frontier and len(seen) < max_states and time.monotonic() < deadline:
        nxt = []
        for state in frontier:
            for rule, pin, target in level_rules:
                for n in state.root_module.graph.nodes:
                    if n.op != CALL_FUNCTION or n.target is not target:
                        continue
                    pin.anchor, pin.left = n.name, 1
                    try:
                        q, _ = apply_rules(state, [rule], fixpoint=False)
                    except PassError:
                        continue
                    if q is state:
                        continue
                    key = graph_key(q.root_module.graph)
                    if key in seen:
                        continue
                    seen.add(key)
                    best = min(best, program_cost(q, frozen_state=frozen_state))
                    nxt.append(q)
        frontier = nxt
    return best, len(seen)


def _chosen(report: Any) -> str:
    """The table's ``chosen``: ``report.chosen``, ``(ilp)`` after it where the exact
    extraction's choice was kept (scipy installed and strictly cheaper than greedy's)."""
    return report.chosen + (" (ilp)" if report.extractor == "ilp" else "")


# --- the suite -----------------------------------------------------------------------------------


def run_suite(n_cases: int | None, max_states: int, out: Any = sys.stdout) -> list[dict]:
    """Run the suite (its first ``n_cases``); print a table; return the rows."""
    table = rules()
    rows = []
    print("| program | nodes | original | greedy | saturate | exhaustive | sat s | exh s "
          "| states | chosen |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for name, fn, shapes, names in suite()[:n_cases]:
        args = tuple(torch.rand(*s) for s in shapes)  # positive: no cancellation to amplify
        p = import_ep(torch.export.export(_Fn(fn), args))
        chosen = [table[k] for k in names]
        t0 = time.perf_counter()
        q, report = saturate_report(p, chosen, assume=R)
        t_sat = time.perf_counter() - t0
        check_extracted(p, q, args, R, where=name)
        try:
            g, _ = apply_rules(p, chosen)
            greedy: float | str = program_cost(g)
        except PassError:
            greedy = "cycle"
        t0 = time.perf_counter()
        best, states = exhaustive(p, chosen, max_states, seconds=120.0)
        t_exh = time.perf_counter() - t0
        row = {"name": name, "nodes": len(p.root_module.graph.nodes),
               "before": report.cost_before, "greedy": greedy, "sat": report.cost_after,
               "exh": best, "t_sat": t_sat, "t_exh": t_exh, "states": states,
               "chosen": report.chosen}
        rows.append(row)
        shown = greedy if isinstance(greedy, str) else f"{greedy:.1f}"
        print(f"| {name} | {row['nodes']} | {row['before']:.1f} | {shown} | {row['sat']:.1f} "
              f"| {best:.1f} | {t_sat:.2f} | {t_exh:.2f} | {states} | {_chosen(report)} |",
              file=out, flush=True)
    equal = sum(1 for r in rows if r["sat"] <= r["exh"] * (1 + 1e-9))
    within = sum(1 for r in rows if r["sat"] <= r["exh"] * 1.05)
    better = sum(1 for r in rows if r["greedy"] == "cycle"
                 or r["sat"] < r["greedy"] * (1 - 1e-9))
    worse = sum(1 for r in rows if r["greedy"] != "cycle"
                and r["sat"] > r["greedy"] * (1 + 1e-9))
    print(f"\nsaturate = exhaustive on {equal}/{len(rows)}, within 5 % on {within}/{len(rows)}; "
          f"better than greedy (or greedy cycles) on {better}/{len(rows)}, worse on {worse}",
          file=out)
    return rows


# --- attention in transformers models --------------------------------------------------------------


def _transformers_model(kind: str, layers: int) -> tuple[torch.nn.Module, tuple]:
    import transformers

    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=layers,
                                      n_head=2, use_cache=False, attn_implementation="eager")
        model = transformers.GPT2Model(cfg)
    else:
        cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=layers, num_attention_heads=2,
                                      max_position_embeddings=32, attn_implementation="eager")
        model = transformers.BertModel(cfg)
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    return model.eval(), (ids,)


def model_suite() -> list[tuple[str, str, int]]:
    """``(name, model kind, layers)`` of the transformers programs: eager attention whose scale
    multiplies ``q @ kᵀ`` (GPT-2, BERT), searched with ``move_scale`` both ways and the shipped
    ``ATTENTION`` set. Greedy moves the scale onto ``q`` first (graph order), so only the
    unscaled rule fuses, leaving the ``q * s`` multiply over."""
    return [("gpt2_1layer", "gpt2", 1), ("gpt2_2layers", "gpt2", 2),
            ("bert_2layers", "bert", 2)]


def model_rules() -> list[Rule]:
    """``move_scale`` (both ways) and the ``ATTENTION`` set, trusted here (its own tests check
    it) so that the bench times the search, not ``check_rule``."""
    from transforms.rewrite.rules import ATTENTION

    return [rules()["move_scale"], *(attrs.evolve(r, trusted=True) for r in ATTENTION)]


def run_models(n_cases: int | None, max_states: int, out: Any = sys.stdout,
               seconds: float = 120.0) -> list[dict]:
    """Run the transformers programs (the first ``n_cases``) as ``run_suite`` runs its own:
    saturate, greedy (forward rules) and the exhaustive search (capped at ``seconds``); each
    extracted program checked against the original. Prints a table; returns the rows."""
    from transforms.rewrite.rules import ATTENTION_ASSUMES

    granted = R | ATTENTION_ASSUMES
    chosen = model_rules()
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    rows = []
    print("\n| program | nodes | original | greedy | saturate | exhaustive | sat s | exh s "
          "| states | chosen | fused (greedy / saturate) |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    for name, kind, layers in model_suite()[:n_cases]:
        model, args = _transformers_model(kind, layers)
        p = import_ep(torch.export.export(model, args))
        t0 = time.perf_counter()
        q, report = saturate_report(p, chosen, assume=granted)
        t_sat = time.perf_counter() - t0
        check_extracted(p, q, args, granted, where=name)
        g, _ = apply_rules(p, chosen)
        greedy = program_cost(g)
        t0 = time.perf_counter()
        best, states = exhaustive(p, chosen, max_states, seconds=seconds)
        t_exh = time.perf_counter() - t0

        def fused(prog: Any) -> int:
            return sum(1 for n in prog.root_module.graph.nodes if n.target == sdpa)

        row = {"name": name, "nodes": len(p.root_module.graph.nodes),
               "before": report.cost_before, "greedy": greedy, "sat": report.cost_after,
               "exh": best, "t_sat": t_sat, "t_exh": t_exh, "states": states,
               "chosen": report.chosen, "fused": (fused(g), fused(q)), "layers": layers,
               "sizes": report.sizes[0], "classes": report.classes[0]}
        rows.append(row)
        print(f"| {name} | {row['nodes']} | {row['before']:.1f} | {greedy:.1f} | "
              f"{row['sat']:.1f} | {best:.1f} | {t_sat:.2f} | {t_exh:.2f} | {states} | "
              f"{_chosen(report)} | {fused(g)} / {fused(q)} of {layers} |", file=out, flush=True)
    return rows


def growth_pictures(folder: str) -> list[str]:
    """Write the e-graph growth charts of docs/search.md's two walk-throughs (the matrix chain
    ``chain3_1`` and ``gpt2_1layer``) as ``.svg`` files in ``folder``; returns their paths."""
    import os

    from lowering.plot import line_chart
    from transforms.rewrite.rules import ATTENTION_ASSUMES

    shapes = ((1024, 1024), (1024, 1024), (1024, 8))
    chain = import_ep(torch.export.export(_Fn(_chain(3)), tuple(torch.rand(*s) for s in shapes)))
    _, chain_report = saturate_report(chain, [rules()["assoc"]], assume=R)
    model, args = _transformers_model("gpt2", 1)
    gpt2 = import_ep(torch.export.export(model, args))
    _, gpt2_report = saturate_report(gpt2, model_rules(), assume=R | ATTENTION_ASSUMES)
    os.makedirs(folder, exist_ok=True)
    paths = []
    for name, report in (("chain", chain_report), ("gpt2", gpt2_report)):
        svg = line_chart({"e-nodes": list(report.sizes[0]), "e-classes": list(report.classes[0])},
                         x_label="round (0: the e-graph as built)", y_label="count",
                         title=f"{name}: the e-graph's growth per round", standalone=True,
                         zero=False)
        path = os.path.join(folder, f"search-{name}-growth.svg")
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg + "\n")
        paths.append(path)
    return paths


# --- conv + batch norm: one rule with hyperparameter holes --------------------------------------


def conv_bn_suite() -> list[tuple[str, Callable[[], torch.nn.Module], tuple[int, ...], bool]]:
    """``(name, model factory, input shape, exhaustive?)`` of the conv + batch-norm programs:
    single pairs at other strides, paddings, dilations, groups and without bias, the small CNN
    (4 pairs) and transformers' ``ResNetModel`` (16 pairs, residual adds in place; too many
    subsets for the exhaustive search, which is skipped there). One rule, ``CONV_BN``."""
    from bench.conv_models import CNN, conv_bn, randomize_bn, resnet_model

    def cnn() -> torch.nn.Module:
        m = CNN().eval()
        randomize_bn(m)
        return m

    cases: list[tuple[str, Callable[[], torch.nn.Module], tuple[int, ...], bool]] = [
        ("conv_bn_stride2_nobias",
         lambda: conv_bn(stride=2, padding=1, bias=False), (2, 4, 9, 9), True),
        ("conv_bn_dilated_grouped",
         lambda: conv_bn(padding=2, dilation=2, groups=2), (2, 4, 9, 9), True),
        ("conv_bn_nonsquare", lambda: conv_bn(stride=(1, 2), padding=(0, 1)), (2, 4, 9, 9), True),
        ("cnn_4_pairs", cnn, (2, 3, 16, 16), True),
    ]
    try:
        import transformers  # noqa: F401 - optional
    except ImportError:
        return cases
    return [*cases, ("resnet_16_pairs", resnet_model, (2, 3, 32, 32), False)]


def run_conv_bn(max_states: int, out: Any = sys.stdout, n_cases: int | None = None) -> list[dict]:
    """``saturate`` with the one ``CONV_BN`` rule on ``conv_bn_suite()`` (its first
    ``n_cases``), against greedy
    ``rewrite`` and the exhaustive search; each result checked against the original
    (``check_extracted``); prints a table like ``run_suite``'s and returns the rows. State is
    frozen (``frozen_state=True``: the folded weights become constants; greedy's program and
    the exhaustive search's costed as folded), the setting a conv + batch-norm fold is for;
    charged, folding by hand at every call costs more and every program is kept
    (``run_lowered``)."""
    from bench.conv_models import batch_norms, program
    from transforms.rewrite_rules import CONV_BN

    rule = attrs.evolve(CONV_BN, trusted=True)
    rows = []
    print("\n| program | nodes | pairs | original | greedy | saturate | exhaustive | sat s "
          "| saturate rewrites | chosen |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for name, make, shape, exh in conv_bn_suite()[:n_cases]:
        x = torch.randn(*shape)
        p = program(make(), x)
        t0 = time.perf_counter()
        q, report = saturate_report(p, [rule], assume=rule.assumes, frozen_state=True)
        t_sat = time.perf_counter() - t0
        check_extracted(p, q, (x,), where=name)
        g, _ = apply_rules(p, [rule])
        greedy = program_cost(g, frozen_state=True)
        best: float | None = exhaustive(
            p, [rule], max_states, seconds=120.0, frozen_state=True)[0] if exh else None
        row = {"name": name, "nodes": len(p.root_module.graph.nodes), "before": report.cost_before,
               "greedy": greedy, "sat": report.cost_after, "exh": best, "t_sat": t_sat,
               "chosen": report.chosen, "pairs": batch_norms(p),
               "left": batch_norms(q), "egraph": report.rewrites.get(rule.name, 0)}
        rows.append(row)
        shown = "-" if best is None else f"{best:.1f}"
        print(f"| {name} | {row['nodes']} | {row['pairs']} | {row['before']:.1f} | {greedy:.1f} "
              f"| {row['sat']:.1f} | {shown} | {t_sat:.2f} | {row['egraph']} | {_chosen(report)} |",
              file=out, flush=True)
    ran = [r for r in rows if r["exh"] is not None]
    equal = sum(1 for r in ran if r["sat"] <= r["exh"] * (1 + 1e-9))
    same = sum(1 for r in rows if abs(r["sat"] - r["greedy"]) <= 1e-9 * r["greedy"])
    print(f"\nconv_bn: saturate = exhaustive on {equal}/{len(ran)} (where it ran); = greedy on "
          f"{same}/{len(rows)}; pairs folded {sum(r['pairs'] - r['left'] for r in rows)}/"
          f"{sum(r['pairs'] for r in rows)}", file=out)
    return rows


# --- scaling ---------------------------------------------------------------------------------------


class _Big(torch.nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.w1 = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(32, 4)) for _ in range(blocks)])
        self.w2 = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(4, 32)) for _ in range(blocks)])

    def forward(self, x):
        h = x
        for a, b in zip(self.w1, self.w2):
            h = torch.relu((h @ a) @ b) * 0.5 + h
        return h


class _Explosive(_Big):
    """Blocks on which ``assoc`` and ``factor`` both ways never saturate: the limits decide."""

    def forward(self, x):
        h = x
        for a, b in zip(self.w1, self.w2):
            h = (h @ a) @ b * h + (h @ a) @ b * x
        return h


def run_scaling(sizes: list[int], out: Any = sys.stdout,
                module: type = _Big) -> list[tuple[int, float]]:
    """``saturate`` time against program size (nodes) on blocks of ``module``; prints the
    log-log slope."""
    table = rules()
    chosen = [table["assoc"], table["factor"]]
    points = []
    tiny = import_ep(torch.export.export(module(1), (torch.randn(32, 32),)))
    saturate_report(tiny, chosen, assume=R)  # warm: the rules traced before the clock
    print("\n| nodes | e-nodes | rounds | stopped | seconds | saturate+extract s | build s "
          "| greedy s | cost before | after |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for n in sizes:
        blocks = max(1, n // 6)
        p = import_ep(torch.export.export(module(blocks), (torch.randn(32, 32),)))
        nodes = len(p.root_module.graph.nodes)
        t0 = time.perf_counter()
        _, report = saturate_report(p, chosen, assume=R, limits=SaturationLimits())
        dt = time.perf_counter() - t0
        points.append((nodes, dt))
        t = report.seconds
        print(f"| {nodes} | {report.sizes[0][-1]} | {len(report.sizes[0]) - 1} | "
              f"{report.stopped[0]} | {dt:.2f} | {t['saturate'] + t['extract']:.2f} | "
              f"{t['build']:.2f} | {t['greedy']:.2f} | {report.cost_before:.0f} | "
              f"{report.cost_after:.0f} |", file=out, flush=True)
    if len(points) > 1:
        xs = [math.log(a) for a, _ in points]
        ys = [math.log(b) for _, b in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        print(f"\nlog-log slope of seconds against nodes: {slope:.2f}", file=out)
    return points


def run_bound(limits: list[float], nodes: int = 10000, out: Any = sys.stdout,
              module: type = _Explosive) -> list[tuple[float, float]]:
    """The whole ``saturate_report`` call's wall time against ``limits.seconds`` (each of
    ``limits``) on one program of about ``nodes`` nodes of ``module`` blocks: the time per
    phase, whether greedy ``rewrite`` was cut, which program was kept and its cost."""
    table = rules()
    chosen = [table["assoc"], table["factor"]]
    tiny = import_ep(torch.export.export(module(1), (torch.randn(32, 32),)))
    saturate_report(tiny, chosen, assume=R)  # warm: the rules traced before the clock
    p = import_ep(torch.export.export(module(max(1, nodes // 6)), (torch.randn(32, 32),)))
    print(f"\n{len(p.root_module.graph.nodes)} nodes\n\n| seconds | total s | greedy s | "
          "greedy cut | saturate + extract s | build s | stopped | chosen | cost before "
          "| after |\n|---|---|---|---|---|---|---|---|---|---|", file=out)
    points = []
    for s in limits:
        t0 = time.perf_counter()
        _, report = saturate_report(p, chosen, assume=R, limits=SaturationLimits(seconds=s))
        dt = time.perf_counter() - t0
        points.append((s, dt))
        t = report.seconds
        print(f"| {s:g} | {dt:.2f} | {t['greedy']:.2f} | {report.greedy_cut is not None} | "
              f"{t['saturate'] + t['extract']:.2f} | {t['build']:.2f} | "
              f"{'; '.join(report.stopped)} | {report.chosen} | {report.cost_before:.0f} | "
              f"{report.cost_after:.0f} |", file=out, flush=True)
    return points


# --- costs that come true: each result lowered and timed against its input ------------------------


class _Lora(torch.nn.Module):
    """A merged LoRA, ``x @ (W + A @ B)``: ``W + A @ B`` is computed from state alone."""

    def __init__(self, d: int = 1024, r: int = 16) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(d, d) / d ** 0.5)
        self.a = torch.nn.Parameter(torch.randn(d, r) / d ** 0.5)
        self.b = torch.nn.Parameter(torch.randn(r, d) / r ** 0.5)

    def forward(self, x):
        return x @ (self.w + self.a @ self.b)


def lora_rule() -> Rule:
    """``x @ (w + a @ b) <-> x @ w + (x @ a) @ b`` (both ways)."""
    return _rule(lambda x, w, a, b: x @ (w + a @ b), lambda x, w, a, b: x @ w + (x @ a) @ b,
                 (torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 2), torch.randn(2, 8)),
                 "lora_split", both_ways=True)


def _two_conv_cnn() -> torch.nn.Module:
    from bench.conv_models import randomize_bn

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
    randomize_bn(m)
    return m.eval()


def lowered_suite(n_cases: int | None = None) -> list[tuple[str, Callable, list[Rule]]]:
    """``(name, make (module, inputs), rules)`` of the programs ``run_lowered`` times: the
    suite's (its first ``n_cases``), a merged LoRA (4 rows), a two-conv CNN with batch norms
    (``CONV_BN``) and the small CNN of four pairs."""
    from bench.conv_models import CNN, randomize_bn
    from transforms.rewrite_rules import CONV_BN

    table = rules()
    conv_bn = attrs.evolve(CONV_BN, trusted=True)
    out: list[tuple[str, Callable, list[Rule]]] = []
    for name, fn, shapes, names in suite()[:n_cases]:
        def make(fn=fn, shapes=shapes):
            torch.manual_seed(0)
            return _Fn(fn), tuple(torch.rand(*s) for s in shapes)
        out.append((name, make, [table[k] for k in names]))

    def cnn4():
        m = CNN().eval()
        randomize_bn(m)
        return m, (torch.randn(2, 3, 16, 16),)

    out += [
        ("lora_4rows", lambda: (_Lora(), (torch.randn(4, 1024),)), [lora_rule()]),
        ("cnn_2_convs_bn", lambda: (_two_conv_cnn(), (torch.randn(2, 3, 32, 32),)), [conv_bn]),
        ("cnn_4_pairs", cnn4, [conv_bn]),
    ]
    return out


def _best_us(fns: list[Callable], args: tuple, rounds: int = 15, calls: int = 5) -> list[float]:
    """The best time per call (µs) of each of ``fns`` on ``args``, interleaved: round after
    round each is run ``calls`` times, so that a load on the machine falls on all alike."""
    best = [math.inf] * len(fns)
    with torch.no_grad():
        for f in fns:
            f(*args)  # warm up
        for _ in range(rounds):
            for i, f in enumerate(fns):
                t0 = time.perf_counter()
                for _ in range(calls):
                    f(*args)
                best[i] = min(best[i], (time.perf_counter() - t0) / calls * 1e6)
    return best


def run_lowered(n_cases: int | None = None, out: Any = sys.stdout,
                tolerance: float = 1.10, rounds: int = 15) -> list[dict]:
    """Each program of ``lowered_suite`` searched with state charged (the default) and frozen
    (``frozen_state=True``); the input and each result lowered (``lowering.lower``) and timed
    in this process, one thread, interleaved (``_best_us``, ``rounds`` rounds; timed twice
    more where the result seems slower by more than ``tolerance``, the best ratio kept; a
    result that is ``p`` itself is the input, ratio 1). Prints the report's costs (µs,
    roofline) and the measured µs per call, and whether a result is slower than its input by
    more than ``tolerance`` (timing noise on a shared machine). Returns the rows."""
    from lowering import lower

    rows = []
    print("\n| program | state | chosen | cost before | cost after | input µs | result µs "
          "| result / input |\n|---|---|---|---|---|---|---|---|", file=out)
    with one_thread():
        for name, make, chosen in lowered_suite(n_cases):
            model, args = make()
            p = import_ep(torch.export.export(model, args))
            for frozen in (False, True):
                q, report = saturate_report(p, chosen, assume=R | _assumed(chosen),
                                            frozen_state=frozen)
                check_extracted(p, q, args, R | _assumed(chosen), where=name)
                if q is p:  # nothing cheaper: the input itself, nothing to time against
                    t_in = t_out = _best_us([lower(p)], args, rounds)[0]
                else:
                    t_in, t_out = _best_us([lower(p), lower(q)], args, rounds)
                    for _ in range(2):  # a load on a shared machine: timed again
                        if t_out / t_in <= tolerance:
                            break
                        again = _best_us([lower(p), lower(q)], args, rounds)
                        if again[1] / again[0] < t_out / t_in:
                            t_in, t_out = again
                row = {"name": name, "frozen": frozen, "chosen": report.chosen,
                       "before": report.cost_before, "after": report.cost_after,
                       "input_us": t_in, "result_us": t_out, "ratio": t_out / t_in}
                rows.append(row)
                print(f"| {name} | {'frozen' if frozen else 'charged'} | {report.chosen} | "
                      f"{report.cost_before:.1f} | {report.cost_after:.1f} | {t_in:.1f} | "
                      f"{t_out:.1f} | {t_out / t_in:.2f} |", file=out, flush=True)
    slower = [f"{r['name']} ({'frozen' if r['frozen'] else 'charged'})" for r in rows
              if r["ratio"] > tolerance]
    print(f"\nslower than the input by more than {tolerance:.2f}x: "
          f"{', '.join(slower) or 'none'} of {len(rows)}", file=out)
    return rows


def _assumed(chosen: list[Rule]) -> frozenset[str]:
    return frozenset().union(*(r.assumes for r in chosen))


# --- search that scales: many blocks reach what one block alone reaches -----------------------------


class _TrapBlocks(torch.nn.Module):
    """Blocks of 8 nodes, ``relu(((h @ a) @ b) * 0.5 + h) + x``: the scale moves onto the
    small ``h @ a`` (``move_scale``) before ``@ b + h`` fuses into an ``addmm`` (``fuse``), while
    ``assoc`` both ways offers ``h @ (a @ b)`` on the way (greedy takes the first rule that
    matches in graph order)."""

    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.a = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(32, 4)) for _ in range(blocks)])
        self.b = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(4, 32)) for _ in range(blocks)])

    def forward(self, x):
        h = x
        for a, b in zip(self.a, self.b):
            h = torch.relu(((h @ a) @ b) * 0.5 + h) + x
        return h


class _ChainBlocks(torch.nn.Module):
    """Blocks of 7 nodes, ``relu(((h @ a) @ b) @ c)`` of a 512 x 512 ``h`` and weights
    512 x 512, 512 x 8, 8 x 512: the association decides the cost (``assoc`` both ways)."""

    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.a = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(512, 512)) for _ in range(blocks)])
        self.b = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(512, 8)) for _ in range(blocks)])
        self.c = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(8, 512)) for _ in range(blocks)])

    def forward(self, x):
        h = x
        for a, b, c in zip(self.a, self.b, self.c):
            h = torch.relu(((h @ a) @ b) @ c)
        return h


def block_families() -> dict[str, tuple[type, int, tuple[int, ...], tuple[str, ...]]]:
    """``{name: (module, nodes per block, input shape, rule names)}`` of ``run_blocks``."""
    return {
        "trap": (_TrapBlocks, 8, (32, 32), ("assoc", "move_scale", "fuse")),
        "chain": (_ChainBlocks, 7, (512, 512), ("assoc",)),
    }


def run_blocks(sizes: list[int], families: tuple[str, ...] = ("trap", "chain"),
               out: Any = sys.stdout, limits: SaturationLimits | None = None) -> list[dict]:
    """Programs of about each of ``sizes`` nodes made of repeated blocks (``block_families``),
    searched with ``limits`` (default ``SaturationLimits()``); each cost against the blocks
    times the cost one block alone reaches (its own search, the same rules): ``reached`` where
    the whole program's is within 0.1 %. Prints a table; returns the rows."""
    table = rules()
    rows = []
    print("\n| family | nodes | blocks | e-nodes | rounds | stopped | seconds | chosen "
          "| cost before | after | blocks x one block | reached |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    for fam in families:
        module, per, shape, names = block_families()[fam]
        chosen = [table[k] for k in names]
        one = import_ep(torch.export.export(module(1), (torch.randn(*shape),)))
        _, alone = saturate_report(one, chosen, assume=R)  # also traces the rules
        for n in sizes:
            blocks = max(1, (n - 2) // per)
            p = import_ep(torch.export.export(module(blocks), (torch.randn(*shape),)))
            t0 = time.perf_counter()
            _, report = saturate_report(p, chosen, assume=R, limits=limits)
            dt = time.perf_counter() - t0
            want = blocks * alone.cost_after
            row = {"family": fam, "nodes": len(p.root_module.graph.nodes), "blocks": blocks,
                   "seconds": dt, "before": report.cost_before, "after": report.cost_after,
                   "want": want, "reached": report.cost_after <= want * 1.001,
                   "stopped": report.stopped[0], "chosen": report.chosen,
                   "sizes": report.sizes[0]}
            rows.append(row)
            print(f"| {fam} | {row['nodes']} | {blocks} | {report.sizes[0][-1]} | "
                  f"{len(report.sizes[0]) - 1} | {report.stopped[0]} | {dt:.1f} | "
                  f"{report.chosen} | {report.cost_before:.0f} | {report.cost_after:.0f} | "
                  f"{want:.0f} | {'yes' if row['reached'] else 'no'} |", file=out, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=None, help="run the first N programs")
    ap.add_argument("--states", type=int, default=2000, help="exhaustive search cap")
    ap.add_argument("--sizes", type=int, nargs="*", default=[100, 300, 1000, 3000, 10000])
    ap.add_argument("--models", type=int, default=None,
                    help="run the first N transformers programs (0: none)")
    ap.add_argument("--bound", type=float, nargs="*", metavar="SECONDS",
                    help="only time the whole call on the explosive 15k-node program at "
                         "these limits.seconds")
    ap.add_argument("--lowered", action="store_true",
                    help="only lower each search result and time it against its input")
    ap.add_argument("--blocks", type=int, nargs="*", metavar="NODES",
                    help="only the repeated-block programs at these sizes (nodes)")
    ap.add_argument("--pictures", metavar="DIR",
                    help="only write the walk-throughs' growth charts (docs/images) there")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)  # torch's pytree deprecation, per deepcopy
    if args.pictures:
        print("\n".join(growth_pictures(args.pictures)))
        return
    if args.bound:
        run_bound(args.bound)
        return
    if args.lowered:
        run_lowered(args.cases)
        return
    if args.blocks:
        run_blocks(args.blocks)
        return
    run_suite(args.cases, args.states)
    if args.models != 0:
        run_models(args.models, args.states)
    run_conv_bn(args.states)
    if args.sizes:
        run_scaling(args.sizes)
        print("\nexplosive rules (never saturate):", file=sys.stdout)
        run_scaling(args.sizes[:2], module=_Explosive)


if __name__ == "__main__":
    main()
