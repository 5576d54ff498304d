"""The preserve sweep (``tests/preserve_sweep.py``) as a test.

CI runs the deterministic sample (a few cases per model, picked by a hash of the case id) and
asserts that no case is a failure other than those listed in ``KNOWN_FAILURES``, that every listed
case it meets still fails (the list is exact: fixing a case means removing it), and that every
documented ``PassError`` class it meets is one of ``DOCUMENTED``.

The whole sweep is ``python -m pytest tests/test_preserve_sweep.py -m sweep`` (about an hour on
2 cores) or ``python -m tests.preserve_sweep --full`` for the table.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ir

try:
    from . import preserve_sweep as ps
    from .zoo import Case, randn, seeded
except ImportError:  # tests/ is on sys.path, not a package
    import preserve_sweep as ps
    from zoo import Case, randn, seeded


def _assert_sweep_is_as_listed(results: list[ps.Result]) -> None:
    failures = {r.case.id: r.purefx.detail for r in results if r.purefx.status == ps.FAILURE}
    new = {k: v for k, v in failures.items() if k not in ps.KNOWN_FAILURES}
    met = {r.case.id for r in results}
    fixed = sorted((ps.KNOWN_FAILURES & met) - set(failures))
    assert not new, "purefx fails on cases not in KNOWN_FAILURES:\n" + "\n".join(
        f"{k}: {v}" for k, v in new.items()
    )
    assert not fixed, f"these cases pass now; remove them from KNOWN_FAILURES: {fixed}"
    listed = {c.name for c in ps.DOCUMENTED}
    seen = {r.purefx.error_class for r in results if r.purefx.status == ps.DOCUMENTED_CLASS}
    assert seen <= listed, seen - listed


@pytest.fixture(scope="module")
def ci_sample() -> list[ps.Result]:
    return ps.run_sweep(full=False)


def test_ci_sample(ci_sample: list[ps.Result]) -> None:
    _assert_sweep_is_as_listed(ci_sample)
    models = {r.case.model for r in ci_sample}
    # every model is sampled but nn.LSTM alone, which has no submodule
    assert set(ps.sweep_models()) - models == {"lstm"}
    assert {r.case.ir for r in ci_sample} == set(ps.IRS)


def test_ci_sample_counts_torch_on_the_same_cases(ci_sample: list[ps.Result]) -> None:
    table = ps.counts(ci_sample)
    assert table["purefx"]["total"] == table["torch"]["total"] == len(ci_sample)
    assert table["purefx"][ps.NOT_EXPORTABLE] == table["torch"][ps.NOT_EXPORTABLE]
    assert table["purefx"][ps.PASS] >= table["torch"][ps.PASS]
    assert "| purefx |" in ps.format_table(ci_sample)


@pytest.mark.sweep
def test_full_sweep(request: pytest.FixtureRequest) -> None:
    if "sweep" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full preserve sweep runs only when asked for: -m sweep")
    _assert_sweep_is_as_listed(ps.run_sweep(full=True))


# --- the harness itself -------------------------------------------------------------------------


def test_known_failures_name_sweep_cases() -> None:
    """Every listed id has the form model|ir|fqns of a swept model."""
    models = set(ps.sweep_models())
    for case_id in ps.KNOWN_FAILURES:
        model, ir_name, fqns = case_id.split("|")
        assert model in models and ir_name in ps.IRS and fqns, case_id


def test_sibling_pairs_are_adjacent_children_of_one_parent() -> None:
    called = ["a", "a.x", "a.y", "a.z", "b", "b.x", "c"]
    assert ps.sibling_pairs(called) == [("a", "b"), ("b", "c"), ("a.x", "a.y"), ("a.y", "a.z")]


def test_called_modules_in_tree_order() -> None:
    models = ps.sweep_models()
    case = models["containers"]
    called = ps.called_modules(case.make(), case)
    assert called[:4] == ["seq", "seq.0", "seq.1", "seq.2"]
    assert "heads.a" in called and "heads" not in called  # a ModuleDict is indexed, not called
    never = models["parent_never_runs"]
    assert ps.called_modules(never.make(), never) == ["outer.inner", "outer.inner.lin"]


def test_sample_is_deterministic_and_spread() -> None:
    cases = [ps.SweepCase(m, (f,), r) for m in "ab" for f in "xyz" for r in ps.IRS]
    picked = ps.sample(cases, per_model=2)
    assert [c.model for c in picked] == ["a", "a", "b", "b"]
    assert set(picked) == set(ps.sample(list(reversed(cases)), per_model=2))  # not order-tuned
    assert [c for c in cases if c in set(picked)] == picked  # kept in sweep order


def test_documented_class_matches_type_and_message() -> None:
    row = ps.ErrorClass("demo", ir.PassError, r"value %\w+ is random", "why")
    assert row.matches(ir.PassError("value %x is random"))
    assert not row.matches(ir.PassError("value %x is fine"))
    assert not row.matches(ir.LoweringError("value %x is random"))


def _reference_for(case_name: str) -> ps.Reference:
    return ps.reference(ps.sweep_models()[case_name])


def test_checks_pass_on_the_eager_model_itself() -> None:
    ref = _reference_for("mlp_nested")
    ps.check_module(lambda: copy.deepcopy(ref.pristine), ref, ("block.middle",))


class _Off(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1e-3


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda m: setattr(m, "head", _Off(m.head)), "output of call 1"),
        (lambda m: m.register_buffer("extra", torch.zeros(1)), "buffer names"),
        (lambda m: m.add_module("extra", nn.Identity()), "named_modules"),
    ],
)
def test_checks_catch_wrong_numbers_and_trees(break_it, message: str) -> None:
    ref = _reference_for("mlp_nested")

    def build() -> nn.Module:
        m = copy.deepcopy(ref.pristine)
        break_it(m)
        return m

    with pytest.raises(ps.CheckFailed, match=message):
        ps.check_module(build, ref, ())


class _EagerParent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


class _TwoArgLinear(nn.Linear):
    def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x) * k


class _BuiltParent(_EagerParent):
    """Same tree, state and numbers, but the parent passes its child a second argument."""

    def __init__(self, eager: _EagerParent) -> None:
        super().__init__()
        self.inner = _TwoArgLinear(4, 4)
        self.load_state_dict(eager.state_dict())
        self.k = torch.tensor(2.0)  # a plain attribute: not state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, self.k)


def test_swap_check_fails_when_the_eager_module_cannot_be_called() -> None:
    """Outputs, state and tree are right; only calling the swapped-in eager module shows that
    the build's calling convention is not eager's."""
    case = Case("two_arg", seeded(_EagerParent), lambda: (randn(3, 4),))
    ref = ps.reference(case)
    sweep_case = ps.SweepCase("two_arg", ("inner",), "train")
    outcome = ps._checked(lambda: _BuiltParent(ref.pristine), ref, sweep_case)
    assert outcome.status == ps.FAILURE and outcome.detail.startswith("TypeError"), outcome
    assert ps._checked(lambda: copy.deepcopy(ref.pristine), ref, sweep_case).status == ps.PASS
