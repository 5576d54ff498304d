"""``fold_constants``: what depends on no input and on no state that can change is computed once,
when the program is transformed, and held as a new lifted constant."""

from __future__ import annotations

from typing import Any

import torch

from ir import ops
from ir import signature as sg
from ir import state as st
from ir.args import EMPTY_DICT, thaw
from ir.effects import Effects, binds_symbols, graph_effects, is_pure, written_state
from ir.errors import PassError
from ir.gcpause import gc_paused
from ir.graph import Graph
from ir.module import SUBGRAPH, ModuleId
from ir.node import CALL_FUNCTION, GET_ATTR, PLACEHOLDER, Node
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.each_graph import map_graphs, signature_names
from transforms.machinery.pass_checks import require_program
from transforms.new_state import NewState

__all__ = ["DEFAULT_MAX_BYTES", "fold_constants"]

DEFAULT_MAX_BYTES = 1 << 20
"""``fold_constants``' default bound on one folded tensor: 1 MiB."""

@gc_paused
def fold_constants(
    p: Program, max_bytes: int = DEFAULT_MAX_BYTES, *, listener: kn.Listener | None = None
) -> Program:
    """Compute once the values that depend on no input and on no state that can change, and
    read them from new lifted constants.

    A driver on the rewriting kernel (``transforms.kernel``): each graph with values to fold
    is streamed through a ``WorkingGraph``, which names and makes the nodes that read the new
    constants (``state_read``), ``replace`` s each folded node by one and places the new root
    inputs; the renames and the new state go through the kernel's ``finalised``.

    Parameters:
        p: a Program, flat or outlined (each graph of the module table once).
        max_bytes: the largest result (``numel * element_size``) held as a new constant;
            default ``DEFAULT_MAX_BYTES`` (1 MiB). A larger result is computed on each call as
            before (what it is computed from may still fold), so folding never makes a small
            program hold a large tensor (``ones(n)`` expanded to ``(n, n)``).
        listener: a ``kernel.Listener`` told of each node that reads a new constant
            (``emitted``), each folded node replaced by one (``replaced``, ``erased``) and each
            node dropped (``erased``); ``None``: nobody.

    Returns:
        ``p`` itself when nothing folds. Else a Program in which each folded node that is
        still read is replaced by a read of a new constant:

        - in the root graph of a flat program with a root call signature: a
          ``constant_tensor`` placeholder and input spec (after the state inputs, before the
          user inputs: ``NewState``), state ``<module>._folded_<node>`` of the module call the node ran in;
        - in any other graph: a ``get_attr`` of a new attribute ``_folded_<node>``, with state
          at every path that reaches the module (as ``sink_state`` leaves state). Bodies of
          higher-order ops own no state and are not folded;
        - a folded value that its graph returns or a preserved call signature names keeps its
          node and name, as ``clone(constant)``: a caller never gets the constant to write.

        A node folds when it is a pure ``call_function`` (``ops.impurity`` empty: never a
        random, effectful, mutating or higher-order op; nor an ``empty*`` builder, whose
        values are unspecified; nor a node that defines unbacked symbols) whose arguments are
        literals, lifted constants (``constant`` state that no graph writes in place and no
        output mutates) or folded values; that is never written in place itself (directly or
        through an alias); and whose computation succeeds here (a builder for a device that
        is not present stays). Parameters and buffers are not folded: the user may load or
        train them. A result that is a view or copy of a constant (``t(c)``, ``clone(c)``:
        folding computes nothing), not a tensor, or larger than ``max_bytes`` is not held: it
        stays computed where still read. Nodes that only folded values read are dropped.
        The tensors are computed under ``torch.no_grad`` from the program's tensors, which
        are never written: the new constants are fresh copies.

    Raises:
        NotAProgramError: ``p`` is not a Program.
        PassError: ``max_bytes`` is not a non-negative int.

    **Laws:**

    - identity: a program with nothing to fold is returned as is; idempotent: a second run
      folds nothing (``f(f(p)) is f(p)``);
    - determinism: two runs give equal programs up to the new tensors' identity (their
      values are equal; ``Opaque`` compares by identity);
    - semantics: ``lower(f(p))`` returns what ``lower(p)`` returns and leaves the same state
      (up to floating-point rounding of ops computed on another device);
    - purity: ``p`` and its tensors are not written (``_version`` kept);
    - ``state_dict`` keys kept (constants are not in it); ``verify`` holds of the result.

    Complexity: O(n) in the nodes of all graphs, plus the folded arithmetic.
    """
    require_program(p, "fold_constants")
    if type(max_bytes) is not int or max_bytes < 0:
        raise PassError(f"fold_constants: max_bytes must be an int >= 0, got {max_bytes!r}")
    new = NewState(p)
    fixed = _constant_keys(p)
    named = signature_names(p)
    specs = {s.name: s for s in p.signature.inputs}
    renames: dict[ModuleId, dict[str, str]] = {}

    def fold(mid: ModuleId, graph: Graph) -> Graph:
        if mid != p.root and (not p.module_paths(mid) or p.module(mid).kind == SUBGRAPH):
            # a module no path reaches holds no state to read; a higher-order op's body is
            # held by whichever module runs it (the pipeline moves it): no state of its own
            return graph
        values, sources, kept, held = _evaluate(
            p, mid, graph, fixed, graph_effects(p, mid, graph), max_bytes, specs
        )
        if not held:
            return graph
        needed = _needed(graph, kept, held, sources, named)
        exposed = set(named)
        exposed.update(r.name for r in graph.output_node.inputs())
        w = kn.WorkingGraph(graph, indexed=False, listener=listener)
        _rebuild(p, mid, w, values, sources, kept, held, needed, exposed, new)
        out, replaced = w.finish()
        if replaced:
            renames[mid] = replaced
        return out

    return kn.finalised(p, map_graphs(p, fold), renames, new)


