"""The private torch symbols that ``ir`` and ``transforms`` use: the one place they are reached.

torch makes no promise about a ``_``-prefixed module or attribute; any release may move or
change one. So no other module of ``ir`` or ``transforms`` imports or reads a private torch
symbol: each is named here once, with what purefx uses it for and how the supported releases
(torch 2.13, 2.14 and 2.15) differ in it. ``lowering/lowering_seam.py`` does the same for what only
lowering needs. ``tests/test_torch_seam.py`` checks every symbol against the installed torch
(it exists and behaves as purefx expects) and scans the sources for private torch symbols used
anywhere else.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx

# - pytree (torch.utils._pytree): the pytree registry and TreeSpec. purefx uses tree_flatten,
#   tree_flatten_with_path, tree_unflatten, tree_structure, tree_leaves, tree_map, TreeSpec,
#   treespec_leaf and the key classes (GetAttrKey, SequenceKey, MappingKey). Same API in
#   2.13-2.15 (a Python TreeSpec(type, context, children_specs) in each; since 2.13 the
#   ``children_specs`` field and ``LeafSpec`` warn as deprecated: purefx reads ``children()`` /
#   ``child(i)`` and builds leaves with ``treespec_leaf()``); torch has no public pytree module.
import torch.utils._pytree as pytree
from torch._higher_order_ops.effects import has_effects as _has_effects
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.fake_tensor import FakeTensorMode as _FakeTensorMode
from torch._subclasses.fake_tensor import unset_fake_temporarily as _unset_fake_temporarily
from torch.fx._pytree import tree_flatten_spec as torch_tree_flatten_spec
from torch.fx.node import _side_effectful_functions

try:  # 2.13-2.15: raised by ``ShapeEnv.error_on_new_guards``; absent, nothing raises it
    from torch.fx.experimental.symbolic_shapes import _ShapeEnvGuardError as ShapeEnvGuardError
except ImportError:  # pragma: no cover - a release without it: guards are not refused
    class ShapeEnvGuardError(RuntimeError):  # type: ignore[no-redef]
        """Never raised: this torch cannot refuse a guard."""
from torch.utils._pytree import TreeSpec

__all__ = [
    "HigherOrderOperator",
    "OpOverload",
    "OpOverloadPacket",
    "ShapeEnvGuardError",
    "TreeSpec",
    "active_fake_mode",
    "fake_failures_unlogged",
    "fake_of",
    "fresh_fake",
    "graph_codegen",
    "guard_failures_unlogged",
    "has_effects",
    "module_buffers",
    "module_children",
    "module_parameters",
    "new_fake",
    "new_fake_mode",
    "new_symbolic_size",
    "new_symbolic_sizes",
    "non_persistent_buffers",
    "op_schema",
    "opinfo_db",
    "packet_name",
    "pytree",
    "real_tensors",
    "refusing_new_guards",
    "size_symbols",
    "tensor_version",
    "torch_side_effectful",
    "torch_tree_flatten_spec",
]

# Documentation of the re-exported names (a class or function keeps its own docstring):
# - OpOverload (torch._ops): the class of ``torch.ops.<ns>.<op>.<overload>``: the node targets
#   that are operators. Same in 2.13-2.15.
# - OpOverloadPacket (torch._ops): ``torch.ops.<ns>.<op>`` without an overload. Same in 2.13-2.15.
# - HigherOrderOperator (torch._ops): ``cond``, ``while_loop``, ``with_effects``, ... : targets
#   whose arguments include graphs. Same in 2.13-2.15.
# - ShapeEnvGuardError (torch.fx.experimental.symbolic_shapes._ShapeEnvGuardError): what a
#   shape env raises, before it records anything, for a guard asked inside
#   ``refusing_new_guards``; its message is ``Guard attempted while ShapeEnv guards are frozen:
#   <expr> == <value>``. A ``RuntimeError`` subclass in 2.13-2.15.
# - TreeSpec (torch.utils._pytree): the structure of a pytree; the IR holds specs as values
#   (call signatures, arguments of the tree functions). Same in 2.13-2.15.
# - torch_tree_flatten_spec (torch.fx._pytree.tree_flatten_spec): torch's own flatten-against-a-
#   spec; IR graphs call ``ir.tree_calls.flatten_by_spec`` instead, which runs this. Same in
#   2.13-2.15.


def op_schema(target: Any) -> torch.FunctionSchema | None:
    """The ``FunctionSchema`` of an operator overload (``target._schema``): argument names, which
    arguments it writes (``is_mutable``), its return types; ``None`` for a target without one
    (a Python function, a higher-order op). Same in 2.13-2.15."""
    return getattr(target, "_schema", None)


def opinfo_db() -> list:
    """torch's OpInfo table (``torch.testing._internal.common_methods_invocations.op_db``):
    each operator with sample inputs, what the offline operator-table builder
    (``ir/opset_build.py``) exports to record the calls it makes. Imported on call (slow, and
    only the builder needs it). Same in 2.13-2.15 (an internal test module: entries come and
    go between releases)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def packet_name(packet: OpOverloadPacket) -> str:
    """The qualified name ``ns::op`` of an overload packet (``packet._qualified_op_name``), the
    name by which it is looked up again after pickling. Same in 2.13-2.15."""
    return packet._qualified_op_name


