"""Every shipped pass over the opset: the laws of the default pipeline, ``cse``,
``fold_constants``, ``eliminate_dead_code``, every rule of ``RULES`` through ``rewrite`` and all
of them through ``saturate``, the ``export_ep`` round trip, and ``split_stages``, on programs
whose steps call the verified operator table (``programs(always={"opset"})``).

A sample runs by default (a few examples per pass); the whole matrix (every pass, every opset
feature set, many examples) under ``-m nightly``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ir import PassError, import_ep, verify
from ir.strategies import DETERMINISTIC_FEATURES, OPSET_FEATURES, program_inputs, programs
from ir.torch_seam import pytree
from lowering import lower, stage_module
from lowering.export import export_ep
from lowering.pass_laws import check_laws
from transforms import cse, eliminate_dead_code, fold_constants, split_stages, transform
from transforms.rewrite import rewrite, saturate
from transforms.rewrite.rules import RULES


def export_round_trip(p):
    """``import_ep(export_ep(p))``: the round trip as a pass."""
    return import_ep(export_ep(p))


def _rewrite_with(rule):
    def run(p):
        return rewrite(p, [rule])

    run.__name__ = run.__qualname__ = f"rewrite[{rule.name}]"
    return run


def saturate_rules(p):
    return saturate(p, RULES)


# (pass, claims idempotence)
PASSES = [
    (transform, True),
    (cse, True),
    (fold_constants, True),
    (eliminate_dead_code, True),
    (export_round_trip, False),
    (saturate_rules, False),
    *((_rewrite_with(r), False) for r in RULES),
]
IDS = [f.__name__ for f, _ in PASSES]

# feature sets of the matrix: the opset steps with each group of their features on
GROUPS = {
    "plain": {"opset"},
    "dtypes": {"opset", "integer_values", "bool_values", "low_precision"},
    "layouts": {"opset", "strided_inputs", "channels_last"},
    "state": {"opset", "train_norms", "inplace_variants", "random_ops"},
    "core": {"opset", "core_level"},
    "all": set(OPSET_FEATURES) | {"random_ops"},
}


def opset_programs(group: str = "all", **kw):
    return programs(always=GROUPS[group], max_modules=2, max_ops=5, max_nodes=40, **kw)


def _settings(n):
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("pass_fn, idempotent", PASSES, ids=IDS)
def test_shipped_pass_obeys_its_laws_on_the_opset(pass_fn, idempotent):
    """The sample: a few programs per pass, every opset feature on."""
    check_laws(pass_fn, programs=opset_programs(), idempotent=idempotent, max_examples=3,
               allow_vacuous=True)


@pytest.mark.nightly
@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("pass_fn, idempotent", PASSES, ids=IDS)
def test_shipped_pass_obeys_its_laws_on_the_opset_matrix(pass_fn, idempotent, group):
    check_laws(pass_fn, programs=opset_programs(group), idempotent=idempotent,
               max_examples=40, allow_vacuous=True)


def _stages_compute_the_program(p, n):
    try:
        stages = split_stages(p, n=n, balance="params")
    except PassError:
        return  # declined with a purefx error
    for q in stages.programs:
        verify(q)
    args, kwargs = program_inputs(p, seed=1)
    want = pytree.tree_leaves(lower(p)(*args, **kwargs))
    leaves = pytree.tree_leaves(program_inputs(p, seed=1))
    by_name = dict(zip([s.name for s in p.signature.user_inputs()], leaves, strict=True))
    acts = tuple(by_name[n] for n in stages.inputs[0])
    kw = {n: by_name[n] for n in stages.root_inputs}
    out = None
    for k in range(len(stages)):
        out = stage_module(stages, k)(*acts, **kw)
        if k < len(stages) - 1:
            acts = tuple(out)
    got = pytree.tree_leaves(out)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, equal_nan=True)
        else:
            assert g == w


_DETERMINISTIC = (DETERMINISTIC_FEATURES | set(OPSET_FEATURES))


@_settings(4)
@given(p=programs(features=_DETERMINISTIC, always={"opset", "nesting"}, max_modules=3,
                  max_ops=4, max_nodes=40), n=st.integers(2, 3))
def test_split_stages_on_the_opset(p, n):
    _stages_compute_the_program(p, n)


@pytest.mark.nightly
@_settings(200)
@given(p=programs(features=_DETERMINISTIC, always={"opset", "nesting"}, max_modules=3,
                  max_ops=5, max_nodes=50), n=st.integers(2, 3))
def test_split_stages_on_the_opset_matrix(p, n):
    _stages_compute_the_program(p, n)




# --- regressions of what the opset matrix found --------------------------------------------------


def test_two_imports_of_a_static_export_are_equal_programs():
    """Found by the export round trip's determinism law: every import made range constraints
    of its own, so two round trips of one program differed (``Opaque`` compares by identity)."""
    from lowering.pass_laws import same_program

    ep = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(2, 3),))
    first, second = import_ep(ep), import_ep(ep)
    assert same_program(first, second)
    assert first.range_constraints is second.range_constraints


def test_a_resized_buffer_never_reaches_a_program():
    """Found by the opset matrix: ``resize_`` of a new buffer changed its placeholder's val
    (the fake run writes the fake tensor), so ``export_ep`` refused the program (the buffer's
    shape and its placeholder's differ). A step that resizes an argument adds nothing."""
    rows = [n for n in ("aten.resize_.default", "aten.resize_as_.default")
            if n in __import__("ir.opset", fromlist=["table"]).table()]
    if not rows:
        pytest.skip("the table has no resize_ row")

    @_settings(20)
    @given(programs(features=set(OPSET_FEATURES), always={"opset", "inplace_variants"},
                    ops=rows, max_modules=1))
    def exports(p):
        verify(p)
        for spec in p.signature.inputs:
            if spec.kind == "buffer":
                node = p.root_module.graph.node(spec.name)
                assert tuple(node.meta["val"].shape) == tuple(p.tensor(spec.target).shape)
        export_ep(p)

    exports()
