"""How real models call each operator: the census of argument forms ``programs()`` draws from
(``ir/strategies/model_forms.json``; forms are defined in ``ir.strategies.forms``).

    python -m bench.model_forms                 # run the models, print the forms
    python -m bench.model_forms --write         # and write ir/strategies/model_forms.json
    python -m bench.model_forms --coverage 200  # which census forms 200 default draws call

The models are those of ``bench.model_ops`` (the test zoo, its Hugging Face cases, the attention
models, before and after ``run_decompositions()``) the census's own (:func:`own_models`,
``ir.opset_build.census_models``: a small CNN and a small transformer that call what real
vision and language models call and the zoo does not: pooling, ``group_norm``, ``pad``,
``conv1d``, causal masks, ``einsum``, ...).
Each program runs once on its example inputs under an ``fx.Interpreter`` that records every
``aten`` call of its graph with its real arguments; each call counts once for its form, and the
census keeps, per form, the call with the fewest tensor elements as the form's example: its
tensors as specs (shape, dtype, strides; integer and bool tensors with their exact values, float
tensors by their range), its literals exactly. An example that does not run again on fresh tensors
(``ir.opset.run_sample``) is dropped (the form is still counted).

The recorded calls are kept in ``--calls`` (a JSON file outside the package, default in the
temporary directory), so ``--write`` after a change of the form classes needs no new run:
``--from-calls`` reads them back. About two minutes on one core for the run, most of it the
Hugging Face exports. ``--coverage N`` draws N default programs (``--seed``: under that
hypothesis seed, else derandomized) and prints the census's forms and operators they call and
the share of the census's calls those forms make. The bench imports ``tests/``; ``ir/`` only
reads the JSON file.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ir.opset import Sample, TensorSpec
from ir.opset_build import flat_inputs
from ir.strategies.forms import MODEL_FORMS, decode_sample, encode_sample, form_of
from ir.torch_seam import OpOverload, op_schema, pytree

CALLS = Path(tempfile.gettempdir()) / "purefx_model_forms_calls.json"
MAX_VALUES = 4096  #: integer and bool tensors up to this size keep their exact values


# --- the models -----------------------------------------------------------------------------------


def own_models() -> Iterator[tuple[str, nn.Module, tuple]]:
    """``(name, model in train mode, example inputs)`` of the census's own models
    (``ir.opset_build.census_models``, which the table's builder records too)."""
    from ir.opset_build import census_models

    for name, make, args in census_models():
        yield name, make(), args


def programs() -> Iterator[tuple[str, Any, tuple, dict]]:
    """``(model name, ExportedProgram, args, kwargs)`` for every program the census runs (module
    docstring); one that does not export is reported on stderr and skipped."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import attention_models
    import zoo
    import zoo_hf

    def skipped(name: str, exc: Exception) -> None:
        print(f"skipped {name}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)

    for name, model, args in own_models():
        for decompose in (False, True):
            try:
                ep = torch.export.export(model, args)
                yield name, ep.run_decompositions() if decompose else ep, args, {}
            except Exception as exc:  # noqa: BLE001 - named, skipped
                skipped(name, exc)
    cases = {**zoo.CASES, **zoo_hf.HF_CASES}
    for name, case in sorted(cases.items()):
        if case.strict:
            continue
        try:
            yield name.partition("[")[0], zoo.fresh_export(case), case.args(), case.kwargs()
        except Exception as exc:  # noqa: BLE001 - a case this torch cannot export
            skipped(name, exc)
    for name in sorted(attention_models.ATTENTION_MODELS):
        for decompose in (False, True):
            try:
                m = attention_models.model(name).train()
                args, kwargs = attention_models.inputs(name)
                ep = torch.export.export(m, args, kwargs)
                yield f"attention_{name}", ep.run_decompositions() if decompose else ep, args, \
                    kwargs
            except Exception as exc:  # noqa: BLE001 - as above
                skipped(f"attention {name}", exc)


# --- recording calls ------------------------------------------------------------------------------


class Calls:
    """The distinct calls recorded: per ``(operator, call without tensor values)``, how many
    nodes made it, which models, and the first such call with its values."""

    def __init__(self) -> None:
        self.count: collections.Counter[tuple[str, str]] = collections.Counter()
        self.models: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        self.example: dict[tuple[str, str], dict] = {}

    def add(self, op: OpOverload, args: tuple, kwargs: dict, model: str) -> None:
        """Record one call of ``op`` on real arguments in ``model``."""
        sample = normal_sample(op, args, kwargs)
        if sample is None:
            return
        data = encode_sample(sample)
        key = (str(op), json.dumps(_shape_only(data), sort_keys=True))
        self.count[key] += 1
        self.models[key].add(model)
        self.example.setdefault(key, data)

    def dump(self) -> list:
        """The calls as JSON data: ``[operator, nodes, models, example]`` rows, sorted."""
        return [[op, self.count[(op, k)], sorted(self.models[(op, k)]), self.example[(op, k)]]
                for op, k in sorted(self.count)]

    @classmethod
    def load(cls, rows: list) -> Calls:
        """The calls :meth:`dump` wrote."""
        calls = cls()
        for op, n, models, example in rows:
            key = (op, json.dumps(_shape_only(example), sort_keys=True))
            calls.count[key] += n
            calls.models[key].update(models)
            calls.example.setdefault(key, example)
        return calls


def _shape_only(data: Any) -> Any:
    if isinstance(data, dict) and "tensor" in data:
        t = data["tensor"]
        return {"tensor": [t["shape"], t["dtype"], t["stride"]]}
    if isinstance(data, dict):
        return {k: _shape_only(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_shape_only(v) for v in data]
    return data


def normal_sample(op: OpOverload, args: tuple, kwargs: dict) -> Sample | None:
    """The call ``op(*args, **kwargs)`` as a ``Sample``: every positional parameter in schema
    order (defaults filled), keyword-only ones given as keywords, tensors as specs; None when
    an argument is not a plain CPU tensor or literal."""
    schema = op_schema(op)
    out: list[Any] = []
    kw: list[tuple[str, Any]] = []
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            value = args[i]
        elif a.name in kwargs:
            value = kwargs[a.name]
        elif a.has_default_value():
            if a.kwarg_only:
                continue
            value = a.default_value
        else:
            return None
        spec = _spec_of(value)
        if spec is _BAD:
            return None
        if a.kwarg_only:
            kw.append((a.name, spec))
        else:
            out.append(spec)
    return Sample(tuple(out), tuple(kw))


_BAD = object()


def _spec_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.device.type != "cpu" or value.is_quantized:
            return _BAD
        t = value.detach()
        # an expanded tensor (a zero stride) as a contiguous one: fresh tensors of its strides
        # would overlap
        stride = None if t.is_contiguous() or 0 in t.stride() else tuple(t.stride())
        flat = t.contiguous().reshape(-1)
        if t.dtype.is_floating_point:
            # by its range, as the table's samples (a weight of small values becomes a
            # parameter of the program, an activation an input or an earlier value)
            finite = flat[torch.isfinite(flat)].double()
            low = round(float(finite.min()), 3) if finite.numel() else -3.0
            high = round(float(finite.max()), 3) if finite.numel() else 3.0
            return TensorSpec(tuple(t.shape), t.dtype, stride, low, max(high, low + 1e-3))
        if t.dtype.is_complex:
            return TensorSpec(tuple(t.shape), t.dtype, stride)
        if flat.numel() <= MAX_VALUES:
            return TensorSpec(tuple(t.shape), t.dtype, stride, values=tuple(flat.tolist()))
        low, high = (int(flat.min()), int(flat.max()) + 1) if flat.numel() else (0, 1)
        return TensorSpec(tuple(t.shape), t.dtype, stride, low, high)
    if isinstance(value, (list, tuple)):
        items = tuple(_spec_of(v) for v in value)
        return _BAD if any(i is _BAD for i in items) else items
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return _BAD
    if isinstance(value, (bool, int, float, str, type(None), torch.dtype, torch.device,
                          torch.layout, torch.memory_format)):
        return value
    return _BAD


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, calls: Calls, model: str) -> None:
        super().__init__(gm)
        self.calls, self.model = calls, model

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if isinstance(target, OpOverload) and str(target).startswith("aten."):
            self.calls.add(target, args, kwargs, self.model)
        return super().call_function(target, args, kwargs)


def _flat_inputs(ep: Any, args: tuple, kwargs: dict) -> list[Any]:
    """``ir.opset_build.flat_inputs``, each tensor a detached copy (a recorded call never
    writes the model's own state)."""
    return [v.detach().clone() if isinstance(v, torch.Tensor) else v
            for v in flat_inputs(ep, args, kwargs)]


def record(log: Callable[[str], None] = print) -> Calls:
    """Run every program of :func:`programs` and record its calls."""
    calls = Calls()
    for model, ep, args, kwargs in programs():
        try:
            torch.manual_seed(0)
            with torch.no_grad():
                _Recorder(ep.graph_module, calls, model).run(*_flat_inputs(ep, args, kwargs))
        except Exception as exc:  # noqa: BLE001 - named, the rest goes on
            log(f"not run {model}: {type(exc).__name__}: {str(exc)[:120]}")
    return calls


# --- the census -----------------------------------------------------------------------------------


def _numel(sample: Sample) -> int:
    total = 0
    for leaf in pytree.tree_leaves((sample.args, [v for _, v in sample.kwargs])):
        if isinstance(leaf, TensorSpec):
            n = 1
            for d in leaf.shape:
                n *= d
            total += n
    return total


def _runs(op_name: str, sample: Sample) -> bool:
    from ir.opset import run_sample
    from ir.strategies.opset_steps import overload

    op = overload(op_name)
    if op is None:
        return False
    try:
        run_sample(op, sample)
    except Exception:  # noqa: BLE001 - an example that does not run is no example
        return False
    return True


def _no_overlap(sample: Sample) -> Sample:
    """``sample`` with every expanded tensor (a zero stride) contiguous, as ``_spec_of``
    records them now."""
    def fix(v: Any) -> Any:
        if isinstance(v, TensorSpec) and v.stride is not None and 0 in v.stride:
            return TensorSpec(v.shape, v.dtype, None, v.low, v.high, v.values)
        return tuple(fix(x) for x in v) if isinstance(v, tuple) else v
    return Sample(fix(sample.args), tuple((k, fix(v)) for k, v in sample.kwargs))


def census(calls: Calls) -> dict[str, dict]:
    """``{form: {"op", "uses", "models", "example"}}`` of ``calls``, sorted by form; each
    form's example is its call with the fewest tensor elements that runs again on fresh tensors
    (ties: the first in the calls' order), or None."""
    from ir.strategies.opset_steps import overload

    uses: collections.Counter[str] = collections.Counter()
    users: dict[str, set[str]] = collections.defaultdict(set)
    candidates: dict[str, list[tuple[int, int, Sample]]] = collections.defaultdict(list)
    ops: dict[str, str] = {}
    for i, ((op_name, key), n) in enumerate(sorted(calls.count.items())):
        op = overload(op_name)
        if op is None:
            continue
        sample = _no_overlap(decode_sample(calls.example[(op_name, key)]))
        form = form_of(op, sample.args, dict(sample.kwargs),
                       is_tensor=lambda v: isinstance(v, TensorSpec))
        ops[form] = op_name
        uses[form] += n
        users[form] |= calls.models[(op_name, key)]
        candidates[form].append((_numel(sample), i, sample))
    out = {}
    for form in sorted(uses):
        example = None
        for _, _, sample in sorted(candidates[form], key=lambda c: c[:2]):
            if _runs(ops[form], sample):
                example = encode_sample(sample)
                break
        out[form] = {"op": ops[form], "uses": uses[form], "models": len(users[form]),
                     "example": example}
    return out


# --- coverage -------------------------------------------------------------------------------------


def drawn_forms(programs_drawn: list) -> collections.Counter[str]:
    """How many calls of each form (``ir.strategies.forms.form_of``) the programs make, over
    every graph of each. O(nodes)."""
    from ir.args import Ref
    from ir.node import CALL_FUNCTION

    found: collections.Counter[str] = collections.Counter()
    for program in programs_drawn:
        for module in program.modules.values():
            for graph in module.graphs:
                for node in graph.nodes:
                    if node.op == CALL_FUNCTION and isinstance(node.target, OpOverload):
                        found[form_of(node.target, tuple(node.args), dict(node.kwargs.items),
                                      is_tensor=lambda v: isinstance(v, Ref))] += 1
    return found


def coverage(n: int, seed: int | None = None) -> dict[str, Any]:
    """Over ``n`` default draws (derandomized, or under hypothesis seed ``seed``): the census's
    forms and operators drawn, and the share of the census's uses their forms make; forms of
    operators no default program can call (``bench.opset_coverage.UNREACHABLE``: effectful, or
    no tensor result) left out. O(n programs)."""
    from bench.opset_coverage import UNREACHABLE, draw
    from ir.strategies.forms import census as read_census

    forms = {k: f for k, f in read_census().items() if f.op not in UNREACHABLE}
    drawn = drawn_forms(draw(n, seed)[0])
    ops = {f.op for f in forms.values()}
    hit = [f for f in forms.values() if f.form in drawn]
    drawn_ops = {f.split("(")[0] for f in drawn}
    total = sum(f.uses for f in forms.values())
    return {"draws": n, "forms": len(forms), "forms_drawn": len(hit),
            "operators": len(ops), "operators_drawn": len(ops & drawn_ops),
            "uses_share": sum(f.uses for f in hit) / total if total else 0.0,
            "missing_forms": sorted(f.form for f in forms.values() if f.form not in drawn),
            "missing_operators": sorted(ops - drawn_ops)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {MODEL_FORMS.name}")
    parser.add_argument("--calls", type=Path, default=CALLS, help="the recorded calls' file")
    parser.add_argument("--from-calls", action="store_true",
                        help="read the recorded calls instead of running the models")
    parser.add_argument("--coverage", type=int, metavar="N",
                        help="report which census forms N default programs() draws call")
    parser.add_argument("--seed", type=int, default=None,
                        help="hypothesis seed of --coverage (default: derandomized)")
    args = parser.parse_args(argv)
    if args.coverage:
        start = time.perf_counter()
        c = coverage(args.coverage, args.seed)
        print(f"{c['draws']} default draws ({time.perf_counter() - start:.0f} s): "
              f"{c['forms_drawn']} of {c['forms']} forms "
              f"({100 * c['forms_drawn'] / max(c['forms'], 1):.0f} %), "
              f"{c['operators_drawn']} of {c['operators']} operators, "
              f"{100 * c['uses_share']:.0f} % of the uses")
        print("never drawn forms:", "; ".join(c["missing_forms"]) or "none")
        print("never drawn operators:", ", ".join(c["missing_operators"]) or "none")
        return
    start = time.perf_counter()
    if args.from_calls:
        calls = Calls.load(json.loads(args.calls.read_text()))
    else:
        calls = record()
        args.calls.write_text(json.dumps(calls.dump()) + "\n")
        print(f"recorded calls in {args.calls}")
    forms = census(calls)
    ops = {f["op"] for f in forms.values()}
    print(f"{len(forms)} forms of {len(ops)} operators "
          f"({time.perf_counter() - start:.0f} s); "
          f"{sum(f['example'] is None for f in forms.values())} without an example")
    for form, f in sorted(forms.items(), key=lambda kv: (-kv[1]["uses"], kv[0])):
        print(f"  {f['uses']:6d} {f['models']:4d}  {form}"
              f"{'' if f['example'] else '   (no example)'}")
    if args.write:
        MODEL_FORMS.write_text(json.dumps({"forms": forms}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {MODEL_FORMS}")


if __name__ == "__main__":
    main()
