"""The matcher's normal form (issue 31, items 4 and 5, typed literals): literals keep their type;
nodes that compute nothing (eval dropout, same-dtype ``.to``, copies, ``alias``, metadata
asserts) are looked through and absorbed; dimensions and dtypes are spelled one way; sizes are
wildcards re-checked at the matched shapes (``transforms.rewrite.sizes.recheck``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import import_ep, ops
from ir.node import CALL_FUNCTION
from transforms.rewrite import Rule, match, sizes
from transforms.rewrite.match import literal_equal, match_at
from transforms.rewrite_rules import ATTENTION

aten = torch.ops.aten

# --- helpers ------------------------------------------------------------------------------------


def _program(module: torch.nn.Module, args: tuple, level: str):
    ep = torch.export.export(module.eval(), args)
    return import_ep(ep.run_decompositions() if level == "core" else ep)


def bindings(rule: Rule, p, level: str, *, strict: bool = False, checked: bool = True) -> list:
    """Every binding of ``rule``'s pattern in ``p``'s root graph (one per anchor node), each
    through ``sizes.recheck`` when ``checked``: what the engine's ``_try`` sees."""
    g = p.root_module.graph
    table = {n.name: n for n in g.nodes}
    users: dict[str, list[str]] = {}
    by: dict[int, list] = {}
    for n in g.nodes:
        for r in n.inputs():
            users.setdefault(r.name, []).append(n.name)
        if n.op == CALL_FUNCTION:
            by.setdefault(id(n.target), []).append(n)
    c = rule.compiled(level)
    out = []
    for n in by.get(id(c.pattern.anchor.target), []):
        for b in match_at(c.pattern, n, table.get, lambda t: by.get(id(t), []), strict=strict):
            if checked:
                b = sizes.recheck(rule, c, b, table.get, level, users.get)
            if b is not None:
                out.append((b, table))
                break
    return out


def _targets(b, table) -> list:
    return sorted(str(table[a].target) for a in b.absorbed)


# --- typed literals -----------------------------------------------------------------------------


@pytest.mark.parametrize(("p", "t", "equal"), [
    (1, 1, True), (1, 1.0, False), (1.0, 1, False), (0.0, -0.0, False), (-0.0, -0.0, True),
    (True, 1, False), (1, True, False), (True, True, True), (math.nan, math.nan, True),
    (torch.float32, torch.float32, True), (torch.float32, torch.float64, False),
    (None, None, True), (None, 0, False), ("a", "a", True), (2.5, 2.5, True),
])
def test_literal_equal_keeps_the_types_that_alpha_keys_keep(p, t, equal):
    assert literal_equal(p, t) is equal


_NUMBERS = st.one_of(
    st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, math.inf]),
)


@settings(max_examples=60, deadline=None)
@given(_NUMBERS, _NUMBERS)
def test_literal_equal_is_equality_of_typed_alpha_keys(a, b):
    def key(x):
        return (type(x), x.hex() if type(x) is float else x)

    assert literal_equal(a, b) == (key(a) == key(b))
    assert literal_equal(a, b) == literal_equal(b, a)
    assert literal_equal(a, a)


