"""``Stages``: a Program cut into pipeline stages, as a value (``transforms.split_stages``
builds it; ``lowering.stage_modules`` builds torch objects from it)."""

from __future__ import annotations

from typing import Any

import attrs

from ir.memo import memoized
from ir.program import Program


@attrs.frozen
class Edge:
    """One value passed from stage ``src`` to stage ``src + 1``: the value ``name`` (its node
    name in the flat program), made in stage ``origin`` (``origin < src`` for a relay), at
    position ``index`` of stage ``src``'s outputs and stage ``src + 1``'s positional inputs;
    ``grad``: whether it *may* carry a gradient back: every floating-point (or complex) value
    may, integer and bool values never do. Whether one does is decided at run time (which
    parameters require grad then), never from export-time ``requires_grad``."""

    name: str
    src: int
    origin: int
    index: int
    grad: bool = True

    @property
    def dst(self) -> int:
        """The stage that receives the value: ``src + 1``."""
        return self.src + 1


@attrs.frozen
class Stages:
    """The result of ``split_stages``.

    - ``programs``: one outlined Program per stage (``lower`` / ``export_ep`` take each);
    - ``at``: the module paths that begin stages ``1 .. n-1``;
    - ``inputs``: per stage, the names of its positional inputs in order (stage 0: program
      inputs; stage ``k > 0``: the edges from ``k - 1``);
    - ``root_inputs``: the program inputs every stage takes by keyword, in program order;
    - ``edges``: every edge, by source stage then position;
    - ``state``: per stage, the state fqns it holds, in the program's registration order;
    - ``modules``: per stage, the module paths whose calls run there, in module order;
    - ``shared``: fqn -> the stages holding a copy of its tensor (only tensors in 2+ stages);
      a tied group lists each of its fqns with the stages of the whole group;
    - ``source``: the flat program that was split (its state order and tensors, for merging);
    - ``out_spec``: the program's output pytree spec (the last stage returns it);
    - ``balance``: the measure ``split_stages(n=..., balance=...)`` balanced (``"params"`` or
      ``"flops"``), ``""`` for a split ``at`` given paths;
    - ``params``: per stage, the bytes of the distinct state tensors it holds;
    - ``flops``: per stage, its estimated FLOPs (``transforms.stages.balance.node_flops``).
    """

    programs: tuple[Program, ...]
    at: tuple[str, ...]
    inputs: tuple[tuple[str, ...], ...]
    root_inputs: tuple[str, ...]
    edges: tuple[Edge, ...]
    state: tuple[tuple[str, ...], ...]
    modules: tuple[tuple[str, ...], ...]
    shared: Any
    source: Program = attrs.field(repr=False)
    out_spec: Any = attrs.field(repr=False)
    balance: str = ""
    params: tuple[int, ...] = ()
    flops: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.programs)

    def edges_from(self, k: int) -> tuple[Edge, ...]:
        """The edges from stage ``k`` to stage ``k + 1``, in position order. O(edges)."""
        return tuple(e for e in self.edges if e.src == k)

    def owner(self, fqn: str, k: int) -> str | None:
        """The fqn under which stage ``k`` holds the tensor of ``fqn`` (itself or a tied fqn),
        or ``None`` when stage ``k`` holds no copy of it. O(1) after the first call (a table
        per Stages value, built once in O(state))."""
        return self._holders.get((self.source.slot(fqn).tensor, k))

    @memoized
    def _holders(self) -> dict[tuple[str, int], str]:
        table = self.source.state_table()
        found: dict[tuple[str, int], str] = {}
        for k, fqns in enumerate(self.state):
            for f in fqns:
                found.setdefault((table[f].tensor, k), f)
        return found


__all__ = ["Edge", "Stages"]
