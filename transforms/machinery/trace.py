"""Tracing PyTorch functions into IR graphs, at the level of the program they go into: a rewrite
rule's pattern and replacement (``transforms.rewrite``), the functions an ``Edit`` calls
(``transforms.edit``). It sits below both: the editor needs it and the rewrite package, which
builds on the editor, needs it too.

A rule's pattern and replacement are plain PyTorch functions of tensors and Python scalars. Each is
exported (``torch.export.export`` of a small wrapper module, ``run_decompositions()`` for programs
at the core aten level) and imported with ``ir.import_ep``; the root graph is the traced function.
Tensor arguments become placeholders (the pattern's wildcards). A float argument (and an int one
where tracing allows it) is passed as a *sentinel*, an unlikely value that the traced graph then
holds as a literal wherever the function used the argument: the matcher treats that literal as a
scalar wildcard, compared by value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from ir import ops
from ir.errors import PassError, PurefxError, first_line
from ir.fake_run import RefusedGuard
from ir.graph import Graph
from ir.import_ep import import_ep
from ir.memo import NOT_COMPUTED, BoundedMemo
from ir.node import CALL_FUNCTION, GET_ATTR, OUTPUT, PLACEHOLDER, Node
from ir.torch_seam import fake_failures_unlogged

TRAINING = "training"  #: the training IR that ``torch.export.export`` gives
CORE = "core"  #: core aten, after ``ExportedProgram.run_decompositions()``
LEVELS = (TRAINING, CORE)

_FLOAT_SENTINEL = 0.7316402859
_INT_SENTINEL = 7919


@attrs.frozen
class Traced:
    """One function traced at one level.

    - ``graph``: the root graph of the traced program (placeholders are the tensor arguments, in
      order; no state);
    - ``tensor_args``: for each placeholder, the position of the function argument it stands for;
    - ``sentinels``: ``((position, sentinel value), ...)`` for the scalar arguments passed as
      sentinels; other scalar arguments were traced with their example value (a literal);
    - ``outputs``: the returned refs or literals, a tuple (one entry per result).
    """

    graph: Graph
    tensor_args: tuple[int, ...]
    sentinels: tuple[tuple[int, Any], ...]
    outputs: tuple

    def compute_nodes(self) -> tuple[Node, ...]:
        """The nodes that compute, in graph order."""
        return tuple(n for n in self.graph.nodes if n.op not in (PLACEHOLDER, OUTPUT, GET_ATTR))


def sentinel_for(position: int, value: Any, salt: int = 0) -> Any:
    """The sentinel passed for scalar argument ``position`` whose example is ``value``; another
    ``salt`` gives another set of sentinels (to see whether a function computes on them)."""
    if isinstance(value, float):
        return _FLOAT_SENTINEL + 0.0137 * position + 0.00391 * salt
    return _INT_SENTINEL + 101 * position + 7 * salt


def is_scalar(value: Any) -> bool:
    """A Python ``int`` or ``float`` (not ``bool``): a rule argument that may be a wildcard."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def trace(
    fn: Callable, example_inputs: Sequence[Any], level: str, rule: str, role: str,
    *, sentinels: bool = True, salt: int = 0, literal: frozenset[int] = frozenset(),
    dynamic: Sequence[Any] | None = None,
) -> Traced:
    """Trace ``fn(*example_inputs)`` at ``level`` (``TRAINING`` or ``CORE``).

    Raises ``PassError`` naming the rule and the role (``pattern``/``replacement``) when the
    function cannot be exported, reads state, or returns something other than tensors.
    Scalars: each float argument is traced as a sentinel; each int argument too when tracing
    with a sentinel succeeds (an int used as a size or dimension is kept as its example value).
    ``literal``: argument positions traced with their example value, never a sentinel (a
    rule's hyperparameters, located in the trace by that value). ``dynamic``: for each tensor
    argument, in order, its ``torch.export`` dynamic shape (a tuple, per dimension a
    ``torch.export.Dim`` or ``None``); the trace then holds at every size in those ranges, and
    a function that fixes one raises (``fixed_sizes`` reads which). Each trace runs in the fake
    mode and shape env of its own export: the programs a rule rewrites are never written.

    **Laws:** deterministic (same function, inputs and level: equal graphs); ``example_inputs``
    are not written (tensors are cloned before export). Cost: one or two ``torch.export``
    calls (plus ``run_decompositions`` at ``CORE``); none for a call traced before, and no
    export for ``CORE`` after the same call at ``TRAINING`` (``_MEMO``: the same function,
    tensors of the same sizes, strides, dtypes and devices, the same other arguments).
    """
    if level not in LEVELS:
        raise PassError(f"rule {rule!r}: unknown level {level!r}; expected one of {LEVELS}")
    scalars = [i for i, v in enumerate(example_inputs) if is_scalar(v) and i not in literal]
    floats = [i for i in scalars if isinstance(example_inputs[i], float)]
    ints = [i for i in scalars if i not in floats]
    attempts = [floats + ints, floats] if ints else [floats]
    if not sentinels:
        attempts = [[]]
    error: Exception | None = None
    for as_sentinel in attempts:
        try:
            return _trace(fn, example_inputs, level, as_sentinel, salt, dynamic)
        except PurefxError:
            raise
        except Exception as exc:  # noqa: BLE001 - torch's export errors share no base class
            error = exc
    raise PassError(
        f"rule {rule!r}: its {role} cannot be traced with torch.export ({type(error).__name__}: "
        f"{first_line(error)}); write it as a function of tensors and Python scalars that "
        "torch.export can trace, and give example_inputs it runs on"
    ) from error


