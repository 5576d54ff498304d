"""The preserve sweep: every called submodule of every zoo model, preserved in turn.

Run it as ``python -m tests.preserve_sweep [--full] [--json F]`` from the repository root. Without
``--full`` it runs the deterministic CI sample (:func:`sample`); ``--full`` runs every case.

**Cases.** For every model of ``tests/zoo.py`` and ``tests/zoo_hf.py`` (each distinct eager model
once: variants and preserved copies of one model are one model here), a case is one set of
preserved fqns and one IR:

* each submodule that the eager forward calls, alone (``preserve_module_call_signature=(fqn,)``);
* each pair of called siblings (two called children of one module, the root included);
* in training IR (``torch.export.export``, non-strict) and after ``run_decompositions()``.

Modules reached under two names are swept under their first name (``named_modules()`` order).

**Checks**, each against the eager model (tolerance 1e-5), in this order; the first that does not
hold decides the case:

1. ``lower(transform(import_ep(ep)))`` builds;
2. two calls give eager's outputs (same pytree structure), and after each call
   ``named_buffers(remove_duplicate=False)`` holds eager's names and values;
3. ``state_dict()`` keys equal eager's, in eager's order;
4. ``named_modules()`` names equal eager's, in eager's order. Only names are compared: a
   container or holder (a ``Sequential``, a ``ModuleList``, a never-called ``ModuleDict`` that
   comes back as a dict-like holder) counts when it stands at the eager path; its class does not
   (the program does not record every class). HOP subgraphs and ``foo@1`` copies are extra names,
   so they fail this check;
5. a module built the same way again, with each preserved submodule replaced by a deep copy of
   the eager one (``setattr`` on its parent), gives eager's first output.

``torch.export.unflatten`` gets a deep copy of the same program (it writes to the program it is
given) and the same checks.

**Classes.** A purefx case is ``pass``; or ``documented`` when building raises a ``PurefxError``
that matches one of the :data:`DOCUMENTED` classes (a named reason why the case cannot pass);
or ``failure`` (any other exception, an internal error, a wrong number, a wrong tree). A case that
torch cannot export (or decompose) is ``not exportable`` and counted apart. torch's cases are
``pass`` or ``failure``.

:data:`KNOWN_FAILURES` lists the cases that fail today for reasons issue #12 items 1-5 fix; the
test (``tests/test_preserve_sweep.py``) checks it strictly both ways, so the list only shrinks.

Everything is seeded (the zoo's factories and inputs are); cases run in a fixed order; eager
models, eager results and training-IR exports are built once per run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import itertools
import json
import logging
import re
import sys
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import torch
import torch.utils._pytree as pytree
from torch import nn

import ir
from ir import import_ep
from ir.errors import first_line
from lowering import lower
from transforms import transform

try:
    from .zoo import CASES, Case
    from .zoo_hf import HF_CASES
except ImportError:  # tests/ is on sys.path, not a package (pytest's rootdir conftest)
    from zoo import CASES, Case
    from zoo_hf import HF_CASES

TOL = {"atol": 1e-5, "rtol": 1e-5}
PASS, DOCUMENTED_CLASS, FAILURE, NOT_EXPORTABLE = "pass", "documented", "failure", "not exportable"
IRS = ("train", "decomp")


# --------------------------------------------------------------------------
# Documented PassError classes: cases that cannot pass, each with its reason
# --------------------------------------------------------------------------


@attrs.frozen
class ErrorClass:
    """A named reason why a preserved case cannot pass: the error type and message it raises."""

    name: str
    error: type[ir.PurefxError]
    pattern: str  # a regular expression searched in the message
    reason: str

    def matches(self, exc: BaseException) -> bool:
        return isinstance(exc, self.error) and re.search(self.pattern, str(exc)) is not None


# One row per class. A PurefxError matching none of them is a failure.
DOCUMENTED: tuple[ErrorClass, ...] = ()


def documented_class(exc: BaseException) -> str | None:
    """The name of the documented class ``exc`` belongs to, or None."""
    return next((c.name for c in DOCUMENTED if c.matches(exc)), None)


# --------------------------------------------------------------------------
# Models and cases
# --------------------------------------------------------------------------


@attrs.frozen
class SweepCase:
    """One export: a model, the fqns it preserves and the IR (``train`` or ``decomp``)."""

    model: str
    preserve: tuple[str, ...]
    ir: str

    @property
    def id(self) -> str:
        return f"{self.model}|{self.ir}|{','.join(self.preserve)}"


def sweep_models() -> dict[str, Case]:
    """Each distinct eager model of the zoo once: base cases (no variant suffix), not preserved.

    The Hugging Face cases that only preserve a block of a model listed already are left out.
    """
    models = {n: c for n, c in CASES.items() if "[" not in n}
    models |= {n: c for n, c in HF_CASES.items() if "[" not in n and not c.preserve}
    return {
        n: attrs.evolve(c, preserve=(), strict=False, decompose=False)
        for n, c in sorted(models.items())
    }


def called_modules(model: nn.Module, case: Case) -> list[str]:
    """Fqns of the submodules one eager call runs, in ``named_modules()`` order (root left out).

    A deep copy is called with a global forward pre-hook (the model keeps its state); its modules
    are matched by path. Where the hook cannot run (eager ``torch.cond``, ``map`` and
    ``while_loop`` trace their bodies with dynamo, which refuses the hook's side effect), every
    submodule counts as called.
    """
    twin = copy.deepcopy(model)
    path_of = {id(m): p for p, m in twin.named_modules()}
    ran: set[str] = set()

    def record(mod: nn.Module, args: Any) -> None:
        if id(mod) in path_of:
            ran.add(path_of[id(mod)])

    handle = nn.modules.module.register_module_forward_pre_hook(record)
    try:
        with torch.no_grad():
            call(twin, case)
    except Exception:  # noqa: BLE001 - the hook under dynamo: take every module
        ran = set(path_of.values())
    finally:
        handle.remove()
    return [p for p, _ in model.named_modules() if p and p in ran]


def sibling_pairs(called: list[str]) -> list[tuple[str, str]]:
    """Each two called fqns that are next to each other among the called children of a parent.

    Adjacent pairs, not all pairs: a block's sub-layers are adjacent (attention and MLP, the
    norms around them), and all pairs would square the sweep's size on wide modules.
    """
    by_parent: dict[str, list[str]] = {}
    for fqn in called:
        by_parent.setdefault(fqn.rpartition(".")[0], []).append(fqn)
    return [pair for kids in by_parent.values() for pair in itertools.pairwise(kids)]


def model_cases(name: str, called: list[str]) -> list[SweepCase]:
    """Every case of one model: singles then sibling pairs, training IR then decomposed."""
    sets = [(f,) for f in called] + sibling_pairs(called)
    return [SweepCase(name, fqns, r) for fqns in sets for r in IRS]


def sample(cases: Iterable[SweepCase], per_model: int = 2) -> list[SweepCase]:
    """The deterministic CI sample: per model, the ``per_model`` cases of smallest crc32 of id.

    A hash of the case id, not a hand-picked list, so the sample cannot be tuned to.
    """
    by_model: dict[str, list[SweepCase]] = {}
    for c in cases:
        by_model.setdefault(c.model, []).append(c)
    picked = {
        c.id
        for group in by_model.values()
        for c in sorted(group, key=lambda c: zlib.crc32(c.id.encode()))[:per_model]
    }
    return [c for c in itertools.chain.from_iterable(by_model.values()) if c.id in picked]


# --------------------------------------------------------------------------
# Eager reference (once per model)
# --------------------------------------------------------------------------


@attrs.frozen
class Reference:
    """What the eager model does: outputs and buffers after each of two calls, names."""

    case: Case
    pristine: nn.Module
    outputs: tuple[Any, Any]
    buffers: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]
    state_keys: tuple[str, ...]
    module_names: tuple[str, ...]


def call(mod: Callable, case: Case) -> Any:
    """Call ``mod`` on fresh inputs of ``case``; stdout swallowed (some models print)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return mod(*case.args(), **case.kwargs())


