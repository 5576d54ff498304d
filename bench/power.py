"""The power of purefx's checkers, measured (issue 60, item 1): ``python -m bench.power``.

Every planted bug the project has is checked under N seeds at the budget a user gets, and so
is every correct twin written beside them:

- pass bugs (``check_laws``): ``tests/laws/test_planted_bugs.py``, ``..._heldout.py``,
  ``..._programs_like.py``, ``test_teeth.py``, ``test_planted_motif_bugs.py`` (bugs in ``planted_motifs.py``) and
  ``test_planted_fast_math_and_forms.py`` (bugs in ``planted_fast_math.py`` and ``planted_forms.py``), each
  bug with its own options (programs, tolerances) and, where it gives no programs, none: as
  its test and a user call it, so the default programs' first phase is followed by the pass's
  own targets (``lowering.law_targets``); ``check_laws(..., seed=s)`` for s in
  0..N-1, found, not shrunk (a run stops at its first violation). Per bug: the catch rate
  (seeds where a ``LawViolation`` was raised), the median number of programs drawn up to and
  including the first that broke a law, and the laws that caught it (the law the suite
  expects in brackets when another one did). Per twin: the pass rate and the median number
  of programs it changed.
- wrong rules (``check_rule``): ``tests/heldout_rules.py`` (``WRONG``; ``RIGHT`` and
  ``tests/rule_library.py``'s ``RULES`` as twins). Where ``check_rule`` takes a ``seed`` it
  runs under each; until then it runs once, under its content seed, and the row says
  ``seed-independent: not yet``.
- planted backends (``lowering.fuzz.differential``): ``tests/fuzz_planted.py`` as
  ``tests/test_fuzz.py`` plants them, under the fuzzer's own ``seed``, its default budget of
  200 programs; ``eager`` is the twin.

Nothing here asserts: it prints a table (``--markdown``: one the docs can take as it is).
Flags: ``--seeds N`` (default 20: seeds 0..N-1; ``--seed-list 2,9,16``: those), ``--examples E`` (default 100, ``check_laws``'s budget),
``--fuzz-examples F`` (default 200), ``--only REGEX`` (on ``family:source:name``), ``--quick``
(3 seeds, 30 examples, the main suite only), ``--jobs J`` (processes; default 1), ``--json``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]


@attrs.frozen
class Case:
    """One thing checked under every seed: a planted bug or its correct twin.

    ``run(seed, examples)`` returns an ``Outcome``; ``seeded`` is False where the checker takes
    no seed yet (it runs once)."""

    family: str  # "pass", "rule", "fuzz"
    source: str  # the module it comes from
    name: str
    bug: bool
    law: str  # the law the suite expects (bugs), "" for twins
    run: Callable[[int, int], Outcome] = attrs.field(repr=False)
    seeded: bool = True

    @property
    def key(self) -> str:
        return f"{self.family}:{self.source}:{self.name}"


@attrs.frozen
class Outcome:
    """One seed's run: ``caught`` (a law broke), the law, how many examples were drawn up to
    the first violation (or in all), how many were changed (twins), an error that is no
    verdict (a crash of the checker), seconds."""

    caught: bool
    law: str = ""
    examples: int | None = None
    changed: int | None = None
    error: str = ""
    seconds: float = 0.0


def _on_path(*folders: Path) -> None:
    """The repository root and the tests' folders importable (their modules import siblings by
    bare name, as pytest lets them), each once."""
    for folder in folders:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


# --- pass bugs (check_laws) ---------------------------------------------------------------------


def _found() -> Any:
    """Found, not shrunk, no database: a run stops at its first violation."""
    from hypothesis import Phase, settings

    return settings(phases=[Phase.explicit, Phase.generate], database=None)


def _laws_run(fn: Callable, options: dict, programs: Any = None) -> Callable[[int, int], Outcome]:
    """A case run as its test runs it: ``check_laws(fn, **options)``, with ``programs`` where
    the case draws its own; with none, no ``programs=`` at all, so that ``check_laws`` spends
    the budget as a user's call does (the default programs, then the pass's own targets:
    ``lowering.law_targets``). The examples to the first catch are the violation's
    ``tried``."""

    def run(seed: int, examples: int) -> Outcome:
        from lowering.pass_laws import LawViolation, check_laws

        options_here = {k: v for k, v in options.items() if k != "settings"}
        chosen = options_here.pop("programs", None)
        chosen = programs if chosen is None else chosen  # (a strategy has no truth value)
        if chosen is not None:
            options_here["programs"] = chosen
        try:
            report = check_laws(fn, max_examples=examples, settings=_found(), seed=seed,
                                **options_here)
        except LawViolation as caught:
            return Outcome(True, caught.law, caught.tried)
        return Outcome(False, "", report.tried, report.changed)

    return run


def _pass_cases() -> Iterator[Case]:
    _on_path(ROOT, ROOT / "tests", ROOT / "tests" / "laws")

    def law_of(law: Any) -> str:
        return law if isinstance(law, str) else "|".join(law)

    main = importlib.import_module("tests.laws.test_planted_bugs")
    for bug, options, law, *_ in main.PLANTED:
        yield Case("pass", "planted_bugs", bug.__name__, True, law_of(law), _laws_run(bug, options))
    for twin, options in main.CORRECT:
        yield Case("pass", "planted_bugs", twin.__name__, False, "", _laws_run(twin, options))

    held = importlib.import_module("tests.laws.test_planted_bugs_heldout")
    for bug, options, law, *_ in held.PLANTED:
        yield Case("pass", "heldout", bug.__name__ + _suffix(options), True, law_of(law),
                   _laws_run(bug, options))
    for twin, options in held.CORRECT:
        yield Case("pass", "heldout", twin.__name__ + _suffix(options), False, "",
                   _laws_run(twin, options))

    like = importlib.import_module("tests.laws.test_planted_bugs_programs_like")
    strategy = _LazyLike(like)
    for fn, bug, where, law, *_ in like.PLANTED:
        yield Case("pass", "programs_like", f"{fn.__name__}[{bug}]@{where}", True, law_of(law),
                   _laws_run(like._named(fn, bug), {},
                             strategy if where == "like" else None))
    for row in like.CORRECT:  # a row, or a ``pytest.param`` of one (its marks aside)
        fn, where, options = getattr(row, "values", row)
        for at in (("defaults", "like") if where == "both" else (where,)):
            yield Case("pass", "programs_like", f"{fn.__name__}@{at}", False, "",
                       _laws_run(fn, options, strategy if at == "like" else None))

    teeth = importlib.import_module("tests.laws.test_teeth")
    for bug, options, law, *_ in teeth.PLANTED:
        yield Case("pass", "teeth", bug.__name__, True, law_of(law), _laws_run(bug, options))
    yield Case("pass", "teeth", "deduplicate", False, "",
               _laws_run(teeth.deduplicate, {"programs": teeth.REPEATED, "idempotent": True}))

    edges = importlib.import_module("tests.laws.test_planted_fast_math_and_forms")
    for bug, options, law, *_ in edges.PLANTED:
        yield Case("pass", "fast_math_forms", bug.__name__, True, law_of(law),
                   _laws_run(bug, options))
    for twin, options in edges.CORRECT:
        yield Case("pass", "fast_math_forms", twin.__name__, False, "", _laws_run(twin, options))

    try:
        motifs = importlib.import_module("tests.laws.test_planted_motif_bugs")
    except ImportError as missing:
        print(f"note: tests/laws/test_planted_motif_bugs.py not importable ({missing}); its bugs are "
              f"not measured", file=sys.stderr)
        return
    for bug, options, law, *_ in motifs.PLANTED:
        yield Case("pass", "motifs", bug.__name__ + _suffix(options), True, law_of(law),
                   _laws_run(bug, options))
    for row in motifs.CORRECT:  # a row, or a ``pytest.param`` of one (its marks aside)
        twin, options, *_ = getattr(row, "values", row)
        yield Case("pass", "motifs", twin.__name__ + _suffix(options), False, "",
                   _laws_run(twin, options))


def _suffix(options: dict) -> str:
    """Tells apart two rows of one pass with other programs (``_outlined``)."""
    return "_other_programs" if "programs" in options else ""


class _LazyLike:
    """``programs_like`` of the masked MLP, built on first use (one per process)."""

    def __init__(self, module: Any) -> None:
        self.module, self.built = module, None

    def map(self, f: Callable) -> Any:
        if self.built is None:
            from lowering.like import programs_like

            self.built = programs_like(self.module.lp.masked_mlp()[1])
        return self.built.map(f)

    def __bool__(self) -> bool:
        return True


# --- wrong rules (check_rule) -------------------------------------------------------------------


def _rule_seeded() -> bool:
    from transforms.rewrite.rule_check import check_rule

    return "seed" in inspect.signature(check_rule).parameters


def _rule_run(rule: Any) -> Callable[[int, int], Outcome]:
    def run(seed: int, examples: int) -> Outcome:
        from lowering.pass_laws import LawViolation
        from transforms.rewrite.rule_check import check_rule

        extra = {"seed": seed} if _rule_seeded() else {}
        try:
            checked = check_rule(rule, **extra)
        except LawViolation as caught:
            return Outcome(True, caught.law)
        return Outcome(False, "", checked.ran, checked.rewritten)

    return run


def _rule_cases() -> Iterator[Case]:
    _on_path(ROOT, ROOT / "tests")
    seeded = _rule_seeded()
    held = importlib.import_module("tests.heldout_rules")
    for rule in held.WRONG:
        yield Case("rule", "heldout_rules", rule.name, True, "rule", _rule_run(rule), seeded)
    for rule in held.RIGHT:
        yield Case("rule", "heldout_rules", rule.name, False, "", _rule_run(rule), seeded)
    library = importlib.import_module("tests.rule_library")
    for rule in library.RULES:
        yield Case("rule", "rule_library", rule.name, False, "", _rule_run(rule), seeded)


# --- planted backends (the fuzzer) --------------------------------------------------------------

_FUZZ = {"alpha": "drop_alpha_when_broadcast", "keepdim": "sum_for_keepdim_mean",
         "clone": "skip_add_on_clone", "integer": "integer_off_by_one", "eager": "eager"}
"""``tests/test_fuzz.py``'s planted backends by the name it gives them (``eager``: correct)."""


