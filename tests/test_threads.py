"""No hidden dispatch state: the graph a call runs is named by its caller, never by a counter.

A module called several times with different graphs (the zoo's ``repeated_call_diff_graph``
models) must give serial results when its root is called from several threads at once, in every
way a lowered module runs: direct code, interpreter, module by module (after a hook or a swap),
and in deep-copied, unpickled and ``torch.save``d copies. A user's direct call of such a module
runs one documented graph every time.
"""

from __future__ import annotations

import copy
import io
import pickle
import sys
import threading
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ir import import_ep
from ir.errors import InputError
from lowering import LoweredDispatcher, lower
from lowering.codegen import GRAPH_KEYWORD
from tests.zoo import CASES, export_case, randn
from transforms import transform

THREADS = 4
CALLS = 40
# Zoo models whose lowered submodule ``block`` runs different graphs on its calls, and the local
# ``CallsWithAndWithout`` (graphs of different arity).
MODELS = ("repeated_diff_flag", "calls_with_and_without")


def lowered(name: str, **options) -> nn.Module:
    return lower(transform(import_ep(exported(name))), **options)


def exported(name: str) -> torch.export.ExportedProgram:
    if name in CASES:
        return export_case(CASES[name])
    return torch.export.export(eager_model(name), _inputs(name, 0), strict=False)


def eager_model(name: str) -> nn.Module:
    if name in CASES:
        return CASES[name].make()
    torch.manual_seed(0)
    return CallsWithAndWithout()


def _hooked(m: nn.Module) -> nn.Module:
    calls = []
    m.block.register_forward_hook(lambda mod, args, out: calls.append(1))
    m.__dict__["hook_calls"] = calls
    return m


def _swapped(m: nn.Module) -> nn.Module:
    m.block.lin = copy.deepcopy(m.block.lin)  # same weights, a changed tree: module by module
    return m


def _saved(m: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


MODES: dict[str, Callable[[str], nn.Module]] = {
    "direct": lambda name: lowered(name),
    "interpreter": lambda name: lowered(name, interpreter=True),
    "hook": lambda name: _hooked(lowered(name)),
    "swap": lambda name: _swapped(lowered(name)),
    "deepcopy": lambda name: copy.deepcopy(lowered(name)),
    "pickle": lambda name: pickle.loads(pickle.dumps(lowered(name))),
    "torch_save": lambda name: _saved(lowered(name)),
}


def _inputs(name: str, i: int) -> tuple:
    """Distinct inputs per call (so that a wrong graph cannot give the right answer by chance)."""
    args = CASES[name].args() if name in CASES else (randn(3, 4, seed=5),)
    return tuple(a + 0.01 * i for a in args)


def _run_threads(m: nn.Module, name: str) -> list[list[torch.Tensor]]:
    start = threading.Barrier(THREADS)
    results: list[list[torch.Tensor]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            start.wait()
            with torch.no_grad():
                results[t] = [m(*_inputs(name, i)) for i in range(CALLS)]
        except Exception as err:  # noqa: BLE001 (reported by the test thread)
            errors.append(err)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    return results


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", MODELS)
def test_threads_give_serial_results(name: str, mode: str) -> None:
    m = MODES[mode](name)
    assert isinstance(m.block, LoweredDispatcher)
    eager = eager_model(name)
    with torch.no_grad():
        serial = [m(*_inputs(name, i)) for i in range(CALLS)]
        for i in (0, CALLS - 1):
            torch.testing.assert_close(serial[i], eager(*_inputs(name, i)))
    for per_thread in _run_threads(m, name):
        wrong = [i for i, (a, b) in enumerate(zip(per_thread, serial)) if not torch.equal(a, b)]
        assert wrong == [], f"{len(wrong)} of {CALLS} calls ran another graph"
    if mode == "hook":
        assert len(m.hook_calls) == 2 * CALLS * (THREADS + 1)  # the hook fired on every call


@pytest.mark.parametrize("mode", ["direct", "interpreter", "pickle"])
def test_direct_call_of_a_dispatcher_runs_graph_0_every_time(mode: str) -> None:
    m = MODES[mode]("repeated_diff_flag")
    eager = CASES["repeated_diff_flag"].make()
    x = randn(3, 4, seed=3)
    with torch.no_grad():
        for _ in range(3):  # the same graph on every call, never alternating
            torch.testing.assert_close(m.block(x), eager.block(x))
        torch.testing.assert_close(m.block(x, **{GRAPH_KEYWORD: 1}), eager.block(x, negate=True))
        torch.testing.assert_close(m.block(x, **{GRAPH_KEYWORD: 0}), eager.block(x))


class OptionalInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.lin(x) if y is None else self.lin(x) * y


class CallsWithAndWithout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = OptionalInput()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + self.block(x, x * 2)


def test_direct_call_picks_the_first_graph_whose_inputs_fit() -> None:
    eager = eager_model("calls_with_and_without")
    m = lowered("calls_with_and_without")
    x = randn(3, 4, seed=3)
    assert isinstance(m.block, LoweredDispatcher)
    assert all(not hasattr(mod, "_num_calls") for mod in m.modules())
    assert not hasattr(m.block, "reset_calls")
    y = randn(3, 4, seed=4)
    for _ in range(2):
        torch.testing.assert_close(m.block(x), eager.block(x))
        torch.testing.assert_close(m.block(x, y), eager.block(x, y))
    torch.testing.assert_close(m(x), eager(x))


def test_arguments_that_fit_no_graph_raise_input_error() -> None:
    m = lowered("repeated_diff_flag")
    x = randn(3, 4, seed=3)
    with pytest.raises(InputError, match="fit none of its graphs"):
        m.block(x, x)
    with pytest.raises(InputError, match="graphs 0 to 1"):
        m.block(x, **{GRAPH_KEYWORD: 2})


def test_callers_name_the_graph_in_the_generated_code() -> None:
    m = lowered("repeated_diff_flag")
    calls = [n for n in m.graph.nodes if n.op == "call_module"]
    assert [n.target for n in calls] == ["block", "block"]
    assert [n.kwargs.get(GRAPH_KEYWORD) for n in calls] == [None, 1]
    assert f"{GRAPH_KEYWORD} = 1" in m.graph.python_code("self").src


def test_symbolic_trace_of_the_root_runs_each_graph() -> None:
    m = lowered("repeated_diff_flag")
    traced = torch.fx.symbolic_trace(m)
    x = randn(3, 4, seed=3)
    torch.testing.assert_close(traced(x), CASES["repeated_diff_flag"].make()(x))
