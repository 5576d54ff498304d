"""What a run of generated programs reached: which operators of the verified table
(``ir.opset.table()``) they call, and which opset features they show.

``coverage_of(program)`` observes one program; :class:`CoverageLog` collects it over every
program a strategy draws, e.g. a ``check_laws`` run::

    log = CoverageLog()
    check_laws(my_pass, programs=log.track(programs()))
    print(log.coverage)            # "23 of 312 operators of the table (7%), features: ..."
    log.coverage.missing()         # the rows no program called

Features are observed in the program itself, not read from the generator, so the same log
works on ``programs_like(ep)`` and on mapped strategies. A feature is shown where:

- ``opset``: an operator of the table outside the fixed vocabulary of ``programs()`` is called;
- ``strided_inputs`` / ``channels_last``: an operator reads a strided view of an input (a
  ``permute`` or ``as_strided`` of a placeholder) that is not contiguous (channels-last strides
  of a 4-d value for the second);
- ``integer_values`` / ``bool_values``: an operator reads an integer / bool tensor that is not
  an index constant of exact values (``opset_c*``);
- ``low_precision``: an operator other than a cast reads a ``float16`` / ``bfloat16`` tensor;
- ``train_norms``: a norm of the table writes its running statistics (``ir.opset.written_at``);
- ``inplace_variants``: another operator of the table writes an argument: one outside the fixed
  vocabulary's in-place ops (``add_``, ``sub_``, ``mul_``, ``relu_``, ``copy_``), or any of
  them writing a buffer the opset steps made (``opset_b*``);
- ``random_ops``: a random operator of the table is called;
- ``core_level``: an operator outside the fixed vocabulary that only core aten has (not the
  training IR) is called;
- ``symbolic_sizes``: a value has a symbolic size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import torch
from hypothesis import strategies as st

from ir.args import Ref
from ir.node import CALL_FUNCTION, PLACEHOLDER
from ir.opset import entry, table, written_at
from ir.program import Program

__all__ = ["FIXED_VOCABULARY", "Coverage", "CoverageLog", "coverage_of"]

FIXED_VOCABULARY = frozenset({
    "aten.relu.default", "aten.neg.default", "aten.tanh.default", "aten.sigmoid.default",
    "aten.gelu.default", "aten.silu.default", "aten.rand_like.default", "aten.randn_like.default",
    "aten.rand.default", "aten.arange.default", "aten.ones.default", "aten.full.default",
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.add_.Tensor",
    "aten.sub_.Tensor", "aten.mul_.Tensor", "aten.relu_.default", "aten.div.Tensor",
    "aten.pow.Tensor_Scalar", "aten.clone.default", "aten.copy_.default", "aten.matmul.default",
    "aten.mm.default", "aten.t.default", "aten.linear.default", "aten.mean.dim",
    "aten.sort.default", "aten._to_copy.default",
    # the layout nodes of the opset steps' strided inputs
    "aten.permute.default", "aten.as_strided.default",
})
"""The operators ``programs()`` calls without the ``opset`` feature (and the layout views its
strided inputs are made with)."""

_LOW = (torch.float16, torch.bfloat16)


@attrs.frozen
class Coverage:
    """What some programs reached: ``operators``, the table rows they call; ``features``, the
    opset features they show (module docstring); ``programs``, how many were seen."""

    operators: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    programs: int = 0

    def __or__(self, other: Coverage) -> Coverage:
        return Coverage(self.operators | other.operators, self.features | other.features,
                        self.programs + other.programs)

    def fraction(self) -> float:
        """The share of the table's rows reached (0 for an empty table)."""
        rows = table()
        return len(self.operators & rows.keys()) / len(rows) if rows else 0.0

    def missing(self) -> tuple[str, ...]:
        """The table's rows no program called, sorted."""
        return tuple(sorted(set(table()) - self.operators))

    def __str__(self) -> str:
        return (f"{len(self.operators)} of {len(table())} operators of the table "
                f"({self.fraction():.0%}) in {self.programs} programs; features: "
                f"{', '.join(sorted(self.features)) or 'none'}")


