"""The ``purefx`` command: import, transform and lower a program, and check the result.

``purefx`` runs the built-in example model; ``purefx MODEL.pt2`` loads a program saved with
``torch.export.save``. Either way it imports the program, runs each pass and lowers the result
(timing each stage, with a progress bar on a terminal for large programs), prints the module tree
and checks the lowered module against ``ep.module()`` on the program's example inputs.

Exit status: 0 when the check passes (or the program carries no example inputs), 1 when it fails,
2 for bad input (a file that is not a program, an unknown pass, a program purefx cannot handle).

A .pt2 file is scanned before it is loaded (``ir.load_program``): a file whose loading would
unpickle anything or run code from it is refused with one line naming the member; ``--trust``
loads it with ``torch.export.load``, which unpickles: a crafted file can then run any code. Only
load files you trust with ``--trust``. ``--max-members``, ``--max-bytes`` and ``--max-ratio``
raise the caps on the archive (zip bombs).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

import torch

from ir import PurefxError, import_ep
from ir.errors import shorten
from ir.load import DEFAULT_LIMITS, Limits, load_program
from ir.program import Program
from ir.torch_seam import pytree
from lowering.export import save_ep
from lowering.lower import lower
from lowering.report import Stage, format_module_tree, html_report
from lowering.stage_modules import format_stage_plan
from transforms.pipeline import DEFAULT_PIPELINE, named_passes
from transforms.rewrite import (
    ASSUMPTIONS,
    VERDICTS_OFF,
    RewriteReport,
    Rule,
    SaturationReport,
    rewrite_report,
    saturate_report,
)
from transforms.rewrite_rules import ATTENTION_ASSUMES
from transforms.stages import split_stages

Pass = Callable[[Program], Program]

LARGE = 2000  # nodes in the exported graph from which a run shows a progress bar (on a terminal)

_EPILOG = """\
A .pt2 file is scanned first and refused (one line, exit status 2) if loading it would unpickle
anything or run code from it. With --trust it is loaded with torch.export.load, which unpickles
the weights and constants stored in it: a crafted file can run any code when loaded. Only load
files you trust.

exit status: 0 check passed (or no example inputs), 1 check failed, 2 bad input or error."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 on PASS, 1 on FAIL, 2 on bad input).
    ``purefx fuzz ...`` runs the differential fuzzer instead (``lowering.fuzz.command``)."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["fuzz"]:
        from lowering.fuzz.command import main as fuzz_main

        return fuzz_main(given[1:])
    args = _parser().parse_args(given)
    try:
        passes = _passes(args.passes)
        rules = load_rules(args.rules)
        assume = _assume(args.assume)
        if args.search and args.stages is not None:
            raise UsageError(
                "--search rewrites the program, --stages only prints its stage plan: give one "
                "of them"
            )
        _check_search(args.search, args.frozen_state, rules)
        ep, source = _load(args)
        if args.stages is not None:
            plan = stage_plan(ep, args.stages)
            sys.stdout.write(f"purefx: {source}\n{plan}\n")
            return 0
        progress = _Progress.for_run(ep, args.progress, sys.stderr)
        result = run(ep, passes=passes, progress=progress, rules=rules, assume=assume,
                     search=args.search, verdicts=_verdicts(args.verdicts),
                     frozen_state=args.frozen_state)
        if args.out:
            save_ep(result.program, args.out)
        if args.html:
            _write(args.html, html_report(
                source=source, stages=result.stages, verdict=result.verdict, passed=result.passed,
                rewrites=result.rewrites, search=result.search,
            ))
    except (PurefxError, UsageError) as err:
        sys.stderr.write(f"purefx: error: {_one_line(err)}\n")
        return 2
    sys.stdout.write(f"purefx: {source}\n{result.text}\n")
    if args.html:
        sys.stdout.write(f"report written to {args.html}\n")
    return 1 if result.passed is False else 0


def stage_plan(ep: torch.export.ExportedProgram, at: str) -> str:
    """The pipeline stage plan of ``ep`` (``lowering.stage_modules.format_stage_plan`` of
    ``transforms.split_stages``): cut at the comma-separated module paths ``at``, or, for
    ``auto:K`` / ``auto:K:flops``, in ``K`` stages balanced by parameter bytes (the default) or
    FLOPs. A ``PassError`` names an unknown path, a bad ``K`` or measure; a malformed ``auto``
    spec is a ``UsageError``. Pure; O(n + c * K) in the program's nodes and cut candidates."""
    spec = at.strip()
    if spec.startswith("auto:") or spec == "auto":
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[1].strip().lstrip("-").isdigit():
            raise UsageError(
                f"--stages {at!r}: write auto:K or auto:K:params or auto:K:flops (K stages)"
            )
        balance = parts[2].strip() if len(parts) == 3 else "params"
        stages = split_stages(import_ep(ep), n=int(parts[1]), balance=balance)
        return format_stage_plan(stages)
    paths = [a.strip() for a in at.split(",") if a.strip()]
    return format_stage_plan(split_stages(import_ep(ep), paths))


