"""The memo of traces (``transforms.machinery.trace._MEMO``): a call traced before is not exported
again, the core level of a call reuses its training-level export, and everything export reads
of a call is in the key, so a call that differs in any of it is traced anew and right."""

from __future__ import annotations

import pytest
import torch

from ir.memo import BoundedMemo
from ir.printer import format_graph
from transforms.machinery import trace as tr
from transforms.machinery.trace import CORE, TRAINING, trace


def _scaled_softmax(x, s):
    return torch.softmax(x * s, -1)


@pytest.fixture
def counted(monkeypatch):
    """A fresh memo; the exports and decompositions made, by kind."""
    monkeypatch.setattr(tr, "_MEMO", BoundedMemo(512))
    calls = {"export": 0, "decompose": 0}
    export, decompose = torch.export.export, torch.export.ExportedProgram.run_decompositions

    def counting_export(*a, **k):
        calls["export"] += 1
        return export(*a, **k)

    def counting_decompose(self, *a, **k):
        calls["decompose"] += 1
        return decompose(self, *a, **k)

    monkeypatch.setattr(torch.export, "export", counting_export)
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counting_decompose)
    return calls


def _text(traced) -> str:
    return format_graph(traced.graph, vals=True)


def test_a_call_traced_before_exports_nothing_and_core_reuses_the_training_export(counted):
    x = torch.randn(3, 4)
    first = trace(_scaled_softmax, (x, 2.0), TRAINING, "r", "pattern")
    assert counted == {"export": 1, "decompose": 0}
    # other values of the same sizes: export never reads them
    again = trace(_scaled_softmax, (torch.randn(3, 4), 2.0), TRAINING, "r", "pattern")
    assert again is first and counted == {"export": 1, "decompose": 0}
    core = trace(_scaled_softmax, (x, 2.0), CORE, "r", "pattern")
    assert counted == {"export": 1, "decompose": 1}
    assert trace(_scaled_softmax, (x, 2.0), CORE, "r", "pattern") is core
    assert counted == {"export": 1, "decompose": 1}
    # what a fresh process would trace
    tr._MEMO.clear()
    assert _text(trace(_scaled_softmax, (x, 2.0), TRAINING, "r", "pattern")) == _text(first)
    assert _text(trace(_scaled_softmax, (x, 2.0), CORE, "r", "pattern")) == _text(core)


_OTHER_CALLS = {
    # what: (the other call's arguments, its options); the first call is (randn(3, 4), 2.0)
    "shape": ((5, 4), 2.0, {}),
    "stride": ("transposed", 2.0, {}),
    "dtype": ("float64", 2.0, {}),
    "literal": ((3, 4), 3.0, {"sentinels": False}),
    "int_literal": ((3, 4), 2, {"sentinels": False}),
    "salt": ((3, 4), 2.0, {"salt": 1}),
}


def _tensor(spec) -> torch.Tensor:
    if spec == "transposed":
        return torch.randn(4, 3).t()
    if spec == "float64":
        return torch.randn(3, 4, dtype=torch.float64)
    return torch.randn(*spec)


@pytest.mark.parametrize("what", list(_OTHER_CALLS))
def test_a_call_that_differs_in_what_export_reads_is_traced_anew(counted, what):
    spec, scalar, options = _OTHER_CALLS[what]
    base_options = {"sentinels": False} if options.get("sentinels") is False else {}
    base = trace(_scaled_softmax, (torch.randn(3, 4), 2.0), TRAINING, "r", "pattern",
                 **base_options)
    args = (_tensor(spec), scalar)
    got = trace(_scaled_softmax, args, TRAINING, "r", "pattern", **options)
    assert counted["export"] == 2 and got is not base
    tr._MEMO.clear()
    assert _text(got) == _text(trace(_scaled_softmax, args, TRAINING, "r", "pattern", **options))


def test_another_function_position_grad_mode_or_default_dtype_is_traced_anew(counted):
    def make():
        return lambda x: torch.relu(x) + 1.5

    f, g = make(), make()
    x = torch.randn(4)
    first = trace(f, (x,), TRAINING, "r", "pattern")
    assert trace(g, (x,), TRAINING, "r", "pattern") is not first and counted["export"] == 2
    with torch.no_grad():
        trace(f, (x,), TRAINING, "r", "pattern")
    assert counted["export"] == 3
    before = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        trace(f, (x,), TRAINING, "r", "pattern")
    finally:
        torch.set_default_dtype(before)
    assert counted["export"] == 4
    assert trace(f, (x,), TRAINING, "r", "pattern") is first and counted["export"] == 4
    # the same values at other positions
    left = trace(torch.sub, (x, 3.0), TRAINING, "r", "pattern", sentinels=False)
    right = trace(torch.sub, (3.0, x), TRAINING, "r", "pattern", sentinels=False)
    assert counted["export"] == 6 and left.tensor_args == (0,) and right.tensor_args == (1,)


def test_an_argument_that_is_not_a_plain_value_is_traced_every_time(counted):
    class Scale:
        def __init__(self, s):
            self.s = s

    def scaled(x, k):
        return x * k.s

    x = torch.randn(4)
    trace(scaled, (x, Scale(2.0)), TRAINING, "r", "pattern")
    trace(scaled, (x, Scale(3.0)), TRAINING, "r", "pattern")
    assert counted["export"] == 2 and not tr._MEMO


def test_a_failed_trace_is_not_kept_and_the_memo_is_bounded(counted):
    def reads_a_value(x):
        return x[: int(x.sum().item() > 0)]

    with pytest.raises(Exception):  # noqa: B017 - export's own error, any type
        tr._trace(reads_a_value, (torch.randn(4),), TRAINING, [], 0)
    kept = tr._MEMO.keys()  # (level, ...) per entry
    assert TRAINING not in {k[0] for k in kept}
    tr._MEMO.size = 2  # the fixture's own memo
    for n in range(1, 5):
        trace(torch.relu, (torch.randn(n),), TRAINING, "r", "pattern")
        assert len(tr._MEMO) <= 2
    assert counted["export"] >= 5
