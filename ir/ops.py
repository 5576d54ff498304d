"""Operator facts: what purefx knows about a node's target, in one table.

A pass never reads an operator's schema, tags or class itself; it asks ``facts(target)`` (or
one of the small predicates below) whether the target mutates an argument, has a side effect,
draws random numbers, can be computed a second time, copies or aliases a value, is size
arithmetic, a ``getitem`` or a higher-order op, which of its arguments are sizes, dimensions and
dtypes, and when a call of it computes nothing (``computes_nothing``, ``is_metadata_check``;
``canonical_args`` spells one computation one way). The answers come from five sources:

- the verified operator table (``ir.opset``): for an ``OpOverload``, what it writes (under
  which argument values: ``aten.batch_norm`` writes its running statistics when ``training``
  is true, which its schema does not declare), which results share storage with which
  arguments, whether it draws random numbers, all observed on real tensors; for an overload
  the table lacks, the same facts declared by the user (``register_facts``) or observed on
  the first call purefx met with values (``ir.op_known``); an overload of none of these is
  assumed to write and alias every tensor argument (``verified`` false, ``origin`` ``UNKNOWN``),
  so it is never pure, and a refusal it causes says so (``unknown_facts``);
- the operator's schema: ``Tensor(a!)`` arguments are declared written (``mutating``: the
  in-place and ``out=`` forms), the returns are counted, the argument types say which are
  sizes (``SymInt``), dimensions and dtypes;
- torch's tags: ``nondeterministic_seeded`` marks random operators;
- torch's registries of side effects (``torch.library``'s effect registry, the functions
  torch's dead-code elimination keeps), for ``is_effectful`` only;
- the tables of this module, one row per operator or Python function, for what none of those
  says (print and assert operators, ``_make_dep_token``, higher-order ops that run random or
  effectful bodies, Python's arithmetic, torch's random functions, Tensor methods by name).

``facts`` is a pure function of its target, memoized in a bounded table (see ``facts``).
Whether an operator has a side effect is the one fact that torch lets change after the operator
exists (``torch.library``'s effect registry; the side-effectful set that ``torch.distributed``
adds to when imported); ``is_effectful`` reads those on each call and never memoizes them.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from pyrsistent import PMap, pmap

from ir import op_known, opset
from ir.args import IDict, IList
from ir.torch_seam import (
    HigherOrderOperator,
    OpOverload,
    OpOverloadPacket,
    has_effects,
    op_schema,
    packet_name,
    torch_side_effectful,
)

# --- what a target is ---------------------------------------------------------------------------

OVERLOAD = "overload"  #: an ``OpOverload`` (``aten.add.Tensor``): it has a schema
PACKET = "packet"  #: an ``OpOverloadPacket`` (``aten.add``): answered by its ``default`` overload
HOP = "hop"  #: a ``HigherOrderOperator`` (``cond``, ``with_effects``, ...)
FUNCTION = "function"  #: any other callable (``operator.getitem``, ``torch.relu``, ...)
METHOD = "method"  #: a ``call_method`` target: a Tensor method's name (``"add_"``)

#: The operators purefx itself writes into graphs.
COPY = torch.ops.aten.copy_.default
CLONE = torch.ops.aten.clone.default
SYM_SIZE = torch.ops.aten.sym_size.int
MAKE_DEP_TOKEN = torch.ops.aten._make_dep_token.default

#: The name of the higher-order op that threads an effect token (``facts(t).hop``).
WITH_EFFECTS = "with_effects"

_MEMO_SIZE = 4096

TABLE = "table"  #: ``OpFacts.origin``: a row of the verified operator table (``ir.opset``)
OBSERVED = op_known.OBSERVED  #: ``OpFacts.origin``: observed on a call purefx met
DECLARED = op_known.DECLARED  #: ``OpFacts.origin``: declared with ``register_facts``
UNKNOWN = "unknown"  #: ``OpFacts.origin``: no facts; writes and aliases every tensor argument
_SETTLED = frozenset({"", TABLE})  # origins whose facts no observation or declaration changes
_NO_STATE_OUTPUTS: PMap = pmap()


@attrs.frozen
class Param:
    """One argument of an operator's schema."""

    name: str
    type: str  #: the schema's type, as torch prints it (``"Tensor"``, ``"int[]"``, ``"str"``)
    required: bool  #: no default value
    written: bool  #: ``Tensor(a!)``: the operator writes it in place
    default: Any = None  #: the default value (``None`` when required or when it is ``None``)
    kwarg_only: bool = False  #: may only be passed by keyword (after ``*`` in the schema)


