"""The module calls of a repro script: a flat program's calls written back as nested modules.

A backend that reads preserved calls (``"unflatten"``) sees the module hierarchy, which a flat
``Repro.forward`` (``lowering.fuzz.repro``) does not have. :func:`nested_forward` writes the
program's operator lines (each ``V['name'] = ...``: every value lives in one dict ``V``, so a
call may read a value outside its arguments, as the program does) split by the module call
each node runs in (its ``nn_module_stack`` frames): the root's lines stay in ``Repro.forward``;
each call of a submodule becomes a function ``call_<n>(self, *args, **kwargs)``, which the
holder module at its path (:data:`MOD_CLASS`, ``Mod``) runs when called, its calls taken in
order from ``BODIES``. A call with a preserved signature is made with the signature's inputs
(its ``in_spec`` spelled as arguments and keywords) and binds its outputs, so that
``torch.export.export(..., preserve_module_call_signature=PRESERVED)`` records the program's
signatures again; a call without one is made without arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ir.errors import PurefxError
from ir.module_stack import NO_STACK
from ir.node import OUTPUT, PLACEHOLDER
from ir.program import Program
from ir.signature import CallSignature


class CallsError(PurefxError):
    """A program whose module calls cannot be written as nested calls (a call cut in two, a
    signature spec the writer does not spell), named in the message."""


MOD_CLASS = '''V = {}  # every value of the program, by name: a call may read one outside its arguments
BODIES = {}  # module path -> the bodies of its calls not made yet, in order
ROOT = []  # the Repro being run


class Mod(nn.Module):
    """A module of the program: each call runs the next of its calls' bodies."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def forward(self, *args, **kwargs):
        return BODIES[self.path].pop(0)(self, *args, **kwargs)
'''
"""The script's lines before ``class Repro``: ``V``, ``BODIES`` and the holder class ``Mod``."""


NESTED_COMPILE = '''def compile_backend(module):
    """The backend as the fuzzer ran it: export keeping the program's preserved calls,
    torch.export.unflatten."""
    ep = torch.export.export(module, make_inputs(), dynamic_shapes=DYNAMIC_SHAPES,
                             preserve_module_call_signature=PRESERVED)
    if FUNCTIONAL:  # the program writes its state back at the end, as a functional export
        ep = ep.run_decompositions({})
    return torch.export.unflatten(ep)
