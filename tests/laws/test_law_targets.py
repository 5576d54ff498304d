"""A pass's own targets, found (``lowering/law_targets.py``): ``check_laws(pass)`` with no
``programs=`` draws a first share of default programs, finds which operator forms the pass
changes (from the programs it changed, or by probing the operator table when it changed none)
and spends the rest of its budget on ``programs(ops=...)`` of them; its report names them and
tells a pass that changed fewer than one default program in five so.

The planted pair: ``floor_divide(a, b)`` rewritten as ``div(a, b, rounding_mode='floor')``
(right) and as ``div(..., rounding_mode='trunc')`` (wrong where a quotient is negative), an
operator few default programs call."""

from __future__ import annotations

import collections

import pytest
import torch

from ir import verify
from ir.args import IDict, IList
from ir.graph import Graph
from lowering import law_targets
from lowering.law_targets import Targets, changed_forms, probe_calls, probe_table, report_note
from lowering.pass_laws import LawViolation, check_laws

aten = torch.ops.aten


def _each_node(p, change):
    """``p`` with ``change`` applied to every node of every graph (``p`` itself when it changes
    none)."""
    modules, changed = p.modules, False
    for _, mid in p.walk():
        module = p.module_table()[mid]
        graphs = []
        for g in module.graphs:
            nodes = tuple(change(n) for n in g.nodes)
            changed |= nodes != g.nodes
            graphs.append(Graph(nodes))
        modules = modules.set(mid, module.replace(graphs=tuple(graphs)))
    return p.replace(modules=modules) if changed else p


def _as_div(mode):
    def rewrite(p):
        return _each_node(p, lambda n: n.replace(
            target=aten.div.Tensor_mode, kwargs=IDict((("rounding_mode", mode),)))
            if n.target is aten.floor_divide.default else n)
    return rewrite


floor_divide_as_floor_div = _as_div("floor")  # right: the same kernel
floor_divide_as_trunc_div = _as_div("trunc")  # wrong where a quotient is negative


def _calls_of(row):
    return [c for c in probe_calls() if c[0] == row]