@attrs.frozen
class OpFacts:
    """Everything purefx knows about one target. Build it with ``facts``."""

    name: str  #: a readable name, for messages
    kind: str  #: ``OVERLOAD``, ``PACKET``, ``HOP``, ``FUNCTION`` or ``METHOD``
    qualname: str = ""  #: what ``torch.ops`` finds it by (``"aten::add.Tensor"``, ``"cond"``)
    schema: str = ""  #: the schema as torch prints it, for messages (``""`` without one)
    params: tuple[Param, ...] = ()  #: schema arguments (``()`` without a schema)
    results: int | None = None  #: how many values the schema returns (``None``: no schema)
    mutating: bool = False
    """Its schema declares a write of some argument (``add_``, ``copy_``, ``add.out``): an
    in-place or ``out=`` form. What a call may write, declared or not, is ``writes``."""
    written: tuple[int, ...] = ()  #: positions of the arguments its schema declares written
    writes: tuple[opset.Write, ...] = ()
    """What an ``OpOverload`` writes in place, and under which argument values
    (``opset.written_at`` evaluates them for one call): the verified table's row, which
    includes the writes its schema hides; for an overload the table lacks, every tensor
    argument, always. ``()`` for other targets (``mutating``/``written`` say theirs)."""
    aliases: tuple[tuple[int, int], ...] = ()
    """``(result index, argument position)`` pairs whose storage an ``OpOverload``'s result
    may share (the verified table's; every tensor argument for an overload it lacks)."""
    verified: bool = True
    """``False`` only for an ``OpOverload`` without a row in the verified table: nothing is
    known of it, so it writes and aliases every tensor argument and is never pure."""
    origin: str = ""
    """Where an ``OpOverload``'s ``writes``, ``aliases`` and randomness come from: ``TABLE``
    (the verified table), ``OBSERVED`` (observed on a call purefx met: ``ir.op_known``),
    ``DECLARED`` (``register_facts``) or ``UNKNOWN`` (none: conservative); ``""`` for other
    targets."""
    inplace: bool = False  #: writes its first argument and returns it (``add_``, ``copy_``)
    view: bool = False
    """Returns a view of an argument without writing (a schema result ``Tensor(a)`` of a
    functional operator: ``slice``, ``view``, ``select``, ``split``'s list, ``t``)."""
    effectful: bool = False  #: a side effect beyond its result (print, assert, effect token)
    random: bool = False  #: draws from a random number generator
    copy_of: int | None = None  #: the argument whose values the result (or the write) takes
    alias_like: bool = False  #: returns its first argument when shape, dtype, device are kept
    size_arithmetic: bool = False  #: scalar or symbolic-size arithmetic, or a size query
    getitem: bool = False  #: ``operator.getitem``
    hop: str = ""  #: the higher-order op's name (``"cond"``, ``"with_effects"``), else ``""``
    commutative: bool = False  #: its first two arguments may be swapped (``add.Tensor``, ``mul``)
    core: bool = True
    """In core aten (tagged core and left by ``run_decompositions()``, or an assert, effect
    token or size query it keeps), or no aten operator at all."""
    state_outputs: PMap = _NO_STATE_OUTPUTS
    """``{result index: argument position}`` for a functional operator that returns new values
    of some arguments (``_native_batch_norm_legit_functional``'s running statistics)."""
    size_args: tuple[int, ...] = ()  #: positions of ``SymInt``/``SymInt[]`` (optional too) arguments
    dim_args: tuple[int, ...] = ()  #: positions of dimension arguments (``int dim``, ``int[] dims``)
    dims_unordered: bool = False  #: its dimension arguments name a set (transpose, reductions)
    dims_of_result: bool = False  #: its dimensions count in the result's rank (``unsqueeze``)
    dtype_args: tuple[int, ...] = ()  #: positions of ``ScalarType? dtype`` arguments
    shape_arg: int | None = None  #: the size argument that is the result's shape (``view``, ``expand``)
    identity: str = ""
    """When the result is argument 0's value unchanged (``ALWAYS``, ``EVAL_DROPOUT``,
    ``SAME_METADATA``; ``""``: never); ``computes_nothing`` decides it for one node."""
    metadata_check: bool = False  #: returns nothing and only checks its input's metadata
    assertion: bool = False
    """A runtime check: raises on bad input and otherwise does nothing (``_assert_scalar``,
    ``_assert_tensor_metadata``, ``_assert_async``, ``sym_constrain_range``, ``torch._check``)."""

    @property
    def recomputable(self) -> bool:
        """Pure, deterministic and without effect, and no higher-order op: computing it a
        second time gives the same value and changes nothing (effects registered after this
        value was made are not seen: use ``is_recomputable``)."""
        return not (self.mutating or self.writes or not self.verified or self.effectful
                    or self.random or self.kind == HOP)


def facts(target: Any) -> OpFacts:
    """What purefx knows about ``target``, a ``call_function`` or ``call_method`` target.

    Any value is accepted: an ``OpOverload``, ``OpOverloadPacket``, ``HigherOrderOperator``,
    Python callable, or a method name (``str``). A target the tables do not name gets the
    facts its schema and tags give, else none (pure, deterministic, no effect), as torch's
    own ``Node.is_impure`` assumes for an unknown function.

    Memoized by identity in a table of at most 4096 entries, emptied when full: the value
    depends on nothing but the target, so a hit and a miss answer the same, and the table
    cannot grow past its bound. Keys are ``id(target)``, each entry holding its target (so an
    id is never reused while its entry lives): ``OpOverload.__hash__`` is Python code that
    costs more than reading the schema, so a hash-keyed cache would slow every pass down.
    The targets held are operators and functions that torch or the user's module keeps alive
    anyway. An overload outside the verified table is answered again once ``ir.op_known``'s
    generation moves (its facts observed, declared or withdrawn): from unknown (conservative)
    to what torch showed or the user declared; back to unknown only by an explicit
    ``unregister`` or ``ir.op_known.forget``, or when ``ir.op_known``'s bounded memo is emptied
    with the store off (then the next call met observes again).
    O(schema arguments) on a miss, O(1) on a hit.
    """
    hit = _MEMO.get(id(target))
    if hit is not None and hit[0] is target and (
            hit[1].origin in _SETTLED or hit[2] == op_known.generation()):
        return hit[1]
    found = _facts_of(target)
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.clear()
    _MEMO[id(target)] = (target, found, op_known.generation())
    return found


# The shape of ``ir.memo.BoundedMemo``, written inline: ``facts`` runs per node in every pass,
# and a ``BoundedMemo.get`` per hit (a call and a tuple key) costs half again a hit's time.
_MEMO: dict[int, tuple[Any, OpFacts, int]] = {}