def _fuzz_run(name: str, attribute: str, budget: list[int]) -> Callable[[int, int], Outcome]:
    def run(seed: int, examples: int) -> Outcome:
        import fuzz_planted

        from lowering.fuzz import differential

        report = differential({name: getattr(fuzz_planted, attribute)}, seed=seed,
                              max_examples=budget[0], shrink_seconds=1)
        found = [f for f in report.findings if f.kind == "mismatch"]
        if found:
            return Outcome(True, "mismatch", min(f.example for f in found) + 1)
        return Outcome(False, "", report.examples, None)

    return run


def _fuzz_cases(budget: list[int]) -> Iterator[Case]:
    _on_path(ROOT, ROOT / "tests")
    for name, attribute in _FUZZ.items():
        yield Case("fuzz", "fuzz_planted", name, name != "eager",
                   "mismatch" if name != "eager" else "", _fuzz_run(name, attribute, budget))


# --- running and printing -----------------------------------------------------------------------

_FUZZ_BUDGET = [200]


def cases(families: tuple[str, ...] = ("pass", "rule", "fuzz")) -> list[Case]:
    """Every case of ``families``, in a fixed order (the same in every process)."""
    found: list[Case] = []
    if "pass" in families:
        found += _pass_cases()
    if "rule" in families:
        found += _rule_cases()
    if "fuzz" in families:
        found += _fuzz_cases(_FUZZ_BUDGET)
    return found


