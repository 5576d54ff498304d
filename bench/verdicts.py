"""Cold processes and rule verdicts (issue 54, item 1): ``python -m bench.verdicts``.

Each run is a fresh ``python`` (nothing checked in memory), timed around the ``rewrite`` alone
(the export of tiny GPT-2 from ``tests/attention_models.py`` before it is not counted), wall
and CPU (this process and the checking processes it started):

1. the shipped rules: ``rewrite(p, RULES, assume=ATTENTION_ASSUMES)`` (their verdicts ship
   with purefx: no check runs);
2. a user's own three rules, first with an empty store (checked over the cores, filed), then
   in a second process (read back from the store).

The store is a temporary directory (``PUREFX_VERDICTS``): the user's cache is not touched.
Needs ``transformers``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_COMMON = """
import os, sys, time
sys.path.insert(0, "tests")
import torch
from attention_models import program
from transforms.rewrite import Rule, rewrite_report
_, p = program("gpt2", "flat")
"""

SHIPPED = _COMMON + """
from transforms.rewrite_rules import ATTENTION_ASSUMES as GRANT, RULES
"""

USER = _COMMON + """
X = (torch.randn(4, 8),)
FAST = {"no_nans", "no_infs", "no_signed_zeros", "reassociate"}


def _floating(m):
    return m.val(0).dtype.is_floating_point


RULES = [
    Rule(lambda x: torch.neg(torch.neg(x)), lambda x: x, X, name="neg_neg"),
    Rule(lambda x: torch.relu(torch.relu(x)) * 1.0, torch.relu, X, name="relu_relu_one",
         where=_floating),
    Rule(lambda x, y: (x + y) - y, lambda x, y: x, X + X, name="add_sub", assumes=FAST),
]
GRANT = FAST
"""

_TIMED = """
t, c = time.perf_counter(), os.times()
q, report = rewrite_report(p, RULES, assume=GRANT)
wall, d = time.perf_counter() - t, os.times()
cpu = sum(d[:4]) - sum(c[:4])
print(f"RESULT {wall:.2f} {cpu:.2f}")
"""


def _run(script: str, store: str) -> tuple[float, float]:
    env = {**os.environ, "PUREFX_VERDICTS": store, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script + _TIMED], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    wall, cpu = line.split()[1:]
    return float(wall), float(cpu)


def main() -> None:
    """Print the three cold runs, wall and CPU seconds."""
    with tempfile.TemporaryDirectory() as store:
        rows = [("shipped rules, fresh process", _run(SHIPPED, store)),
                ("user's rules, first process (empty store)", _run(USER, store)),
                ("user's rules, second process (store)", _run(USER, store))]
    for name, (wall, cpu) in rows:
        print(f"{name:45s} wall {wall:7.2f} s  cpu {cpu:7.2f} s")


if __name__ == "__main__":
    main()
