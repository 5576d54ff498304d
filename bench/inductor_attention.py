"""Bench: purefx's matching of torch inductor's own attention rules, against inductor.

Inductor ships its attention fusions as pattern/replacement pairs of PyTorch functions
(``torch/_inductor/fx_passes/fuse_attention.py``: ``_sfdp_pattern_k`` / ``_sfdp_replacement_k``),
the same shape as a purefx ``Rule``. For each no-dropout rule ``k`` in ``KS`` this bench

1. loads the rule from the installed torch as ``_get_sfdp_patterns`` registers it for inference
   in float32 (the example tensors' shapes and dtypes, the scalar workaround values such as
   ``inv_scale=0.66666``); a 0-d example tensor that stands for a scalar (``inv_scale``,
   ``scale_factor``) becomes a Python float, as inductor's own ``extra_check`` requires the
   scale to be a number in the matched graph;
2. builds a model that calls the pattern function at other shapes than the rule's examples
   (each distinct example size mapped to another, so sizes that agree still do) and with other
   scalar values;
3. counts purefx's rewrites of that model with the rule (``apply_rules``: matching only, the
   verdict is a separate column) at three levels: flat (``import_ep`` of the training IR),
   decomposed (``ep.run_decompositions()``) and outlined (``transforms.transform``), and
   compares each lowered module's output with eager;
4. runs ``torch.compile(model)`` (CPU inductor) and reads inductor's ``fuse_attention``
   counter;
5. gives ``check_rule``'s verdict on the rule with a one-line reason.

It prints a markdown table. Run from the repository root with the project's venv::

    python -m bench.inductor_attention                # all 14 rules (a few minutes: inductor)
    python -m bench.inductor_attention --ks 1,5       # a subset
    python -m bench.inductor_attention --no-inductor  # purefx only
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch

from ir import import_ep
from ir.errors import PassError
from lowering import lower
from transforms import transform
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite import Rule, check_rule
from transforms.rewrite.engine import apply_rules

KS = (1, 2, 5, 8, 10, 11, 14, 15, 21, 22, 23, 24, 29, 30)
"""Inductor's attention rules without dropout."""
LEVELS = ("flat", "decomposed", "outlined")
_OTHER_SIZE = {1: 1, 2: 3, 4: 5, 8: 6, 16: 12}  #: example size -> the model's size
_OTHER_SCALAR = 1.75  #: what every scalar argument becomes in the models


def _other_size(s: int) -> int:
    return _OTHER_SIZE.get(s, s + 3)


def inductor_entries(ks: Sequence[int] = KS) -> dict[int, dict[str, Any]]:
    """``{k: register_replacement kwargs}`` of rule ``k``'s float32 inference entry, as the
    installed torch's ``_get_sfdp_patterns`` yields it (``search_fn``, ``replace_fn``,
    ``example_inputs``, ``scalar_workaround``, ...)."""
    from torch._inductor.fx_passes import fuse_attention

    wanted = {f"_sfdp_pattern_{k}_inference": k for k in ks}
    found: dict[int, dict[str, Any]] = {}
    for name, kwargs in fuse_attention._get_sfdp_patterns(torch.device("cpu")):
        k = wanted.get(name)
        if k is not None and k not in found:
            found[k] = kwargs
    missing = sorted(set(ks) - set(found))
    if missing:
        raise PassError(
            f"inductor's _get_sfdp_patterns yields no float32 inference entry for rules "
            f"{missing} in torch {torch.__version__}; pick rules it has (--ks)"
        )
    return found


