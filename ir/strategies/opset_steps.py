"""Steps of :func:`ir.strategies.programs` that call operators of the verified table
(:mod:`ir.opset`), each with the arguments of one of its checked samples, so the call is valid
by construction.

A step picks a row (an index taken modulo the rows this program may draw) and one of its
samples (likewise), and makes each argument from the sample:

- a tensor the operator writes (``ir.opset.written_at``: a train-mode norm's running
  statistics, the first argument of an in-place variant) is a new buffer of the calling
  module, filled from the sample's spec: state the program writes, as a model's is;
- a tensor with exact values (an index, a structured input) is a new tensor constant with
  those values, so every index is in range whatever inputs the program is run on;
- another floating tensor is an earlier value of the same shape, dtype and strides when one is
  in scope (so operators chain), else a new user input (now and then a parameter); an integer
  or bool tensor is a new user input when :func:`ir.strategies.program_inputs`'s values
  (``0..9``, ``False/True``) fit its spec, else a constant from the spec;
- a strided spec (``stride=``) is honoured under ``strided_inputs`` (channels-last strides
  under ``channels_last``) by a ``permute`` of a contiguous input, or an ``as_strided`` view
  where no permutation has those strides; otherwise the argument is contiguous;
- every other argument is the sample's literal (lists become ``IList``).

The node's ``meta["val"]`` is the operator run on the arguments' fake values under the
program's fake mode (results share memory with the arguments exactly where the operator's
do). A step whose fake run fails (a data-dependent output shape, an operator without a fake
kernel) adds nothing: nothing is committed before the run succeeds.

Which rows a program may draw: those of its level (``core_level``: the rows of core aten, the
program after ``run_decompositions()``; else those of the training IR, ``torch.export``'s
default), never an effectful one, a random one only under ``random_ops``; and of a row, the
samples whose dtypes the program's features allow (``low_precision``: ``float16`` /
``bfloat16``; ``integer_values``, ``bool_values``: integer and bool tensors that are not exact
index values) and whose writes they allow (``train_norms``: a norm's running statistics;
``inplace_variants``: any other write). Which of those a step draws, by default: by how
many of the test zoo's models use each row's operator, above a uniform floor, each row's weight
divided by its :func:`availability` (the share of the swarm's feature sets that let a program
draw it), so that a row only some programs may draw is not drawn that much less often
(:func:`row_weights`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch
from hypothesis.errors import InvalidArgument

from ir.args import IList
from ir.opset import OpEntry, Sample, TensorSpec, table, written_at
from ir.printer import contiguous_strides
from ir.strategies.fake_calls import fake_call
from ir.strategies.forms import census, form_samples
from ir.strategies.signed_samples import signed_variants
from ir.torch_seam import OpOverload

__all__ = [
    "FORM_CALLS",
    "FORM_OP_SHARE",
    "FORM_SHARE",
    "FORM_USE_SHARE",
    "OPSET_FEATURES",
    "ROW_FEATURES",
    "availability",
    "fake_call",
    "form_units",
    "form_weights",
    "model_use",
    "opset_rows",
    "overload",
    "own_samples",
    "pick_form",
    "pick_row",
    "resolve_ops",
    "row_samples",
    "row_weights",
    "sample_features",
    "scatter",
]

OPSET_FEATURES = (
    "opset",
    "strided_inputs",
    "channels_last",
    "integer_values",
    "bool_values",
    "low_precision",
    "train_norms",
    "inplace_variants",
    "core_level",
)
"""The features of the opset steps (part of :data:`ir.strategies.FEATURES`): ``opset`` turns
the steps on; the others widen what they draw (module docstring). ``random_ops`` (a feature of
the fixed vocabulary too) lets them draw random rows."""

ROW_FEATURES = frozenset({*OPSET_FEATURES, "random_ops"})
"""The features that decide which rows and samples a program may draw (:func:`opset_rows`)."""

_LOW = (torch.float16, torch.bfloat16)
_NORM_WORDS = ("norm",)


def resolve_ops(ops: Collection[Any] | None) -> frozenset[str] | None:
    """The row names ``ops`` names (``OpOverload`` s, ``OpOverloadPacket`` s: all their rows,
    or names ``"aten.add.Tensor"``); None for every row. ``InvalidArgument`` naming ``ops``
    for a name with no row, or a value that is not a collection."""
    if ops is None:
        return None
    if isinstance(ops, str) or not isinstance(ops, Collection):
        raise InvalidArgument(f"ops must be a collection of operators or names, got {ops!r}")
    rows = table()
    names: set[str] = set()
    for op in ops:
        name = str(op)
        if name in rows:
            names.add(name)
            continue
        prefix = name + "."
        found = [n for n in rows if n.startswith(prefix)]
        if not found:
            raise InvalidArgument(
                f"ops names {name!r}, which has no row in ir.opset.table() (an overload such as "
                f"torch.ops.aten.add.Tensor, a packet such as torch.ops.aten.add, or a row name)")
        names.update(found)
    return frozenset(names)


def sample_features(e: OpEntry, sample: Sample) -> frozenset[str]:
    """The features a program needs to draw ``sample`` of row ``e`` (``opset`` always)."""
    need = {"opset"}
    for spec in _specs(sample.args) + _specs(tuple(v for _, v in sample.kwargs)):
        if spec.dtype in _LOW:
            need.add("low_precision")
        elif spec.values is None and spec.dtype == torch.bool:
            need.add("bool_values")
        elif spec.values is None and not (spec.dtype.is_floating_point or spec.dtype.is_complex):
            need.add("integer_values")
    if e.random:
        need.add("random_ops")
    if written_at(e, sample.args):
        need.add("train_norms" if _is_norm(e) else "inplace_variants")
    return frozenset(need)


_UNINITIALIZED = ("aten.empty.", "aten.empty_like.", "aten.empty_strided.", "aten.new_empty.",
                  "aten.new_empty_strided.", "aten.empty_permuted.", "aten.resize.",
                  "aten.resize_.", "aten.resize_as_.", "aten.resize_as.")


def uninitialized(e: OpEntry) -> bool:
    """``e``'s results hold memory no one wrote (``empty``, ``resize_``): a program that reads
    or returns them computes garbage, so the steps call them and read them no further."""
    return e.name.startswith(_UNINITIALIZED)


def _is_norm(e: OpEntry) -> bool:
    return any(w in e.name for w in _NORM_WORDS)


def _specs(args: tuple) -> tuple[TensorSpec, ...]:
    out: list[TensorSpec] = []
    for a in args:
        if isinstance(a, TensorSpec):
            out.append(a)
        elif isinstance(a, (tuple, list)):
            out += [x for x in a if isinstance(x, TensorSpec)]
    return tuple(out)


def opset_rows(
    on: frozenset[str], names: frozenset[str] | None
) -> tuple[tuple[OpEntry, Any, tuple[Sample, ...]], ...]:
    """``(row, overload, samples)`` a program with features ``on`` may draw, restricted to
    ``names`` (None: every row), in table order. Memoized per set of the features that decide
    it (:data:`ROW_FEATURES`); O(rows x samples) the first time."""
    return _opset_rows(on & ROW_FEATURES, names)


@functools.cache
def _opset_rows(
    on: frozenset[str], names: frozenset[str] | None
) -> tuple[tuple[OpEntry, Any, tuple[Sample, ...]], ...]:
    level = "core" if "core_level" in on else "training"
    out = []
    for e, op, needs in _drawable():
        if names is not None and e.name not in names:
            continue
        if e.levels and level not in e.levels:
            continue
        samples = tuple(s for s, need in needs if need <= on)
        if samples and names is not None:  # asked for: each sample's other signs as well
            samples += tuple(v for s, v in signed_variants(e.name, op, row_samples(e))
                             if any(s is k for k in samples))
        if samples:
            out.append((e, op, samples))
    return tuple(out)


@functools.cache
def _drawable() -> tuple[tuple[OpEntry, Any, tuple[tuple[Sample, frozenset[str]], ...]], ...]:
    """Every row a program may draw under some features (not effectful, with samples and an
    overload), with each sample's :func:`sample_features`; in table order."""
    out = []
    for name, e in table().items():
        samples = row_samples(e)
        if e.effectful or not samples:
            continue
        op = overload(name)
        if op is not None:
            out.append((e, op, tuple((s, sample_features(e, s)) for s in samples)))
    return tuple(out)