class _TimesLiteral(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.neg(x) * 1.0


def _times_one(x):
    return x * 1


def test_an_int_literal_does_not_match_a_float_one_so_int_times_one_float_stays_float():
    rule = Rule(_times_one, lambda x: x, (torch.randn(4),), name="times_one_int", trusted=True)
    p = _program(_TimesLiteral(), (torch.arange(4),), "training")  # int64 * 1.0 -> float32
    assert bindings(rule, p, "training") == []


def test_the_matcher_calls_literal_equal_as_a_module_global(monkeypatch):
    # the teeth: put the old loose comparison back and the int64 `x * 1.0` matches `x * 1`
    rule = Rule(_times_one, lambda x: x, (torch.randn(4),), name="times_one_int", trusted=True)
    p = _program(_TimesLiteral(), (torch.arange(4),), "training")
    monkeypatch.setattr(match, "literal_equal", lambda a, b: a == b)
    assert len(bindings(rule, p, "training")) == 1


class _Scale(torch.nn.Module):
    def __init__(self, s) -> None:
        super().__init__()
        self.s = s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.s


@pytest.mark.parametrize(("scalar", "found"), [(3.0, [3.0]), (3, [])])
def test_a_float_sentinel_binds_float_literals_only(scalar, found):
    rule = Rule(lambda x, s: torch.relu(x) * s, lambda x, s: torch.relu(x) * s,
                (torch.randn(4), 2.0), name="scaled", trusted=True)
    p = _program(_Scale(scalar), (torch.randn(4),), "training")
    got = [b.scalars[1] for b, _ in bindings(rule, p, "training")]
    assert got == found and all(type(g) is float for g in got)


# --- ir.ops facts -------------------------------------------------------------------------------

_F32 = torch.empty(2, 3)


@pytest.mark.parametrize(("target", "args", "val_in", "val_out", "nothing"), [
    (aten.dropout.default, (None, 0.1, False), None, None, True),
    (aten.dropout.default, (None, 0.1, True), None, None, False),
    (aten.dropout.default, (None, 0.0, True), None, None, True),
    (aten.alias.default, (None,), None, None, True),
    (aten._to_copy.default, (None, None, None, None, None, False, None), _F32, _F32, True),
    (aten._to_copy.default, (None, torch.float64, None, None, None, False, None), _F32,
     _F32.double(), False),
    (aten.clone.default, (None, torch.contiguous_format), _F32.t(), _F32.t().contiguous(), True),
    (aten.clone.default, (None, None), None, None, False),  # no vals: unknown, so no
    (aten.to.dtype, (None, torch.float32, False, False, None), _F32, _F32, True),
    (aten.type_as.default, (None, None), _F32, _F32.int(), False),
    (aten.relu.default, (None,), _F32, _F32, False),
])
def test_computes_nothing(target, args, val_in, val_out, nothing):
    assert ops.computes_nothing(target, args, val_in, val_out) is nothing


@pytest.mark.parametrize(("target", "args", "rank", "dtype", "expected"), [
    (aten.transpose.int, (1, -1, -2), 4, torch.float32, (1, 2, 3)),
    (aten.transpose.int, (1, 3, 2), 4, torch.float32, (1, 2, 3)),
    (aten.transpose.int, (1, -1, -2), None, None, (1, -1, -2)),  # rank unknown: as written
    (aten.softmax.int, (1, -1, torch.float32), 3, torch.float32, (1, 2, None)),
    (aten.softmax.int, (1, -1, torch.float64), 3, torch.float32, (1, 2, torch.float64)),
    # an integer sum promotes to int64 without dtype: dtype=int32 is not the default there
    (aten.sum.dim_IntList, (1, [-1, 0], False, torch.int32), 2, torch.int32,
     (1, (0, 1), False, torch.int32)),
    (aten.permute.default, (1, [-1, 0]), 2, torch.float32, (1, (1, 0))),  # an order: kept
    (aten.unsqueeze.default, (1, -1), 2, torch.float32, (1, 2)),  # counts in the result
    (aten.view.default, (1, [-1, 4]), 2, torch.float32, (1, [-1, 4])),  # sizes are not dims
])
def test_canonical_args(target, args, rank, dtype, expected):
    assert ops.canonical_args(target, args, rank, dtype) == expected


def test_a_size_argument_that_is_the_result_shape_is_spelled_as_that_shape():
    view = aten.view.default
    assert ops.canonical_args(view, (1, [-1, 4]), 2, torch.float32, (3, 4)) == (1, (3, 4))
    assert ops.canonical_args(view, (1, [-1]), 2, torch.float32, (2, 3)) == (1, [-1])  # rank
    expand = aten.expand.default
    assert ops.canonical_args(expand, (1, [2, -1], False), 2, None, (2, 5)) == (1, (2, 5), False)
    # slice's bounds are sizes but not the result's shape
    assert ops.canonical_args(aten.slice.Tensor, (1, 0, 0, -1, 1), 2, None, (3, 4)) == (
        1, 0, 0, -1, 1)


def test_argument_kinds_come_from_the_schema():
    assert ops.facts(aten.view.default).size_args == (1,)
    assert ops.facts(aten.slice.Tensor).size_args == (2, 3, 4)
    assert ops.facts(aten.slice.Tensor).dim_args == (1,)
    assert ops.facts(aten.transpose.int).dim_args == (1, 2)
    assert ops.facts(aten.softmax.int).dtype_args == (2,)
    assert ops.is_metadata_check(aten._assert_tensor_metadata.default)
    assert not ops.is_metadata_check(aten._assert_async.msg)
    assert ops.facts(aten.view).size_args == ()  # a packet has no schema to read


# --- through what computes nothing, in one spelling ---------------------------------------------


class _Attn(torch.nn.Module):
    """Eager attention as transformers writes it, with its spellings as options."""

    def __init__(self, dims=(2, 3), dtype=False, to=True, train=False, cast=None) -> None:
        super().__init__()
        self.dims, self.dtype, self.to, self.train_, self.cast = dims, dtype, to, train, cast

    def forward(self, q, k, v, mask):
        w = torch.matmul(q, k.transpose(*self.dims)) * 0.125 + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32) if self.dtype else F.softmax(w, dim=-1)
        if self.to:
            w = w.to(q.dtype)
        if self.cast is not None:
            w = w.to(self.cast)
        w = F.dropout(w, p=0.1, training=self.train_)
        return torch.matmul(w.to(v.dtype), v)


