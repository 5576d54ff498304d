"""``lower(import_ep(ep))`` behaves like ``ep.module()``: the round trip without any pass."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch
import zoo

from ir import InputError, import_ep
from lowering import lower

ALL = sorted(zoo.CASES)


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, equal_nan=True)


def _run_both(case, module, calls: int = 2):
    """Call ``ep.module()`` and ``module`` ``calls`` times on fresh copies of the inputs."""
    # ep.module() shares ep's tensors and mutates them; run it on a copy so that ``ep`` itself
    # only sees what purefx does to it
    reference = copy.deepcopy(zoo.export_case(case)).module()
    for _ in range(calls):
        args_r, kwargs_r = case.args(), case.kwargs()
        args_m, kwargs_m = case.args(), case.kwargs()
        out_r = reference(*args_r, **kwargs_r)
        out_m = module(*args_m, **kwargs_m)
        _close(out_m, out_r)
        _close(list(args_m), list(args_r))  # user-input mutations applied alike
    return reference


@pytest.mark.parametrize("name", ALL)
def test_flat_round_trip_matches_ep_module(name):
    case = zoo.CASES[name]
    ep = zoo.export_case(case)
    versions = [(k, v._version) for k, v in ep.state_dict.items()]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module = lower(import_ep(ep))
    assert out.getvalue() == ""
    reference = _run_both(case, module)
    expected = dict(reference.named_buffers())
    _close({k: v for k, v in module.named_buffers() if k in expected}, expected)
    assert list(module.state_dict()) == list(zoo.eager_model(case).state_dict())
    assert [(k, v._version) for k, v in ep.state_dict.items()] == versions  # state was copied


@pytest.mark.parametrize("name", [n for n in ALL if zoo.CASES[n].alt_args is not None])
def test_flat_round_trip_on_other_shapes(name):
    case = zoo.CASES[name]
    ep = zoo.export_case(case)
    module = lower(import_ep(ep))
    args, kwargs = case.alt_args(), (case.alt_kwargs() if case.alt_kwargs else case.kwargs())
    _close(module(*args, **kwargs), ep.module()(*args, **kwargs))


def test_non_persistent_buffers_stay_out_of_state_dict():
    case = zoo.CASES["param_zoo"]
    module = lower(import_ep(zoo.export_case(case)))
    eager = zoo.eager_model(case)
    assert set(dict(eager.named_buffers())) <= set(dict(module.named_buffers()))
    assert "offset" in dict(module.named_buffers()) and "offset" not in module.state_dict()
    assert list(module.state_dict()) == list(eager.state_dict())
    assert not module.frozen.requires_grad and module.w.requires_grad


def test_kwargs_in_any_order_and_missing_kwargs():
    case = zoo.cases_with("kwargs")[0]
    module = lower(import_ep(zoo.export_case(case)))
    kwargs = case.kwargs()
    assert len(kwargs) >= 1
    reordered = dict(reversed(list(kwargs.items())))
    _close(module(*case.args(), **reordered), zoo.export_case(case).module()(*case.args(), **kwargs))
    with pytest.raises(InputError):
        module(*case.args())


def test_wrong_arity_is_an_input_error():
    case = zoo.CASES["mlp_nested"]
    module = lower(import_ep(zoo.export_case(case)))
    with pytest.raises(InputError, match="no flat args adapter"):
        module(*case.args(), torch.zeros(1))


def test_calling_never_changes_ep_tensors():
    case = zoo.cases_with("buffer_mutation")[0]
    ep = zoo.export_case(case)
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    module = lower(import_ep(ep))
    module(*case.args(), **case.kwargs())
    for k, v in ep.state_dict.items():
        torch.testing.assert_close(v, before[k])
    out = module(*case.args(), **case.kwargs())
    assert any(isinstance(x, torch.Tensor) for x in torch.utils._pytree.tree_leaves(out))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_places_state_on_cuda():
    case = zoo.CASES["mlp_nested"]
    module = lower(import_ep(zoo.export_case(case)), device="cuda")
    assert all(p.is_cuda for p in module.parameters())
    args = [a.cuda() for a in case.args()]
    out = module(*args)
    _close(out.cpu(), zoo.export_case(case).module()(*case.args()))