def _constant_keys(p: Program) -> frozenset[str]:
    """The tensor keys of ``constant`` state that no graph writes and no output mutates."""
    written = written_state(p)
    return frozenset(
        slot.tensor for slot in p.state_table().values()
        if slot.kind == st.CONSTANT and slot.tensor not in written
    )


def _source(
    p: Program, mid: ModuleId, n: Node, fixed: frozenset[str], specs: dict
) -> Any:
    """The tensor a placeholder or ``get_attr`` reads when it is a constant nothing writes."""
    state = p.state_table()
    if n.op == PLACEHOLDER:
        if mid != p.root:
            return None
        spec = specs.get(n.name)
        fqns = [spec.target] if spec is not None and spec.kind == sg.CONSTANT_TENSOR else []
    else:
        fqns = [p.attr_fqn(mid, path, n.target) for path in p.module_paths(mid)]  # one a path
    keys = {state[f].tensor if f in state else None for f in fqns}
    if len(keys) != 1 or None in keys or next(iter(keys)) not in fixed:
        return None
    value = p.tensor_table()[next(iter(keys))].value
    return value if isinstance(value, torch.Tensor) else None


def _foldable(node: Node) -> bool:
    return is_pure(node) and "empty" not in ops.facts(node.target).name


def _evaluate(
    p: Program, mid: ModuleId, graph: Graph, fixed: frozenset[str], effects: Effects,
    max_bytes: int, specs: dict,
) -> tuple[dict[str, Any], set[str], set[str], set[str]]:
    """Run the graph's constant part. Returns ``(values, sources, kept, held)``: the value of
    every node that depends on constants only, the constant reads among them, the computed
    ones that stay computed where read (views and copies of constants, non-tensors, results
    over ``max_bytes``), and the computed ones that become new constants."""
    values: dict[str, Any] = {}
    sources: set[str] = set()
    free: set[str] = set()  # views and copies of constants: folding them computes nothing
    kept: set[str] = set()
    held: set[str] = set()
    with torch.no_grad():
        for n in graph.nodes:
            if effects.is_written(n.name):
                continue
            if n.op in (PLACEHOLDER, GET_ATTR):
                value = _source(p, mid, n, fixed, specs)
                if value is not None:
                    values[n.name] = value
                    sources.add(n.name)
                continue
            if n.op != CALL_FUNCTION or not all(r.name in values for r in n.inputs()):
                continue
            if not _foldable(n) or binds_symbols(n):
                continue
            try:
                result = n.target(*thaw(n.args, _read(values)), **thaw(n.kwargs, _read(values)))
            except Exception:  # noqa: BLE001, S112 - what cannot be computed here stays computed
                continue
            values[n.name] = result
            facts = ops.facts(n.target)
            if (facts.view or facts.alias_like or facts.getitem) and all(
                r.name in sources or r.name in free for r in n.inputs()
            ):
                free.add(n.name)
                kept.add(n.name)
            elif (
                type(result) is torch.Tensor
                and result.device.type != "meta"
                and result.numel() * result.element_size() <= max_bytes
            ):
                held.add(n.name)
            else:
                kept.add(n.name)
    return values, sources, kept, held


def _read(values: dict[str, Any]) -> Any:
    return lambda r: values[r.name]


def _needed(
    graph: Graph, kept: set[str], held: set[str], sources: set[str], named: frozenset[str]
) -> set[str]:
    """The names the folded graph still reads: a held node here becomes a constant, a kept
    node or constant ``get_attr`` that nothing reads any more is dropped."""
    needed: set[str] = set(named)
    for n in reversed(graph.nodes):
        if n.name in held:
            continue  # it reads nothing once it is a constant
        optional = n.name in kept or (n.name in sources and n.op == GET_ATTR)
        if optional and n.name not in needed:
            continue
        needed.update(r.name for r in n.inputs())
    return needed


def _rebuild(
    p: Program, mid: ModuleId, w: kn.WorkingGraph, values: dict, sources: set[str],
    kept: set[str], held: set[str], needed: set[str], exposed: set[str], new: NewState,
) -> None:
    """Stream ``w``'s graph: each held node still needed is read from a new constant (at a flat
    root a placeholder of state ``<module>._folded_<node>`` of the module call the node ran
    in; elsewhere a ``get_attr`` of attribute ``_folded_<node>``, state under every path that
    reaches module ``mid``), as ``clone(constant)`` under its own name where exposed; what
    is no longer needed is dropped."""
    # a flat root reads state through placeholders, which its call signature binds to state
    # (without one, ``lower`` takes every placeholder as an input: read a get_attr then)
    at_root = mid == p.root and p.is_flat and "" in p.call_signatures
    for n in w.graph.nodes:
        if n.name in held:
            if n.name not in needed:
                w.drop(n.name)
                continue
            constant, _ = w.state_read(
                new, st.CONSTANT, f"_folded_{n.name}", values[n.name].detach().clone(),
                mid=mid, anchor=n, root=at_root, val=n.meta.get("val"),
            )
            w.add(constant)
            if n.name in exposed:
                w.add(n.replace(target=ops.CLONE, args=(constant.ref,), kwargs=EMPTY_DICT))
            else:
                w.replace(n.name, constant.ref)
            continue
        if (n.name in kept or (n.name in sources and n.op == GET_ATTR)) and n.name not in needed:
            w.drop(n.name)
            continue
        w.keep(n)