def _plain(q, k, v, mask, s: float):
    return torch.softmax(q @ k.transpose(-2, -1) * s + mask, dim=-1) @ v


def _with_noops(q, k, v, mask, s: float):
    w = torch.softmax(q @ k.transpose(-2, -1) * s + mask, dim=-1).float().contiguous()
    return F.dropout(w, p=0.1, training=False) @ v


def _sdpa(q, k, v, mask, s: float):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s)


_QKV = tuple(torch.randn(2, 2, 5, 4) for _ in range(3))
_ARGS = (*_QKV, torch.randn(2, 1, 5, 5))
PLAIN = Rule(_plain, _sdpa, (*_ARGS, 0.5), name="plain", trusted=True)
NOOPS = Rule(_with_noops, _sdpa, (*_ARGS, 0.5), name="noops", trusted=True)


@pytest.mark.parametrize("level", ["training", "core"])
@pytest.mark.parametrize("rule", [PLAIN, NOOPS], ids=["plain", "noops"])
@pytest.mark.parametrize("spelling", [
    {}, {"dims": (-1, -2)}, {"dims": (3, 2)}, {"dtype": True}, {"to": False},
], ids=["bert", "gpt2", "swapped", "dtype", "no_to"])
def test_attention_matches_through_dropout_to_and_asserts_in_any_spelling(level, rule, spelling):
    p = _program(_Attn(**spelling), _ARGS, level)
    found = bindings(rule, p, level)
    assert len(found) == 1
    b, table = found[0]
    assert b.scalars == {4: 0.125}
    absorbed = _targets(b, table)
    # eval dropout is aten.dropout in the training IR, a clone after run_decompositions
    assert any("dropout" in t or "clone" in t for t in absorbed)
    if level == "training" and spelling.get("to", True):
        assert "aten._assert_tensor_metadata.default" in absorbed
    inside = {table[n].name for n in b.names.values()}
    assert not inside & set(b.absorbed)


@pytest.mark.parametrize("level", ["training", "core"])
@pytest.mark.parametrize("spelling", [{"train": True}, {"cast": torch.float64}],
                         ids=["train_dropout", "real_cast"])
def test_what_computes_something_is_not_looked_through(level, spelling):
    args = _ARGS
    p = _program(_Attn(**spelling), args, level)
    assert bindings(PLAIN, p, level) == []


