"""The laws at other sizes of a dynamic dimension: planted bugs that fix or bake in a batch size
are caught by ``check_laws``; a correct pass over a dynamic program passes, not vacuously.

- purity: the input program runs at other sizes after the pass as before (a pass that fixes
  its input's batch through the shape env they share is caught);
- semantics: the result runs as the input at other sizes too (a pass that bakes the example's
  batch into the program is caught, though it is right at the example's);
- a pass that would fix a size through the editor is refused (``edit_refused``, naming the
  dimension), never a silent change to its input.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st
from torch.export import Dim

from ir import import_ep
from lowering import lower
from lowering.pass_laws import LawViolation, check_laws, other_sizes
from transforms.edit import rewrite_nodes

ONE = settings(settings.default, max_examples=1, phases=[Phase.explicit, Phase.generate],
               database=None)
RELU = torch.ops.aten.relu.default


class _PerRow(torch.nn.Module):
    """Linear, ReLU, and a division by the batch (a size the program reads as a value)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.lin(x)).reshape(x.shape[0], -1) / x.shape[0]


def _program():
    """A fresh export (its own shape env: a bug that fixes it breaks no other test)."""
    torch.manual_seed(0)
    ep = torch.export.export(_PerRow(), (torch.randn(5, 4),),
                             dynamic_shapes={"x": {0: Dim("b", min=2, max=32)}})
    return import_ep(ep)


def _symbolic_size_args(node, e):
    """The positions of ``node``'s arguments that are dynamic sizes (SymInt vals)."""
    return [i for i, a in enumerate(e.args) if isinstance(e.val(a), torch.SymInt)]


def bakes_batch(p):
    """Planted bug: a size the program reads as a value becomes the example's number (read
    from the size's hint, which asks the shape env nothing): right at batch 5 only."""

    def visit(node, e):
        at = _symbolic_size_args(node, e) if node.target is torch.ops.aten.div.Tensor else []
        if at:
            args = list(e.args)
            for i in at:
                args[i] = int(e.val(args[i]).node.hint)
            e.args = tuple(args)

    return rewrite_nodes(p, visit)


def bakes_view_size(p):
    """Planted bug: a view's symbolic size becomes the example's number; the editor derives
    the view's val again, which needs the guard ``s0 == 5``: refused."""

    def visit(node, e):
        if node.target in (torch.ops.aten.view.default, torch.ops.aten.reshape.default):
            sizes = [int(s.node.hint) if isinstance(s, torch.SymInt) else s
                     for s in (e.val(a) for a in e.args[1])]
            e.args = (e.args[0], sizes)

    return rewrite_nodes(p, visit)


def fixes_its_input(p):
    """Planted bug: the pass makes a dynamic size an int outside the editor, on the shape
    env its input shares (then does a correct edit)."""
    x = next(n for n in p.root_module.graph.placeholders if n.name == "x")
    int(x.meta["val"].shape[0])
    return times_one(p)


def times_one(p):
    """Correct: ``x * 1.0`` after each ReLU, through ``e.apply`` (traced at dynamic sizes)."""

    def visit(node, e):
        if node.target is RELU:
            return e.apply(lambda t: t * 1.0, node.ref)
        return None

    return rewrite_nodes(p, visit)


def test_other_sizes_move_each_symbol_within_its_range():
    p = _program()
    sets = other_sizes(p)
    assert len(sets) == 2
    assert all(len(s) == 1 and 2 <= next(iter(s.values())) <= 32 for s in sets)
    assert {next(iter(s.values())) for s in sets}.isdisjoint({5})


@pytest.mark.parametrize(("bug", "law", "says"), [
    (bakes_batch, "semantics", "at other sizes of its dynamic dimensions"),
    (bakes_view_size, "edit_refused", "would fix the dynamic size"),
    (fixes_its_input, "purity", "the pass asked the shape env its input shares for the guard"),
])
def test_a_pass_that_fixes_or_bakes_a_batch_size_is_caught(bug, law, says):
    p = _program()
    with pytest.raises(LawViolation) as caught:
        check_laws(bug, programs=st.just(p), settings=ONE)
    assert caught.value.law == law, str(caught.value)[:600]
    assert says in str(caught.value)
    assert "dimension 0 of input %x" in str(caught.value)


def test_the_purity_law_leaves_the_input_dynamic_when_it_catches_a_pass():
    p = _program()
    with pytest.raises(LawViolation):
        check_laws(fixes_its_input, programs=st.just(p), settings=ONE)
    assert lower(p)(torch.ones(9, 4)).shape == (9, 3)


def test_the_purity_law_runs_the_input_at_other_sizes():
    """A pass that changes its input behind the shape env's back (its range constraints, a
    table lowering reads) is seen by running the input at other sizes before and after."""
    p = _program()

    def narrows_the_range(q):
        ranges = q.range_constraints.value
        for sym, vr in list(ranges.items()):
            ranges[sym] = type(vr)(5, 5)
        return times_one(q)

    with pytest.raises(LawViolation) as caught:
        check_laws(narrows_the_range, programs=st.just(p), settings=ONE)
    assert caught.value.law == "purity"
    assert "the input program ran before the pass and raises" in str(caught.value)


def test_a_correct_pass_over_a_dynamic_program_keeps_every_law():
    p = _program()
    report = check_laws(times_one, programs=st.just(p), settings=ONE)
    assert report.changed == 1
    assert lower(p)(torch.ones(9, 4)).shape == (9, 3)
