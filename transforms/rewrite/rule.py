"""A rewrite rule: a pattern and a replacement written as PyTorch functions, traced per level.

``Rule`` is the user's value; ``Compiled`` is the rule traced at one level (``rule.compiled``);
``replacement_for`` gives the replacement to instantiate for one match; ``Match`` is what a
rule's ``where`` sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir import ops
from ir.args import IDict, IList, Ref
from ir.errors import PassError
from ir.graph import Graph
from ir.memo import WeakMemo
from ir.node import PLACEHOLDER, Node
from transforms.machinery.trace import TRAINING, Traced, trace
from transforms.rewrite.match import (
    HyperparameterNotTraced,
    Pattern,
    match_at,
    prepare,
    with_holes,
)

# --- rules --------------------------------------------------------------------------------------


ASSUMPTIONS = frozenset({"no_nans", "no_infs", "no_signed_zeros", "reassociate"})
"""The assumptions a rule may declare (``Rule(..., assumes=...)``) and a caller may grant
(``rewrite(p, rules, assume=...)``), after LLVM's fast-math flags: ``no_nans`` (no input or
result is NaN), ``no_infs`` (none is ±inf), ``no_signed_zeros`` (-0.0 and +0.0 are one value),
``reassociate`` (floating-point sums and products may be regrouped: results equal up to rounding)."""


def check_assumptions(flags: Any, what: str) -> frozenset[str]:
    """``flags`` as a frozenset of known assumption names: ``ValueError`` naming ``what`` and the
    known flags when one is unknown, ``TypeError`` when ``flags`` is not a set, tuple or list
    (a bare string is refused: ``{"no_nans"}``, not ``"no_nans"``). O(len(flags))."""
    if isinstance(flags, str) or not isinstance(flags, (set, frozenset, tuple, list)):
        raise TypeError(
            f"{what} must be a set of assumption names out of {sorted(ASSUMPTIONS)}, got {flags!r}"
        )
    unknown = sorted(str(f) for f in flags if f not in ASSUMPTIONS)
    if unknown:
        raise ValueError(
            f"{what}: unknown assumption(s) {unknown}; the known ones are {sorted(ASSUMPTIONS)}"
        )
    return frozenset(flags)


def _check_callable(arg: str):
    def check(_self: Any, _attr: Any, value: Any) -> None:
        if not callable(value):
            raise PassError(f"Rule: {arg} must be a function, got {type(value).__name__}")
    return check


def _check_where(_self: Any, _attr: Any, value: Any) -> None:
    if value is not None and not callable(value):
        raise PassError(f"Rule: where must be a function of a Match, got {value!r}")


# --- hyperparameters and optional tensors -------------------------------------------------------

_INT_DRAWS = (1, 2, 3, 0, -1, 7)
_MAX_OPTIONAL = 3  #: optional tensor arguments per rule, at most (2**3 variants)


@attrs.frozen
class Hyper:
    """A rule argument that is a hyperparameter: a literal wildcard bound from each match (made
    by ``hyper``). ``example``: the value both functions are traced with (an int, a bool, a
    string or a tuple of ints); ``values``: what ``check_rule`` draws for it (the example
    first)."""

    example: Any
    values: tuple


def _hyper_kind(value: Any) -> str | None:
    if type(value) in (int, bool, str):
        return type(value).__name__
    if isinstance(value, (tuple, list)) and value and all(type(x) is int for x in value):
        return "tuple"
    return None


def hyper(example: Any, *, values: Any = None) -> Hyper:
    """Mark a rule argument as a hyperparameter: ``Rule(pattern, replacement, (x, w,
    hyper((2, 2)), hyper(True)))``. Its ``example`` (an int, a bool, a string or a tuple of
    ints; a list is taken as a tuple) is where the pattern's trace holds that literal; a match
    binds the program's literal there (``stride=[1, 1]``, ``keepdim=False``,
    ``approximate='tanh'``, another value at each match) and the replacement is traced with the
    bound values (a tuple for a list). Give each hyperparameter an example value that no other
    literal of the pattern has (``PassError`` when two hyperparameters share one).

    ``values``: what ``check_rule`` draws for it besides the example (default: for an int
    ``1, 2, 3, 0, -1, 7``; for a bool both; for a tuple each of those repeated and the example
    with its first entry changed; for a string only the example: give the others).

    Raises ``PassError`` naming the value when ``example`` or a value is of another kind.
    O(len(values))."""
    kind = _hyper_kind(example)
    if kind is None:
        raise PassError(
            f"hyper: the example must be an int, a bool, a string or a non-empty tuple of ints, "
            f"got {example!r}"
        )
    if kind == "tuple":
        example = tuple(example)
    if values is None:
        if kind == "int":
            pool: list[Any] = list(_INT_DRAWS)
        elif kind == "bool":
            pool = [not example]
        elif kind == "tuple":
            pool = [(v,) * len(example) for v in _INT_DRAWS[:4]]
            pool += [(v, *example[1:]) for v in _INT_DRAWS[:2]]
        else:
            pool = []
    else:
        pool = [tuple(v) if kind == "tuple" and isinstance(v, list) else v for v in values]
    for v in pool:
        if _hyper_kind(v) != kind:
            raise PassError(f"hyper: value {v!r} is not of the example {example!r}'s kind")
    drawn = [example]
    for v in pool:
        if not any(type(v) is type(d) and v == d for d in drawn):
            drawn.append(v)
    return Hyper(example, tuple(drawn))


@attrs.frozen
class OptionalTensor:
    """A tensor argument that may be ``None`` (made by ``optional``)."""

    example: torch.Tensor


def optional(example: torch.Tensor) -> OptionalTensor:
    """Mark a tensor argument of a rule as optional: ``Rule(conv_bn, folded, (x, w,
    optional(torch.randn(4)), ...))``. The rule then also stands for itself with ``None`` there
    (``F.conv2d(x, w, None)``: a convolution without bias): both functions must accept
    ``None``; the rule is traced, matched and checked once per combination of its optional
    arguments being ``None`` or a tensor (at most 3 optional arguments). ``PassError`` when
    ``example`` is not a tensor. O(1)."""
    if not isinstance(example, torch.Tensor):
        raise PassError(f"optional: the example must be a tensor, got {type(example).__name__}")
    return OptionalTensor(example)


def _example_tuple(value: Any) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise PassError(
            f"Rule: example_inputs must be a tuple of tensors and scalars, got "
            f"{type(value).__name__}"
        )
    for i, x in enumerate(value):
        if isinstance(x, (Hyper, OptionalTensor)) or x is None or _hyper_kind(x) is not None:
            continue  # a bool, string or tuple: the plain example of a hyperparameter (checked
            # once the Rule is made)
        if not isinstance(x, (torch.Tensor, int, float)) or isinstance(x, bool):
            raise PassError(
                f"Rule: example_inputs[{i}] is a {type(x).__name__}; a rule's arguments are "
                "tensors, Python ints or floats, None, hyper(...) for a hyperparameter and "
                "optional(...) for a tensor that may be None"
            )
    return tuple(value)


def _also_at(value: Any) -> tuple[tuple, ...]:
    if not isinstance(value, (tuple, list)):
        raise PassError(f"Rule: also_at must be a tuple of example tuples, got {value!r}")
    return tuple(_example_tuple(v) for v in value)


def _check_also(rule: Any, k: int, other: tuple) -> None:
    """``PassError`` where ``also_at[k]`` does not fit the rule's example inputs: another
    length, a marker where the first set has none, or no tensor at an ``optional``
    position."""
    if len(other) != len(rule.example_inputs):
        raise PassError(
            f"Rule {rule.name or ''}: also_at[{k}] has {len(other)} arguments; "
            f"example_inputs has {len(rule.example_inputs)}"
        )
    for i, x in enumerate(other):
        if isinstance(x, Hyper) and i not in rule.hypers:
            raise PassError(
                f"Rule: also_at[{k}][{i}] is a hyper(...) where example_inputs[{i}] is not one"
            )
        if isinstance(x, OptionalTensor) or (
            i in rule.optional and not isinstance(x, torch.Tensor)
        ):
            raise PassError(
                f"Rule: also_at[{k}][{i}] must be a plain tensor: the position's optional(...) "
                "marker is given once, in example_inputs"
            )


def _hypers(value: Any) -> Mapping[int, Hyper]:
    return pmap(dict(value))  # immutable, and copied with the rule (copy.deepcopy)


def _check_max_examples(_self: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PassError(f"Rule: max_examples must be a positive int, got {value!r}")


def _assumes(value: Any) -> frozenset[str]:
    return check_assumptions(value, "Rule: assumes")


@attrs.frozen(eq=False, weakref_slot=True)
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
            ``hyper(example)`` marks a hyperparameter (an int, bool, string or tuple of ints:
            stride, padding, ``keepdim``, ``approximate``) bound from each match, and
            ``optional(tensor)`` a tensor argument that may be ``None`` (a bias); once
            the Rule is made, ``example_inputs`` holds the plain examples and ``hypers`` /
            ``optional`` what was marked.
        name: the rule's name in reports and errors (default: ``pattern -> replacement``).
        where: ``where(match) -> bool``, an extra condition on a ``Match`` (e.g. on the matched
            inputs' dtypes, ``match.val(0).dtype``); a match where it is false is skipped.
        trusted: skip the ``check_rule`` that ``rewrite`` runs the first time it meets the rule.
        max_examples: how many examples ``check_rule`` tries for this rule (default 40).
        fold_state: compute what the replacement derives from state alone (parameters, buffers,
            constants; never state the program writes) once, when rewriting a flat program, and hold it as new constant
            tensors (``<module>._folded_<node>``; not in the state dict, whose keys stay). Off by
            default: a rule adds state only when asked to. Outlined programs are not folded.
        specials: whether ``check_rule`` puts special values (0, -0., ±inf, NaN) into the
            tensors it draws (default ``True``). Say ``False`` for a rule that is right for finite
            values only, as any folding of arithmetic is (``conv`` + ``batch_norm``).
        assumes: the assumptions the rule is right under (``ASSUMPTIONS``: ``"no_nans"``,
            ``"no_infs"``, ``"no_signed_zeros"``, ``"reassociate"``; default none, exact IEEE
            semantics). ``check_rule`` draws only what they admit; ``rewrite`` applies the rule
            only where the caller grants all of them. An unknown flag: ``ValueError`` naming the
            known ones.
        both_ways: the replacement may be rewritten back into the pattern too (``saturate``
            applies the rule in both directions; equality makes that no cycle). ``rewrite``
            (greedy) applies it forwards only.
        also_at: more example inputs, each a tuple as long as ``example_inputs``, to trace the
            same two functions at: other ranks (``conv1d`` and ``conv3d`` where the example is
            a ``conv2d``) or another kind of hyperparameter (a string ``padding='same'``, which
            export records as another operator). The rule stands for each trace (its
            ``variants``), so functions generic over the ranks are written once. A
            hyperparameter position takes the other value (``(2,)``) or ``hyper(...)`` with
            its ``values``; an ``optional`` position a tensor (it may be ``None`` there too).
            Each set is checked by ``check_rule`` as a variant is.

    A Rule is a frozen attrs value: assigning an attribute raises, ``attrs.evolve(rule, ...)``
    makes a changed copy (its caches start empty), and two Rules are equal only when they are
    the same object (a rule's functions cannot be compared). What is derived from it is kept
    beside it, in a memo keyed by the rule (``rule_cache``): its traced functions per level
    (plus, for a replacement that computes on its scalar arguments, its tensors' sizes or
    dtypes in Python, at most 32 traces for concrete scalars, shapes and dtypes), and
    ``check_rule``'s verdict (so a rule set is checked once, not per program). Neither changes
    what a rewrite computes.
    """

    pattern: Callable = attrs.field(validator=_check_callable("pattern"))
    replacement: Callable = attrs.field(validator=_check_callable("replacement"))
    example_inputs: tuple = attrs.field(converter=_example_tuple)
    name: str = attrs.field(default=None, kw_only=True)
    where: Callable[[Match], bool] | None = attrs.field(
        default=None, kw_only=True, validator=_check_where
    )
    trusted: bool = attrs.field(default=False, kw_only=True, converter=bool)
    max_examples: int = attrs.field(default=40, kw_only=True, validator=_check_max_examples)
    specials: bool = attrs.field(default=True, kw_only=True, converter=bool)
    fold_state: bool = attrs.field(default=False, kw_only=True, converter=bool)
    assumes: frozenset[str] = attrs.field(default=frozenset(), kw_only=True, converter=_assumes)
    both_ways: bool = attrs.field(default=False, kw_only=True, converter=bool)
    hypers: Mapping[int, Hyper] = attrs.field(factory=dict, kw_only=True, converter=_hypers)
    """``{argument position: Hyper}``: the hyperparameters (from ``hyper`` markers)."""
    optional: frozenset[int] = attrs.field(default=frozenset(), kw_only=True, converter=frozenset)
    """The positions of the tensor arguments that may be ``None`` (``optional`` markers)."""
    also_at: tuple[tuple, ...] = attrs.field(default=(), kw_only=True, converter=_also_at)

    def __attrs_post_init__(self) -> None:
        marked = {i: x for i, x in enumerate(self.example_inputs)
                  if isinstance(x, (Hyper, OptionalTensor))}
        if marked:
            hypers = dict(self.hypers)
            hypers.update({i: x for i, x in marked.items() if isinstance(x, Hyper)})
            opt = self.optional | {i for i, x in marked.items() if isinstance(x, OptionalTensor)}
            plain = tuple(x.example if i in marked else x
                          for i, x in enumerate(self.example_inputs))
            object.__setattr__(self, "example_inputs", plain)
            object.__setattr__(self, "hypers", pmap(hypers))
            object.__setattr__(self, "optional", frozenset(opt))
        for i, x in enumerate(self.example_inputs):
            if i not in self.hypers and _hyper_kind(x) in ("bool", "str", "tuple"):
                raise PassError(
                    f"Rule: example_inputs[{i}] is a {type(x).__name__}; a rule's arguments "
                    "are tensors, Python ints or floats, None, hyper(...) for a "
                    "hyperparameter and optional(...) for a tensor that may be None"
                )
        for i in self.optional:
            if i >= len(self.example_inputs) or not isinstance(
                self.example_inputs[i], torch.Tensor
            ):
                raise PassError(f"Rule: optional argument {i} must have a tensor example")
        if len(self.optional) > _MAX_OPTIONAL:
            raise PassError(
                f"Rule: {len(self.optional)} optional tensor arguments; at most "
                f"{_MAX_OPTIONAL} (each doubles the variants traced and checked)"
            )
        for k, other in enumerate(self.also_at):
            _check_also(self, k, other)
        if self.name is None:
            object.__setattr__(
                self, "name", f"{_fn_name(self.pattern)} -> {_fn_name(self.replacement)}"
            )

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"

    def variants(self) -> tuple[Rule, ...]:
        """The rule once per example set (``example_inputs``, then each of ``also_at``) and
        per combination of its ``optional`` arguments being a tensor or ``None`` (the example
        with ``None`` there; same name, functions, ``where``; the set's hyperparameters), all
        tensors first, the first set first (its first variant ``self``); ``(self,)`` when it
        has neither. Kept in
        ``rule_cache`` (made once). O((1 + len(also_at)) x 2 ** len(optional))."""
        if not self.optional and not self.also_at:
            return (self,)
        cache = rule_cache(self)
        if cache.variants is None:
            out = list(self._optional_variants())
            for other in self.also_at:
                marked = tuple(
                    x if i not in self.hypers or isinstance(x, Hyper) else hyper(x)
                    for i, x in enumerate(other))
                at = attrs.evolve(self, example_inputs=marked, hypers={}, also_at=())
                out.extend(at._optional_variants())
            cache.variants = tuple(out)
        return cache.variants

    def _optional_variants(self) -> list[Rule]:
        order = sorted(self.optional)
        out = []
        for mask in range(2 ** len(order)):
            nones = {p for k, p in enumerate(order) if mask >> k & 1}
            if not nones:
                out.append(self)  # the first set's: the rule itself (its also_at unused)
                continue
            ex = tuple(None if i in nones else x for i, x in enumerate(self.example_inputs))
            out.append(attrs.evolve(self, example_inputs=ex, optional=frozenset(), also_at=()))
        return out

    def compiled(self, level: str) -> Compiled:
        """The rule traced at ``level`` (``"training"`` or ``"core"``), traced once per level.

        Raises ``PassError`` naming the rule when a function cannot be traced, the pattern
        computes nothing, or the replacement returns other results than the pattern.
        """
        traced = rule_cache(self).traced
        found = traced.get(level)
        if found is None:
            found = _compile(self, level)
            traced[level] = found  # at most len(LEVELS) entries
        return found

    def at_level(self, level: str) -> Compiled | None:
        """``compiled(level)``, or ``None`` where this variant does not exist at ``level``: a
        hyperparameter that the level's decompositions fold away (``padding='same'`` becomes
        numbers at ``"core"``, where the numeric variant stands for it). Raises as
        ``compiled`` does otherwise, and where the hyperparameter is missing from the trace as
        written (a malformed rule). O(1) after the first call per level."""
        traced = rule_cache(self).traced
        if ("absent", level) in traced:
            return None
        try:
            return self.compiled(level)
        except HyperparameterNotTraced:
            if level == TRAINING:
                raise
            self.compiled(TRAINING)  # as written, the rule must hold each hyperparameter
            traced["absent", level] = None
            return None