def test_an_absorbed_node_is_never_a_matched_one_and_the_binding_is_typed():
    p = _program(_Attn(), _ARGS, "training")
    (b, table), = bindings(NOOPS, p, "training")
    assert len(set(b.absorbed)) == len(b.absorbed)
    assert all(table[a].op == CALL_FUNCTION for a in b.absorbed)
    assert isinstance(b.absorbed, tuple) and b.loose is False


# --- sizes as wildcards -------------------------------------------------------------------------


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v


_OTHER = tuple(torch.randn(3, 4, 7, 16) for _ in range(3))  # ATTENTION is traced at (2, 5, 8)


@pytest.mark.parametrize("level", ["training", "core"])
def test_the_shipped_attention_rule_matches_at_other_shapes_and_ranks(level):
    p = _program(_Attention(), _OTHER, level)
    found = bindings(ATTENTION, p, level)
    assert len(found) == 1
    assert found[0][0].scalars == {3: 0.25} and found[0][0].loose is False


def test_without_size_wildcards_the_decomposed_attention_matched_nothing():
    # the state before: sizes compared as literals (strict) at the core level
    p = _program(_Attention(), _OTHER, "core")
    assert bindings(ATTENTION, p, "core", strict=True, checked=False) == []
    loose = bindings(ATTENTION, p, "core", checked=False)
    assert len(loose) == 1 and loose[0][0].loose


class _FlatThenRelu(torch.nn.Module):
    def __init__(self, shape) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return torch.relu(x.view(*self.shape))


def _flat_relu(x):
    return torch.relu(x.flatten())


FLAT = Rule(_flat_relu, lambda x: torch.relu(x.reshape(-1)), (torch.randn(4, 8),), name="flat",
            trusted=True)


def test_a_loose_candidate_that_the_exact_pattern_refuses_is_dropped():
    # relu(x.flatten()) is view(x, [32]) at the example; a view to [8, 4] matches the loose
    # search (a size wildcard) but not the pattern traced at the matched input's shape
    p = _program(_FlatThenRelu((8, 4)), (torch.randn(32),), "core")
    assert len(bindings(FLAT, p, "core", checked=False)) == 1
    assert bindings(FLAT, p, "core") == []
    q = _program(_FlatThenRelu((-1,)), (torch.randn(6, 5),), "core")
    assert len(bindings(FLAT, q, "core")) == 1  # x.view(-1) is flatten at (6, 5)


def test_the_retrace_is_memoized_per_shapes_and_the_memo_is_bounded(monkeypatch):
    calls = []
    real = sizes.trace

    def counting(*a, **k):
        calls.append(a[2])
        return real(*a, **k)

    monkeypatch.setattr(sizes, "trace", counting)
    monkeypatch.setattr(sizes, "_MEMO", {})
    monkeypatch.setattr(sizes, "_MEMO_SIZE", 2)
    rule = Rule(_flat_relu, lambda x: torch.relu(x.reshape(-1)), (torch.randn(4, 8),),
                name="flat2", trusted=True)
    for shape in [(6, 5), (6, 5), (3, 3), (2, 7)]:
        p = _program(_FlatThenRelu((-1,)), (torch.randn(*shape),), "core")
        assert len(bindings(rule, p, "core")) == 1
        assert len(sizes._MEMO) <= 2
    assert len(calls) == 3  # (6, 5) traced once


def test_a_match_at_the_example_shapes_is_not_loose_and_needs_no_retrace(monkeypatch):
    monkeypatch.setattr(sizes, "trace", lambda *a, **k: pytest.fail("traced again"))
    p = _program(_Attention(), tuple(torch.randn(2, 5, 8) for _ in range(3)), "core")
    (b, _), = bindings(ATTENTION, p, "core")
    assert not b.loose


def test_what_run_decompositions_keeps_is_core_aten():
    # level_of reads it: a decomposed program keeps its asserts and size queries, and is
    # still at the core level (a pattern traced at the training level matches nothing there)
    for op in (aten._assert_tensor_metadata.default, aten._assert_scalar.default,
               aten.sym_size.int, aten.sym_constrain_range_for_size.default):
        assert ops.is_core_aten(op), op
    assert not ops.is_core_aten(aten.softmax.int)