def _facts_of(target: Any) -> OpFacts:
    if isinstance(target, OpOverload):
        return _overload_facts(target)
    if isinstance(target, OpOverloadPacket):
        default = getattr(target, "default", None)
        base = _overload_facts(default) if default is not None else OpFacts(str(target), PACKET)
        # which overload runs depends on the arguments: no schema facts, the default's others
        return attrs.evolve(
            base, name=str(target), kind=PACKET, qualname=packet_name(target), schema="",
            params=(), results=None, size_args=(), dim_args=(), dtype_args=(), identity="",
            shape_arg=None,
        )
    if isinstance(target, HigherOrderOperator):
        return _hop_facts(target)
    if isinstance(target, str):
        return _method_facts(target)
    return _function_facts(target)


def _overload_facts(op: OpOverload) -> OpFacts:
    schema = op_schema(op)
    params = tuple(
        Param(
            a.name,
            str(a.type),
            not a.has_default_value(),
            a.alias_info is not None and a.alias_info.is_write,
            a.default_value if a.has_default_value() else None,
            a.kwarg_only,
        )
        for a in schema.arguments
    )
    written = tuple(i for i, p in enumerate(params) if p.written)
    first_result = schema.returns[0].alias_info if schema.returns else None
    packet = op.overloadpacket
    row = opset.entry(op)
    origin = TABLE
    if row is None:
        row = op_known.known(op)
        origin = UNKNOWN if row is None else row.source
    if row is None:
        tensors = tuple(i for i, p in enumerate(params) if "Tensor" in p.type)
        writes = tuple(opset.Write(i) for i in tensors)
        aliases = tuple((r, i) for r in range(len(schema.returns)) for i in tensors)
    else:
        writes, aliases = row.writes, row.aliases
    return OpFacts(
        name=str(op),
        kind=OVERLOAD,
        qualname=op.name(),
        schema=str(schema),
        params=params,
        results=len(schema.returns),
        mutating=schema.is_mutable,
        written=written,
        inplace=0 in written and first_result is not None and first_result.is_write,
        view=not schema.is_mutable and any(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        ),
        writes=writes,
        aliases=aliases,
        verified=row is not None,
        origin=origin,
        effectful=op in _EFFECTFUL_OPS or packet in _EFFECTFUL_PACKETS or (
            row is not None and row.effectful),
        random=torch.Tag.nondeterministic_seeded in op.tags or (row is not None and row.random),
        copy_of=_COPY_OF.get(packet),
        alias_like=packet in _ALIAS_LIKE_PACKETS,
        size_arithmetic=packet in _SIZE_QUERIES,
        state_outputs=_state_outputs(op),
        commutative=op in _COMMUTATIVE_OPS,
        **_argument_kinds(op, params),
        identity=_IDENTITY.get(packet, ""),
        metadata_check=op in _METADATA_CHECKS,
        assertion=op in _ASSERT_OPS or packet in _ASSERT_PACKETS,
        core=op.namespace != "aten" or (
            torch.Tag.core in op.tags and op not in _decomposed_by_default()
        ) or _kept_by_decompositions(op),
    )


def _kept_by_decompositions(op: OpOverload) -> bool:
    """An aten operator untagged core (or in the default decomposition table) that
    ``run_decompositions()`` leaves in graphs all the same: the runtime asserts, effect tokens
    and size queries (``_assert_tensor_metadata`` after ``.to``, ``sym_size`` with dynamic
    shapes)."""
    packet = op.overloadpacket
    return op in _EFFECTFUL_OPS or packet in _EFFECTFUL_PACKETS or packet in _SIZE_QUERIES


def _argument_kinds(op: OpOverload, params: tuple[Param, ...]) -> dict[str, Any]:
    """Which schema arguments are sizes, dimensions and result dtypes (``OpFacts`` fields),
    read from the schema's types (``SymInt``, ``int``, ``ScalarType``, optional or in lists)."""
    kinds = [_element_kind(a.real_type) for a in op_schema(op).arguments]
    sizes = tuple(i for i, k in enumerate(kinds) if k == "SymIntType")
    dims = tuple(
        i for i, (p, k) in enumerate(zip(params, kinds)) if p.name in _DIM_NAMES and k == "IntType"
    )
    dtypes = tuple(
        i for i, (p, k) in enumerate(zip(params, kinds))
        if p.name == "dtype" and k == "ScalarTypeType" and not p.required
    )
    packet = op.overloadpacket
    return {
        "size_args": sizes,
        "dim_args": dims,
        "dtype_args": dtypes,
        "dims_unordered": bool(dims) and packet in _UNORDERED_DIMS,
        "dims_of_result": packet in _DIMS_OF_RESULT,
        "shape_arg": 1 if packet in _SHAPE_IS_RESULT and 1 in sizes else None,
    }


def _element_kind(jit_type: Any) -> str:
    """The kind of a schema type's element (``"SymIntType"`` for ``SymInt[]?``)."""
    while jit_type.kind() in ("OptionalType", "ListType"):
        jit_type = jit_type.getElementType()
    return jit_type.kind()


_DECOMPOSED: list = []


def _decomposed_by_default() -> Any:
    """The operators ``ExportedProgram.run_decompositions()`` decomposes by default, even some
    tagged core (``aten.var.dim``); built once, on first use."""
    if not _DECOMPOSED:
        _DECOMPOSED.append(frozenset(torch.export.default_decompositions()))
    return _DECOMPOSED[0]


def _hop_facts(hop: HigherOrderOperator) -> OpFacts:
    name = hop.name()
    return OpFacts(
        name=f"higher_order.{name}",
        kind=HOP,
        qualname=name,
        mutating=name in _MUTATING_HOPS,
        effectful=name in _EFFECTFUL_HOPS,
        random=name in _RANDOM_HOPS,
        hop=name,
    )


