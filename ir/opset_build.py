"""The builder of the verified operator table: ``python -m ir.opset_build`` writes
``ir/opset_table.py``.

Two phases, each a command (the first is slow, so its result is kept in a file):

1. ``collect OUT.pkl``: export programs with ``torch.export.export`` (the training IR) and
   ``.run_decompositions()`` (core aten), run each with an ``fx.Interpreter`` that records the
   concrete arguments of every ``OpOverload`` call, and keep a few calls per operator. The
   programs: every OpInfo of ``op_db`` (needs ``expecttest``; a few float32 samples each, then
   the first dtype an OpInfo supports when float32 is not one; samples that fail to export are
   skipped), the models of the test zoo (``tests/zoo.py``, ``tests/zoo_hf.py``, training-IR
   variants) and the models of this module (train- and eval-mode norms, dropout, copies).
2. ``write IN.pkl [ir/opset_table.py]``: for each operator, calls of its own (``OWN_SAMPLES``)
   for core aten operators no program reached, then observe it on real tensors
   (``ir.opset.run_sample``): which arguments each call writes (a write seen under some
   argument values only becomes a ``Write`` conditioned on the bool argument that separates
   them), which results share storage with which arguments, whether results depend on the
   seed. The schema's declared writes and aliases are kept too (the table is never less
   conservative than the schema). Every row is checked with ``ir.opset.check_entry`` before it
   is written; a row torch contradicts is reported and left out.

``python -m ir.opset_build all`` runs both. The builder is a tool, not part of the analysis:
nothing in ``ir``, ``transforms`` or ``lowering`` imports it.
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ir import ops as op_facts
from ir.literals import PRELUDE, scalar_literal
from ir.op_observe import entry_of, observe
from ir.opset import check_entry, resolve
from ir.opset_entry import CORE, TRAINING, OpEntry, Sample, TensorSpec, Write
from ir.torch_seam import OpOverload, op_schema, opinfo_db, pytree

ROOT = Path(__file__).resolve().parents[1]
MAX_CALLS = 8  #: calls kept per operator (observed); at most two become samples
MAX_NUMEL = 4096  #: a call with a larger tensor argument is not kept
MAX_EXACT_FLOAT = 256  #: float tensors up to this size keep their exact values as a fallback
SAMPLES_PER_OPINFO = 2

# --- phase 1: recording calls ---------------------------------------------------------------------


class Calls:
    """The calls recorded per operator name: ``{name: [(args, kwargs, source, level)]}``."""

    def __init__(self) -> None:
        self.by_op: dict[str, list[tuple]] = {}
        self.keys: dict[str, set] = {}
        self.levels: dict[str, set[str]] = {}
        self.sources: dict[str, str] = {}

    def add(self, op: OpOverload, args: tuple, kwargs: dict, source: str, level: str) -> None:
        name = str(op)
        self.levels.setdefault(name, set()).add(level)
        self.sources.setdefault(name, source)
        kept = self.by_op.setdefault(name, [])
        if len(kept) >= MAX_CALLS:
            return
        call = _normal_call(op, args, kwargs)
        if call is None:
            return
        key = _diversity_key(call)
        seen = self.keys.setdefault(name, set())
        if key in seen and len(kept) >= 2:
            return
        seen.add(key)
        kept.append((*call, source, level))


def _normal_call(op: OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    """``(args, kwargs)`` in ``Sample``'s form: every positional parameter in schema order
    (defaults filled), keyword-only ones given as keywords; tensors as exact ``TensorSpec``s.
    ``None`` when an argument cannot be recorded (a large or unusual tensor, a generator)."""
    schema = op_schema(op)
    out: list[Any] = []
    kw: list[tuple[str, Any]] = []
    given = dict(kwargs)
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            value = args[i]
        elif a.name in given:
            value = given.pop(a.name)
        elif a.has_default_value():
            value = a.default_value
            if a.kwarg_only:
                continue
        else:
            return None
        spec = _record(value)
        if spec is _BAD:
            return None
        if a.kwarg_only:
            kw.append((a.name, spec))
        else:
            out.append(spec)
    return tuple(out), tuple(kw)


_BAD = object()


def _record(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _spec(value)
    if isinstance(value, (list, tuple)):
        items = tuple(_record(v) for v in value)
        return _BAD if any(i is _BAD for i in items) else items
    if isinstance(value, (bool, int, float, complex, str, type(None), torch.dtype, torch.device,
                          torch.layout, torch.memory_format)):
        return value
    return _BAD


def _spec(t: torch.Tensor) -> Any:
    if (t.layout != torch.strided or t.is_quantized or t.device.type != "cpu"
            or t.numel() > MAX_NUMEL or type(t) is not torch.Tensor and
            not isinstance(t, nn.Parameter)):
        return _BAD
    t = t.detach()
    stride = None if t.is_contiguous() else tuple(t.stride())
    flat = t.contiguous().reshape(-1)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        finite = flat[torch.isfinite(flat)] if flat.numel() else flat
        real = finite.real if t.dtype.is_complex else finite
        low = float(real.min()) if real.numel() else -3.0
        high = float(real.max()) if real.numel() else 3.0
        exact = tuple(flat.tolist()) if flat.numel() <= MAX_EXACT_FLOAT else None
        return _Recorded(tuple(t.shape), t.dtype, stride, low, max(high, low), exact)
    return TensorSpec(tuple(t.shape), t.dtype, stride, values=tuple(flat.tolist()))


class _Recorded(TensorSpec):
    """A recorded float tensor: drawn values in ``[low, high]``; ``exact`` keeps its values."""

    def __init__(self, shape, dtype, stride, low, high, exact) -> None:
        super().__init__(shape, dtype, stride, low, high)
        object.__setattr__(self, "exact", exact)

    def __reduce__(self):
        return (_Recorded, (self.shape, self.dtype, self.stride, self.low, self.high, self.exact))


def _diversity_key(call: tuple) -> tuple:
    """What makes two calls worth keeping both: literal arguments and tensor dtypes/strides."""
    def key(v: Any) -> Any:
        if isinstance(v, TensorSpec):
            return ("T", v.dtype, v.stride is not None, len(v.shape))
        if isinstance(v, tuple):
            return tuple(key(x) for x in v)
        return v if isinstance(v, (bool, type(None), str)) else type(v).__name__
    return key(call)


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, calls: Calls, source: str, level: str) -> None:
        super().__init__(gm)
        self.calls, self.source, self.level = calls, source, level

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if isinstance(target, OpOverload):
            self.calls.add(target, args, kwargs, self.source, self.level)
        return super().call_function(target, args, kwargs)


def flat_inputs(ep: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list[Any]:
    """The flat inputs of ``ep``'s graph for a call with ``(args, kwargs)``: its state and
    constants in signature order, then the user inputs (``None`` for a token). O(inputs)."""
    user = iter(pytree.tree_leaves((args, kwargs)))
    kinds = torch.export.graph_signature.InputKind
    out: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (kinds.PARAMETER, kinds.BUFFER):
            out.append(ep.state_dict[spec.target] if spec.target in ep.state_dict
                       else ep.constants[spec.target])
        elif spec.kind in (kinds.CONSTANT_TENSOR, kinds.CUSTOM_OBJ):
            out.append(ep.constants[spec.target])
        elif spec.kind == kinds.USER_INPUT:
            out.append(next(user))
        else:
            out.append(None)
    return out


def record_program(calls: Calls, ep: torch.export.ExportedProgram, args: tuple, kwargs: dict,
                   source: str, level: str) -> None:
    """Run ``ep`` on fresh copies of its state and ``args`` and record every operator call."""
    ep_args = pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v,
                              (args, kwargs))
    flat = flat_inputs(ep, *ep_args)
    flat = [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in flat]
    with torch.no_grad():
        _Recorder(ep.graph_module, calls, source, level).run(*flat)


def record_both(calls: Calls, make: Callable[[], nn.Module], args: tuple, kwargs: dict,
                source: str, **export_kw: Any) -> None:
    """Export ``make()`` on ``args``, record its training IR, decompose, record core aten."""
    ep = torch.export.export(make(), args, kwargs, **export_kw)
    record_program(calls, ep, args, kwargs, source, TRAINING)
    core = ep.run_decompositions()
    record_program(calls, core, args, kwargs, source, CORE)


class _Call(nn.Module):
    """Calls ``fn`` on the tensors given and the constant rest of one OpInfo sample."""

    def __init__(self, fn: Callable, spec: Any, consts: list, where: list[int]) -> None:
        super().__init__()
        self.fn, self.spec, self.consts, self.where = fn, spec, consts, where

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.consts)
        for i, t in zip(self.where, tensors):
            leaves[i] = t
        a, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.fn(a, *args, **kwargs)


def collect_opinfo(calls: Calls, log: Callable[[str], None], deadline: float,
                   start: int = 0, stop: int | None = None) -> dict[str, int]:
    """Record the calls export makes for the OpInfos ``op_db[start:stop]`` (a few samples
    each), until ``deadline`` (a ``time.time()``)."""
    op_db = opinfo_db()

    reached: dict[str, int] = {}
    for n, info in enumerate(op_db):
        if n < start or (stop is not None and n >= stop):
            continue
        if time.time() > deadline:
            log(f"opinfo: deadline reached at {n}/{len(op_db)}")
            break
        name = f"opinfo:{info.name}{'.' + info.variant_test_name if info.variant_test_name else ''}"
        dtypes = info.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in dtypes else next(iter(sorted(dtypes, key=str)),
                                                                    None)
        if dtype is None:
            continue
        ok = tried = 0
        try:
            samples = info.sample_inputs("cpu", dtype, requires_grad=False)
            for s in samples:
                if ok >= SAMPLES_PER_OPINFO or tried >= 2 * SAMPLES_PER_OPINFO:
                    break
                tried += 1
                leaves, spec = pytree.tree_flatten((s.input, tuple(s.args), dict(s.kwargs)))
                where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
                tensors = tuple(leaves[i] for i in where)
                consts = [None if isinstance(v, torch.Tensor) else v for v in leaves]
                try:
                    module = _Call(info.op, spec, consts, where)
                    record_both(calls, lambda m=module: m, tensors, {},
                                name, strict=False)
                    ok += 1
                except Exception:  # noqa: BLE001, S112 - samples that fail to export are skipped
                    continue
        except Exception as err:  # noqa: BLE001 - an OpInfo whose samples cannot be made
            log(f"{name}: no samples ({type(err).__name__})")
        reached[name] = ok
        if n % 25 == 0:
            log(f"opinfo {n}/{len(op_db)}: {len(calls.by_op)} operators so far")
    return reached


# --- models ---------------------------------------------------------------------------------------


class _FunctionalBN(nn.Module):
    def __init__(self, training: bool) -> None:
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))
        self.w = nn.Parameter(torch.ones(3))
        self.training_flag = training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.rm, self.rv, self.w, None, training=self.training_flag)


class _FunctionalIN(nn.Module):
    def __init__(self, use_input_stats: bool) -> None:
        super().__init__()
        self.register_buffer("rm", torch.zeros(3))
        self.register_buffer("rv", torch.ones(3))
        self.use = use_input_stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.instance_norm(x, self.rm, self.rv, use_input_stats=self.use)


class _TrainBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.inorm = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
        self.bn1 = nn.BatchNorm1d(3)
        self.ln = nn.LayerNorm(4)
        self.gn = nn.GroupNorm(1, 3)
        self.drop = nn.Dropout(0.2)
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.inorm(self.bn(self.conv(x))))
        self.count.add_(1)
        z = self.bn1(y.flatten(2).mean(-1, keepdim=True))
        return self.gn(self.ln(y)) + z.unsqueeze(-1) + torch.rsqrt(self.bn.running_var + 1e-5)[
            None, :, None, None]


def _trained(module: nn.Module, train: bool) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        torch.manual_seed(0)
        m = module()
        return m.train(train)
    return make


class TinyCNN(nn.Module):
    """A small vision model: strided and padded convolutions, pooling of every kind, group
    norm, padding, clamping, hard activations (in place too), global average pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.act = nn.Hardswish(inplace=True)
        self.conv = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2, stride=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.conv1 = nn.Conv1d(8, 4, 3, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.gn(self.stem(x)))
        y = F.pad(y, (1, 1, 1, 1))
        y = self.pool(self.conv(y))
        y = self.avg(y).clamp(-6.0, 6.0) * F.hardsigmoid(y[:, :, :1, :1])
        seq = self.conv1(y.flatten(2))
        pooled = self.gap(y).flatten(1) + y.mean((2, 3))
        return self.head(pooled) + seq.sum()