class RuleCache:
    """What is derived from one ``Rule`` and kept beside it (``rule_cache``): ``traced``, its
    ``Compiled`` per level and its replacement traced per match's concrete scalars, shapes or
    dtypes (keys ``(kind, ...)``, at most ``_CONCRETE_CACHE`` of them), what reads only the
    pattern, the replacement, the examples and the name (``TRACE_FREE`` lists what it does not
    read), so one dict is shared by the rules ``sharing_traces`` makes; ``content``, its
    ``transforms.rewrite.rule_key.rule_content`` (what its verdict depends on); ``verdict``,
    ``check_rule``'s verdict (``None`` until checked; ``True``; or the ``LawViolation``, its
    traceback dropped so that it holds no frame of the rule); ``variants`` (``Rule.variants``)
    and ``reversed`` (``ruleset.reverse_of``: it carries the rule's ``where`` and ``assumes``),
    the rule's own. Each entry is a pure function of the rule: dropping the cache changes no
    result, only time."""

    __slots__ = ("content", "reversed", "traced", "variants", "verdict")

    def __init__(self) -> None:
        self.content: str | None = None
        self.traced: dict[Any, Any] = {}
        self.verdict: BaseException | bool | None = None
        self.variants: tuple[Rule, ...] | None = None
        self.reversed: Rule | None = None