class UsageError(Exception):
    """Bad input to the command: a file that is not a program, an unknown pass, a bad path."""


class RunResult:
    """What one run found: its stages, the lowered module, and the check's verdict.

    ``passed`` is ``True``/``False`` for PASS/FAIL and ``None`` when the program carries no
    example inputs to check with.
    """

    def __init__(
        self, stages: list[Stage], module: torch.nn.Module, passed: bool | None, verdict: str,
        rewrites: RewriteReport | None = None, search: SaturationReport | None = None,
    ) -> None:
        self.stages = stages
        self.module = module
        self.passed = passed
        self.verdict = verdict
        self.rewrites = rewrites  #: what ``--rules`` rewrote (``None``: no rules, or ``--search``)
        self.search = search  #: what ``--rules ... --search`` found (``None``: no search)

    @property
    def program(self) -> Program:
        """The final Program (the one that was lowered)."""
        return next(s.program for s in reversed(self.stages) if s.program is not None)

    @property
    def text(self) -> str:
        """The stage table, the module tree and the verdict, as printed by the command."""
        lines = [f"{'stage':<30} {'ms':>10} {'nodes':>8} {'modules':>8}"]
        for s in self.stages:
            counts = (
                f" {s.program.node_count():8d} {s.program.module_count():8d}"
                if s.program is not None
                else ""
            )
            lines.append(f"  {s.name:<28} {1e3 * s.seconds:10.2f}{counts}")
        if self.rewrites is not None:
            counts = ", ".join(f"{k} {v}" for k, v in self.rewrites.counts.items())
            lines.append(f"rewrites: {counts}")
            for name, flags in self.rewrites.not_granted.items():
                lines.append(f"  not applied: {name} assumes {', '.join(sorted(flags))} "
                             "(grant with --assume)")
        if self.search is not None:
            lines.append("search:")
            lines.extend("  " + line for line in str(self.search).splitlines())
        lines.append("module tree:")
        lines.extend("  " + line for line in format_module_tree(self.program).splitlines())
        lines.append(f"check against ep.module(): {self.verdict}")
        return "\n".join(lines)


def run(
    ep: torch.export.ExportedProgram,
    passes: Sequence[Pass] | None = None,
    progress: _Progress | None = None,
    rules: Sequence[Rule] = (),
    assume: frozenset[str] = frozenset(),
    search: bool = False,
    verdicts: Any = None,
    frozen_state: bool = False,
) -> RunResult:
    """Import ``ep``, apply ``passes`` one by one (default: the default pipeline), then the
    rewrite ``rules`` if any (``transforms.rewrite``, one stage ``rewrite``, granting the
    assumptions ``assume``; with ``search``, ``saturate_report`` instead, one stage
    ``saturate``: equality saturation and the cheapest program extracted), lower, check.
    ``verdicts``: where the rules' verdicts are kept between runs
    (``transforms.rewrite.check_rules``: ``None`` for the default store, a directory, ``False``
    for none); the rules granted are checked first, those without a verdict on the cores.
    ``frozen_state`` (with ``search``): ``saturate``'s ``frozen_state=True``: the caller will
    neither train the result nor load other state into it, so values computed from state alone
    are free to the search and folded into constants.

    Every stage is timed; ``progress`` (optional) is told when each one starts and ends.
    Raises ``UsageError`` for ``search`` without rules, and for ``frozen_state`` without
    ``search``.
    """
    _check_search(search, frozen_state, rules)
    chosen = list(DEFAULT_PIPELINE if passes is None else passes)
    progress = progress or _Progress(0, None)
    progress.total = len(chosen) + 2 + bool(rules)
    stages: list[Stage] = []
    report: list[RewriteReport] = []
    searched: list[SaturationReport] = []

    def rewritten(program: Program) -> Program:
        out, done = rewrite_report(program, rules, assume, verdicts=verdicts)
        report.append(done)
        return out

    def saturated(program: Program) -> Program:
        out, done = saturate_report(program, rules, assume=assume, verdicts=verdicts,
                                    frozen_state=frozen_state)
        searched.append(done)
        return out

    def timed(name: str, work: Callable[[], Any]) -> Any:
        progress.start(name)
        start = time.perf_counter()
        made = work()
        seconds = time.perf_counter() - start
        progress.done()
        stages.append(Stage(name, seconds, made if isinstance(made, Program) else None))
        return made

    try:
        program = timed("import_ep", lambda: import_ep(ep))
        for p in chosen:
            program = timed(_name(p), lambda p=p, program=program: p(program))
        if rules and search:
            program = timed("saturate", lambda program=program: saturated(program))
        elif rules:
            program = timed("rewrite", lambda program=program: rewritten(program))
        module = timed("lower", lambda: lower(program))
    finally:
        progress.close()
    passed, verdict = check(ep, module)
    return RunResult(stages, module, passed, verdict, report[0] if report else None,
                     searched[0] if searched else None)