def buffers(mod: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in mod.named_buffers(remove_duplicate=False)}


def reference(case: Case) -> Reference:
    """Build ``case``'s eager model once and record two calls of a copy of it."""
    pristine = case.make()
    eager = copy.deepcopy(pristine)
    outs, bufs = [], []
    for _ in range(2):
        outs.append(_detach(call(eager, case)))
        bufs.append(buffers(eager))
    return Reference(
        case,
        pristine,
        tuple(outs),
        tuple(bufs),
        tuple(pristine.state_dict()),
        tuple(n for n, _ in pristine.named_modules()),
    )


def _detach(tree: Any) -> Any:
    return pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, tree)


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


class CheckFailed(Exception):
    """A check of the sweep did not hold (the message says which and how)."""


def same(got: Any, want: Any, what: str) -> None:
    if pytree.tree_structure(got) != pytree.tree_structure(want):
        raise CheckFailed(f"{what}: structure {pytree.tree_structure(got)} != eager's")
    try:
        torch.testing.assert_close(got, want, **TOL)
    except AssertionError as e:
        raise CheckFailed(f"{what}: {first_line(e)}") from None


def check_module(build: Callable[[], nn.Module], ref: Reference, preserve: tuple[str, ...]) -> None:
    """Run checks 2-5 on modules from ``build`` (raises ``CheckFailed`` or the module's error)."""
    m = build()
    for i in range(2):
        same(_detach(call(m, ref.case)), ref.outputs[i], f"output of call {i + 1}")
        got = buffers(m)
        if list(got) != list(ref.buffers[i]):
            raise CheckFailed(f"buffer names after call {i + 1}: {_diff(got, ref.buffers[i])}")
        same(got, ref.buffers[i], f"buffers after call {i + 1}")
    keys = tuple(m.state_dict())
    if keys != ref.state_keys:
        raise CheckFailed(f"state_dict keys: {_diff(keys, ref.state_keys)}")
    names = tuple(n for n, _ in m.named_modules())
    if names != ref.module_names:
        raise CheckFailed(f"named_modules: {_diff(names, ref.module_names)}")
    swapped = build()
    for fqn in preserve:
        parent, _, leaf = fqn.rpartition(".")
        setattr(swapped.get_submodule(parent), leaf, copy.deepcopy(ref.pristine.get_submodule(fqn)))
    same(_detach(call(swapped, ref.case)), ref.outputs[0], "output with the eager module swapped in")


