"""Compiling generated source into a function whose source lives exactly as long as it does.

Tracebacks and debuggers read generated code through ``linecache``; an entry that is never
removed keeps every program's source alive forever. ``compile_function`` registers the source
under a file name of its own and removes it when the function is garbage collected, so dropping a
lowered module frees its code and its source.

Compiling is the costly part of lowering a small program, and the same source comes again (a
program lowered twice, the same graph in many programs): the code object of a source is kept in a
bounded least-recently-used memo, compiled under a neutral file name, and given the function's own
file name by ``CodeType.replace`` (nested code objects too). A memo entry is a pure function of the
source, so it changes no result; its bound (128 sources: a program and its result, lowered
again and again by a law, hit it) keeps the memory flat.

File names are numbered slots that a collected function gives back for the next one: CPython
keeps every distinct file name that ``compile`` ever saw, so fresh names per function would grow
without bound; recycled ones are at most as many as functions alive at once.
"""

from __future__ import annotations

import functools
import itertools
import linecache
import weakref
from collections.abc import Callable, Mapping
from types import CodeType
from typing import Any

_FREE_SLOTS: list[int] = []  # slots of collected functions, for reuse
_SLOTS = itertools.count()  # the next slot never used


def compile_function(source: str, scope: Mapping[str, Any], name: str) -> Callable[..., Any]:
    """Execute ``source`` (which defines function ``name``) in a copy of ``scope`` and return the
    function. Its source is readable through ``linecache`` under ``<purefx code #N>`` until the
    function is collected. ``source`` must come from a code generator that spelled
    every string of a program safely (see ``lowering.identifiers``). O(len(source)).
    """
    slot = _take_slot()
    filename = f"<purefx code #{slot}>"
    namespace = dict(scope)
    exec(_with_filename(_compiled(source), filename), namespace)  # noqa: S102
    function = namespace.pop(name)  # no cycle through its own globals: freed by refcount
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    weakref.finalize(function, _release, filename, slot)
    return function


_NEUTRAL = "<purefx code>"


@functools.lru_cache(maxsize=128)
def _compiled(source: str) -> CodeType:
    """``source`` compiled once under the neutral file name; ``dont_inherit``: this module's
    ``from __future__`` flags must not reach the generated code."""
    return compile(source, _NEUTRAL, "exec", dont_inherit=True)


def _with_filename(code: CodeType, filename: str) -> CodeType:
    """``code`` and every code object nested in it under ``filename``. O(code objects)."""
    consts = tuple(_with_filename(c, filename) if isinstance(c, CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _take_slot() -> int:
    try:
        return _FREE_SLOTS.pop()
    except IndexError:
        return next(_SLOTS)


def _release(filename: str, slot: int) -> None:
    linecache.cache.pop(filename, None)
    _FREE_SLOTS.append(slot)