class TinyTransformer(nn.Module):
    """A small language model: embeddings, a causal mask by ``triu`` / ``tril`` and
    ``masked_fill`` with -inf, attention by ``einsum``, ``roll``, ``cumsum`` positions,
    ``argmax`` and ``index_select`` decoding, ``unbind``, ``new_zeros``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.qkv = nn.Linear(8, 24)
        self.norm = nn.LayerNorm(8, eps=1e-6)
        self.drop = nn.Dropout(0.0)
        self.out = nn.Linear(8, 11)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        pos = torch.ones_like(ids).cumsum(-1) - 1
        h = self.emb(ids) + self.emb(pos)
        q, k, v = self.qkv(self.norm(h)).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / 2.0
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill_(causal, float("-inf"))
        att = self.drop(scores.softmax(-1))
        ctx = torch.einsum("bhqk,bhkd->bhqd", att, v).transpose(1, 2).reshape(b, s, 8)
        ctx = ctx + torch.roll(ctx, 1, 1) * torch.ones(s, s).tril().sum(-1, keepdim=True)
        logits = self.out(ctx)
        best = logits.argmax(-1)
        picked = self.emb.weight.index_select(0, best[0])
        extra = logits.new_zeros(b, 1) + picked.sum() + logits.select(1, 0).sum()
        return logits[:, -1] + extra


def census_models() -> Iterable[tuple[str, Callable[[], nn.Module], tuple]]:
    """Models that call what real vision and language models call and the test zoo does not
    (``bench.model_forms`` counts their forms; their rows, ``masked_fill_`` and
    ``hardswish_`` among them, come from here): train mode, seeded."""
    yield "own:tiny_cnn", _trained(TinyCNN, True), (torch.randn(2, 3, 12, 12),)
    yield "own:tiny_transformer", _trained(TinyTransformer, True), (
        torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(0)),)


def own_models() -> Iterable[tuple[str, Callable[[], nn.Module], tuple]]:
    """Models of this builder: norms in train and eval mode, on modules and functionals."""
    x4 = (torch.randn(2, 3, 4, 4),)
    x3 = (torch.randn(2, 3, 4),)
    for train in (True, False):
        yield f"own:block[train={train}]", _trained(_TrainBlock, train), x4
        yield f"own:F.batch_norm[training={train}]", lambda t=train: _FunctionalBN(t), x3
        yield f"own:F.instance_norm[use_input_stats={train}]", lambda t=train: _FunctionalIN(t), x3
    yield from census_models()


def collect_models(calls: Calls, log: Callable[[str], None]) -> list[str]:
    """Record the training IR and core aten of the test zoo's models and of ``own_models``."""
    done: list[str] = []
    for name, make, args in own_models():
        try:
            record_both(calls, make, args, {}, name)
            done.append(name)
        except Exception as err:  # noqa: BLE001 - reported, the rest goes on
            log(f"{name}: {type(err).__name__}: {err}"[:200])
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import zoo
        import zoo_hf
    finally:
        sys.path.pop(0)
    cases = [*zoo.CASES.values(), *zoo_hf.HF_CASES.values()]
    for case in cases:
        if case.strict or case.decompose:
            continue
        try:
            ep = zoo.fresh_export(case)
            args, kwargs = case.args(), case.kwargs()
            record_program(calls, ep, args, kwargs, f"model:{case.name}", TRAINING)
            record_program(calls, ep.run_decompositions(), args, kwargs, f"model:{case.name}",
                           CORE)
            done.append(case.name)
        except Exception as err:  # noqa: BLE001 - reported, the rest goes on
            log(f"model:{case.name}: {type(err).__name__}: {err}"[:200])
    return done


