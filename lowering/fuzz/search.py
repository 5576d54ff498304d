"""The differential fuzzer: generated programs run by eager and by torch's compilers, compared.

:func:`differential` spends its whole budget (no early stop) drawing programs from a hypothesis
strategy and running each through :func:`lowering.fuzz.trial.try_program`. A difference is a
*raw* finding; it is asked of the known deviations (the built-ins of ``lowering.fuzz.known``,
then the caller's) as it is made, and one that is news is kept under its key: backend, kind and
the operator at the cause (so a second bug of one kind is not hidden behind the first). After
the search each kept finding is shrunk: the strategy's draws are replayed under the same seed up
to the failing example, and hypothesis shrinks it while the backend still gives a finding of the
same kind at the same operator, within ``shrink_seconds``. The shrunk program gets a standalone
repro script (``lowering.fuzz.repro``), checked in this process.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from ir.alpha import program_key
from ir.harness import ShrinkBudget
from ir.node import CALL_FUNCTION
from ir.ops import is_mutating, is_random
from ir.printer import format_program
from ir.program import Program
from lowering.fuzz.backends import Backend, FuzzError, resolve
from lowering.fuzz.call_sizes import size_sets, sizes_text
from lowering.fuzz.fuzz_programs import default_programs, whole_paths
from lowering.fuzz.judge import Setup, Verdict, operator_of, reference_module, state_value
from lowering.fuzz.known import BUILTIN_KNOWN
from lowering.fuzz.localize import first_wrong
from lowering.fuzz.reduce import isolated_call, reduce
from lowering.fuzz.refusals import Refusals
from lowering.fuzz.repro import ReproError, shortest_repro
from lowering.fuzz.shown import shows
from lowering.fuzz.torch_bugs import LISTED_BUGS
from lowering.fuzz.trial import placed, try_program


@attrs.frozen
class Finding:
    """One difference between a backend and eager.

    ``backend`` (its name in the mapping given), ``kind`` (``"mismatch"`` or ``"crash"``),
    ``detail`` (one sentence), ``program`` (the shrunk program), ``args`` / ``kwargs`` (its
    inputs), ``repro`` (a standalone script importing torch only: ``Repro``, ``make_inputs``,
    ``difference``; ``""`` when the program cannot be written out), ``cause`` (the operator held
    to be at the cause), ``error`` (largest difference over the output scale), ``reproduced``
    (whether the repro showed the difference, of the finding's own kind, when run here;
    ``None``: not run yet), ``repro_shows`` (the differences the repro showed, as sentences),
    ``count`` (how many drawn examples gave a finding with this key), ``example`` (the index of
    the first), ``setup`` (device, dtype, seed, sizes, grad), ``compiler`` (the backend
    itself); under ``sizes > 1``: ``call`` (which call of the once-compiled callable showed
    it, 0 the first), ``sizes`` (its dynamic sizes, symbol -> size) and ``calls`` (every call
    up to it, ``(sizes, args, kwargs)``, what the repro calls in order)."""

    backend: str
    kind: str
    detail: str
    program: Program = attrs.field(repr=False)
    args: tuple = attrs.field(repr=False)
    kwargs: dict = attrs.field(factory=dict, repr=False)
    repro: str = attrs.field(default="", repr=False)
    cause: str = ""
    error: float = 0.0
    reproduced: bool | None = None
    repro_shows: tuple[str, ...] = ()
    count: int = 1
    example: int = 0
    setup: Setup = attrs.field(factory=Setup)
    compiler: Backend | None = attrs.field(default=None, repr=False)
    call: int = 0
    sizes: Mapping[str, int] = attrs.field(factory=dict)
    calls: tuple = attrs.field(default=(), repr=False)

    @property
    def key(self) -> tuple[str, str, str]:
        """What findings are deduplicated by: backend, kind, operator at the cause."""
        return (self.backend, self.kind, self.cause)

    def summary(self) -> str:
        """One line: backend, kind, cause, detail, size of the shrunk program."""
        n = sum(1 for node in self.program.root_module.graph.nodes if node.op == CALL_FUNCTION)
        at = f" in call {self.call} ({sizes_text(self.sizes)})" if self.call else ""
        return (f"{self.backend}: {self.kind} at {self.cause}{at} ({n} ops, seen "
                f"{self.count}x): {self.detail}")


@attrs.frozen
class FuzzReport:
    """What a run of :func:`differential` found and reached.

    ``findings`` (news, deduplicated by backend, kind and operator at the cause, shrunk);
    ``examples`` (programs run); ``seconds`` (wall time, shrinking included); ``search_seconds``
    (the search alone); ``operators`` / ``features`` (how many programs reached each);
    ``known`` (per known deviation, how many raw findings it explained); ``refused`` (programs
    eager and the backends all refused); ``raw`` (raw findings, before deduplication);
    ``unrunnable`` (per error, the programs that could not be lowered or judged, and, as
    ``shrinking: <error>``, the findings whose shrinking raised, kept as drawn: a fuzzer bug
    or a strategy's, never a backend's); ``unsupported`` (per label, the crashes that were
    refusals torch documents or that the backend's reference shares:
    ``lowering.fuzz.refusals``; never findings); ``skipped`` (under ``grad=True``, per reason,
    the programs eager could not differentiate: nothing compared); ``one_size`` (under
    ``sizes > 1``, the programs without a dynamic dimension, called at their one size);
    ``unshrunk`` (findings left as drawn, their repros not run, because ``shrink_total`` was
    spent before their turn)."""

    findings: tuple[Finding, ...]
    examples: int
    seconds: float
    search_seconds: float = 0.0
    operators: Mapping[str, int] = attrs.field(factory=dict)
    features: Mapping[str, int] = attrs.field(factory=dict)
    known: Mapping[str, int] = attrs.field(factory=dict)
    refused: int = 0
    raw: int = 0
    unrunnable: Mapping[str, int] = attrs.field(factory=dict)
    unsupported: Mapping[str, int] = attrs.field(factory=dict)
    skipped: Mapping[str, int] = attrs.field(factory=dict)
    one_size: int = 0
    unshrunk: int = 0

    @property
    def per_minute(self) -> float:
        """Programs run per minute of search."""
        return 60.0 * self.examples / self.search_seconds if self.search_seconds else 0.0


def differential(
    backends: Mapping[str, Any],
    *,
    programs: st.SearchStrategy[Program] | None = None,
    max_examples: int = 200,
    seconds: float | None = None,
    device: str = "cpu",
    known: Collection[Callable[[Finding], bool]] = (),
    seed: int = 0,
    dtype: torch.dtype | None = None,
    shrink_seconds: float = 120.0,
    progress: Callable[[str], None] | None = None,
    sizes: int = 1,
    grad: bool = False,
    shrink_total: float | None = None,
) -> FuzzReport:
    """Run generated programs through eager and each backend; report the differences.

    Parameters:
        backends: name -> a built-in (``lowering.fuzz.backends.BUILTINS``: ``"inductor"``,
            ``"aot_eager"``, ``"aot_inductor"``, ``"decompositions"``, ``"export_roundtrip"``,
            ``"unflatten"``) or a callable
            ``compile(module) -> callable`` applied to the freshly lowered module.
        programs: a hypothesis strategy of flat Programs (default:
            ``lowering.fuzz.fuzz_programs.default_programs(backends, symbolic=sizes > 1)``).
        max_examples: programs to run (with ``seconds``: no count limit, the time is the budget).
        seconds: the search's time budget; shrinking comes after it (``shrink_seconds`` each).
        device: where programs run (``"cuda"``); the program is moved there first.
        known: more predicates ``finding -> bool`` for deviations not to report, asked after
            ``lowering.fuzz.known.BUILTIN_KNOWN`` and the torch bugs already listed in
            ``docs/findings.md`` (``lowering.fuzz.torch_bugs.LISTED_BUGS``, counted in
            ``FuzzReport.known`` under names that carry their numbers).
        seed: hypothesis's seed and the inputs' and random operators' seed.
        dtype: floating state and inputs cast to it after lowering (``None``: float32 as drawn).
        shrink_seconds: most seconds spent shrinking one finding.
        shrink_total: most seconds spent shrinking all findings together (``None``: no
            limit). Findings are shrunk in the order they were first met; one met after the
            total is spent is reported as drawn, neither shrunk nor its repro written or run
            (``reproduced`` ``None``: unconfirmed), and counted in ``FuzzReport.unshrunk``. A
            run that finds many distinct keys so ends within its search time plus about
            ``shrink_total + 4 * shrink_seconds``.
        progress: called with a one-line status now and then.
        sizes: with ``k > 1``, the default programs have a dynamic dimension (a symbolic batch
            with a range, as ``torch.export`` makes for a ``Dim``), each side's callable is
            built once and called at ``k`` sizes, the drawn one first
            (``lowering.fuzz.call_sizes``), each call compared with eager's on fresh inputs of its
            size; ``"inductor"`` compiles with ``dynamic=True``. Recompiling is allowed; a
            wrong answer at any call is a finding that records the call and its sizes.
        grad: floating inputs and parameters require grad; a fixed random weighting of the
            floating outputs is backpropagated through eager and through each backend's
            callable, and every input's and parameter's gradient compared (kinds ``grad``,
            ``grad_crash``; ``lowering.fuzz.gradients``). Programs eager cannot differentiate
            are skipped and counted (``FuzzReport.skipped``).

    Returns a :class:`FuzzReport`. Raises ``FuzzError`` naming a bad argument. Deterministic in
    ``seed`` for a deterministic backend. Complexity: per program, one lowering and ``sizes``
    eager runs (each with a backward under ``grad``) plus one lowering and compile and
    ``sizes`` runs per backend; per new finding, a shrink within ``shrink_seconds`` and a run
    of its repro.
    """
    resolved = resolve(backends)
    if isinstance(sizes, bool) or not isinstance(sizes, int) or sizes < 1:
        raise FuzzError(f"sizes must be a positive int (how many sizes each program is called "
                        f"at), got {sizes!r}")
    if not isinstance(grad, bool):
        raise FuzzError(f"grad must be a bool, got {grad!r}")
    inference_only = [b for b in resolved if b.target in INFERENCE_ONLY]
    if grad and inference_only:
        first = inference_only[0]
        raise FuzzError(f"backend {first.name!r} compiles for inference only "
                        f"({INFERENCE_ONLY[first.target]}); "
                        "grad=True is not supported for it")
    strategy = default_programs(resolved, symbolic=sizes > 1) if programs is None else programs
    if not isinstance(strategy, st.SearchStrategy):
        raise FuzzError(f"programs must be a hypothesis strategy of Programs, got {strategy!r}")
    if not isinstance(max_examples, int) or max_examples < 1:
        raise FuzzError(f"max_examples must be a positive int, got {max_examples!r}")
    if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0):
        raise FuzzError(f"seconds must be a positive number or None, got {seconds!r}")
    if shrink_total is not None and not (isinstance(shrink_total, (int, float))
                                         and shrink_total >= 0):
        raise FuzzError(f"shrink_total must be a number of seconds >= 0 or None, got "
                        f"{shrink_total!r}")
    search = _Search(resolved, strategy, Setup(device, dtype, seed, sizes, grad),
                     (*BUILTIN_KNOWN, *LISTED_BUGS, *known), progress)
    start = time.monotonic()
    search.explore(max_examples, seconds)
    searched = time.monotonic() - start
    findings, unshrunk = search.shrink_all(shrink_seconds, shrink_total)
    return FuzzReport(tuple(findings), search.examples, time.monotonic() - start, searched,
                      dict(search.operators), dict(search.features), dict(search.known),
                      search.refused, search.raw, dict(search.unrunnable),
                      dict(search.unsupported), dict(search.skipped), search.one_size,
                      unshrunk)


INFERENCE_ONLY: Mapping[str, str] = MappingProxyType({
    "aot_inductor": "its callable's outputs carry no autograd graph",
    "decompositions": "torch documents run_decompositions' graph as inference IR; a backward "
                      "through its module is not supported (aten.copy has no derivative, "
                      "embedding_bag becomes _embedding_bag_forward_only, batch_norm's saved "
                      "running stats are written in place)",
})
"""Built-in targets compiled for inference only, with why: refused under ``grad=True``."""


class _Stop(BaseException):
    """Ends hypothesis's loop when the time budget is spent (hypothesis lets it through)."""


