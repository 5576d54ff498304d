"""``LawViolation``, the error every purefx law check raises, and ``describe``, how it prints the
program at fault. Its own module, inside the ``transforms`` layer, so that a pass's own law
(``transforms.rewrite.check``) raises the same error as ``lowering.laws`` without importing a
module that lowers programs."""

from __future__ import annotations

from typing import Any

from ir.printer import format_program
from ir.program import Program


class LawViolation(AssertionError):
    """A pass broke a law: ``law`` names it, ``detail`` says how, ``program`` is the input."""

    def __init__(self, law: str, pass_fn: Any, detail: str, program: Program | None) -> None:
        self.law = law
        self.pass_name = pass_name(pass_fn)  # the attribute that the messages read
        self.detail = detail
        self.program = program
        text = f"law {law!r} broken by {self.pass_name}: {detail}"
        if program is not None:
            text += "\n\ninput program:\n" + describe(program)
        super().__init__(text)


def describe(program: Program) -> str:
    """``format_program(program)`` and, for nodes that carry one, their module stack."""
    lines = [format_program(program)]
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
