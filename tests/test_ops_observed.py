"""Operators the verified table lacks, known on demand (``ir.op_known``): observed the first time
purefx meets a call with values, kept in memory and in the store, declared with
``ir.ops.register_facts``; an operator that cannot be observed is refused with "facts unknown",
never with a write it was not seen to make."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ir import OperatorFactsError, PassError, import_ep, op_known, ops
from ir.fact_store import decode_sample, encode_sample, read_json, write_json
from ir.op_observe import Unobservable, entry_of, observe, sample_of, value_ranges
from ir.opset import entry
from ir.opset_entry import Sample, TensorSpec, Write
from ir.printer import format_graph
from ir.torch_seam import new_fake_mode
from lowering import lower
from transforms import rewrite_nodes
from transforms.rewrite import Rule, check_rule, saturate_report

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[1]

# --- custom operators, one per test that counts or changes what is known ------------------------

CALLS: dict[str, int] = {}


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


@torch.library.custom_op("purefx_observed::scale", mutates_args=())
def scale(x: torch.Tensor, s: float) -> torch.Tensor:
    _count("scale")
    return x * s


@scale.register_fake
def _(x, s):
    return torch.empty_like(x)


@torch.library.custom_op("purefx_observed::bump", mutates_args=("x",))
def bump(x: torch.Tensor) -> None:
    x.add_(1)


@bump.register_fake
def _(x):
    return None


@torch.library.custom_op("purefx_observed::noise", mutates_args=())
def noise(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand_like(x)


@noise.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("purefx_observed::picky", mutates_args=())
def picky(x: torch.Tensor) -> torch.Tensor:
    _count("picky")
    raise RuntimeError("picky runs on no made-up tensor")


@picky.register_fake
def _(x):
    return torch.empty_like(x)


# writes its argument although its schema says nothing (when ``train``): only observation sees it
_LIB = torch.library.Library("purefx_observed", "FRAGMENT")
_LIB.define("sneaky(Tensor x, bool train) -> Tensor")


def _sneaky(x: torch.Tensor, train: bool) -> torch.Tensor:
    if train:
        x.add_(1)
    return x * 2


_LIB.impl("sneaky", _sneaky, "CompositeExplicitAutograd")
_LIB.impl("sneaky", lambda x, train: torch.empty_like(x), "Meta")


# --- an aten operator outside the table, emitted by a pass -------------------------------------

FQ = aten.fake_quantize_per_tensor_affine.tensor_qparams


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def _quantize_linear(node, e):
    if node.target is aten.linear.default:
        s = e.constant(torch.tensor(0.1))
        z = e.constant(torch.tensor(0, dtype=torch.int32))
        return e.call(FQ, node.ref, s, z, -128, 127)
    return None


def test_an_aten_operator_outside_the_table_is_emitted_and_judged_by_its_observed_facts():
    assert entry(FQ) is None  # not a row: its facts are observed
    torch.manual_seed(0)
    m = _Linear().eval()
    x = torch.randn(2, 4)
    p = import_ep(torch.export.export(m, (x,)))
    q = rewrite_nodes(p, _quantize_linear)
    text = format_graph(q.root_module.graph)
    assert "aten.fake_quantize_per_tensor_affine.tensor_qparams](%linear" in text
    found = ops.facts(FQ)
    assert found.origin == ops.OBSERVED and found.verified
    assert found.writes == () and found.aliases == () and not found.random
    assert ops.unknown_facts(FQ) == ""
    want = torch.relu(torch.fake_quantize_per_tensor_affine(
        m.lin(x), torch.tensor(0.1), torch.tensor(0, dtype=torch.int32), -128, 127))
    torch.testing.assert_close(lower(q)(x), want)


# --- a rule whose replacement is an aten operator outside the table ------------------------------


def _reglu(x, w1, b1, w2, b2):
    return F.relu(F.linear(x, w1, b1)) * F.linear(x, w2, b2)


def _reglu_fused(x, w1, b1, w2, b2):
    return aten._addmm_activation.default(b1, x, w1.t()) * F.linear(x, w2, b2)


REGLU = Rule(_reglu, _reglu_fused, (torch.randn(3, 4), torch.randn(5, 4), torch.randn(5),
                                    torch.randn(5, 4), torch.randn(5)), name="reglu_addmm",
             max_examples=12)
# the search is under test here (check_rule of this rule takes ~30 s: the nightly test below)
REGLU_TRUSTED = attrs.evolve(REGLU, trusted=True)


class _ReGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(5, 4)), nn.Parameter(torch.randn(5))
        self.w2, self.b2 = nn.Parameter(torch.randn(5, 4)), nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _reglu(x, self.w1, self.b1, self.w2, self.b2)


def test_a_reglu_rule_fused_to_addmm_activation_is_taken_by_saturate():
    assert entry(aten._addmm_activation.default) is None
    torch.manual_seed(0)
    m = _ReGLU()
    x = torch.randn(3, 4)
    p = import_ep(torch.export.export(m, (x,)))
    q, report = saturate_report(p, [REGLU_TRUSTED])
    assert report.rewrites == {"reglu_addmm": 1}
    text = format_graph(q.root_module.graph)
    assert "aten._addmm_activation.default](%p_b1, %x" in text and "aten.relu" not in text
    assert ops.facts(aten._addmm_activation.default).origin == ops.OBSERVED
    torch.testing.assert_close(lower(q)(x), m(x))


@pytest.mark.nightly
def test_the_reglu_rule_fused_to_addmm_activation_passes_check_rule():
    assert check_rule(REGLU).rewritten > 0


# --- custom operators -----------------------------------------------------------------------------


def test_a_functional_custom_operator_is_observed_functional():
    op = torch.ops.purefx_observed.scale.default
    assert ops.facts(op).origin == ops.UNKNOWN and ops.facts(op).writes  # conservative
    facts = ops.observe_facts(op, (torch.randn(2, 3), 2.0))
    assert facts.writes == () and facts.aliases == () and not facts.random
    found = ops.facts(op)
    assert found.origin == ops.OBSERVED and found.recomputable and not ops.impurity(op)


def test_a_custom_operator_that_mutates_its_argument_is_seen_writing_it():
    op = torch.ops.purefx_observed.bump.default
    facts = ops.observe_facts(op, (torch.randn(3),))
    assert facts.writes == (Write(0),)
    assert ops.facts(op).origin == ops.OBSERVED and ops.impurity(op)


def test_a_write_the_schema_hides_is_observed_under_the_bool_that_makes_it():
    op = torch.ops.purefx_observed.sneaky.default
    assert ops.facts(op).written == ()  # the schema declares no write
    x = torch.randn(3)
    assert ops.observe_facts(op, (x, False)).writes == ()
    assert torch.equal(x, x.clone())  # the example values are never run on
    facts = ops.observe_facts(op, (x, True))
    assert facts.writes == (Write(0, ((1, True),)),)
    assert "writes x (0) when train (1) is True" in facts.hidden
    assert ops.facts(op).writes == (Write(0, ((1, True),)),)


def _emit_sneaky(train: bool):
    def visit(node, e):
        if node.target is aten.add.Tensor:
            return e.call(torch.ops.purefx_observed.sneaky.default, e.args[0], train)
        return None
    return visit


def test_an_emitted_call_is_judged_by_what_its_own_arguments_make_it_do():
    p = import_ep(torch.export.export(_Picky(), (torch.randn(3),)))
    q = rewrite_nodes(p, _emit_sneaky(False))  # writes nothing when train is False
    assert "purefx_observed.sneaky.default](%x, False)" in format_graph(q.root_module.graph)
    x = torch.randn(3)
    torch.testing.assert_close(lower(q)(x.clone()), x * 2)
    with pytest.raises(PassError, match="writes %x in place, which is a user input"):
        rewrite_nodes(p, _emit_sneaky(True))  # observed writing its argument


def test_a_random_custom_operator_is_observed_random():
    op = torch.ops.purefx_observed.noise.default
    assert ops.observe_facts(op, (torch.randn(4),)).random
    assert ops.is_random(op) and "is random" in ops.impurity(op)


class _Picky(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _emit_picky(node, e):
    if node.target is aten.add.Tensor:
        return e.call(torch.ops.purefx_observed.picky.default, e.args[0])
    return None


def test_an_operator_that_cannot_be_observed_is_refused_as_unknown_not_as_a_write():
    op = torch.ops.purefx_observed.picky.default
    p = import_ep(torch.export.export(_Picky(), (torch.randn(3),)))
    with pytest.raises(PassError) as caught:
        rewrite_nodes(p, _emit_picky)
    message = str(caught.value)
    assert "facts unknown for purefx_observed.picky.default: purefx could not observe it" in message
    assert "picky runs on no made-up tensor" in message
    assert "register_facts" in message and "writes %x in place" not in message
    with pytest.raises(OperatorFactsError, match="could not observe"):
        ops.observe_facts(op, (torch.randn(3),))
    with ops.register_facts(op) as declared:  # the user's word: functional
        assert ops.facts(op).origin == ops.DECLARED and declared.facts.writes == ()
        q = rewrite_nodes(p, _emit_picky)
        assert "purefx_observed.picky.default](%x)" in format_graph(q.root_module.graph)
    assert ops.facts(op).origin == ops.UNKNOWN  # withdrawn at the end of the block
    tried = CALLS["picky"]
    with pytest.raises(PassError, match="facts unknown"):
        rewrite_nodes(p, _emit_picky)
    assert CALLS["picky"] == tried  # a call that raised is not run again at its key
    other = torch.ops.purefx_observed.big.default  # another failure keeps picky's reason
    with pytest.raises(OperatorFactsError):
        ops.observe_facts(other, (torch.empty(1 << 12, 1 << 11),))
    assert "picky runs on no made-up tensor" in ops.unknown_facts(op)


@torch.library.custom_op("purefx_observed::big", mutates_args=())
def big(x: torch.Tensor) -> torch.Tensor:
    _count("big")
    return x.clone()


def test_a_call_too_large_to_run_is_not_observed_and_says_so():
    op = torch.ops.purefx_observed.big.default
    with pytest.raises(OperatorFactsError, match="more than the 4194304 purefx runs"):
        ops.observe_facts(op, (torch.empty(1 << 12, 1 << 11),))  # 8M elements
    assert CALLS.get("big", 0) == 0 and ops.facts(op).origin == ops.UNKNOWN
    ops.observe_facts(op, (torch.randn(2, 3),))  # a small example of the same kind covers it
    assert CALLS["big"] == 2 and ops.facts(op).origin == ops.OBSERVED


def test_register_facts_refuses_what_it_cannot_take_and_keeps_the_schema_writes():
    with pytest.raises(OperatorFactsError, match="verified operator table"):
        ops.register_facts(aten.add.Tensor)
    with pytest.raises(OperatorFactsError, match="has no argument 'y'"):
        ops.register_facts(torch.ops.purefx_observed.scale.default, written=("y",))
    with pytest.raises(OperatorFactsError, match="not an operator overload"):
        ops.register_facts(torch.relu)
    with pytest.raises(OperatorFactsError, match="verified operator table"):
        ops.observe_facts(aten.add.Tensor, (torch.ones(2), torch.ones(2)))
    with pytest.raises(OperatorFactsError, match="not an operator overload"):
        ops.observe_facts(torch.relu, (torch.ones(2),))
    handle = ops.register_facts(torch.ops.purefx_observed.bump.default)  # declares no write
    try:
        assert ops.facts(torch.ops.purefx_observed.bump.default).writes == (Write(0),)
        with pytest.raises(OperatorFactsError, match="has declared facts"):
            ops.observe_facts(torch.ops.purefx_observed.bump.default, (torch.ones(2),))
    finally:
        handle.unregister()
    handle.unregister()  # twice: a no-op
    assert op_known.declared(torch.ops.purefx_observed.bump.default) is None
    random = ops.register_facts(torch.ops.purefx_observed.scale.default, random=True,
                                aliases=[(0, "x")])
    try:
        assert ops.is_random(torch.ops.purefx_observed.scale.default)
        assert ops.facts(torch.ops.purefx_observed.scale.default).aliases == ((0, 0),)
    finally:
        random.unregister()
    with pytest.raises(OperatorFactsError, match="has no result 1"):
        ops.register_facts(torch.ops.purefx_observed.scale.default, aliases=[(1, 0)])


# --- kept: memo and store ------------------------------------------------------------------------


@torch.library.custom_op("purefx_observed::kept", mutates_args=())
def kept(x: torch.Tensor) -> torch.Tensor:
    _count("kept")
    return x.sin()


@kept.register_fake
def _(x):
    return torch.empty_like(x)


def test_observed_facts_are_kept_in_the_memo_and_the_store_per_torch_version():
    op = torch.ops.purefx_observed.kept.default
    before = CALLS.get("kept", 0)
    ops.observe_facts(op, (torch.randn(2, 2),))
    assert CALLS["kept"] - before == 2  # seed 0, seed 1
    op_known.meet(op, (torch.randn(5, 5),), {})  # same key (dtype, rank): covered
    assert CALLS["kept"] - before == 2
    path = op_known.store_path(op)
    body = json.loads(path.read_text())
    assert body["op"] == "purefx_observed.kept.default" and body["torch"] == torch.__version__
    assert len(body["calls"]) == 1 and body["calls"][0]["written"] == []
    op_known.forget(op)  # the memo forgets: the store answers, nothing runs
    assert ops.facts(op).origin == ops.OBSERVED and CALLS["kept"] - before == 2
    assert op_known.stored(op) is not None
    assert op_known.stored(op, version="0.0.0") is None  # another torch: not reused
    other = op_known.store_path(op, "0.0.0")
    assert other != path
    other.write_text(path.read_text())  # a copy filed under another version is not trusted
    assert op_known.stored(op, version="0.0.0") is None
    body["calls"][0]["written"] = [0]  # an edited entry: its checksum fails
    path.write_text(json.dumps(body))
    op_known.forget(op)
    assert ops.facts(op).origin == ops.UNKNOWN
    op_known.meet(op, (torch.randn(2, 2),), {})
    assert CALLS["kept"] - before == 4 and ops.facts(op).origin == ops.OBSERVED


_SECOND_PROCESS = """
import torch
from ir import ops
calls = []
@torch.library.custom_op("purefx_observed::kept", mutates_args=())
def kept(x: torch.Tensor) -> torch.Tensor:
    calls.append(1)
    return x.sin()
