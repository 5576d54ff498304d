"""The guards ``rewrite`` puts on every match: what makes a match right in its program, beyond
the rule's own law (``check_rule``).

A rule is checked on its own functions; whether taking one match keeps the *program's* meaning
depends on the program around it. Every reason to skip a match is one row of ``GUARDS``, an
ordered table of ``Guard`` values (name, stage, pure predicate of a ``Site``, reason), in the
"rules as data" style: the engine fills a ``Site`` stage by stage (``MATCH``, ``PLAN``,
``REPLACEMENT``, ``INSTANCE``) and runs each stage's rows in order; the first row that fails
skips the match and is counted under its name in ``RewriteReport.skipped``. The engine reads
``GUARDS`` (and the rows read the predicates below) as module globals, so a test can take a
row out (``without``) or switch a predicate off and watch a law fail.

The predicates that need more than a line:

- ``alias_guard``: a replacement that returns an input (``x * 1 -> x``), or a view of one, makes
  a value that was fresh an alias of a value outside the match. That is right only while no write
  in place can reach either of them (through any chain of views) and while the caller cannot see
  the new aliasing (the result returned next to, or as, an input or state value). Whether the
  matched result was fresh is read from the matched nodes' fake values (``shares_storage``), so a
  copy inside the match (``clone``, ``contiguous``, a ``reshape`` that copies) counts;
- ``barrier_guard``: a match must lie inside one chain of preserved calls
  (``preserve_module_call_signature``), so that outlining still finds every preserved call whole;
- ``dtype_guard``: each value that takes a replaced result's place has that result's dtype and
  shape (a replacement traced at one dtype must not change what a program at another computes);
- ``layout_guard``: a value with other strides than the result it replaces is taken only where
  no reader depends on them (the new layout followed down the readers on fake values).

The predicates are written once for both drivers: ``saturate`` asks ``where_holds``,
``alias_guard`` and ``sharing_guard`` of an e-graph (``transforms.rewrite.eclass_view``
answers ``MemoryView`` there, conservatively where a class is not one value), and both layout
guards (``layout_guard``, ``eclass_view.EClassView.restride``) are one walk, ``follow_layout``:
each driver gives its reader rules and comparisons (how it reads unknowns) as hooks.

Views are read from the operators' schemas (a result annotated ``Tensor(a)`` that is not written)
and from ``ir.ops.is_alias_like`` (``reshape``, ``to``, ``contiguous``: they may return their
input itself); a reader that is a ``call_module``, a higher-order op or an operator that writes
any argument counts as a write (it may write what it is given).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import attrs
import torch

from ir import ops
from ir.args import Ref
from ir.effects import is_pure, is_view, view_base, written_args
from ir.errors import PassError, PurefxError
from ir.fake_memo import FakeMemo
from ir.memo import WeakMemo
from ir.module_stack import NO_STACK
from ir.node import CALL_FUNCTION, CALL_METHOD, OUTPUT, PLACEHOLDER, Node
from ir.torch_seam import storage_identity
from transforms import kernel as kn
from transforms.machinery.trace import Traced
from transforms.rewrite.rule import Match


class GraphView(Protocol):
    """What a guard reads of the graph being rewritten: nodes by name and each value's readers
    (the output node is a reader of what it returns)."""

    node: Mapping[str, Node]
    users: Mapping[str, Mapping[str, None]]


@runtime_checkable
class MemoryView(Protocol):
    """What the alias and sharing guards ask of the graph a match is in, keyed by its values
    (a working graph's node names, an e-graph's class ids). Both drivers answer it: ``rewrite``
    through ``OnGraph`` (a ``GraphView`` read as ``ir.effects`` defines views and writes),
    ``saturate`` through ``eclass_view.EClassView``, whose answers are conservative where an
    e-class is not one value (``True`` past its cap, ``None`` for sources past it).

    - ``reach(v) -> (escapes, written)``: whether ``v`` or a view of it reaches the caller
      (returned; an input or state value always does; on the e-graph also read by a leaf),
      and whether a write in place (or a reader that may write) reaches it or a view of it;
    - ``sources(v)``: the values whose memory ``v`` may be (itself included), down its views;
      ``None`` when unknown."""

    def reach(self, value: Hashable) -> tuple[bool, bool]: ...

    def sources(self, value: Hashable) -> Collection[Hashable] | None: ...


# --- aliasing -----------------------------------------------------------------------------------


def alias_guard(view: GraphView | MemoryView, aliases: Mapping[Hashable, Hashable]) -> bool:
    """Whether results may become aliases of outside values without changing the program: the
    ``alias`` guard of ``rewrite`` and of ``saturate`` (one predicate over ``MemoryView``).

    Parameters:
        view: the graph as it is before the match is taken: a ``GraphView`` (read through
            ``OnGraph``) or any ``MemoryView`` (an e-graph's ``EClassView``).
        aliases: ``{replaced result: outside value}``: each result of the match (a graph node
            name) that the replacement makes an alias of a value outside the match (the graph
            name of the value bound to the replacement input it returns, or a view of which it
            returns), and that the pattern did not already make an alias of that input.

    Returns ``False`` when, for some pair: a write in place (or a reader that may write:
    ``call_module``, a higher-order op) reaches the result or a view of it; or reaches one of
    the outside value's sources (on a graph its base: the value it is a view of, through any
    chain of views) or any view of it; or the result escapes (returned, or a view of it is)
    while a source escapes too (a placeholder, an input or state the caller holds, or a value
    returned too), or while its sources are unknown. Else ``True``; always ``True`` for an
    empty mapping.

    **Laws:** pure; ``False`` whenever taking the match would let a write through the result
    reach the caller's input (or a write to the input reach the result), or give the caller
    two outputs, or an output and an input, that share memory where eager's did not.
    Complexity: O(views of the values involved and their readers).
    """
    memory = _memory(view)
    for result, outside in aliases.items():
        escapes, written = memory.reach(result)
        if written:
            return False
        sources = memory.sources(outside)
        if sources is None:
            if escapes:
                return False
            continue
        for source in sources:
            source_escapes, written = memory.reach(source)
            if written or (escapes and source_escapes):
                return False
    return True


def sharing_guard(view: GraphView | MemoryView, shared: Sequence[tuple[Hashable, Hashable]],
                  ) -> bool:
    """Whether the result pairs in ``shared`` may share memory: for each pair no write reaches
    either (or a view of either), and not both escape (``MemoryView.reach``). ``rewrite``'s
    pairs are ``transforms.rewrite.result_sharing.new_sharing`` (made views of one buffer by
    the replacement, fresh in the pattern); ``saturate``'s are the results that are views of
    one value in the pattern or in the replacement (``result_sharing.base_pairs``: one of
    them, and an e-graph value that escapes, would lose or gain the caller's aliasing).

    **Laws:** pure; ``True`` for no pairs; ``False`` whenever a write through one result could
    show in the other, or the caller would get two outputs sharing memory where eager's did
    not. O(views of the results and their readers)."""
    memory = _memory(view)
    for a, b in shared:
        ra, wa = memory.reach(a)
        rb, wb = memory.reach(b)
        if wa or wb or (ra and rb):
            return False
    return True


def _memory(view: GraphView | MemoryView) -> MemoryView:
    """``view`` as a ``MemoryView``: itself when it answers ``sources`` (an ``EClassView``), else
    read through ``OnGraph``. By attribute, not ``isinstance`` against the protocol: that walks
    the protocol's members at every call (a third of greedy ``rewrite``'s guard time). O(1)."""
    return view if hasattr(view, "sources") else OnGraph(view)


@attrs.frozen
class OnGraph:
    """A ``GraphView``'s answers to ``MemoryView``: views are ``ir.effects.is_view`` nodes
    reading their first argument, a write is a reader with ``ir.effects.written_args``; a value
    escapes when it or a view of it is returned, or when it is a placeholder (or not in the
    graph); its one source is its base (``ir.effects.view_base``). O(views of the value and
    their readers) per question."""

    view: GraphView

    def reach(self, name: str) -> tuple[bool, bool]:
        view, returned = self.view, False
        for v in _views_of(view, name):
            for u in view.users.get(v, ()):
                node = view.node.get(u)
                if node is None:
                    continue
                if node.op == OUTPUT:
                    returned = True
                elif not is_view(node) and written_args(node):
                    return True, True
        node = view.node.get(name)
        return returned or node is None or node.op == PLACEHOLDER, False

    def sources(self, name: str) -> tuple[str]:
        return (view_base(name, self.view.node.get),)


def _views_of(view: GraphView, name: str):
    """``name`` and every value that is a view of it through a chain of views, in BFS order."""
    seen = {name: None}
    todo = [name]
    while todo:
        v = todo.pop()
        for u in view.users.get(v, ()):
            if u in seen:
                continue
            node = view.node.get(u)
            if node is None or not is_view(node):
                continue
            first = node.args[0] if node.args else None
            if type(first) is Ref and first.name == v:
                seen[u] = None
                todo.append(u)
    return seen


def result_aliases(traced: Traced) -> tuple[int | None, ...]:
    """For each result of a traced rule function: the index of the input (placeholder order)
    that it is, or is a view of through a chain of views; ``None`` for a fresh result. A memo
    per ``Traced``. O(nodes) once."""
    return _RESULT_ALIASES(traced)


def _result_aliases(traced: Traced) -> tuple[int | None, ...]:
    nodes = {n.name: n for n in traced.graph.nodes}
    order = {n.name: i for i, n in enumerate(n for n in traced.graph.nodes if n.op == PLACEHOLDER)}

    def node_of(name: str) -> Node | None:  # a conversion that copies ends the chain of views
        node = nodes.get(name)
        return None if node is not None and node.args and _converts(node, nodes) else node

    return tuple(order.get(view_base(r.name, node_of)) if type(r) is Ref else None
                 for r in traced.outputs)


def _converts(node: Node, nodes: Mapping[str, Node]) -> bool:
    """Whether a may-alias operator (``to``, ``contiguous``: schema result ``Tensor(a)``) made a
    new tensor here: its ``val`` has another dtype or device than its input's (``x.to(float64)``
    of a float32 ``x`` is a copy; of a float64 ``x``, ``x`` itself)."""
    source = node.args[0]
    arg = nodes.get(source.name) if type(source) is Ref else None
    before = arg.meta.get("val") if arg is not None else None
    after = node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    return before.dtype != after.dtype or before.device != after.device


_RESULT_ALIASES: WeakMemo[Traced, tuple] = WeakMemo(_result_aliases)


# --- preserved calls ----------------------------------------------------------------------------


def barrier_guard(
    view: GraphView, nodes: Collection[str], preserved: Collection[str],
    renamed: Collection[str] = (), boundary: Collection[str] = (),
) -> bool:
    """Whether a match stays inside one chain of preserved calls.

    Parameters:
        view: the graph before the match is taken (a flat program's root graph).
        nodes: every node the match removes (pattern nodes and ``Binding.absorbed``).
        preserved: the program's preserved call names (``Program.call_signatures`` keys but
            ``""``, e.g. ``"blocks.0"``, ``"blocks.0@1"``).
        renamed: the match's results whose value will be read under another name (the
            replacement returns an input): they must not be named in a preserved signature.
        boundary: the value names that preserved call signatures name.

    Returns ``True`` when every node in ``nodes`` runs in the same chain of preserved calls
    (read from its ``nn_module_stack`` frames whose ``call_name`` is in ``preserved``; a node
    without a stack runs in none) and no name in ``renamed`` is in ``boundary``; always ``True``
    when ``preserved`` is empty.

    **Laws:** pure; a match it lets through computes no value on one side of a preserved
    call's boundary that is read on the other, so ``transform`` outlines every preserved call
    of the rewritten program as before. Complexity: O(len(nodes) · stack depth).
    """
    if not preserved:
        return True
    if any(r in boundary for r in renamed):
        return False
    chains = {_chain(view.node[n], preserved) for n in nodes if n in view.node}
    return len(chains) <= 1


def _chain(node: Node, preserved: Collection[str]) -> tuple[str, ...]:
    frames = node.module_frames
    if frames is NO_STACK or frames is None:
        return ()
    return tuple(f.call_name for f in frames if f.call_name in preserved)


# --- dtypes and shapes --------------------------------------------------------------------------


def dtype_guard(old: Sequence[Any], new: Sequence[Any]) -> bool:
    """Whether each new value has the dtype and shape of the result it replaces.

    ``old[i]`` is the replaced result's ``meta['val']``, ``new[i]`` the ``meta['val']`` of the
    value taking its place; ``None`` on either side is unknown and passes. Fake tensors (or
    tuples/lists of them) compare by dtype and rank, and by each size where both sizes are
    plain ints (a symbolic size is not compared); other values by type.

    **Laws:** pure; ``dtype_guard(v, v)`` holds. Complexity: O(results · rank).
    """
    return all(_same_meta(o, n) for o, n in zip(old, new))


def _same_meta(old: Any, new: Any) -> bool:
    if old is None or new is None:
        return True
    if isinstance(old, (tuple, list)) or isinstance(new, (tuple, list)):
        if not (isinstance(old, (tuple, list)) and isinstance(new, (tuple, list))):
            return False
        return len(old) == len(new) and all(_same_meta(a, b) for a, b in zip(old, new))
    if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return False
        if old.dtype != new.dtype or old.dim() != new.dim():
            return False
        return all(
            a == b for a, b in zip(old.shape, new.shape) if type(a) is int and type(b) is int
        )
    return type(old) is type(new)


# --- layouts ------------------------------------------------------------------------------------


def layout_guard(
    view: GraphView, result: str, old: Any, new: Any, inside: Collection[str] = ()
) -> bool:
    """Whether the value ``new`` may take the place of result ``result`` (whose value was
    ``old``; both ``meta['val']``) though its strides may differ: ``follow_layout`` down the
    graph's readers (``inside``: the match's nodes, not readers), unknowns no difference, a
    reader whose sharing flipped followed too. Also ``False`` where a reader of a value of
    other strides writes in place, is a ``call_module`` or a higher-order op; or, a sharing
    flipped, where two values of the group are returned, or one is written (or given to a
    ``call_module``) while one has a second reader. Returning other strides is allowed (the
    caller sees the same values). **Laws:** pure (fake values only); ``True`` where the
    strides are equal or unknown (``layout_guard(view, r, v, v)``); ``False`` whenever a
    reader of the result could raise, or alias its input differently, at the new strides.
    Complexity: O(readers followed), at most ``LAYOUT_CAP`` fake operator runs.
    """
    if same_strides(old, new, unknown=True):
        return True
    returned, writes = 0, False

    def val(name: str) -> Any:
        node = view.node.get(name)
        return node.meta.get("val") if node is not None else None

    def rerun(node: Node, vals: Mapping[str, Any]) -> Any:
        return fake_run(node.target, node.args, node.kwargs,
                        lambda n: vals[n] if n in vals else val(n), method=node.op == CALL_METHOD)

    def readers(v: str, restrided: bool, vals: Mapping[str, Any]) -> Iterator[tuple | None]:
        nonlocal returned, writes
        for u in view.users.get(v, ()):
            node = None if u in inside or u in vals else view.node.get(u)
            if node is None:
                continue
            if node.op == OUTPUT:
                returned += 1
            elif node.op not in (CALL_FUNCTION, CALL_METHOD) or written_args(node):
                if restrided:
                    yield None  # it may depend on the new strides: refused, never resumed
                writes = True  # sees its old strides: only what it writes where matters
            else:
                first = node.args[0] if node.args else None
                yield node, node.target, u, first.name if type(first) is Ref else None

    walked = follow_layout(result, new, readers, rerun, val,
                           strides=partial(same_strides, unknown=True),
                           sharing=partial(same_sharing, unknown=True))
    if walked is None:
        return False
    vals, flipped = walked
    # a reader that was a copy is now a view (or the reverse): which values share memory
    # changed, seen only where the group is returned twice, or written while read elsewhere
    return not flipped or (returned <= 1 and not (writes and any(
        sum(u not in inside for u in view.users.get(v, ())) > 1 for v in vals)))


LAYOUT_CAP = 64  #: readers followed from one value with other strides, at most (both drivers)


def follow_layout(start: Hashable, new: Any, readers: Callable[..., Iterable[tuple | None]],
                  rerun: Callable[..., Any], val: Callable[[Any], Any], *,
                  strides: Callable[..., bool | None], sharing: Callable[..., bool],
                  follow_flips: bool = True) -> tuple[dict, set] | None:
    """The one layout walk of both drivers (``layout_guard``, ``EClassView.restride``): value
    ``start`` takes the value ``new`` of other strides. Each reader is run again with the new
    values in; where its result has its old strides the difference stops there (``mm``, a
    reduction); where not, its readers are followed (``(r + 1).view(-1)`` fails as
    ``r.view(-1)`` does; a ``view`` refuses only where it raises).

    Hooks: ``readers(v, restrided, vals)`` yields ``v``'s readers as ``(reader, target, owner,
    source)`` (what ``rerun`` runs, its operator, the value it makes, the value whose memory
    it may share, compared where in ``vals``), ``None`` to refuse: the driver's own rules
    (outputs, writes, leaves); ``restrided``: whether ``v``'s strides differ (not where
    followed for a sharing flip); ``vals``: the new values so far. ``rerun(reader, vals)``:
    its new fake value (``fake_run``); ``val(v)``: the old one. ``strides``, ``sharing``: the
    driver's ``same_strides``, ``same_sharing`` (how it reads unknowns); ``follow_flips``:
    follow a reader of alike strides whose sharing flipped too.

    Returns ``(vals, flipped)``: the new value of each value followed (``start`` too) and the
    owners whose sharing with ``source`` flipped (``reshape``); ``None`` where ``readers``
    refuses, a reader reads strides (``ir.ops.reads_strides``), raises (``FakeRunFailed``),
    has no old or new value or strides beyond compare, or past ``LAYOUT_CAP`` readers run.
    **Laws:** pure where the hooks are. Complexity: O(readers followed), at most
    ``LAYOUT_CAP`` fake operator runs.
    """
    vals, flipped = {start: new}, set()
    todo = [(start, True)]  # (value, whether its strides differ from before)
    followed = 0
    while todo:
        v, restrided = todo.pop()
        for step in readers(v, restrided, vals):
            if step is None:
                return None
            reader, target, owner, source = step
            followed += 1
            if ops.reads_strides(target) or followed > LAYOUT_CAP:
                return None
            try:
                after = rerun(reader, vals)
            except kn.FakeRunFailed:
                return None  # raised at the new strides (a view they admit not)
            before = val(owner)
            alike = None if before is None or after is None else strides(before, after)
            if alike is None:
                return None
            shared = source not in vals or sharing(before, val(source), after, vals[source])
            if not shared:
                flipped.add(owner)
            if (alike and (shared or not follow_flips)) or owner in vals:
                continue
            vals[owner] = after
            todo.append((owner, not alike))
    return vals, flipped


def same_strides(a: Any, b: Any, *, unknown: bool | None = None,
                 single: bool = False) -> bool | None:
    """Whether fake values ``a`` and ``b`` are laid out alike: ``True`` where their strides
    are equal, ``False`` where they differ, ``unknown`` where there is nothing to compare (not
    both tensors; another shape, dtype or device; strides unreadable or symbolic; sequences of
    other lengths). Lists and tuples are compared item by item (``split``'s value, read by
    ``getitem``): ``None`` where an item is, else whether all are alike. The one layout
    comparison of both drivers' layout guards: ``rewrite``'s passes ``unknown=True`` (nothing
    to compare is no difference), ``saturate``'s keeps ``None`` (such a value may not join a
    class) and ``single=True`` (a tensor of at most one element is laid out like any other
    of its shape). **Laws:** ``same_strides(v, v)`` is ``True`` for a tensor of plain
    strides; symmetric. O(items · rank)."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        if not (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))) or len(a) != len(b):
            return unknown
        got = [same_strides(x, y, unknown=unknown, single=single) for x, y in zip(a, b)]
        return None if None in got else all(got)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return unknown
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return unknown
    if single and a.numel() <= 1:
        return True
    try:
        sa, sb = tuple(a.stride()), tuple(b.stride())
    except Exception:  # noqa: BLE001 - a layout without strides
        return unknown
    if not all(type(d) is int for d in (*sa, *sb)):
        return unknown
    return sa == sb