def collect(out: Path, budget_s: float = 3600.0, first: int = 0, stop: int | None = None,
            with_models: bool = True) -> None:
    """Phase 1: record calls and write them to ``out`` (a pickle): the models (unless
    ``with_models`` is false), then the OpInfos ``op_db[first:stop]`` for at most
    ``budget_s``."""
    start = time.time()
    calls = Calls()

    def log(msg: str) -> None:
        _say(f"[{time.time() - start:7.1f}s] {msg}")

    models = collect_models(calls, log) if with_models else []
    log(f"models: {len(models)} exported, {len(calls.by_op)} operators")
    reached = collect_opinfo(calls, log, start + budget_s, first, stop)
    log(f"opinfo: {sum(1 for v in reached.values() if v)} of {len(reached)} reached, "
        f"{len(calls.by_op)} operators")
    with out.open("wb") as f:
        pickle.dump({"calls": calls.by_op, "levels": calls.levels, "sources": calls.sources,
                     "opinfo": reached, "models": models, "seconds": time.time() - start,
                     "torch": torch.__version__}, f)
    log(f"wrote {out}")


# --- own samples ----------------------------------------------------------------------------------


def own_samples() -> dict[str, list[Sample]]:
    """Calls written by hand: the norms whose writes depend on a bool argument (both values),
    and core aten operators that no exported program reaches (backward operators, ``Scalar``
    overloads, size queries, factories). Used where the recorded calls lack an operator."""
    f32, i64 = torch.float32, torch.int64
    x = TensorSpec((2, 3, 4), f32)
    x4 = TensorSpec((2, 3, 4, 4), f32)
    c = TensorSpec((3,), f32)
    v = TensorSpec((3,), f32, low=0.5, high=2.0)
    m = TensorSpec((3, 4), f32)
    idx = TensorSpec((2,), i64, values=(0, 2))
    ints = TensorSpec((2, 3), i64, low=-5, high=5)
    both = lambda *pairs: [Sample(a) for a in pairs]
    rows: dict[str, list[Sample]] = {
        "aten.batch_norm.default": both(
            (x, c, c, c, v, True, 0.1, 1e-5, False), (x, c, c, c, v, False, 0.1, 1e-5, False)),
        "aten.instance_norm.default": both(
            (x, c, c, c, v, True, 0.1, 1e-5, False), (x, c, c, c, v, False, 0.1, 1e-5, False)),
        "aten._batch_norm_impl_index.default": both(
            (x, c, c, c, v, True, 0.1, 1e-5, False), (x, c, c, c, v, False, 0.1, 1e-5, False)),
        "aten.native_batch_norm.default": both(
            (x, c, c, c, v, True, 0.1, 1e-5), (x, c, c, c, v, False, 0.1, 1e-5)),
        "aten._native_batch_norm_legit.default": both(
            (x, c, c, c, v, True, 0.1, 1e-5), (x, c, c, c, v, False, 0.1, 1e-5)),
        "aten._native_batch_norm_legit.no_stats": both((x, c, c, True, 0.1, 1e-5)),
        "aten._native_batch_norm_legit_functional.default": both(
            (x, c, c, c, v, True, 0.1, 1e-5)),
        "aten._native_batch_norm_legit_no_training.default": both((x, c, c, c, v, 0.1, 1e-5)),
        "aten.add.Scalar": both((x, 2.0, 1)),
        "aten.sub.Scalar": both((x, 2.0, 1)),
        "aten.mul.Scalar": both((x, 2.0)),
        "aten.div.Scalar": both((x, 2.0)),
        "aten.div.Scalar_mode": [Sample((x, 2.0), (("rounding_mode", "floor"),))],
        "aten.div.Tensor_mode": [Sample((x, TensorSpec((4,), f32, low=0.5, high=2.0)),
                                         (("rounding_mode", "trunc"),))],
        "aten.eq.Scalar": both((x, 0.0)),
        "aten.ne.Scalar": both((x, 0.0)),
        "aten.lt.Scalar": both((x, 0.0)),
        "aten.le.Scalar": both((x, 0.0)),
        "aten.gt.Scalar": both((x, 0.0)),
        "aten.ge.Scalar": both((x, 0.0)),
        "aten.fmod.Scalar": both((x, 2.0)),
        "aten.remainder.Scalar": both((x, 2.0)),
        "aten.pow.Scalar": both((2.0, x)),
        "aten.bitwise_and.Scalar": both((ints, 3)),
        "aten.bitwise_or.Scalar": both((ints, 3)),
        "aten.bitwise_xor.Scalar": both((ints, 3)),
        "aten.atan2.out": [Sample((x, x), (("out", x),))],
        "aten.copy.default": both((x, x, False)),
        "aten.fill.Scalar": both((x, 1.5)),
        "aten.var.correction": [Sample((x, (1,)), (("correction", 1), ("keepdim", False)))],
        "aten.var.dim": both((x, (1,), True, False)),
        "aten.sym_size.int": both((x, 1)),
        "aten.sym_stride.int": both((x, 1)),
        "aten.sym_numel.default": both((x,)),
        "aten.sym_storage_offset.default": both((x,)),
        "aten._local_scalar_dense.default": both((TensorSpec((), f32),)),
        "aten.scalar_tensor.default": [Sample((1.5,), (("dtype", f32),))],
        "aten.empty.memory_format": [Sample(((2, 3),), (("dtype", f32),))],
        "aten.empty_strided.default": [Sample(((2, 3), (3, 1)), (("dtype", f32),))],
        "aten.full.default": [Sample(((2, 3), 1.5), (("dtype", f32),))],
        "aten.rand.default": [Sample(((2, 3),), (("dtype", f32),))],
        "aten.randn.default": [Sample(((2, 3),), (("dtype", f32),))],
        "aten.randperm.default": [Sample((6,), (("dtype", i64),))],
        "aten.native_dropout.default": both((x, 0.5, True)),
        "aten.index_select.default": both((m, 0, TensorSpec((2,), i64, values=(0, 2)))),
        "aten.embedding_dense_backward.default": both(
            (TensorSpec((2, 4), f32), idx, 3, -1, False)),
        "aten.convolution_backward.default": both((
            x4, x4, TensorSpec((3, 3, 1, 1), f32), (3,), (1, 1), (0, 0), (1, 1), False, (0, 0), 1,
            (True, True, True))),
        "aten.native_layer_norm_backward.default": both((
            x, x, (4,), TensorSpec((2, 3, 1), f32), TensorSpec((2, 3, 1), f32, low=0.5, high=2.0),
            TensorSpec((4,), f32), TensorSpec((4,), f32), (True, True, True))),
        "aten.native_group_norm_backward.default": both((
            x, x, TensorSpec((2, 1), f32), TensorSpec((2, 1), f32, low=0.5, high=2.0), c, 2, 3, 4,
            1, (True, True, True))),
        "aten._adaptive_avg_pool2d_backward.default": both((TensorSpec((2, 3, 2, 2), f32), x4)),
        "aten.avg_pool2d_backward.default": both((
            TensorSpec((2, 3, 2, 2), f32), x4, (2, 2), (2, 2), (0, 0), False, True, None)),
        "aten.max_pool2d_with_indices_backward.default": both((
            TensorSpec((2, 3, 2, 2), f32), x4, (2, 2), (2, 2), (0, 0), (1, 1), False,
            TensorSpec((2, 3, 2, 2), i64, values=tuple([0, 2, 8, 10] * 6)))),
        "aten.col2im.default": both((TensorSpec((1, 4, 4), f32), (3, 3), (2, 2), (1, 1), (0, 0),
                                     (1, 1))),
        "aten.grid_sampler_2d.default": both((
            x4, TensorSpec((2, 2, 2, 2), f32, low=-1.0, high=1.0), 0, 0, False)),
        "aten._cdist_forward.default": both((m, TensorSpec((2, 4), f32), 2.0, None)),
        "aten._pdist_forward.default": both((m, 2.0)),
        "aten._fft_r2c.default": both((m, (1,), 0, True)),
        "aten._fft_c2r.default": both((TensorSpec((3, 3), torch.complex64), (1,), 0, 4)),
        "aten._embedding_bag.default": both((
            m, TensorSpec((4,), i64, values=(0, 1, 2, 1)), TensorSpec((2,), i64, values=(0, 2)),
            False, 0, False, None, False, -1)),
        "aten.as_strided.default": both((m, (2, 2), (1, 2), 0)),
        "aten.alias.default": both((m,)),
        "aten.squeeze.dims": both((TensorSpec((2, 1, 3), f32), (1,))),
        "aten.any.dims": both((TensorSpec((2, 3), torch.bool), (1,), False)),
        "aten.scatter.value": both((m, 1, TensorSpec((3, 1), i64, values=(0, 1, 3)), 2.0)),
        "aten.masked_scatter.default": both((
            m, TensorSpec((3, 4), torch.bool, values=tuple([True, False] * 6)), m)),
        "aten.reflection_pad3d.default": both((TensorSpec((1, 2, 3, 3, 3), f32),
                                               (1, 1, 1, 1, 1, 1))),
        "aten.replication_pad3d.default": both((TensorSpec((1, 2, 3, 3, 3), f32),
                                                (1, 1, 1, 1, 1, 1))),
        "aten.avg_pool3d.default": both((TensorSpec((1, 2, 4, 4, 4), f32), (2, 2, 2))),
        "aten.max_pool3d_with_indices.default": both((TensorSpec((1, 2, 4, 4, 4), f32),
                                                      (2, 2, 2))),
        "aten._adaptive_avg_pool3d.default": both((TensorSpec((1, 2, 4, 4, 4), f32), (2, 2, 2))),
        # asserts and size constraints export leaves (dynamic shapes, ``.to``, ``item``)
        "aten._assert_scalar.default": both((True, "purefx sample")),
        "aten._assert_tensor_metadata.default": both((x, None, None, f32)),
        "aten.sym_constrain_range.default": [Sample((3,), (("min", 0), ("max", 10)))],
        "aten.sym_constrain_range_for_size.default": [Sample((3,), (("min", 0), ("max", 10)))],
        "aten._assert_async.msg": both((TensorSpec((), torch.bool, values=(True,)), "sample")),
        "aten._assert_async.default": both((TensorSpec((), torch.bool, values=(True,)),)),
        "aten._make_dep_token.default": [Sample(())],
        "aten.item.default": both((TensorSpec((), f32),)),
        "aten.lift_fresh_copy.default": both((x,)),
        "aten.lift_fresh.default": both((x,)),
        "aten.detach.default": both((x,)),
        "aten.detach_.default": both((x,)),
        "aten.sym_is_contiguous.default": both((x,)),
        "aten.is_contiguous.default": both((x,)),
        "aten.clone.default": both((x,)),
        "aten.contiguous.default": both((TensorSpec((3, 4), f32, stride=(1, 3)),)),
        "aten.t.default": both((m,)),
        "aten.dropout.default": both((x, 0.5, True), (x, 0.5, False)),
        "aten.copy_.default": both((x, x, False)),
        "aten.add_.Tensor": both((x, x)),
        "aten.mul_.Tensor": both((x, x)),
        "aten.index_put_.default": both((m, (idx,), TensorSpec((2, 4), f32), False)),
        "aten.index_put.default": both((m, (idx,), TensorSpec((2, 4), f32), False)),
        "aten.relu_.default": both((x,)),
        "aten.hardtanh_.default": both((x, -1.0, 1.0)),
        "aten.mul_.Scalar": both((x, 2.0)),
        "aten.add.out": [Sample((x, x), (("alpha", 1), ("out", x)))],
        # operators the tests' own programs name that no export reached
        "aten._unsafe_view.default": both((x, (6, 4))),
        "aten.clamp_max.default": both((x, 1.0)),
        "aten.clamp_min.default": both((x, 1.0)),
        "aten.conv2d.padding": both((x4, TensorSpec((3, 3, 3, 3), f32), None, (1, 1), "same",
                                     (1, 1), 1)),
        "aten.conv1d.padding": both((x, TensorSpec((3, 3, 3), f32), None, (1,), "same", (1,),
                                     1)),
        "aten._convolution.default": both((
            x4, TensorSpec((3, 3, 3, 3), f32), c, (1, 1), (1, 1), (1, 1), False, (0, 0), 1,
            False, False, True, True)),
        "aten.conv3d.default": both((TensorSpec((1, 2, 4, 4, 4), f32),
                                     TensorSpec((2, 2, 3, 3, 3), f32))),
        "aten.cos_.default": both((x,)),
        "aten.sigmoid_.default": both((x,)),
        "aten.sub_.Tensor": both((x, x)),
        "aten.fake_quantize_per_tensor_affine.default": both((x, 0.1, 0, -128, 127)),
        "aten.normal.Tensor_float": both((x, 1.0)),
        "aten.normal.float_Tensor": both((0.0, v)),
        "aten.normal.Tensor_Tensor": both((x, v)),
        "aten.rand_like.default": both((x,)),
        "aten.randn_like.default": both((x,)),
        "aten.randint_like.default": both((x, 10)),
        "aten.bernoulli.default": both((TensorSpec((2, 3, 4), f32, low=0.0, high=1.0),)),
        "aten.bernoulli.p": both((x, 0.5)),
        "aten.uniform_.default": both((x, 0.0, 1.0)),
        "aten.normal_.default": both((x, 0.0, 1.0)),
        "aten.reflection_pad1d.default": both((x, (1, 1))),
        "aten.reflection_pad2d.default": both((x4, (1, 1, 1, 1))),
        "aten.replication_pad1d.default": both((x, (1, 1))),
        "aten.replication_pad2d.default": both((x4, (1, 1, 1, 1))),
        "aten.upsample_nearest2d.vec": both((x4, (8, 8), None)),
        "aten.upsample_bilinear2d.vec": both((x4, (8, 8), False, None)),
        "aten.set_.source_Tensor": both((x, TensorSpec((2, 3, 4), f32))),
        "aten.type_as.default": both((x, x), (x, TensorSpec((2,), torch.float64))),
        "aten._scaled_dot_product_flash_attention_for_cpu.default": both((
            TensorSpec((1, 2, 4, 8), f32), TensorSpec((1, 2, 4, 8), f32),
            TensorSpec((1, 2, 4, 8), f32))),
    }
    return rows


