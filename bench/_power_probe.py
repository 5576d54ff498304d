"""Temporary power probe (issue 60, item 2): each planted bug under N forced hypothesis seeds.

``python -m bench._power_probe [--seeds N] [--examples K] [--twins M] [--only SUBSTR] [--suite S]``
prints, per planted bug, on how many seeds ``check_laws`` caught it (with the law expected) and
the examples it took; per correct twin, on how many of M seeds it held with >= 5 programs
changed. The seed is forced by setting hypothesis's ``_hypothesis_internal_use_seed`` on the
``given``-wrapped test (what ``@seed(n)`` does), through a wrapper around ``hypothesis.given``
that lives here only: the public ``check_laws(..., seed=)`` is another branch's.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import time

import hypothesis
from hypothesis import Phase, settings

from lowering.pass_laws import LawViolation, check_laws

_SEED: list[int | None] = [None]
_given = hypothesis.given


def _seeded_given(*a, **k):
    inner = _given(*a, **k)

    def wrap(f):
        test = inner(f)
        if _SEED[0] is not None:
            test._hypothesis_internal_use_seed = _SEED[0]
        return test

    return wrap


hypothesis.given = _seeded_given

SETTINGS = settings(derandomize=False, database=None,
                    phases=[Phase.explicit, Phase.generate])

SUITES = {
    "planted": "tests.laws.test_planted_bugs",
    "heldout": "tests.laws.test_planted_bugs_heldout",
    "motifs": "tests.laws.test_planted_motif_bugs",
}


def _rows(suite: str):
    mod = importlib.import_module(SUITES[suite])
    planted = []
    for row in mod.PLANTED:
        fn, options, law = row[0], dict(row[1]), row[2]
        planted.append((fn, options, law if isinstance(law, tuple) else (law,)))
    return planted, [(c[0], dict(c[1])) for c in mod.CORRECT]


def _counted(fn, box):
    @functools.wraps(fn)
    def counted(p):
        box[0] += 1
        return fn(p)
    return counted


def probe(suite: str, seeds: int, examples: int, twins: int, only: str | None) -> None:
    planted, correct = _rows(suite)
    for fn, options, laws in planted:
        if only and only not in fn.__name__:
            continue
        caught, firsts, t0, wrong = 0, [], time.time(), []
        for s in range(seeds):
            _SEED[0] = 1000 + s
            box = [0]
            try:
                check_laws(_counted(fn, box), max_examples=examples, settings=SETTINGS, **options)
            except LawViolation as v:
                if v.law in laws:
                    caught += 1
                    firsts.append(box[0])
                else:
                    wrong.append(v.law)
            except Exception as e:  # noqa: BLE001
                wrong.append(type(e).__name__)
        med = sorted(firsts)[len(firsts) // 2] if firsts else None
        print(f"{suite:8} {fn.__name__:40} caught {caught:2}/{seeds} median-first {med} "
              f"other {wrong[:3]} ({time.time() - t0:.0f}s)", flush=True)
    for fn, options in correct[:] if twins else []:
        if only and only not in fn.__name__:
            continue
        ok, changed, t0, fails = 0, [], time.time(), []
        for s in range(twins):
            _SEED[0] = 2000 + s
            try:
                r = check_laws(fn, max_examples=examples, settings=SETTINGS, **options)
                changed.append(r.changed)
                ok += r.changed >= 5
            except Exception as e:  # noqa: BLE001
                fails.append(str(e).splitlines()[0][:200])
        print(f"{suite:8} TWIN {fn.__name__:35} ok {ok}/{twins} changed {changed} "
              f"fails {fails[:2]} ({time.time() - t0:.0f}s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--twins", type=int, default=0)
    ap.add_argument("--only")
    ap.add_argument("--suite", action="append")
    a = ap.parse_args()
    for suite in a.suite or list(SUITES):
        probe(suite, a.seeds, a.examples, a.twins, a.only)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