def check(ep: torch.export.ExportedProgram, module: torch.nn.Module) -> tuple[bool | None, str]:
    """Run ``ep.module()`` and ``module`` on copies of ``ep.example_inputs``; compare outputs and
    mutated inputs. Returns ``(passed, "PASS (largest abs error ...)")``, ``passed`` ``None``
    when ``ep`` has no example inputs."""
    if ep.example_inputs is None:
        return None, "SKIPPED (the program carries no example inputs)"
    args, kwargs = copy.deepcopy(ep.example_inputs)
    try:
        expected = ep.module()(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 (nothing to compare with: not purefx's failure)
        return None, f"SKIPPED (ep.module() raised {type(err).__name__}: {_one_line(err)})"
    args_m, kwargs_m = copy.deepcopy(ep.example_inputs)
    try:
        got = module(*args_m, **kwargs_m)
    except Exception as err:  # noqa: BLE001 (any failure of the lowered module is a FAIL)
        return False, f"FAIL (the lowered module raised {type(err).__name__}: {_one_line(err)})"
    pairs = [(expected, got), ((args, kwargs), (args_m, kwargs_m))]
    worst = 0.0
    for want, have in pairs:
        spec_w = pytree.tree_structure(want)
        spec_h = pytree.tree_structure(have)
        if spec_w != spec_h:
            return False, "FAIL (the outputs have another structure than ep.module()'s)"
        leaves = zip(pytree.tree_leaves(want), pytree.tree_leaves(have))
        for e, g in leaves:
            problem, error = _compare(e, g)
            if problem:
                return False, f"FAIL ({problem})"
            worst = max(worst, error)
    return True, f"PASS (largest abs error {worst:.3g})"


def _compare(expected: Any, got: Any) -> tuple[str | None, float]:
    if not isinstance(expected, torch.Tensor):
        return (None if expected == got else f"value {got!r} where {expected!r} was expected"), 0.0
    if not isinstance(got, torch.Tensor):
        return f"a {type(got).__name__} where a tensor was expected", 0.0
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return (
            f"{got.dtype} {tuple(got.shape)} where {expected.dtype} {tuple(expected.shape)} "
            "was expected"
        ), 0.0
    if not expected.numel():
        return None, 0.0
    error = (got.detach().double() - expected.detach().double()).abs().nan_to_num(0.0).max().item()
    try:
        torch.testing.assert_close(got, expected, equal_nan=True)
    except AssertionError:
        return f"largest abs error {error:.3g}", error
    return None, error


# --- loading --------------------------------------------------------------------------------------


def _load(args: argparse.Namespace) -> tuple[torch.export.ExportedProgram, str]:
    """The program named on the command line, loaded safely unless ``--trust`` (ir/load.py)."""
    if args.program is None:
        from lowering.example_model import example_program

        return example_program(), "the built-in example model (lowering/example_model.py)"
    limits = Limits(max_members=args.max_members, max_bytes=args.max_bytes, max_ratio=args.max_ratio)
    return load_program(args.program, trust=args.trust, limits=limits), args.program


def _one_line(err: BaseException) -> str:
    """``err``'s message on one line, cut at 300 characters between words
    (``ir.errors.shorten``)."""
    return shorten(" ".join(str(err).split()), 300)


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise UsageError(f"{path}: cannot write the report ({err.strerror or err})") from None


# --- passes ---------------------------------------------------------------------------------------


def _name(p: Pass) -> str:
    return getattr(p, "__name__", None) or str(p)


def known_passes() -> dict[str, Pass]:
    """Pass name -> pass, for ``--passes``: ``transforms.pipeline.named_passes`` (the names
    ``transform`` accepts too)."""
    return named_passes()


def _passes(spec: str | None) -> list[Pass] | None:
    if spec is None:
        return None
    known = known_passes()
    chosen = []
    for name in filter(None, (s.strip() for s in spec.split(","))):
        if name not in known:
            raise UsageError(f"unknown pass {name!r}; known passes: {', '.join(known)}")
        chosen.append(known[name])
    return chosen


_NO_RULES = (
    "--search searches with the rewrite rules, and none were given: name them with --rules "
    "MODULE:NAME (e.g. --rules transforms.rewrite_rules:RULES --search)"
)


_FROZEN_ALONE = (
    "--frozen-state tells the search that state will not change, and there is no search: "
    "give it with --rules MODULE:NAME --search"
)


def _check_search(search: bool, frozen_state: bool, rules: Sequence[Rule]) -> None:
    """``--search`` needs ``--rules`` (naming at least one rule); ``--frozen-state`` needs
    ``--search``; a ``UsageError`` saying so."""
    if search and not rules:
        raise UsageError(_NO_RULES)
    if frozen_state and not search:
        raise UsageError(_FROZEN_ALONE)


def _assume(spec: str | None) -> frozenset[str]:
    """The flags ``--assume`` names; a ``UsageError`` naming the known ones for an unknown one."""
    if not spec:
        return frozenset()
    flags = frozenset(f.strip() for f in spec.split(",") if f.strip())
    unknown = sorted(flags - ASSUMPTIONS)
    if unknown:
        raise UsageError(
            f"--assume: unknown assumption(s) {unknown}; the known ones are {sorted(ASSUMPTIONS)}"
        )
    return flags


def _verdicts(value: str | None) -> Any:
    """``--verdicts`` as ``check_rules`` takes it: ``None`` (the default store), ``False``
    (``off``, ``none``, ``0``: no store) or the directory."""
    if value is None:
        return None
    return False if value.strip().lower() in VERDICTS_OFF else value


def load_rules(spec: str | None) -> list[Rule]:
    """The rules ``--rules`` names: ``module:NAME`` (several separated by commas), each a ``Rule``
    or a sequence of them, found by importing ``module`` (the user's own code: it runs). Raises
    ``UsageError`` naming the spec when the module cannot be imported or the name is not rules."""
    if not spec:
        return []
    found: list[Rule] = []
    for part in filter(None, (s.strip() for s in spec.split(","))):
        module_name, colon, attr = part.partition(":")
        if not colon or not module_name or not attr:
            raise UsageError(f"--rules {part!r}: expected MODULE:NAME, e.g. mypkg.rules:RULES")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise UsageError(f"--rules {part!r}: cannot import {module_name!r} ({err})") from None
        value = getattr(module, attr, None)
        items = [value] if isinstance(value, Rule) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(r, Rule) for r in items):
            raise UsageError(
                f"--rules {part!r}: {module_name}.{attr} is {type(value).__name__}, expected a "
                "transforms.rewrite.Rule or a list or tuple of them"
            )
        found.extend(items)
    return found


# --- progress -------------------------------------------------------------------------------------


class _Progress:
    """A one-line progress bar over the stages of a run, on a terminal's stderr.

    Nothing is written when ``stream`` is ``None``; the line is cleared when the run ends.
    """

    WIDTH = 24

    def __init__(self, total: int, stream: IO[str] | None) -> None:
        self.total = total
        self.stream = stream
        self.finished = 0
        self.started = 0.0

    @classmethod
    def for_run(cls, ep: torch.export.ExportedProgram, mode: str, stream: IO[str]) -> _Progress:
        """``mode`` ``auto``: a bar only on a terminal and for a program of ``LARGE`` nodes."""
        if mode == "off":
            return cls(0, None)
        if mode == "auto":
            tty = getattr(stream, "isatty", lambda: False)()
            if not tty or len(ep.graph.nodes) < LARGE:
                return cls(0, None)
        return cls(0, stream)

    def start(self, name: str) -> None:
        self.started = time.perf_counter()
        self._draw(name)

    def done(self) -> None:
        self.finished += 1

    def close(self) -> None:
        if self.stream is not None:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def _draw(self, name: str) -> None:
        if self.stream is None:
            return
        filled = round(self.WIDTH * self.finished / max(1, self.total))
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r\x1b[2K[{bar}] {self.finished}/{self.total} {name}")
        self.stream.flush()


_ATTENTION_FLAGS = ",".join(sorted(ATTENTION_ASSUMES))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="purefx",
        description=(
            "Import a torch.export program into purefx's IR, run each pass and lower it back;\n"
            "print the time and node/module counts of each pass, the module tree, and a check\n"
            "of the lowered module against ep.module() on the program's example inputs."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "program",
        nargs="?",
        help="a .pt2 file saved with torch.export.save (scanned and refused if loading it would "
        "run code from it, unless --trust); default: the built-in example model",
    )
    parser.add_argument(
        "--passes",
        metavar="A,B,C",
        help="comma-separated passes to run, in order (default: the default pipeline, "
        + ", ".join(_name(p) for p in DEFAULT_PIPELINE)
        + "; known passes: "
        + ", ".join(known_passes())
        + ")",
    )
    parser.add_argument(
        "--rules",
        metavar="MODULE:NAME",
        help="rewrite rules (transforms.rewrite.Rule, or a list of them) to run after the passes, "
        "imported from a module of yours, e.g. mypkg.rules:RULES (comma-separated for several; "
        "transforms.rewrite_rules:RULES holds the shipped rules, ATTENTION the attention set, "
        f"which applies only with --assume {_ATTENTION_FLAGS})",
    )
    parser.add_argument(
        "--assume",
        metavar="FLAG,...",
        help="assumptions granted to the rewrite rules (comma-separated, out of "
        + ", ".join(sorted(ASSUMPTIONS))
        + "; default none: exact IEEE semantics); a rule that assumes more is not applied. The "
        f"shipped attention rules need {_ATTENTION_FLAGS} "
        "(transforms.rewrite_rules.ATTENTION_ASSUMES): fused attention equals eager up to "
        "rounding for finite inputs, as inductor assumes",
    )
    parser.add_argument(
        "--verdicts",
        metavar="DIR|off",
        help="where the rules' verdicts (check_rule's, keyed by each rule's content) are kept "
        "between runs: a directory, or off to keep none (default: $PUREFX_VERDICTS, else "
        "~/.cache/purefx/verdicts; the shipped rules' verdicts ship with purefx). Rules without "
        "a verdict are checked on every core",
    )
    parser.add_argument(
        "--search",
        action="store_true",
        help="with --rules: search instead of rewriting greedily (transforms.rewrite."
        "saturate_report: equality saturation, then the cheapest program under the roofline "
        "cost model; a rule with both_ways=True, or passed with its reverse, never cycles); "
        "prints the cost before and after, why the search stopped and the rewrites kept, and "
        "--html charts the e-graph's growth per round (docs/search.md)",
    )
    parser.add_argument(
        "--frozen-state",
        action="store_true",
        help="with --search: the program will be neither trained nor given other state, so "
        "the search counts values computed from parameters, buffers and constants alone as "
        "free and folds them into new constants (saturate(..., frozen_state=True)); the report "
        "says how many were folded",
    )
    parser.add_argument(
        "--stages",
        metavar="A,B|auto:K[:flops]",
        help="print the pipeline stage plan instead (split_stages at these module paths: each "
        "begins a stage; or auto:K for K stages balanced by parameter bytes, auto:K:flops by "
        "FLOPs): per stage its inputs, modules, share of state and FLOPs, and what it sends on",
    )
    parser.add_argument(
        "--html",
        metavar="REPORT.html",
        help="also write one self-contained HTML page: the module tree, each module's graphs and "
        "a diff of the IR text per pass",
    )
    parser.add_argument(
        "--out",
        metavar="NEW.pt2",
        help="also write the rewritten program, exported back with export_ep, with "
        "torch.export.save",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help=f"progress bar on stderr (auto: on a terminal, for programs of {LARGE} nodes or more)",
    )
    parser.add_argument(
        "--trust",
        action="store_true",
        help="load the file even if it holds pickles, custom objects or code (torch.export.load "
        "unpickles them: only for files you trust)",
    )
    parser.add_argument(
        "--max-members", type=int, default=DEFAULT_LIMITS.max_members, metavar="N",
        help=f"most members a .pt2 archive may hold (default {DEFAULT_LIMITS.max_members})",
    )
    parser.add_argument(
        "--max-bytes", type=int, default=DEFAULT_LIMITS.max_bytes, metavar="N",
        help=f"most bytes a .pt2 file and its members may hold (default {DEFAULT_LIMITS.max_bytes})",
    )
    parser.add_argument(
        "--max-ratio", type=float, default=DEFAULT_LIMITS.max_ratio, metavar="R",
        help="largest compression ratio of a .pt2 archive or member (default "
        f"{DEFAULT_LIMITS.max_ratio:g}; zip bombs exceed it)",
    )
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