def _method_facts(name: str) -> OpFacts:
    inplace = name.endswith("_") and not name.endswith("__")
    return OpFacts(
        name=name,
        kind=METHOD,
        mutating=inplace,
        written=(0,) if inplace else (),
        inplace=inplace,
        random=name in _RANDOM_METHODS,
        copy_of=_COPY_OF_METHOD.get(name),
        alias_like=name in _ALIAS_LIKE_METHODS,
        size_arithmetic=name in _SIZE_METHODS,
    )


def _function_facts(fn: Any) -> OpFacts:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    known = is_in(fn, _SIZE_FUNCTIONS)
    mutating = is_in(fn, _MUTATING_FUNCTIONS)
    return OpFacts(
        name=f"{module}.{qualname}" if module else qualname,
        kind=FUNCTION,
        mutating=mutating,
        written=(0,) if mutating else (),
        inplace=mutating and fn not in _SETTERS,
        effectful=is_in(fn, _EFFECTFUL_FUNCTIONS),
        assertion=is_in(fn, _ASSERT_FUNCTIONS),
        random=is_in(fn, _RANDOM_FUNCTIONS),
        size_arithmetic=known or (module == "math" and callable(fn)),
        getitem=fn is operator.getitem,
    )


def is_in(value: Any, table: frozenset[Any]) -> bool:
    """``value in table``, ``False`` for an unhashable ``value`` (a target may be any object).
    O(1)."""
    try:
        return value in table
    except TypeError:  # unhashable
        return False


def _state_outputs(op: OpOverload) -> PMap:
    """For ``X_functional``, the functionalized form of an operator ``X`` that writes arguments
    in place: its last returns are the new values of ``X``'s written arguments, in order."""
    packet_name = op.overloadpacket.__name__
    if not packet_name.endswith("_functional"):
        return _NO_STATE_OUTPUTS
    namespace = getattr(torch.ops, op.namespace, None)
    base_packet = getattr(namespace, packet_name[: -len("_functional")], None)
    overload = op.name().rpartition(".")[2] if "." in op.name() else "default"
    base = getattr(base_packet, overload, None) if base_packet is not None else None
    if not isinstance(base, OpOverload):
        return _NO_STATE_OUTPUTS
    written = _overload_facts(base).written
    results = len(op_schema(op).returns)
    if not written or len(written) > results:
        return _NO_STATE_OUTPUTS
    first = results - len(written)
    return pmap({first + k: position for k, position in enumerate(written)})


# --- predicates ----------------------------------------------------------------------------------


def is_mutating(target: Any) -> bool:
    """Writes some argument in place (schema ``Tensor(a!)``, ``operator.setitem``, a Tensor
    method whose name ends in ``_``). O(1) amortized."""
    return facts(target).mutating


def written_args(target: Any) -> tuple[int, ...]:
    """Positions of the arguments ``target`` writes in place (``()`` for a functional one)."""
    return facts(target).written


def is_inplace(target: Any) -> bool:
    """Writes its first argument in place and returns it, so that its result *is* that
    argument (``add_``, ``copy_``; not ``add.out`` nor train-mode batch norm, which write
    other arguments)."""
    return facts(target).inplace


def functional_twin(target: Any) -> Any:
    """The operator that computes what the in-place ``target`` writes, into new memory:
    ``aten.add.Tensor`` for ``aten.add_.Tensor``, ``aten.relu.default`` for
    ``aten.relu_.default``; ``None`` where ``target`` is no in-place ``OpOverload``
    (``is_inplace``) or its namespace has no overload of the name without ``_`` taking the
    same arguments (names, types, defaults) that writes nothing, is no view and returns one
    value.

    **Laws:** ``twin(*args)`` equals the value ``target(*args)`` leaves in its first argument
    (and returns), for every argument ``target`` accepts. O(1) after the first call per
    operator (``facts`` is memoized)."""
    found = facts(target)
    if found.kind != OVERLOAD or not found.inplace or found.written != (0,):
        return None
    packet = target.overloadpacket.__name__
    if not packet.endswith("_") or packet.endswith("__"):
        return None
    namespace = getattr(torch.ops, target.namespace, None)
    twin_packet = getattr(namespace, packet[:-1], None)
    twin = getattr(twin_packet, target._overloadname, None) if twin_packet is not None else None
    if twin is None:
        return None
    mine = facts(twin)
    if (mine.kind != OVERLOAD or mine.mutating or mine.writes or mine.view or mine.random
            or mine.results != 1
            or _parameters(mine) != _parameters(found)):
        return None
    return twin


def _parameters(found: Any) -> list[tuple]:
    """An operator's parameters as ``functional_twin`` compares them: name, type, whether
    required, default, keyword-only."""
    return [(p.name, p.type, p.required, p.default, p.kwarg_only) for p in found.params]


def is_view(target: Any) -> bool:
    """Returns a view of an argument (its first, for every aten view operator) without writing
    it: the schema's result is aliased and not written (``slice``, ``view``, ``select``,
    ``split``'s list items, ``t``, ``expand``). ``getitem`` and alias-like operators that may
    copy (``clone``, ``to``) are not views by this fact. O(1) after the first call."""
    return facts(target).view


def is_effectful(target: Any) -> bool:
    """Has a side effect beyond its result: prints, asserts, threads an effect token
    (``with_effects``, ``_make_dep_token``), changes global state (grad mode, autocast), is
    registered as effectful with ``torch.library``, or is one torch keeps for its side effect
    (``torch.distributed``'s send and receive). torch's registries are read on every call (a
    custom operator may be registered, a torch module imported, after a first lookup), so
    this costs a few µs for an operator; use it on the nodes that need it, not on every node
    of a graph."""
    found = facts(target)
    if found.effectful:
        return True
    if found.kind in (OVERLOAD, HOP) and has_effects(target):
        return True
    return torch_side_effectful(target)


def is_random(target: Any) -> bool:
    """Draws from a random number generator (``nondeterministic_seeded``, dropout, ``rand*``,
    ``bernoulli``, random-state higher-order ops, torch's random functions)."""
    return facts(target).random


