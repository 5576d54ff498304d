"""The generator as data: the step kinds' table (``ir.strategies.step_kinds``), the swarm's
shares (``ir.strategies.swarm``) and the byte decoding (``ir.strategies.decoding``) mean what
their docstrings say: a row's weight is its share of the body's draws, a feature off or a need
unmet takes its kind out, a new row is drawn with its weight and keeps the others' shares, and
a feature is on in its share of the flag bytes."""

from __future__ import annotations

import collections
from fractions import Fraction
from types import SimpleNamespace

import pytest

from ir import state as stt
from ir.args import Ref
from ir.strategies import step_kinds
from ir.strategies.decoding import back, decode_step, scattered
from ir.strategies.step_kinds import MOTIF, MOTIF_SLOT, STEP_KINDS, StepKind, pick_kind
from ir.strategies.swarm import DEFAULT_SHARE, FEATURES, FLAG_GROUPS, ON_SHARE, switched_on
from ir.strategies.vocabulary import WIDTH

# a module with a matrix, a state vector, a buffer and the large linears' pair
FULL_STATE = [("w0", stt.PARAMETER, (WIDTH, WIDTH)), ("w1", stt.PARAMETER, (WIDTH,)),
              ("b0", stt.BUFFER, (WIDTH,)), ("wl0", stt.PARAMETER, (256, WIDTH)),
              ("wl1", stt.PARAMETER, (WIDTH, 256))]
OUTSIDE = SimpleNamespace(preserved=False)
INSIDE = SimpleNamespace(preserved=True)


def _builder(on=frozenset(FEATURES), styles=("inplace_mutation",), inputs=("x0",)):
    return SimpleNamespace(on=on, styles_on=lambda: styles, user_inputs=list(inputs))


def _counts(b, state, scope, n, table=STEP_KINDS):
    return collections.Counter(pick_kind(b, state, scope, k, table) for k in range(n))


def _entries(b, state, scope, table=STEP_KINDS):
    """How many entries the body's kinds have (the motifs' shared one counted once)."""
    rows = [r for r in table if (r.feature is None or r.feature in b.on)
            and r.needs(b, state, scope)]
    return sum(r.weight for r in rows if r.role != MOTIF) + any(r.role == MOTIF for r in rows)


def test_every_row_has_a_kind_of_its_own_and_a_known_feature():
    kinds = [r.kind for r in STEP_KINDS]
    assert len(kinds) == len(set(kinds))
    assert MOTIF_SLOT not in kinds
    assert all(r.feature is None or r.feature in FEATURES for r in STEP_KINDS)
    assert all(r.weight >= 1 for r in STEP_KINDS)
    # the targeted and motif features each name one row (their steps at the root)
    special = [r.feature for r in STEP_KINDS if r.role in (step_kinds.TARGETED, MOTIF)]
    assert len(special) == len(set(special))
    assert [r.kind for r in step_kinds.MOTIFS] == [r.kind for r in STEP_KINDS if r.role == MOTIF]
    assert step_kinds.KIND["softmax"].role == MOTIF
    assert step_kinds.KIND["build"].role == step_kinds.TARGETED


def test_a_rows_weight_is_its_share_of_the_body_draws():
    b = _builder()
    n_entries = _entries(b, FULL_STATE, OUTSIDE)
    n_motifs = len(step_kinds.MOTIFS)
    counts = _counts(b, FULL_STATE, OUTSIDE, n_entries * n_motifs * 4)
    per_entry = n_motifs * 4
    assert counts["unary"] == per_entry
    assert counts["binary"] == counts["alpha"] == 2 * per_entry
    assert counts["matmul"] == counts["update"] == counts["mlp"] == per_entry
    # the motifs share one entry, evenly
    assert all(counts[r.kind] == 4 for r in step_kinds.MOTIFS)
    assert sum(counts.values()) == n_entries * per_entry


def test_a_feature_off_or_a_need_unmet_takes_its_kind_out():
    kinds = set(_counts(_builder(), FULL_STATE, OUTSIDE, 4096))
    assert {"unary", "binary", "alpha", "matmul", "update", "input_update", "mlp", "opset",
            "softmax", "build"} <= kinds
    off = _builder(on=frozenset(FEATURES) - {"kwargs_ops", "softmax", "constant_builders"})
    kinds = set(_counts(off, FULL_STATE, OUTSIDE, 4096))
    assert not kinds & {"alpha", "softmax", "build"}
    # no matrix, no buffer, no large linears: no matmul, update or mlp
    vector_only = [("w1", stt.PARAMETER, (WIDTH,))]
    kinds = set(_counts(_builder(), vector_only, OUTSIDE, 4096))
    assert not kinds & {"matmul", "update", "mlp"}
    # a buffer but no update style: no update; a preserved call: no input update
    assert "update" not in _counts(_builder(styles=()), FULL_STATE, OUTSIDE, 4096)
    assert "input_update" not in _counts(_builder(), FULL_STATE, INSIDE, 4096)
    assert "input_update" not in _counts(_builder(inputs=()), FULL_STATE, OUTSIDE, 4096)
    # no motif on: no shared entry, and the kinds are the others only
    no_motifs = _builder(on=frozenset(FEATURES) - {r.feature for r in step_kinds.MOTIFS})
    assert not set(_counts(no_motifs, FULL_STATE, OUTSIDE, 4096)) & {
        r.kind for r in step_kinds.MOTIFS}