def row_samples(e: OpEntry) -> tuple[Sample, ...]:
    """The samples the steps may call row ``e`` with: its own (recorded when the table was
    built), then the examples of the census's forms of its operator, commonest first
    (``ir.strategies.forms.form_samples``: how real models call it), each once. O(samples)."""
    return _row_samples(e.name)


def own_samples(e: OpEntry, samples: tuple[Sample, ...]) -> int:
    """How many of ``samples`` (a row's samples a program may draw, :func:`opset_rows`: the
    row's own first) are ``e``'s own, recorded when the table was built. O(samples)."""
    n = 0
    for s in samples:
        if not any(s is t for t in e.samples):
            break
        n += 1
    return n


@functools.cache
def _row_samples(name: str) -> tuple[Sample, ...]:
    e = table()[name]
    out = list(e.samples)
    for _, _, sample in form_samples().get(name, ()):
        if sample not in out:
            out.append(sample)
    return tuple(out)


@functools.cache
def overload(name: str) -> Any:
    """The ``OpOverload`` named ``name`` (``"aten.add.Tensor"``); None when torch has none.
    Memoized; O(1)."""
    obj: Any = torch.ops
    try:
        for part in name.split("."):
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError):
        return None
    return obj if isinstance(obj, OpOverload) else None


