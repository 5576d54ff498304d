"""The opset steps of ``ir.strategies.programs``: every drawn call of the verified table is
valid (verifies, lowers, runs on ``program_inputs``), ``ops=`` restricts them, the coverage API
says what a run reached, and what the opset matrix found stays fixed.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import InvalidArgument

import ir
from ir.opset import table
from ir.strategies import (
    OPSET_FEATURES,
    Coverage,
    CoverageLog,
    coverage_of,
    program_inputs,
    programs,
)
from ir.strategies.coverage import FIXED_VOCABULARY
from ir.strategies.opset_steps import opset_rows, resolve_ops, scatter
from lowering import lower

FIND = settings(database=None, derandomize=True, max_examples=300, deadline=None,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck))
EVERY = set(OPSET_FEATURES) | {"random_ops"}
BATCH_NORM = "aten.batch_norm.default"


def _calls(p):
    return [n for _, m in p.modules.items() for g in m.graphs for n in g.nodes
            if n.op == "call_function"]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(always=EVERY, max_modules=2, max_ops=5, max_nodes=40))
def test_every_opset_program_verifies_lowers_and_runs(p):
    ir.verify(p)
    args, kwargs = program_inputs(p)
    module = lower(p)
    for _ in range(2):
        module(*args, **kwargs)


def test_ops_restricts_the_opset_steps_to_the_rows_named():
    log = CoverageLog()

    @settings(FIND, max_examples=40)
    @given(log.track(programs(features=EVERY, always={"opset"}, ops=[BATCH_NORM])))
    def draw(p):
        pass

    draw()
    assert BATCH_NORM in log.coverage.operators
    assert log.coverage.operators - FIXED_VOCABULARY == {BATCH_NORM}


def test_a_packet_names_all_its_rows_and_an_unknown_operator_is_refused():
    assert BATCH_NORM in resolve_ops([torch.ops.aten.batch_norm])
    assert resolve_ops([torch.ops.aten.batch_norm.default]) == frozenset({BATCH_NORM})
    with pytest.raises(InvalidArgument, match="ops"):
        programs(ops=["aten.no_such_op.default"])
    with pytest.raises(InvalidArgument, match="ops"):
        programs(ops="aten.add.Tensor")


def test_a_train_mode_norm_writes_a_buffer_of_its_module():
    """``train_norms``: the running statistics are buffers the program writes (what
    ``ir.effects.state_written`` must see)."""
    if not any(s for s in opset_rows(frozenset({"opset", "train_norms"}), None)
               if s[0].name == BATCH_NORM):
        pytest.skip("the table has no batch_norm sample")

    def writes_a_buffer(p):
        for n in _calls(p):
            if str(n.target) == BATCH_NORM and len(n.args) > 5 and n.args[5] is True:
                return any("opset_b" in n.args[i].name for i in (3, 4))
        return False

    p = find(programs(features={"opset", "train_norms"}, always={"opset", "train_norms"},
                      ops=[BATCH_NORM]), writes_a_buffer, settings=FIND)
    assert "train_norms" in coverage_of(p).features
    assert any(s.kind == "buffer" and "opset_b" in s.target for s in p.signature.inputs)
    lower(p)(*program_inputs(p)[0])


def test_coverage_of_a_program_without_the_opset_is_its_fixed_vocabulary():
    p = find(programs(features=set()), lambda p: len(_calls(p)) >= 1, settings=FIND)
    c = coverage_of(p)
    assert c.programs == 1 and "opset" not in c.features
    both = c | Coverage(frozenset({BATCH_NORM}), frozenset({"opset"}), 2)
    assert both.programs == 3 and BATCH_NORM in both.operators and "opset" in both.features
    assert 0.0 <= both.fraction() <= 1.0
    assert BATCH_NORM not in both.missing() and set(both.missing()) < set(table())
    assert "operators of the table" in str(both)


def test_a_run_of_programs_reaches_many_rows_of_the_table():
    """A floor under the figure of ``docs/testing.md``: 100 examples reach 28 % at least of the
    rows they may draw (measured: 209 to 258 of the 721 drawable rows under hypothesis seeds 1
    to 4, against 174 to 217 before the closing run had its reserve, 137 before the rows were
    scattered; the old floor, a third, held on the old derandomized stream only)."""
    log = CoverageLog()

    @settings(FIND, max_examples=100)
    @given(log.track(programs(always={"opset"})))
    def draw(p):
        pass

    draw()
    drawable = {e.name for e, _, _ in opset_rows(frozenset(EVERY) - {"core_level"}, None)}
    drawable |= {e.name for e, _, _ in opset_rows(frozenset(EVERY), None)}
    assert len(log.coverage.operators & drawable) >= 0.28 * len(drawable), log.coverage
    assert "opset" in log.coverage.features


def test_the_opset_rows_are_scattered_over_the_step_bytes():
    """The row of an opset step is ``scatter`` of its bytes, the program's seed and the step's
    number: bytes one apart pick far-apart rows (hypothesis's bytes favour small values and
    repeats; a product of them reached half as many rows), every part changes the number."""
    rows = 645
    picks = [scatter(b, 0, 0) % rows for b in range(1, 65)]
    assert len(set(picks)) >= 40
    assert max(picks) - min(picks) > rows // 2
    assert scatter(1, 2, 3) != scatter(1, 2, 4) != scatter(1, 3, 3)
    assert scatter(7, 7, 7) == scatter(7, 7, 7)


def test_an_uninitialized_result_is_never_returned():
    """Found by the opset matrix: ``empty(...)`` returned as an output made the semantics law
    compare garbage (``transform`` "changed" the program). Its result is read no further."""
    rows = [n for n in table() if n.startswith("aten.empty.")]
    if not rows:
        pytest.skip("the table has no aten.empty row")

    def returns_empty(p):
        out = p.root_module.graph.nodes[-1]
        names = {r.name for r in out.inputs()}
        return any(str(n.target).startswith("aten.empty.") and n.name in names for n in _calls(p))

    with pytest.raises(Exception, match="No examples"):
        find(programs(features={"opset"}, always={"opset"}, ops=rows), returns_empty,
             settings=settings(FIND, max_examples=60))


def test_dead_code_elimination_keeps_a_train_mode_norm_whose_results_nobody_reads():
    """Found by the opset matrix (before the table was wired into ``ir.effects``):
    ``eliminate_dead_code`` dropped a train-mode ``_batch_norm_impl_index`` whose results were
    unread, and with it the write of the running statistics (the semantics law saw the
    buffer's value differ)."""
    from transforms import eliminate_dead_code

    norms = [e.name for e, _, _ in opset_rows(frozenset({"opset", "train_norms"}), None)
             if "norm" in e.name and e.writes]
    if not norms:
        pytest.skip("the table has no train-mode norm sample")

    def writes_state(p):
        return [n.name for n in _calls(p) if str(n.target) in norms
                and any("opset_b" in getattr(a, "name", "") for a in n.args)]

    p = find(programs(features={"opset", "train_norms"}, always={"opset", "train_norms"},
                      ops=norms), writes_state, settings=FIND)
    kept = {n.name for n in _calls(eliminate_dead_code(p))}
    assert set(writes_state(p)) <= kept


def test_a_spec_narrower_than_program_inputs_keeps_its_own_values():
    """Found by the opset matrix: ``normal(mean, std)`` drew ``std`` as a user input, and
    ``program_inputs``' values in [-1, 1) made the input program itself raise (std >= 0). A
    floating spec whose range is narrower than [-1, 1) is the sample's own values (a
    parameter)."""
    rows = [n for n in table() if n.startswith("aten.normal.")]
    if not rows:
        pytest.skip("the table has no aten.normal row")

    @settings(FIND, max_examples=30)
    @given(programs(features=EVERY, always={"opset", "random_ops"}, ops=rows))
    def runs(p):
        lower(p)(*program_inputs(p)[0], **program_inputs(p)[1])

    runs()


VIEWS = ["aten.view.default", "aten.reshape.default", "aten.transpose.int", "aten.select.int"]


def test_a_view_an_opset_step_draws_is_read_on_through_a_copy_that_reaches_an_output():
    """A view of an argument is read on as models read theirs: a ``clone`` of it is taken at
    once, and the clone joins the step's results (later steps read it; an unread one is an
    output). Before, views were read by nothing, so a pass that got a view's shape wrong
    changed no output (``planted_forms.view_as_two_dims`` was found vacuous)."""
    from transforms import eliminate_dead_code

    rows = [n for n in VIEWS if n in table()]

    def live_copied_view(p):
        kept = {n.name for n in _calls(eliminate_dead_code(p))}
        views = {n.name for n in _calls(p) if str(n.target) in rows}
        copies = [n for n in _calls(p) if n.target is torch.ops.aten.clone.default
                  and any(getattr(a, "name", None) in views for a in n.args)]
        return any(c.name in kept for c in copies)

    p = find(programs(features={"opset"}, always={"opset"}, ops=rows), live_copied_view,
             settings=settings(FIND, max_examples=60))
    ir.verify(p)
    args, kwargs = program_inputs(p)
    lower(p)(*args, **kwargs)


def test_a_written_argument_returned_by_its_writer_is_not_copied():
    """``add_(x, y)`` returns ``x``, written: it stays read as it is (no copy of it is taken,
    nor is it returned), unlike a view of an argument."""
    rows = [n for n in table() if n == "aten.add_.Tensor"]
    if not rows:
        pytest.skip("the table has no aten.add_.Tensor row")

    def copies_a_write(p):
        writes = {n.name for n in _calls(p) if str(n.target) in rows}
        return any(n.target is torch.ops.aten.clone.default
                   and any(getattr(a, "name", None) in writes for a in n.args)
                   for n in _calls(p))

    with pytest.raises(Exception, match="No examples"):
        find(programs(features={"opset"}, always={"opset"}, ops=rows), copies_a_write,
             settings=settings(FIND, max_examples=40))