_CACHES: WeakMemo[Rule, RuleCache] = WeakMemo(lambda rule: RuleCache())


def rule_cache(rule: Rule) -> RuleCache:
    """The cache of what is derived from ``rule`` (a memo keyed by the rule's identity, held
    as long as the rule lives; nothing is written into the rule). O(1)."""
    return _CACHES(rule)


TRACE_FREE = frozenset({"assumes", "where", "max_examples", "trusted"})
"""The fields of a ``Rule`` that no trace reads (``Rule.compiled``, the replacement's traces
per match, ``transforms.rewrite.sizes.pattern_at``): a rule that differs from another only in
them has the same traces (``sharing_traces``)."""


def sharing_traces(rule: Rule, **changes: Any) -> Rule:
    """``attrs.evolve(rule, **changes)`` for changes of ``TRACE_FREE`` fields only, sharing
    ``rule``'s traces: the two rules' caches hold the same ``traced`` dict (a trace made
    through either is the other's), and each variant of the new rule is the matching variant
    of ``rule`` with the same changes, sharing that variant's traces. Its verdict and content
    are its own (they read ``assumes`` and ``where``). What ``check_rule`` and its refusal's
    explanation make of one rule (``where`` guarded, assumptions added) so trace the pattern
    and replacement once, not once per copy. Raises ``TypeError`` naming a field a trace
    reads. O(variants)."""
    traced_fields = sorted(set(changes) - TRACE_FREE)
    if traced_fields:
        raise TypeError(f"sharing_traces: {', '.join(traced_fields)} changes what the rule "
                        f"traces; only {', '.join(sorted(TRACE_FREE))} may change")
    new = attrs.evolve(rule, **changes)
    cache, new_cache = rule_cache(rule), rule_cache(new)
    new_cache.traced = cache.traced
    if rule.optional or rule.also_at:
        new_cache.variants = tuple(new if v is rule else sharing_traces(v, **changes)
                                   for v in rule.variants())
    return new