MODEL_OPS = Path(__file__).resolve().parent / "model_ops.json"
"""How many of the test zoo's models use each operator in their training IR, and in how many
nodes (written by ``python -m bench.model_ops --write``; ``{name: {"models": m, "nodes": n}}``)."""

USE_SHARE = 0.1
"""The share of the default opset steps' row draws given to the operators the models use in
proportion to how many models use each (:func:`model_use`). It was 0.2 (and ``USED_SHARE``
0.35) before the census's form calls (:data:`FORM_SHARE`) drew the models' operators, every
one of them, the way they call them: now the rows no model calls have three quarters of the
row draws, and 200 default draws reach 360 to 414 operators (311 to 340 before)."""

USED_SHARE = 0.15
"""The share given evenly to the operators the models use, however many use each (so an
operator one model uses is drawn about as often as it would be at ``USE_SHARE`` were it used
by many). The rest, ``1 - USE_SHARE - USED_SHARE``, is uniform over every row: each row keeps
at least that share over the rows of each draw. Over the swarm each row is drawn within a
factor of two of its share (:func:`row_weights` divides by :func:`availability`; checked over
every feature set by ``tests/laws/test_opset_default.py``, nightly)."""


@functools.cache
def model_use() -> dict[str, int]:
    """Operator name -> how many models of the test zoo use it (:data:`MODEL_OPS`; empty when
    the file is missing). Read once; O(operators)."""
    try:
        counts = json.loads(MODEL_OPS.read_text())
    except FileNotFoundError:
        return {}
    return {name: int(c["models"]) for name, c in counts.items()}


_SWARM_FLAGS = ROW_FEATURES - {"opset", "core_level"}
"""The features that decide whether a program may draw a sample, each on in about half the
draws of the swarm (``programs()``'s flag bytes); ``core_level`` picks the level."""


@functools.cache
def availability(name: str) -> float:
    """The share of the swarm's feature sets under which a program may draw row ``name``: its
    level's half (a row of one level; 1 for a row of both), times the share of the
    :data:`_SWARM_FLAGS` subsets (each on with probability 1/2) that allow one of its samples
    (:func:`sample_features`). 0 for a row no default program draws (effectful, no sample, no
    overload). Memoized; O(2 ** features a row's samples need)."""
    e = table().get(name)
    if e is None or e.effectful or not row_samples(e) or overload(name) is None:
        return 0.0
    level = 1.0 if not e.levels or {"core", "training"} <= e.levels else 0.5
    needs = {sample_features(e, s) - {"opset"} for s in row_samples(e)}
    flags = sorted(set().union(*needs))
    allowed = sum(any(n <= on for n in needs) for on in _subsets(flags))
    return level * allowed / 2 ** len(flags)


def _subsets(flags: list[str]) -> Iterator[frozenset[str]]:
    for k in range(len(flags) + 1):
        for on in itertools.combinations(flags, k):
            yield frozenset(on)


