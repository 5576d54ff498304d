"""Whether what a repro showed is the finding it was written for.

A repro's ``difference()`` (``lowering.fuzz.repro``) answers in sentences: ``crash: <Type>:
<line>``, ``the backend accepts an input eager refuses (...)``, ``[call k (...): ]gradient of
<key>: ...``, or a value that differs (``[call k (...): ]output i: ...``, ``input i``,
``state 'fqn'``, ``N outputs, eager gives M``). A finding is shown again only by a sentence of
its own kind: a crash by a crash raising the same exception type (a backward's crash, the
fuzzer's ``grad_crash``, is a crash of the repro's one run), an input eager refuses by that
sentence, a gradient by a gradient, a value by a value. Any other difference the repro happens
to show (the program crashing for another reason, a forward difference where the finding is a
gradient's) does not confirm it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lowering.fuzz.judge import ACCEPTS_WHAT_EAGER_REFUSES
from lowering.fuzz.refusals import CRASH_KINDS

CRASH = "crash"
REFUSED = "refused"
GRADIENT = "gradient"
VALUE = "value"
"""The classes of difference a repro's sentence and a finding are sorted into."""

_AT_CALL = re.compile(r"^call \d+ \([^)]*\): ")
_CRASH_TYPE = re.compile(r"^crash: ([A-Za-z_][A-Za-z_0-9.]*)")
_BACKWARD_TYPE = re.compile(r"^the backward raises ([A-Za-z_][A-Za-z_0-9.]*)")
_FORWARD_TYPE = re.compile(r"^([A-Za-z_][A-Za-z_0-9.]*):")


def sentence_class(sentence: str) -> str:
    """The class of one of a repro's sentences: ``CRASH``, ``REFUSED``, ``GRADIENT`` or
    ``VALUE`` (every other sentence ``difference()`` writes). O(len(sentence))."""
    body = _AT_CALL.sub("", sentence, count=1)
    if body.startswith("crash: "):
        return CRASH
    if body.startswith(ACCEPTS_WHAT_EAGER_REFUSES):
        return REFUSED
    if body.startswith("gradient of "):
        return GRADIENT
    return VALUE


def finding_class(kind: str, detail: str) -> str:
    """The class of a finding of ``kind`` (``lowering.fuzz.judge.KINDS``) whose detail is
    ``detail``. O(len(detail))."""
    if kind in CRASH_KINDS:
        return CRASH
    if kind == "grad":
        return GRADIENT
    return REFUSED if detail.startswith(ACCEPTS_WHAT_EAGER_REFUSES) else VALUE


def _crash_type(kind: str, detail: str) -> str | None:
    found = (_BACKWARD_TYPE if kind == "grad_crash" else _FORWARD_TYPE).match(detail)
    return found.group(1) if found else None


def shows(kind: str, detail: str, sentences: Sequence[str]) -> bool:
    """Whether a repro's ``sentences`` show a finding of ``kind`` and ``detail`` again: one
    sentence of the finding's class, and for a crash one raising the same exception type (where
    the detail names one). Laws: ``shows(k, d, []) is False``; adding sentences never turns
    ``True`` into ``False``. O(total length)."""
    wanted = finding_class(kind, detail)
    crash_type = _crash_type(kind, detail) if wanted == CRASH else None
    for sentence in sentences:
        if sentence_class(sentence) != wanted:
            continue
        if crash_type is None:
            return True
        found = _CRASH_TYPE.match(_AT_CALL.sub("", sentence, count=1))
        if found is not None and found.group(1) == crash_type:
            return True
    return False


__all__ = ["CRASH", "GRADIENT", "REFUSED", "VALUE", "finding_class", "sentence_class", "shows"]