def has_effects(op: OpOverload) -> bool:
    """Whether torch threads an effect token through calls of ``op`` (``with_effects``): such a
    call may not be recomputed or reordered. ``torch._higher_order_ops.effects.has_effects``,
    ``(op) -> bool`` in 2.13-2.15."""
    return bool(_has_effects(op))


def torch_side_effectful(target: Any) -> bool:
    """Whether torch's dead-code elimination keeps ``target`` for its side effect
    (``torch.fx.node._side_effectful_functions``, a set torch's modules add to as they are
    imported: ``torch.distributed`` adds its send, receive and wait operators). Same in
    2.13-2.15."""
    try:
        return target in _side_effectful_functions
    except TypeError:  # unhashable
        return False


def module_children(module: torch.nn.Module) -> dict[str, torch.nn.Module | None]:
    """The live ``_modules`` table of ``module`` (direct children by name, ``None`` for an empty
    slot), read without ``named_children``'s deduplication. Same in 2.13-2.15."""
    return module._modules


def module_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter | None]:
    """The live ``_parameters`` table of ``module`` (its own parameters, in registration order).
    Writing it registers a parameter without ``register_parameter``'s checks and hooks: lowering
    does that only where no registration hook exists. Same in 2.13-2.15."""
    return module._parameters


def module_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """The live ``_buffers`` table of ``module`` (its own buffers, persistent or not). Same in
    2.13-2.15."""
    return module._buffers


def non_persistent_buffers(module: torch.nn.Module) -> set[str]:
    """The live set of ``module``'s buffer names that ``state_dict`` leaves out
    (``_non_persistent_buffers_set``). Same in 2.13-2.15."""
    return module._non_persistent_buffers_set


def graph_codegen(graph: torch.fx.Graph) -> Any:
    """The ``CodeGen`` an fx graph writes its Python code with (``graph._codegen``): the plain
    ``torch.fx.graph.CodeGen``, or a subclass that flattens pytree inputs (``_PyTreeCodeGen``).
    Same in 2.13-2.15."""
    return graph._codegen


def tensor_version(tensor: torch.Tensor) -> int:
    """The in-place write counter of ``tensor`` (``tensor._version``): purity checks compare it
    before and after a pass. Same in 2.13-2.15."""
    return tensor._version


def storage_identity(tensor: torch.Tensor) -> int:
    """The address of the storage object (``c10::StorageImpl``) behind ``tensor``
    (``untyped_storage()._cdata``): equal for views of one storage, different for two tensors
    made apart, also where storages have no data pointer (``meta``: every meta storage's
    ``data_ptr()`` is 0). Valid while the tensor is alive. Same in 2.13-2.15."""
    return tensor.untyped_storage()._cdata


# The logger a shape env warns on when evaluating a size raised (``failed during
# evaluate_expr(...)``, then the error is raised again): the module's own name in 2.13-2.15.
_SHAPE_ENV_LOGGER = "torch.fx.experimental.symbolic_shapes"