def same_sharing(before: Any, before_in: Any, after: Any, after_in: Any, *,
                 unknown: bool = False) -> bool:
    """Whether a reader's value shares memory with what it reads (``shares_storage``) at the
    new layout (``after`` of ``after_in``) as it did at the old (``before`` of
    ``before_in``): ``reshape`` is a view of a contiguous value and a copy of a strided one.
    ``False`` where one side is known and the other not; ``unknown`` where neither is
    (``rewrite``'s layout guard: ``True``; ``saturate``'s: ``False``). O(1)."""
    was, now = shares_storage(before, before_in), shares_storage(after, after_in)
    if was is None and now is None:
        return unknown
    return was is not None and was == now


def fake_run(target: Any, args: Any, kwargs: Any,
             val_of: Mapping[str, Any] | Callable[[str], Any], memo: FakeMemo | None = None, *,
             method: bool = False) -> Any:
    """``target`` run on the fake values of its arguments, ``val_of`` (a mapping, or a function
    of the name) for each ``Ref``: the one fake run of both drivers' guards and instances
    (``ir.fake_run.fake_value``, fake modes only, no ``meta`` runs; its contract: ``None`` where
    an argument has no fake value or no fake mode is found, ``FakeRunFailed``, the one failure
    type, where the operator raises). ``method``: ``target`` is a method name. ``memo``: the
    driver's ``ir.fake_memo.FakeMemo`` (one greedy run, one search): a fresh operator at
    metadata seen before is not run again, and a failure there is raised again. O(arguments)
    plus, unless kept, the operator's fake run."""
    read = val_of.get if isinstance(val_of, Mapping) else val_of
    run = kn.fake_value if memo is None else memo.value
    return run(target, args, kwargs, lambda r: read(r.name), method=method, meta=False)