def coverage_of(program: Program) -> Coverage:
    """What ``program`` reaches (every graph of it). O(nodes x arguments)."""
    ops: set[str] = set()
    features: set[str] = set()
    for module in program.modules.values():
        for graph in module.graphs:
            _observe(graph, ops, features)
    return Coverage(frozenset(ops), frozenset(features), 1)


def _observe(graph: Any, ops: set[str], features: set[str]) -> None:
    kind: dict[str, str] = {}
    for node in graph.nodes:
        kind[node.name] = node.op if node.op != CALL_FUNCTION else "computed"
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape):
            features.add("symbolic_sizes")
        if node.op != CALL_FUNCTION:
            continue
        name = str(node.target)
        row = entry(node.target)
        if row is None:
            continue
        ops.add(name)
        new = name not in FIXED_VOCABULARY
        if new:
            features.add("opset")
        if row.random:
            features.add("random_ops")
        if new and row.levels and "training" not in row.levels:
            features.add("core_level")
        written = written_at(row, tuple(node.args)) if row.writes else ()
        if written and (new or any(_opset_buffer(node.args[i]) for i in written
                                   if i < len(node.args))):
            features.add("train_norms" if "norm" in name else "inplace_variants")
        for r in node.inputs():
            read = graph.node(r.name).meta.get("val") if r.name in kind else None
            if not isinstance(read, torch.Tensor):
                continue
            if read.dtype in _LOW and name != "aten._to_copy.default":
                features.add("low_precision")
            if not _index_constant(graph, r.name):
                if read.dtype == torch.bool:
                    features.add("bool_values")
                elif not (read.dtype.is_floating_point or read.dtype.is_complex):
                    features.add("integer_values")
            if _layout_view(graph, r.name) and not read.is_contiguous():
                four = read.dim() == 4 and read.is_contiguous(memory_format=torch.channels_last)
                features.add("channels_last" if four else "strided_inputs")


def _layout_view(graph: Any, name: str) -> bool:
    """``name`` is a ``permute`` / ``as_strided`` of a placeholder: a strided input as the
    opset steps make one (the fixed vocabulary makes none)."""
    node = graph.node(name)
    if node.op != CALL_FUNCTION or str(node.target) not in _LAYOUT:
        return False
    return graph.node(node.args[0].name).op == PLACEHOLDER


_LAYOUT = ("aten.permute.default", "aten.as_strided.default")


def _opset_buffer(arg: Any) -> bool:
    """``arg`` reads a buffer the opset steps made (``opset_b``)."""
    return isinstance(arg, Ref) and "opset_b" in arg.name


def _index_constant(graph: Any, name: str) -> bool:
    """``name`` is a tensor constant of exact values the opset steps made (``opset_c``)."""
    node = graph.node(name)
    return node.op == PLACEHOLDER and "opset_c" in name


class CoverageLog:
    """Collects :func:`coverage_of` over the programs a strategy draws (``track``); the
    running total is ``coverage``. Not thread-safe; one log per run."""

    def __init__(self) -> None:
        self.coverage = Coverage()

    def note(self, program: Program) -> None:
        """Add ``program`` (a ``LikeExample``'s ``program``) to the total."""
        self.coverage = self.coverage | coverage_of(getattr(program, "program", program))

    def track(self, strategy: st.SearchStrategy) -> st.SearchStrategy:
        """``strategy`` drawing the same examples, each noted on the way (the shrink phase's
        examples too)."""

        def noted(drawn: Any) -> Any:
            self.note(drawn)
            return drawn

        return strategy.map(noted)

    def extend(self, programs: Iterable[Program]) -> None:
        """Note each of ``programs``."""
        for p in programs:
            self.note(p)