def _fn_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


@attrs.frozen
class Compiled:
    """A rule at one level: its prepared pattern, traced replacement and benefit (compute nodes
    removed per rewrite). ``concrete``: the replacement's trace holds values computed in Python
    from its scalar arguments (``x * (a * b)``) or from the example tensors' shapes
    (``x.reshape(-1, x.shape[-1])``), so it is traced again for each match's scalars, shapes and
    dtypes (``replacement_for``). ``by_dtype``: the trace depends on the tensors' dtypes only
    (``mask.to(q.dtype)``), so it is traced again for each match's dtypes. ``level``: the level
    the pattern was traced at. ``regroups``: where the pattern matches the whole of the
    replacement, another instance of itself (associativity, commutativity), why (greedy
    ``rewrite`` then never applies the rule at a node the rule made)."""

    pattern: Pattern
    replacement: Traced
    benefit: int
    traced: Traced  #: the pattern's traced function
    concrete: bool = False
    by_dtype: bool = False
    level: str = TRAINING
    regroups: str | None = None


def _compile(rule: Rule, level: str) -> Compiled:
    lit = frozenset(rule.hypers)
    pat = trace(rule.pattern, rule.example_inputs, level, rule.name, "pattern", literal=lit)
    as_written = pat if level == TRAINING else trace(
        rule.pattern, rule.example_inputs, TRAINING, rule.name, "pattern", literal=lit
    )
    _refuse_inplace(rule, as_written)
    rep = trace(rule.replacement, rule.example_inputs, TRAINING, rule.name, "replacement",
                literal=lit)
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
    used = {pos for pos, value in pat.sentinels if _holds_literal(pat.graph, value)}
    for pos, value in rep.sentinels:
        if pos not in used and _holds_literal(rep.graph, value):
            raise PassError(
                f"rule {rule.name!r}: the replacement uses scalar argument {pos}, which the "
                "pattern does not; a replacement can only use what the pattern matched"
            )
    pattern = with_holes(pattern, {i: h.example for i, h in rule.hypers.items()},
                         f"rule {rule.name!r} (at the {level} level)",
                         {i: _moved_pattern(rule, level, i) for i in rule.hypers})
    _refuse_ignored_tensors(rule, pat, rep)
    regroups = _refuse_self_replacing(rule, pattern, rep)
    benefit = pattern.size - len(rep.compute_nodes())
    # a replacement of hyperparameters is traced with each match's values
    concrete = bool(rule.hypers) or _differs(
        rule, rep, [_other_shapes(x) for x in rule.example_inputs], salt=1)
    by_dtype = not concrete and _differs(
        rule, rep, [_other_dtype(x) for x in rule.example_inputs], salt=0
    )
    return Compiled(pattern, rep, benefit, pat, concrete, by_dtype, level, regroups)