# --- what a match shares with its inputs ---------------------------------------------------------


def shares_storage(a: Any, b: Any) -> bool | None:
    """Whether fake values ``a`` and ``b`` (``meta['val']``) share memory, read from their
    storages (``ir.torch_seam.storage_identity``: a view's fake value shares its base's
    storage; a copy's does not); ``None`` when either is unknown or not a tensor. The static
    question, on the values a rewrite sees; what a run shows is ``ir.harness.shares_storage``.
    O(1)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None
    try:
        return storage_identity(a) == storage_identity(b)
    except Exception:  # noqa: BLE001 - a tensor without a storage (sparse, nested)
        return None


# --- the table ----------------------------------------------------------------------------------

MATCH, PLAN, REPLACEMENT, INSTANCE = 0, 1, 2, 3
"""The stages of a match, in the order the engine reaches them: ``MATCH`` (a binding),
``PLAN`` (the nodes it removes and where the new ones go), ``REPLACEMENT`` (the replacement to
instantiate, its renamed results and new aliases), ``INSTANCE`` (the new nodes and their
values). A guard reads only what its stage and the earlier ones know."""


@attrs.define(slots=True, eq=False)
class Site:
    """One match where it is, as the guards see it: the engine fills it stage by stage (a
    working record local to one match; the guards only read it).

    - ``view``: the graph before the match is taken (``GraphView``, plus ``written``: the values
      written in place; ``key``: each node's position; ``mutates_between(lo, hi)``;
      ``barriers``: the preserved calls (``calls``) and the names their signatures hold
      (``names``); ``per_match``: whether a replacement may be traced per match here);
    - ``rule``, ``compiled``: the rule and its ``Compiled`` at the graph's level;
    - ``binding``: the matcher's ``Binding``; ``exact``: it after ``sizes.recheck`` (``None``:
      the pattern re-traced at the match's shapes and dtypes does not match there);
    - PLAN: ``matched`` (nodes bound to the pattern's compute nodes), ``absorbed`` (nodes looked
      through), ``removed`` (both), ``outs`` (each result's node, ``None`` for a literal),
      ``inputs`` (the bound inputs), ``pos`` (where the new nodes go; ``None``: nowhere);
    - REPLACEMENT: ``untraceable`` (the error tracing the replacement at this match's
      scalars, shapes or dtypes raised; ``None`` when it traced), ``replacement`` (``None``:
      unknown at this match), ``renamed`` (results read
      under another name afterwards), ``aliases`` (``{result: outside value}`` made aliases by
      the replacement, ``None`` when it returns an input the match does not bind),
      ``shared`` (pairs of results the replacement makes views of one buffer it computes,
      fresh in the pattern: ``transforms.rewrite.result_sharing``);
    - INSTANCE: ``raised`` (a new node raised on the match's fake values), ``results`` (the
      graph name taking each result's place), ``old`` / ``new`` (their ``meta['val']``).
    """

    view: Any
    rule: Any
    compiled: Any
    binding: Any
    exact: Any = None
    matched: tuple[str, ...] = ()
    absorbed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    outs: tuple[str | None, ...] = ()
    inputs: tuple[str, ...] = ()
    pos: tuple | None = None
    untraceable: str | None = None
    replacement: Traced | None = None
    renamed: tuple[str, ...] = ()
    aliases: Mapping[str, str] | None = None
    shared: tuple[tuple[str, str], ...] = ()
    raised: bool = False
    results: tuple[str | None, ...] = ()
    old: tuple = ()
    new: tuple = ()


@attrs.frozen
class Guard:
    """One row of ``GUARDS``: ``name`` (the key in ``RewriteReport.skipped``), ``stage``
    (``MATCH`` .. ``INSTANCE``), ``holds(site) -> bool`` (a pure predicate: ``True`` when the
    match may be taken as far as this guard sees), and ``reason``, what a skip means."""

    name: str
    stage: int
    holds: Callable[[Site], bool]
    reason: str


def _interior_unread(s: Site) -> bool:
    rset = set(s.removed)
    out_set = {o for o in s.outs if o is not None}
    return not any(
        m not in out_set and any(u not in rset for u in s.view.users[m]) for m in s.removed
    )


def _inputs_unwritten(s: Site) -> bool:
    """No input of the match is written in place after it is made, as ``ir.effects`` defines
    written (``WorkingGraph.written_after``: through views and aliases, and inputs that may be
    one tensor; a write before the input exists is what it reads either way). Direct writes
    alone are not enough: a module graph's inputs may be one tensor, so ``y * 1 -> y`` before
    a write of ``z`` would read ``y`` after the write (``tests/test_rewrite_guards.py``)."""
    return not any(s.view.written_after(i) for i in s.inputs)


def _no_write_between(s: Site) -> bool:
    keys = [s.view.key[m] for m in s.removed]
    return not s.view.mutates_between(min(keys), max(keys))


def _where(s: Site) -> bool:
    if s.rule.where is None:
        return True
    match = match_value(s.rule, s.compiled.pattern, s.exact, s.view)
    return where_holds(s.rule, match, f"%{s.view.node[s.matched[-1]].name}")


def where_holds(rule: Any, match: Match, at: str) -> bool:
    """Whether ``rule.where`` holds of ``match`` (``True`` for a rule without one): the
    ``where`` guard of ``rewrite`` (``match_value``) and of ``saturate``
    (``ematch.ematch_value``). A ``where`` that raises is the rule's error: ``PassError``
    naming the rule, the error and ``at`` (where the match is: ``%node``, an e-class); a
    purefx error passes as it is. O(1) plus the ``where``."""
    if rule.where is None:
        return True
    try:
        return bool(rule.where(match))
    except PurefxError:
        raise
    except Exception as exc:
        raise PassError(
            f"rule {rule.name!r}: its where() raised {type(exc).__name__}: {exc} on a match "
            f"at {at}; make where() return a bool for every Match"
        ) from exc


def _barrier(s: Site) -> bool:
    b = s.view.barriers
    return barrier_guard(s.view, s.removed, b.calls, s.renamed, b.names)


def _layout(s: Site) -> bool:
    inside = frozenset(s.removed)
    pairs = [o for o, new in zip(s.outs, s.results) if o is not None and new]
    return all(layout_guard(s.view, o, a, b, inside) for o, a, b in zip(pairs, s.old, s.new))


GUARDS: tuple[Guard, ...] = (
    Guard("per_match", MATCH, lambda s: not s.compiled.concrete or s.view.per_match,
          "the replacement is traced per match's shapes, and several calls run this graph"),
    Guard("retrace", MATCH, lambda s: s.exact is not None,
          "the pattern re-traced at the match's shapes and dtypes does not match there, or "
          "computes other dtypes (a literal matched by value: x * 1 for x * 1.0 on ints)"),
    Guard("absorbed", PLAN, lambda s: all(a in s.view.node for a in s.absorbed),
          "a node the match looks through is gone"),
    Guard("pure", PLAN, lambda s: all(is_pure(s.view.node[m]) for m in s.matched),
          "a matched node writes in place, has an effect or is random, or calls an operator "
          "whose facts are unknown (ir.ops.unknown_facts says why; ir.ops.register_facts)"),
    Guard("interior", PLAN, _interior_unread,
          "a value inside the match (not a result) is read outside it"),
    Guard("input_written", PLAN, _inputs_unwritten,
          "an input of the match is written in place after it is made (directly, through a "
          "view or alias, or as an input that may be the same tensor)"),
    Guard("write_between", PLAN, _no_write_between,
          "a write in place lies between the matched nodes"),
    Guard("placement", PLAN, lambda s: s.pos is not None,
          "no position has every input before it and every outside reader after it"),
    Guard("where", PLAN, _where, "the rule's where() is false at this match"),
    Guard("replacement_untraceable", REPLACEMENT, lambda s: s.untraceable is None,
          "the replacement cannot be traced at this match's scalars, shapes or dtypes (it "
          "raises there: a division by a matched scale of 0.0)"),
    Guard("replacement", REPLACEMENT, lambda s: s.replacement is not None,
          "the replacement cannot be traced here (a shape or dtype unknown or symbolic)"),
    Guard("barrier", REPLACEMENT, _barrier,
          "the match crosses a preserved call's boundary, or renames a value its signature "
          "names"),
    Guard("alias_unbound", REPLACEMENT, lambda s: s.aliases is not None,
          "the replacement returns an input the match binds to no value"),
    Guard("alias", REPLACEMENT, lambda s: not s.aliases or alias_guard(s.view, s.aliases),
          "a fresh result made an alias of an input or state value that a write or the caller "
          "can reach"),
    Guard("shared", REPLACEMENT, lambda s: sharing_guard(s.view, s.shared),
          "results the replacement makes views of one buffer (fresh in the pattern) are "
          "written in place, or both returned"),
    Guard("runs", INSTANCE, lambda s: not s.raised,
          "a replacement node raises on the match's fake values (a shape it does not allow)"),
    Guard("dtype", INSTANCE, lambda s: dtype_guard(s.old, s.new),
          "a value taking a result's place has another dtype or shape"),
    Guard("layout", INSTANCE, _layout,
          "a value taking a result's place has other strides, and a reader depends on them"),
)
"""The guards, in the order they run: a match is taken only when every row holds, and the
first row that does not is the one ``RewriteReport.skipped`` counts. Rows run stage by stage
(the engine computes a stage's facts only once the earlier rows hold); a test may run the
engine with a row removed (``without``) to show that the row is needed."""


_SHIPPED = GUARDS


def without(*names: str) -> tuple[Guard, ...]:
    """The shipped ``GUARDS`` less the rows named (for tests:
    ``monkeypatch.setattr(guards, "GUARDS", guards.without("layout"))``); ``ValueError`` naming
    the known rows for an unknown name."""
    known = [g.name for g in _SHIPPED]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"guards.without: unknown guard(s) {unknown}; the guards are {known}")
    return tuple(g for g in _SHIPPED if g.name not in names)


def match_value(rule: Any, pattern: Any, b: Any, view: GraphView) -> Any:
    """The ``Match`` a rule's ``where`` sees for binding ``b`` in ``view``. O(pattern)."""
    nodes = {k: view.node[b.names[k]] for k in pattern.nodes if k in b.names}
    trace_inputs = dict(zip(pattern.tensor_args, pattern.input_order))
    inputs = []
    for i, x in enumerate(rule.example_inputs):
        if i in trace_inputs:
            bound = b.names.get(trace_inputs[i])
            inputs.append(view.node[bound] if bound is not None else None)
        else:
            inputs.append(b.scalars.get(i, x))
    return Match(rule.name, MappingProxyType(nodes), tuple(inputs))


__all__ = [
    "GUARDS",
    "INSTANCE",
    "LAYOUT_CAP",
    "MATCH",
    "PLAN",
    "REPLACEMENT",
    "GraphView",
    "Guard",
    "MemoryView",
    "OnGraph",
    "Site",
    "alias_guard",
    "barrier_guard",
    "dtype_guard",
    "fake_run",
    "follow_layout",
    "layout_guard",
    "match_value",
    "result_aliases",
    "same_sharing",
    "same_strides",
    "shares_storage",
    "sharing_guard",
    "where_holds",
    "without",
]