def is_recomputable(target: Any) -> bool:
    """Pure, deterministic and without effect: a second call computes the same value and
    changes nothing. Higher-order ops are never recomputable (their bodies are not looked at)."""
    return not impurity(target)


def impurity(target: Any) -> str:
    """Why ``target`` cannot be computed a second time, as a phrase that follows a value's name
    (``"mutates its input (aten.add_.Tensor)"``), or ``''`` when it can: a higher-order op, a
    declared or verified write under some argument values (``aten.batch_norm``: a node whose
    literal arguments rule the write out is pure by ``ir.effects.is_pure``), an overload the
    verified table lacks, randomness, a side effect."""
    found = facts(target)
    if found.kind == HOP:
        return f"is a higher-order op ({found.hop})"
    if found.mutating:
        return f"mutates its input ({found.name})"
    if found.random:
        return f"is random ({found.name})"
    if is_effectful(target):
        return f"has a side effect ({found.name})"
    if not found.verified:
        return f"may write and alias its inputs: {unknown_facts(target)}"
    if found.writes:
        return f"may write its input ({found.name})"
    return ""


def unknown_facts(target: Any) -> str:
    """The one message for an operator whose facts are unknown (an ``OpOverload`` the verified
    table lacks, with no declared facts, that purefx could not observe: ``OpFacts.origin`` is
    ``UNKNOWN``): ``"facts unknown for OP: purefx could not observe it (WHY); declare them
    with ir.ops.register_facts(OP, written=..., random=...)"``; ``""`` for any target whose
    facts are known. Every refusal that comes from the conservative default (writes and
    aliases every tensor argument) says this instead of claiming a write. O(1)."""
    found = facts(target)
    if found.kind != OVERLOAD or found.origin != UNKNOWN:
        return ""
    return (f"facts unknown for {found.name}: purefx could not observe it "
            f"({op_known.why_unknown(target)}); declare them with "
            f"ir.ops.register_facts({found.name}, written=..., random=...), or observe them "
            "with ir.ops.observe_facts(op, example_args)")


def meet(target: Any, args: Any, kwargs: Any, val_of: Any) -> None:
    """A call of ``target`` whose arguments hold ``Ref`` s, each value read by ``val_of``, is
    about to be analysed: when ``target`` is an operator overload whose facts do not cover
    such a call yet (not in the verified table, not declared), observe it on real tensors of
    those values' shapes and dtypes first (``ir.op_known``), so that ``facts`` answers what it
    does rather than the conservative default. O(1) for an operator of the table."""
    op_known.meet_refs(target, args, kwargs, val_of)


def register_facts(target: Any, *, written: Any = (), aliases: Any = (), random: bool = False,
                   effectful: bool = False) -> op_known.Declared:
    """Declare the facts of ``target``, an operator overload the verified table lacks (a
    ``torch.library`` custom operator): ``written``, the arguments it writes in place
    (positions or names); ``aliases``, ``(result index, argument)`` pairs that may share
    storage; ``random``, whether it draws random numbers; ``effectful``, whether it has a side
    effect. The schema's own writes and aliases are always added.

    An explicit, scoped action: the facts hold from this call until the returned handle's
    ``unregister()`` (or the end of ``with register_facts(...):``); while they hold, ``facts``
    answers them (``origin == DECLARED``) and purefx never runs the operator to observe it.
    Raises ``ir.errors.OperatorFactsError`` for a target that is no overload, one of the
    table, or an argument its schema lacks. O(arguments)."""
    return op_known.declare(target, written=written, aliases=aliases, random=random,
                            effectful=effectful)


def observe_facts(target: Any, args: Any = (), kwargs: Any = None) -> opset.OpEntry:
    """Observe ``target``, an operator overload the verified table lacks, on a call with
    example ``args`` and ``kwargs`` (real or fake tensors and literals; only the tensors'
    shapes, dtypes, strides and devices are used: the operator runs twice, under two seeds, on new
    tensors) and keep its facts (in memory and in the verdict store's ``operators/``), as
    purefx does by itself when it first meets a call with values. Returns the facts
    (``ir.opset.OpEntry``). Raises ``ir.errors.OperatorFactsError`` when it cannot be
    observed (the operator raises on such tensors, a value cannot be made). O(two calls)."""
    return op_known.observe_now(target, tuple(args), dict(kwargs or {}))


def is_assert(target: Any) -> bool:
    """A runtime check that raises on bad input and otherwise computes nothing and writes
    nothing: the asserts export leaves (``_assert_scalar``, ``_assert_tensor_metadata``,
    ``_assert_async``, their functional forms), the size constraints
    (``sym_constrain_range``, ``sym_constrain_range_for_size``) and Python's ``torch._assert``,
    ``torch._assert_async``, ``torch._check``. Every assert is effectful (``is_effectful``):
    it is kept where its check still matters, and goes with the value it checks. O(1)."""
    return facts(target).assertion


def is_commutative(target: Any) -> bool:
    """Whether ``target``'s first two arguments may be swapped without changing its result
    (``aten.add.Tensor``, ``aten.mul.Tensor``, ``aten.maximum``, ``aten.eq.Tensor``, ...) when
    its other arguments have their defaults (``add``'s ``alpha=1``). The ``Scalar`` overloads,
    whose scalar cannot come first, are not. A fact of the table ``_COMMUTATIVE_OPS``; O(1)
    after the first call."""
    return facts(target).commutative


def is_core_aten(target: Any) -> bool:
    """``False`` only for an aten operator overload outside core aten (``aten.linear``,
    ``aten.softmax.int``, ``aten.matmul``): what ``run_decompositions()`` leaves is core aten.
    Any other target (another namespace, a Python function, a higher-order op) is ``True``."""
    return facts(target).core