def test_a_new_row_is_drawn_with_its_weight_and_the_others_keep_their_shares():
    def step(b, path, scope, vectors, a, y, z):
        return a

    table = (*STEP_KINDS, StepKind("new", step, feature="matrices", weight=3))
    b = _builder()
    before = _entries(b, FULL_STATE, OUTSIDE)
    counts = _counts(b, FULL_STATE, OUTSIDE, (before + 3) * 100, table)
    assert counts["new"] == 3 * counts["unary"] == 300
    # the others keep their shares; appended last, the bytes below the old entry count pick
    # as they did
    shipped = _counts(b, FULL_STATE, OUTSIDE, before * 100)
    assert all(counts[k] == n for k, n in shipped.items())
    assert [pick_kind(b, FULL_STATE, OUTSIDE, k, table) for k in range(before)] == [
        pick_kind(b, FULL_STATE, OUTSIDE, k) for k in range(before)]
    # switched off by its feature, the table draws as the shipped one does
    off = _builder(on=frozenset(FEATURES) - {"matrices"})
    assert _counts(off, FULL_STATE, OUTSIDE, 999, table) == _counts(off, FULL_STATE, OUTSIDE, 999)


class _ConstantDraws:
    """A ``draw`` that gives every byte string ``value`` in each byte, and counts its draws."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.draws = 0

    def __call__(self, strategy):
        self.draws += 1
        group = next(g for g in FLAG_GROUPS if g.strategy is strategy)
        return bytes([self.value]) * len(group.features)


@pytest.mark.parametrize("feature", ["opset", "symbolic_sizes", "edge_operands", "nesting",
                                     "grad_regions", "channels_last"])
def test_a_feature_is_on_in_its_share_of_the_flag_bytes(feature):
    if feature not in FEATURES:
        pytest.skip(f"{feature} is not a feature of this generator")
    allowed = frozenset(FEATURES)
    on = sum(feature in switched_on(_ConstantDraws(v), allowed, frozenset()) for v in range(256))
    assert Fraction(on, 256) == ON_SHARE.get(feature, DEFAULT_SHARE)


def test_flags_are_drawn_by_group_and_always_wins():
    base = FLAG_GROUPS[0].features
    draws = _ConstantDraws(0)
    assert switched_on(draws, frozenset(base), frozenset()) == frozenset()
    assert draws.draws == 1  # the opt-in and opset groups are not drawn when none is allowed
    draws = _ConstantDraws(255)
    assert switched_on(draws, frozenset(FEATURES), frozenset()) == frozenset(FEATURES)
    assert draws.draws == len(FLAG_GROUPS)
    # a feature not allowed stays off whatever its byte; one always on is on whatever its byte
    assert "nesting" not in switched_on(_ConstantDraws(255), frozenset(base) - {"nesting"},
                                        frozenset())
    assert "nesting" in switched_on(_ConstantDraws(0), frozenset(), frozenset({"nesting"}))
    # every feature is in exactly one group
    grouped = [f for g in FLAG_GROUPS for f in g.features]
    assert sorted(grouped) == sorted(FEATURES)


def test_decoding_a_step():
    assert decode_step(0, 0, 0) == (0, 0, 0, 0, 0)
    # bit 7 clear: one of the two latest values; set: any back-offset
    assert decode_step(0b0000_0011, 0x5A, 7) == (1, 7, 1, 0xA, 0x5)
    assert decode_step(0b1000_0100, 0, 0)[2] == 0b100_0010
    is_call, kind, x, y, z = scattered((1, 9, 3, 4, 5), mix=12345, at=7)
    assert (is_call, x) == (1, 3) and 0 <= kind < 256 and 0 <= y < 16 and 0 <= z < 16
    assert scattered((1, 9, 3, 4, 5), 12345, 7) != scattered((1, 9, 3, 4, 5), 12345, 10)
    vals = [Ref("a"), Ref("b"), Ref("c")]
    assert [back(vals, k).name for k in range(5)] == ["c", "b", "a", "c", "b"]
