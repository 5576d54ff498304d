"""Which module paths are one module object.

A module reused under two names (``self.b = self.a``, the same block at two positions of a
``Sequential``) owns the same state under both paths: every state fqn below one path has a twin
below the other that names the same tensor. torch.export keeps that aliasing in the state dict,
so it is the main evidence used here; strict export also records one identity key for a module
under every path it is called through, which is used too.

Tied weights alone are not sharing: two modules whose single tensor is tied (an embedding and a
bias-free head) stay two objects. So state evidence needs at least two tied tensors; a shared
module with a single tensor and no identity key stays two objects sharing that tensor, and a
module without state cannot be told from a copy. Both are harmless: nothing else is shared.
"""

from __future__ import annotations

from ir.program import Program


def canonical_paths(program: Program, same_object: dict[str, str]) -> dict[str, str]:
    """``{path: canonical path}`` for every module path that is an alias of an earlier one.

    The canonical path is the first in registration order. Two paths are one module when the state
    below them is the same (same relative names and tensor keys, at least two tensors) and their
    classes do not differ, or when ``same_object`` (path -> identity key) gives them one key.
    Complexity: O(S · d log S) for S state fqns of depth at most d.
    """
    state = program.state_table()
    if not same_object and len({slot.tensor for slot in state.values()}) == len(state):
        return {}  # no tensor under two fqns and no identity key: no evidence of sharing
    below: dict[str, list[tuple[str, str]]] = {}
    for fqn in program.state_order:
        key = state[fqn].tensor
        parts = fqn.split(".")
        for depth in range(1, len(parts)):
            below.setdefault(".".join(parts[:depth]), []).append((".".join(parts[depth:]), key))
    first_of: dict[tuple, list[str]] = {}
    canon: dict[str, str] = {}
    by_identity: dict[str, str] = {}
    for path, mid in program.walk():
        identity = same_object.get(path)
        if identity is not None and path not in canon:
            first = by_identity.setdefault(identity, path)
            if first != path:
                canon[path] = first
                continue
        entries = below.get(path)
        if not entries or len(entries) < 2 or path in canon:
            continue
        key = tuple(sorted(entries))
        candidates = first_of.setdefault(key, [])
        for other in candidates:
            if _compatible(program, other, path):
                canon[path] = other
                break
        else:
            candidates.append(path)
    return _with_descendants(program, canon)


def _with_descendants(program: Program, canon: dict[str, str]) -> dict[str, str]:
    """If ``b`` is ``a``, then ``b.x`` is ``a.x`` for every child path below it."""
    table = program.module_table()
    extended = dict(canon)
    for alias, canonical in canon.items():
        stack = [(alias, canonical)]
        while stack:
            here, there = stack.pop()
            mid = program.resolve(here)
            if mid is None:
                continue
            for name, _ in table[mid].children:
                child, twin = f"{here}.{name}", f"{there}.{name}"
                if program.resolve(twin) is not None and child not in extended:
                    extended[child] = twin
                    stack.append((child, twin))
    return extended


def _compatible(program: Program, a: str, b: str) -> bool:
    ta = program.module_table()[program.resolve(a)].type_name
    tb = program.module_table()[program.resolve(b)].type_name
    return ta is None or tb is None or ta == tb