def normalized_args(target: Any, args: tuple, kwargs: Any) -> tuple | None:
    """``target``'s arguments in schema order, keywords made positional and defaults filled:
    ``aten.add.Tensor(x, y)`` and ``aten.add.Tensor(x, y, alpha=1)`` both give ``(x, y, 1)``.

    ``kwargs`` is an ``ir.args.IDict`` or a mapping. Returns ``None`` for a target without a
    schema (a Python function, a higher-order op, a packet) or arguments its schema does not
    take. Laws: two calls of one overload that compute the same thing by the schema's rules
    give equal tuples. O(schema arguments).
    """
    params = facts(target).params
    if not params and facts(target).kind != OVERLOAD:
        return None
    if len(args) > len(params):
        return None
    pairs = kwargs.items if isinstance(kwargs, IDict) else (kwargs or {}).items()
    items = dict(pairs)
    out = list(args)
    for param in params[len(args):]:
        if param.name in items:
            out.append(items.pop(param.name))
        elif param.required:
            return None
        else:
            out.append(param.default)
    if items:
        return None
    return tuple(out)


def copy_of(target: Any) -> int | None:
    """The position of the argument whose values ``target``'s result takes (``_to_copy``,
    ``clone``, ``to``: 0), or that it writes into its first argument (``copy_``: 1); else
    ``None``. Values are equal up to dtype, device, layout, memory format and broadcasting."""
    return facts(target).copy_of


def is_alias_like(target: Any) -> bool:
    """Returns its first argument's value unchanged whenever the result keeps the argument's
    shape, dtype and device (``view``, ``reshape``, ``expand``, ``clone``, ``alias``, ``to``,
    ``_to_copy``, ``contiguous``, a whole ``slice``, ...). Callers check the metadata."""
    return facts(target).alias_like


def reads_strides(target: Any) -> bool:
    """Whether ``target``'s result depends on its first argument's strides, not only on its
    values: ``as_strided`` and the stride and contiguity queries. A rewrite that changes a
    value's strides keeps the program's meaning only where no such operator reads it. O(1)."""
    if isinstance(target, str):
        return target in _STRIDE_READING_METHODS
    packet = getattr(target, "overloadpacket", target)
    return is_in(packet, _STRIDE_READERS)


def is_size_arithmetic(target: Any) -> bool:
    """Scalar arithmetic or comparison (``operator``, ``math``, ``torch.sym_*``), or a size
    query (``aten.sym_size``, ``sym_numel``, ...): in an exported graph, symbolic sizes."""
    return facts(target).size_arithmetic


def is_getitem(target: Any) -> bool:
    """``operator.getitem``."""
    return facts(target).getitem


def hop_kind(target: Any) -> str:
    """The higher-order op's name (``"cond"``, ``"with_effects"``, ...), ``''`` for any other
    target."""
    return facts(target).hop


# --- arguments in a normal form, and nodes that compute nothing ----------------------------------

ALWAYS = "always"  #: ``identity``: the result is always argument 0's value (``alias``)
EVAL_DROPOUT = "eval_dropout"  #: ``identity``: a dropout whose ``train`` is false or ``p`` is 0
SAME_METADATA = "same_metadata"
"""``identity``: a conversion or copy (``to``, ``_to_copy``, ``type_as``, ``clone``,
``contiguous``) whose result keeps its input's dtype, device, layout and shape."""


def canonical_args(
    target: Any, args: tuple, rank: int | None, dtype: Any, shape: tuple | None = None
) -> tuple:
    """``args`` (``normalized_args``' form) with the spellings of one computation made one:
    a negative dimension made positive by ``rank``, the dimensions of ``transpose`` and of a
    reduction's dimension list sorted, a floating ``dtype`` argument equal to ``dtype`` made
    ``None`` (``softmax(x, -1, dtype=torch.float32)`` on float32 ``x`` is ``softmax(x, -1)``),
    the size argument of ``view``, ``reshape`` or ``expand`` made the result's ``shape``
    (``x.view(-1)`` on a (6, 5) ``x`` is ``x.view(30)``).

    ``rank``, ``dtype``: the first tensor argument's (the result's rank for an operator whose
    dimensions count in its result, ``unsqueeze``); ``shape``: the result's, a tuple of ints;
    ``None`` when unknown (left as they are).

    **Laws:** two calls of one overload on inputs of one rank and dtype that compute the same
    thing by those rules give equal tuples; a pure function of its arguments; ``args`` of a
    target without a schema come back unchanged. O(arguments)."""
    found = facts(target)
    if not (found.dim_args or found.dtype_args or found.shape_arg) or len(args) != len(
        found.params
    ):
        return args
    out = list(args)
    at = found.shape_arg
    if (at is not None and shape is not None and isinstance(out[at], (tuple, list, IList))
            and len(out[at]) == len(shape) and all(type(d) is int for d in out[at])):
        out[at] = IList(tuple(shape)) if type(out[at]) is IList else tuple(shape)
    if rank is not None and found.dims_of_result:
        rank += 1
    if rank is not None:
        for i in found.dim_args:
            out[i] = _positive_dims(out[i], rank, found.dims_unordered)
        if found.dims_unordered and len(found.dim_args) == 2:
            a, b = (out[i] for i in found.dim_args)
            if type(a) is int and type(b) is int and a > b:
                out[found.dim_args[0]], out[found.dim_args[1]] = b, a
    if dtype is not None and getattr(dtype, "is_floating_point", False):
        for i in found.dtype_args:
            if out[i] == dtype:
                out[i] = None
    return tuple(out)