_MOVES = 2  #: other values tried per hyperparameter to see where it lands in the trace


def _moved_pattern(rule: Rule, level: str, i: int) -> Pattern | None:
    """The pattern traced with hyperparameter ``i`` alone set to another of its values (the
    first of ``Hyper.values[1:]`` that traces, ``_MOVES`` tried), for ``with_holes``;
    ``None`` when none traces (``groups`` changes the weight's shape)."""
    lit = frozenset(rule.hypers)
    for v in rule.hypers[i].values[1:1 + _MOVES]:
        args = list(rule.example_inputs)
        args[i] = v
        try:
            found = prepare(trace(rule.pattern, args, level, rule.name, "pattern", literal=lit))
        except PassError:
            continue
        if found is not None:
            return found
    return None


def _refuse_inplace(rule: Rule, pat: Traced) -> None:
    """A pattern is functional: the programs ``rewrite`` matches are (after ``torch.export``),
    so a pattern that writes in place could match nothing, or a different program."""
    for n in pat.compute_nodes():
        if ops.is_mutating(n.target):
            name = getattr(n.target, "__name__", str(n.target))
            functional = name.split(".")[0].rstrip("_") or name
            raise PassError(
                f"rule {rule.name!r}: the pattern calls {name}, which writes in place; rewrite "
                f"matches functional programs: write the functional form (e.g. {functional} "
                f"instead of {name.split('.')[0]})"
            )


