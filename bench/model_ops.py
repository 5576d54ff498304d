"""Which operators real models' training IR is made of: the counts ``programs()`` weights its
opset steps by (``ir/strategies/model_ops.json``).

    python -m bench.model_ops            # print the counts and what the table lacks
    python -m bench.model_ops --write    # and write them to ir/strategies/model_ops.json

The models are the ones the tests export: every case of the test zoo (``tests/zoo.py`` and its
Hugging Face cases, ``tests/zoo_hf.py``) but the strict variants (the same operators as their
non-strict twins, at several seconds of dynamo each), exported as the zoo exports them (train
mode, the model's own ``dynamic_shapes`` and preserved calls, ``run_decompositions()`` for the
``[decomp]`` variants), and the attention models of ``tests/attention_models.py`` in train mode,
before and after ``run_decompositions()``. Each ``call_function`` node on an ``aten`` overload,
in every graph (higher-order ops' bodies too), counts once for its operator; a *model* is a
case's base name (``"hf_gpt2"`` for all its variants), so the per-operator ``models`` figure
says how many different models use it. A case that does not export (a torch version that
cannot, a missing ``transformers``) is skipped and named.

The bench imports ``tests/`` (it puts it on ``sys.path``); ``ir/`` only reads the JSON file.
About ten minutes on one core, most of it the Hugging Face exports.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parent.parent / "ir" / "strategies" / "model_ops.json"


def exported() -> Iterator[tuple[str, Any]]:
    """``(model name, ExportedProgram)`` for every model the bench counts (module docstring);
    a case that raises is reported on stderr and skipped."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import attention_models
    import zoo
    import zoo_hf

    cases = {**zoo.CASES, **zoo_hf.HF_CASES}
    for name, case in sorted(cases.items()):
        if case.strict:
            continue
        try:
            yield name.partition("[")[0], zoo.fresh_export(case)
        except Exception as exc:  # noqa: BLE001 - a case this torch cannot export: named, skipped
            print(f"skipped {name}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
    for name in sorted(attention_models.ATTENTION_MODELS):
        for decompose in (False, True):
            try:
                m = attention_models.model(name).train()
                args, kwargs = attention_models.inputs(name)
                ep = torch.export.export(m, args, kwargs)
                yield f"attention_{name}", ep.run_decompositions() if decompose else ep
            except Exception as exc:  # noqa: BLE001 - as above
                print(f"skipped attention {name}: {type(exc).__name__}: {str(exc)[:120]}",
                      file=sys.stderr)


def operators(ep: Any) -> collections.Counter[str]:
    """How many ``call_function`` nodes of ``ep`` (every graph) call each ``aten`` overload."""
    found: collections.Counter[str] = collections.Counter()
    for gm in ep.graph_module.modules():
        graph = getattr(gm, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
                name = str(target)
                if name.startswith("aten."):
                    found[name] += 1
    return found


def count() -> dict[str, dict[str, int]]:
    """``{operator: {"nodes": n, "models": m}}`` over :func:`exported`, sorted by name."""
    nodes: collections.Counter[str] = collections.Counter()
    users: dict[str, set[str]] = collections.defaultdict(set)
    for model, ep in exported():
        for op, n in operators(ep).items():
            nodes[op] += n
            users[op].add(model)
    return {op: {"nodes": nodes[op], "models": len(users[op])} for op in sorted(nodes)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    args = parser.parse_args(argv)
    from ir.opset import table

    start = time.perf_counter()
    counts = count()
    rows = table()
    print(f"{len(counts)} aten operators in the models' IR ({time.perf_counter() - start:.0f} s)")
    for op, c in sorted(counts.items(), key=lambda kv: -kv[1]["models"]):
        print(f"  {op:55s} {c['models']:4d} models {c['nodes']:6d} nodes"
              f"{'' if op in rows else '   (no table row)'}")
    lacking = sorted(op for op in counts if op not in rows)
    print(f"{len(lacking)} with no row in ir.opset.table(): {', '.join(lacking) or 'none'}")
    if args.write:
        OUT.write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