def row_weights(on: frozenset[str], names: frozenset[str] | None) -> tuple[float, ...]:
    """Running sums of the weights of :func:`opset_rows` ``(on, names)``, what
    :func:`pick_row` reads: :data:`USE_SHARE` of the mass in proportion to how many models use
    each row's operator (:func:`model_use`), :data:`USED_SHARE` evenly among the operators they
    use, the rest uniform over the rows (all uniform when no row's operator is used); each
    row's weight then divided by its :func:`availability`, so that over the swarm's feature
    sets a row that only some programs may draw (a random row, an in-place variant, a row of
    one level) is drawn as often as its share says, not that share times its availability.
    Memoized per feature set, as the rows are; O(rows)."""
    return _row_weights(on & ROW_FEATURES, names)


@functools.cache
def _row_weights(on: frozenset[str], names: frozenset[str] | None) -> tuple[float, ...]:
    use = model_use()
    rows = opset_rows(on, names)
    weights = [use.get(e.name, 0) for e, _, _ in rows]
    total, used = sum(weights), sum(1 for w in weights if w)
    floor = 1 - USE_SHARE - USED_SHARE if total else 1.0
    out, running = [], 0.0
    for (e, _, _), w in zip(rows, weights):
        weight = floor / len(rows)
        if w:
            weight += USE_SHARE * w / total + USED_SHARE / used
        running += weight / (availability(e.name) or 1.0)
        out.append(running)
    return tuple(out)


FORM_SHARE = 1.0
"""The chance of each of a default opset step's :data:`FORM_CALLS` calls of a form of the
census (how real models call an operator: ``ir.strategies.forms``), drawn by
:func:`form_weights`, besides the step's row: every call, since the floor of "every operator
the models call in 200 draws" is set by the number of calls (three calls at 75 % missed an
operator on two streams of 14, at 100 % on one). The calls are outside the program's node budget (``programs()``'s
``max_nodes``): taken from it, they cut the steps that reach the table's rows no model calls."""

FORM_CALLS = 3
"""The most census forms one default opset step calls (each with chance :data:`FORM_SHARE`).
An operator's calls in 200 draws are a count of rare events, missed on a stream with about
``exp(-calls)`` chance; hypothesis draws programs whose steps repeat an earlier program's bytes
(a third of the form draws of 200 programs repeated one), which widens that spread. Measured on
14 streams of 200 default draws (the derandomized one and seeds 1 to 13): two calls at 75 %
missed an operator of the census on most streams (the rarest at about 3 programs of 200), three
calls at 100 % on one stream of 14 (the rarest at about 7), for 24 % more nodes."""

FORM_USE_SHARE = 0.1
"""Of the census draws, the share in proportion to how many of the models' calls have each
form (:func:`form_weights`)."""

FORM_OP_SHARE = 0.7
"""Of the census draws, the share even over the census's operators (each operator's part even
over its forms), so that an operator of one rare form is drawn as often as one of twenty: it
is the floor under every operator's count. The rest, ``1 - FORM_USE_SHARE - FORM_OP_SHARE``, is
even over the forms: a form one call in ten thousand has is drawn as well as the commonest. At
0.2 (even over forms 0.7), the operators of many forms took most draws (``view``, ``full``,
``slice``: 190 to 240 calls in 800 programs) and those of one form 8 to 12. Each operator's
part is scaled by :func:`form_boosts`, so that the swarm as a whole, not one feature set,
draws every operator alike."""


def form_units(on: frozenset[str], names: frozenset[str] | None) -> tuple[tuple[int, int], ...]:
    """``(row index, sample index)`` into :func:`opset_rows` ``(on, names)`` of each census
    form a program with features ``on`` may call, in the rows' order, each row's forms
    commonest first. Memoized per feature set; O(forms)."""
    return _form_table(on & ROW_FEATURES, names)[0]


def form_weights(on: frozenset[str], names: frozenset[str] | None) -> tuple[float, ...]:
    """Running sums of the weights of :func:`form_units` (what :func:`pick_row` reads):
    :data:`FORM_USE_SHARE` of the mass by the form's uses, :data:`FORM_OP_SHARE` even over
    the census's operators, the rest even over its forms, each divided by the share of the swarm's feature sets that let a program call it
    (its row's level, a half per feature its example needs), so that over the swarm a form is
    drawn in proportion to its weight. Empty when the census is. Memoized; O(forms)."""
    return _form_table(on & ROW_FEATURES, names)[1]