_BY_KEY: dict[str, Case] = {}


def _one(key: str, seed: int, examples: int, fuzz_examples: int) -> tuple[str, int, Outcome]:
    """Run case ``key`` under ``seed`` (in a worker: the cases are built once per process)."""
    _FUZZ_BUDGET[0] = fuzz_examples
    if not _BY_KEY:
        _BY_KEY.update((c.key, c) for c in cases())
    case = _BY_KEY[key]
    start = time.perf_counter()
    try:
        outcome = case.run(seed, examples)
    except Exception as exc:  # noqa: BLE001 - a checker's crash is reported, not a verdict
        first = (str(exc).splitlines() or [""])[0][:120]
        outcome = Outcome(False, "", error=f"{type(exc).__name__}: {first}")
    return key, seed, attrs.evolve(outcome, seconds=time.perf_counter() - start)


def row(case: Case, outcomes: list[Outcome]) -> dict[str, Any]:
    """The figures of one case over its seeds."""
    n = len(outcomes)
    caught = [o for o in outcomes if o.caught]
    errors = Counter(o.error for o in outcomes if o.error)
    laws = Counter(o.law for o in caught)
    first = [o.examples for o in caught if o.examples is not None]
    changed = [o.changed for o in outcomes if not o.caught and o.changed is not None]
    return {
        "family": case.family, "source": case.source, "name": case.name,
        "kind": "bug" if case.bug else "twin", "expected": case.law, "seeds": n,
        "caught": len(caught), "passed": n - len(caught) - sum(errors.values()),
        "median_first": statistics.median(first) if first else None,
        "median_changed": statistics.median(changed) if changed else None,
        "laws": dict(laws), "errors": dict(errors), "seeded": case.seeded,
        "seconds": round(sum(o.seconds for o in outcomes), 1),
    }