class _Lost(BaseException):
    """The replay did not meet the finding again (a flaky backend): shrinking gives up."""


class _Again(Exception):
    """A shrink candidate still gives the finding: hypothesis keeps it and tries smaller."""


_UNLIMITED = 10**6


class _Search:
    def __init__(self, backends: tuple[Backend, ...], strategy: st.SearchStrategy,
                 setup: Setup, known: tuple, progress: Callable[[str], None] | None) -> None:
        self.backends, self.strategy, self.setup = backends, strategy, setup
        self.known_predicates, self.progress = known, progress
        self.examples = self.refused = self.raw = self.one_size = 0
        self.skipped: Counter = Counter()
        self.operators: Counter = Counter()
        self.features: Counter = Counter()
        self.known: Counter = Counter()
        self.unrunnable: Counter = Counter()
        self.unsupported: Counter = Counter()
        self.refusals = Refusals()
        self.keep_calls = any(b.wants_calls for b in backends)
        self.kept: dict[tuple, Finding] = {}
        self.limit = _UNLIMITED
        self.last_line = 0.0

    def _settings(self, phases: tuple) -> settings:
        return settings(max_examples=self.limit, deadline=None, database=None,
                        phases=phases, suppress_health_check=list(HealthCheck),
                        verbosity=Verbosity.quiet, report_multiple_bugs=False,
                        derandomize=False)

    def explore(self, max_examples: int, seconds: float | None) -> None:
        self.limit = _UNLIMITED if seconds is not None else max_examples
        deadline = None if seconds is None else time.monotonic() + seconds
        self.start = time.monotonic()
        calls = [0]

        @seed(self.setup.seed)
        @self._settings((Phase.generate,))
        @given(self.strategy)
        def each(program: Program) -> None:
            calls[0] += 1
            if deadline is not None and time.monotonic() > deadline:
                raise _Stop
            try:
                self.one(program, calls[0])
            except Exception as exc:  # noqa: BLE001 - a program that cannot be lowered or run
                self.unrunnable[f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"] += 1

        try:
            each()
        except _Stop:
            pass
        self.say(final=True)

    def one(self, drawn: Program, index: int) -> None:
        program = placed(drawn, self.setup, self.keep_calls)
        trial = try_program(program, self.backends, self.setup)
        self.examples += 1
        self.operators.update(_targets(program))
        self.features.update(program_features(program))
        if self.setup.dtype is not None:
            self.features[f"run:{str(self.setup.dtype).removeprefix('torch.')}"] += 1
        if self.setup.sizes > 1 and len(size_sets(program, 2)) < 2:
            self.one_size += 1
        if trial.skipped is not None:
            self.skipped[trial.skipped] += 1
            self.say()
            return
        if trial.eager.error is not None and not any(trial.verdicts.values()):
            self.refused += 1
        for backend in self.backends:
            verdict = trial.verdicts[backend.name]
            if verdict is not None:
                self.found(backend, verdict, trial, index)
        self.say()

    def found(self, backend: Backend, verdict: Verdict, trial: Any, index: int) -> None:
        self.raw += 1
        key = (backend.name, verdict.kind, verdict.cause)
        if key in self.kept:
            self.kept[key] = attrs.evolve(self.kept[key], count=self.kept[key].count + 1)
            return
        finding = Finding(backend.name, verdict.kind, verdict.detail, trial.program, trial.args,
                          trial.kwargs, cause=verdict.cause, error=verdict.error, example=index,
                          setup=self.setup, compiler=backend, **_at_call(trial, verdict))
        name = self.explained(finding)
        if name is not None:
            self.known[name] += 1
            return
        label = self.refusals.classify(finding)
        if label is not None:
            self.unsupported[label] += 1
            return
        self.kept[key] = finding

    def explained(self, finding: Finding) -> str | None:
        """The name of the first known deviation that explains ``finding``, else ``None``."""
        for predicate in self.known_predicates:
            try:
                hit = bool(predicate(finding))
            except Exception:  # noqa: BLE001 - a broken predicate explains nothing
                hit = False
            if hit:
                return getattr(predicate, "name", getattr(predicate, "__name__", repr(predicate)))
        return None

    def say(self, final: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if not final and now - self.last_line < 10.0:
            return
        self.last_line = now
        elapsed = now - self.start
        self.progress(
            f"fuzz: {self.examples} programs in {elapsed:.0f} s "
            f"({60.0 * self.examples / max(elapsed, 1e-9):.1f}/min), {len(self.kept)} new, "
            f"{sum(self.known.values())} known, {len(self.operators)} operators"
            + (f", {sum(self.skipped.values())} not differentiable" if self.setup.grad else ""))

    # --- shrinking ------------------------------------------------------------------------------

    def shrink_all(self, seconds: float,
                   total: float | None = None) -> tuple[list[Finding], int]:
        """The kept findings shrunk (each within ``seconds``), with their repros, merged by
        key, and how many were left as drawn because ``total`` seconds of shrinking were
        spent before their turn (``differential``'s ``shrink_total``)."""
        merged: dict[tuple, Finding] = {}
        deadline = None if total is None else time.monotonic() + total
        unshrunk = 0
        for finding in sorted(self.kept.values(), key=lambda f: f.example):
            if deadline is not None and time.monotonic() >= deadline:
                unshrunk += 1
                _merge(merged, attrs.evolve(finding, reproduced=None))
                continue
            seen = self.seen_already(finding, merged, seconds)
            if seen is not None:  # its drawn program is wrong first at a finding's operator
                _merge(merged, attrs.evolve(merged[seen], count=finding.count))
                continue
            if self.progress is not None:
                self.progress(f"fuzz: shrinking {finding.backend} {finding.kind} at "
                              f"{finding.cause} (example {finding.example})")
            try:
                small = self.shrink(finding, seconds)
            except Exception as exc:  # noqa: BLE001 - a fuzzer bug: counted, the drawn one kept
                self.unrunnable[f"shrinking: {type(exc).__name__}"] += 1
                small = finding
            explained = self.explained(small) if small is not finding else None
            if explained is not None:
                self.known[explained] += finding.count
                continue
            _merge(merged, with_repro(small))
        return list(merged.values()), unshrunk

    def seen_already(self, finding: Finding, merged: Mapping[tuple, Finding],
                     seconds: float) -> tuple | None:
        """The key of a finding in ``merged`` (shrunk already) that ``finding`` is held to be
        before any shrinking, else ``None``: its drawn program, localized
        (:meth:`at_first_wrong`, the first :data:`~lowering.fuzz.localize.MOST_CUTS` cuts, within
        ``seconds``), is wrong first at an operator a finding of its backend and kind was
        localized at. What its shrink would end at where the cause stays the first wrong node
        (a shrink keeps the finding and a cut program is wrong there still); asked only of a
        mismatch or grad finding (a crash's cause is its error, not an operator) whose backend
        and kind have a shrunk finding. O(cuts * (lower + compile + run))."""
        if finding.kind not in _VALUE_KINDS or not any(
                k[:2] == finding.key[:2] for k in merged):
            return None
        held, wrong = self.at_first_wrong(finding, seconds)
        return held.key if wrong is not None and held.key in merged else None

    def shrink(self, finding: Finding, seconds: float) -> Finding:
        """``finding`` with the smallest program reached within about ``2 * seconds``: the
        strategy's draws replayed and shrunk by hypothesis (nothing when the replay does not
        meet the finding again), the node at the cause localized (the first whose cut program
        is wrong, ``lowering.fuzz.localize.first_wrong``), the program reduced node by node
        keeping its operator, that node isolated first (``lowering.fuzz.reduce``), then
        localized again and that node isolated. Every step keeps a finding of its kind."""
        target_key = program_key(finding.program)
        calls = [0]
        best: list[Finding] = []
        budget = ShrinkBudget(seconds, _Again)
        low = _low_precision(finding.program)

        def check(drawn: Program) -> None:
            again = self.gives(finding, placed(drawn, self.setup, self.keep_calls), low)
            if again is not None:
                best.append(again)
                raise _Again

        @seed(self.setup.seed)
        @self._settings((Phase.generate, Phase.shrink))
        @given(self.strategy)
        def replay(drawn: Program) -> None:
            calls[0] += 1
            if calls[0] < finding.example:
                return
            if calls[0] == finding.example and program_key(
                    placed(drawn, self.setup, self.keep_calls)) != target_key:
                raise _Lost
            if calls[0] > finding.example and not best:
                raise _Lost
            budget.run(calls[0], lambda: check(drawn))

        try:
            budget.guard(replay)
        except (Exception, _Lost):  # noqa: BLE001, S110 - _Again, or hypothesis's Flaky
            pass  # the best candidate so far is kept either way
        small, wrong = self.at_first_wrong(best[-1] if best else finding, seconds)
        last: list[Finding] = []

        def still(program: Program) -> bool:
            # judged against ``small`` as it is at the call: its cause moves with it below
            again = self.gives(small, program, low)
            if again is not None:
                last.append(again)
            return again is not None

        reduce(small.program, still, seconds=seconds, cause=small.cause, at=wrong)
        small = attrs.evolve(last[-1], cause=small.cause) if last else small
        small, wrong = self.at_first_wrong(small, seconds)
        if wrong is not None and isolated_call(small.program, still, None, wrong) is not None:
            return attrs.evolve(last[-1], cause=small.cause)
        return small

    def at_first_wrong(self, finding: Finding, seconds: float) -> tuple[Finding, str | None]:
        """``finding`` held to be at the operator of the first node of its program whose cut
        program is wrong (``lowering.fuzz.localize.first_wrong``, within ``seconds``), and that
        node's name; ``finding`` itself and ``None`` where no cut is. O(cuts * (lower +
        compile + run))."""
        wrong = first_wrong(finding.program, finding.compiler, self.setup, finding.kind, seconds)
        if wrong is None:
            return finding, None
        graph = finding.program.root_module.graph
        return attrs.evolve(finding, cause=operator_of(graph, wrong)), wrong

    def gives(self, finding: Finding, program: Program, low: frozenset) -> Finding | None:
        """``finding`` again on ``program`` (its backend gives a finding of its kind, at its
        operator for a crash, in a program holding its operator and no new low-precision
        dtype; for a backend that reads preserved calls, one whose modules have every call
        preserved or none, ``lowering.fuzz.fuzz_programs.whole_paths``), else ``None``."""
        if not _low_precision(program) <= low:
            return None
        if finding.compiler is not None and finding.compiler.wants_calls \
                and not whole_paths(program):
            return None  # only some calls of a module preserved: no program export gives
        if finding.kind in _VALUE_KINDS and finding.cause not in _targets(program) \
                and finding.cause != "?":
            return None
        backend = finding.compiler
        try:
            trial = try_program(program, (backend,), self.setup)
        except Exception:  # noqa: BLE001 - a candidate that cannot be run is no finding
            return None
        verdict = trial.verdicts[backend.name]
        if verdict is None or verdict.kind != finding.kind or trial.eager.error is not None:
            return None
        if finding.kind not in _VALUE_KINDS and verdict.cause != finding.cause:
            return None
        again = attrs.evolve(finding, detail=verdict.detail, program=program, args=trial.args,
                             kwargs=trial.kwargs, cause=verdict.cause, error=verdict.error,
                             **_at_call(trial, verdict))
        return None if self.refusals.classify(again) is not None else again


_VALUE_KINDS = frozenset({"mismatch", "grad"})
"""Kinds whose cause is an operator of the program (the others: an error's)."""


def _at_call(trial: Any, verdict: Verdict) -> dict[str, Any]:
    """A finding's fields for the call of ``trial`` that showed ``verdict``."""
    calls = tuple((dict(c.sizes), c.args, c.kwargs) for c in trial.calls[:verdict.call + 1])
    return {"call": verdict.call, "sizes": dict(verdict.sizes), "calls": calls}


def _merge(merged: dict[tuple, Finding], finding: Finding) -> None:
    """``finding`` into ``merged`` (key -> finding): a second one of its key adds its count
    to the first."""
    old = merged.get(finding.key)
    merged[finding.key] = finding if old is None else attrs.evolve(
        old, count=old.count + finding.count)


def with_repro(finding: Finding) -> Finding:
    """``finding`` with its repro script written and run here: the short one where it shows
    the finding (``lowering.fuzz.repro.shortest_repro``), what it showed (``repro_shows``) and
    whether that is the finding again (``reproduced``: a difference of the finding's own kind,
    ``lowering.fuzz.shown.shows``; another difference the repro happens to show is not)."""
    setup = finding.setup
    try:
        module = reference_module(finding.program, setup)
        state = {fqn: state_value(module, fqn) for fqn in finding.program.state}
        backend = finding.compiler
        target = backend.target if backend is not None else "callable"
        compile_fn = backend.compile if backend is not None and target == "callable" else None
        text, problems = shortest_repro(
            finding.program, finding.args, finding.kwargs, state, target=target,
            summary=finding.summary(), compile=compile_fn,
            observe_state=backend is None or backend.observes_state,
            calls=finding.calls, dynamic=setup.sizes > 1, grad=setup.grad, seed=setup.seed,
            nested=backend is not None and backend.wants_calls,
            shows=functools.partial(shows, finding.kind, finding.detail))
    except ReproError as err:
        return attrs.evolve(finding, repro="", reproduced=False,
                            detail=f"{finding.detail} (no repro: {err})")
    return attrs.evolve(finding, repro=text, repro_shows=tuple(problems),
                        reproduced=shows(finding.kind, finding.detail, problems))


def program_features(program: Program) -> frozenset[str]:
    """The features a program exercises, as the report counts them: ``inplace_ops``,
    ``buffer_mutation``, ``input_mutation``, ``keyword_inputs``, ``pytree_outputs``,
    ``multi_result_ops`` (a ``getitem``), ``random_ops``, ``tied_state``, ``constants``,
    ``noncontiguous`` (a value whose strides are not contiguous), ``dynamic_shapes`` (a
    symbolic size) and ``dtype:<name>`` per dtype of a value. O(nodes)."""
    found: set[str] = set()
    sig = program.signature
    kinds = {o.kind for o in sig.outputs}
    if "buffer_mutation" in kinds:
        found.add("buffer_mutation")
    if "user_input_mutation" in kinds:
        found.add("input_mutation")
    if any(s.kind == "constant_tensor" for s in sig.inputs):
        found.add("constants")
    keys = [slot.tensor for slot in program.state.values()]
    if len(keys) != len(set(keys)):
        found.add("tied_state")
    root_sig = program.call_signatures.get("")
    if root_sig is not None:
        text = str(root_sig.in_spec)
        if "dict" in text:
            found.add("keyword_inputs")
        if "list" in str(root_sig.out_spec) or "dict" in str(root_sig.out_spec):
            found.add("pytree_outputs")
    for node in program.root_module.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            found.add(f"dtype:{str(val.dtype).removeprefix('torch.')}")
            if any(isinstance(s, torch.SymInt) for s in val.shape):
                found.add("dynamic_shapes")
            elif val.numel() > 1 and not val.is_contiguous():
                found.add("noncontiguous")
        if node.op != CALL_FUNCTION:
            continue
        if getattr(node.target, "__name__", "") == "getitem":
            found.add("multi_result_ops")
        elif is_random(node.target):
            found.add("random_ops")
        elif is_mutating(node.target):
            found.add("inplace_ops")
    return frozenset(found)


def _targets(program: Program) -> set[str]:
    return {str(n.target) for n in program.root_module.graph.nodes if n.op == CALL_FUNCTION}


def _low_precision(program: Program) -> frozenset:
    found = set()
    for node in program.root_module.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype in (torch.float16, torch.bfloat16):
            found.add(val.dtype)
    return frozenset(found)


def program_text(finding: Finding) -> str:
    """The finding's program as purefx text (``ir.format_program``)."""
    return format_program(finding.program)


__all__ = ["INFERENCE_ONLY", "Finding", "FuzzReport", "differential", "program_features", "program_text",
           "with_repro"]
