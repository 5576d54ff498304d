"""A pass's own targets, found from what it does: which operators (and argument forms) it
changes, so that ``check_laws`` can spend the rest of its budget on programs rich in them.

Nothing here reads a pass's name, source or identity: only its results on programs.

- :func:`changed_forms` compares a program with the pass's result (both without dead code):
  the *forms* (an operator with its non-tensor arguments, tensors written ``%``:
  ``aten.div.Tensor_mode(%, %, rounding_mode='floor')``) whose nodes the result has fewer of
  are what the pass rewrote; where it only added nodes, the forms of the nodes those read
  (what it inserted after).
- :func:`targets_from_changes` sums that over the programs a first phase changed.
- :func:`probe_table`, for a pass that changed none: every drawable row of the operator table
  (``ir.opset``), each distinct form of its samples once, called in small probe programs of
  :data:`PROBE_CALLS` calls each (a placeholder per tensor argument, a fake ``val`` per
  node); the pass is applied to each probe program, no law checked, and the rows whose forms
  it rewrote are its targets. About 25 programs for the whole table.

``Targets.operators`` are the row names ``ir.strategies.programs(ops=...)`` draws.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from ir.args import EMPTY_DICT, IDict, IList, Ref, iter_refs, ref
from ir.graph import Graph
from ir.module import PLAIN, Module
from ir.names import target_name
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node, frozen_meta
from ir.opset import TensorSpec, written_at
from ir.printer import contiguous_strides, format_arg
from ir.program import Program
from ir.signature import CallSignature, ExportSignature, InputSpec, OutputSpec
from ir.torch_seam import fake_failures_unlogged, new_fake_mode, pytree

__all__ = [
    "FIRST_SHARE",
    "PROBE_CALLS",
    "RARE",
    "Targets",
    "changed_forms",
    "first_phase",
    "probe_table",
    "report_note",
    "targeted_programs",
    "targets_from_changes",
]

FIRST_SHARE = 0.4
"""The share of ``check_laws``' examples drawn from the default programs before the targets
are looked for; the rest are drawn rich in the targets found."""

RARE = 5
"""A pass that changed fewer than one default program in ``RARE`` is told so (its report)."""

PROBE_CALLS = 32
"""Calls of table rows per probe program (:func:`probe_table`)."""

SHOWN = 6
"""At most this many forms are named in a report."""


def first_phase(total: int) -> int:
    """How many of ``total`` examples the first phase (default programs) draws: at least one,
    :data:`FIRST_SHARE` of them, rounded up. O(1)."""
    return max(1, min(total, math.ceil(total * FIRST_SHARE)))


@attrs.frozen
class Targets:
    """What a pass was found to change: ``forms`` (most changed first), ``operators`` (their
    operators that have a row in ``ir.opset.table()``, sorted: what ``programs(ops=)`` can
    draw), ``source`` (``"changed"``: from the programs it changed; ``"probe"``: from the
    table's probe programs; ``""``: nothing found) and ``probed`` (the probe's calls)."""

    forms: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    source: str = ""
    probed: int = 0

    def named(self) -> str:
        """The forms as a report names them (the first :data:`SHOWN`)."""
        shown = ", ".join(self.forms[:SHOWN])
        more = len(self.forms) - SHOWN
        return shown + (f" (and {more} more)" if more > 0 else "")


# --- forms --------------------------------------------------------------------------------------


def node_form(node: Node) -> str:
    """``node``'s form: its target with its arguments, each value it reads written ``%``
    (``aten.mul.Tensor(%, 0.0)``). O(size of its arguments)."""
    def skeleton(tree: Any) -> Any:
        if isinstance(tree, Ref):
            return _ANY
        if isinstance(tree, tuple):
            return tuple(skeleton(x) for x in tree)
        if isinstance(tree, IList):
            return IList(tuple(skeleton(x) for x in tree.items))
        return tree

    parts = [format_arg(skeleton(a)) for a in node.args]
    parts += [f"{k}={format_arg(skeleton(v))}" for k, v in node.kwargs.items]
    return f"{target_name(node.target)}({', '.join(parts)})".replace(_ANY_TEXT, "%")


class _Any:
    def __repr__(self) -> str:
        return _ANY_TEXT


_ANY_TEXT = "__purefx_any__"
_ANY = _Any()


def _calls(p: Program) -> Iterable[Node]:
    for _, mid in p.walk():
        for graph in p.module_table()[mid].graphs:
            yield from (n for n in graph.nodes if n.op == CALL_FUNCTION)


def changed_forms(before: Program, after: Program) -> collections.Counter:
    """The forms ``after`` rewrote of ``before`` (both taken without dead code, metadata
    checks included): each form with fewer nodes in ``after``, by how many; where none has
    fewer (the pass only added nodes), the forms of the nodes of ``before`` that the added
    nodes read. Empty when ``after`` is no Program. O(size of the programs)."""
    if not isinstance(after, Program):
        return collections.Counter()
    from transforms.passes.dce import eliminate_dead_code

    before = eliminate_dead_code(before, metadata_checks=False)
    after = eliminate_dead_code(after, metadata_checks=False)
    had = collections.Counter(node_form(n) for n in _calls(before))
    has = collections.Counter(node_form(n) for n in _calls(after))
    removed = had - has
    if removed:
        return removed
    added = has - had
    if not added:
        return collections.Counter()
    old = {n.name: n for n in _calls(before)}
    anchors: collections.Counter = collections.Counter()
    for n in _calls(after):
        if node_form(n) in added and n.name not in old:
            for r in iter_refs((n.args, n.kwargs)):
                if r.name in old:
                    anchors[node_form(old[r.name])] += 1
    return anchors


def _operator_of(form: str) -> str:
    return form.split("(", 1)[0]


def _targets(found: collections.Counter, source: str, probed: int = 0) -> Targets:
    if not found:
        return Targets(source="", probed=probed)
    from ir.opset import table

    forms = tuple(f for f, _ in sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))
    rows = table()
    operators = tuple(sorted({_operator_of(f) for f in forms} & rows.keys()))
    return Targets(forms, operators, source, probed)


def targets_from_changes(pairs: Iterable[tuple[Program, Any]]) -> Targets:
    """The forms the pass rewrote over ``(program, result)`` pairs (:func:`changed_forms`
    summed). O(size of the programs)."""
    found: collections.Counter = collections.Counter()
    for program, result in pairs:
        if result is not None and result is not program:
            found.update(changed_forms(program, result))
    return _targets(found, "changed")


# --- probing the table --------------------------------------------------------------------------


def probe_table(pass_fn: Callable[[Program], Program]) -> Targets:
    """The rows of the operator table whose forms ``pass_fn`` rewrites, found by applying it,
    with no law checked, to probe programs that call each drawable row once per distinct form
    of its samples (:func:`probe_calls`, :data:`PROBE_CALLS` a program). A probe program the
    pass returns no Program for tells nothing (it declined). One it raises on (an edit the
    editor refuses: a view's new shape reaching the probe's output) is split in halves and
    probed again, down to single calls: the forms it raises on alone are its targets too,
    since the laws judge a pass that raises; unless it raises on every probe program (a pass
    that raises on anything tells nothing of its targets). Deterministic: the programs depend
    on the table alone. Cost: about 25 programs built (a fake run per call) and one pass call
    on each, plus about ``2 log2(PROBE_CALLS)`` for each form raised on."""
    calls = probe_calls()
    found: collections.Counter = collections.Counter()
    raised: list[tuple] = []
    chunks = [calls[start:start + PROBE_CALLS] for start in range(0, len(calls), PROBE_CALLS)]
    for chunk in chunks:
        _, outcome = _probe(pass_fn, chunk)
        if outcome is _RAISED:
            raised.append(chunk)
        elif outcome is not None:
            found.update(outcome)
    if len(raised) < len(chunks):
        for chunk in raised:
            found.update(_raising_forms(pass_fn, chunk))
    return _targets(found, "probe", len(calls))


_RAISED = object()  # what ``_probe`` returns for a probe program the pass raised on


def _probe(pass_fn: Callable[[Program], Program], calls: tuple) -> tuple[Program | None, Any]:
    """The probe program of ``calls`` (None where no call of them runs) and what ``pass_fn``
    did to it: the forms it rewrote, None where there is no program or the pass returned none,
    ``_RAISED`` where it raised."""
    program = _probe_program(calls)
    if program is None:
        return None, None
    try:
        result = pass_fn(program)
    except Exception:  # noqa: BLE001 - a probe only looks; the laws judge raising
        return program, _RAISED
    return program, changed_forms(program, result)


def _raising_forms(pass_fn: Callable[[Program], Program], calls: tuple) -> collections.Counter:
    """The forms of the single calls of ``calls`` whose probe program ``pass_fn`` raises on,
    with what it rewrote in the others, found by halving ``calls`` (which it raised on); each
    probe program built once."""
    found: collections.Counter = collections.Counter()
    half = len(calls) // 2
    for part in (calls[:half], calls[half:]):
        program, outcome = _probe(pass_fn, part)
        if outcome is _RAISED and len(part) == 1:
            found.update(node_form(n) for n in _calls(program) if n.target is part[0][1])
        elif outcome is _RAISED:
            found.update(_raising_forms(pass_fn, part))
        elif outcome is not None:
            found.update(outcome)
    return found


@functools.cache
def probe_calls() -> tuple[tuple[str, Any, Any], ...]:
    """``(row name, overload, sample)`` for each drawable row of the table (training and core
    level, every feature's samples, no row that writes its arguments) and each distinct form
    of its samples (their non-tensor arguments and tensor dtype kinds), in table order.
    Memoized: it depends on the table alone."""
    from ir.strategies.opset_steps import ROW_FEATURES, opset_rows

    out = []
    seen_rows: set[str] = set()
    for on in (ROW_FEATURES - {"core_level"}, ROW_FEATURES):
        for row, op, samples in opset_rows(frozenset(on), None):
            if row.name in seen_rows:
                continue
            seen_rows.add(row.name)
            forms = set()
            for sample in samples:
                if written_at(row, sample.args):
                    continue
                key = _sample_form(sample)
                if key not in forms:
                    forms.add(key)
                    out.append((row.name, op, sample))
    return tuple(out)


def _sample_form(sample: Any) -> str:
    def one(a: Any) -> str:
        if isinstance(a, TensorSpec):
            return "f" if a.dtype.is_floating_point else "b" if a.dtype == torch.bool else "i"
        if isinstance(a, (tuple, list)):
            return "[" + ",".join(one(x) for x in a) + "]"
        return repr(a)

    return ";".join([one(a) for a in sample.args] + [f"{k}={one(v)}" for k, v in sample.kwargs])


def _probe_program(calls: Iterable[tuple[str, Any, Any]]) -> Program | None:
    """A flat program that calls each of ``calls`` once, each tensor argument a user input of
    the sample's spec (its ``val`` a fake tensor), every tensor result returned; a call whose
    fake run fails is left out. ``None`` when none is left."""
    from ir.strategies.opset_steps import fake_call, literal, result_tensors

    mode = new_fake_mode()
    vals: dict[str, Any] = {}
    inputs: list[Node] = []
    body: list[Node] = []
    returned: list[Ref] = []
    numbers = itertools.count()  # the placeholders' (a call left out skips its numbers)
    for k, (_, op, sample) in enumerate(calls):
        fresh: list[Node] = []

        def tensor(spec: TensorSpec, fresh: list[Node] = fresh) -> Ref:
            name = f"x{next(numbers)}"
            stride = tuple(spec.stride) if spec.stride is not None else contiguous_strides(
                tuple(spec.shape))
            with mode:
                val = torch.empty_strided(tuple(spec.shape), stride, dtype=spec.dtype)
            vals[name] = val
            fresh.append(Node(PLACEHOLDER, name, name, meta=frozen_meta({"val": val})))
            return ref(name)

        def argument(a: Any) -> Any:
            if isinstance(a, TensorSpec):
                return tensor(a)
            if isinstance(a, (tuple, list)) and a and all(isinstance(x, TensorSpec) for x in a):
                return IList(tuple(tensor(x) for x in a))
            return literal(a)

        args = tuple(argument(a) for a in sample.args)
        kwargs = IDict(tuple((key, argument(v)) for key, v in sample.kwargs))
        try:
            with fake_failures_unlogged():
                val = fake_call(mode, op, args, kwargs, lambda r: vals[r.name])
        except Exception:  # noqa: BLE001, S112 - no fake run: no probe of this form
            continue
        results = result_tensors(val)
        if not results:
            continue
        inputs += fresh
        name = f"{_identifier(str(op).split('.')[1])}_{k}"
        body.append(Node(CALL_FUNCTION, name, op, args, kwargs, meta=frozen_meta({"val": val})))
        for ix, t in results:
            if ix is None:
                returned.append(ref(name))
                continue
            item = f"{name}_{ix}"
            body.append(Node(CALL_FUNCTION, item, operator.getitem, (ref(name), ix), EMPTY_DICT,
                             meta=frozen_meta({"val": t})))
            returned.append(ref(item))
    if not returned:
        return None
    names = [n.name for n in inputs]
    out = Node(OUTPUT, "output", "output", (tuple(returned),))
    graph = Graph((*inputs, *body, out))
    leaf = pytree.treespec_leaf()
    signature = CallSignature(
        inputs=(), outputs=(),
        in_spec=pytree.TreeSpec(tuple, None, [pytree.TreeSpec(tuple, None, [leaf] * len(names)),
                                              pytree.TreeSpec(dict, [], [])]),
        out_spec=pytree.TreeSpec(tuple, None, [leaf] * len(returned)),
        forward_arg_names=tuple(names),
    )
    from pyrsistent import pmap

    return Program(
        root="",
        modules=pmap({"": Module("purefx.probe.Root", PLAIN, (), (graph,))}),
        signature=ExportSignature(
            tuple(InputSpec("user_input", n, None, None) for n in names),
            tuple(OutputSpec("user_output", r.name, None) for r in returned)),
        call_signatures=pmap({"": signature}),
    )


def _identifier(text: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in text).strip("_") or "op"
    return cleaned if not cleaned[0].isdigit() else f"op_{cleaned}"


def report_note(targets: Targets, tried: int, changed: int, rest: int) -> str:
    """What ``check_laws``' report says of the targets: that the pass changed fewer than one
    of the ``tried`` default programs in :data:`RARE` (``changed`` of them), the forms it
    changes (found from those, or by the probe when it changed none), and where the ``rest``
    of the budget went (``programs(ops=...)`` of their operators); ``""`` when there is
    nothing to say (it changed enough programs, in no form of its own, or nothing at all: the
    vacuous verdict says so). O(forms shown)."""
    rare = changed * RARE < tried
    if not targets.forms:
        if not changed or not rare:
            return ""
        return (f"it changed {changed} of the {tried} default programs, fewer than one in "
                f"{RARE} (in no operator's form of its own: only which values nodes read)")
    if targets.source == "probe":
        text = (f"it changed none of the {tried} default programs; probing the operator table, "
                f"it changes {targets.named()}")
    elif rare:
        text = (f"it changed {changed} of the {tried} default programs, fewer than one in "
                f"{RARE}: it changes {targets.named()}")
    else:
        text = f"it changes {targets.named()}"
    if rest and targets.operators:
        text += f"; {rest} more drawn with programs(ops=[{', '.join(targets.operators)}])"
    elif rest:
        text += f"; {rest} more default programs (no operator of the table among them)"
    return text


def targeted_programs(operators: tuple[str, ...]) -> Any:
    """The programs of ``check_laws``' second phase: ``programs(ops=operators)``, whose opset
    steps call only those rows, with the default features but ``core_level`` kept off where no
    row of them is of the core level (and on where none is of the training level), so every
    draw can call them (a ``training``-only row drawn under ``core_level`` would leave the
    opset steps nothing to call). O(len(operators))."""
    from ir.opset import table
    from ir.strategies.programs import FEATURES, OPT_IN_FEATURES, programs

    rows = table()
    levels: set[str] = set()
    for name in operators:
        levels |= rows[name].levels or {"core", "training"}
    allowed = set(FEATURES) - OPT_IN_FEATURES
    always = set()
    if "core" not in levels:
        allowed.discard("core_level")
    if "training" not in levels:
        always.add("core_level")
    return programs(features=allowed, always=always, ops=operators)
