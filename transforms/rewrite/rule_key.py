"""A rule's content key: what ``check_rule``'s verdict on a rule depends on, as a digest, never
its name.

``rule_content(rule)`` is that content as text, per variant (``Rule.variants``: each example
set, each combination of ``optional`` arguments): the example signature (each tensor's shape
and dtype, each scalar's type and value; never the example tensors' values, which a rule draws
afresh each process and the checker never reads), the hyperparameters and the values drawn for
them, the pattern and the replacement traced at the training level (``format_graph`` with vals:
operators, literals, sentinels, shapes), and the identity of the pattern, the replacement and
``where``: each function's module, qualified name and a digest of its code (bytecode,
constants, names, closure values, and the code of the module's own functions it calls by name,
so a change in a helper reaches the key). Then the flags the check reads: ``specials``,
``assumes``, ``max_examples``, ``both_ways``, ``fold_state``.

- ``rule_seed(rule)``: the digest of that content. ``check_rule`` seeds its draws by it
  (``transforms.rewrite.rule_check``), so two rules that differ only in name draw alike and get one
  verdict.
- ``verdict_key(rule)``: the digest of the content plus what else decides a verdict: the
  checker's version (``CHECKER_VERSION`` and a digest of the sources that draw and judge), the
  torch version (its kernels round and overflow; its export traces) and hypothesis's (its draws).
  The key of ``transforms.rewrite.verdict_store``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import math
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
    ``rule_content``, ``checker_version()`` and the torch and hypothesis versions. Same cost as
    ``rule_content``."""
    return _sha("\n".join((rule_seed(rule), *versions())))


def versions() -> tuple[str, str, str]:
    """``(checker version, torch version, hypothesis version)`` as keys record them: the checker
    as ``CHECKER_VERSION`` and a digest of its sources, torch without its local build tag
    (``2.13.0+cpu`` and ``2.13.0+cu128`` check alike: the checker runs on the CPU). O(1) after
    the first call."""
    return (checker_version(), torch.__version__.split("+")[0], _hypothesis_version())


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


@functools.cache
def _hypothesis_version() -> str:
    try:
        return importlib.metadata.version("hypothesis")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a vendored copy
        import hypothesis

        return str(getattr(hypothesis, "__version__", "unknown"))


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
    h.update(_code_bytes(code))
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
    "verdict_key",
    "versions",
]
