"""``check_rules``: the verdicts of many rules, reached once: kept in memory, read from the
shipped verdicts or the store on disk (``transforms.rewrite.verdict_store``), else checked
(``check_rule``) on the machine's cores.

A verdict is found, in order: beside the rule in this process (``rule_cache``); among the
shipped verdicts, by the rule's ``verdict_key`` (its content and the versions, never its
name); in the store; else ``check_rule`` runs, the rules still unchecked spread over a pool of
processes (forked, so a rule's functions need not be importable or picklable; at most
``MAX_WORKERS``, one torch thread each; every one joined before the call returns), and each
verdict is written to the store. A verdict reached inside a hypothesis test (where
``check_rule`` draws from a seeded generator instead) is kept in memory only.

Verdicts ship for each torch release line they were computed on. Under a torch outside those
lines, the first check of a process says so once, in one line (``NoShippedVerdicts``, a
``UserWarning``): how many rules it checks now, about how long the shipped set takes, and where
the verdicts are kept for the next process.

Run as ``python -m transforms.rewrite.verdicts --write`` to regenerate the running torch line's
shipped verdicts (``verdict_store.SHIPPED``; the other lines' are kept) from the shipped rules
(``shipped_rules``), ``--check`` to recompute them and exit 1 where they drift.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ir.errors import PassError, PurefxError
from transforms.machinery.law_violation import LawViolation
from transforms.rewrite.refusal import check_rule, refusal
from transforms.rewrite.rule import Rule, rule_cache
from transforms.rewrite.rule_check import Checked
from transforms.rewrite.rule_key import verdict_key, versions
from transforms.rewrite.verdict_store import (
    Stored,
    VerdictStore,
    shipped,
    shipped_lines,
    store_for,
    write_shipped,
)

MAX_WORKERS = 8
"""At most this many processes check rules at once."""

SHIPPED_CHECK_SECONDS = 45
"""About how long the shipped rules' first check takes on two cores (``python -m
bench.verdicts`` on torch 2.14.1 before its verdicts shipped: 43-44 s): what
``NoShippedVerdicts`` announces."""


class NoShippedVerdicts(UserWarning):
    """This torch is outside the release lines whose rule verdicts ship with purefx, so rules
    are checked at first use (once per store). Raised as a warning, once per process;
    ``warnings.filterwarnings("ignore", category=NoShippedVerdicts)`` silences it."""


_WARNED: list[bool] = []  #: whether this process has said ``NoShippedVerdicts`` (says nothing else)


def check_rules(rules: Iterable[Rule], *, verdicts: Any = None,
                workers: int | None = None) -> tuple[BaseException | bool, ...]:
    """Reach ``check_rule``'s verdict on each rule of ``rules`` (see the module docstring for
    where it is looked for) and keep it beside the rule (``rule_verdict``); return them in
    order: ``True`` for a right or ``trusted`` rule, the ``LawViolation`` for a wrong one.

    Parameters:
        rules: ``Rule`` values (a rule given twice is checked once).
        verdicts: the store (``verdict_store.store_for``): ``None`` for the default
            (``PUREFX_VERDICTS``, else the user's cache directory), a directory, or ``False``
            for none (verdicts kept in memory only).
        workers: how many processes check the rules not found (default: the cores this
            process may use and torch's thread count, whichever is less, at most
            ``MAX_WORKERS``); ``1`` checks them here, one after another.

    Raises ``PassError`` naming the rule when it cannot be traced or is malformed, or when its
    check broke (as ``ensure_checked``); nothing is kept for that rule.

    **Laws:** the verdict of a rule is that of ``check_rule`` on it, wherever it was found
    (shipped and stored verdicts are ``check_rule``'s, filed under what decides them, and an
    entry not to trust is never read); renaming a rule changes no verdict; ``rules`` are not
    changed except for the verdict kept beside each.

    Complexity: a training-level trace of each rule's variants (its key) when it has no
    verdict in memory; one ``check_rule`` per rule not found, over ``workers`` processes.
    """
    given = list(dict.fromkeys(rules))
    for r in given:
        if not isinstance(r, Rule):
            raise PassError(f"check_rules: expected Rule values, got {type(r).__name__}")
    pending = [r for r in given if not r.trusted and rule_cache(r).verdict is None]
    if pending:
        _settle(pending, store_for(verdicts), workers)
    return tuple(True if r.trusted else rule_cache(r).verdict for r in given)


def _settle(rules: list[Rule], store: VerdictStore | None, workers: int | None) -> None:
    from hypothesis import currently_in_test_context

    nested = currently_in_test_context()
    now = versions()
    keys = {id(r): verdict_key(r) for r in rules}
    unknown = []
    for r in rules:
        found = shipped(keys[id(r)], now)
        if found is None and store is not None:
            found = store.get(keys[id(r)], now)
        if found is None:
            unknown.append(r)
        else:
            rule_cache(r).verdict = _verdict(r, found)
    if unknown:
        _say_unshipped(len(unknown), store, now)
    reached = checked_verdicts(unknown, workers=1 if nested else workers)
    for r, v in zip(unknown, reached):
        rule_cache(r).verdict = _verdict(r, v)
        if store is not None and not nested:
            store.put(keys[id(r)], now, v)


def _say_unshipped(n: int, store: VerdictStore | None, now: tuple[str, str]) -> None:
    """Warn once per process (``NoShippedVerdicts``, one line) when rules are about to be
    checked under a torch line no shipped verdicts were computed on."""
    lines = shipped_lines(now[0])
    if _WARNED or now[1] in lines:
        return
    _WARNED.append(True)
    kept = (f"kept in {store.directory} for later processes" if store is not None
            else "checked again in every process (no verdict store)")
    warnings.warn(
        f"purefx: no rule verdicts ship for torch {torch.__version__} (they ship for torch "
        f"{', '.join(lines) or 'none'}), so {n} rule(s) are checked now (the shipped rules: "
        f"about {SHIPPED_CHECK_SECONDS} s on two cores), {kept}",
        NoShippedVerdicts, stacklevel=4)


def _verdict(rule: Rule, v: Stored) -> BaseException | bool:
    """A stored verdict as ``check_rules`` returns it: ``True``, or the refusal with its
    ``excused_by`` (``transforms.rewrite.refusal``)."""
    if v.right:
        return True
    return refusal(rule, v.detail, None if v.excused_by is None else frozenset(v.excused_by))


def checked_verdicts(rules: Sequence[Rule], *, workers: int | None = None) -> list[Stored]:
    """``check_rule`` run on each of ``rules`` (no memory, shipped verdict or store read or
    written), as ``Stored`` verdicts in order, over ``workers`` processes (``check_rules``).
    Raises ``PassError`` naming the rule as ``check_rules`` does."""
    n = _workers(len(rules), workers)
    if n <= 1:
        return [_check_here(r) for r in rules]
    found = _in_pool(rules, n)
    # a rule whose check raised other than a verdict (malformed, broke) is checked again here,
    # so its error is raised as the serial check raises it, traceback and cause included; a
    # worker's "wrong" is checked again here too before it is kept, so that a failure of the
    # worker's process (not of the rule) never becomes a stored wrong verdict
    return [v if isinstance(v, Stored) and v.right else _check_here(r)
            for r, v in zip(rules, found)]


def _check_here(rule: Rule) -> Stored:
    try:
        return _stored(rule, check_rule(rule))
    except LawViolation as exc:
        excused = getattr(exc, "excused_by", None)
        return Stored(False, exc.detail, rule=rule.name,
                      excused_by=None if excused is None else tuple(sorted(excused)))
    except PurefxError:
        raise
    except Exception as exc:  # a check that broke is no verdict: say so, keep none
        raise PassError(
            f"rule {rule.name!r}: check_rule failed with {type(exc).__name__}: {exc}; "
            "mark the rule Rule(..., trusted=True) to skip the check, or report it"
        ) from exc


def _stored(rule: Rule, c: Checked) -> Stored:
    return Stored(True, "", c.ran, c.rewritten, tuple(c.restrided), rule.name)


def _workers(pending: int, asked: int | None) -> int:
    if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
        raise PassError(f"check_rules: workers must be a positive int, got {asked!r}")
    if pending < 2 or not _can_fork():
        return 1
    if asked is not None:
        return min(asked, pending, MAX_WORKERS)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    return max(1, min(pending, cores, torch.get_num_threads(), MAX_WORKERS))


def _can_fork() -> bool:
    """Forking is what lets a worker see rules that cannot be pickled: on Linux only (fork is
    unsafe on macOS), not from a daemonic process (which may start none), and not once this
    process has initialized CUDA (a forked child cannot use it again: a check that touches it
    would fail for the machine's sake, not the rule's; seen on an H100)."""
    return (sys.platform.startswith("linux")
            and "fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon
            and not torch.cuda.is_initialized())


_FORKED: Sequence[Rule] = ()  #: the rules a forked pool checks, read by index in the workers


def _in_pool(rules: Sequence[Rule], n: int) -> list[Stored | None]:
    """Each rule's verdict from a pool of ``n`` forked processes (the longest checks first);
    ``None`` for a rule whose check raised other than a verdict, or where the pool broke."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    global _FORKED
    order = sorted(range(len(rules)), key=lambda i: -len(rules[i].variants()))
    out: list[Stored | None] = [None] * len(rules)
    _FORKED = tuple(rules)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with torch's threads
            with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"),
                                     initializer=_worker_start) as pool:
                futures = {i: pool.submit(_worker_check, i) for i in order}
                for i, f in futures.items():
                    try:
                        out[i] = f.result()
                    except BrokenProcessPool:
                        break
    finally:
        _FORKED = ()
    return out