def _trace(
    fn: Callable, example_inputs: Sequence[Any], level: str, as_sentinel: list[int], salt: int,
    dynamic: Sequence[Any] | None = None,
):
    tensor_args = tuple(i for i, v in enumerate(example_inputs) if isinstance(v, torch.Tensor))
    sentinels = tuple(
        (i, sentinel_for(i, example_inputs[i], salt)) for i in sorted(as_sentinel)
    )
    fixed = list(example_inputs)
    for i, s in sentinels:
        fixed[i] = s

    class RuleFunction(torch.nn.Module):
        def forward(self, *tensors: torch.Tensor) -> Any:
            args = list(fixed)
            for i, t in zip(tensor_args, tensors):
                args[i] = t
            return fn(*args)

    # distinct tensors: export would read one tensor passed twice as one input
    tensors = tuple(example_inputs[i].detach().clone() for i in tensor_args)
    key = None if dynamic is not None else _memo_key(fixed, tensors, tensor_args)
    found = _recall(key, level, fn)
    if found is not None:
        return found
    with fake_failures_unlogged():  # a failure is the caller's answer (declined or refused)
        ep = _recall(key, "export", fn)
        if ep is None:
            shapes = None if dynamic is None else (tuple(dynamic),)  # the one ``*tensors``
            ep = torch.export.export(RuleFunction(), tensors, dynamic_shapes=shapes)
            _keep(key, "export", fn, ep)
        if level == CORE:
            ep = ep.run_decompositions()  # a new program: the kept export is not written
    program = import_ep(ep)
    if program.state:
        raise PassError(
            f"the traced function reads state {sorted(program.state)}; a rule's functions take "
            "every tensor they use as an argument"
        )
    graph = program.root_module.graph
    outputs = graph.outputs
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    traced = Traced(graph, tensor_args, sentinels, outputs)
    _keep(key, level, fn, traced)
    return traced


_MEMO: BoundedMemo[Any] = BoundedMemo(512)
"""The traces made, and the training-level exports they came from: per function, (what is
kept, the memo key) -> the trace or export. A bounded memo (``ir.memo.BoundedMemo``, at most
512 entries, emptied when full, as ``ir.ops.facts`` keeps its memo), keyed by the function's
identity (held here, so no other function takes its id) and what ``torch.export`` reads of
the call: the tensors' sizes, strides, dtypes and devices (never their values: export runs on
fake tensors) and the other arguments' values as passed (sentinels included), with the grad
mode and the default dtype. A hit and a miss answer alike: a trace is deterministic and
immutable, and ``run_decompositions`` returns a new program without writing the export it
decomposes, so the two levels of one call share its export. What makes one trace for two rules
with the same function and examples (a copy made with ``attrs.evolve``, a rule built again by
each test), for the pattern at ``CORE`` and as written, and for ``sizes.pattern_at`` at both
levels. An entry of a conv and batch-norm pattern holds about 75 KB (its fake values are
metadata only): the memo stays under about 40 MB. A function is taken to compute from its
arguments alone (a rule's functions must): one that reads a global changed between two calls
keeps its first trace."""


