"""The opset in default ``programs()``: on, a bounded share of the steps, its rows drawn by how
many real models use them (``ir/strategies/model_ops.json``), and a symbolic batch as a
feature (``symbolic_sizes``): the laws then run the program at other batch sizes.

The 200-draw figures (at least 300 operators, 90 % of the models' operators, on the
derandomized stream and three seeds) are nightly here and printed by
``python -m bench.opset_coverage``; by default a sample of 40 draws. The rows' weights are
checked without drawing: over the swarm's feature sets each row is drawn within a factor of
its share by model use (nightly: every feature set; by default a sample of them).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import Phase, settings

from bench.opset_coverage import draw, figures
from ir.opset import table
from ir.strategies import FEATURES, OPT_IN_FEATURES, program_inputs, programs
from ir.strategies.coverage import FIXED_VOCABULARY
from ir.strategies.opset_steps import (
    MODEL_OPS,
    ROW_FEATURES,
    USE_SHARE,
    USED_SHARE,
    availability,
    model_use,
    opset_rows,
    pick_row,
    row_weights,
    scatter,
)
from lowering import lower
from lowering.pass_laws import LawViolation, check_laws, other_sizes
from transforms.edit import rewrite_nodes

RELU = torch.ops.aten.relu.default


def test_the_model_counts_name_rows_of_the_table():
    counts = json.loads(MODEL_OPS.read_text())
    assert len(counts) >= 80  # transformers, CNNs, the zoo's small models
    assert set(counts) <= set(table()), sorted(set(counts) - set(table()))
    assert all(c["models"] >= 1 and c["nodes"] >= c["models"] for c in counts.values())
    for op in ("aten.linear.default", "aten.view.default", "aten.softmax.int",
               "aten.layer_norm.default", "aten.embedding.default"):
        assert op in counts


def test_rows_are_drawn_by_their_weights_with_a_floor_for_every_row():
    on = frozenset({"opset"})
    rows = opset_rows(on, None)
    cumulative = row_weights(on, None)
    picks = [rows[pick_row(cumulative, scatter(i))][0].name for i in range(20_000)]
    use = model_use()
    weight = {e.name: (c - b) / cumulative[-1]
              for (e, _, _), b, c in zip(rows, (0.0, *cumulative), cumulative)}
    share = sum(1 for name in picks if name in use) / len(picks)
    expected = sum(w for name, w in weight.items() if name in use)
    assert abs(share - expected) < 0.02, (share, expected)
    assert len(set(picks)) == len(rows)  # a floor for every row: all of them are picked


def _swarm_marginals(sets: int) -> dict[str, float]:
    """Each row's chance to be drawn by an opset step, averaged over ``sets`` of the feature
    sets of the swarm (every subset of :data:`ROW_FEATURES` with the opset on, each equally
    likely, as ``programs()`` draws them; all of them for ``sets`` >= their number)."""
    flags = sorted(ROW_FEATURES - {"opset"})
    every = range(2 ** len(flags))
    chosen = every if sets >= len(every) else random.Random(0).sample(every, sets)
    marginal: dict[str, float] = {}
    for bits in chosen:
        on = frozenset({"opset", *(f for k, f in enumerate(flags) if bits >> k & 1)})
        cumulative = row_weights(on, None)
        for (e, _, _), b, c in zip(opset_rows(on, None), (0.0, *cumulative), cumulative):
            marginal[e.name] = marginal.get(e.name, 0.0) + (c - b) / cumulative[-1] / len(chosen)
    return marginal


def _target(name: str, reachable: list[str]) -> float:
    """A row's share by :data:`USE_SHARE`, :data:`USED_SHARE` and the floor, over every row
    some default program may draw."""
    use = model_use()
    total = sum(use.get(n, 0) for n in reachable)
    used = sum(1 for n in reachable if n in use)
    share = (1 - USE_SHARE - USED_SHARE) / len(reachable)
    if name in use:
        share += USE_SHARE * use[name] / total + USED_SHARE / used
    return share


def _check_drawn_by_use_over_the_swarm(sets: int, low: float, high: float) -> None:
    marginal = _swarm_marginals(sets)
    reachable = [name for name in table() if availability(name)]
    assert set(marginal) == set(reachable)  # every row some default program may draw
    # each row within a factor of its share: in proportion to model use, above a floor, and
    # a row only some programs may draw (a random row, an in-place variant, a row of one
    # level) as often as one every program may; undivided by its availability, a row that
    # one program in eight may draw was drawn a fifth as often as its share
    ratios = sorted((marginal[n] / _target(n, reachable), n) for n in reachable)
    assert low < ratios[0][0] and ratios[-1][0] < high, (ratios[:3], ratios[-3:])
    use = model_use()
    share = sum(p for name, p in marginal.items() if name in use)
    assert abs(share - sum(_target(n, reachable) for n in reachable if n in use)) < 0.05


def test_over_the_swarm_rows_are_drawn_by_model_use_whatever_features_they_need():
    _check_drawn_by_use_over_the_swarm(128, 0.4, 2.5)  # a sample: about one second


@pytest.mark.nightly
def test_over_every_feature_set_rows_are_drawn_within_a_factor_two_of_their_share():
    _check_drawn_by_use_over_the_swarm(1 << 16, 0.5, 2.0)  # exact: every feature set


FORTY_SEED = 1
"""The hypothesis seed of the 40-draw sample: at 40 draws the figures vary with the stream
(seeds 1 to 8: 109 to 157 operators, 62 to 74 of 105 models' operators, 1 to 19 symbolic
draws; the derandomized stream 133, 71 and 19), so the floors below sit under every one of
those streams, not at one stream's figures."""


