"""Per-call cost of a lowered module against the model, the bare aten graph and ``ep.module()``.

Four callers of the same inputs, timed in one process (one thread, ``no_grad``, interleaved
rounds, medians):

- ``eager``: the model itself;
- ``floor``: the exported aten graph (``ep.graph_module``) called with the flat state and flat
  inputs: the same aten ops with no module dispatch and no pytree;
- ``ep.module()``: torch's own runnable module;
- ``purefx``: ``lower(transform(import_ep(ep)))`` called as users call it.

Models (``MODELS``): one ``nn.Linear(16, 16)``, four residual Linear+GELU blocks, two transformer
blocks with ``nn.MultiheadAttention``, a model taking a dict and a keyword argument (batch dim
exported dynamic), a tiny transformers GPT-2 (2 layers, built from a config) and a root calling
one submodule whose signature is preserved (``preserve_module_call_signature``).

The breakdown splits a purefx call into: ``flatten`` (inputs to flat, checks off), ``checks``
(the input checks' extra), ``body`` (the floor: the aten ops), ``submodules`` (the root's code
beyond the floor: module dispatch, state reads), ``unflatten`` (flat outputs to the output
tree) and ``entry`` (the rest: ``nn.Module.__call__``, choosing the code). Each piece is timed
alone, so the pieces add up to the call only roughly.

    python -m bench.call_overhead                 # the table and the breakdown, ~1-2 min
    python -m bench.call_overhead --models linear,dict --rounds 5 --calls 50
    python -m bench.call_overhead --json out.json

Timings are never asserted; ``tests/test_bench_smoke.py`` only runs this at tiny sizes.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.models import _seeded
from bench.threads import one_thread

WIDTH = 16
BATCH = 4
SEQ = 8


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class GeluBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class Mlp(nn.Module):
    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(GeluBlock() for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(TransformerBlock() for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class DictKwarg(nn.Module):
    """``forward(batch, *, scale)``: a dict of two tensors and a keyword tensor; a dict out."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, batch: dict, *, scale: torch.Tensor) -> dict:
        h = self.fc(batch["x"]) * scale
        return {"out": h + batch["bias"], "norm": h.norm(dim=-1)}


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Preserved(nn.Module):
    """A root calling one submodule whose call signature the export preserves."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(WIDTH, WIDTH)
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.pre(x)) + x


def _gpt2() -> nn.Module:
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=WIDTH,
        n_layer=2,
        n_head=2,
        use_cache=False,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


@dataclass(frozen=True)
class Case:
    """A model, its example call and how to export it."""

    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[tuple, dict]]
    preserve: tuple[str, ...] = ()
    dynamic: Any = None


def _x() -> tuple[tuple, dict]:
    return (torch.randn(BATCH, WIDTH),), {}


def _seq() -> tuple[tuple, dict]:
    return (torch.randn(BATCH, SEQ, WIDTH),), {}


def _dict_inputs() -> tuple[tuple, dict]:
    batch = {"x": torch.randn(BATCH, WIDTH), "bias": torch.randn(BATCH, WIDTH)}
    return (batch,), {"scale": torch.randn(BATCH, 1)}


def _tokens() -> tuple[tuple, dict]:
    return (torch.randint(0, 64, (1, SEQ)),), {}


def _dict_dynamic() -> Any:
    batch = torch.export.Dim("batch", min=2, max=64)
    return {"batch": {"x": {0: batch}, "bias": {0: batch}}, "scale": {0: batch}}


MODELS: dict[str, Case] = {
    "linear": Case(Linear, _x),
    "mlp4": Case(Mlp, _x),
    "transformer2": Case(Transformer, _seq),
    "dict_kwarg": Case(DictKwarg, _dict_inputs, dynamic=_dict_dynamic),
    "gpt2": Case(_gpt2, _tokens),
    "preserved": Case(Preserved, _x, preserve=("inner",)),
}


def prepare(name: str) -> dict[str, Any]:
    """The model, its inputs, its export and the four callers (each ``f()`` runs one call)."""
    from ir import import_ep
    from lowering import lower
    from transforms import transform

    case = MODELS[name]
    with _seeded():
        model = case.build().eval()
        args, kwargs = case.inputs()
    ep = torch.export.export(
        model,
        args,
        kwargs,
        dynamic_shapes=case.dynamic() if case.dynamic else None,
        preserve_module_call_signature=case.preserve,
        strict=False,
    )
    module = ep.module()
    lowered = lower(transform(import_ep(ep)))
    gm = ep.graph_module
    flat_inputs = flat_state(ep) + user_leaves(ep, args, kwargs)
    return {
        "model": model,
        "args": args,
        "kwargs": kwargs,
        "ep": ep,
        "lowered": lowered,
        "callers": {
            "eager": lambda: model(*args, **kwargs),
            "floor": lambda: gm(*flat_inputs),
            "ep.module()": lambda: module(*args, **kwargs),
            "purefx": lambda: lowered(*args, **kwargs),
        },
        "floor_inputs": flat_inputs,
    }


def flat_state(ep: torch.export.ExportedProgram) -> list[Any]:
    """The state inputs of ``ep.graph_module``, in its placeholder order."""
    from torch.export.graph_signature import InputKind

    values = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in ep.state_dict:
            values.append(ep.state_dict[spec.target])
        else:
            values.append(ep.constants[spec.target])
    return values


def user_leaves(ep: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list[Any]:
    """The flat user inputs in the exported order (the example call is the exported one, so its
    keywords and dict keys come in the exported order)."""
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    if spec != ep.call_spec.in_spec:
        raise SystemExit(f"the example call's structure is not the exported one: {spec}")
    return leaves


def time_rounds(
    callers: dict[str, Callable[[], Any]], rounds: int, calls: int, clock: Callable = time.perf_counter
) -> dict[str, float]:
    """Median microseconds per call of each caller: ``rounds`` rounds, each timing ``calls``
    calls of every caller in turn, starting one caller later each round. ``clock`` is
    ``time.perf_counter`` (wall) or ``time.thread_time`` (this thread's CPU time)."""
    return {n: statistics.median(s) for n, s in round_samples(callers, rounds, calls, clock).items()}


def round_samples(
    callers: dict[str, Callable[[], Any]], rounds: int, calls: int, clock: Callable = time.perf_counter
) -> dict[str, list[float]]:
    """Microseconds per call of each caller in each round (``time_rounds``' samples, in round
    order, so that the callers' samples of one round can be paired)."""
    names = list(callers)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            f = callers[name]
            start = clock()
            for _ in range(calls):
                f()
            samples[name].append((clock() - start) / calls * 1e6)
    return samples


def paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of ``a``'s time over ``b``'s in the same round: the two were
    timed one right after the other, so what the machine did meanwhile (another process, a
    slower clock) weighs on both, and this ratio moves less between runs than the ratio of
    the medians."""
    return statistics.median(x / y for x, y in zip(samples[a], samples[b]))


def breakdown(prepared: dict[str, Any], rounds: int, calls: int, clock: Callable) -> dict[str, float]:
    """The pieces of one purefx call, each timed alone (microseconds, medians)."""
    root = prepared["lowered"]
    args, kwargs = prepared["args"], prepared["kwargs"]
    gm, flat_inputs = prepared["ep"].graph_module, prepared["floor_inputs"]
    flat = root.process_forward_inputs(*args, **kwargs)
    code = root.code_to_run(flat)
    out = code(root, *flat)
    fast = root.__dict__.get("_call_path")
    timed = {
        "root code": lambda: code(root, *flat),
        "floor": lambda: gm(*flat_inputs),
        "call": prepared["callers"]["purefx"],
    }
    if fast is None:  # the general path: ``lowering.inputs`` and ``pytree``
        spec = root._out_spec
        timed.update(
            {
                "inputs": lambda: root.process_forward_inputs(*args, **kwargs),
                "unchecked": lambda: _unchecked(root, args, kwargs),
                "toggle": lambda: _unchecked(root, None, None),
                "unflatten": lambda: torch.utils._pytree.tree_unflatten(list(out), spec),
            }
        )
        pieces = time_rounds(timed, rounds, calls, clock)
        flatten = max(pieces["unchecked"] - pieces["toggle"], 0.0)
        checks = max(pieces["inputs"] - flatten, 0.0)
    else:  # the call path, its body stubbed out: inputs, checks, choosing the code, outputs
        from lowering.call_path import call_path, probe_location

        unchecked = call_path(
            root._in_spec,
            root._out_spec,
            root._input_checks,
            root._ranges,
            probe_location(root),
            check_inputs=False,
        )
        build = root.__dict__["_build_outputs"]
        direct = root.__dict__["_direct"]
        timed.update(
            {
                "stubbed": lambda: fast(root, args, kwargs),
                "stubbed unchecked": lambda: unchecked(root, args, kwargs),
                "unflatten": lambda: build(out),
            }
        )
        stubbed = {k: timed.pop(k) for k in ("stubbed", "stubbed unchecked")}
        pieces = time_rounds(timed, rounds, calls, clock)
        root.__dict__["_direct"] = lambda self, *flat: out
        try:
            pieces.update(time_rounds(stubbed, rounds, calls, clock))
        finally:
            root.__dict__["_direct"] = direct
        flatten = max(pieces["stubbed unchecked"] - pieces["unflatten"], 0.0)
        checks = max(pieces["stubbed"] - pieces["stubbed unchecked"], 0.0)
    result = {
        "flatten": flatten,
        "checks": checks,
        "body": pieces["floor"],
        "submodules": pieces["root code"] - pieces["floor"],
        "unflatten": pieces["unflatten"],
        "call": pieces["call"],
    }
    parts = ("flatten", "checks", "body", "submodules", "unflatten")
    result["entry"] = result["call"] - sum(result[p] for p in parts)
    return result


def _unchecked(root: Any, args: tuple | None, kwargs: dict | None) -> Any:
    """The general path's flat inputs without the input checks (``None``: only the toggle)."""
    root.check_input_constraints = False
    try:
        return None if args is None else root.process_forward_inputs(*args, **kwargs)
    finally:
        root.check_input_constraints = True


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def run(
    models: list[str], rounds: int, calls: int, with_breakdown: bool, clock: str = "cpu"
) -> dict[str, Any]:
    """Every number, by model (on one torch thread; the caller's count restored after)."""
    with one_thread():
        return _run(models, rounds, calls, with_breakdown, clock)


def _run(
    models: list[str], rounds: int, calls: int, with_breakdown: bool, clock: str
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in models:
        prepared = prepare(name)
        with torch.no_grad():
            _check_agree(name, prepared)
            gc.collect()
            samples = round_samples(prepared["callers"], rounds, calls, CLOCKS[clock])
            record: dict[str, Any] = {
                "us": {n: statistics.median(s) for n, s in samples.items()},
                "paired": {
                    "purefx / floor": paired_ratio(samples, "purefx", "floor"),
                    "purefx / eager": paired_ratio(samples, "purefx", "eager"),
                },
            }
            if with_breakdown:
                record["breakdown"] = breakdown(prepared, rounds, calls, CLOCKS[clock])
        results[name] = record
        del prepared
        gc.collect()
    return results


def _check_agree(name: str, prepared: dict[str, Any]) -> None:
    want = torch.utils._pytree.tree_leaves(prepared["callers"]["eager"]())
    for caller in ("ep.module()", "purefx"):
        got = torch.utils._pytree.tree_leaves(prepared["callers"][caller]())
        if len(got) != len(want) or not all(
            torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want) if isinstance(a, torch.Tensor)
        ):
            raise SystemExit(f"{name}: {caller} disagrees with the eager model")


def table(results: dict[str, Any]) -> list[str]:
    """The markdown table of the four callers and purefx's ratios."""
    lines = [
        (
            "| model | eager | floor | ep.module() | purefx | purefx / floor | purefx / eager "
            "| paired / floor | paired / eager |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, record in results.items():
        us = record["us"]
        paired = record.get("paired") or {}
        lines.append(
            f"| {name} | {us['eager']:.1f} us | {us['floor']:.1f} us | {us['ep.module()']:.1f} us "
            f"| {us['purefx']:.1f} us | {us['purefx'] / us['floor']:.2f}x "
            f"| {us['purefx'] / us['eager']:.2f}x "
            f"| {_ratio(paired.get('purefx / floor'))} | {_ratio(paired.get('purefx / eager'))} |"
        )
    return lines


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def breakdown_table(results: dict[str, Any]) -> list[str]:
    """The markdown table of each model's breakdown (microseconds)."""
    parts = ("flatten", "checks", "body", "submodules", "unflatten", "entry", "call")
    lines = ["| model | " + " | ".join(parts) + " |", "|---|" + "---:|" * len(parts)]
    for name, record in results.items():
        b = record.get("breakdown")
        if b:
            lines.append(f"| {name} | " + " | ".join(f"{b[p]:.1f}" for p in parts) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median)")
    parser.add_argument("--calls", type=int, default=200, help="calls per caller per round")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: this thread's CPU time (default; steadier on a shared machine), wall: perf_counter",
    )
    parser.add_argument("--json", help="write every number here")
    ns = parser.parse_args(argv)
    models = [m for m in ns.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {sorted(MODELS)}")
    results = run(models, ns.rounds, ns.calls, not ns.no_breakdown, ns.clock)
    out = "\n".join(table(results))
    if not ns.no_breakdown:
        out += "\n\nbreakdown of one purefx call (us):\n" + "\n".join(breakdown_table(results))
    sys.stdout.write(out + "\n")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
