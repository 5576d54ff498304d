"""Checks on the zoo itself: every case exports and matches its eager model.

Hugging Face variants with ``strict`` or ``decompose`` are marked ``slow``;
``-m "not slow"`` leaves them out.
"""

import pickle

import attrs
import pytest
import torch

try:
    from .zoo import CASES, Case, eager_model, export_case, fresh_export, zoo_ops
    from .zoo_hf import HF_CASES
except ImportError:  # tests/ is not a package
    from zoo import CASES, Case, eager_model, export_case, fresh_export, zoo_ops
    from zoo_hf import HF_CASES

MUTATING = {"buffer_mutation", "input_mutation"}

REQUIRED_FEATURES = {
    "nesting", "containers", "parent_not_called", "method_call", "ancestor_sibling",
    "params", "frozen_param", "buffers", "non_persistent_buffer", "constant_tensor",
    "tied_weights", "unused_param", "unused_buffer", "param_containers",
    "buffer_mutation", "cross_module_mutation", "repeated_mutation", "input_mutation",
    "batchnorm_train", "shared_module", "aliased_module", "repeated_call",
    "repeated_call_diff_graph", "kwargs", "pytree_inputs", "pytree_outputs",
    "none_output", "constant_output", "dynamic_shapes", "symint", "cond", "map",
    "while_loop", "effects", "opaque_object", "preserve", "preserve_nested",
    "preserve_repeated", "preserve_constant", "big",
}  # fmt: skip


def _buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_buffers(remove_duplicate=False))


def check_case(case: Case) -> None:
    """Eager and ``ep.module()`` agree on outputs, mutated inputs and buffers."""
    mutates = bool(case.features & MUTATING)
    ep = fresh_export(case) if mutates else export_case(case)
    eager, exported = eager_model(case), ep.module()

    inputs = [(case.args, case.kwargs)]
    if case.alt_args is not None:
        inputs.append((case.alt_args, case.alt_kwargs or case.kwargs))
    for make_args, make_kwargs in inputs:
        e_args, e_kwargs = make_args(), make_kwargs()
        x_args, x_kwargs = make_args(), make_kwargs()
        expected = eager(*e_args, **e_kwargs)
        got = exported(*x_args, **x_kwargs)
        torch.testing.assert_close(got, expected)
        if "input_mutation" in case.features:
            torch.testing.assert_close((x_args, x_kwargs), (e_args, e_kwargs))
        if "buffer_mutation" in case.features:
            want, have = _buffers(eager), _buffers(exported)
            torch.testing.assert_close({k: have[k] for k in want}, want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_eager(name: str) -> None:
    check_case(CASES[name])


def _hf_params() -> list:
    if not HF_CASES:
        return ["<no transformers>"]
    marks = {True: [pytest.mark.slow], False: []}
    return [
        pytest.param(name, marks=marks["slow" in HF_CASES[name].features])
        for name in sorted(HF_CASES)
    ]


@pytest.mark.hf
@pytest.mark.parametrize("name", _hf_params())
def test_hf_case_matches_eager(name: str) -> None:
    pytest.importorskip("transformers")
    check_case(HF_CASES[name])


def test_features_covered() -> None:
    seen = set().union(*(c.features for c in CASES.values()))
    assert REQUIRED_FEATURES <= seen, REQUIRED_FEATURES - seen


def test_variant_names() -> None:
    for name, case in {**CASES, **HF_CASES}.items():
        assert case.name == name
        assert case.features
        tags = name.partition("[")[2].rstrip("]").split(",") if "[" in name else []
        assert ("strict" in tags) == case.strict
        assert ("decomp" in tags) == case.decompose
    assert CASES["buffer_mutation[strict,decomp]"].strict


def test_factories_are_deterministic() -> None:
    case = CASES["param_zoo"]
    torch.testing.assert_close(case.make().state_dict(), case.make().state_dict())
    torch.testing.assert_close(case.args(), case.args())
    assert case.args()[0] is not case.args()[0]
    before = torch.random.get_rng_state()
    case.make()
    assert torch.equal(before, torch.random.get_rng_state())


def test_export_cache() -> None:
    case = CASES["mlp_nested"]
    assert export_case(case) is export_case(case)
    assert fresh_export(case) is not export_case(case)


def test_effect_tokens_after_decomposition() -> None:
    ep = export_case(CASES["effect_record[decomp]"])
    targets = {n.target for n in ep.graph.nodes}
    assert torch.ops.higher_order.with_effects in targets
    zoo_ops().LOG.clear()
    ep.module()(*CASES["effect_record"].args())
    assert len(zoo_ops().LOG) == 2


def test_print_case_prints(capfd: pytest.CaptureFixture[str]) -> None:
    case = CASES["effect_print[decomp]"]
    export_case(case).module()(*case.args())
    assert "purefx-zoo" in capfd.readouterr().out


def test_opaque_object_is_lifted_and_picklable() -> None:
    ep = export_case(CASES["opaque_object"])
    objs = [v for v in ep.constants.values() if isinstance(v, zoo_ops().Scaler)]
    assert len(objs) == 1
    assert pickle.loads(pickle.dumps(objs[0])).k == 3.0


def test_case_is_frozen() -> None:
    case = CASES["mlp_nested"]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        case.name = "other"  # type: ignore[misc]