# --- phase 2: observing and writing the table -----------------------------------------------------


def _replayed(value: Any, exact: bool) -> Any:
    """A recorded argument with float tensors drawn in their recorded range, or (``exact``) at
    their recorded values (``_BAD``: unknown)."""
    if isinstance(value, _Recorded):
        if not exact:
            return TensorSpec(value.shape, value.dtype, value.stride, value.low, value.high)
        if value.exact is None:
            return _BAD
        return TensorSpec(value.shape, value.dtype, value.stride, values=value.exact)
    if type(value) is tuple:
        items = tuple(_replayed(v, exact) for v in value)
        return _BAD if any(i is _BAD for i in items) else items
    return value


def _samples_of(call: tuple) -> list[Sample]:
    """The samples to try for one recorded call: drawn values first, exact values second."""
    args, kwargs = call[0], call[1]
    out = [Sample(_replayed(args, False), tuple((k, _replayed(v, False)) for k, v in kwargs))]
    exact_args = _replayed(args, True)
    exact_kwargs = tuple((k, _replayed(v, True)) for k, v in kwargs)
    if exact_args is not _BAD and all(v is not _BAD for _, v in exact_kwargs):
        exact = Sample(exact_args, exact_kwargs)
        if exact != out[0]:
            out.append(exact)
    return out


