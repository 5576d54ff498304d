"""A rule's content key: what ``check_rule``'s verdict on a rule depends on, as a digest, never
its name.

``rule_content(rule)`` is that content as text, per variant (``Rule.variants``: each example
set, each combination of ``optional`` arguments): the example signature (each tensor's shape
and dtype, each scalar's type and value; never the example tensors' values, which a rule draws
afresh each process and the checker never reads), the hyperparameters and the values drawn for
them, the pattern and the replacement traced at the training level (``format_graph`` with vals:
operators, literals, sentinels, shapes), and the identity of the pattern, the replacement and
``where``: each function's module, qualified name and a digest of its code (a ``def``'s
source text where it can be read and is what runs, so a Python release does not change it,
else its bytecode; closure values, defaults, and the code of the module's own functions it
calls by name, so a change in a helper reaches the key). Then the flags the check reads: ``specials``,
``assumes``, ``max_examples``, ``both_ways``, ``fold_state``.

- ``rule_seed(rule)``: the digest of that content. ``check_rule`` seeds its draws by it
  (``transforms.rewrite.rule_check``), so two rules that differ only in name draw alike and get one
  verdict.
- ``verdict_key(rule)``: the digest of the content plus what else decides a verdict: the
  checker's version (``CHECKER_VERSION`` and a digest of the sources that draw and judge) and
  torch's release line (``torch_line``: its kernels round and overflow). The key of
  ``transforms.rewrite.verdict_store``.

Not in the key, because no verdict depends on them:

- **hypothesis's version.** ``check_rule`` draws every value that decides a verdict itself:
  deterministic probes and examples from a ``random.Random`` seeded by the rule's content
  (``ir.strategies.seeded_values``). Hypothesis runs only once a draw has broken the law, to
  look for a smaller counterexample; the verdict is then "wrong" whatever it finds, and only
  the counterexample's text (kept with the verdict) depends on it.
- **torch's patch release.** Within one release line (``2.14.0``, ``2.14.1``, a ``+cpu`` or
  ``+cu128`` build) what could move a verdict is either in the key already or shared: the
  pattern's and the replacement's traces are part of the content (an export fix in a patch
  changes their text, hence the key), and the checker runs both sides on the CPU kernels of the
  same process. What is left is a patch that changes a CPU kernel's values, which torch's patch
  releases take only to fix a regression or a silent wrong result; the shipped verdicts are
  computed on the newest patch of each line, and ``python -m transforms.rewrite.verdicts
  --check`` recomputes them on whichever patch is installed (exit 1 on drift). A pre-release or
  source build (``2.15.0a0+git…``, ``2.15.0.dev…``) is keyed by its whole version instead.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import linecache
import math
import re
import textwrap
import types
from pathlib import Path
from typing import Any

import torch

from ir.printer import format_graph
from transforms.machinery.trace import TRAINING, Traced
from transforms.rewrite.rule import Rule, rule_cache

CHECKER_VERSION = 2
"""Bump when ``check_rule`` changes what it draws or how it judges in a way the digest of its
sources (``_CHECKER_SOURCES``) does not show (a change in a module it calls)."""

_CHECKER_SOURCES = (
    "transforms/rewrite/rule_check.py",
    "transforms/rewrite/rule_key.py",
    "ir/strategies/values.py",
    "ir/strategies/seeded_values.py",
    "ir/harness/compare.py",
    "ir/harness/tolerance.py",
    "ir/harness/observe.py",
    "ir/harness/run.py",
    "ir/harness/loop.py",
)
"""The sources whose text is part of the checker's version: what ``check_rule`` draws and how
it judges. Another text, another key: a verdict of another checker is not reused."""

_DEPTH = 6  #: how deep ``code_digest`` follows the functions a function calls by name


def rule_content(rule: Rule) -> str:
    """The content of ``rule`` that decides its verdict, as text (see the module docstring);
    the same for two rules that differ only in ``name`` (or ``trusted``, which skips the check).
    Raises ``PassError`` naming the rule when a variant cannot be traced (``Rule.compiled``).

    Cost: one training-level trace per variant (each kept in ``rule_cache``), then
    O(traced nodes + code size). Kept beside the rule (computed once)."""
    cache = rule_cache(rule)
    if cache.content is None:
        flags = (f"specials={rule.specials} assumes={sorted(rule.assumes)} "
                 f"max_examples={rule.max_examples} both_ways={rule.both_ways} "
                 f"fold_state={rule.fold_state}")
        parts = [flags,
                 "pattern " + code_digest(rule.pattern),
                 "replacement " + code_digest(rule.replacement),
                 "where " + ("None" if rule.where is None else code_digest(rule.where))]
        for k, v in enumerate(rule.variants()):
            parts.append(f"-- variant {k}")
            parts.append("args " + ", ".join(_arg_text(x) for x in v.example_inputs))
            parts.append("hypers " + repr(sorted((i, h.example, h.values)
                                                 for i, h in v.hypers.items())))
            parts.append("optional " + repr(sorted(v.optional)))
            c = v.compiled(TRAINING)
            parts.append(f"concrete={c.concrete} by_dtype={c.by_dtype}")
            parts.append("pattern:\n" + _traced_text(c.traced))
            parts.append("replacement:\n" + _traced_text(c.replacement))
        cache.content = "\n".join(parts)
    return cache.content


def rule_seed(rule: Rule) -> str:
    """The sha256 hex digest of ``rule_content(rule)``: what ``check_rule`` seeds its draws by.
    Same cost as ``rule_content``."""
    return _sha(rule_content(rule))


def verdict_key(rule: Rule) -> str:
    """The sha256 hex digest of everything that decides ``check_rule``'s verdict on ``rule``:
    ``rule_content`` and ``versions()`` (the checker's and torch's release line; never
    hypothesis's version, never the rule's name). Same cost as ``rule_content``."""
    return _sha("\n".join((rule_seed(rule), *versions())))


def versions() -> tuple[str, str]:
    """``(checker version, torch line)`` as keys record them: the checker as ``CHECKER_VERSION``
    and a digest of its sources, torch as ``torch_line()``. O(1) after the first call."""
    return (checker_version(), torch_line())


def torch_line(version: str | None = None) -> str:
    """The torch release line a verdict holds for (module docstring): ``major.minor`` of a
    release, whatever its patch and build tag (``"2.14.1+cu128"`` -> ``"2.14"``); the whole
    version of anything else (a pre-release, a nightly or a source build: ``"2.15.0a0+gitabc"``
    stays as it is, since two of them share no kernels for sure). ``version``: that string
    instead of the running torch's. O(len(version))."""
    text = torch.__version__ if version is None else version
    m = re.fullmatch(r"(\d+)\.(\d+)\.\d+(\+[0-9A-Za-z.]+)?", text)
    return f"{m[1]}.{m[2]}" if m else text