def test_probe_programs_call_each_form_of_the_table_and_verify():
    calls = probe_calls()
    rows = {c[0] for c in calls}
    assert len(rows) > 500 and "aten.floor_divide.default" in rows
    # one call per distinct form: div.Tensor_mode's two rounding modes are two calls
    modes = {dict(c[2].kwargs).get("rounding_mode") for c in _calls_of("aten.div.Tensor_mode")}
    assert modes == {"trunc", "floor"}
    for start in (0, len(calls) // 2):
        p = law_targets._probe_program(calls[start:start + law_targets.PROBE_CALLS])
        assert p is not None and len(p.root_module.graph.nodes) > law_targets.PROBE_CALLS
        verify(p, vals=True)


def test_changed_forms_names_what_the_pass_rewrote_and_not_what_it_kept():
    p = law_targets._probe_program(_calls_of("aten.floor_divide.default")
                                   + _calls_of("aten.relu.default"))
    found = changed_forms(p, floor_divide_as_trunc_div(p))
    # every form of floor_divide the table and the census know (two tensors, a scalar divisor),
    # once each, and no relu
    assert found["aten.floor_divide.default(%, %)"] == 1
    assert found and set(found.values()) == {1}
    assert all(f.startswith("aten.floor_divide.default(") for f in found)
    assert changed_forms(p, p) == collections.Counter()


def test_the_probe_finds_a_rare_operator_whatever_the_pass_is_called():
    found = probe_table(floor_divide_as_floor_div)
    assert found.source == "probe" and found.operators == ("aten.floor_divide.default",)
    assert "aten.floor_divide.default(%, %)" in found.forms
    assert all(f.startswith("aten.floor_divide.default(") for f in found.forms)
    assert probe_table(lambda p: floor_divide_as_floor_div(p)) == found  # its behaviour alone
    assert probe_table(lambda p: p).forms == ()


def _views_flattened(p):
    """Bug: every ``view(x, shape)`` of three or more sizes as ``view(x, [shape[0], -1])``,
    through the editor, which refuses it where the new shape reaches an output (each probe's
    calls are outputs)."""
    from transforms.edit import rewrite_nodes

    def visit(node, e):
        if node.target is not aten.view.default or len(e.args) != 2:
            return None
        shape = e.args[1]
        if not isinstance(shape, IList) or len(shape) < 3 or not all(
                isinstance(d, int) and d > 0 for d in shape):
            return None
        return e.call(aten.view.default, e.args[0], [shape[0], -1])

    return rewrite_nodes(p, visit)


def test_the_probe_finds_the_forms_a_pass_raises_on_by_halving_the_probe():
    # every probe program with a 3-d view raises (the editor refuses the new output shape):
    # halved down to single calls, the views it raises on are its targets, and nothing else
    found = probe_table(_views_flattened)
    assert found.source == "probe" and found.operators == ("aten.view.default",)
    assert found.forms and all(f.startswith("aten.view.default(%, [") for f in found.forms)
    assert all(f.count(",") >= 3 for f in found.forms)  # three sizes or more: no 2-d view
    # a pass that raises on every probe program tells nothing of its targets
    assert probe_table(lambda p: 1 / 0).forms == ()
    # a pass that raises only where a probe calls floor_divide: that row alone
    def raises_on_floor_divide(p):
        if floor_divide_as_floor_div(p) is not p:
            raise ValueError("no floor_divide here")
        return p
    assert probe_table(raises_on_floor_divide).operators == ("aten.floor_divide.default",)


def test_a_pass_of_a_rare_operator_is_judged_on_programs_rich_in_it():
    report = check_laws(floor_divide_as_floor_div, max_examples=25)
    # the forms the first phase met (which of the operator's forms depends on the draws)
    assert report.targets
    assert all(f.startswith("aten.floor_divide.default(") for f in report.targets)
    assert report.changed >= 3  # not vacuous: the second phase gave it work
    text = str(report)
    assert report.targets[0] in text
    assert "15 more drawn with programs(ops=[aten.floor_divide.default])" in text
    with pytest.raises(LawViolation) as caught:
        check_laws(floor_divide_as_trunc_div, max_examples=25, shrink_calls=20)  # found, not shrunk
    assert caught.value.law == "semantics"


def test_the_report_tells_a_pass_that_changes_fewer_than_one_program_in_five():
    found = Targets(("aten.remainder.Tensor(%, %)",), ("aten.remainder.Tensor",), "changed")
    note = report_note(found, tried=40, changed=7, rest=60)
    assert note.startswith("it changed 7 of the 40 default programs, fewer than one in 5: it "
                           "changes aten.remainder.Tensor(%, %)")
    assert note.endswith("; 60 more drawn with programs(ops=[aten.remainder.Tensor])")
    assert "fewer than one" not in report_note(found, tried=40, changed=8, rest=60)
    assert report_note(Targets(), tried=40, changed=0, rest=60) == ""  # the vacuous verdict
    assert "fewer than one in 5" in report_note(Targets(), tried=40, changed=2, rest=60)


def test_a_pass_that_changes_nothing_is_told_the_probe_found_nothing_either():
    with pytest.raises(LawViolation, match="VACUOUS: the pass changed none of the 10 programs"
                       ) as caught:
        check_laws(lambda p: p.replace(), max_examples=10)
    assert "forms of the operator table probed" in str(caught.value)


def test_first_phase_shares():
    assert [law_targets.first_phase(n) for n in (1, 2, 10, 100)] == [1, 1, 4, 40]


def test_the_two_phases_are_repeatable_under_a_seed():
    one = check_laws(floor_divide_as_floor_div, max_examples=10, seed=5)
    assert one == check_laws(floor_divide_as_floor_div, max_examples=10, seed=5)
    assert one.tried == 10 and "aten.floor_divide.default(%, %)" in one.targets