def build_entry(op: OpOverload, calls: list[tuple], levels: set[str], source: str,
                ) -> tuple[OpEntry | None, str]:
    """The row of ``op`` observed on ``calls`` (``ir.op_observe``), or ``None`` and why."""
    seen = [s for s in (observe(op, _samples_of(c))[0] for c in calls) if s is not None]
    if not seen:
        return None, "no recorded call runs on real tensors"
    level = set(levels)
    if torch.Tag.core in op.tags:
        level.add(CORE)
    row = entry_of(op, seen, source=source, levels=frozenset(level),
                   effectful=op_facts.is_effectful(op),
                   state_outputs=tuple(sorted(op_facts.facts(op).state_outputs.items())))
    wrong = check_entry(row)
    if wrong:
        return None, "; ".join(wrong)
    return row, ""


def _merged(pkls: list[Path]) -> dict[str, Any]:
    """The recorded calls of several collections, as one."""
    data: dict[str, Any] = {"calls": {}, "levels": {}, "sources": {}, "opinfo": {},
                            "models": [], "seconds": 0.0}
    for pkl in pkls:
        with pkl.open("rb") as f:
            part = pickle.load(f)
        for name, calls in part["calls"].items():
            kept = data["calls"].setdefault(name, [])
            kept.extend(calls[: max(0, MAX_CALLS - len(kept))])
        for name, levels in part["levels"].items():
            data["levels"].setdefault(name, set()).update(levels)
        for name, source in part["sources"].items():
            data["sources"].setdefault(name, source)
        data["opinfo"].update(part["opinfo"])
        data["models"].extend(part["models"])
        data["seconds"] += part["seconds"]
    return data