def _refuse_self_replacing(rule: Rule, pattern: Pattern, rep: Traced) -> str | None:
    """A replacement the pattern matches whole: refused where it is the pattern itself, else
    the reason greedy ``rewrite`` refuses it (``Compiled.regroups``).

    The pattern matches the replacement's traced graph (exactly: no size wildcards) and the
    match covers every operator the replacement calls (looked-through copies included). Where
    the match reads each argument at its own position in each operator, the replacement is the
    pattern as the matcher sees it: the rule drops only nodes the matcher looks through anyway
    (``contiguous``, a same-dtype ``clone`` or ``.to``, ``alias``, eval-mode dropout), so it
    changes nothing it can see: ``PassError``, for every engine. Otherwise the rule regroups
    the pattern into another instance of itself (``(a + b) + c`` into ``a + (b + c)``,
    ``a + b`` into ``b + a``): equality saturation takes it (the second instance is only a new
    member of the class), greedy ``rewrite`` takes it where it never rewrites its own result
    again (``engine._drain``: each rewrite consumes a node the rule did not make, so it ends);
    the message is returned (``Compiled.regroups``).
    O(replacement nodes x bindings tried)."""
    graph = rep.graph
    table = {n.name: n for n in graph.nodes}
    by_target: dict[int, list[Node]] = {}
    for n in rep.compute_nodes():
        by_target.setdefault(id(n.target), []).append(n)
    calls = {n.name for n in rep.compute_nodes() if not ops.is_metadata_check(n.target)}
    rep_ph = [n.name for n in graph.nodes if n.op == PLACEHOLDER]
    found: str | None = None
    for n in by_target.get(id(pattern.anchor.target), ()):
        for b in match_at(pattern, n, table.get, lambda t: by_target.get(id(t), []), strict=True):
            if not calls <= {*b.names.values(), *b.absorbed}:
                continue
            if _as_written(pattern, b, table, rep_ph):
                raise PassError(
                    f"rule {rule.name!r}: the pattern matches the whole of its own replacement "
                    "(nodes that compute nothing, such as contiguous(), a clone or a .to of the "
                    "same dtype, are looked through on both sides), so the rule changes nothing "
                    "a rewrite can see, and rewrite would rewrite its result again without "
                    "end; a rule must replace its pattern by something the pattern does not "
                    "match (to drop a copy, write the computation around it: rewrite drops "
                    "the copies a match looks through)"
                )
            found = (
                f"rule {rule.name!r}: the pattern matches the whole of its own replacement "
                "(it regroups its arguments into another instance of the pattern), so greedy "
                "rewrite would rewrite its result again without end; saturate takes such a "
                "rule (both_ways=True, e.g. associativity or commutativity), rewrite does not"
            )
    return found


def _as_written(pattern: Pattern, b: Any, table: Mapping[str, Node], rep_ph: list[str]) -> bool:
    """Whether binding ``b`` of ``pattern`` on a replacement maps each placeholder to the
    replacement's of the same position and reads, in each matched operator, each argument at
    the position the pattern reads it (no commutative swap, no regrouping). O(pattern)."""
    for name, rp in zip(pattern.input_order, rep_ph):
        if b.names.get(name, rp) != rp:
            return False
    for name, pn in pattern.nodes.items():
        rn = table.get(b.names.get(name, ""))
        if rn is None:
            return False
        if [b.names.get(r.name) for r in pn.inputs()] != [r.name for r in rn.inputs()]:
            return False
    return True


def _refuse_ignored_tensors(rule: Rule, pat: Traced, rep: Traced) -> None:
    """A replacement may read only the tensor arguments its pattern reads: a match binds no
    value to one the pattern ignores."""
    for pos, pat_reads, rep_reads in zip(pat.tensor_args, reads_inputs(pat), reads_inputs(rep)):
        if rep_reads and not pat_reads:
            raise PassError(
                f"rule {rule.name!r}: the replacement reads tensor argument {pos}, which the "
                "pattern ignores; a match binds no value to it, so the replacement may read "
                "only the arguments its pattern reads"
            )


