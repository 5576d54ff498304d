"""Bench: every route from a purefx Program to running code, on CUDA, against eager.

For each model (an MLP; a model of a dict and a keyword input that writes a buffer; a
train-mode conv + batch norm; GPT-2, BERT and ResNet from ``transformers``, tiny, built from
their config classes, no downloads) in float32, float16 and bfloat16, exported on the device,
each route's outputs are compared with the eager model's on the same inputs and state:

- ``lower``: ``lower(p)``;
- ``interpreter``: ``lower(p, interpreter=True)``;
- ``lower(device)``: ``lower(p_cpu, device=DEVICE)`` of the same model exported on the CPU;
- ``export_ep``: ``export_ep(p).module()``;
- ``stages``: ``split_stages(p, n=2)``, each stage ``stage_module(stages, k, DEVICE)``, run in
  sequence;
- ``compile``: ``torch.compile(lower(p), fullgraph=True)`` (inductor);
- ``aoti``: ``torch._inductor.aoti_compile_and_package(export_ep(p))``, loaded and run (in a
  worker process, each build capped at ``--aoti-cap`` seconds).

Then the attention speedup: a 4-layer GPT-2 (768 wide, 12 heads, 4 x 1024 tokens, float16,
eager attention) lowered as exported and after ``rewrite(p, RULES, assume=ATTENTION_ASSUMES)``
(the shipped attention rules fuse each attention into ``scaled_dot_product_attention``), timed
with CUDA events against the eager model, rounds interleaved.

Everything runs under one time budget (``--budget``, seconds from the process's start): a step
that would not fit in what is left is skipped and the table says so, the AOTInductor worker
(and whatever it started) is killed a few seconds before the budget ends (``bench.bounded``),
and a watchdog writes the table and exits at the budget whatever still runs. The order is what
matters most first: the cheap routes of every model and dtype, the attention speedup, then
inductor (``compile`` in float32, the AOTInductor worker started beside it, then ``compile`` in
float16 and bfloat16).

float32 and TF32 (``--tf32``): on CUDA torch runs float32 convolutions in TF32 by default
(cuDNN), and may run matmuls so (``torch.backends.cuda.matmul.allow_tf32``). TF32 keeps 10
mantissa bits, float16's, so two correct float32 runs that both use it differ by float16-sized
errors. ``--tf32 off`` (the default) turns TF32 off for eager and the compiled routes alike (and
in the AOTInductor worker) and judges float32 at float32's bound; ``--tf32 torch`` keeps torch's
settings and judges float32 at TF32's bound (float16's) wherever TF32 is on. The report's
second line says which.

AOTInductor runs only on a torch inside the supported range (``pyproject.toml``'s torch
requirement, ``bench.torch_range``); below it its cells read "n/a: torch X.Y is below the
supported range (...)".

It prints a markdown table (model x dtype x route: max abs error against eager, pass or fail,
build seconds, milliseconds per call and the ratio to eager) and writes it to ``$OUT/cuda.md``
(with ``$OUT/cuda.json``) when ``OUT`` is set, or to ``--out``. Exit status 1 when any cell
that ran failed. Run from the repository root with the project's venv::

    python -m bench.cuda                          # on a GPU: about 5 minutes on an H100
    python -m bench.cuda --device cpu --quick     # the smoke run: tiny, cheap routes, ~1 min

``ms`` are medians over ``--calls`` calls after one warm-up call (CUDA events on CUDA,
``perf_counter`` on the CPU); they are per-call costs of tiny models (launch-bound), except the
attention rows. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from bench import tf32
from bench.bounded import Bounded, Watchdog, process_started
from bench.torch_range import outside, torch_spec

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CHEAP_ROUTES = ("lower", "interpreter", "lower(device)", "export_ep", "stages")
INDUCTOR_ROUTES = ("compile", "aoti")
ROUTES = CHEAP_ROUTES + INDUCTOR_ROUTES
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}
"""``torch.testing.assert_close``'s ``atol`` and ``rtol`` per dtype: the routes that run the
same kernels are expected exact (the table says ``exact``); inductor's fused kernels round
elsewhere."""
TF32_MODES = ("off", "torch")
"""``--tf32``: ``off`` turns TF32 off on both sides; ``torch`` keeps torch's settings."""
AOTI_MARGIN_S = 5.0
"""The AOTInductor worker is stopped this long before the budget ends (the report's time)."""
COMPILE_ESTIMATE_S = {"mlp": 15, "dict_kwarg": 15, "conv_bn_train": 20, "gpt2": 40, "bert": 40,
                      "resnet": 35}
