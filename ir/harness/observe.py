"""What a law observes of one run, and the one comparison of two runs: the law runner's core.

Every law that runs two sides (``lowering.pass_laws.check_semantics``: the input program and the
pass's result; ``check_rule``: the pattern and the rewritten pattern; ``check_rule_in_context``:
a program and its rewrite) describes each run as an :class:`Observed` (outputs, inputs after
the call, state after the call, and which outputs alias which inputs, state or earlier outputs,
seen before anything is copied) and judges the pair with :func:`observed_difference`, under a
:class:`Law`: a value saying what that law observes and how its messages name the wanted side.
The difference is a structured ``ir.harness.Difference`` (which output, input or state, the path
into it, each side's account), never a patched string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from ir.harness.compare import Difference, find_difference

OBSERVABLES = frozenset({"outputs", "inputs", "state", "aliasing"})
"""What a law may observe of a run."""

MISSING = type("Missing", (), {"__repr__": lambda self: "<missing>"})()
"""A state fqn a run does not have."""


@attrs.frozen
class Law:
    """A law as a value: ``name``; ``observes``, the part of :data:`OBSERVABLES` it compares;
    ``wanted``, how a value sentence names the wanted side (``"want"``, ``"the pattern gives"``,
    ``"the original gives"``); ``side``, the wanted side's name in an aliasing sentence
    (``"the pattern's result is"``)."""

    name: str
    observes: frozenset[str] = OBSERVABLES
    wanted: str = "want"
    side: str = "the wanted side's result is"
    fresh_may_alias: bool = False
    """Whether an output fresh on the wanted side may alias on the other (``check_rule``: the
    engine's ``alias`` and ``shared`` guards take such a replacement only where nothing writes
    either value and no caller sees both); an alias lost is a difference unless
    ``alias_may_be_fresh``."""
    alias_may_be_fresh: bool = False
    """Whether an output that aliases on the wanted side may be fresh on the other
    (``check_laws``' semantics law: a pass may copy a view it returns, a caller writing the
    output then no longer writes the input; a new alias is a difference either way)."""
    repeated_outputs: bool = False
    """Whether an output fresh on the wanted side may be the very same tensor as an earlier
    output on the other (``check_laws``' semantics law: ``cse`` merges two outputs that compute
    one value, and the result's signature shows it, two output specs naming one value); a view
    of another output, or of an input or state, is still a difference."""

    def __attrs_post_init__(self) -> None:
        if not self.observes <= OBSERVABLES:
            raise ValueError(f"a law observes a part of {sorted(OBSERVABLES)}, got "
                             f"{sorted(self.observes)}")


@attrs.frozen
class Observed:
    """One run of one side: ``outputs`` (one item per output), ``inputs`` (the arguments after
    the call, one item per input), ``state`` (fqn -> value after the call, :data:`MISSING` for
    one the run lacks), ``aliasing`` (per output, the names of the inputs, state and earlier
    outputs it shares storage with: ``"input 0"``, ``"state 'w'"``, ``"output 1"``).
    Built by :func:`observe`, which reads aliasing before a caller copies anything."""

    outputs: tuple
    inputs: tuple = ()
    state: Mapping[str, Any] = attrs.field(factory=dict)
    aliasing: tuple = ()
    repeats: tuple = ()
    """Per output, the names (``"output 0"``) of the earlier outputs that are the very same
    object (a program returning one value twice); a part of its ``aliasing``."""


def observe(outputs: Sequence, inputs: Sequence = (), state: Mapping[str, Any] | None = None,
            ) -> Observed:
    """The :class:`Observed` of one run, its aliasing read from the objects given (call it on
    the run's own results, before copying them): an output's aliasing names each input, state
    tensor and earlier output it :func:`shares_storage` with, its repeats each earlier output
    that is the same tensor object. O(outputs + inputs + state), each looked up by storage."""
    outputs, inputs, state = tuple(outputs), tuple(inputs), dict(state or {})
    on_storage: dict[int, list[str]] = {}  # a storage's address -> the names on it so far
    for name, x in [(f"input {i}", x) for i, x in enumerate(inputs)] + [
            (f"state {f!r}", x) for f, x in sorted(state.items())]:
        _add(on_storage, _storage_of(x), name)
    same_object: dict[int, list[str]] = {}  # an output tensor's id -> the outputs it is
    aliasing, repeats = [], []
    for k, out in enumerate(outputs):
        storage = _storage_of(out)
        aliasing.append(frozenset(on_storage.get(storage, ())) if storage is not None
                        else frozenset())
        tensor = isinstance(out, torch.Tensor)
        repeats.append(frozenset(same_object.get(id(out), ())) if tensor else frozenset())
        _add(on_storage, storage, f"output {k}")
        if tensor:
            same_object.setdefault(id(out), []).append(f"output {k}")
    return Observed(outputs, inputs, state, tuple(aliasing), tuple(repeats))


def _storage_of(x: Any) -> int | None:
    """What :func:`shares_storage` compares of ``x``: its storage's address, or ``None`` where
    it shares with nothing (not a tensor, empty, ``meta``, or of a layout without one storage:
    sparse)."""
    if (not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.numel() == 0
            or x.device.type == "meta"):
        return None
    return x.untyped_storage().data_ptr()


def _add(on_storage: dict[int, list[str]], storage: int | None, name: str) -> None:
    if storage is not None:
        on_storage.setdefault(storage, []).append(name)


def shares_storage(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are tensors on one storage at run time (a view of the other,
    both views of one base, or one tensor): the one run-time aliasing question, which
    :func:`observe` asks of every output and every law reads from its ``aliasing``. Never for
    a non-tensor, an empty tensor, a ``meta`` tensor or a sparse one (no storage to share).
    O(1)."""
    sa = _storage_of(a)
    return sa is not None and sa == _storage_of(b)


def observed_difference(
    got: Observed,
    want: Observed,
    law: Law,
    *,
    assumes: frozenset[str] = frozenset(),
    reference: Observed | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    outputs: str = "outputs",
    written: frozenset[str] = frozenset(),
) -> Difference | None:
    """The first difference between two runs as ``law`` observes them, or ``None``.

    ``written``: the inputs and state (``"input 0"``, ``"state 'w'"``) the wanted side wrote
    in place; an output may alias one of them where the wanted side's was fresh (after
    ``x.add_(1); return x`` eager returns ``x`` itself; its values are compared all the same).

    In order: the number of outputs, each output's value (``find_difference``: position by
    position at the result dtype's tolerance, or ``atol``/``rtol``, as ``assumes`` relaxes it;
    ``reference``, the wanted side run in float64, under ``reassociate``), each input after the
    call, each state fqn (missing on one side only is a difference), then aliasing: an output
    that aliases an input, state or earlier output on one side and not on the other (as the
    law's ``fresh_may_alias``, ``alias_may_be_fresh`` and ``repeated_outputs`` allow).
    ``outputs`` names the outputs in the sentence (``"outputs (against the reference's)"``).

    Laws: ``observed_difference(o, o, law) is None`` for every ``o`` (NaN equals NaN); only
    what ``law.observes`` is compared. Complexity: O(elements).
    """
    tol = {"assumes": assumes, "atol": atol, "rtol": rtol}
    ref = reference or Observed(())
    seen = law.observes
    if "outputs" in seen:
        if len(got.outputs) != len(want.outputs):
            return Difference(outputs, (), f"{len(got.outputs)}", f"{len(want.outputs)}",
                              law.wanted)
        for k, (g, w) in enumerate(zip(got.outputs, want.outputs)):
            found = find_difference(g, w, what=outputs, reference=_at(ref.outputs, k), **tol)
            if found:
                return _under(found, (k,), law)
    if "inputs" in seen:
        for i, (g, w) in enumerate(zip(got.inputs, want.inputs)):
            found = find_difference(g, w, what="inputs after the call",
                                    reference=_at(ref.inputs, i), **tol)
            if found:
                return _under(found, (i,), law)
    if "state" in seen:
        for fqn in sorted(want.state):
            g, w = got.state.get(fqn, MISSING), want.state[fqn]
            if (g is MISSING) != (w is MISSING):
                return Difference(f"state {fqn!r}", (), "missing" if g is MISSING else "present",
                                  "missing" if w is MISSING else "present", law.wanted)
            if w is not MISSING:
                found = find_difference(g, w, what=f"state {fqn!r}",
                                        reference=_at(ref.state, fqn), **tol)
                if found:
                    return attrs.evolve(found, wanted=law.wanted)
    if "aliasing" in seen:
        for k, (g, w) in enumerate(zip(got.aliasing, want.aliasing)):
            new = g - w - written
            if law.repeated_outputs and k < len(got.repeats):
                new -= got.repeats[k]
            if (w - g and not law.alias_may_be_fresh) or (new and not law.fresh_may_alias):
                return Difference(outputs, (k,), _alias_words(g - w, "an alias of"),
                                  _alias_words(w - g, "an alias of"), law.side)
    return None


def _alias_words(names: frozenset[str], lead: str) -> str:
    return f"{lead} {', '.join(sorted(names))}" if names else "fresh"


def _under(found: Difference, prefix: tuple, law: Law) -> Difference:
    return attrs.evolve(found, path=prefix + found.path, wanted=law.wanted)


def _at(items: Any, key: Any) -> Any:
    try:
        return items[key]
    except (IndexError, KeyError, TypeError):
        return None


__all__ = [
    "MISSING", "OBSERVABLES", "Law", "Observed", "observe", "observed_difference",
    "shares_storage",
]