def test_forty_default_draws_reach_the_opset_the_models_and_symbolic_sizes():
    drawn, _ = draw(40, FORTY_SEED)
    f = figures(drawn)
    assert f["operators"] >= 100, f  # a third of the 200-draw floor
    assert f["model_reached"] >= 0.55 * f["model_ops"], f
    assert f["symbolic"] >= 1, f
    opset_nodes = fixed_nodes = 0
    for p in drawn:
        for n in p.root_module.graph.nodes:
            if n.op == "call_function":
                fixed = str(n.target) in FIXED_VOCABULARY or n.target.__name__ == "getitem"
                fixed_nodes += fixed
                opset_nodes += not fixed
    assert fixed_nodes > opset_nodes  # the fixed vocabulary still makes most of the structure


@pytest.mark.nightly
@pytest.mark.parametrize("at", [None, 1, 2, 3])
def test_two_hundred_default_draws_reach_300_operators_and_90_percent_of_the_models(at):
    f = figures(draw(200, at)[0])
    assert f["operators"] >= 300, f
    assert f["model_reached"] >= 0.9 * f["model_ops"], f
    assert f["symbolic"] >= 10, f


def test_a_symbolic_program_runs_at_other_batch_sizes():
    drawn, _ = draw(15, strategy=programs(always={"symbolic_sizes"}))
    ran = 0
    for p in drawn:
        sets = other_sizes(p)
        assert sets, "a symbolic batch is a dynamic dimension of the user inputs"
        module = lower(p)
        for sizes in sets:
            args, kwargs = program_inputs(p, 0, sizes)
            assert args[0].shape[0] == next(iter(sizes.values()))
            module(*args, **kwargs)
            ran += 1
        assert ran


def _times_one(p):
    """Correct: ``x * 1.0`` after each ReLU, through ``e.apply`` (traced at dynamic sizes)."""

    def visit(node, e):
        if node.target is RELU:
            return e.apply(lambda t: t * 1.0, node.ref)
        return None

    return rewrite_nodes(p, visit)


def _fixes_the_batch(p):
    """Planted bug: the batch made an int on the shape env the pass's input shares, then the
    correct edit."""
    graph = p.root_module.graph
    users = {s.name for s in p.signature.user_inputs()}
    for node in graph.placeholders:
        val = node.meta.get("val")
        if node.name in users and isinstance(val, torch.Tensor) and val.dim():
            int(val.shape[0])
    return _times_one(p)


SYMBOLIC = settings(max_examples=20, database=None, deadline=None,
                    phases=[Phase.generate, Phase.shrink])


def test_a_pass_that_fixes_the_batch_is_caught_on_symbolic_programs():
    with pytest.raises(LawViolation) as caught:
        check_laws(_fixes_the_batch, programs=programs(always={"symbolic_sizes"}),
                   settings=SYMBOLIC)
    assert caught.value.law == "purity", str(caught.value)[:400]


def test_its_correct_twin_keeps_every_law_on_symbolic_programs():
    report = check_laws(_times_one, programs=programs(always={"symbolic_sizes"}, max_ops=4),
                        settings=settings(SYMBOLIC, max_examples=8))
    assert report.changed > 0


def test_symbolic_sizes_are_drawn_only_with_the_feature():
    others = frozenset(FEATURES) - OPT_IN_FEATURES - {"symbolic_sizes"}
    drawn, _ = draw(20, strategy=programs(features=others))
    assert not any(other_sizes(p) for p in drawn)