def _positive_dims(value: Any, rank: int, unordered: bool) -> Any:
    if type(value) is int:
        return value + rank if -rank <= value < 0 else value
    if isinstance(value, (tuple, list, IList)):
        items = [d + rank if type(d) is int and -rank <= d < 0 else d for d in value]
        if unordered and all(type(d) is int for d in items):
            items.sort()
        return IList(tuple(items)) if type(value) is IList else tuple(items)
    return value


def computes_nothing(target: Any, args: tuple, val_in: Any, val_out: Any) -> bool:
    """Whether a node calling ``target`` on ``args`` (``canonical_args``' form) gives its
    argument 0's value unchanged: ``alias``; a dropout with ``train`` false or ``p`` 0; a
    conversion or copy (``to``, ``_to_copy``, ``type_as``, ``clone``, ``contiguous``) whose
    result ``val_out`` keeps ``val_in``'s dtype, device, layout and shape (its memory format is
    no matter: the values are the same, only their strides differ). ``val_in``/``val_out``: argument 0's and the node's
    ``meta['val']`` (``None``: unknown, then only ``alias`` and dropout can say yes).

    Such a node is a copy or an alias of its input: inside a rewrite's match it may be looked
    through, and dropped with the match. **Laws:** ``True`` only when, on every input, the
    result equals argument 0 element for element, in dtype and shape. O(arguments)."""
    found = facts(target)
    kind = found.identity
    if not kind or not args:
        return False
    if kind == ALWAYS:
        return True
    if kind == EVAL_DROPOUT:
        p, train = args[1], args[2]
        return train is False or (type(p) in (int, float) and p == 0)
    if not isinstance(val_in, torch.Tensor) or not isinstance(val_out, torch.Tensor):
        return False
    return (val_in.dtype, val_in.device, val_in.layout, val_in.shape) == (
        val_out.dtype, val_out.device, val_out.layout, val_out.shape
    )


def is_metadata_check(target: Any) -> bool:
    """Returns nothing and only checks its input's metadata (``_assert_tensor_metadata``): a
    check that a rewrite may drop with the value it reads."""
    return facts(target).metadata_check


# --- the tables ----------------------------------------------------------------------------------


def _ops(*names: str) -> frozenset[Any]:
    """The overloads (``"aten._print.default"``) or packets (``"aten.to"``) named that exist in
    this torch; a name it lacks is skipped."""
    found = (attribute_path(torch.ops, name.split(".")) for name in names)
    return frozenset(obj for obj in found if obj is not None)


def _functions(*names: str) -> frozenset[Any]:
    """The functions named (``"torch.rand"``, ``"torch.nn.functional.dropout"``) that exist."""
    roots = {"torch": torch, "F": F, "operator": operator, "builtins": builtins, "math": math}
    found = (attribute_path(roots[root], parts) for root, *parts in (n.split(".") for n in names))
    return frozenset(obj for obj in found if obj is not None)


def attribute_path(obj: Any, parts: list[str]) -> Any:
    """``obj.parts[0].parts[1]...``, or ``None`` where a step is missing or raises while it is
    looked up (a ``torch.ops`` namespace loads lazily). O(len(parts))."""
    for part in parts:
        try:
            obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            return None
    return obj


# Operators with a side effect that neither the schema nor the effect registry states.
_EFFECTFUL_OPS = _ops(
    "aten._make_dep_token.default",  # starts an effect-token chain
    "aten._assert_scalar.default",  # the runtime asserts: raise on bad input
    "aten._assert_tensor_metadata.default",
    "aten.sym_constrain_range.default",
    "aten.sym_constrain_range_for_size.default",
    "prims._sink_tokens.default",  # ends effect-token chains
    "inductor.accumulate_grad_.default",  # write a tensor's .grad or storage, unannotated
    "inductor.resize_storage_bytes_.default",
)
_EFFECTFUL_PACKETS = _ops(
    "aten._print",  # prints
    "aten._assert_async",
    "aten._functional_assert_async",
    "aten._functional_sym_constrain_range",
    "aten._functional_sym_constrain_range_for_size",
    "profiler._record_function_enter",  # opens and closes profiler ranges
    "profiler._record_function_enter_new",
    "profiler._record_function_exit",
)

# The runtime checks among those (``is_assert``).
_ASSERT_OPS = _ops(
    "aten._assert_scalar.default", "aten._assert_tensor_metadata.default",
    "aten.sym_constrain_range.default", "aten.sym_constrain_range_for_size.default",
)
_ASSERT_PACKETS = _ops(
    "aten._assert_async", "aten._functional_assert_async",
    "aten._functional_sym_constrain_range", "aten._functional_sym_constrain_range_for_size",
)

# Higher-order ops by name: those whose call is an effect, draws random numbers or writes.
_EFFECTFUL_HOPS = frozenset(
    {"with_effects", "print", "invoke_leaf_function", "call_torchbind", "_export_tracepoint"}
)
_RANDOM_HOPS = frozenset(
    {"run_and_save_rng_state", "run_with_rng_state", "graphsafe_run_with_rng_state",
     "run_dtensor_rng_op"}
)
_MUTATING_HOPS = frozenset({"triton_kernel_wrapper_mutation"})

# Operators whose first two arguments commute (both tensors; a Scalar overload's scalar is second).
_COMMUTATIVE_OPS = _ops(*(f"aten.{n}.Tensor" for n in (
    "add", "mul", "eq", "ne", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor",
)), *(f"aten.{n}.default" for n in ("maximum", "minimum", "fmax", "fmin", "hypot")))

# Operators whose result holds the values of one argument: position of that argument.
_COPY_OF: Mapping[Any, int] = MappingProxyType(
    {p: 1 for p in _ops("aten.copy_", "aten.copy")}
    | {p: 0 for p in _ops("aten._to_copy", "aten.clone", "aten.to", "aten.lift_fresh_copy")}
)
_COPY_OF_METHOD: Mapping[str, int] = MappingProxyType(
    {"copy_": 1, "clone": 0, "to": 0, "type": 0, "float": 0, "double": 0, "half": 0,
     "bfloat16": 0, "int": 0, "long": 0, "bool": 0, "cpu": 0, "cuda": 0}
)

