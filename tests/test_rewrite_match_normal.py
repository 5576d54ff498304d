"""The matcher's normal form (issue 31, items 4 and 5, typed literals): literals keep their type;
nodes that compute nothing (eval dropout, same-dtype ``.to``, copies, ``alias``, metadata
asserts) are looked through and absorbed; dimensions and dtypes are spelled one way; sizes are
wildcards re-checked at the matched shapes (``transforms.rewrite.sizes.recheck``)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import import_ep, ops
from ir.memo import BoundedMemo
from ir.node import CALL_FUNCTION
from lowering.lowering_seam import decompositions_drop_eval_dropout
from transforms.rewrite import Rule, match, sizes
from transforms.rewrite.match import literal_equal, match_at
from transforms.rewrite_rules import ATTENTION_SCALED as ATTENTION

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


def test_an_int_literal_matches_the_same_float_where_the_dtypes_agree():
    # literals match by value (issue 36): float32 `x * 1.0` is `x * 1`, re-checked by dtype
    rule = Rule(_times_one, lambda x: x, (torch.randn(4),), name="times_one_f", trusted=True)
    p = _program(_TimesLiteral(), (torch.randn(4),), "training")
    assert len(bindings(rule, p, "training")) == 1
    assert bindings(rule, p, "training", checked=False)[0][0].loose


def test_the_recheck_calls_dtypes_agree_as_a_module_global(monkeypatch):
    # the teeth: without the dtype re-check the int64 `x * 1.0` (float) matches `x * 1`
    rule = Rule(_times_one, lambda x: x, (torch.randn(4),), name="times_one_int", trusted=True)
    p = _program(_TimesLiteral(), (torch.arange(4),), "training")
    monkeypatch.setattr(sizes, "dtypes_agree", lambda *a, **k: True)
    assert len(bindings(rule, p, "training")) == 1


@pytest.mark.parametrize(("p", "t", "same"), [
    (1, 1.0, True), (1.0, 1, True), (0, -0.0, False), (0, 0.0, True), (True, 1.0, False),
    (1, 1, False), (2, 2.5, False), (1, math.inf, False), (2**60, float(2**60) + 1, True),
])
def test_same_number_is_an_int_and_a_float_of_one_value(p, t, same):
    assert match.same_number(p, t) is same


class _Scale(torch.nn.Module):
    def __init__(self, s) -> None:
        super().__init__()
        self.s = s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.s


@pytest.mark.parametrize(("scalar", "found"), [(3.0, [3.0]), (3, [])])
def test_a_float_sentinel_binds_float_literals_only(scalar, found):
    rule = Rule(lambda x, s: torch.relu(x) * s, lambda x, s: torch.clamp(x, min=0) * s,
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


@functools.cache
def _attn_program(level: str, spelling: tuple):
    """The exported ``_Attn`` (programs are immutable: shared by the tests of both rules)."""
    return _program(_Attn(**dict(spelling)), _ARGS, level)


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
    p = _attn_program(level, tuple(sorted(spelling.items())))
    found = bindings(rule, p, level)
    assert len(found) == 1
    b, table = found[0]
    assert b.scalars == {4: 0.125}
    absorbed = _targets(b, table)
    # eval dropout is aten.dropout in the training IR; after run_decompositions a clone on
    # torch 2.13, nothing from 2.14 on (``decompositions_drop_eval_dropout``)
    dropped = level == "core" and decompositions_drop_eval_dropout()
    assert any("dropout" in t or "clone" in t for t in absorbed) != dropped, absorbed
    if level == "training" and spelling.get("to", True):
        assert "aten._assert_tensor_metadata.default" in absorbed
    inside = {table[n].name for n in b.names.values()}
    assert not inside & set(b.absorbed)


@pytest.mark.parametrize("level", ["training", "core"])
@pytest.mark.parametrize("spelling", [{"train": True}, {"cast": torch.float64}],
                         ids=["train_dropout", "real_cast"])
def test_what_computes_something_is_not_looked_through(level, spelling):
    p = _attn_program(level, tuple(sorted(spelling.items())))
    assert bindings(PLAIN, p, level) == []


def test_an_absorbed_node_is_never_a_matched_one_and_the_binding_is_typed():
    p = _attn_program("training", ())
    (b, table), = bindings(NOOPS, p, "training")
    assert len(set(b.absorbed)) == len(b.absorbed)
    assert all(table[a].op == CALL_FUNCTION for a in b.absorbed)
    assert isinstance(b.absorbed, tuple) and b.loose is False


# --- sizes as wildcards -------------------------------------------------------------------------


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v


_OTHER = tuple(torch.randn(3, 4, 7, 16) for _ in range(3))  # ATTENTION is traced at (2, 3, 5, 8)


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
    monkeypatch.setattr(sizes, "_MEMO", BoundedMemo(2))
    rule = Rule(_flat_relu, lambda x: torch.relu(x.reshape(-1)), (torch.randn(4, 8),),
                name="flat2", trusted=True)
    for shape in [(6, 5), (6, 5), (3, 3), (2, 7)]:
        p = _program(_FlatThenRelu((-1,)), (torch.randn(*shape),), "core")
        assert len(bindings(rule, p, "core")) == 1
        assert len(sizes._MEMO) <= 2
    assert len(calls) == 3  # (6, 5) traced once


def test_a_match_at_the_example_shapes_is_not_loose_and_needs_no_retrace(monkeypatch):
    monkeypatch.setattr(sizes, "trace", lambda *a, **k: pytest.fail("traced again"))
    examples = tuple(torch.randn(x.shape) for x in ATTENTION.example_inputs[:3])
    p = _program(_Attention(), examples, "core")
    (b, _), = bindings(ATTENTION, p, "core")
    assert not b.loose


def test_what_run_decompositions_keeps_is_core_aten():
    # level_of reads it: a decomposed program keeps its asserts and size queries, and is
    # still at the core level (a pattern traced at the training level matches nothing there)
    for op in (aten._assert_tensor_metadata.default, aten._assert_scalar.default,
               aten.sym_size.int, aten.sym_constrain_range_for_size.default):
        assert ops.is_core_aten(op), op
    assert not ops.is_core_aten(aten.softmax.int)


class _SiluThroughTo(torch.nn.Module):
    def __init__(self, first: bool) -> None:
        super().__init__()
        self.first = first

    def forward(self, x):
        y = torch.relu(x)
        if self.first:  # the input is read through a no-op once, directly once
            return y.clone() * torch.sigmoid(y)  # (`y.float()` is y itself to export)
        return y * torch.sigmoid(y.clone())


@pytest.mark.parametrize("first", [True, False])
def test_a_wildcard_bound_once_is_reached_again_through_a_no_op(first):
    silu = Rule(lambda x: x * torch.sigmoid(x), F.silu, (torch.randn(4),), name="silu_",
                trusted=True)
    p = _program(_SiluThroughTo(first), (torch.randn(4),), "training")
    (b, table), = bindings(silu, p, "training")
    assert table[b.names[silu.compiled("training").pattern.input_order[0]]].name == "relu"
    assert _targets(b, table) == ["aten.clone.default"]


class _Expand(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x.expand(3, 4))


def test_a_scalar_argument_used_as_a_size_is_bound_not_a_wildcard():
    rule = Rule(lambda x, n: torch.relu(x.expand(n, 4)), lambda x, n: torch.relu(x).expand(n, 4),
                (torch.randn(1, 4), 2), name="expand_n", trusted=True)
    p = _program(_Expand(), (torch.randn(1, 4),), "training")
    (b, _), = bindings(rule, p, "training")
    assert b.scalars == {1: 3}


def test_a_pattern_made_only_of_what_computes_nothing_is_refused_saying_so():
    from ir import PassError

    rule = Rule(lambda x: F.dropout(x.float(), 0.1, training=False), lambda x: x,
                (torch.randn(4),), name="nothing", trusted=True)
    with pytest.raises(PassError, match="computes nothing"):
        rule.compiled("training")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5).flatmap(lambda r: st.tuples(
    st.just(r), st.integers(-r, r - 1), st.integers(-r, r - 1),
    st.lists(st.integers(-r, r - 1), min_size=1, max_size=r, unique_by=lambda d: d % r),
)))
def test_canonical_dims_laws(case):
    rank, d0, d1, dims = case
    t = aten.transpose.int
    one = ops.canonical_args(t, ("x", d0, d1), rank, torch.float32)
    # either order, either sign: one spelling, positive and sorted; and idempotent
    assert one == ops.canonical_args(t, ("x", d1 % rank, d0 - rank if d0 >= 0 else d0), rank,
                                     torch.float32)
    assert one == ("x", *sorted((d0 % rank, d1 % rank)))
    assert ops.canonical_args(t, one, rank, torch.float32) == one
    s = aten.sum.dim_IntList
    summed = ops.canonical_args(s, ("x", dims, False, None), rank, torch.float32)
    assert summed == ("x", tuple(sorted(d % rank for d in dims)), False, None)
    p = aten.permute.default
    assert ops.canonical_args(p, ("x", dims), rank, None) == ("x", tuple(d % rank for d in dims))


class _Softmax(torch.nn.Module):
    def __init__(self, upcast: bool) -> None:
        super().__init__()
        self.upcast = upcast

    def forward(self, x):
        if self.upcast:
            return torch.relu(torch.softmax(torch.relu(x).float(), -1).to(x.dtype))
        return torch.relu(torch.softmax(torch.relu(x), -1))


def _upcast_softmax(x):
    return torch.relu(torch.softmax(torch.relu(x).float(), -1).to(x.dtype))


def _upcast_softmax_clamped(x):
    """``_upcast_softmax`` spelled otherwise (a rule whose replacement is its pattern is
    refused): these tests are about matching."""
    return torch.clamp(torch.softmax(torch.relu(x).float(), -1).to(x.dtype), min=0)


@pytest.mark.parametrize(("dtype", "upcast", "found"), [
    (torch.float32, False, 1),  # at the example's dtype the casts compute nothing
    (torch.float64, True, 1),  # they compute something at float64, and the program has them
    (torch.float64, False, 0),  # the program computes in float64 throughout: not the pattern
    (torch.float32, True, 1),  # casts to float32 of float32: nothing, in pattern and program
])
def test_what_computes_nothing_at_the_example_dtype_is_rechecked_at_the_match_dtype(
    dtype, upcast, found
):
    rule = Rule(_upcast_softmax, _upcast_softmax_clamped, (torch.randn(3, 4),), name="upcast",
                trusted=True)
    p = _program(_Softmax(upcast), (torch.randn(3, 4, dtype=dtype),), "training")
    assert len(bindings(rule, p, "training")) == found


def test_without_the_dtype_recheck_a_float64_program_would_match_a_float32_cast_pattern(
    monkeypatch,
):
    # the teeth: the pattern's casts are nothing at float32; at float64 they are what the
    # pattern computes, and a program without them computes something else (in float64)
    rule = Rule(_upcast_softmax, _upcast_softmax_clamped, (torch.randn(3, 4),), name="upcast2",
                trusted=True)
    p = _program(_Softmax(False), (torch.randn(3, 4, dtype=torch.float64),), "training")
    monkeypatch.setattr(sizes, "_other_dtypes", lambda *a: False)
    assert len(bindings(rule, p, "training")) == 1


class _Cat(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cat([torch.relu(x)], self.dim)


@pytest.mark.parametrize("dim", [-1, 1])
def test_a_list_of_tensors_gives_the_rank_for_its_dimension(dim):
    # cat's dimension counts in its first tensor's rank: -1 and 1 are one on a 2-D input
    rule = Rule(lambda x: torch.cat([torch.relu(x)], -1), lambda x: torch.relu(x),
                (torch.randn(3, 4),), name="cat1", trusted=True)
    p = _program(_Cat(dim), (torch.randn(2, 5),), "training")
    assert len(bindings(rule, p, "training")) == 1
    cat = next(n for n in p.root_module.graph.nodes if "cat" in str(n.target))
    table = {n.name: n for n in p.root_module.graph.nodes}
    assert match.normal_args(cat, table.get)[1] == 1


@pytest.mark.parametrize("level", ["training", "core"])
def test_the_shipped_attention_rewrite_at_other_shapes_computes_what_eager_does(level):
    from lowering import lower
    from transforms.rewrite import rewrite_report
    from transforms.rewrite_rules import ATTENTION_ASSUMES

    p = _program(_Attention(), _OTHER, level)
    q, report = rewrite_report(p, [ATTENTION], ATTENTION_ASSUMES)
    assert report.counts == {"attention": 1}
    assert not any("softmax" in str(n.target) for n in q.root_module.graph.nodes)
    torch.testing.assert_close(lower(q)(*_OTHER), _Attention()(*_OTHER))


class _Slice(torch.nn.Module):
    def __init__(self, stop: int) -> None:
        super().__init__()
        self.stop = stop

    def forward(self, x):
        return torch.relu(x[:, 1:self.stop])


@pytest.mark.parametrize(("stop", "loose", "kept"), [(3, False, True), (4, True, False)])
def test_an_int_size_equal_to_the_patterns_is_no_wildcard_another_is(stop, loose, kept):
    rule = Rule(lambda x: torch.relu(x[:, 1:3]), lambda x: torch.clamp(x[:, 1:3], min=0),
                (torch.randn(4, 6),), name="slice13", trusted=True)
    p = _program(_Slice(stop), (torch.randn(4, 6),), "core")
    (b, _), = bindings(rule, p, "core", checked=False)
    assert b.loose is loose
    assert (len(bindings(rule, p, "core")) == 1) is kept


def test_a_binding_made_elsewhere_absorbs_nothing_and_is_not_loose():
    # contract 2: Binding(names, scalars) is what the engine took before this change
    b = match.Binding({"x": "y"}, {})
    assert b.absorbed == () and b.loose is False


class _TwoResults(torch.nn.Module):
    def forward(self, x):
        s = torch.sigmoid(x)
        return torch.relu(s) + 1, s * 2


def _relu_sigmoid(x):
    s = torch.sigmoid(x)
    return torch.relu(s), s


def test_a_second_result_reached_from_the_anchor_is_matched_once():
    rule = Rule(_relu_sigmoid, lambda x: (torch.clamp(torch.sigmoid(x), min=0), torch.sigmoid(x)),
                (torch.randn(4),), name="two", trusted=True)
    p = _program(_TwoResults(), (torch.randn(4),), "training")
    (b, table), = bindings(rule, p, "training")
    pattern = rule.compiled("training").pattern
    assert {table[b.names[k]].name for k in pattern.nodes} == {"sigmoid", "relu"}
