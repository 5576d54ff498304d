"""``remove_effect_tokens``: side-effecting calls without their effect tokens.

``run_decompositions`` threads each side-effecting operator (``aten._print``, custom ops registered
as effectful) through a token: a ``token`` input placeholder, calls
``with_effects(token, op, *args, **kwargs)`` that return ``(new_token, *results)`` read by
``operator.getitem``, and a ``token`` output. Generated code runs nodes in graph order, so the
tokens carry nothing there; this pass calls the operators directly again, as
``torch.export.unflatten`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ir import ops
from ir import signature as sg
from ir.args import ref
from ir.errors import PassError
from ir.graph import Graph
from ir.names import target_name
from ir.node import CALL_FUNCTION, OUTPUT, Node
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.call_targets import call_targets
from transforms.machinery.each_graph import with_root_graph


def remove_effect_tokens(p: Program) -> Program:
    """Rewrite every ``with_effects`` call of the root graph into a direct call of its operator.

    Parameters:
        p: a Program, typically straight from ``import_ep`` of a decomposed export.

    Returns:
        A Program without effect tokens. Each ``with_effects(token, op, *args, **kwargs)`` becomes
        ``op(*args, **kwargs)`` at the same place. ``getitem(w, 0)`` (the next token) disappears;
        ``getitem(w, i)`` for ``i >= 1`` becomes ``getitem(op_node, i - 1)`` when ``op`` returns
        several values, and when it returns one value the op node itself stands for it. Token
        placeholders, token outputs and their specs are removed. Names are kept: the op node takes
        the name of the value its readers read (the first ``getitem(w, 1)`` of a one-result op,
        else the ``with_effects`` node's); a repeated ``getitem(w, 1)`` is read as that node. The
        op node keeps the ``with_effects`` node's ``meta`` (``nn_module_stack``, ...), with
        ``val`` and ``unbacked_bindings`` moved past the token as torch does.

    Raises:
        PassError: naming the node, when a token is read by anything but ``with_effects`` or a
        token output (for example a ``call_module`` or ``invoke_subgraph`` threading a token: run
        this pass before outlining), when a ``with_effects`` result is read by anything but an
        integer ``getitem``, or when the number of results of an operator without a schema or
        ``meta["val"]`` cannot be told.

    **Laws:**

    - identity: a Program without token specs and ``with_effects`` nodes is returned as is
      (``remove_effect_tokens(p) is p``); hence idempotent: ``f(f(p)) is f(p)``;
    - semantics: ``lower(f(p))`` runs the same side effects in the same order and returns the
      same outputs as ``lower(p)`` and ``ep.module()``;
    - names: every node that is not a token, a ``with_effects`` or an absorbed ``getitem`` keeps
      its name, args' structure and meta;
    - ``verify`` holds of the result whenever it holds of ``p``.

    A driver on the rewriting kernel (``transforms.kernel``): the root graph is streamed through
    a ``WorkingGraph``, which derives and names each op node, replaces the absorbed ``getitem``
    nodes, and whose renames the signatures follow (``finalised``).

    Complexity: O(n) in the number of root-graph nodes.
    """
    graph = p.root_module.graph
    if graph is None or not _has_tokens(p, graph):
        return p
    return _remove_effect_tokens(p, graph)


def _has_tokens(p: Program, graph: Graph) -> bool:
    return (
        any(s.kind == sg.TOKEN for s in p.signature.inputs)
        or any(s.kind == sg.OUTPUT_TOKEN for s in p.signature.outputs)
        or any(ops.hop_kind(t) == ops.WITH_EFFECTS for t in call_targets(graph))
    )


def _remove_effect_tokens(p: Program, graph: Graph) -> Program:
    tokens = {s.name for s in p.signature.inputs if s.kind == sg.TOKEN}
    dropped: set[str] = set(tokens)  # nodes not emitted at their own place
    emit: dict[str, Node] = {}  # node name -> what stands at its place instead
    # the op nodes are derived and named by the kernel's working graph; a repeated
    # getitem(w, 1) of a one-result op is replaced by the op node (its readers read that)
    work = kn.WorkingGraph(graph, indexed=False)

    for w in graph.nodes:
        if w.op != CALL_FUNCTION or ops.hop_kind(w.target) != ops.WITH_EFFECTS:
            continue
        if len(w.args) < 2:
            raise PassError(
                f"with_effects node {w.name!r} has args {w.args!r}; expected (token, op, *args)"
            )
        _, op, *args = w.args
        reads = _result_reads(graph, w)
        count = _result_count(w, op, reads)
        name = w.name
        for i, g in reads:
            if i == 0:
                tokens.add(g.name)
                dropped.add(g.name)
            elif count == 1:
                if name == w.name:
                    name = g.name
                else:
                    work.replace(g.name, ref(name))
                dropped.add(g.name)
            else:
                emit[g.name] = g.replace(args=(ref(name), i - 1))
        emit[w.name] = work.derive(
            w, name=name, target=op, args=tuple(args), meta=_result_meta(w.meta, count)
        )

    for here in graph.nodes:
        if here.op == OUTPUT:
            node = _output(here, p.signature.outputs)
        elif here.name in dropped:
            if here.name not in work.alias:
                work.drop(here.name)
            continue
        else:
            node = emit.get(here.name, here)
        for r in node.inputs():
            if r.name in tokens:
                raise PassError(
                    f"node {here.name!r} reads effect token %{r.name}; remove_effect_tokens "
                    "only handles tokens threaded through with_effects calls of the root graph "
                    "(run it before outlining)"
                )
        work.keep(node)

    new_graph, renames = work.finish()
    q = with_root_graph(p, new_graph)
    q = q.replace(signature=sg.ExportSignature(
        inputs=tuple(s for s in p.signature.inputs if s.kind != sg.TOKEN),
        outputs=tuple(s for s in p.signature.outputs if s.kind != sg.OUTPUT_TOKEN),
    ))
    return kn.finalised(p, q, {p.root: renames})


def _result_reads(graph: Graph, w: Node) -> list[tuple[int, Node]]:
    """``(index, getitem node)`` for every reader of ``w``, in graph order."""
    by_name = graph.by_name()
    reads = []
    for user in graph.users()[w.name]:
        g = by_name[user]
        if (
            not ops.is_getitem(g.target)
            or len(g.args) != 2
            or g.args[0] != w.ref
            or type(g.args[1]) is not int
        ):
            raise PassError(
                f"node {g.name!r} reads with_effects node {w.name!r} other than as "
                f"getitem(%{w.name}, <int>); only indexed reads of its results are supported"
            )
        reads.append((g.args[1], g))
    return reads


def _result_count(w: Node, op: Any, reads: list[tuple[int, Node]]) -> int:
    """How many values ``op`` returns: per its schema, else ``meta["val"]`` less the token."""
    count = ops.facts(op).results
    if count is None:
        val = w.meta.get("val")
        if isinstance(val, (tuple, list)) and val:
            count = len(val) - 1
        elif all(i == 0 for i, _ in reads):
            return 0
        else:
            raise PassError(
                f"with_effects node {w.name!r} calls {target_name(op)}, which has no schema and "
                "no meta['val']; cannot tell how many values it returns"
            )
    for i, g in reads:
        if i > count:
            raise PassError(
                f"node {g.name!r} reads result {i} of with_effects node {w.name!r}, but "
                f"{target_name(op)} returns {count} values after the token"
            )
    return count


def _result_meta(meta: Mapping[str, Any], count: int) -> dict[str, Any]:
    """What changes in the ``meta`` of a ``with_effects`` node for the op's own result (no
    leading token): ``val`` and ``unbacked_bindings`` moved past the token."""
    changes: dict[str, Any] = {}
    val = meta.get("val")
    if isinstance(val, tuple):
        changes["val"] = val[1] if count == 1 else (val[1:] if count > 1 else None)
    bindings = meta.get("unbacked_bindings")
    if bindings:
        changes["unbacked_bindings"] = {
            k: path[1:] if path else path for k, path in bindings.items()
        }
    return changes


def _output(node: Node, specs: tuple[sg.OutputSpec, ...]) -> Node:
    """The output node without its token outputs (positions follow ``specs`` when given)."""
    values = node.args[0] if node.args else None
    if specs and isinstance(values, tuple) and len(values) == len(specs):
        values = tuple(v for v, s in zip(values, specs) if s.kind != sg.OUTPUT_TOKEN)
    return node.replace(args=(values,) + node.args[1:])