def _diff(got: Iterable[str], want: Iterable[str]) -> str:
    got, want = list(got), list(want)
    extra = [n for n in got if n not in set(want)]
    missing = [n for n in want if n not in set(got)]
    if not extra and not missing:
        return "same names, another order"
    return f"extra {extra[:4]}{'...' if len(extra) > 4 else ''}, missing {missing[:4]}"


# --------------------------------------------------------------------------
# Running a case
# --------------------------------------------------------------------------


@attrs.frozen
class Outcome:
    """The class of one case for one tool, with the detail that decided it."""

    status: str  # PASS, DOCUMENTED_CLASS, FAILURE or NOT_EXPORTABLE
    detail: str = ""
    error_class: str | None = None


@attrs.frozen
class Result:
    case: SweepCase
    purefx: Outcome
    torch: Outcome


class Sweep:
    """Runs cases with eager references and training-IR exports cached for the whole run."""

    def __init__(self) -> None:
        self.models = sweep_models()
        self._refs: dict[str, Reference] = {}
        self._train: dict[tuple[str, tuple[str, ...]], Any] = {}

    def ref(self, model: str) -> Reference:
        if model not in self._refs:
            self._refs[model] = reference(self.models[model])
        return self._refs[model]

    def cases(self) -> list[SweepCase]:
        """Every case of the full sweep, in a fixed order."""
        out: list[SweepCase] = []
        for name in self.models:
            ref = self.ref(name)
            out += model_cases(name, called_modules(ref.pristine, ref.case))
        return out

    def export(self, c: SweepCase) -> torch.export.ExportedProgram:
        """The case's program (a training-IR export is shared by its decomposed case)."""
        key = (c.model, c.preserve)
        if key not in self._train:
            ref = self.ref(c.model)
            try:
                self._train[key] = torch.export.export(
                    copy.deepcopy(ref.pristine),
                    ref.case.args(),
                    ref.case.kwargs(),
                    strict=False,
                    dynamic_shapes=ref.case.dynamic_shapes() if ref.case.dynamic_shapes else None,
                    preserve_module_call_signature=c.preserve,
                )
            except Exception as e:  # noqa: BLE001 - torch's own failure, kept for the report
                self._train[key] = e
        ep = self._train[key]
        if isinstance(ep, Exception):
            raise ep
        return ep.run_decompositions() if c.ir == "decomp" else ep

    def run(self, c: SweepCase) -> Result:
        ref = self.ref(c.model)
        try:
            ep = self.export(c)
        except Exception as e:  # noqa: BLE001
            out = Outcome(NOT_EXPORTABLE, _short(e))
            return Result(c, out, out)
        return Result(c, self._purefx(ep, ref, c), self._torch(ep, ref, c))

    def _purefx(self, ep: Any, ref: Reference, c: SweepCase) -> Outcome:
        try:
            program = transform(import_ep(ep))
        except ir.PurefxError as e:
            name = documented_class(e)
            if name is not None:
                return Outcome(DOCUMENTED_CLASS, _short(e), name)
            return Outcome(FAILURE, "transform: " + _short(e))
        except Exception as e:  # noqa: BLE001 - an internal error is a failure, recorded
            return Outcome(FAILURE, "transform: " + _short(e))
        return _checked(lambda: lower(program), ref, c)

    def _torch(self, ep: Any, ref: Reference, c: SweepCase) -> Outcome:
        def build() -> nn.Module:
            with contextlib.redirect_stdout(io.StringIO()):
                return torch.export.unflatten(copy.deepcopy(ep))

        return _checked(build, ref, c)