"""A step starts only when this much budget is left (a cold inductor compile on a 16-core
machine; the ``compile`` route's first call)."""
ATTENTION_ESTIMATE_S = 90  # export + rewrite (the rule checks of a fresh process) + timing
AOTI_ORDER = (("float32", None), ("float16", ("mlp", "conv_bn_train")),
              ("bfloat16", ("mlp", "gpt2")))
"""The AOTInductor cases in the order the worker builds them: every model in float32, then a
few in the half types (each build is a C++ compile: about half a minute)."""


# --- the models ---------------------------------------------------------------------------------


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DictKwarg(nn.Module):
    """A dict argument and a keyword argument in, a dict out; writes a running-mean buffer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("mean", torch.zeros(width))

    def forward(self, batch: dict[str, torch.Tensor], *, scale: torch.Tensor) -> dict:
        x = batch["x"] + batch["bias"]
        self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
        y = self.lin(x) * scale
        return {"y": y, "centred": y - self.mean}


class ConvBn(nn.Module):
    """Two conv + batch norm + ReLU blocks, run in train mode (the batch norms write their
    running statistics)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mlp(quick: bool) -> tuple[nn.Module, tuple, dict]:
    w = 16 if quick else 256
    return Mlp(w).eval(), (torch.randn(8, w, generator=_gen()),), {}


def _dict_kwarg(quick: bool) -> tuple[nn.Module, tuple, dict]:
    w = 16 if quick else 256
    g = _gen()
    batch = {"x": torch.randn(8, w, generator=g), "bias": torch.randn(8, w, generator=g)}
    return DictKwarg(w).eval(), (batch,), {"scale": torch.randn(8, 1, generator=g)}


def _conv_bn_train(quick: bool) -> tuple[nn.Module, tuple, dict]:
    c, hw = (4, 8) if quick else (32, 32)
    return ConvBn(c).train(), (torch.randn(4, 3, hw, hw, generator=_gen()),), {}


_VOCAB = 64


def _ids(seq: int) -> torch.Tensor:
    return torch.randint(3, _VOCAB, (2, seq), generator=_gen())


def _mask(seq: int) -> torch.Tensor:
    mask = torch.ones(2, seq, dtype=torch.int64)
    mask[1, seq - 2:] = 0  # padding in the second row
    return mask


def _gpt2(quick: bool) -> tuple[nn.Module, tuple, dict]:
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=_VOCAB, n_positions=64, n_embd=16 if quick else 64, n_layer=2, n_head=2,
        use_cache=False, attn_implementation="eager", bos_token_id=0, eos_token_id=0,
    )
    seq = 8 if quick else 32
    return transformers.GPT2LMHeadModel(cfg).eval(), (_ids(seq),), {"attention_mask": _mask(seq)}


def _bert(quick: bool) -> tuple[nn.Module, tuple, dict]:
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=_VOCAB, hidden_size=16 if quick else 64, intermediate_size=32 if quick else 128,
        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
        attn_implementation="eager",
    )
    seq = 8 if quick else 32
    return transformers.BertModel(cfg).eval(), (_ids(seq),), {"attention_mask": _mask(seq)}


def _resnet(quick: bool) -> tuple[nn.Module, tuple, dict]:
    import transformers

    cfg = transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16] if quick else [16, 32],
        depths=[1, 1], layer_type="basic",
    )
    hw = 16 if quick else 64
    return transformers.ResNetModel(cfg).eval(), (torch.randn(2, 3, hw, hw, generator=_gen()),), {}


MODELS: dict[str, Callable[[bool], tuple[nn.Module, tuple, dict]]] = {
    "mlp": _mlp,
    "dict_kwarg": _dict_kwarg,
    "conv_bn_train": _conv_bn_train,
    "gpt2": _gpt2,
    "bert": _bert,
    "resnet": _resnet,
}
QUICK_MODELS = ("mlp", "dict_kwarg", "conv_bn_train")


def build(name: str, dtype: torch.dtype, quick: bool) -> tuple[nn.Module, tuple, dict]:
    """Model ``name`` (seeded) on the CPU in ``dtype``, with its inputs (floating ones in
    ``dtype``)."""
    torch.manual_seed(0)
    model, args, kwargs = MODELS[name](quick)
    model = model.to(dtype)
    args, kwargs = _cast((args, kwargs), dtype)
    return model, args, kwargs


