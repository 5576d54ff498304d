"""Sizes as wildcards: the re-check that makes a pattern traced at one shape match at others.

A pattern is traced once per level at its example inputs' shapes, so its size arguments
(``view``'s and ``expand``'s sizes after ``run_decompositions``) and, through the rank, its
dimensions hold that shape's numbers. The matcher (``transforms.rewrite.match``) lets them match
any int in the candidate search and marks such a binding ``loose``; ``recheck`` then traces the
pattern again at the matched inputs' shapes and dtypes (``meta['val']``) and keeps the binding
only when that exact pattern matches the same graph nodes with the same inputs, as torch
inductor re-checks its candidates. The engine calls ``recheck`` on every binding before taking it.

The re-traced patterns are kept in a bounded memo (``_MEMO``) keyed by the rule's traces
(shared by the rules ``rule.sharing_traces`` makes from one: they trace alike), level, shapes
and dtypes (at most ``_MEMO.size`` entries, emptied when full, as ``ir.ops.facts`` keeps its
memo): a hit and a miss answer the same, so the memo changes no result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from ir.errors import PassError
from ir.memo import NOT_COMPUTED, BoundedMemo
from ir.node import Node
from transforms.machinery.trace import LEVELS, trace
from transforms.rewrite.match import Binding, Pattern, absorb_checks, match_at, prepare
from transforms.rewrite.rule import rule_cache

_MEMO: BoundedMemo[Pattern | None] = BoundedMemo(256)
"""``pattern_at``'s memo: per rule's traces (``rule_cache(rule).traced``, held here so that no
other object takes its id), (level, shapes and dtypes, hyperparameters) -> the prepared pattern,
or ``None`` where it cannot be traced (kept too: a failed trace fails again)."""


def recheck(
    rule: Any,
    compiled: Any,
    binding: Binding,
    lookup: Callable[[str], Node | None],
    level: str | None = None,
    users: Callable[[str], Iterable[str] | None] | None = None,
) -> Binding | None:
    """The binding to take for ``binding`` (a match of ``compiled.pattern``, the ``Compiled``
    of ``rule`` at ``level``), or ``None`` to skip it.

    - A ``loose`` binding (a size or dimension wildcard bound another value than the pattern's),
      or one whose inputs have other dtypes than the rule's examples (what computes nothing at
      the examples' dtypes, a ``.float()``, may compute something at the match's), is kept only
      when the pattern traced again at the matched inputs' shapes and dtypes
      matches exactly (``match_at(..., strict=True)``) at the same anchor, the same graph nodes
      (looked-through ones included) and the same inputs and scalars; ``None`` when it does
      not, when an input's ``meta['val']`` is missing or symbolic, or when the pattern cannot
      be traced there. The binding kept is ``binding`` with ``loose`` false.
    - With ``users`` (name -> names of the nodes reading it), the metadata checks that read a
      matched interior value are added to ``absorbed`` (``match.absorb_checks``).

    ``level``: ``"training"`` or ``"core"``; ``None``: ``compiled.level`` (a loose binding is
    dropped when neither says).

    **Laws:** a binding that is not loose, at the examples' dtypes, is kept (with checks
    absorbed); what is kept is a match
    of the pattern's own trace at the matched shapes; pure (the memo changes no answer).
    Complexity: O(pattern size + readers of matched nodes) per binding, plus one trace per new
    (rule, level, shapes, dtypes).
    """
    pattern: Pattern = compiled.pattern
    vals = bound_vals(pattern, binding, lookup)
    if binding.loose or _other_dtypes(rule, vals):
        exact = _exact(rule, compiled, binding, lookup, _level(compiled, level), vals)
        if exact is None:
            return None
        binding = exact
    if users is not None:
        binding = absorb_checks(pattern, binding, lookup, users)
    return binding


def bound_vals(pattern: Pattern, b: Binding,
               lookup: Callable[[str], Node | None]) -> dict[int, Any]:
    """Rule argument position -> the ``meta['val']`` (or ``None``) of the input ``b`` binds
    there, for each tensor argument the binding binds. O(inputs)."""
    out = {}
    for i, name in zip(pattern.tensor_args, pattern.input_order):
        if name in b.names:
            n = lookup(b.names[name])
            out[i] = n.meta.get("val") if n is not None else None
    return out


def _other_dtypes(rule: Any, vals: dict[int, Any]) -> bool:
    """Whether a matched input (``vals``: ``bound_vals``) has another dtype than the rule's
    example: what computes nothing in the pattern's trace (a ``.float()`` of a float32
    example) may compute something at the match's dtypes, so the binding is re-checked there.
    O(inputs)."""
    examples = rule.example_inputs
    return any(isinstance(v, torch.Tensor) and isinstance(examples[i], torch.Tensor)
               and v.dtype != examples[i].dtype for i, v in vals.items())


def _level(compiled: Any, level: str | None) -> str | None:
    if level is not None:
        return level
    found = getattr(compiled, "level", None)
    return found if found in LEVELS else None


def _exact(
    rule: Any, compiled: Any, b: Binding, lookup: Callable[[str], Node | None],
    level: str | None, vals: dict[int, Any],
) -> Binding | None:
    pattern: Pattern = compiled.pattern
    if level is None:
        return None
    shapes = input_shapes(rule, vals)
    if shapes is None:
        return None
    hypers = getattr(rule, "hypers", None) or {}
    bound = tuple((i, b.scalars[i]) for i in sorted(hypers) if i in b.scalars)
    exact = pattern_at(rule, level, shapes, bound)
    if exact is None:
        return None
    anchor = lookup(b.names.get(pattern.anchor.name, ""))
    if anchor is None:
        return None
    matched = {b.names[k] for k in pattern.nodes if k in b.names} | set(b.absorbed)
    inputs = {k: b.names[k] for k in pattern.inputs if k in b.names}
    by_target: dict[int, list[Node]] = {}
    for name in sorted(matched):
        n = lookup(name)
        if n is not None:
            by_target.setdefault(id(n.target), []).append(n)
    for e in match_at(exact, anchor, lookup, lambda t: by_target.get(id(t), ()), strict=True):
        got = {e.names[k] for k in exact.nodes if k in e.names} | set(e.absorbed)
        if (got == matched and {k: e.names[k] for k in exact.inputs if k in e.names} == inputs
                and dict(e.scalars) == {k: v for k, v in b.scalars.items() if k not in hypers}
                and dtypes_agree(exact, e, lookup)):
            return attrs.evolve(b, loose=False)
    return None


def dtypes_agree(
    pattern: Pattern, binding: Binding, lookup: Callable[[str], Node | None]
) -> bool:
    """Whether each compute node of ``pattern`` (traced at the match's shapes and dtypes) has
    the dtype of the graph node ``binding`` binds it to, where both ``meta['val']`` are
    tensors: what makes a literal matched by value (``x * 1`` for ``x * 1.0``) a match of the
    same computation. The engine calls it as a module global (a test may switch it off).
    O(pattern size)."""
    for k, pnode in pattern.nodes.items():
        name = binding.names.get(k)
        tnode = lookup(name) if name is not None else None
        if tnode is None:
            continue
        a, b = pnode.meta.get("val"), tnode.meta.get("val")
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != b.dtype:
            return False
    return True


def input_shapes(rule: Any, vals: dict[int, Any]) -> tuple | None:
    """``((shape, dtype), ...)`` per tensor argument of the rule: the matched input's value
    (``vals``: argument position -> fake value, ``bound_vals``), the example's where ``vals``
    has none (the pattern does not read the argument); ``None`` when a matched input's value
    is no tensor or has a symbolic size. What ``recheck`` and ``ematch.exact`` trace the
    pattern at. O(arguments x rank)."""
    out = []
    for i, x in enumerate(rule.example_inputs):
        if not isinstance(x, torch.Tensor):
            continue
        if i not in vals:
            out.append((tuple(x.shape), x.dtype))
            continue
        v = vals[i]
        if not isinstance(v, torch.Tensor) or not all(type(d) is int for d in v.shape):
            return None
        out.append((tuple(v.shape), v.dtype))
    return tuple(out)


def pattern_at(rule: Any, level: str, shapes: tuple, hypers: tuple = ()) -> Pattern | None:
    """``rule``'s pattern traced at ``level`` on tensors of ``shapes`` (``((shape, dtype),
    ...)`` per tensor argument) with the hyperparameter values ``hypers`` (``((position,
    value), ...)``), prepared, its hyperparameters' literals kept as literals; ``None`` where
    it cannot be traced there. What ``recheck`` matches a loose binding against, for the
    e-matcher's own re-check (``ematch.exact``). Memoised (bounded). O(one trace) per miss."""
    traces = rule_cache(rule).traced  # shared by the rules that trace alike (sharing_traces)
    key = (level, shapes, tuple((i, type(v).__name__, repr(v)) for i, v in hypers))
    hit = _MEMO.get(traces, key)
    if hit is not NOT_COMPUTED:
        return hit
    args = []
    it = iter(shapes)
    values = dict(hypers)
    for i, x in enumerate(rule.example_inputs):
        if isinstance(x, torch.Tensor):
            shape, dtype = next(it)
            args.append(torch.zeros(shape, dtype=dtype))
        else:
            args.append(values.get(i, x))
    literal = frozenset(getattr(rule, "hypers", None) or ())
    try:
        found = prepare(trace(rule.pattern, args, level, rule.name, "pattern", literal=literal))
    except PassError:
        found = None
    return _MEMO.put(traces, key, found)


__all__ = ["bound_vals", "dtypes_agree", "input_shapes", "pattern_at", "recheck"]