def _checked(build: Callable[[], nn.Module], ref: Reference, c: SweepCase) -> Outcome:
    try:
        check_module(build, ref, c.preserve)
    except CheckFailed as e:
        return Outcome(FAILURE, str(e))
    except Exception as e:  # noqa: BLE001 - crashes are failures, recorded
        return Outcome(FAILURE, _short(e))
    return Outcome(PASS)


def _short(e: BaseException, limit: int = 240) -> str:
    text = f"{type(e).__name__}: {first_line(e, limit)}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Warnings and log records (torch's, purefx's) off while the sweep runs; stdout is
    swallowed per call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def run_sweep(
    full: bool = False,
    progress: Callable[[Result], None] | None = None,
    shard: tuple[int, int] = (0, 1),
    models: frozenset[str] | None = None,
    irs: tuple[str, ...] = IRS,
    skip: frozenset[str] = frozenset(),
) -> list[Result]:
    """Run the CI sample (or every case with ``full``) and return the results in case order.

    ``shard=(k, n)`` runs only the cases at positions ``k, k + n, k + 2n, ...`` (to spread one
    sweep over ``n`` processes; ``--report`` joins their JSON files). ``models`` keeps only the
    cases of those models, ``irs`` those of these IRs, and ``skip`` leaves out these case ids
    (all before sharding).
    """
    torch.manual_seed(0)
    sweep = Sweep()
    with quiet():
        cases = sweep.cases()
        chosen = cases if full else sample(cases)
        chosen = [
            c
            for c in chosen
            if (models is None or c.model in models) and c.ir in irs and c.id not in skip
        ]
        chosen = chosen[shard[0] :: shard[1]]
        results = []
        for c in chosen:
            results.append(sweep.run(c))
            if progress is not None:
                progress(results[-1])
    return results


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def counts(results: list[Result]) -> dict[str, dict[str, int]]:
    """Per tool: total, pass, failure, not exportable and one count per documented class."""
    table: dict[str, dict[str, int]] = {}
    for tool in ("purefx", "torch"):
        outs = [getattr(r, tool) for r in results]
        row = Counter(o.status for o in outs)
        classes = Counter(o.error_class for o in outs if o.error_class)
        table[tool] = {
            "total": len(outs),
            "exportable": len(outs) - row[NOT_EXPORTABLE],
            PASS: row[PASS],
            DOCUMENTED_CLASS: row[DOCUMENTED_CLASS],
            FAILURE: row[FAILURE],
            NOT_EXPORTABLE: row[NOT_EXPORTABLE],
            **{f"class {k}": v for k, v in sorted(classes.items())},
        }
    return table


