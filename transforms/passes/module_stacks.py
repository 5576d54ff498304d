"""The passes that repair module stacks: ``fix_module_stacks`` (stacks that do not nest) and
``fill_call_gaps`` (one module call cut in two by nodes under a caller's stack).

A node's module stack lists the module calls it runs inside, outermost first (``Frame``,
``ir.module_stack``); reading it is ``transforms.machinery.frames``. Public at
``transforms.stacks``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from ir.graph import Graph
from ir.module import ModuleId
from ir.module_stack import NO_STACK, Frame
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.each_graph import with_root_graph
from transforms.machinery.frames import common_prefix, graph_frames, node_frames
from transforms.machinery.pass_checks import require_flat

__all__ = ["fill_call_gaps", "fix_module_stacks"]

log = logging.getLogger("purefx")


def _nesting_prefix(resolve: Callable[[str], ModuleId | None], items: tuple) -> int:
    """How many leading entries of a module stack nest, each inside the one before, and name a
    module (``resolve``: ``Program.resolve``'s answer).

    The entries that nest are found first; each of their paths is ``""`` or a dotted prefix of
    the last one, so when the last names a module they all do (one lookup, not one per entry).
    """
    keep = 1
    prev = items[0][1][0]
    for _, (path, _) in items[1:]:
        if prev != "" and not path.startswith(prev + "."):  # ``path`` is not inside ``prev``
            break
        keep += 1
        prev = path
    if keep == 1 or resolve(prev) is not None:
        return keep
    keep = 1  # some entry names no module: the first such one ends the stack
    for _, (path, _) in items[1:]:
        if resolve(path) is None:
            break
        keep += 1
    return keep


def _path_resolver(program: Program) -> Callable[[str], ModuleId | None]:
    """``program.resolve`` for many paths that share prefixes (the stacks of a graph): a path's
    answer is its parent path's and one child lookup, remembered, so each new path costs O(1)
    instead of O(its depth)."""
    table = program.module_table()
    root = program.root
    found: dict[str, ModuleId | None] = {}
    # each module's children by name, made here: most of these modules get new graphs (and so
    # new objects) when outlined, so a memo on them would be built for nothing
    kids: dict[ModuleId, dict[str, ModuleId]] = {}

    def parts(path: str) -> ModuleId | None:
        # ``path`` as ``Program.resolve`` splits it: a leading "." is a first part ""
        if path in found:
            return found[path]
        head, dot, name = path.rpartition(".")
        parent = parts(head) if dot else root
        named = kids.get(parent)
        if named is None and parent in table:
            named = kids[parent] = dict(table[parent].children)
        mid = found[path] = named.get(name) if named is not None else None
        return mid

    return lambda path: parts(path) if path else root


def fix_module_stacks(program: Program) -> Program:
    """Cut every root-graph module stack at its first entry that is not inside the one before.

    A call to a sibling of an ancestor leaves a stack such as ``[a, b]`` with ``b`` not inside
    ``a``; such entries and all after them are dropped (the node stays in ``a``) and a warning is
    logged on the ``purefx`` logger, as ``torch.export.unflatten`` does. So are entries whose path
    names no module of the program (strict export may record an access path such as
    ``a.leaf._peer[0]``).

    **Laws:** idempotent; returns ``program`` itself when every stack nests; changes meta only, so
    the result is ``==`` to the input. Complexity: O(n · stack depth).
    """
    graph = program.root_module.graph
    stacks: dict[int, dict] = {}  # node index -> its cut stack
    nesting: dict[tuple, int] = {}  # stack entries -> how many entries nest (stacks repeat)
    resolve = _path_resolver(program)
    for i, node in enumerate(graph.nodes):
        stack = node.meta.get("nn_module_stack")
        if not stack:
            continue
        items = tuple(stack.items())
        try:
            keep = nesting.get(items)
        except TypeError:  # an unhashable entry: check this stack on its own
            keep = _nesting_prefix(resolve, items)
        if keep is None:
            keep = nesting[items] = _nesting_prefix(resolve, items)
        if keep < len(items):
            log.warning(
                "nn_module_stack paths %s of node %s do not nest; dropping the last %d entries",
                [p for _, (p, _) in items],
                node.name,
                len(items) - keep,
            )
            stacks[i] = dict(items[:keep])
    return _restacked(program, stacks) if stacks else program


def fill_call_gaps(program: Program) -> Program:
    """Give each node that runs in the gap of a module call, under a caller's stack, that call's
    stack.

    A module call runs contiguously in eager, so a node placed between two nodes of one call
    ran inside it. Export sometimes records such a node with the stack of a caller: strict
    export gives a higher-order op (``wrap_with_set_grad_enabled`` of a rotary embedding under
    ``no_grad``) and the ``get_attr`` of its body the root's stack, and ``run_decompositions``
    gives the nodes of the inlined body the stack of that op's caller. ``outline`` would then
    close the call before the node and open it again after it: one call cut in two, which
    ``export_ep`` and torch's unflatten number as two calls (``model@1``).

    A node whose stack is a proper prefix of a call whose nodes come both before and after it
    gets the stack of the deepest such call (its entries, up to that call, taken from the
    call's first node); its own entries below stay lost, as they were. Nodes of another call
    in the gap (not an ancestor's) keep their stacks. Nodes without a stack of their own (the
    "keep the current stack" marker) are left as they are: they follow their neighbours.

    Raises ``PassError`` for an outlined program (run this before ``outline``).

    **Laws:** idempotent; returns ``program`` itself when no call is cut in two; changes meta
    only, so the result is ``==`` to the input. Complexity: O(n · stack depth) for n nodes,
    plus O(m · c) when calls are cut in two, for the m nodes inside their spans and c such
    calls open at once (at most the stack depth unless calls of unrelated modules interleave).
    """
    require_flat(program, "fill_call_gaps")
    graph = program.root_module.graph
    if graph is None:
        return program
    chains, split = _cut_calls(graph)
    if not split:
        return program
    spans: dict[tuple[Frame, ...], list[int]] = {}
    stacks: dict[tuple[Frame, ...], dict] = {}
    for i, chain in enumerate(chains):
        for depth in range(1, len(chain or ()) + 1):
            call = chain[:depth]
            if call in split:
                span = spans.setdefault(call, [i, i])
                span[1] = i
                stacks.setdefault(call, graph.nodes[i].meta["nn_module_stack"])
    adoptions = list(_gap_adoptions(chains, spans))
    if not adoptions:
        return program
    return _restacked(
        program, {i: _truncated_stack(stacks[call], len(call)) for i, call in adoptions}
    )


def _restacked(program: Program, stacks: Mapping[int, dict]) -> Program:
    """``program`` with node ``i`` of its root's first graph given module stack ``stacks[i]``
    (meta changes only here): the graph streamed through a ``kernel.WorkingGraph``, put back
    by ``with_root_graph``. O(n)."""
    graph = program.root_module.graph
    w = kn.WorkingGraph(graph, indexed=False)
    for i, node in enumerate(graph.nodes):
        stack = stacks.get(i)
        w.keep(node if stack is None else node.with_meta(nn_module_stack=stack))
    return with_root_graph(program, w.finish()[0])


def _cut_calls(graph: Graph) -> tuple[list[tuple[Frame, ...] | None], set[tuple[Frame, ...]]]:
    """Per node, the calls it runs in (``None`` for a node with no stack of its own, or a
    placeholder or output); and the calls that close and open again later (each call named by
    its chain of frames from the root)."""
    chains: list[tuple[Frame, ...] | None] = []
    # a call that opens again was opened before (it cannot be open still: it differs from the
    # open calls where it starts), so the calls seen opening are enough to find the cut ones
    opened: set[tuple[Frame, ...]] = set()
    split: set[tuple[Frame, ...]] = set()
    prev: tuple[Frame, ...] = ()
    for node, frames in zip(graph.nodes, graph_frames(graph)):
        if frames is NO_STACK:
            frames = None if node.op in ("placeholder", "output") else node_frames(node)
        chains.append(frames)
        if frames is None or frames is prev:
            continue
        for depth in range(common_prefix(prev, frames) + 1, len(frames) + 1):
            call = frames[:depth]
            seen = len(opened)
            opened.add(call)
            if len(opened) == seen:
                split.add(call)
        prev = frames
    return chains, split


def _gap_adoptions(chains: list, spans: dict[tuple[Frame, ...], list[int]]):
    """(node index, call) for each node inside the span of a call cut in two whose own chain is
    a proper prefix of that call's: the deepest such call. A sweep over the spans in order."""
    starts = sorted(spans.items(), key=lambda item: item[1][0])
    open_calls: list[tuple[tuple[Frame, ...], int]] = []
    s = 0
    for i, chain in enumerate(chains):
        while s < len(starts) and starts[s][1][0] < i:
            call, (_, last) = starts[s]
            open_calls.append((call, last))
            s += 1
        if not open_calls:
            continue
        open_calls = [(call, last) for call, last in open_calls if last > i]
        if chain is None:
            continue
        best = None
        for call, _ in open_calls:
            encloses = len(call) > len(chain) and call[: len(chain)] == chain
            if encloses and (best is None or len(call) > len(best)):
                best = call
        if best is not None:
            yield i, best


def _truncated_stack(stack: dict, depth: int) -> dict:
    """The entries of module stack ``stack`` up to its ``depth``-th non-root entry."""
    kept = {}
    seen = 0
    for key, entry in stack.items():
        if entry[0]:
            if seen == depth:
                break
            seen += 1
        kept[key] = entry
    return kept
