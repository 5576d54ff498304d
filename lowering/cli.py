"""The ``purefx`` command: import, transform and lower a program, and check it.

``purefx`` runs the built-in example model; ``purefx MODEL.pt2`` loads a program saved with
``torch.export.save``. Loading a ``.pt2`` file runs ``torch.export.load``, which unpickles parts of
the file: only load files you trust.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

import torch

from ir import PurefxError, format_tree, import_ep
from ir.program import Program
from lowering.lower import lower
from transforms.pipeline import transform

_DESCRIPTION = __doc__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 on PASS, 1 on FAIL, 2 on bad input)."""
    args = _parser().parse_args(argv)
    try:
        ep = _load(args.program)
        report = run(ep, passes=_passes(args.passes))
    except (PurefxError, _LoadError) as err:
        sys.stderr.write(f"purefx: error: {err}\n")
        return 2
    sys.stdout.write(report.text + "\n")
    return 0 if report.passed else 1


class _LoadError(Exception):
    pass


class Report:
    """What one run found: the printable text and whether the numeric check passed."""

    def __init__(self, text: str, passed: bool, program: Program, module: torch.nn.Module) -> None:
        self.text = text
        self.passed = passed
        self.program = program
        self.module = module


def run(ep: torch.export.ExportedProgram, passes: Sequence[Any] | None = None) -> Report:
    """Import, transform (each pass timed) and lower ``ep``; compare with ``ep.module()``."""
    lines = []
    start = time.perf_counter()
    program = import_ep(ep)
    lines.append(_stage("import_ep", start, program))
    for p in passes if passes is not None else _default_passes():
        start = time.perf_counter()
        program = transform(program, [p])
        lines.append(_stage(getattr(p, "__name__", str(p)), start, program))
    start = time.perf_counter()
    module = lower(program)
    lines.append(f"  {'lower':<28} {1e3 * (time.perf_counter() - start):9.2f} ms")
    passed, detail = _check(ep, module)
    text = "\n".join(
        ["stages:", *lines, "module tree:", format_tree(program), f"check against ep.module(): {detail}"]
    )
    return Report(text, passed, program, module)


def _stage(name: str, start: float, program: Program) -> str:
    ms = 1e3 * (time.perf_counter() - start)
    return (
        f"  {name:<28} {ms:9.2f} ms  {program.node_count():6d} nodes  "
        f"{program.module_count():5d} modules"
    )


def _check(ep: torch.export.ExportedProgram, module: torch.nn.Module) -> tuple[bool, str]:
    example = ep.example_inputs
    if example is None:
        return True, "SKIPPED (the program carries no example inputs)"
    args, kwargs = example
    expected = ep.module()(*args, **kwargs)
    got = module(*args, **kwargs)
    leaves_e = [x for x in torch.utils._pytree.tree_leaves(expected)]
    leaves_g = [x for x in torch.utils._pytree.tree_leaves(got)]
    if len(leaves_e) != len(leaves_g):
        return False, f"FAIL (output structure differs: {len(leaves_g)} vs {len(leaves_e)} leaves)"
    worst = 0.0
    for e, g in zip(leaves_e, leaves_g):
        if isinstance(e, torch.Tensor):
            if e.shape != g.shape:
                return False, f"FAIL (shape {tuple(g.shape)} where {tuple(e.shape)} was expected)"
            if e.numel():
                worst = max(worst, (e.double() - g.double()).abs().max().item())
        elif e != g:
            return False, f"FAIL (value {g!r} where {e!r} was expected)"
    passed = worst <= 1e-5
    return passed, f"{'PASS' if passed else 'FAIL'} (largest abs error {worst:.3g})"


def _load(path: str | None) -> torch.export.ExportedProgram:
    if path is None:
        from lowering.example_model import example_program

        return example_program()
    try:
        return torch.export.load(path)
    except FileNotFoundError:
        raise _LoadError(f"{path}: no such file") from None
    except Exception as err:  # torch raises many kinds for a file that is not a program
        raise _LoadError(f"{path}: not a torch.export program ({type(err).__name__}: {err})") from None


def _default_passes() -> Sequence[Any]:
    from transforms.pipeline import DEFAULT_PIPELINE

    return DEFAULT_PIPELINE


def _passes(spec: str | None) -> Sequence[Any] | None:
    if spec is None:
        return None
    import transforms

    chosen = []
    for name in filter(None, (s.strip() for s in spec.split(","))):
        fn = getattr(transforms, name, None)
        if not callable(fn):
            raise SystemExit(f"purefx: error: unknown pass {name!r}")
        chosen.append(fn)
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="purefx", description=_DESCRIPTION)
    parser.add_argument("program", nargs="?", help="a .pt2 file from torch.export.save (trusted files only)")
    parser.add_argument("--passes", help="comma-separated pass names (default: the default pipeline)")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
