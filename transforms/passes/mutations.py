"""``functional_to_inplace``: functionalized buffer and user-input mutations back to ``copy_``.

After ``run_decompositions`` a mutation ``self.buf.add_(x)`` is functional: the root computes the
new value and returns it as an extra leading output of kind ``buffer_mutation`` (or
``user_input_mutation``), which the caller writes back after the call. This pass writes it back
inside the graph instead, with ``aten.copy_`` next to the node computing the value, so that
outlining puts the write in the module that made it (``torch.export.unflatten`` does the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ir import signature as sg
from ir.args import EMPTY_DICT, Ref, iter_refs, ref
from ir.errors import PassError
from ir.graph import Graph
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER
from ir.ops import COPY
from ir.program import Program
from transforms import kernel as kn
from transforms.machinery.each_graph import with_root_graph

INPLACE_KINDS = (sg.BUFFER_MUTATION, sg.USER_INPUT_MUTATION)


def functional_to_inplace(p: Program) -> Program:
    """Turn the root's ``buffer_mutation`` / ``user_input_mutation`` outputs into ``copy_`` nodes.

    Parameters:
        p: a Program whose root graph is the exported flat graph (run before outlining).

    Returns:
        A Program where each mutation output ``v`` of buffer ``b`` (or user input ``x``) is a node
        ``copy_ = aten.copy_.default(%b, %v)``, placed right after the node defining ``v`` (after
        the last placeholder when ``v`` is one) and carrying ``v``'s ``meta``, so it lands in
        ``v``'s module when outlined (a placeholder ``v`` has no module: its copy gets the root's
        ``nn_module_stack`` entry and stays in the root). Every later read of ``v``, user outputs
        included, reads the ``copy_`` node instead, as ``torch.export.unflatten`` does. A
        ``copy_`` goes later than
        that when a node still reads the old value of its destination afterwards (it then waits
        for the last such read), so the in-place program computes what the functional one did.
        The mutation outputs and their specs are dropped; parameter mutations are left as they
        are. New nodes are named ``copy_``, ``copy__1``, ...; no existing node is renamed.

    Raises:
        PassError: naming the output or node, when a mutation names no buffer or user-input
        placeholder, returns a literal, or writes a target that another mutation also writes;
        when copies would have to go in a cycle (two buffers swapping their old values); when a
        user output returns the old value of an input that is mutated; or when the root's
        outputs do not match its output specs.

    **Laws:**

    - identity: a Program without buffer or user-input mutation outputs is returned as is
      (``functional_to_inplace(p) is p``); hence idempotent: ``f(f(p)) is f(p)``;
    - semantics: ``lower(f(p))`` returns what ``lower(p)`` returns, leaves every buffer with the
      same value after each call, and writes the same values into the caller's mutated inputs;
    - counting: exactly one ``copy_`` node is added per mutation output and no node is removed;
    - ``verify`` holds of the result whenever it holds of ``p``.

    A driver on the rewriting kernel (``transforms.kernel``): the root graph is streamed through
    a ``WorkingGraph``, which names and makes each ``copy_`` (``derive``: the value's meta) and
    has the readers after it read it (``read_as(..., rename=True)``).

    Complexity: O(n + m) for n root-graph nodes and m outputs.
    """
    graph = p.root_module.graph
    if graph is None or not any(s.kind in INPLACE_KINDS for s in p.signature.outputs):
        return p
    return _functional_to_inplace(p, graph)


def _functional_to_inplace(p: Program, graph: Graph) -> Program:
    specs = p.signature.outputs
    values = _output_values(graph, specs)
    groups = _mutation_groups(p.signature, values)
    at, order = _placement(graph, groups)

    after: dict[int, list[str]] = {}  # node index -> the groups whose copies follow it
    for value in order:
        after.setdefault(at[value], []).append(value)
    root_stack = (
        _root_stack(graph) if any(graph.node(v).op == PLACEHOLDER for v in groups) else None
    )
    # each copy_ is made, named and placed by the kernel's working graph; the readers after it
    # read it instead of the value it wrote (``read_as(..., rename=True)``)
    w = kn.WorkingGraph(graph, indexed=False)
    for i, node in enumerate(graph.nodes):
        if node.op == OUTPUT:
            kept = tuple(v for v, s in zip(values, specs) if s.kind not in INPLACE_KINDS)
            w.keep(node.replace(args=(kept,) + node.args[1:]))
            continue
        if w.alias and any(r.name in w.alias for r in node.inputs()):
            w.keep(node)  # rewired: reads the copy_ that stands for a value it reads
        else:
            w.add(node)
        for value in after.get(i, ()):
            anchor = graph.node(value)
            stack = _copy_stack(anchor.meta, root_stack)
            for dest in groups[value]:
                copy = w.derive(anchor, op=CALL_FUNCTION, target=COPY,
                                args=(ref(dest), ref(value)), kwargs=EMPTY_DICT, meta=stack)
                w.add(copy)
                if value not in w.alias:
                    w.read_as(value, copy.ref, rename=True)

    new_graph, env = w.finish()
    _check_outputs_keep_old_values(graph, specs, values, groups, env)
    signature = sg.ExportSignature(
        p.signature.inputs,
        tuple(s for s in specs if s.kind not in INPLACE_KINDS),
    )
    return with_root_graph(p, new_graph).replace(
        signature=kn.renamed_outputs(signature, env),
        call_signatures=_renamed_call_inputs(p, env),
    )


def _renamed_call_inputs(p: Program, env: Mapping[str, str]) -> Any:
    """Preserved calls that took a mutated value now take the ``copy_`` that stands for it, as
    every other reader does."""
    renamed = {name: sig.renamed(inputs=env) for name, sig in p.call_signatures.items()}
    changed = {name: sig for name, sig in renamed.items() if sig != p.call_signatures[name]}
    return p.call_signatures.update(changed) if changed else p.call_signatures


def _root_stack(graph: Graph) -> dict[str, Any] | None:
    """The root's entry of the graph's module stacks, as a one-entry ``nn_module_stack``."""
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            key, (path, type_name) = next(iter(stack.items()))
            return {key: (path, type_name)} if path == "" else None
    return None


def _copy_stack(
    meta: Mapping[str, Any], root_stack: dict[str, Any] | None
) -> Mapping[str, Any] | None:
    """What a value's ``copy_`` changes in the value's meta: a value outside every module (a
    placeholder) puts its copy in the root, as ``torch.export.unflatten`` does."""
    if root_stack is None or meta.get("nn_module_stack"):
        return None
    return {"nn_module_stack": root_stack}


def _output_values(graph: Graph, specs: tuple[sg.OutputSpec, ...]) -> tuple:
    outputs = graph.outputs
    values = outputs if isinstance(outputs, tuple) else (outputs,)
    if len(values) != len(specs):
        raise PassError(
            f"the root graph returns {len(values)} values but its signature lists {len(specs)} "
            "outputs; run verify on the Program"
        )
    return values


def _mutation_groups(signature: sg.ExportSignature, values: tuple) -> dict[str, list[str]]:
    """``{value name: destination placeholder names}``, both in output order."""
    buffers = {s.target: s.name for s in signature.inputs if s.kind == sg.BUFFER}
    user_inputs = {s.name for s in signature.inputs if s.kind == sg.USER_INPUT}
    groups: dict[str, list[str]] = {}
    written: set[str] = set()
    for value, spec in zip(values, signature.outputs):
        if spec.kind not in INPLACE_KINDS:
            continue
        if spec.kind == sg.BUFFER_MUTATION:
            dest = buffers.get(spec.target)
        else:
            dest = spec.target if spec.target in user_inputs else None
        if dest is None:
            raise PassError(
                f"{spec.kind} output {spec.name!r} writes {spec.target!r}, which is not a "
                f"{'buffer' if spec.kind == sg.BUFFER_MUTATION else 'user input'} of the root"
            )
        if type(value) is not Ref:
            raise PassError(
                f"{spec.kind} output of {spec.target!r} returns the literal {value!r}; expected "
                "a node's value"
            )
        if dest in written:
            raise PassError(
                f"{spec.target!r} is written by two {spec.kind} outputs; expected one per target"
            )
        written.add(dest)
        groups.setdefault(value.name, []).append(dest)
    return groups


def _placement(graph: Graph, groups: dict[str, list[str]]) -> tuple[dict[str, int], list[str]]:
    """Where each group's copies go (the index of the node they follow), and the groups in an
    order that emits a copy reading a placeholder before the copy that overwrites it.

    A group's copies follow its value, the placeholders, every non-output reader of a
    destination, and the copies that read a destination's old value (their group's value is that
    destination).
    """
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    last_reader = _last_readers(graph, {d for dests in groups.values() for d in dests})
    last_placeholder = max((position[n.name] for n in graph.placeholders), default=0)
    at: dict[str, int] = {}
    order: list[str] = []
    visiting: set[str] = set()

    def place(value: str) -> int:
        found = at.get(value)
        if found is not None:
            return found
        if value in visiting:
            raise PassError(
                f"mutations write %{value} while another mutation copies its old value, in a "
                "cycle (buffers swapping values); this cannot be done with copy_ in place"
            )
        visiting.add(value)
        k = max(position[value], last_placeholder)
        for dest in groups[value]:
            k = max(k, last_reader.get(dest, k))
            if dest in groups:
                k = max(k, place(dest))
        visiting.discard(value)
        at[value] = k
        order.append(value)
        return k

    for value in groups:
        place(value)
    return at, order


def _last_readers(graph: Graph, names: set[str]) -> dict[str, int]:
    """The index of the last node other than the output that reads each of ``names``."""
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.op == OUTPUT:
            continue
        for r in node.inputs():
            if r.name in names:
                last[r.name] = i
    return last


def _check_outputs_keep_old_values(
    graph: Graph,
    specs: tuple[sg.OutputSpec, ...],
    values: tuple,
    groups: dict[str, list[str]],
    env: Mapping[str, str],
) -> None:
    """A kept output reading a mutated placeholder would see the new value after the copies."""
    written = {d for dests in groups.values() for d in dests}
    for value, spec in zip(values, specs):
        if spec.kind in INPLACE_KINDS:
            continue
        for r in iter_refs(value):
            if r.name in written and r.name not in env:
                raise PassError(
                    f"{spec.kind} output returns %{r.name}, the value of an input from before "
                    "the call mutated it; in place it would return the new value"
                )