@functools.cache
def checker_version() -> str:
    """``CHECKER_VERSION`` and the first 16 hex digits of a digest of ``_CHECKER_SOURCES``.
    Reads them once per process."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for rel in _CHECKER_SOURCES:
        path = root / rel
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return f"{CHECKER_VERSION}-{h.hexdigest()[:16]}"


def code_digest(fn: Any) -> str:
    """A function's identity as text: its module and qualified name, then a digest of what it
    computes as far as Python shows it: its code (bytecode, constants, nested code, names), its
    closure's values and defaults, and, followed by name up to ``_DEPTH`` calls deep, the
    functions of its globals that are written in Python outside torch. A partial gives its
    function and bound arguments; a callable object its class's ``__call__`` and its attrs
    fields. Deterministic across processes (sets sorted; no ids or addresses). O(code size)."""
    return _code_text(fn, 0, set())


def _code_text(fn: Any, depth: int, seen: set[int]) -> str:
    if isinstance(fn, functools.partial):
        return (f"partial({_code_text(fn.func, depth, seen)}, "
                f"{[_value_text(a, depth, seen) for a in fn.args]}, "
                f"{ {k: _value_text(v, depth, seen) for k, v in sorted(fn.keywords.items())} })")
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    if isinstance(fn, types.MethodType):
        return (f"method({_code_text(fn.__func__, depth, seen)}, "
                f"{_value_text(fn.__self__, depth, seen)})")
    if not isinstance(fn, types.FunctionType):
        call = next((vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)),
                    None)
        if not isinstance(fn, type) and isinstance(call, types.FunctionType):
            fields = ([f.name for f in getattr(type(fn), "__attrs_attrs__", ())]
                      or sorted(getattr(fn, "__dict__", {})))
            state = {f: _value_text(getattr(fn, f, None), depth, seen) for f in fields}
            return (f"object {type(fn).__module__}.{type(fn).__qualname__} "
                    f"{_code_text(type(fn).__call__, depth, seen)} {state}")
        return name
    if id(fn) in seen or depth > _DEPTH:
        return name
    seen.add(id(fn))
    code = fn.__code__
    h = hashlib.sha256()
    h.update(_code_identity(code))
    cells = [_value_text(c.cell_contents, depth, seen) if _filled(c) else "<empty>"
             for c in (fn.__closure__ or ())]
    h.update(repr(cells).encode())
    h.update(repr([_value_text(d, depth, seen) for d in (fn.__defaults__ or ())]).encode())
    h.update(repr(sorted((k, _value_text(v, depth, seen))
                         for k, v in (fn.__kwdefaults__ or {}).items())).encode())
    for g in sorted(_global_names(code)):
        value = fn.__globals__.get(g)
        if value is not None and _followed(value):
            h.update(f"{g}={_value_text(value, depth + 1, seen)}".encode())
    return f"{name} {h.hexdigest()[:32]}"


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _code_identity(code: types.CodeType) -> bytes:
    """What a function's code is, the same on every Python release where it can be: the
    source text of a ``def`` (dedented) when its file, compiled on this interpreter, holds the
    very code the function runs (so a file edited since the import, or a function built
    elsewhere, never passes for its source); else the bytecode (``_code_bytes``), which a
    Python release changes. A lambda is keyed by its bytecode: its source is the whole
    statement it sits in."""
    text = _source(code)
    if text is not None:
        return b"source\0" + text.encode()
    return b"bytecode\0" + _code_bytes(code)


@functools.lru_cache(maxsize=4096)
def _source(code: types.CodeType) -> str | None:
    if code.co_name == "<lambda>" or code.co_firstlineno < 1:
        return None
    linecache.checkcache(code.co_filename)
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return None
    compiled = _compiled("".join(lines), code.co_filename)
    if compiled.get((_qualname(code), code.co_firstlineno)) != _code_bytes(code):
        return None
    try:
        return textwrap.dedent("".join(inspect.getblock(lines[code.co_firstlineno - 1:])))
    except (SyntaxError, IndentationError, ValueError):  # pragma: no cover - it compiled
        return None


@functools.lru_cache(maxsize=64)
def _compiled(text: str, filename: str) -> dict[tuple[str, int], bytes]:
    """``_code_bytes`` of every function compiled from a file's ``text``, by qualified name and
    first line; empty when it does not compile."""
    try:
        module = compile(text, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return {}
    out: dict[tuple[str, int], bytes] = {}
    todo = [module]
    while todo:
        for c in todo.pop().co_consts:
            if isinstance(c, types.CodeType):
                out[(_qualname(c), c.co_firstlineno)] = _code_bytes(c)
                todo.append(c)
    return out


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11 on


def _code_bytes(code: types.CodeType) -> bytes:
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    for c in code.co_consts:
        parts.append(_code_bytes(c) if isinstance(c, types.CodeType) else _const_text(c).encode())
    return b"\0".join(parts)


def _const_text(c: Any) -> str:
    if isinstance(c, (frozenset, set)):
        return "{" + ", ".join(sorted(_const_text(x) for x in c)) + "}"
    if isinstance(c, tuple):
        return "(" + ", ".join(_const_text(x) for x in c) + ")"
    if isinstance(c, float):
        return "nan" if math.isnan(c) else repr(c)
    return f"{type(c).__name__}:{c!r}"


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _followed(value: Any) -> bool:
    """Whether a global a function reads is part of its digest: a Python function, or a
    container of values, outside torch (torch's own code is keyed by its version)."""
    if isinstance(value, types.FunctionType):
        return not _in_torch(value)
    return isinstance(value, (dict, tuple, list, int, float, str, bool, functools.partial))


def _in_torch(fn: Any) -> bool:
    module = getattr(fn, "__module__", "") or ""
    return module == "torch" or module.startswith(("torch.", "hypothesis", "functools"))


def _value_text(v: Any, depth: int, seen: set[int]) -> str:
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    if isinstance(v, torch.Tensor):
        return f"tensor{tuple(v.shape)} {v.dtype}"  # a closure's tensor: its kind, not values
    if isinstance(v, (torch.dtype, torch.device)):
        return str(v)
    if isinstance(v, (tuple, list)):
        return type(v).__name__ + "(" + ", ".join(_value_text(x, depth, seen) for x in v) + ")"
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(sorted(_value_text(x, depth, seen) for x in v)) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_value_text(k, depth, seen)}: {_value_text(x, depth, seen)}"
                               for k, x in v.items()) + "}"
    if isinstance(v, types.FunctionType) and not _in_torch(v):
        return _code_text(v, depth + 1, seen)
    if callable(v) or isinstance(v, types.ModuleType):
        label = getattr(v, "__qualname__", getattr(v, "__name__", type(v).__qualname__))
        return f"{getattr(v, '__module__', '')}.{label}"
    return f"<{type(v).__module__}.{type(v).__qualname__}>"


def _arg_text(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor{tuple(x.shape)} {x.dtype}"
    return f"{type(x).__name__}:{_const_text(x) if isinstance(x, float) else repr(x)}"


def _traced_text(t: Traced) -> str:
    return (f"tensor_args={t.tensor_args} sentinels={t.sentinels!r} outputs={t.outputs!r}\n"
            + format_graph(t.graph, vals=True))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


__all__ = [
    "CHECKER_VERSION",
    "checker_version",
    "code_digest",
    "rule_content",
    "rule_seed",
    "torch_line",
    "verdict_key",
    "versions",
]