def write(pkls: list[Path], out: Path) -> None:
    """Phase 2: observe every recorded operator (and the own samples of core aten operators
    no program reached), check each row, and write the table module to ``out``."""
    start = time.time()
    data = _merged(pkls)
    calls: dict[str, list[tuple]] = dict(data["calls"])
    levels: dict[str, set[str]] = dict(data["levels"])
    sources: dict[str, str] = dict(data["sources"])
    for name, samples in own_samples().items():
        if not calls.get(name):
            calls[name] = [(s.args, s.kwargs, "own", CORE) for s in samples]
            sources[name] = "own"
    rows: list[OpEntry] = []
    refused: dict[str, str] = {}
    for name in sorted(calls):
        op = resolve(name)
        if op is None or op.namespace not in NAMESPACES:
            continue
        try:
            row, why = build_entry(op, calls[name], levels.get(name, set()), sources[name])
        except Exception as err:  # noqa: BLE001 - reported as refused, the rest goes on
            row, why = None, f"{type(err).__name__}: {err}"[:200]
        if row is None:
            refused[name] = why
        else:
            rows.append(row)
    core = core_aten()
    covered = sorted(n for n in core if any(r.name == n for r in rows))
    out.write_text(render(rows, {
        "torch": torch.__version__,
        "rows": len(rows),
        "core_covered": f"{len(covered)}/{len(core)}",
        "core_missing": sorted(set(core) - set(covered)),
        "refused": refused,
        "collect_seconds": round(data["seconds"]),
        "write_seconds": round(time.time() - start),
        "opinfo_reached": f"{sum(1 for v in data['opinfo'].values() if v)}/{len(data['opinfo'])}",
        "models": len(data["models"]),
    }))
    _say(f"{len(rows)} rows, core aten {len(covered)}/{len(core)}, {len(refused)} refused, "
         f"{time.time() - start:.0f} s")
    for name, why in sorted(refused.items()):
        _say(f"refused {name}: {why}"[:300])