def _memo_key(fixed: list, tensors: tuple, tensor_args: tuple) -> tuple | None:
    """What a trace reads of its call besides the function (``_MEMO``'s owner), as a hashable
    key; ``None`` where an argument is not a plain value (a tensor inside a list, an object
    whose ``repr`` may not say all it holds): such a call is traced every time.
    O(arguments x rank)."""
    metas = tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in tensors)
    if any(type(n) is not int for shape, stride, _, _ in metas for n in (*shape, *stride)):
        return None  # a symbolic size: its range lives in a shape env
    positions = set(tensor_args)
    plain = tuple(_plain(v) for i, v in enumerate(fixed) if i not in positions)
    if any(p is None for p in plain):
        return None
    # what else export reads from the process: grad mode, the default dtype (a Python float
    # made a tensor inside ``fn``)
    ambient = (torch.is_grad_enabled(), torch.get_default_dtype())
    return (tensor_args, metas, plain, ambient)


_PLAIN_TYPES = (bool, int, float, str, type(None), torch.dtype, torch.device,
                torch.memory_format, torch.layout)


def _plain(value: Any) -> tuple | None:
    """``value`` as a key (its type's name and ``repr``, element by element in a tuple or
    list), or ``None`` when it is not a plain value."""
    if isinstance(value, (tuple, list)):
        items = tuple(_plain(v) for v in value)
        return None if any(i is None for i in items) else (type(value).__name__, items)
    if type(value) in _PLAIN_TYPES:
        return (type(value).__name__, repr(value))
    return None


def _recall(key: tuple | None, kind: str, fn: Callable) -> Any:
    """The ``kind`` kept for ``fn``'s call ``key``, or ``None`` (never a value kept)."""
    found = NOT_COMPUTED if key is None else _MEMO.get(fn, (kind, *key))
    return None if found is NOT_COMPUTED else found


def _keep(key: tuple | None, kind: str, fn: Callable, value: Any) -> None:
    if key is not None:
        _MEMO.put(fn, (kind, *key), value)


def fixed_sizes(exc: BaseException, dims: Mapping[str, Any]) -> RefusedGuard | None:
    """The sizes a function traced with ``dynamic`` fixed, when that is why ``exc`` (what
    ``trace`` raised) was raised: torch.export's constraint violation, read as a
    ``RefusedGuard`` (its first reason as ``text``, the names of ``dims`` it mentions as
    ``symbols``); ``None`` for another error. O(length of the message)."""
    cause: BaseException | None = exc
    while cause is not None and (
        isinstance(cause, PurefxError) or "Constraints violated" not in str(cause)
    ):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None
    lines = [ln.strip() for ln in str(cause).splitlines()]
    reason = next((ln[2:] for ln in lines if ln.startswith("- ")), lines[0] if lines else "")
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(cause)))
    reason = reason.split(". If ")[0].rstrip(".")  # torch's advice on mark_dynamic: not ours
    return RefusedGuard(reason, tuple(d for d in dims if d in words))


def level_of(graphs: Sequence[Graph]) -> str:
    """``TRAINING`` when some node calls an aten operator that core aten lacks (``linear``,
    ``softmax.int``, ``matmul``, ...), else ``CORE``.

    **Laws:** ``level_of`` of a program from ``run_decompositions()`` is ``CORE``. O(nodes)."""
    for graph in graphs:
        for node in graph.nodes:
            if node.op == CALL_FUNCTION and not ops.is_core_aten(node.target):
                return TRAINING
    return CORE


__all__ = [
    "CORE",
    "LEVELS",
    "TRAINING",
    "Traced",
    "fixed_sizes",
    "is_scalar",
    "level_of",
    "sentinel_for",
    "trace",
]