# Operators that are their first argument whenever the result keeps its shape, dtype and device.
_ALIAS_LIKE_NAMES = (
    "alias", "clone", "contiguous", "to", "_to_copy", "lift_fresh_copy", "type_as",
    "view", "view_as", "reshape", "reshape_as", "_unsafe_view", "_reshape_alias",
    "expand", "expand_as", "flatten", "unflatten", "squeeze", "unsqueeze", "slice",
    "alias_copy", "view_copy", "expand_copy", "squeeze_copy", "unsqueeze_copy", "slice_copy",
)
_ALIAS_LIKE_PACKETS = _ops(*(f"aten.{n}" for n in _ALIAS_LIKE_NAMES))
_ALIAS_LIKE_METHODS = frozenset(_ALIAS_LIKE_NAMES) - {"_to_copy", "lift_fresh_copy"}

# Operators whose result depends on their first argument's strides (``reads_strides``).
_STRIDE_READERS = _ops(
    "aten.as_strided", "aten.sym_stride", "aten.sym_is_contiguous", "aten.is_contiguous",
    "aten.is_non_overlapping_and_dense",
)
_STRIDE_READING_METHODS = frozenset({"as_strided", "stride", "is_contiguous"})

# Size queries on tensors: their results are (symbolic) integers.
_SIZE_QUERIES = _ops(
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset",
    "aten.sym_is_contiguous",
)
_SIZE_METHODS = frozenset({"size", "stride", "numel", "dim", "storage_offset"})

# Python functions on scalars and symbolic sizes (all of ``math`` counts too).
_SIZE_FUNCTIONS = _functions(
    *(f"operator.{n}" for n in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq",
        "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift",
        "rshift", "truth", "index",
    )),
    *(f"torch.{n}" for n in (
        "sym_int", "sym_float", "sym_not", "sym_ite", "sym_max", "sym_min", "sym_sqrt",
        "sym_sum", "sym_fresh_size", "_sym_sqrt",
    )),
    "builtins.abs", "builtins.min", "builtins.max", "builtins.round", "builtins.int",
    "builtins.float", "builtins.bool",
)

# Python functions that write their first argument (the setters return None, the others it).
_SETTERS = _functions("operator.setitem", "operator.delitem")
_MUTATING_FUNCTIONS = _SETTERS | _functions(
    *(f"operator.{n}" for n in (
        "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "iand",
        "ior", "ixor", "ilshift", "irshift",
    )),
)

# Python functions with a side effect: printing, asserting, global autograd / autocast state.
_EFFECTFUL_FUNCTIONS = _functions(
    "builtins.print", "torch._assert", "torch._assert_async", "torch._check",
    "torch._C._set_grad_enabled", "torch.amp.autocast_mode._enter_autocast",
    "torch.amp.autocast_mode._exit_autocast",
    *(f"torch._functorch.predispatch.{n}" for n in (
        "_enter_dual_level", "_exit_dual_level", "_jvp_increment_nesting",
        "_jvp_decrement_nesting",
    )),
)

# The runtime checks among those.
_ASSERT_FUNCTIONS = _functions("torch._assert", "torch._assert_async", "torch._check")

# Python functions that draw random numbers.
_RANDOM_FUNCTIONS = _functions(
    *(f"torch.{n}" for n in (
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
        "bernoulli", "multinomial", "normal", "poisson", "dropout", "alpha_dropout",
        "feature_dropout", "feature_alpha_dropout", "rrelu", "native_dropout",
    )),
    *(f"F.{n}" for n in (
        "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
        "feature_alpha_dropout", "rrelu", "gumbel_softmax",
    )),
)
_RANDOM_METHODS = frozenset(
    {"bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_",
     "geometric_", "cauchy_", "log_normal_", "multinomial"}
)


# Arguments named so are dimensions of the input (of the result, for ``_DIMS_OF_RESULT``).
_DIM_NAMES = frozenset(
    {"dim", "dims", "dim0", "dim1", "start_dim", "end_dim", "source", "destination"}
)
# Operators whose size argument is their result's shape (``-1`` standing for a size).
_SHAPE_IS_RESULT = _ops(
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.view_copy",
    "aten.expand_copy", "aten._reshape_alias",
)
_DIMS_OF_RESULT = _ops("aten.unsqueeze", "aten.unsqueeze_copy", "aten.stack")
# Operators whose dimension arguments name a set: the order they are written in is no matter.
_UNORDERED_DIMS = _ops(
    "aten.transpose", "aten.transpose_copy", "aten.sum", "aten.mean", "aten.amax", "aten.amin",
    "aten.prod", "aten.var", "aten.std", "aten.var_mean", "aten.std_mean", "aten.logsumexp",
    "aten.any", "aten.all", "aten.squeeze", "aten.squeeze_copy", "aten.nansum",
)
# Operators whose result is their argument 0's value under a condition (``computes_nothing``).
_IDENTITY: Mapping[Any, str] = MappingProxyType(
    {p: ALWAYS for p in _ops("aten.alias")}
    | {p: EVAL_DROPOUT for p in _ops(
        "aten.dropout", "aten.feature_dropout", "aten.alpha_dropout", "aten.feature_alpha_dropout",
    )}
    | {p: SAME_METADATA for p in _ops(
        "aten.to", "aten._to_copy", "aten.type_as", "aten.clone", "aten.contiguous",
    )}
)
# Operators that return nothing and only check their input's metadata.
_METADATA_CHECKS = _ops("aten._assert_tensor_metadata.default")