def _laws_text(r: dict) -> str:
    text = ", ".join(f"{law} {k}" if len(r["laws"]) > 1 else law for law, k in r["laws"].items())
    unexpected = [law for law in r["laws"] if law not in r["expected"].split("|")]
    if r["expected"] and unexpected:
        text += f" [expected {r['expected']}]"
    return text or "-"


def _cells(r: dict) -> list[str]:
    n = r["seeds"]
    if r["kind"] == "bug":
        verdict = f"caught {r['caught']}/{n}"
        figure = "-" if r["median_first"] is None else f"{r['median_first']:g}"
        law = _laws_text(r)
    else:
        verdict = f"passed {r['passed']}/{n}"
        figure = "-" if r["median_changed"] is None else f"{r['median_changed']:g} changed"
        law = _laws_text(r) if r["laws"] else "-"
    notes = []
    if not r["seeded"]:
        notes.append("seed-independent: not yet (content seed)")
    if r["errors"]:
        notes.append("; ".join(f"{k} x{v}" for k, v in r["errors"].items()))
    return [f"{r['family']}:{r['source']}", r["name"], r["kind"], verdict, figure, law,
            " ".join(notes), f"{r['seconds']:.0f}"]


HEADER = ["source", "name", "kind", "verdict", "examples to first catch / changed", "law",
          "notes", "s"]


def table(rows: list[dict], markdown: bool) -> str:
    """The rows as a markdown table, or as aligned text."""
    body = [_cells(r) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
                  for cells in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(HEADER, *body, strict=False)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
                     for cells in [HEADER, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per case (0..N-1)")
    parser.add_argument("--seed-list", default=None,
                        help="these seeds instead (comma-separated), e.g. the tests' sample")
    parser.add_argument("--examples", type=int, default=100, help="check_laws' max_examples")
    parser.add_argument("--fuzz-examples", type=int, default=200, help="the fuzzer's budget")
    parser.add_argument("--only", default=None, help="regex on family:source:name")
    parser.add_argument("--families", default="pass,rule,fuzz", help="subset of pass,rule,fuzz")
    parser.add_argument("--quick", action="store_true",
                        help="3 seeds, 30 examples, the main planted-bug suite only")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--json", default=None, help="write every outcome to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.examples, args.fuzz_examples = 3, 30, 50
        args.only = args.only or r"^pass:planted_bugs:"
    _FUZZ_BUDGET[0] = args.fuzz_examples
    chosen = [c for c in cases(tuple(args.families.split(",")))
              if args.only is None or re.search(args.only, c.key)]
    _BY_KEY.update((c.key, c) for c in chosen)
    seeds = ([int(s) for s in args.seed_list.split(",")] if args.seed_list
             else list(range(args.seeds)))
    work = [(c.key, s) for c in chosen for s in (seeds if c.seeded else seeds[:1])]
    print(f"bench.power: {len(chosen)} cases, seeds {seeds}, {args.examples} examples "
          f"(fuzzer: {args.fuzz_examples}), {len(work)} runs, {args.jobs} job(s)",
          file=sys.stderr)
    results: dict[str, list[Outcome]] = {c.key: [] for c in chosen}
    start = time.perf_counter()
    if args.jobs > 1:
        import multiprocessing

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_one, k, s, args.examples, args.fuzz_examples) for k, s in work]
            for done in futures:
                key, _, outcome = done.result()
                results[key].append(outcome)
    else:
        for key, seed in work:
            _, _, outcome = _one(key, seed, args.examples, args.fuzz_examples)
            results[key].append(outcome)
            print(f"  {key} seed {seed}: {'caught ' + outcome.law if outcome.caught else 'held'}"
                  f"{' ' + outcome.error if outcome.error else ''} (examples {outcome.examples}, "
                  f"changed {outcome.changed}, {outcome.seconds:.1f} s)",
                  file=sys.stderr, flush=True)
    rows = [row(c, results[c.key]) for c in chosen]
    print(table(rows, args.markdown))
    print(f"\n{len(work)} runs in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"seeds": seeds, "examples": args.examples, "fuzz_examples": args.fuzz_examples,
             "rows": rows, "outcomes": {k: [attrs.asdict(o) for o in v]
                                        for k, v in results.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