def _worker_start() -> None:
    torch.set_num_threads(1)  # one thread per process: the pool is the parallelism


def _worker_check(i: int) -> Stored | None:
    try:
        return _check_here(_FORKED[i])
    except BaseException:  # noqa: BLE001 - re-raised by the parent's own check of the rule
        return None


# --- the shipped verdicts -----------------------------------------------------------------------


def shipped_rules() -> tuple[Rule, ...]:
    """Every rule ``transforms.rewrite.rules`` exports (alone or in a tuple), each once, in
    the order of its ``__all__``: the rules whose verdicts ship with the package."""
    from transforms.rewrite import rules as module

    found: dict[int, Rule] = {}
    for name in module.__all__:
        value = getattr(module, name)
        for r in (value if isinstance(value, tuple) else (value,)):
            if isinstance(r, Rule):
                found.setdefault(id(r), r)
    return tuple(found.values())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m transforms.rewrite.verdicts --write | --check [--workers N]``: check every
    shipped rule (no store read) and write the shipped verdicts file, or compare with it
    (exit 1 naming each rule whose verdict or key drifted). ``--write`` refuses (exit 1) when
    a shipped rule is wrong."""
    parser = argparse.ArgumentParser(prog="python -m transforms.rewrite.verdicts")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the shipped verdicts")
    mode.add_argument("--check", action="store_true", help="recompute them; exit 1 on drift")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: cores)")
    args = parser.parse_args(argv)
    rules = shipped_rules()
    start = time.perf_counter()
    found = checked_verdicts(rules, workers=args.workers)
    took = time.perf_counter() - start
    keys = [verdict_key(r) for r in rules]
    if args.write:
        wrong = [r.name for r, v in zip(rules, found) if not v.right]
        if wrong:
            _say(f"shipped rules found wrong, not written: {wrong}", sys.stderr)
            return 1
        import hypothesis

        computed_on = {"torch": torch.__version__, "hypothesis": hypothesis.__version__,
                       "python": platform.python_version()}
        dropped = write_shipped(dict(zip(keys, found)), versions(), computed_on)
        _say(f"wrote {len(rules)} verdicts for torch {versions()[1]} in {took:.1f}s")
        if dropped:
            _say(f"dropped the verdicts of torch {', '.join(dropped)} (another checker): "
                 "run this command under each of them", sys.stderr)
        return 0
    drift = drifted(rules, keys, found)
    for line in drift:
        _say(line, sys.stderr)
    _say(f"checked {len(rules)} shipped rules in {took:.1f}s: "
         f"{'drift' if drift else 'as shipped'}")
    return 1 if drift else 0


def _say(text: str, stream: Any = None) -> None:
    """One line of the command's output, on ``stream`` (standard output by default); the
    library itself prints nothing."""
    (stream or sys.stdout).write(text + "\n")


def drifted(rules: Sequence[Rule], keys: Sequence[str],
            found: Sequence[Stored | None]) -> list[str]:
    """A line per rule whose shipped verdict is missing for its key or differs from ``found``
    (its recomputed verdict; ``None`` to compare keys only). O(rules)."""
    now = versions()
    out = []
    for r, k, v in zip(rules, keys, found):
        s = shipped(k, now)
        if s is None:
            out.append(f"{r.name}: no shipped verdict for its key {k[:12]} (regenerate: "
                       "python -m transforms.rewrite.verdicts --write)")
        elif v is not None and s.right != v.right:
            out.append(f"{r.name}: shipped {'right' if s.right else 'wrong'}, now "
                       f"{'right' if v.right else 'wrong'}")
    return out


__all__ = [
    "MAX_WORKERS",
    "SHIPPED_CHECK_SECONDS",
    "NoShippedVerdicts",
    "check_rules",
    "checked_verdicts",
    "drifted",
    "main",
    "shipped_rules",
]

if __name__ == "__main__":
    raise SystemExit(main())