def _example(x: Any, gen: torch.Generator) -> Any:
    """A value for one of inductor's example arguments: a 0-d tensor (a scalar's stand-in)
    becomes its Python number, other tensors get values (``torch.empty`` has none) of the same
    shape and dtype, detached."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.dim() == 0:
        return float(x.item())
    if x.dtype == torch.bool:
        return torch.randint(0, 2, tuple(x.shape), generator=gen).bool()
    return torch.randn(tuple(x.shape), generator=gen).to(x.dtype)


ASSUMES = frozenset({"no_nans", "no_infs", "reassociate"})
"""What inductor assumes when it fuses attention (``Rule.assumes``): finite values (a row of
-inf scores is NaN unfused, 0 fused) and sums regrouped (the fused kernel rounds elsewhere)."""


def rule_from_entry(k: int, entry: dict[str, Any]) -> Rule:
    """Inductor's rule ``k`` as a purefx ``Rule`` (not trusted: ``rewrite`` would check it),
    assuming ``ASSUMES``.

    Arguments: inductor's example inputs in signature order, then the scalar workaround
    values for the signature's remaining parameters (``inv_scale``); floating tensors in the
    dtype the pattern computes its result in (``_domain_dtype``)."""
    search, replace = entry["search_fn"], entry["replace_fn"]
    gen = torch.Generator().manual_seed(k)
    args = [_example(x, gen) for x in entry["example_inputs"]]
    params = list(inspect.signature(search).parameters)
    workaround = entry.get("scalar_workaround") or {}
    for name in params[len(args):]:
        if name not in workaround:
            raise PassError(
                f"inductor rule {k}: parameter {name!r} has no example input nor scalar "
                "workaround value"
            )
        args.append(workaround[name])
    domain = _domain_dtype(search, args)
    if domain is not None:
        args = [x.to(domain) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                for x in args]
    return Rule(search, replace, tuple(args), name=f"sfdp_{k}", assumes=ASSUMES)


def _domain_dtype(pattern: Callable, args: Sequence[Any]) -> torch.dtype | None:
    """The floating dtype the pattern's first result has on ``args`` when it is not theirs
    (rules 8 and 10 cast their probabilities to float16: they are float16 rules, inductor's
    ``_half`` entries, where that cast is a no-op); ``None`` when it keeps their dtype."""
    with torch.no_grad():
        out = pattern(*args)
    first = out[0] if isinstance(out, (tuple, list)) else out
    dtypes = {x.dtype for x in args if isinstance(x, torch.Tensor) and x.is_floating_point()}
    return first.dtype if first.is_floating_point() and first.dtype not in dtypes else None


class PatternModel(torch.nn.Module):
    """A model whose forward is ``pattern(*tensors)`` with the scalar arguments fixed."""

    def __init__(self, pattern: Callable, layout: tuple, scalars: dict[int, float]) -> None:
        super().__init__()
        # dynamo does not trace into torch._inductor's own files unless told to
        self.pattern = torch._dynamo.dont_skip_tracing(pattern)
        self.layout = layout  # per argument: "t" (a forward input) or "s" (a scalar)
        self.scalars = scalars

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        args = [next(it) if kind == "t" else self.scalars[i] for i, kind in enumerate(self.layout)]
        return self.pattern(*args)


def model_for(rule: Rule, seed: int = 0) -> tuple[PatternModel, tuple]:
    """A model computing ``rule.pattern`` and inputs at other shapes than the rule's examples
    (each example size ``s`` mapped by ``_OTHER_SIZE``) and other scalar values, in the
    examples' dtypes."""
    gen = torch.Generator().manual_seed(seed)
    layout, scalars, tensors = [], {}, []
    for i, x in enumerate(rule.example_inputs):
        if isinstance(x, torch.Tensor):
            layout.append("t")
            shape = tuple(_other_size(s) for s in x.shape)
            if x.dtype == torch.bool:
                tensors.append(torch.randint(0, 2, shape, generator=gen).bool())
            else:
                tensors.append(torch.randn(shape, generator=gen).to(x.dtype))
        else:
            layout.append("s")
            scalars[i] = _OTHER_SCALAR if isinstance(x, float) else x
    return PatternModel(rule.pattern, tuple(layout), scalars).eval(), tuple(tensors)


def _program(ep: torch.export.ExportedProgram, level: str) -> Any:
    if level == "decomposed":
        return import_ep(ep.run_decompositions())
    p = import_ep(ep)
    return transform(p) if level == "outlined" else p