def _cast(tree: Any, dtype: torch.dtype) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree
    )


def _to(tree: Any, device: str) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree
    )


# --- comparing and timing -----------------------------------------------------------------------


def _leaves(out: Any) -> list[Any]:
    if hasattr(out, "to_tuple"):  # a transformers ModelOutput
        out = out.to_tuple()
    return torch.utils._pytree.tree_leaves(out)


def compare(got: Any, want: Any, dtype: torch.dtype,
            tol: float | None = None) -> tuple[float, bool, str]:
    """(max abs error over the floating leaves, whether every leaf is close at ``tol``, what
    differs). ``tol``: ``atol`` and ``rtol`` (default ``TOLERANCE[dtype]``)."""
    g, w = _leaves(got), _leaves(want)
    if len(g) != len(w):
        return math.inf, False, f"{len(g)} outputs, eager has {len(w)}"
    tol = TOLERANCE[dtype] if tol is None else tol
    worst, ok, why = 0.0, True, ""
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                ok, why = False, f"output {i}: {a!r} != {b!r}"
            continue
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            desc = (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
            return math.inf, False, f"output {i}: {desc} where eager has {(tuple(b.shape), b.dtype)}"
        a, b = a.detach().cpu(), b.detach().cpu()
        if b.is_floating_point():
            if a.numel():
                worst = max(worst, (a.double() - b.double()).abs().max().item())
            if not torch.allclose(a.double(), b.double(), atol=tol, rtol=tol, equal_nan=True):
                ok, why = False, why or f"output {i} differs by more than {tol:g}"
        elif not torch.equal(a, b):
            ok, why = False, why or f"output {i} (integer) differs"
    return worst, ok, why


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_ms(call: Callable[[], Any], device: str, calls: int) -> float:
    """Median milliseconds of ``calls`` calls of ``call`` (already warmed up)."""
    times = []
    for _ in range(calls):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            call()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


@dataclass
class Cell:
    """One route of one model in one dtype."""

    model: str
    dtype: str
    route: str
    status: str = "skipped"  # "pass", "fail", "error", "n/a" (refused by contract), "skipped"
    error: float | None = None
    build_s: float | None = None
    ms: float | None = None
    note: str = ""


class Budget:
    """Seconds left until a fixed deadline (``time.time()`` based, so a worker can share it)."""

    def __init__(self, until: float) -> None:
        self.until = until

    def left(self) -> float:
        return self.until - time.time()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


# --- the routes ---------------------------------------------------------------------------------


@dataclass
class Subject:
    """A model in one dtype on the device: its eager outputs, its Program (exported on the
    device), the Program of the same model exported on the CPU, and the bound its routes are
    judged at (``tf32.bound``: TF32's where float32 runs in it)."""

    name: str
    dtype: torch.dtype
    device: str
    model: nn.Module
    args: tuple
    kwargs: dict
    want: Any
    eager_ms: float
    program: Any
    cpu_program: Any
    tol: float | None = None  # None: TOLERANCE[dtype]


def prepare(name: str, dtype: torch.dtype, device: str, quick: bool, calls: int) -> Subject:
    """Build, export (on the CPU and on ``device``) and run the eager model once from the
    exported state (a copy, so a buffer write does not reach the Programs' state). Judged at
    ``tf32.bound`` under the process's TF32 flags now."""
    from ir import import_ep

    model, args, kwargs = build(name, dtype, quick)
    # a copy: the export holds the model's tensors, and ``model.to(device)`` moves them in place
    cpu_program = import_ep(torch.export.export(copy.deepcopy(model), args, kwargs))
    model = model.to(device)
    args, kwargs = _to((args, kwargs), device)
    program = import_ep(torch.export.export(model, args, kwargs))
    eager = copy.deepcopy(model)
    with torch.no_grad():
        want = eager(*args, **kwargs)
        _sync(device)
        eager_ms = time_ms(lambda: eager(*args, **kwargs), device, calls)
    return Subject(name, dtype, device, model, args, kwargs, want, eager_ms, program, cpu_program,
                   tf32.bound(dtype, device, tf32.state(), TOLERANCE))


def _stages_runner(s: Subject) -> Callable[[], Any]:
    from ir.errors import PassError
    from lowering import stage_module
    from transforms import split_stages

    try:
        stages = split_stages(s.program, n=2)
    except PassError as err:
        raise _Refused from err
    mods = [stage_module(stages, k, s.device) for k in range(len(stages.programs))]
    leaves = torch.utils._pytree.tree_leaves((s.args, s.kwargs))
    by_name = {spec.name: leaf
               for spec, leaf in zip(s.program.signature.user_inputs(), leaves, strict=True)}
    root = {name: by_name[name] for name in stages.root_inputs}

    def run() -> Any:
        out = mods[0](*[by_name[n] for n in stages.inputs[0]], **root)
        for m in mods[1:]:
            out = m(*out, **root)
        return out

    return run


def route_runner(route: str, s: Subject) -> Callable[[], Any]:
    """A zero-argument callable that runs ``s``'s inputs through ``route`` (built here: the
    build time is this call's plus the first call's)."""
    from lowering import export_ep, lower

    if route == "lower":
        m = lower(s.program)
    elif route == "interpreter":
        m = lower(s.program, interpreter=True)
    elif route == "lower(device)":
        m = lower(s.cpu_program, device=s.device)
    elif route == "export_ep":
        m = export_ep(s.program).module()
    elif route == "stages":
        return _stages_runner(s)
    elif route == "compile":
        torch._dynamo.reset()  # each model compiled afresh, far from dynamo's recompile limit
        m = torch.compile(lower(s.program), fullgraph=True)
    else:
        raise ValueError(f"unknown route {route!r}; routes: {', '.join(ROUTES)}")
    return lambda: m(*s.args, **s.kwargs)


def run_cell(route: str, s: Subject, calls: int) -> Cell:
    """Build ``route`` for ``s``, compare its first call with eager, time ``calls`` more."""
    cell = Cell(s.name, _dtype_name(s.dtype), route)
    try:
        t = time.perf_counter()
        with torch.no_grad():
            call = route_runner(route, s)
            got = call()
            _sync(s.device)
            cell.build_s = time.perf_counter() - t
            cell.error, ok, cell.note = compare(got, s.want, s.dtype, s.tol)
            cell.status = "pass" if ok else "fail"
            cell.ms = time_ms(call, s.device, calls)
    except _Refused as err:
        cell.status, cell.note = "n/a", _one_line(err.__cause__ or err)
    except Exception as err:  # noqa: BLE001 (a route that raises is a failed cell, with why)
        cell.status, cell.note = "error", _one_line(err)
    return cell


class _Refused(Exception):
    """A route that refuses this model by its documented contract (``split_stages`` on a buffer
    written in one stage and read in another): not a failure."""


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".replace("\n", " ").replace("|", "/")
    return text[:300]


def _dtype_name(dtype: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


# --- AOTInductor, in a worker process -----------------------------------------------------------


class _BuildCap(Exception):
    pass


_ALARMS: list[int] = []  # the cap's alarm fired (inductor wraps what it raises in its own error)


def _on_alarm(signum: int, frame: Any) -> None:
    _ALARMS.append(signum)
    raise _BuildCap


def aoti_cell(name: str, dtype: torch.dtype, device: str, quick: bool, calls: int,
              cap: float) -> Cell:
    """``aoti_compile_and_package(export_ep(p))``, loaded and run, against eager; the build is
    stopped after ``cap`` seconds (``SIGALRM``: a worker process's own clock)."""
    from lowering import export_ep

    cell = Cell(name, _dtype_name(dtype), "aoti")
    _ALARMS.clear()
    try:
        s = prepare(name, dtype, device, quick, calls)
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(max(1, int(cap)))
        try:
            t = time.perf_counter()
            with tempfile.TemporaryDirectory() as folder:
                package = torch._inductor.aoti_compile_and_package(
                    export_ep(s.program), package_path=os.path.join(folder, f"{name}.pt2")
                )
                compiled = torch._inductor.aoti_load_package(package)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        with torch.no_grad():
            got = compiled(*s.args, **s.kwargs)
            _sync(device)
            cell.build_s = time.perf_counter() - t
            cell.error, ok, cell.note = compare(got, s.want, dtype, s.tol)
            cell.status = "pass" if ok else "fail"
            cell.ms = time_ms(lambda: compiled(*s.args, **s.kwargs), device, calls)
    except Exception as err:  # noqa: BLE001 (any failure is a cell of the table)
        if _ALARMS:
            cell.status, cell.note = "skipped", f"build stopped at the {cap:.0f} s cap"
        else:
            cell.status, cell.note = "error", _one_line(err)
    return cell


def aoti_cases(models: Iterable[str], dtypes: Iterable[str]) -> list[tuple[str, str]]:
    """The (model, dtype) AOTInductor cases in build order (``AOTI_ORDER``)."""
    models, dtypes = list(models), set(dtypes)
    cases = []
    for dtype, which in AOTI_ORDER:
        if dtype in dtypes:
            cases += [(m, dtype) for m in models if which is None or m in which]
    return cases


def aoti_worker(args: argparse.Namespace) -> int:
    """The worker's loop: one JSON line per case on stdout, until the shared deadline."""
    budget = Budget(args.until)
    for spec in args.aoti_worker.split(","):
        name, dtype = spec.split(":")
        if not budget.allows(20):
            cell = Cell(name, dtype, "aoti", note="out of time")
        else:
            cap = min(args.aoti_cap, budget.left() - 5)
            cell = aoti_cell(name, DTYPES[dtype], args.device, args.quick, args.calls, cap)
        print(json.dumps(asdict(cell)), flush=True)
    return 0


def start_aoti_worker(cases: list[tuple[str, str]], args: argparse.Namespace,
                      until: float) -> Bounded | None:
    """The AOTInductor worker for ``cases`` (``python -m bench.cuda --aoti-worker ...`` with
    this run's device, calls, cap and ``--tf32``), in a process group of its own
    (``bench.bounded``) that ``collect_aoti`` stops at ``until``; ``None`` for no case."""
    if not cases:
        return None
    cmd = [sys.executable, "-m", "bench.cuda", "--device", args.device, "--calls", str(args.calls),
           "--aoti-cap", str(args.aoti_cap), "--until", repr(until), "--tf32", args.tf32,
           "--aoti-worker", ",".join(f"{m}:{d}" for m, d in cases)]
    if args.quick:
        cmd.append("--quick")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return Bounded.start(cmd, cwd=root)


def collect_aoti(worker: Any, cases: list[tuple[str, str]], until: float,
                 restart: Callable[[list[tuple[str, str]]], Any] | None = None) -> list[Cell]:
    """The worker's cells, one per case; returns by ``until`` (``time.time()``), when the
    worker's process group is killed (``Bounded.finish``). A worker that dies (a crash in the
    build or the load of a package, as torch 2.11's ``aoti_load_package`` did on an H100)
    costs the case it was on: that cell is an error naming the signal, and ``restart(rest)``
    starts a new worker for the cases after it while time is left. What no worker reported by
    ``until`` is skipped ("out of time"). ``worker``: a ``Bounded`` (or anything with its
    ``finish(until) -> (text, status, stopped)``), or ``None``."""
    done: dict[tuple[str, str], Cell] = {}
    rest = list(cases)
    while worker is not None and rest:
        out, status, stopped = worker.finish(until)
        for line in out.splitlines():
            if line.startswith("{"):
                cell = Cell(**json.loads(line))
                done[(cell.model, cell.dtype)] = cell
        rest = [case for case in rest if case not in done]
        if stopped or not status or not rest:
            break  # stopped at the deadline: what it did not report is out of time, not a crash
        (model, dtype), rest = rest[0], rest[1:]  # the case it died on, and the others
        done[(model, dtype)] = Cell(model, dtype, "aoti", status="error",
                                    note=f"the AOTI worker died on this case ({_death(status)})")
        room = restart is not None and rest and until - time.time() >= 20
        worker = restart(rest) if room else None
    return [done.get((m, d), Cell(m, d, "aoti", note="out of time (worker stopped)"))
            for m, d in cases]


def _death(status: int) -> str:
    """How a process with return code ``status`` (not 0) ended: the signal by name, or the
    exit status."""
    if status > 0:
        return f"exit status {status}"
    try:
        return f"signal {signal.Signals(-status).name}"
    except ValueError:
        return f"signal {-status}"


# --- the attention speedup ----------------------------------------------------------------------


@dataclass
class Attention:
    config: str
    fused: int = 0
    attention_calls: int = 0
    rewrite_s: float | None = None
    eager_ms: float | None = None
    lowered_ms: float | None = None
    rewritten_ms: float | None = None
    error: float | None = None
    note: str = ""
    rounds: list = field(default_factory=list)


def attention_speedup(device: str, quick: bool, calls: int) -> Attention:
    """Eager vs ``lower(p)`` vs ``lower(rewrite(p, RULES, assume=ATTENTION_ASSUMES))`` on a
    GPT-2 whose attention is eager (float16 on CUDA, float32 on the CPU)."""
    import transformers

    from ir import import_ep
    from lowering import lower
    from transforms.rewrite import rewrite
    from transforms.rewrite_rules import ATTENTION_ASSUMES, RULES

    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    layers, width, heads, batch, seq = (2, 32, 2, 2, 32) if quick else (4, 768, 12, 4, 1024)
    result = Attention(f"GPT2Model, {layers} layers, {width} wide, {heads} heads, "
                       f"{batch} x {seq} tokens, {_dtype_name(dtype)}, {device}")
    try:
        cfg = transformers.GPT2Config(
            vocab_size=1024, n_positions=seq, n_embd=width, n_layer=layers, n_head=heads,
            use_cache=False, attn_implementation="eager", bos_token_id=0, eos_token_id=0,
        )
        torch.manual_seed(0)
        model = transformers.GPT2Model(cfg).eval().to(device=device, dtype=dtype)
        ids = torch.randint(0, 1024, (batch, seq), generator=_gen()).to(device)
        p = import_ep(torch.export.export(model, (ids,)))
        t = time.perf_counter()
        q = rewrite(p, RULES, assume=ATTENTION_ASSUMES)
        result.rewrite_s = time.perf_counter() - t
        result.attention_calls = layers
        result.fused = _count_sdpa(q) - _count_sdpa(p)
        if result.fused != layers:
            result.note = f"{result.fused} of the {layers} attentions fused"
        lowered, rewritten = lower(p), lower(q)
        with torch.no_grad():
            want = model(ids)
            got = rewritten(ids)
            _sync(device)
            result.error = compare(got, want, dtype)[0]
            callers = {"eager": lambda: model(ids), "lowered": lambda: lowered(ids),
                       "rewritten": lambda: rewritten(ids)}
            for call in callers.values():
                call()
            per: dict[str, list[float]] = {k: [] for k in callers}
            for _ in range(5):  # rounds interleaved: a slow moment weighs on every caller
                for k, call in callers.items():
                    per[k].append(time_ms(call, device, max(1, calls // 2)))
        result.eager_ms = statistics.median(per["eager"])
        result.lowered_ms = statistics.median(per["lowered"])
        result.rewritten_ms = statistics.median(per["rewritten"])
        result.rounds = [per[k] for k in callers]
    except Exception as err:  # noqa: BLE001 (a bench reports, it does not stop)
        result.note = _one_line(err)
        traceback.print_exc()
    return result


def _count_sdpa(p: Any) -> int:
    target = torch.ops.aten.scaled_dot_product_attention.default
    return sum(1 for m in p.modules.values() for g in m.graphs for n in g.nodes
               if n.target is target)


# --- the report ---------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def render(cells: list[Cell], attention: Attention | None, eager_ms: dict, header: str) -> str:
    """The markdown report: the route table, then the attention speedup."""
    lines = [header, "",
             "| model | dtype | route | max abs error | result | build s | ms/call | x eager |",
             "|---|---|---|---:|---|---:|---:|---:|"]
    for c in cells:
        result = c.status
        if c.status == "pass" and c.error == 0.0:
            result = "pass (exact)"
        if c.note:
            result += f": {c.note}"
        base = eager_ms.get((c.model, c.dtype))
        ratio = f"{c.ms / base:.2f}x" if c.ms is not None and base else ""
        err = "" if c.error is None else ("inf" if math.isinf(c.error) else f"{c.error:.3g}")
        lines.append(f"| {c.model} | {c.dtype} | {c.route} | {err} | {result} | "
                     f"{_fmt(c.build_s, '.2f')} | {_fmt(c.ms, '.3f')} | {ratio} |")
    counts = {k: sum(c.status == k for c in cells)
              for k in ("pass", "fail", "error", "n/a", "skipped")}
    lines += ["", "cells: " + ", ".join(f"{v} {k}" for k, v in counts.items())]
    if attention is not None:
        a = attention
        lines += ["", f"Attention speedup ({a.config}):", "",
                  ("| fused / attention calls | rewrite s | eager ms | lower(p) ms | "
                   "lower(rewrite(p)) ms | speedup vs eager | max abs error |"),
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        speedup = (f"{a.eager_ms / a.rewritten_ms:.2f}x"
                   if a.eager_ms and a.rewritten_ms else "")
        lines.append(f"| {a.fused} / {a.attention_calls} | {_fmt(a.rewrite_s, '.1f')} | "
                     f"{_fmt(a.eager_ms, '.3f')} | {_fmt(a.lowered_ms, '.3f')} | "
                     f"{_fmt(a.rewritten_ms, '.3f')} | {speedup} | {_fmt(a.error, '.3g')} |")
        if a.note:
            lines.append(f"\nattention: {a.note}")
    return "\n".join(lines) + "\n"


# --- the driver ---------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.cuda", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--quick", action="store_true",
                    help="tiny models, the three small ones, no inductor routes, a tiny attention "
                         "model (the smoke run)")
    ap.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated dtypes")
    ap.add_argument("--routes", default=None,
                    help=f"comma-separated, of {', '.join(ROUTES)} (default: all; --quick: "
                         "the cheap ones)")
    ap.add_argument("--no-attention", action="store_true", help="skip the attention speedup")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds for everything, from the process's start (imports "
                         "included); the run ends by then (default 300)")
    ap.add_argument("--aoti-cap", type=float, default=90.0,
                    help="seconds one AOTInductor build may take (default 90)")
    ap.add_argument("--calls", type=int, default=10, help="timed calls per cell (default 10)")
    ap.add_argument("--tf32", choices=TF32_MODES, default="off",
                    help="off (default): TF32 off for eager and every route, float32 judged at "
                         "float32's bound; torch: torch's TF32 settings kept, float32 judged at "
                         "TF32's bound where it is on (bench.tf32)")
    ap.add_argument("--out", default=None, help="write the markdown here (default $OUT/cuda.md)")
    ap.add_argument("--aoti-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"bench.cuda: device {device!r} but torch sees no CUDA device "
                         "(use --device cpu for a dry run)")


def aoti_gate(version: str, spec: str) -> str | None:
    """Why AOTInductor does not run on torch ``version`` (``None``: it runs): a torch outside
    ``spec``, the supported range (``bench.torch_range.outside``'s words). O(1)."""
    return outside(version, spec)


def _finish(ordered: list[Cell], attention: Attention | None, eager_ms: dict, header: str,
            out: str | None) -> int:
    """Print the report, write it (``out`` and its ``.json``) and return the exit status."""
    report = render(ordered, attention, eager_ms, header)
    print()
    print(report, flush=True)
    if out:
        with open(out, "w") as f:
            f.write(report)
        with open(os.path.splitext(out)[0] + ".json", "w") as f:
            json.dump({"cells": [asdict(c) for c in ordered],
                       "attention": None if attention is None else asdict(attention),
                       "eager_ms": {f"{m}/{d}": v for (m, d), v in eager_ms.items()}}, f, indent=1)
    failed = any(c.status in ("fail", "error") for c in ordered) or bool(
        attention is not None and attention.note and attention.config != "skipped")
    return 1 if failed else 0


def main(argv: list[str] | None = None, *, watchdog: bool = True,
         started: float | None = None) -> int:
    """Run the bench (see the module docstring); the exit status. ``watchdog``: at the budget's
    end, write what is done and leave the process (``os._exit``) whatever still runs (off for
    a call inside another program, such as a test). ``started``: the ``time.time()`` the budget
    counts from (default: now; ``python -m bench.cuda``: the process's start, imports
    included)."""
    args = _parse(argv)
    _check_device(args.device)
    if args.tf32 == "off":
        tf32.set_state(tf32.OFF)
    if args.aoti_worker:
        return aoti_worker(args)
    until = (time.time() if started is None else started) + args.budget
    budget = Budget(until)
    models = args.models.split(",") if args.models else list(
        QUICK_MODELS if args.quick else MODELS)
    dtypes = args.dtypes.split(",")
    routes = args.routes.split(",") if args.routes else list(
        CHEAP_ROUTES if args.quick else ROUTES)
    bad = [m for m in models if m not in MODELS] + [d for d in dtypes if d not in DTYPES] + [
        r for r in routes if r not in ROUTES]
    if bad:
        raise SystemExit(f"bench.cuda: unknown {', '.join(bad)}")
    device_name = (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
                   else "CPU")
    header = (f"bench.cuda on {device_name}, torch {torch.__version__}"
              f"{', quick' if args.quick else ''}; budget {args.budget:.0f} s\n"
              f"{tf32.describe(args.tf32, args.device, tf32.state(), TOLERANCE)}")
    print(header, flush=True)
    out = args.out or (os.path.join(os.environ["OUT"], "cuda.md") if os.environ.get("OUT")
                       else None)

    cells: dict[tuple[str, str, str], Cell] = {
        (m, d, r): Cell(m, d, r) for m in models for d in dtypes for r in routes}
    eager_ms: dict[tuple[str, str], float] = {}
    subjects: dict[tuple[str, str], Subject] = {}
    live: dict[str, Any] = {"worker": None, "attention": None}

    def note(cell: Cell) -> None:
        cells[(cell.model, cell.dtype, cell.route)] = cell
        print(f"  {cell.model:14} {cell.dtype:9} {cell.route:14} {cell.status:8} "
              f"err={cell.error} build={_fmt(cell.build_s, '.2f')}s {cell.note}", flush=True)

    def ordered(late: str) -> list[Cell]:
        found = [cells[(m, d, r)] for m in models for d in dtypes for r in routes]
        for cell in found:
            if cell.status == "skipped" and not cell.note:
                cell.note = late
        return found

    def out_of_time() -> None:
        if live["worker"] is not None:
            live["worker"].kill()
        print(f"bench.cuda: the budget of {args.budget:.0f} s ran out; what is done is "
              "written, the rest is out of time", flush=True)
        status = _finish(ordered("out of time (the budget ran out while it ran or waited)"),
                         live["attention"], dict(eager_ms), header, out)
        os._exit(status)

    guard = Watchdog.start(until, out_of_time) if watchdog else None

    # 1. the cheap routes of every model and dtype
    for d in dtypes:
        for m in models:
            if not budget.allows(10):
                break
            try:
                s = prepare(m, DTYPES[d], args.device, args.quick, args.calls)
            except Exception as err:  # noqa: BLE001 (every route of it is an error cell)
                for r in routes:
                    note(Cell(m, d, r, status="error", note=f"export: {_one_line(err)}"))
                continue
            subjects[(m, d)] = s
            eager_ms[(m, d)] = s.eager_ms
            for r in routes:
                if r in CHEAP_ROUTES:
                    note(run_cell(r, s, args.calls))

    # 2. the attention speedup
    if not args.no_attention:
        if budget.allows(10 if args.quick else ATTENTION_ESTIMATE_S):
            print("attention speedup ...", flush=True)
            live["attention"] = attention_speedup(args.device, args.quick, args.calls)
        else:
            live["attention"] = Attention("skipped", note="out of time")

    # 3. inductor: the AOTI worker beside torch.compile (float32 first), on a supported torch
    aoti = aoti_cases(models, dtypes) if "aoti" in routes else []
    gate = aoti_gate(torch.__version__, torch_spec()) if aoti else None
    if gate is not None:
        for m, d in aoti:
            note(Cell(m, d, "aoti", status="n/a", note=gate))
        aoti = []
    aoti_until = until - AOTI_MARGIN_S
    live["worker"] = start_aoti_worker(aoti, args, aoti_until)
    if "compile" in routes:
        for d in dtypes:
            for m in models:
                s = subjects.get((m, d))
                if s is None:
                    continue
                if budget.allows(COMPILE_ESTIMATE_S[m]):
                    note(run_cell("compile", s, args.calls))
                else:
                    note(Cell(m, d, "compile", note="out of time"))

    def restart(rest: list[tuple[str, str]]) -> Bounded | None:
        live["worker"] = start_aoti_worker(rest, args, aoti_until)
        return live["worker"]

    for cell in collect_aoti(live["worker"], aoti, aoti_until, restart=restart):
        note(cell)
    live["worker"] = None
    for (m, d, r), cell in cells.items():
        if r == "aoti" and (m, d) not in aoti and cell.status != "n/a":
            cell.note = cell.note or "not in the AOTI case list (AOTI_ORDER)"
    if guard is not None:
        guard.cancel()
    # the budget ran out before its model was prepared
    return _finish(ordered("out of time"), live["attention"], eager_ms, header, out)


if __name__ == "__main__":
    status = main(started=process_started())
    # the report is written; leave now: the interpreter's exit waits on inductor's compile
    # workers (10 s on two cores, 20 s and more on a GPU host), past the budget
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