@functools.cache
def _form_table(on: frozenset[str], names: frozenset[str] | None
                ) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    boosts = form_boosts()
    units: list[tuple[int, int]] = []
    cumulative: list[float] = []
    running = 0.0
    for i, (e, _, samples) in enumerate(opset_rows(on, names)):
        for _, uses, sample in form_samples().get(e.name, ()):
            if sample not in samples:
                continue  # a feature this program lacks
            by_uses, even, uniform = _weight_parts(e.name, uses)
            running += (by_uses + even * boosts.get(e.name, 1.0) + uniform) / _swarm_share(
                e, sample)
            units.append((i, samples.index(sample)))
            cumulative.append(running)
    return tuple(units), tuple(cumulative)


@functools.cache
def _census_forms() -> tuple[tuple[Any, ...], dict[str, int], int]:
    """The census's forms that have an example, how many of them each operator has, and the
    uses of them all. Memoized; O(forms)."""
    every = tuple(f for f in census().values() if f.example is not None)
    per_op: dict[str, int] = {}
    for f in every:
        per_op[f.op] = per_op.get(f.op, 0) + 1
    return every, per_op, sum(f.uses for f in every)


def _weight_parts(op: str, uses: int) -> tuple[float, float, float]:
    """A census form's weight (of operator ``op``, called ``uses`` times) in its three parts:
    :data:`FORM_USE_SHARE` by its uses, :data:`FORM_OP_SHARE` even over the operators (the
    part :func:`form_boosts` scales), the rest even over the forms. O(1)."""
    every, per_op, total = _census_forms()
    return (FORM_USE_SHARE * uses / total, FORM_OP_SHARE / len(per_op) / per_op[op],
            (1 - FORM_USE_SHARE - FORM_OP_SHARE) / len(every))


def _swarm_share(e: OpEntry, sample: Sample) -> float:
    """The share of the swarm's feature sets that let a program call row ``e`` with
    ``sample``: its level's (a half unless it is drawn at both), a half per feature the sample
    needs. O(arguments)."""
    level = 1.0 if not e.levels or {"core", "training"} <= e.levels else 0.5
    return level * 0.5 ** len(sample_features(e, sample) - {"opset"})


FORM_FIT_ROUNDS = 60
"""Rounds of :func:`form_boosts`' fit (each a pass over the swarm's feature sets)."""


@functools.cache
def form_boosts() -> dict[str, float]:
    """Operator name -> the factor on its forms' share of the census draws that is even over
    the operators (:data:`FORM_OP_SHARE`), fitted so that over the default swarm's feature
    sets every operator of the census gets the same expected number of those draws (one
    program's draws are normalized over the forms it may call, so dividing a form's weight by
    its availability alone left the operators whose forms need features at about half an
    even share). Memoized; O(rounds x feature sets x forms) tensor work, once per process."""
    every, _, _ = _census_forms()
    drawable = {e.name: e for e, _, _ in _drawable()}
    forms = [f for f in every if f.op in drawable]
    if not forms:
        return {}
    ops = sorted({f.op for f in forms})
    flags = sorted(ROW_FEATURES - {"opset"})
    needs = [sample_features(drawable[f.op], f.example) for f in forms]
    levels = [drawable[f.op].levels for f in forms]
    parts = [_weight_parts(f.op, f.uses) for f in forms]
    share = torch.tensor([_swarm_share(drawable[f.op], f.example) for f in forms],
                         dtype=torch.float64)
    rows = []
    for mask in range(2 ** len(flags)):
        on = {"opset"} | {f for k, f in enumerate(flags) if mask >> k & 1}
        level = "core" if "core_level" in on else "training"
        rows.append([float(need <= on and (not lv or level in lv))
                     for need, lv in zip(needs, levels)])
    avail = torch.tensor(rows, dtype=torch.float64)
    rest = torch.tensor([by_uses + uniform for by_uses, _, uniform in parts],
                        dtype=torch.float64) / share
    even = torch.tensor([by_ops for _, by_ops, _ in parts], dtype=torch.float64) / share
    index = {op: k for k, op in enumerate(ops)}
    of_op = torch.tensor([index[f.op] for f in forms])
    boost = torch.ones(len(ops), dtype=torch.float64)
    for _ in range(FORM_FIT_ROUNDS):
        mass = even * boost[of_op]
        drawn = avail * mass / (avail @ (rest + mass)).unsqueeze(1)
        per = torch.zeros(len(ops), dtype=torch.float64).index_add_(0, of_op, drawn.mean(0))
        boost = boost * per.mean() / per
        got = per.sum()
        boost = boost * (FORM_OP_SHARE / (1 - FORM_OP_SHARE)) / (got / (1 - got))
    return {op: float(b) for op, b in zip(ops, boost)}