NAMESPACES = frozenset({"aten", "prims"})  #: the namespaces the table covers


def core_aten() -> list[str]:
    """Every aten overload tagged ``torch.Tag.core``."""
    found = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        for overload in getattr(packet, "overloads", list)():
            op = getattr(packet, overload, None)
            if isinstance(op, OpOverload) and torch.Tag.core in op.tags:
                found.append(str(op))
    return sorted(found)


# --- the table as Python source -------------------------------------------------------------------


def render(rows: list[OpEntry], summary: dict[str, Any]) -> str:
    """``ir/opset_table.py``'s text: a header with ``summary``, then ``ROWS``."""
    head = [
        '"""GENERATED by ``python -m ir.opset_build`` (see that module): do not edit by hand.',
        "",
        "The verified operator table of ``ir.opset``: one ``OpEntry`` per ``OpOverload``, every",
        "fact observed on real tensors and checked by ``ir.opset.check_entry``.",
        "",
        *(f"{k}: {v}" for k, v in summary.items() if k not in ("refused", "core_missing")),
        "core aten overloads no sample reached: " + ", ".join(summary["core_missing"]),
        '"""',
        "",
        "import torch",
        "",
        "from ir.opset_entry import OpEntry, Sample, TensorSpec, Write",
        "",
        PRELUDE,
        "",
        "ROWS: tuple[OpEntry, ...] = (",
    ]
    body = [f"    {_src(r)}," for r in rows]
    return "\n".join([*head, *body, ")", ""])


