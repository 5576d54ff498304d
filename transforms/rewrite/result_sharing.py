"""Results that a replacement makes share memory where the pattern's were fresh.

``x @ w1, x @ w2 -> split(x @ cat(w1, w2))`` returns two views of one buffer where the pattern
returned two fresh tensors. That is the same program as long as nothing writes either result
(or a view of it) and the caller does not get both: a write through one would show in the other.
``new_sharing`` finds such pairs for one match (the engine puts them in ``Site.shared``);
``guards.sharing_guard`` is the guard that takes the match only where that holds
(``transforms.rewrite.guards.GUARDS`` row ``shared``). What may write or return a value is
asked of one question, ``guards.MemoryView.reach``, which the working graph and the e-graph
both answer; ``base_pairs`` gives ``saturate`` the pairs to ask it of.
"""

from __future__ import annotations

from typing import Any

from ir.args import Ref
from ir.effects import view_base
from ir.memo import WeakMemo
from ir.node import PLACEHOLDER
from transforms.machinery.trace import Traced
from transforms.rewrite import guards


def output_bases(traced: Traced) -> tuple[str | None, ...]:
    """For each result of a traced function: the node it is, or is a view of through a chain
    of views (``ir.effects.view_base``); ``None`` for a literal result. O(nodes), once per
    traced function (``saturate`` asks it of a replacement at every match)."""
    return _OUTPUT_BASES(traced)


def _bases(traced: Traced) -> tuple[str | None, ...]:
    table = {n.name: n for n in traced.graph.nodes}
    out: list[str | None] = []
    for r in traced.outputs:
        out.append(view_base(r.name, table.get) if type(r) is Ref else None)
    return tuple(out)


def base_pairs(traced: Traced) -> frozenset[tuple[int, int]]:
    """The pairs ``(i, j)``, ``i < j``, of results of a traced function that are views of one
    value (the same ``output_bases`` entry, not a literal): ``split(x @ cat(w1, w2))``'s two
    halves. ``saturate`` asks it of the pattern and of the replacement: a pair in either may
    not both escape (``guards.sharing_guard`` on the e-graph), or the caller would see two
    outputs share memory where they did not, or stop sharing where they did.
    O(results²), once per traced function (a rule's pattern and replacement are asked at every
    match)."""
    return _BASE_PAIRS(traced)


def _pairs(traced: Traced) -> frozenset[tuple[int, int]]:
    bases = output_bases(traced)
    return frozenset((i, j) for i in range(len(bases)) for j in range(i + 1, len(bases))
                     if bases[i] is not None and bases[i] == bases[j])


_OUTPUT_BASES: WeakMemo[Traced, tuple[str | None, ...]] = WeakMemo(_bases)
_BASE_PAIRS: WeakMemo[Traced, frozenset[tuple[int, int]]] = WeakMemo(_pairs)


def new_sharing(site: Any, rep: Traced, view: Any) -> tuple[tuple[str, str], ...]:
    """The pairs of the match's results (graph names) that the replacement ``rep`` makes views
    of one value it computes, where the matched results did not share memory (read from their
    fake values, ``guards.shares_storage``; without values, from the pattern's own trace).
    Results made aliases of an *input* are the ``alias`` guard's. O(results²); O(1) for a
    replacement whose results share nothing."""
    made_shared = base_pairs(rep)
    if not made_shared:
        return ()
    rep_bases = output_bases(rep)
    rep_nodes = {n.name: n for n in rep.graph.nodes}
    in_pattern = base_pairs(site.compiled.traced)
    pairs = []
    outs = site.outs
    for i, j in sorted(made_shared):
        a, b = (outs[i], outs[j]) if j < len(outs) else (None, None)
        if a is None or b is None or a == b:
            continue
        base = rep_nodes.get(rep_bases[i])
        if base is None or base.op == PLACEHOLDER:
            continue  # an input returned twice: the alias guard's case
        shared = guards.shares_storage(view.node[a].meta.get("val"),
                                       view.node[b].meta.get("val"))
        if not (shared if shared is not None else (i, j) in in_pattern):
            pairs.append((a, b))
    return tuple(pairs)


__all__ = ["base_pairs", "new_sharing", "output_bases"]