class _RefusedGuardsUnlogged(logging.Filter):
    """Drops the shape env's ``failed during evaluate_expr`` warnings of the threads inside
    ``guard_failures_unlogged`` (a refused guard is an answer purefx reports itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            getattr(self.local, "depth", 0) and str(record.msg).startswith("failed during evaluate")
        )


_GUARD_FILTER = _RefusedGuardsUnlogged()
_GUARD_FILTER_LOCK = threading.Lock()


@contextlib.contextmanager
def guard_failures_unlogged() -> Iterator[None]:
    """Within the block, the shape env does not log, for this thread, the evaluation that a
    refused guard (``refusing_new_guards``) made fail; other records and threads pass. The
    filter is put on the logger once. Same logger and message in 2.13-2.15. O(1)."""
    with _GUARD_FILTER_LOCK:
        logger = logging.getLogger(_SHAPE_ENV_LOGGER)
        if _GUARD_FILTER not in logger.filters:
            logger.addFilter(_GUARD_FILTER)
    local = _GUARD_FILTER.local
    local.depth = getattr(local, "depth", 0) + 1
    try:
        yield
    finally:
        local.depth -= 1


def refusing_new_guards(shape_env: Any) -> contextlib.AbstractContextManager:
    """Within the block, a guard ``shape_env`` would record (a symbolic size compared, a size
    made an ``int``) raises ``ShapeEnvGuardError`` instead, before the env changes
    (``ShapeEnv.error_on_new_guards``: it freezes the env and restores the flags on exit; the
    raise is not cached). The flags are fields of the env, not of the thread: callers nest and
    share it through ``ir.fake_run.guards_refused``. 2.13-2.15; a release without it refuses
    nothing (``nullcontext``). O(1)."""
    enter = getattr(shape_env, "error_on_new_guards", None)
    return enter() if enter is not None else contextlib.nullcontext()


def fresh_fake(like: torch.Tensor) -> torch.Tensor:
    """A new fake tensor of ``like``'s fake mode (``like.fake_mode``), shape, strides, dtype and
    device, on a storage of its own (offset 0): what an operator whose result is fresh would
    return at those metadata, made without running it. ``FakeTensor(mode, meta tensor,
    device)`` (``torch._subclasses.fake_tensor``), the constructor the fake mode itself uses
    for an operator's result, in 2.13-2.15. O(rank)."""
    return fake_of(like.fake_mode, tuple(like.shape), tuple(like.stride()), like.dtype,
                   like.device)