_FORM_SALT = 0x666F726D  # "form": the census draw's own stream of ``h``


def pick_form(on: frozenset[str], h: int, used: Collection[int]) -> int | None:
    """Whether a default opset step of a program with features ``on`` calls a census form,
    and which (an index into :func:`form_units` ``(on, None)``), from its 64-bit number ``h``:
    None for :data:`FORM_SHARE` of the numbers' complement (the step calls no form) or
    when the census has no form for ``on``; else the form :func:`form_weights` picks, the next
    one not in ``used`` where it is (every form once per program). Deterministic; O(log forms)
    unless most forms are used."""
    units = form_units(on, None)
    first = scatter(h, _FORM_SALT)
    if not units or (first & 0xFFFF) >= FORM_SHARE * 0x10000:
        return None
    k = pick_row(form_weights(on, None), scatter(first, _FORM_SALT))
    for _ in range(len(units)):
        if k not in used:
            break
        k = (k + 1) % len(units)
    return k


def pick_row(cumulative: tuple[float, ...], h: int) -> int:
    """The index of the row (of weights ``cumulative``: :func:`row_weights`) that the 64-bit
    number ``h`` (:func:`scatter`'s) picks: each row with the chance its weight gives it.
    Deterministic; O(log rows)."""
    u = (h & _MASK) / (1 << 64) * cumulative[-1]
    return min(bisect.bisect_right(cumulative, u), len(cumulative) - 1)


def is_channels_last(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """``stride`` is the channels-last layout of the 4-d ``shape``."""
    if len(shape) != 4:
        return False
    _, c, h, w = shape
    return tuple(stride) == (h * w * c, 1, w * c, c)


def permutation_for(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """``perm`` with ``empty(shape[perm]).permute(inverse(perm))`` of strides ``stride``; None
    when no permutation of a contiguous tensor has them."""
    perm = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    base = contiguous_strides([shape[d] for d in perm])
    got = [0] * len(shape)
    for k, d in enumerate(perm):
        got[d] = base[k]
    if all(g == s or shape[d] == 1 for d, (g, s) in enumerate(zip(got, stride))):
        return tuple(perm)
    return None


class Plan:
    """What one opset step adds, kept aside until its fake run succeeds: new placeholders
    (``(kind, name, val, real tensor or None)``) and layout nodes (``(name, target, args,
    val)``)."""

    def __init__(self) -> None:
        self.placeholders: list[tuple[str, str, Any, Any]] = []
        self.layout: list[tuple[str, Any, tuple, Any]] = []


def literal(a: Any) -> Any:
    """A sample's non-tensor argument as a node argument (lists and tuples as ``IList``)."""
    if isinstance(a, (list, tuple)):
        return IList(tuple(literal(x) for x in a))
    return a


def result_tensors(val: Any) -> list[tuple[int | None, Any]]:
    """``(index, fake tensor)`` of each tensor result (index None: the result itself)."""
    if isinstance(val, torch.Tensor):
        return [(None, val)]
    if isinstance(val, (tuple, list)):
        return [(i, v) for i, v in enumerate(val) if isinstance(v, torch.Tensor)]
    return []



_MASK = (1 << 64) - 1


def scatter(*parts: int) -> int:
    """A 64-bit number that each of ``parts`` (non-negative ints) changes everywhere (a
    splitmix64 finalizer over their running sum): draws that differ in one small byte pick
    far-apart rows. Deterministic; O(len(parts))."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h + p * 0xBF58476D1CE4E5B9 + 0x9E3779B97F4A7C15) & _MASK
        h ^= h >> 30
        h = (h * 0xBF58476D1CE4E5B9) & _MASK
        h ^= h >> 27
        h = (h * 0x94D049BB133111EB) & _MASK
        h ^= h >> 31
    return h