'''
"""``compile_backend`` of a nested script (the ``"unflatten"`` target): ``PRESERVED`` and
``FUNCTIONAL`` are the script's settings (:func:`preserved_paths`, :func:`functional_state`)."""


def functional_state(program: Program) -> bool:
    """Whether ``program`` writes state or inputs back as outputs of its graph (a functional
    export): then the script's export is functionalized too (``run_decompositions({})``)."""
    return any(o.kind in ("buffer_mutation", "user_input_mutation")
               for o in program.signature.outputs)


def value(name: str) -> str:
    """How the nested script spells the program's value ``name``: ``V['name']``."""
    return f"V[{name!r}]"


def module_paths(program: Program) -> list[str]:
    """Every module path below the root that holds state or is called, parents first.
    O(state + calls)."""
    named = [fqn.rpartition(".")[0] for fqn in program.state]
    named += [call.split("@")[0] for call in program.call_order]
    for node in program.root_module.graph.nodes:
        frames = node.module_frames
        if frames is not NO_STACK and frames is not None:
            named += [f.path for f in frames]
    paths = {".".join(p.split(".")[:i]) for p in named if p for i in range(1, p.count(".") + 2)}
    return sorted(paths, key=lambda p: (p.count("."), p))


def preserved_paths(program: Program) -> tuple[str, ...]:
    """The paths whose calls the program preserves (``@n`` stripped), in call order."""
    found: list[str] = []
    for call in program.call_order:
        path = call.split("@")[0]
        if call and call in program.call_signatures and path not in found:
            found.append(path)
    return tuple(found)


def nested_forward(program: Program, head: Sequence[str], lines: Mapping[str, str],
                   tail: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(forward_lines, functions)``: ``Repro.forward``'s body (``head``, then the root's
    operator lines and its calls, then ``tail``; indented 8) and the ``call_<n>`` functions
    (module level), from ``lines`` (node name -> the statement computing it, unindented).

    Raises :class:`CallsError` for a call that is cut in two (reopened after it closed) or a
    signature spec it cannot spell. O(nodes + calls)."""
    order: list[str] = []  # call names, in the order they open
    bodies: dict[str, list[str]] = {"": list(head)}
    open_calls: list[tuple[str, str]] = []  # (call name, path)
    closed: set[str] = set()
    functions: list[str] = []

    def close_to(depth: int) -> None:
        while len(open_calls) > depth:
            name, _ = open_calls.pop()
            closed.add(name)
            sig = program.call_signatures.get(name)
            outs = "None" if sig is None else _spelled(sig.out_spec, [_out(a) for a in sig.outputs])
            bodies[name].append(f"return {outs}")

    for node in program.root_module.graph.nodes:
        if node.op in (PLACEHOLDER, OUTPUT):
            continue
        frames = node.module_frames
        chain = [] if frames is NO_STACK or frames is None else list(frames)
        calls = [(f.call_name, f.path) for f in chain]
        depth = 0
        while depth < min(len(calls), len(open_calls)) and calls[depth] == open_calls[depth]:
            depth += 1
        close_to(depth)
        for name, path in calls[depth:]:
            if name in closed or name in bodies:
                raise CallsError(f"the call {name!r} is cut in two (node {node.name!r} runs in "
                                 "it after it ended); the nested writer needs one run of nodes "
                                 "per call")
            caller = open_calls[-1][0] if open_calls else ""
            bodies[caller].extend(_making(program, name, path))
            bodies[name] = _taking(program.call_signatures.get(name))
            order.append(name)
            open_calls.append((name, path))
        owner = open_calls[-1][0] if open_calls else ""
        bodies[owner].append(lines[node.name])
    close_to(0)
    for i, name in enumerate(order):
        functions += ["", "", f"def call_{i}(self, *args, **kwargs):",
                      f"    \"\"\"The call {name!r}.\"\"\"",
                      *("    " + line for line in bodies[name])]
    queues: dict[str, list[str]] = {}
    for i, name in enumerate(order):
        queues.setdefault(name.split("@")[0], []).append(f"call_{i}")
    reset = ["V.clear()", "ROOT[:] = [self]", "BODIES.clear()",
             "BODIES.update({" + ", ".join(f"{p!r}: [{', '.join(fs)}]"
                                            for p, fs in queues.items()) + "})"]
    forward = ["        " + line for line in reset + bodies[""] + list(tail)]
    return forward, functions


def _making(program: Program, name: str, path: str) -> list[str]:
    """The caller's lines that make call ``name`` of the module at ``path`` and bind what it
    returns."""
    target = f"ROOT[0].get_submodule({path!r})"
    sig = program.call_signatures.get(name)
    if sig is None:
        return [f"{target}()"]
    binds = [f"{value(a.name)} = _leaves(got)[{i}]" for i, a in enumerate(sig.outputs)
             if a.name is not None and a.kind != "constant"]
    return [f"got = {target}({_arguments(sig)})", *binds]


def _taking(sig: CallSignature | None) -> list[str]:
    """A call's first lines: its arguments bound to the names its signature gives them."""
    if sig is None:
        return []
    return [f"{value(a.name)} = _leaves((args, kwargs))[{i}]" for i, a in enumerate(sig.inputs)
            if a.name is not None and a.kind != "constant"]


def _arguments(sig: CallSignature) -> str:
    """The signature's ``(args, kwargs)`` spec spelled as call arguments."""
    leaves = [_out(a) for a in sig.inputs]
    spec = sig.in_spec
    if spec is None or _kind(spec) is not tuple or len(_children(spec)) != 2:
        raise CallsError(f"a call's in_spec is not (args, kwargs): {spec}")
    args, kwargs = _children(spec)
    n = len(_children(args)) if _kind(args) is tuple else -1
    if n < 0 or _kind(kwargs) is not dict:
        raise CallsError(f"a call's in_spec is not (args, kwargs): {spec}")
    counts = [_count(c) for c in _children(args)]
    parts, at = [], 0
    for child, k in zip(_children(args), counts):
        parts.append(_spelled(child, leaves[at:at + k]))
        at += k
    for key, child in zip(_context(kwargs), _children(kwargs)):
        k = _count(child)
        parts.append(f"{key}={_spelled(child, leaves[at:at + k])}")
        at += k
    return ", ".join(parts)


def _out(a: Any) -> str:
    return repr(a.value) if a.name is None or a.kind == "constant" else value(a.name)


def _kind(spec: Any) -> Any:
    return getattr(spec, "type", None)


def _children(spec: Any) -> list[Any]:
    return list(getattr(spec, "children_specs", []))


def _context(spec: Any) -> list[Any]:
    return list(getattr(spec, "context", None) or [])


def _count(spec: Any) -> int:
    return int(getattr(spec, "num_leaves", 1))


def _spelled(spec: Any, leaves: list[str]) -> str:
    """``leaves`` arranged as ``spec`` (a pytree spec of tuples, lists, dicts and leaves)."""
    if spec is None or getattr(spec, "is_leaf", lambda: True)():
        if len(leaves) != 1:
            raise CallsError(f"a leaf spec with {len(leaves)} values")
        return leaves[0]
    kind, items, at = _kind(spec), [], 0
    for child in _children(spec):
        k = _count(child)
        items.append(_spelled(child, leaves[at:at + k]))
        at += k
    if kind is tuple:
        return "(" + "".join(i + ", " for i in items) + ")"
    if kind is list:
        return "[" + ", ".join(items) + "]"
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {i}" for k, i in zip(_context(spec), items)) + "}"
    raise CallsError(f"the nested writer spells tuple, list and dict specs, not {kind!r}")


__all__ = ["MOD_CLASS", "NESTED_COMPILE", "CallsError", "functional_state", "module_paths", "nested_forward", "preserved_paths",
           "value"]
