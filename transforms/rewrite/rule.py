"""A rewrite rule: a pattern and a replacement written as PyTorch functions, traced per level.

``Rule`` is the user's value; ``Compiled`` is the rule traced at one level (``rule.compiled``);
``replacement_for`` gives the replacement to instantiate for one match; ``Match`` is what a
rule's ``where`` sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from ir.args import IDict, IList, Ref
from ir.errors import PassError
from ir.graph import Graph
from ir.node import Node
from transforms.rewrite.match import Pattern, prepare
from transforms.rewrite.trace import TRAINING, Traced, trace

# --- rules --------------------------------------------------------------------------------------


class Rule:
    """A rewrite rule: where ``pattern(*args)`` is computed, compute ``replacement(*args)``.

    Parameters:
        pattern: a function of tensors and Python scalars returning a tensor or a tuple of
            tensors; traceable by ``torch.export`` on ``example_inputs``.
        replacement: a function of the same arguments returning as many results.
        example_inputs: the arguments to trace both with (tensors and Python scalars). A float
            argument matches any scalar in the program (the same one at each use); an int
            argument does too unless it is used as a size or dimension (then it is the literal
            given). Matches do not depend on the example tensors' shapes or dtypes.
        name: the rule's name in reports and errors (default: ``pattern -> replacement``).
        where: ``where(match) -> bool``, an extra condition on a ``Match`` (e.g. on the matched
            inputs' dtypes, ``match.val(0).dtype``); a match where it is false is skipped.
        trusted: skip the ``check_rule`` that ``rewrite`` runs the first time it meets the rule.
        max_examples: how many examples ``check_rule`` tries for this rule (default 40).
        fold_state: compute what the replacement derives from state alone (parameters, buffers,
            constants) once, when rewriting a flat program, and hold it as new constant
            tensors (``<module>._folded_<node>``; not in the state dict, whose keys stay). Off by
            default: a rule adds state only when asked to. Outlined programs are not folded.
        specials: whether ``check_rule`` puts special values (0, -0., ±inf, NaN) into the
            tensors it draws (default ``True``). Say ``False`` for a rule that is right for finite
            values only, as any folding of arithmetic is (``conv`` + ``batch_norm``).

    A Rule holds two caches: its traced functions per level (plus, for a replacement that
    computes on its scalar arguments or its tensors' sizes in Python, at most 32 traces for
    concrete scalars, shapes and dtypes),
    and ``check_rule``'s verdict (so a rule set is checked once, not per program). Neither
    changes what a rewrite computes.
    """

    __slots__ = (
        "_traced", "_verdict", "example_inputs", "fold_state", "max_examples", "name",
        "pattern", "replacement", "specials", "trusted", "where",
    )

    def __init__(
        self,
        pattern: Callable,
        replacement: Callable,
        example_inputs: Sequence[Any],
        *,
        name: str | None = None,
        where: Callable[[Match], bool] | None = None,
        trusted: bool = False,
        max_examples: int = 40,
        specials: bool = True,
        fold_state: bool = False,
    ) -> None:
        for arg, value in (("pattern", pattern), ("replacement", replacement)):
            if not callable(value):
                raise PassError(f"Rule: {arg} must be a function, got {type(value).__name__}")
        if where is not None and not callable(where):
            raise PassError(f"Rule: where must be a function of a Match, got {where!r}")
        if not isinstance(example_inputs, (tuple, list)):
            raise PassError(
                f"Rule: example_inputs must be a tuple of tensors and scalars, got "
                f"{type(example_inputs).__name__}"
            )
        for i, x in enumerate(example_inputs):
            if not isinstance(x, (torch.Tensor, int, float)) or isinstance(x, bool):
                raise PassError(
                    f"Rule: example_inputs[{i}] is a {type(x).__name__}; a rule's arguments are "
                    "tensors and Python ints or floats"
                )
        self.pattern = pattern
        self.replacement = replacement
        self.example_inputs = tuple(example_inputs)
        self.name = name or f"{_fn_name(pattern)} -> {_fn_name(replacement)}"
        self.where = where
        self.trusted = bool(trusted)
        self.max_examples = max_examples
        self.specials = bool(specials)
        self.fold_state = bool(fold_state)
        self._traced: dict[Any, Any] = {}
        self._verdict: BaseException | bool | None = None

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"

    def compiled(self, level: str) -> Compiled:
        """The rule traced at ``level`` (``"training"`` or ``"core"``), traced once per level.

        Raises ``PassError`` naming the rule when a function cannot be traced, the pattern
        computes nothing, or the replacement returns other results than the pattern.
        """
        found = self._traced.get(level)
        if found is None:
            found = _compile(self, level)
            self._traced[level] = found  # at most len(LEVELS) entries
        return found


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


@attrs.frozen
class Compiled:
    """A rule at one level: its prepared pattern, traced replacement and benefit (compute nodes
    removed per rewrite). ``concrete``: the replacement's trace holds values computed in Python
    from its scalar arguments (``x * (a * b)``) or from the example tensors' shapes
    (``x.reshape(-1, x.shape[-1])``), so it is traced again for each match's scalars, shapes and
    dtypes (``replacement_for``)."""

    pattern: Pattern
    replacement: Traced
    benefit: int
    traced: Traced  #: the pattern's traced function
    concrete: bool = False


def _compile(rule: Rule, level: str) -> Compiled:
    pat = trace(rule.pattern, rule.example_inputs, level, rule.name, "pattern")
    rep = trace(rule.replacement, rule.example_inputs, TRAINING, rule.name, "replacement")
    if len(pat.outputs) != len(rep.outputs):
        raise PassError(
            f"rule {rule.name!r}: the pattern returns {len(pat.outputs)} values, the replacement "
            f"{len(rep.outputs)}; a replacement must return what its pattern returns"
        )
    pattern = prepare(pat)
    if pattern is None:
        raise PassError(
            f"rule {rule.name!r}: the pattern computes nothing that can be matched (traced: "
            f"{[n.target for n in pat.compute_nodes()]}); a pattern must call some operator"
        )
    used = _sentinels_used(pat)
    for pos, value in rep.sentinels:
        if pos not in used and _holds_literal(rep.graph, value):
            raise PassError(
                f"rule {rule.name!r}: the replacement uses scalar argument {pos}, which the "
                "pattern does not; a replacement can only use what the pattern matched"
            )
    benefit = pattern.size - len(rep.compute_nodes())
    return Compiled(pattern, rep, benefit, pat, _is_concrete(rule, rep))


def _other_shapes(x: Any) -> Any:
    """``x`` with each size above 1 made larger (equal sizes stay equal, 0 and 1 stay)."""
    if not isinstance(x, torch.Tensor):
        return x
    return torch.zeros([d if d < 2 else d + 11 for d in x.shape], dtype=x.dtype)


def _is_concrete(rule: Rule, rep: Traced) -> bool:
    """Whether the replacement's trace changes beyond its sentinels when the sentinels and the
    example shapes change (or cannot be traced so): then it folded a scalar argument or a size
    into a literal that no sentinel marks, and is traced per match."""
    try:
        other = trace(rule.replacement, [_other_shapes(x) for x in rule.example_inputs],
                      TRAINING, rule.name, "replacement", salt=1)
    except PassError:
        return True
    back = {s2: s1 for (_, s1), (_, s2) in zip(rep.sentinels, other.sentinels)}
    if len(back) != len(rep.sentinels) or len(other.graph.nodes) != len(rep.graph.nodes):
        return True

    def same(a: Any, b: Any) -> bool:
        if type(a) is not type(b):
            return (isinstance(a, (int, float)) and not isinstance(a, bool)
                    and isinstance(b, (int, float)) and back.get(b, b) == a)
        if isinstance(a, (tuple, IList)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, IDict):
            return same(a.items, b.items)
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return back.get(b, b) == a
        return a == b

    return not all(
        m.op == n.op and m.target == n.target and same(m.args, n.args)
        and same(m.kwargs, n.kwargs)
        for m, n in zip(rep.graph.nodes, other.graph.nodes)
    )


_CONCRETE_CACHE = 32  #: replacements traced per rule for concrete scalar values, at most


def replacement_for(
    rule: Rule, c: Compiled, scalars: Mapping[int, Any], vals: Mapping[int, Any]
) -> Traced | None:
    """The replacement to instantiate for a match binding ``scalars`` (argument position ->
    matched scalar) and tensor arguments whose ``meta['val']`` are ``vals`` (position -> fake
    tensor or None): ``c.replacement`` itself unless ``c.concrete``, then the replacement traced
    with those scalars (the example value for one the pattern did not bind) and tensors of those
    shapes and dtypes, cached on the rule (at most ``_CONCRETE_CACHE`` entries, oldest dropped
    first); ``None`` when a tensor's shape is unknown or symbolic (the match is skipped)."""
    if not c.concrete:
        return c.replacement
    args: list[Any] = []
    key_parts: list[Any] = []
    for i, x in enumerate(rule.example_inputs):
        if isinstance(x, torch.Tensor):
            v = vals.get(i)
            if not isinstance(v, torch.Tensor) or not all(type(d) is int for d in v.shape):
                return None
            args.append(torch.zeros(tuple(v.shape), dtype=v.dtype))
            key_parts.append((tuple(v.shape), str(v.dtype)))
        else:
            value = scalars.get(i, x)
            args.append(value)
            key_parts.append((type(value).__name__, value))
    key = ("concrete", tuple(key_parts))
    found = rule._traced.get(key)
    if found is None:
        found = trace(rule.replacement, args, TRAINING, rule.name, "replacement",
                      sentinels=False)
        concrete = [k for k in rule._traced if isinstance(k, tuple)]
        if len(concrete) >= _CONCRETE_CACHE:
            del rule._traced[concrete[0]]
        rule._traced[key] = found
    return found


def _sentinels_used(traced: Traced) -> set[int]:
    return {pos for pos, value in traced.sentinels if _holds_literal(traced.graph, value)}


def _holds_literal(graph: Graph, value: Any) -> bool:
    found = []

    def walk(tree: Any) -> None:
        if isinstance(tree, (tuple, IList)):
            for x in tree:
                walk(x)
        elif type(tree) is not Ref and type(tree) is type(value) and tree == value:
            found.append(tree)

    for n in graph.nodes:
        walk(n.args)
        walk(tuple(v for _, v in n.kwargs.items))
    return bool(found)


@attrs.frozen
class Match:
    """What ``where`` sees of a match.

    - ``rule``: the rule's name;
    - ``nodes``: ``{pattern node name: matched node}`` for the pattern's compute nodes;
    - ``inputs``: one entry per rule argument: the matched ``Node`` for a tensor argument, the
      matched value for a scalar one (the example value where the pattern did not use it).
    """

    rule: str
    nodes: Mapping[str, Node]
    inputs: tuple

    def val(self, i: int) -> Any:
        """The fake tensor (``meta['val']``) of argument ``i``'s matched node, or its scalar
        value; ``None`` when the node carries no ``val``."""
        x = self.inputs[i]
        return x.meta.get("val") if isinstance(x, Node) else x



__all__ = ["Compiled", "Match", "Rule", "replacement_for"]