def _src(v: Any) -> str:
    if isinstance(v, OpEntry):
        fields = [repr(v.name)]
        if v.writes:
            fields.append(f"writes={_src(v.writes)}")
        if v.aliases:
            fields.append(f"aliases={_src(v.aliases)}")
        if v.random:
            fields.append("random=True")
        if v.effectful:
            fields.append("effectful=True")
        if v.state_outputs:
            fields.append(f"state_outputs={_src(v.state_outputs)}")
        if v.hidden:
            fields.append(f"hidden={v.hidden!r}")
        fields.append(f"levels=frozenset({sorted(v.levels)!r})")
        fields.append(f"samples={_src(v.samples)}")
        fields.append(f"source={v.source!r}")
        return f"OpEntry({', '.join(fields)})"
    if isinstance(v, Write):
        return f"Write({v.arg}, {_src(v.when)})" if v.when else f"Write({v.arg})"
    if isinstance(v, Sample):
        return f"Sample({_src(v.args)}, {_src(v.kwargs)})" if v.kwargs else f"Sample({_src(v.args)})"
    if isinstance(v, TensorSpec):
        parts = [_src(v.shape), _src(v.dtype)]
        if v.stride is not None:
            parts.append(f"stride={_src(v.stride)}")
        if v.values is not None:
            parts.append(f"values={_src(v.values)}")
        elif (v.low, v.high) != (-3.0, 3.0):
            parts.append(f"low={_src(v.low)}, high={_src(v.high)}")
        return f"TensorSpec({', '.join(parts)})"
    if type(v) is tuple:
        inner = ", ".join(_src(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    text = scalar_literal(v)
    if text is not None:
        return text
    raise TypeError(f"cannot write {type(v).__name__} {v!r} into the table")


def hidden_markdown(rows: Iterable[OpEntry]) -> str:
    """The rows whose schema hides a write or an alias, as a Markdown table (for
    ``docs/passes.md``)."""
    lines = ["| operator | what its schema does not say |", "|---|---|"]
    lines += [f"| `{e.name}` | {e.hidden} |" for e in sorted(rows, key=lambda e: e.name)
              if e.hidden]
    return "\n".join(lines)


def _say(text: str) -> None:
    """One line of the builder's command-line output (the library itself prints nothing)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    """``collect OUT.pkl [BUDGET_S]``, ``write IN.pkl [TABLE.py]`` or ``all [TABLE.py]``."""
    if not argv:
        _say(__doc__ or "")
        return 2
    command, *rest = argv
    if command == "collect":
        collect(Path(rest[0]), float(rest[1]) if len(rest) > 1 else 3600.0)
        return 0
    if command == "collect-opinfo":  # OUT.pkl BUDGET_S FIRST STOP: a slice of op_db, no models
        collect(Path(rest[0]), float(rest[1]), int(rest[2]), int(rest[3]), with_models=False)
        return 0
    if command == "write":  # IN.pkl[,IN2.pkl...] [TABLE.py]
        write([Path(x) for x in rest[0].split(",")],
              Path(rest[1]) if len(rest) > 1 else ROOT / "ir" / "opset_table.py")
        return 0
    if command == "all":
        pkl = ROOT / ".opset_calls.pkl"
        collect(pkl)
        write([pkl], Path(rest[0]) if rest else ROOT / "ir" / "opset_table.py")
        return 0
    if command == "hidden":  # the Markdown list of docs/passes.md
        from ir.opset import table

        _say(hidden_markdown(table().values()))
        return 0
    _say(f"unknown command {command!r}: use collect, collect-opinfo, write, all or hidden")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