def fake_of(mode: Any, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    """A new fake tensor of ``mode`` (a ``FakeTensorMode``) with these sizes (``int`` s),
    strides, dtype and device, on a storage of its own (offset 0), made as :func:`fresh_fake`
    makes one, without a dispatch (``FakeTensor(mode, meta tensor, device)``, the same in
    2.13-2.15). O(rank)."""
    meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    return _FakeTensor(mode, meta, device)


def new_fake(mode: Any, shape: tuple, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A new contiguous ``cpu`` fake tensor of ``mode`` (a ``FakeTensorMode``), ``shape`` and
    ``dtype``, on a storage of its own: what ``torch.empty(shape, dtype=dtype)`` makes under
    ``mode``. Where every size is an ``int``, made as :func:`fresh_fake` makes one
    (``FakeTensor(mode, meta tensor, device)``, the constructor the fake mode uses for an
    operator's result, in 2.13-2.15), about five times faster than a dispatch of ``empty``
    through the mode; where a size is symbolic (its sizes live in the mode's shape env), or a
    fake mode is active (it would make the meta tensor fake too:
    ``torch._C._get_dispatch_mode``, same in 2.13-2.15), by that dispatch. O(rank)."""
    if all(type(n) is int for n in shape) and active_fake_mode() is None:
        return _FakeTensor(mode, torch.empty(shape, dtype=dtype, device="meta"), _CPU)
    with mode:
        return torch.empty(shape, dtype=dtype)


_CPU = torch.device("cpu")


def active_fake_mode() -> Any:
    """The fake mode active here, or ``None`` (``torch._C._get_dispatch_mode``, same in
    2.13-2.15). O(1)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


def real_tensors() -> contextlib.AbstractContextManager:
    """A block in which tensors made are real, even where a fake mode is active around it
    (``torch._subclasses.fake_tensor.unset_fake_temporarily``, same in 2.13-2.15): for
    observing an operator on real tensors from inside a fake run (``ir.op_known``). O(1)."""
    return _unset_fake_temporarily()


def new_fake_mode(shape_env: Any = None) -> Any:
    """A new ``FakeTensorMode`` (``torch._subclasses.fake_tensor``), over ``shape_env`` where
    one is given (``None``: none, static shapes): the mode whose tensors ``torch.export`` puts
    in ``meta["val"]``. Tensors made under it are
    ``FakeTensor``s of a real device (``cpu``) that run every operator, those without a Meta
    kernel too (fake quantization, say), through its fallback on zero-filled real tensors.
    The generated programs of ``ir.strategies`` make one per program, and the parser one per
    program text, so no state is shared between programs. Like ``torch.export``'s, it takes a
    real tensor met with its fake ones (``allow_non_fake_inputs``) as a constant: an
    ``ExportedProgram`` of purefx's keeps its tensor constants real in ``ep.constants``, and
    what compiles it under the program's own mode (AOTInductor) meets them so.
    ``FakeTensorMode(allow_non_fake_inputs=)`` takes the same arguments in 2.13-2.15. O(1)."""
    return _FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)


def new_symbolic_size(name: str, hint: int, low: int, high: int) -> tuple[Any, Any, dict]:
    """A new fake mode with a shape env and one symbolic size of it, as ``torch.export`` makes
    for ``Dim(name, min=low, max=high)`` traced at ``hint``: ``(mode, size, ranges)`` (the mode
    :func:`new_fake_mode` makes over a new shape env), the size
    a ``SymInt`` whose symbol ranges over ``[low, high]`` (``var_to_range``), ``ranges`` the
    ``{symbol: ValueRanges(low, high)}`` an ``ExportedProgram``'s ``range_constraints`` holds.
    ``ShapeEnv.create_symbol`` / ``create_symintnode`` with a ``ConstantSource``
    (``torch._dynamo.source``), ``constrain_symbol_range`` and ``ValueRanges``
    (``torch.utils._sympy.value_ranges``) in 2.13-2.15. ``ValueError`` unless ``2 <= low <=
    hint <= high`` (torch specializes sizes 0 and 1). O(1)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch.utils._sympy.value_ranges import ValueRanges

    if not 2 <= low <= hint <= high:
        raise ValueError(f"a symbolic size needs 2 <= low <= hint <= high, got {low}, {hint}, "
                         f"{high}")
    env = ShapeEnv()
    source = ConstantSource(name)
    symbol = env.create_symbol(hint, source, dynamic_dim=DimDynamic.DYNAMIC)
    env.constrain_symbol_range(symbol, compiler_min=low, compiler_max=high)
    size = env.create_symintnode(symbol, hint=hint, source=source)
    return new_fake_mode(env), size, {symbol: ValueRanges(low, high)}


SIZE_SYMBOL_PREFIXES = ("s", "u")
"""The prefixes of the size symbols a shape env names: ``s`` (backed: a hint, what
``torch.export`` makes for a dynamic dimension) and ``u`` (unbacked: a data-dependent size,
no hint). ``torch.utils._sympy.symbol.SymT.SIZE`` / ``UNBACKED_INT`` in 2.13-2.15."""


def new_symbolic_sizes(
    symbols: Sequence[tuple[str, int | None, int, int | None]],
) -> tuple[Any, dict[str, Any], dict]:
    """A new fake mode over a new shape env holding symbols of the given names: what a text
    that names symbolic sizes (``s26``) is read back into (``ir.parser``).

    ``symbols``: ``(name, hint, low, high)`` each, ``name`` a size symbol's (``s`` then digits,
    or ``u`` then digits for an unbacked one), ``hint`` its value in the example (``None``
    where it has none: an unbacked symbol, or one that sizes no value), ``[low, high]`` its
    range (``high`` ``None``: unbounded, torch's ``int_oo``). Returns ``(mode, sizes,
    ranges)``: the mode (:func:`new_fake_mode` over the env), ``sizes`` name -> the ``SymInt``
    of a symbol with a hint (the bare sympy symbol of one without), ``ranges`` ``{symbol: ValueRanges(low, high)}`` as an ``ExportedProgram``'s
    ``range_constraints`` holds them. The symbols are sympy symbols of the name and the
    assumptions the shape env gives its own (``positive``, ``integer`` for ``s``; ``integer``
    for ``u``), so they compare equal to a program's symbols of the same name; each is
    registered as torch's serializer registers a symbol it reads (``ShapeEnv.
    add_backed_var_to_val``, ``add_var_to_val`` before 2.13's rename, ``constrain_symbol_range``,
    ``create_symintnode``), same in 2.13-2.15; a backed symbol's range in the env is the given
    one from 2 up, as ``create_symbol`` makes it. ``ValueError`` for a name that is not a size
    symbol's, a name given twice, a hint outside the range, a hint of an unbacked symbol, or a
    backed symbol whose range holds no size of 2 or more.
    O(len(symbols)).
    """
    import sympy
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    env = ShapeEnv()
    sizes: dict[str, Any] = {}
    ranges: dict = {}
    for name, hint, low, high in symbols:
        kind = name[:1]
        if kind not in SIZE_SYMBOL_PREFIXES or not name[1:].isdigit():
            raise ValueError(f"{name!r} is not a size symbol's name ('s' or 'u' then digits)")
        if name in sizes:
            raise ValueError(f"symbol {name!r} is given twice")
        top = int_oo if high is None else high
        if hint is not None and (kind == "u" or hint < low or (high is not None and hint > high)):
            raise ValueError(f"symbol {name!r} cannot take hint {hint} (range [{low}, {top}]"
                             + (", unbacked)" if kind == "u" else ")"))
        symbol = sympy.Symbol(name, integer=True, **({"positive": True} if kind == "s" else {}))
        if hint is not None:
            add = getattr(env, "add_backed_var_to_val", None) or env.add_var_to_val
            add(symbol, hint)
        # a backed size's range in the env starts at 2, as ``create_symbol`` makes it (torch
        # specializes sizes 0 and 1); ``ranges`` keeps the range as given (an export's
        # constraint of ``Dim("batch")`` reads ``[0, int_oo]``)
        floor = max(low, 2) if kind == "s" else low
        if high is not None and high < floor:
            raise ValueError(f"symbol {name!r} of range [{low}, {high}] holds no size >= 2")
        env.constrain_symbol_range(symbol, compiler_min=floor, compiler_max=top)
        sizes[name] = symbol if hint is None else env.create_symintnode(symbol, hint=hint)
        ranges[symbol] = ValueRanges(low, top)
    return new_fake_mode(env), sizes, ranges


def size_symbols(size: Any) -> dict[str, tuple[int | None, Any, Any]]:
    """The size symbols of a ``SymInt``'s expression: name -> ``(hint, low, high)``, the
    symbol's hint in its shape env (``None`` for an unbacked one) and its range there (sympy
    numbers; ``int_oo`` unbounded). ``{}`` for an ``int`` or a ``SymInt`` of no symbol.
    ``ShapeEnv.backed_var_to_val`` (``var_to_val`` before 2.13) and ``var_to_range``, same in
    2.13-2.15. O(symbols of the expression)."""
    node = getattr(size, "node", None)
    if node is None:
        return {}
    env = node.shape_env
    values = getattr(env, "backed_var_to_val", None)
    if values is None:
        values = env.var_to_val
    found = {}
    for symbol in sorted(node.expr.free_symbols, key=str):
        vr = env.var_to_range.get(symbol)
        value = values.get(symbol)
        found[str(symbol)] = (None if value is None else int(value),
                              None if vr is None else vr.lower, None if vr is None else vr.upper)
    return found


# The logger torch's fake tensor mode reports a failed meta kernel on (``log.exception`` before
# the error is raised again): the module's own name, ``torch._subclasses.fake_tensor``, in
# 2.13-2.15.
_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"


class _OtherThreadsOnly(logging.Filter):
    """Passes the records of every thread but the one that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextlib.contextmanager
def fake_failures_unlogged() -> Iterator[None]:
    """Within the block, torch's fake tensor mode does not log the operators that fail in this
    thread: for purefx's own trial runs on fake values (a replacement tried at a match's dtypes,
    a reader at new strides, a node of a user's pass), where a failure is an answer that purefx
    catches, reports or raises itself. Without it torch prints a traceback of ~30 lines per
    trial to stderr. Records of other threads pass as before; the filter is removed on exit.
    Same logger and ``log.exception`` call in 2.13-2.15. O(1)."""
    logger = logging.getLogger(_FAKE_TENSOR_LOGGER)
    quiet = _OtherThreadsOnly()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