def format_table(results: list[Result]) -> str:
    """The summary as a Markdown table (one row per tool) and the failure list."""
    table = counts(results)
    cols = sorted({k for row in table.values() for k in row}, key=_col_order)
    lines = ["| tool | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for tool, row in table.items():
        lines.append(f"| {tool} | " + " | ".join(str(row.get(k, 0)) for k in cols) + " |")
    known = [r for r in results if r.purefx.status == FAILURE and r.case.id in KNOWN_FAILURES]
    new = [r for r in results if r.purefx.status == FAILURE and r.case.id not in KNOWN_FAILURES]
    fixed = [r for r in results if r.purefx.status != FAILURE and r.case.id in KNOWN_FAILURES]
    lines.append("")
    lines.append(
        f"purefx failures: {len(known)} known (KNOWN_FAILURES), {len(new)} new; "
        f"{len(fixed)} known failures now pass"
    )
    for title, group in (("new failures", new), ("known failures", known)):
        if group:
            lines.append(f"\n{title}:")
            lines += [f"  {r.case.id}: {r.purefx.detail}" for r in group]
    if fixed:
        lines.append("\nno longer failing (remove from KNOWN_FAILURES):")
        lines += [f"  {r.case.id}" for r in fixed]
    return "\n".join(lines)


def _col_order(col: str) -> tuple[int, str]:
    fixed = ["total", "exportable", PASS, DOCUMENTED_CLASS, FAILURE, NOT_EXPORTABLE]
    return (fixed.index(col), col) if col in fixed else (len(fixed), col)


def to_json(results: list[Result]) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "counts": counts(results),
        "cases": [
            {"id": r.case.id, "purefx": attrs.asdict(r.purefx), "torch": attrs.asdict(r.torch)}
            for r in results
        ],
    }


def from_json(data: dict[str, Any]) -> list[Result]:
    """The results a ``--json`` file holds."""
    out = []
    for row in data["cases"]:
        model, ir_name, fqns = row["id"].split("|")
        case = SweepCase(model, tuple(fqns.split(",")), ir_name)
        out.append(Result(case, Outcome(**row["purefx"]), Outcome(**row["torch"])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.preserve_sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--full", action="store_true", help="every case, not the CI sample")
    parser.add_argument("--json", metavar="F", help="write every case's outcome to F")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    parser.add_argument("--shard", metavar="K/N", default="0/1", help="run every N-th case from K")
    parser.add_argument("--models", metavar="A,B", help="only the cases of these models")
    parser.add_argument("--ir", choices=IRS, help="only the cases of this IR")
    parser.add_argument("--skip", nargs="+", default=(), metavar="F", help="cases in these JSONs")
    parser.add_argument(
        "--report", nargs="+", metavar="F", help="the table of JSON files (later files win)"
    )
    opts = parser.parse_args(argv)
    if opts.report:
        by_id: dict[str, Result] = {}  # a case in a later file replaces the same case before
        for path in opts.report:
            with open(path) as f:
                by_id |= {r.case.id: r for r in from_json(json.load(f))}
        print(format_table(list(by_id.values())))
        return 0
    start = time.perf_counter()
    k, _, n = opts.shard.partition("/")

    done: list[Result] = []

    def progress(r: Result) -> None:
        done.append(r)
        if opts.verbose:
            sys.stderr.write(f"{r.purefx.status:>14} {r.torch.status:>14}  {r.case.id}\n")
        if opts.json and len(done) % 10 == 0:  # a long sweep that is stopped keeps its cases
            _write_json(opts.json, done)

    skip: set[str] = set()
    for path in opts.skip:
        with open(path) as f:
            skip |= {r.case.id for r in from_json(json.load(f))}
    results = run_sweep(
        full=opts.full,
        progress=progress,
        shard=(int(k), int(n)),
        models=frozenset(opts.models.split(",")) if opts.models else None,
        irs=(opts.ir,) if opts.ir else IRS,
        skip=frozenset(skip),
    )
    print(format_table(results))
    print(f"\n{len(results)} cases in {time.perf_counter() - start:.0f} s")
    if opts.json:
        _write_json(opts.json, results)
    return 0


def _write_json(path: str, results: list[Result]) -> None:
    with open(path, "w") as f:
        json.dump(to_json(results), f, indent=1)


# --------------------------------------------------------------------------
# Known failures (issue #12 items 1-4 remove them); kept exact by tests/test_preserve_sweep.py
# --------------------------------------------------------------------------
# From the full sweep on the merged code (1084 exportable cases, 2026-11-24): none. The last class (item 4,
# ``ancestor_sibling``: a preserved module reads state owned by a sibling of its ancestor, which
# the parent passed as extra arguments, so a swapped-in eager module got too many) is fixed by
# ``transforms.passes.foreign_state.hold_foreign_state``.
# Cases the sweep has not reached in a run are not listed; `-m sweep` reports them as new.

KNOWN_FAILURES: frozenset[str] = frozenset()


if __name__ == "__main__":
    sys.exit(main())
