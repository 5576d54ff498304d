"""``LawViolation``, the error every purefx law check raises, its ``Example`` (what to run to see
the violation again), and ``describe``, how it prints the program at fault. Its own module,
inside the ``transforms`` layer, so that a pass's own law (``transforms.rewrite.rule_check``) raises
the same error as ``lowering.pass_laws`` without importing a module that lowers programs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from ir.args import iter_refs
from ir.errors import shorten
from ir.node import PLACEHOLDER
from ir.printer import format_program
from ir.program import Program

__all__ = ["Example", "LawViolation", "describe", "format_value", "pass_name"]

SMALL_STATE = 4
"""A message shows every state value when the program holds at most this many; else only those
the failing output reads (all of them where that is not known)."""


@attrs.frozen
class Example:
    """A counterexample to replay: ``lower(program)(*args, **kwargs)`` with the state
    ``state`` (fqn -> tensor, the values the program holds, which ``lower`` loads) shows the
    violation again. ``program`` is the pass's input; printed (``format_program(program)``, vals
    included) it parses back (``ir.parse_program``) into a program that runs, whose state
    tensors are zeros until ``state`` is loaded into the lowered module
    (``load_state_dict(example.state, strict=False)``)."""

    program: Program
    args: tuple = ()
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    state: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def of(cls, program: Program, args: tuple = (), kwargs: Mapping[str, Any] | None = None
           ) -> Example:
        """The example of ``program`` run on ``args``/``kwargs``, its state read from its
        tensor table (fqn -> the tensor it holds). O(state)."""
        state = {fqn: program.tensor(fqn) for fqn in program.state_order}
        return cls(program, tuple(args), dict(kwargs or {}), state)


class LawViolation(AssertionError):
    """A pass broke a law: ``law`` names it, ``detail`` says how, ``program`` is the input,
    ``example`` (an :class:`Example`, ``None`` for a law without a program, such as a rule's)
    what to run to see it again, ``output`` the index of the root output found to differ when
    the law knows it (``None`` otherwise), ``tried`` how many programs ``check_laws`` had
    judged when it met this one, this one included (``None`` from a single ``check_program``).

    The message prints the input program with its vals (``format_program(p)``, which
    ``ir.parse_program`` reads back into a program that runs) and the values of the state that
    matter: all of it when the program holds at most :data:`SMALL_STATE` tensors, else those
    the differing output reads (only their count where the law does not know which output
    differs); each shortened (:func:`format_value`).
    """

    def __init__(self, law: str, pass_fn: Any, detail: str, program: Program | None, *,
                 example: Example | None = None, output: int | None = None) -> None:
        self.law = law
        self.pass_name = pass_name(pass_fn)  # the attribute that the messages read
        self.detail = detail
        self.program = program
        if example is None and program is not None:
            example = Example.of(program)
        self.example = example
        self.output = output
        self.tried: int | None = None  # set by check_laws
        text = f"law {law!r} broken by {self.pass_name}: {detail}"
        if program is not None:
            text += "\n\ninput program:\n" + describe(program, vals=True)
        if example is not None:
            text += _example_lines(example, output)
        super().__init__(text)


def _example_lines(example: Example, output: int | None) -> str:
    lines = []
    if example.args or example.kwargs:
        shown = [format_value(a) for a in example.args]
        shown += [f"{k}={format_value(v)}" for k, v in example.kwargs.items()]
        lines.append("inputs: " + ", ".join(shown))
    fqns = list(example.state)
    if len(fqns) > SMALL_STATE:
        read = state_read_by(example.program, output)
        if read is None:  # which output differs is not known: too many to print them all
            lines.append(f"state: {len(fqns)} tensors (e.example.state)")
            fqns = []
        else:
            fqns = [f for f in fqns if f in read]
    if fqns:
        heading = "state" if len(fqns) == len(example.state) else (
            f"state the differing output reads ({len(fqns)} of {len(example.state)})")
        lines.append(heading + ":")
        lines += [f"  {fqn} = {format_value(example.state[fqn])}" for fqn in fqns]
    return "\n" + "\n".join(lines) if lines else ""


def state_read_by(program: Program, output: int | None) -> set[str] | None:
    """The state fqns root output ``output`` reads, directly or through any node of the root
    graph it depends on (a call of a module counts as reading all the state below it); ``None``
    when ``output`` is ``None`` or out of range. O(root graph + state)."""
    graph = program.root_module.graph
    outs = graph.outputs
    if output is None or not isinstance(outs, tuple) or not 0 <= output < len(outs):
        return None
    by_name = graph.by_name()
    targets = {s.name: s.target for s in program.signature.inputs if s.target}
    read: set[str] = set()
    seen: set[str] = set()
    todo = [r.name for r in iter_refs(outs[output])]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        node = by_name[name]
        if node.op == PLACEHOLDER and name in targets:
            read.add(targets[name])
        elif node.op == "get_attr":
            read.add(str(node.target))
        elif node.op == "call_module":
            read.update(f for f in program.state_order if f.startswith(f"{node.target}."))
        todo += [r.name for r in iter_refs((node.args, node.kwargs))]
    return read


def format_value(value: Any, limit: int = 120) -> str:
    """A short one-line account of a value in a counterexample: a tensor as ``DTYPE[SIZES]``
    and its first elements (``float32[3] [1.0, 1.0, 1.0]``), other values by ``repr``; cut
    between words at about ``limit`` characters (``ir.errors.shorten``). O(limit)."""
    if isinstance(value, torch.Tensor):
        head = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        if value.device.type == "meta" or value.layout != torch.strided:
            return f"{head} on {value.device}"
        flat = ", ".join(repr(x) for x in value.detach().reshape(-1)[:16].cpu().tolist())
        more = ", ..." if value.numel() > 16 else ""
        return shorten(f"{head} [{flat}{more}]", limit)
    if isinstance(value, (tuple, list)):
        inner = ", ".join(format_value(v, limit) for v in value)
        return shorten(f"({inner})" if isinstance(value, tuple) else f"[{inner}]", limit)
    return shorten(repr(value), limit)


def describe(program: Program, *, vals: bool = True) -> str:
    """``format_program(program, vals=vals)`` and, for nodes that carry one, their module
    stack."""
    lines = [format_program(program, vals=vals)]
    stacks = []
    for path, mid in program.walk():
        for i, graph in enumerate(program.modules[mid].graphs):
            for node in graph.nodes:
                stack = node.meta.get("nn_module_stack")
                if stack and len(stack) > 1:
                    calls = " > ".join(_call_name(k, v) for k, v in stack.items() if v[0])
                    stacks.append(f"    {path or '<root>'} graph {i} %{node.name}: {calls}")
        if stacks:
            break  # a flat program: the root's stacks are the whole story
    if stacks:
        lines.append("  module stacks:")
        lines += stacks
    return "\n".join(lines)


def _call_name(key: str, entry: Any) -> str:
    _, _, n = key.rpartition("@")
    return entry[0] + (f"@{n}" if "@" in key and n.isdigit() else "")


def pass_name(pass_fn: Any) -> str:
    """How a law's message names ``pass_fn``: its qualified name, else its ``repr``."""
    return getattr(pass_fn, "__qualname__", None) or getattr(pass_fn, "__name__", None) or repr(
        pass_fn
    )