_TOLERANCE = {torch.float16: (2e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}  #: else (1e-4, 1e-5)


def _max_error(got: Any, want: Any) -> float:
    """The largest difference between two results, ``0.0`` when every tensor is close within
    its dtype's tolerance (``check_rule``'s), ``inf`` when they differ in number, shape or
    dtype."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return math.inf
        rtol, atol = _TOLERANCE.get(w.dtype, (1e-4, 1e-5))
        if w.numel() and not torch.allclose(g.double(), w.double(), rtol=rtol, atol=atol,
                                            equal_nan=True):
            worst = max(worst, float((g.double() - w.double()).abs().max()))
    return worst


def purefx_matches(rule: Rule, model: torch.nn.Module, args: tuple) -> dict[str, tuple[int, float]]:
    """``{level: (rewrites, difference of the lowered output from eager)}`` (``_max_error``: 0
    when equal within the dtype's tolerance); a level whose export or rewrite raises gives
    ``(-1, inf)``."""
    with torch.no_grad():
        want = model(*args)
    out: dict[str, tuple[int, float]] = {}
    ep = torch.export.export(model, args)
    for level in LEVELS:
        try:
            q, report = apply_rules(_program(ep, level), [rule])
            with torch.no_grad():
                err = _max_error(lower(q)(*args), want)
            out[level] = (report.counts[rule.name], err)
        except Exception as exc:  # noqa: BLE001 - a bench reports, it does not stop
            print(f"  sfdp {rule.name} {level}: {type(exc).__name__}: {exc}"[:300],
                  file=sys.stderr)
            out[level] = (-1, math.inf)
    return out


def inductor_matches(model: torch.nn.Module, args: tuple) -> int:
    """How many attentions CPU inductor fuses in ``model``: its ``fuse_attention`` counter
    after one run of ``torch.compile(model)``."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # a cached compiled graph skips the passes, and so the counter: compile afresh
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        torch.compile(model)(*args)
    return int(counters["inductor"]["fuse_attention"])


def verdict(rule: Rule, max_examples: int | None = None) -> tuple[str, str]:
    """``check_rule``'s verdict on ``rule``: ``("accepted", "")``, ``("refused", reason)`` for
    a counterexample or a malformed rule, ``("raised", reason)`` for anything else (a purefx
    bug: check_rule must raise only those two)."""
    try:
        check_rule(rule, max_examples=max_examples)
    except LawViolation as exc:
        return "refused", _line(exc)
    except PassError as exc:
        return "refused", "PassError: " + _line(exc)
    except Exception as exc:  # noqa: BLE001 - reported as the bug it is
        return "raised", f"{type(exc).__name__}: {_line(exc)}"
    return "accepted", ""


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 260 else text[:257] + "..."


def measure(ks: Sequence[int] = KS, *, inductor: bool = True, max_examples: int | None = None,
            out: TextIO = sys.stdout) -> list[dict[str, Any]]:
    """Measure each rule in ``ks`` (see the module docstring); print the table to ``out`` and
    return one row per rule: ``k``, per level ``(rewrites, error)``, ``inductor`` (the counter,
    or None), ``verdict``, ``reason``, ``seconds``."""
    entries = inductor_entries(ks)
    rows = []
    for k in ks:
        t0 = time.perf_counter()
        rule = rule_from_entry(k, entries[k])
        model, args = model_for(rule)
        row: dict[str, Any] = {"k": k, **purefx_matches(rule, model, args)}
        row["inductor"] = inductor_matches(model, args) if inductor else None
        row["verdict"], row["reason"] = verdict(rule, max_examples)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    print_table(rows, out)
    return rows


def print_table(rows: list[dict[str, Any]], out: TextIO = sys.stdout) -> None:
    """The markdown table of ``measure``'s rows, and the totals per level."""

    def cell(m: tuple[int, float]) -> str:
        n, err = m
        if n < 0:
            return "error"
        return f"{n}" + ("" if err == 0 else f" (differs by {err:.1e})")

    print("| rule | flat | decomposed | outlined | inductor | check_rule | reason |", file=out)
    print("|---:|---:|---:|---:|---:|---|---|", file=out)
    for r in rows:
        ind = "-" if r["inductor"] is None else str(r["inductor"])
        reason = r["reason"].replace("|", "\\|")
        print(f"| {r['k']} | {cell(r['flat'])} | {cell(r['decomposed'])} | "
              f"{cell(r['outlined'])} | {ind} | {r['verdict']} | {reason} |", file=out)
    n = len(rows)
    totals = [sum(1 for r in rows if r[level][0] >= 1) for level in LEVELS]
    ind_total = sum(1 for r in rows if (r["inductor"] or 0) >= 1)
    print(f"\nmatched: flat {totals[0]}/{n}, decomposed {totals[1]}/{n}, outlined "
          f"{totals[2]}/{n}, inductor {ind_total}/{n}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default=",".join(map(str, KS)),
                        help="inductor rule numbers, comma-separated (default: the 14)")
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile")
    parser.add_argument("--max-examples", type=int, default=None,
                        help="check_rule's examples per rule (default: the rule's, 40)")
    a = parser.parse_args(argv)
    ks = [int(x) for x in a.ks.split(",") if x]
    measure(ks, inductor=not a.no_inductor, max_examples=a.max_examples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