def reads_inputs(traced: Traced) -> tuple[bool, ...]:
    """For each input of a traced rule function (placeholder order): whether a node reads it
    or it is returned. O(nodes)."""
    users = traced.graph.users()
    out = {r.name for r in traced.outputs if type(r) is Ref}
    return tuple(bool(users.get(n.name)) or n.name in out
                 for n in traced.graph.nodes if n.op == PLACEHOLDER)


def _other_shapes(x: Any) -> Any:
    """``x`` with each size above 1 made larger (equal sizes stay equal, 0 and 1 stay)."""
    if not isinstance(x, torch.Tensor):
        return x
    return torch.zeros([d if d < 2 else d + 11 for d in x.shape], dtype=x.dtype)


_OTHER_DTYPE = {
    torch.float64: torch.float32, torch.int64: torch.int32, torch.int32: torch.int64,
    torch.int16: torch.int64, torch.int8: torch.int64, torch.uint8: torch.int64,
}


def _other_dtype(x: Any) -> Any:
    """``x`` in another dtype of its kind (a float one in float64, float64 in float32, an int
    one in another int; bool stays): a trace that differs depends on its tensors' dtypes."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.dtype == torch.bool:
        return x
    other = _OTHER_DTYPE.get(x.dtype, torch.float64 if x.is_floating_point() else x.dtype)
    return torch.zeros(tuple(x.shape), dtype=other)


def _differs(rule: Rule, rep: Traced, inputs: list, salt: int) -> bool:
    """Whether the replacement's trace changes beyond its sentinels when traced on ``inputs``
    (other shapes, other dtypes) with sentinels of ``salt`` (or cannot be traced so): then it
    folded a scalar argument, a size or a dtype into a literal that no sentinel marks."""
    try:
        other = trace(rule.replacement, inputs, TRAINING, rule.name, "replacement", salt=salt)
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


_CONCRETE_CACHE = 32  #: replacements traced per rule for concrete values or dtypes, at most


def replacement_for(
    rule: Rule, c: Compiled, scalars: Mapping[int, Any], vals: Mapping[int, Any]
) -> Traced | None:
    """The replacement to instantiate for a match binding ``scalars`` (argument position ->
    matched scalar) and tensor arguments whose ``meta['val']`` are ``vals`` (position -> fake
    tensor or None).

    - neither ``c.concrete`` nor ``c.by_dtype``: ``c.replacement`` itself;
    - ``c.concrete``: the replacement traced with those scalars (the example value for one the
      pattern did not bind) and tensors of those shapes and dtypes; ``None`` when a tensor's
      shape is unknown or symbolic (the match is skipped);
    - ``c.by_dtype``: ``c.replacement`` where each tensor has its example's dtype, else the
      replacement traced at the example shapes in the match's dtypes (sentinels kept);
      ``None`` when a tensor's dtype is unknown.

    Traces are cached per rule (``rule_cache``; at most ``_CONCRETE_CACHE`` entries, oldest
    dropped first; a failed trace too). Raises ``PassError`` naming the rule when the
    replacement cannot be traced at the match's values (a division by a matched scale of 0.0):
    the engine then declines the match (guard ``replacement_untraceable``)."""
    if c.concrete:
        return _traced_per_match(rule, scalars, vals)
    if c.by_dtype:
        return _traced_per_dtype(rule, c, vals)
    return c.replacement


def bind_scalars(tree: Any, sentinels: Mapping, scalars: Mapping[int, Any],
                 env: Mapping[str, Any] = pmap()) -> Any:
    """A replacement node's arguments ``tree`` at one match, for both drivers: each ``Ref``
    renamed by ``env`` (kept where absent), each ``int`` / ``float`` literal that is a
    sentinel (``sentinels``: ``(type, value) -> position``, typed so that an int literal is no
    float sentinel) replaced by the match's scalar at that position (``scalars``; kept where
    the match bound none). O(size of the tree)."""
    kind = type(tree)
    if kind is Ref:
        return env.get(tree.name, tree)
    if kind is tuple:
        return tuple(bind_scalars(x, sentinels, scalars, env) for x in tree)
    if kind is IList:
        return IList(tuple(bind_scalars(x, sentinels, scalars, env) for x in tree.items))
    if kind is IDict:
        return IDict(tuple((k, bind_scalars(v, sentinels, scalars, env)) for k, v in tree.items))
    if kind in (int, float):
        pos = sentinels.get((kind, tree))
        if pos is not None and pos in scalars:
            return scalars[pos]
    return tree


def _traced_per_match(rule: Rule, scalars: Mapping[int, Any], vals: Mapping[int, Any]):
    args: list[Any] = []  # a tensor argument as its (shape, dtype): made on a cache miss only
    key_parts: list[Any] = []
    for i, x in enumerate(rule.example_inputs):
        if isinstance(x, torch.Tensor):
            v = vals.get(i)
            if not isinstance(v, torch.Tensor) or not all(type(d) is int for d in v.shape):
                return None
            args.append(_Zeros(tuple(v.shape), v.dtype))
            key_parts.append((tuple(v.shape), str(v.dtype)))
        else:
            value = scalars.get(i, x)
            args.append(value)
            key_parts.append((type(value).__name__, repr(value)))  # -0.0 apart from 0.0

    def make() -> Traced:
        real = [torch.zeros(a.shape, dtype=a.dtype) if type(a) is _Zeros else a for a in args]
        return trace(rule.replacement, real, TRAINING, rule.name, "replacement",
                     sentinels=False)

    return _cached(rule, ("concrete", tuple(key_parts)), make)


@attrs.frozen
class _Zeros:
    """A tensor argument of a replacement trace, made (zeros) only when the trace runs."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _traced_per_dtype(rule: Rule, c: Compiled, vals: Mapping[int, Any]):
    dtypes = []
    for i, x in enumerate(rule.example_inputs):
        if isinstance(x, torch.Tensor):
            v = vals.get(i)
            if not isinstance(v, torch.Tensor):
                return None
            dtypes.append(v.dtype)
    examples = [x.dtype for x in rule.example_inputs if isinstance(x, torch.Tensor)]
    if dtypes == examples:
        return c.replacement
    it = iter(dtypes)
    args = [
        torch.zeros(tuple(x.shape), dtype=next(it)) if isinstance(x, torch.Tensor) else x
        for x in rule.example_inputs
    ]
    return _cached(rule, ("dtype", tuple(str(d) for d in dtypes)),
                   lambda: trace(rule.replacement, args, TRAINING, rule.name, "replacement"))