op = torch.ops.purefx_observed.kept.default
found = ops.facts(op)
print(found.origin, found.writes, len(calls))
"""


@pytest.mark.nightly  # a second interpreter importing torch: ~15 s
def test_a_new_process_reads_observed_facts_from_the_store_without_running_the_operator():
    op = torch.ops.purefx_observed.kept.default
    ops.facts(op)
    op_known.meet(op, (torch.randn(2, 2),), {})
    assert op_known.stored(op) is not None
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _SECOND_PROCESS], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300, check=True)
    assert out.stdout.split() == ["observed", "()", "0"]


# --- the pieces: a call's values as a sample, samples as JSON ------------------------------------


def test_a_calls_values_become_a_sample_of_their_shapes_dtypes_and_strides():
    with new_fake_mode():
        x = torch.empty(2, 3).t()
    assert type(x) is not torch.Tensor  # a fake tensor: no data to read
    sample, device = sample_of((x, [x, x], 2, None), {"alpha": 1.5})
    spec = sample.args[0]
    assert (spec.shape, spec.dtype, spec.stride) == ((3, 2), torch.float32, (1, 3))
    assert sample.args[1] == (spec, spec) and sample.args[2:] == (2, None)
    assert sample.kwargs == (("alpha", 1.5),) and device == torch.device("cpu")
    assert sample_of((torch.ones(4),), {})[0].args[0].stride is None
    with pytest.raises(Unobservable, match="argument 1 is a Generator"):
        sample_of((x, torch.Generator()), {})
    with pytest.raises(Unobservable, match="sparse"):
        sample_of((torch.eye(2).to_sparse(),), {})
    narrow = value_ranges(sample)[1]
    assert (narrow.args[0].low, narrow.args[0].high) == (0.0, 1.0)
    assert narrow.args[1][0].high == 1.0 and narrow.kwargs == sample.kwargs


def test_samples_round_trip_through_json_and_nothing_else_is_read():
    spec = TensorSpec((2, 3), torch.int64, (1, 2), -1.0, 4.0)
    sample = Sample((spec, (spec, 1.5), True, None, 3j, torch.float16, torch.device("cpu"),
                     torch.channels_last, torch.strided, "mean"), (("out", spec),))
    body = json.loads(json.dumps(encode_sample(sample)))
    assert decode_sample(body) == sample
    for bad in ({"args": [{"dtype": "os"}], "kwargs": []},
                {"args": [{"tensor": [2], "dtype": "path", "stride": None, "low": 0, "high": 1}],
                 "kwargs": []},
                {"args": [{"tensor": [-1], "dtype": "float32", "stride": None, "low": 0,
                           "high": 1}], "kwargs": []},
                {"args": [], "kwargs": [["x"]]}, [], {"args": []}):
        with pytest.raises(ValueError):
            decode_sample(bad)
    with pytest.raises(ValueError):
        encode_sample(Sample((TensorSpec((1,), torch.float32, values=(1.0,)),)))


def test_a_sealed_json_file_is_read_back_and_an_edited_one_is_not(tmp_path):
    path = tmp_path / "deep" / "entry.json"
    assert write_json(path, {"a": [1, 2]})
    assert read_json(path)["a"] == [1, 2]
    body = json.loads(path.read_text())
    body["a"] = [1, 3]
    path.write_text(json.dumps(body))
    assert read_json(path) is None
    path.write_text("{not json")
    assert read_json(path) is None and read_json(tmp_path / "missing.json") is None


def test_the_facts_of_several_calls_condition_a_write_on_the_bool_that_separates_them():
    op = torch.ops.purefx_observed.sneaky.default
    x = TensorSpec((3,), torch.float32)
    seen = [observe(op, [Sample((x, flag))])[0] for flag in (False, True)]
    assert [s.written for s in seen] == [frozenset(), frozenset({0})]
    row = entry_of(op, seen, source="test")
    assert row.writes == (Write(0, ((1, True),)),) and not row.random
    assert entry_of(op, seen[1:], source="test").writes == (Write(0),)
    assert observe(torch.ops.purefx_observed.picky.default, [Sample((x,))]) == (
        None, "it raised RuntimeError: picky runs on no made-up tensor")


@pytest.mark.parametrize("name", ["aten.batch_norm.default", "aten.dropout.default",
                                  "aten.add_.Tensor", "aten.rand_like.default",
                                  "aten.index_put.default"])
def test_the_builder_observes_with_the_same_code_and_finds_the_tables_facts(name):
    from ir.opset import resolve, table
    from ir.opset_build import build_entry, own_samples
    from ir.opset_entry import CORE

    calls = [(s.args, s.kwargs, "own", CORE) for s in own_samples()[name]]
    row, why = build_entry(resolve(name), calls, set(), "own")
    assert why == ""
    shipped = table()[name]
    assert (row.writes, row.aliases, row.random) == (
        shipped.writes, shipped.aliases, shipped.random)
