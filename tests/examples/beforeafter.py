"""Before/Expected programs as text, for the example tests of each pass (TVM's shape).

``program(text)`` is ``ir.parse_program`` plus the node meta that some passes read and the text
does not carry: a node line may end in a comment

- ``# stack: a, a.b@1``: its ``nn_module_stack``, module paths outermost first (the root entry is
  added); ``@k`` marks the k-th call of that module (stack key ``path@k``), as export writes it;
- ``# tag: ro``: its ``tag`` (what ``split_by_tags`` reads); ``# tag: ro; tensor`` also marks the
  node's value a tensor (meta ``type``, what ``move_non_tensor_nodes_on_boundary`` reads);
- ``# tensor``: only that mark.

When a text has stack comments, a computing node without one runs in the root.

The module type in a stack entry is the type printed for that path's module (``?`` if none).
"""

from __future__ import annotations

import re
from types import MappingProxyType

import torch

from ir import Program, parse_program

_ANNOTATED = re.compile(r"^(\s+%(\w+) = .*?)\s+#\s*(stack|tag|tensor)\b:?\s*(.*)$")


def program(text: str, like: Program | None = None) -> Program:
    """Parse ``text`` (with ``like``'s tensors if given) and attach the annotated meta."""
    lines, notes = [], {}
    for line in text.splitlines():
        found = _ANNOTATED.match(line)
        if found:
            lines.append(found.group(1))
            notes[found.group(2)] = (found.group(3), found.group(4).strip())
        else:
            lines.append(line)
    parsed = parse_program("\n".join(lines), like=like)
    if not notes:
        return parsed
    root_type = parsed.root_module.type_name or "?"
    stacks = any(kind == "stack" for kind, _ in notes.values())
    modules = dict(parsed.modules)
    for mid, mod in parsed.modules.items():
        graphs = []
        for graph in mod.graphs:
            nodes = []
            for node in graph.nodes:
                note = notes.get(node.name)
                if note is None and stacks and node.op in ("call_function", "call_method"):
                    note = ("stack", "")
                if note is not None:
                    node = node.replace(meta=MappingProxyType(_meta(parsed, root_type, *note)))
                nodes.append(node)
            graphs.append(graph.of(nodes))
        modules[mid] = mod.replace(graphs=tuple(graphs))
    return parsed.replace(modules=parsed.modules.update(modules))


def _meta(p: Program, root_type: str, kind: str, value: str) -> dict:
    if kind == "tensor":
        return {"type": torch.Tensor}
    if kind == "tag":
        tag, _, mark = (part.strip() for part in value.partition(";"))
        return {"tag": tag, "type": torch.Tensor} if mark == "tensor" else {"tag": tag}
    stack = {"L__self__": ("", root_type)}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        path, _, k = entry.partition("@")
        mid = p.resolve(path)
        type_name = (p.modules[mid].type_name if mid is not None else None) or "?"
        stack[entry if k and k != "0" else path] = (path, type_name)
    return {"nn_module_stack": stack}