def _cached(rule: Rule, key: tuple, make: Callable[[], Traced]) -> Traced:
    """``make()`` kept under ``key`` in the rule's cache; a ``PassError`` (the replacement
    cannot be traced there) is kept too and raised again, so a failing trace is tried once."""
    traced = rule_cache(rule).traced
    found = traced.get(key)
    if found is None:
        try:
            found = make()
        except PassError as exc:
            found = _Untraceable(str(exc))
        held = [k for k in traced if isinstance(k, tuple)]
        if len(held) >= _CONCRETE_CACHE:
            del traced[held[0]]
        traced[key] = found
    if isinstance(found, _Untraceable):
        raise PassError(found.message)
    return found


@attrs.frozen
class _Untraceable:
    """A replacement trace that failed, kept in the rule's cache: the error's message."""

    message: str


def _holds_literal(graph: Graph, value: Any) -> bool:
    def holds(tree: Any) -> bool:
        if isinstance(tree, (tuple, IList)):
            return any(holds(x) for x in tree)
        return type(tree) is not Ref and type(tree) is type(value) and tree == value

    return any(holds(n.args) or holds(tuple(v for _, v in n.kwargs.items)) for n in graph.nodes)


@attrs.frozen
class Match:
    """A match of a rule: what ``where`` sees, and what ``transforms.rewrite.matches`` lists
    and ``apply_match`` takes.

    - ``rule``: the rule's name;
    - ``nodes``: ``{pattern node name: matched node}`` for the pattern's compute nodes;
    - ``inputs``: one entry per rule argument: the matched ``Node`` for a tensor argument, the
      matched value for a scalar or hyperparameter one (the example value where the pattern
      did not use it; ``None`` for an ``optional`` argument matched as ``None``).

    Set by ``matches`` (defaults elsewhere, as in the ``Match`` a ``where`` sees):

    - ``module``: the path of the module whose graph holds the match (``""``: the root);
      ``graph``: the graph's index in that module; ``source``: that ``Graph`` itself (what
      ``apply_match`` finds the match by: a match of another program is refused);
    - ``anchor``: the name of the node the pattern ends in; ``binding``: the matcher's
      ``transforms.rewrite.match.Binding`` (pattern names -> graph names, ``scalars``: argument
      position -> bound scalar or hyperparameter value, ``absorbed``);
    - ``definition``: the ``Rule`` (the variant of its ``optional`` arguments that matched);
      ``level``: the level its pattern was traced at.
    """

    rule: str
    nodes: Mapping[str, Node]
    inputs: tuple
    module: str = ""
    graph: int = 0
    anchor: str = ""
    binding: Any = None
    definition: Any = attrs.field(default=None, eq=False, repr=False)
    level: str = TRAINING
    source: Any = attrs.field(default=None, eq=False, repr=False)

    def val(self, i: int) -> Any:
        """The fake tensor (``meta['val']``) of argument ``i``'s matched node, or its scalar
        value; ``None`` when the node carries no ``val``."""
        x = self.inputs[i]
        return x.meta.get("val") if isinstance(x, Node) else x



__all__ = [
    "TRACE_FREE", "Compiled", "Hyper", "Match", "OptionalTensor", "Rule", "RuleCache",
    "bind_scalars", "hyper", "optional", "reads_inputs", "replacement_for", "rule_cache",
    "sharing_traces",
]
