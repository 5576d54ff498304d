"""Extraction: one e-node per needed e-class, the chosen program costed as a DAG.

``greedy`` chooses, bottom up, the e-node of least *tree* cost in each class (egg's
extractor): its own cost plus its children's best. A worklist in cost order settles each class
once (O(e-nodes log e-nodes), however merges have ordered the class ids); a class only takes an
e-node whose children settled before it, so the choice is acyclic. Every e-node costs at least
``EPSILON``. Tree costs count a shared value once per reader, so they double with each block of
a program that reads a value twice: they are summed exactly, as integers (``_exact``: each
e-node's float cost in units of 2^-80 µs), so that two e-nodes of one class, which share the
doubled cost of what they read, are still told apart by their own costs 1,250 blocks deep
(in floats the totals lost the difference past about 50 such blocks, and a cap at ``CAP`` then
kept the original nodes: a program of many blocks did not reach what one block reaches). An
e-node's own cost is capped at ``CAP``. ``complete``
checks a choice (every class reached has one, no cycle) before it is built.
``dag_cost`` costs a choice as the program it builds: each chosen class once, however many
readers share it. ``exact`` solves the extraction as an integer program (DAG cost, acyclicity
by class order variables) where ``scipy`` (``scipy.optimize.milp``) is installed, the optional
extra ``search``; without it it returns ``None``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Mapping

from transforms.rewrite.egraph import LEAF, EGraph, ENode, reachable, walk_classes

__all__ = ["CAP", "EPSILON", "GROUPS_MAX", "complete", "dag_cost", "exact", "greedy", "together"]

EPSILON = 1e-6  #: the least cost of an e-node (keeps the greedy choice acyclic)
CAP = 1e300  #: an e-node's own cost stops growing here (an infinite cost is counted as CAP)
GROUPS_MAX = 256  #: groups of results tried together by ``together``, at most
_INF = float("inf")

Choice = dict[int, ENode]


def greedy(eg: EGraph, roots: Iterable[int], cost: Callable[[ENode], float],
           prefer: Mapping[int, ENode] | None = None) -> Choice:
    """The e-node of least tree cost in each class reachable from ``roots``.

    ``cost(enode)``: its own cost (a leaf's is 0), called at most once per distinct e-node
    (not for one whose children can never all be built).
    ``prefer``: class -> e-node kept on a tie (the original program's node, so that nothing
    changes where nothing is cheaper): another e-node replaces it only where it is cheaper by
    more than a relative 1e-12.

    Tree costs are summed exactly (integers, ``_exact``), however deep the sharing makes them.
    A worklist in cost order (Knuth's generalisation of Dijkstra to "superior" functions: a
    tree cost is never below any child's). An index from each class to the e-nodes that read
    it is built once; an e-node is costed once, when the last of its child classes is
    *settled*; a class is settled when it leaves the heap (keyed by cost, then class id) at
    its least cost, and is never revisited. So the order of class ids (merges leave them out
    of dependency order) does not matter, and the choice is acyclic: a class only ever takes
    an e-node whose children were settled before it, even where costs reach ``CAP``.

    **Laws:** the choice is acyclic and defined on every class reachable from ``roots``
    through chosen e-nodes (a class none of whose e-nodes can be built from leaves has
    none); each class's choice is of least tree cost up to the relative 1e-12 (ties: the
    ``prefer`` e-node, else the one costed first); an e-node of NaN cost is never chosen.
    Complexity: O(e-nodes log e-nodes) plus one ``cost`` call per distinct e-node."""
    live = sorted(reachable(eg, roots))
    prefer = prefer or {}
    find = eg.find
    own: dict[tuple, float] = {}
    nodes: list[ENode] = []  # the live e-nodes, each class's kept one first
    owner: list[int] = []  # the class of each
    waiting: list[int] = []  # its child classes not settled yet
    readers: dict[int, list[int]] = {}  # class -> the e-nodes (indices) reading it
    kept_at: dict[int, int] = {}  # class -> index of its ``prefer`` e-node
    ready: list[int] = []  # e-nodes of no children
    for c in live:
        members = eg.classes[c]
        kept = prefer.get(c)
        if kept is not None:
            kept = eg.canonical(kept)
            kept_at[c] = len(nodes)
            members = [kept, *[n for n in members if n.key != kept.key]]
        for n in members:
            i = len(nodes)
            kids = {find(ch) for ch in n.children}
            nodes.append(n)
            owner.append(c)
            waiting.append(len(kids))
            for k in kids:
                readers.setdefault(k, []).append(i)
            if not kids:
                ready.append(i)

    best: dict[int, int] = {}
    choice: Choice = {}
    settled: set[int] = set()
    heap: list[tuple[int, int]] = []
    nan: set[tuple] = set()

    def offer(i: int) -> None:
        """Cost e-node ``i`` (its children all settled) and keep it where it is better."""
        c = owner[i]
        if c in settled:
            return
        n = nodes[i]
        total = own.get(n.key)
        if total is None:
            if n.key in nan:
                return
            mine = max(cost(n), 0.0)
            if math.isnan(mine):
                nan.add(n.key)
                return  # a cost of NaN: never chosen (no order to settle it in)
            total = own[n.key] = _exact(min(mine, CAP) + EPSILON)
        for ch in n.children:
            total += best[find(ch)]
        old = best.get(c)
        if old is not None:
            if kept_at.get(c) == i:
                if _cheaper(old, total):
                    return  # another is cheaper than the kept one by more than the margin
            elif not _cheaper(total, old):
                return
        best[c] = total
        choice[c] = n
        heapq.heappush(heap, (total, c))

    for i in ready:
        offer(i)
    while heap:
        total, c = heapq.heappop(heap)
        if c in settled or best[c] != total:
            continue  # stale: its class has a newer cost since
        settled.add(c)
        for i in readers.get(c, ()):
            waiting[i] -= 1
            if not waiting[i]:
                offer(i)
    return choice


_SCALE_BITS = 80  #: tree costs are integers in units of 2^-80 µs
_MARGIN = 10**12  #: a tie is closer than 1 / _MARGIN of the dearer cost ...
_MARGIN_BASE = 10**9 << _SCALE_BITS  #: ... counted up to 1e9 µs (past it, 1e-3 µs)


def _cheaper(a: int, b: int) -> bool:
    """Whether tree cost ``a`` is below ``b`` by more than the margin: a relative 1e-12 of
    ``b``, but at most 1e-3 µs, so that a total doubled by sharing (``greedy``) does not
    swallow the difference between two e-nodes of one class. O(size of the integers)."""
    return (b - a) * _MARGIN > min(b, _MARGIN_BASE)


def _exact(x: float) -> int:
    """``x`` (finite, non-negative) in units of 2^-80, exactly where it is a multiple of
    them (every float from 2^-28 up), else rounded down. O(1)."""
    num, den = x.as_integer_ratio()
    return (num << _SCALE_BITS) // den


def together(eg: EGraph, roots: Iterable[int], choice: Choice,
             cost: Callable[[ENode], float],
             groups: Iterable[tuple[tuple[int, ENode], ...]],
             deadline: float | None = None) -> Choice:
    """``choice`` with each group of e-nodes chosen together where that lowers its DAG cost.

    A rule of several results (``x @ w1, x @ w2 -> split(x @ cat(w1, w2))``) puts one e-node
    per result (``getitem`` of one shared ``split``) into each matched class: ``groups``, one
    tuple of ``(class, e-node)`` per rewrite (``EGraph.groups``). The tree cost of ``greedy``
    counts the shared part once per result, so it never finds such a rewrite cheaper where
    only sharing makes it so (one fused matmul against two). Here each group (the first
    ``GROUPS_MAX``) is tried: its classes take its e-nodes at once, and the choice is kept
    where it is acyclic (``complete``) and of lower ``dag_cost``; the classes below the group
    keep their own choice. A group whose result is a value another group made (the fused
    ``x @ cat(w1, w2)`` fused again with ``x @ w3``) is tried with that group, recursively.
    A local improvement, not an optimum (``exact`` is one). ``deadline`` (a
    ``time.monotonic`` value): no group is tried once it has passed (the choice so far is
    kept; ``extracted.plan`` reports the cut).

    **Laws:** the result is ``choice`` itself when no group lowers the cost; never of higher
    DAG cost than ``choice``; acyclic where ``choice`` is. Complexity: O(groups tried x
    classes reached), groups at most ``GROUPS_MAX`` (about 65 ms a group at 16k classes:
    all 256 take longer than the default ``limits.seconds``, hence the deadline)."""
    roots = list(roots)
    groups = list(groups)[:GROUPS_MAX]
    made_by = _made_by(eg, groups)
    best = choice
    best_cost: float | None = None
    for group in groups:
        if deadline is not None and time.monotonic() > deadline:
            break
        trial = dict(best)
        changed = False
        for c, n in _with_makers(eg, group, made_by):
            c = eg.find(c)
            n = eg.canonical(n)
            if c not in trial:
                break
            if eg.canonical(trial[c]).key != n.key:
                trial[c] = n
                changed = True
        else:
            if not changed or not complete(eg, roots, trial):
                continue
            if best_cost is None:
                best_cost = dag_cost(eg, roots, best, cost)
            got = dag_cost(eg, roots, trial, cost)
            if got < best_cost * (1 - 1e-9):
                best, best_cost = trial, got
    return best


def _made_by(eg: EGraph, groups: list) -> dict[int, tuple]:
    """For each class a group's results are projections of (the fused ``x @ cat(w1, w2)``
    under ``getitem(split(.), i)``: the first child of each e-node of the class the
    ``getitem`` s read), the first group that made it. O(groups x e-nodes of those classes)."""
    made: dict[int, tuple] = {}
    for group in groups:
        if not group or not group[0][1].children:
            continue
        for n in eg.classes.get(eg.find(group[0][1].children[0]), ()):
            if n.children:
                made.setdefault(eg.find(n.children[0]), group)
    return made


def _with_makers(eg: EGraph, group: tuple, made_by: Mapping[int, tuple]) -> list:
    """``group`` and, for each of its classes that another group made (a fused value fused
    again: ``((a, b), c)``), that group too, recursively: the pair's value pays only where
    ``a`` and ``b`` read it. O(groups followed)."""
    out: list = []
    todo, seen = [group], set()
    while todo:
        g = todo.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        out.extend(g)
        for c, _ in g:
            maker = made_by.get(eg.find(c))
            if maker is not None:
                todo.append(maker)
    return out


def complete(eg: EGraph, roots: Iterable[int], choice: Mapping[int, ENode]) -> bool:
    """Whether ``choice`` gives an e-node to every class reached from ``roots`` through chosen
    e-nodes, without a cycle. O(classes reached)."""
    state: dict[int, int] = {}  # 1: on the path, 2: done
    for r in roots:
        stack = [(eg.find(r), False)]
        while stack:
            c, leaving = stack.pop()
            if leaving:
                state[c] = 2
                continue
            if state.get(c) == 2:
                continue
            if state.get(c) == 1:
                return False
            n = choice.get(c)
            if n is None:
                return False
            state[c] = 1
            stack.append((c, True))
            for ch in n.children:
                ch = eg.find(ch)
                if state.get(ch) == 1:
                    return False
                if state.get(ch) != 2:
                    stack.append((ch, False))
    return True


def dag_cost(eg: EGraph, roots: Iterable[int], choice: Mapping[int, ENode],
             cost: Callable[[ENode], float],
             reads: Mapping[int, Iterable[int]] | None = None) -> float:
    """The cost of the program ``choice`` builds: each class reachable from ``roots`` through
    chosen e-nodes counted once. ``reads`` (a leaf's class -> the classes its node reads, for
    leaves that are computed only where read: see ``exact``): a leaf reached reaches those
    too. O(classes reached)."""
    reads = reads or {}

    def step(c: int) -> Iterable[int]:
        n = choice[c]
        return n.children if n.op != LEAF else (*reads.get(c, ()), *n.children)

    total = 0.0
    for c in walk_classes(eg, roots, step):
        if choice[c].op != LEAF:
            total += cost(choice[c])
    return total


def exact(eg: EGraph, roots: Iterable[int], cost: Callable[[ENode], float],
          seconds: float = 10.0,
          reads: Mapping[int, Iterable[int]] | None = None) -> Choice | None:
    """The choice of least DAG cost, by an integer program, or ``None`` when ``scipy`` is not
    installed (``pip install purefx[search]``), a cost is not finite (infinite or NaN: the
    greedy choice stands), the solver finds no answer in ``seconds`` (building the program
    counts), or it fails.

    Variables: ``x_n`` (e-node ``n`` chosen), ``t_c`` (class ``c``'s place in a topological
    order, in ``[0, classes - 1]``). Each root class chooses a node; a chosen node's child
    classes choose one; a chosen node's class comes after its children
    (``t_c - t_d >= 1 - classes (1 - x_n)``), so the answer is acyclic. Minimises the sum of
    the chosen nodes' costs plus ``EPSILON`` each: a shared class (the ``split`` that the
    ``getitem`` s of a rewrite of several results read) counts once. ``reads``: a leaf's class
    -> the classes its node reads, for leaves computed only where read (a metadata check the
    build drops with its value): such a leaf's class counts as a node with those children.
    An e-node of NaN cost is never chosen; an infinite (or above ``CAP``) cost gives ``None``
    (no finite objective).

    **Laws:** where a choice is returned it is ``complete`` (every class reached from
    ``roots`` through it has an e-node, no cycle) and closed under ``reads``; its
    ``dag_cost`` is the least over all such choices, up to the solver's gap (``seconds``
    cut: the best found so far). Complexity: building O(e-nodes + edges); the solve is
    NP-hard in general, bounded by ``seconds``."""
    start = time.monotonic()
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
    except ImportError:
        return None
    reads = reads or {}
    roots = [eg.find(r) for r in roots]
    live = sorted(reachable(eg, [*roots, *(eg.find(x) for v in reads.values() for x in v)]))
    index = {c: i for i, c in enumerate(live)}
    nodes = [(c, n) for c in live for n in eg.classes[c]]
    nx, nc = len(nodes), len(live)
    by_class: dict[int, list[int]] = {}
    for j, (c, _) in enumerate(nodes):
        by_class.setdefault(c, []).append(j)
    obj = np.zeros(nx + nc)
    upper = np.ones(nx + nc)
    upper[nx:] = max(nc - 1, 0)
    for j, (_, n) in enumerate(nodes):
        if n.op == LEAF:
            continue
        own = cost(n)
        if math.isnan(own):
            upper[j] = 0.0  # never chosen, as in greedy
            continue
        if not own < CAP:
            return None
        obj[j] = max(own, 0.0) + EPSILON
    ri: list[int] = []  # row, column, value of each nonzero
    ci: list[int] = []
    vi: list[float] = []
    lo: list[float] = []

    def row(entries: Iterable[tuple[int, float]], low: float) -> None:
        r = len(lo)
        for k, v in entries:
            ri.append(r)
            ci.append(k)
            vi.append(v)
        lo.append(low)

    for r in dict.fromkeys(roots):
        row(((j, 1.0) for j in by_class[r]), 1.0)
    big = float(nc)
    for j, (c, n) in enumerate(nodes):
        kids = {eg.find(x) for x in n.children}
        if n.op == LEAF:
            kids |= {eg.find(x) for x in reads.get(c, ())}
        if c in kids:
            upper[j] = 0.0  # an e-node reading its own class: a cycle
            continue
        for ch in kids:
            row([*((k, 1.0) for k in by_class[ch]), (j, -1.0)], 0.0)  # x_j -> ch chosen
            # t_c - t_ch - big * x_j >= 1 - big
            row([(nx + index[c], 1.0), (nx + index[ch], -1.0), (j, -big)], 1.0 - big)
    left = seconds - (time.monotonic() - start)
    if left <= 0:
        return None
    integrality = np.zeros(nx + nc)
    integrality[:nx] = 1
    try:
        a = coo_matrix((vi, (ri, ci)), shape=(len(lo), nx + nc)).tocsr()
        res = milp(obj, constraints=[LinearConstraint(a, np.array(lo), np.inf)],
                   integrality=integrality, bounds=Bounds(np.zeros(nx + nc), upper),
                   options={"time_limit": left})
    except (ValueError, ArithmeticError):
        return None
    if res.x is None:
        return None
    choice: Choice = {}
    for j, (c, n) in enumerate(nodes):
        if res.x[j] > 0.5 and c not in choice:
            choice[c] = n
    return choice if complete(eg, roots, choice) else None
