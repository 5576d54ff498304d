"""The root's call path: straight-line code specialised to one exported signature.

Every call of a lowered root must turn ``(args, kwargs)`` into the flat inputs of its graph,
check them against the export (structure, keys, tensor or not, dtype, rank, static sizes,
symbolic ranges, equal dims, device) and turn the flat outputs back into the output tree. The
general code that does it (``lowering/inputs.py``, ``pytree``) spells key paths, compares specs
by walking them and reads the constraints through generic loops on every call: for a small
model, most of the call. ``call_path`` generates, once at ``lower`` time, one function that does
the same for this program's ``in_spec``, ``out_spec`` and input checks as a run of ``if`` lines:
one type test per container, one subscript per leaf, one comparison per check, a tuple or dict
display for the outputs.

The generated code only *accepts*: when any test fails it returns ``MISS`` before running
anything, and the root runs its general path, which accepts what the export allows (dicts in
another key order, another dtype of the state's after ``.double()``, a ``flat_args_adapter``
structure) and words every error as before. Accepting is never looser than the general path:
each test the code makes is one the general path makes too, or stricter (exact ``torch.Tensor``,
exact containers, the exported dtype, the state's own device), so a call the code runs is a call
the general path would run the same way.

The function also picks what runs the root's graph, as ``LoweredRoot.code_to_run`` does: the
root's direct code while the tree is as built (no epoch change since the last check, no global
hook, no tracing), else ``code_to_run`` itself. It reads only the root's ``__dict__`` and
constants bound at generation: it holds no module or tensor, so deep copies share it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from ir.torch_seam import pytree
from lowering.constraints import InputCheck, linear_form
from lowering.direct import unflatten_source
from lowering.lowering_seam import (
    BUFFER_TABLE,
    MODULE_TABLE,
    PARAMETER_TABLE,
    global_module_hook_tables,
    is_fx_symbolic_tracing,
    tracing_state,
)
from lowering.source import compile_function
from lowering.tree_watch import epoch_cell


class _Miss:
    """The value of a call path that did not accept its inputs (the general path runs)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"


MISS = _Miss()

# Leaf values the generated code accepts where the export recorded no constraint (a bool, a
# string option): anything else, a container pytree would flatten included, goes the general way.
_SIMPLE_LEAVES = frozenset({int, float, bool, str, complex, torch.dtype, torch.device})


# Where one tensor of the root's state lives: module path, table, name; and the tensor itself.
Probe = tuple[tuple[str, ...], str, str, torch.Tensor]


class Unsupported(Exception):
    """The signature has a part the generator does not spell (a namedtuple, a custom pytree
    node, a non-linear size expression): the root keeps its general path only."""


def call_path(
    in_spec: Any,
    out_spec: Any,
    checks: Sequence[InputCheck],
    ranges: dict,
    probe: Probe | None,
    *,
    check_inputs: bool = True,
) -> Callable[..., Any] | None:
    """``fn(root, args, kwargs)``: the root's call, or ``MISS`` when the inputs are not ones it
    accepts (see the module docstring); ``None`` when the signature cannot be spelled.

    ``checks`` are the root's ``InputCheck``s (one per leaf of ``in_spec``), ``ranges`` its
    ``ranges_of`` table, ``probe`` where one tensor of the root's state lives
    (``probe_location``) for the device check, ``None`` for a stateless root. ``check_inputs=False``
    leaves out the dtype, rank and size tests (for ``bench/call_overhead.py``'s breakdown only;
    the root never runs such code). The source is ``fn.source``.

    Laws: for inputs ``fn`` accepts, ``fn(root, args, kwargs)`` equals the general path's
    result; it never raises before running the graph. Complexity: O(leaves + dims) to generate,
    and per call.
    """
    try:
        source, scope = _Writer(in_spec, out_spec, checks, ranges, probe, check_inputs).write()
    except Unsupported:
        return None
    fn = compile_function(source, scope, "call_path")
    fn.source = source  # type: ignore[attr-defined]
    return fn


def output_builder(out_spec: Any) -> Callable[[Any], Any] | None:
    """``fn(flat)``: the output tree of ``out_spec`` over the flat outputs ``flat`` (a sequence
    of ``out_spec.num_leaves`` values), as ``pytree.tree_unflatten`` builds it; ``None`` when the
    spec cannot be spelled. Raises what ``tree_unflatten`` raises for another count."""
    writer = _Writer(None, out_spec, (), {}, None, False)
    try:
        tree = writer.output_tree("o")
    except Unsupported:
        return None
    count = out_spec.num_leaves
    source = (
        "def build_outputs(o):\n"
        f"    if len(o) != {count}:\n"
        "        return _unflatten(list(o), _out_spec)\n"
        f"    return {tree}\n"
    )
    fn = compile_function(source, writer.scope, "build_outputs")
    fn.source = source  # type: ignore[attr-defined]
    return fn


class _Writer:
    """Writes the call path's source, line by line."""

    def __init__(
        self,
        in_spec: Any,
        out_spec: Any,
        checks: Sequence[InputCheck],
        ranges: dict,
        probe: Probe | None,
        check_inputs: bool,
    ) -> None:
        self.in_spec = in_spec
        self.out_spec = out_spec
        self.checks = checks
        self.ranges = ranges
        self.probe = probe
        self.check_inputs = check_inputs
        hooks = global_module_hook_tables()
        self.scope: dict[str, Any] = {
            "MISS": MISS,
            "_Tensor": torch.Tensor,
            "_in_spec": in_spec,
            "_out_spec": out_spec,
            "_unflatten": pytree.tree_unflatten,
            "_epoch": epoch_cell(),
            "_tracing": tracing_state,
            "_fx_tracing": is_fx_symbolic_tracing,
            **{f"_hooks{i}": table for i, table in enumerate(hooks)},
        }
        self.hook_names = [f"_hooks{i}" for i in range(len(hooks))]
        self.lines: list[str] = []
        self.leaves: list[str] = []
        self.symbols: dict[Any, str] = {}
        self.count = 0

    def write(self) -> tuple[str, dict[str, Any]]:
        spec = self.in_spec
        if spec is None or spec.type is not tuple or spec.num_children != 2:
            raise Unsupported
        args_spec, kwargs_spec = spec.children()
        if args_spec.type is not tuple or kwargs_spec.type is not dict:
            raise Unsupported
        if len(self.checks) != spec.num_leaves:
            raise Unsupported
        emit = self.lines.append
        emit("d = self.__dict__")
        # ``args`` and ``kwargs`` are proxies while fx traces ``forward(*args, **kwargs)``
        emit("if type(args) is not tuple or type(kwargs) is not dict:")
        emit("    return MISS")
        emit(f"if len(args) != {args_spec.num_children} or len(kwargs) != "
             f"{kwargs_spec.num_children}:")
        emit("    return MISS")
        emit("try:")
        body_start = len(self.lines)
        for i, child in enumerate(args_spec.children()):
            self.node(f"args[{i}]", child)
        for key, child in zip(kwargs_spec.context, kwargs_spec.children()):
            self.node(f"kwargs[{self.constant(key)}]", child)
        if any(c.is_tensor for c in self.checks):
            self.device_line()
        for leaf, check in zip(self.leaves, self.checks):
            self.check(leaf, check)
        self.lines[body_start:] = ["    " + line for line in self.lines[body_start:]]
        if len(self.lines) == body_start:
            emit("    pass")
        emit("except Exception:  # a missing key or a wrong rank: the general path words it")
        emit("    return MISS")
        flat = ", ".join(self.leaves)
        guard = " or ".join(self.hook_names) or "False"
        emit("direct = d.get('_direct')")
        emit("checked = d.get('_direct_checked')")
        emit(
            "if (direct is not None and checked is not None and checked[1] and checked[0] == "
            f"_epoch[0]\n        and not ({guard}) and _tracing() is None and not _fx_tracing()):"
        )
        emit(f"    o = direct(self{', ' if flat else ''}{flat})")
        emit("else:")
        emit(f"    o = self.code_to_run([{flat}])(self{', ' if flat else ''}{flat})")
        emit(f"if len(o) != {self.out_spec.num_leaves}:")
        emit("    return _unflatten(list(o), _out_spec)")
        emit(f"return {self.output_tree('o')}")
        body = "\n".join("    " + line for line in self.lines)
        return f"def call_path(self, args, kwargs):\n{body}\n", self.scope

    # --- inputs --------------------------------------------------------------------------------

    def node(self, expr: str, spec: Any) -> None:
        """Lines that bind the leaves of the value at ``expr``, which must have ``spec``'s shape."""
        emit = self.lines.append
        if spec.is_leaf():
            name = f"i{len(self.leaves)}"
            self.leaves.append(name)
            emit(f"{name} = {expr}")
            return
        kind = spec.type
        if kind is type(None):
            emit(f"if {expr} is not None:")
            emit("    return MISS")
            return
        if kind not in (tuple, list, dict):
            raise Unsupported
        local = self.fresh("t")
        emit(f"{local} = {expr}")
        emit(f"if type({local}) is not {kind.__name__} or len({local}) != {spec.num_children}:")
        emit("    return MISS")
        if kind is dict:
            for key, child in zip(spec.context, spec.children()):
                self.node(f"{local}[{self.constant(key)}]", child)
        else:
            for i, child in enumerate(spec.children()):
                self.node(f"{local}[{i}]", child)

    def device_line(self) -> None:
        if self.probe is None:
            return
        path, table, name, _ = self.probe
        owner = "d"  # the root's ``__dict__``, then each module's on the path
        for part in path:
            owner = f"{owner}[{MODULE_TABLE!r}][{part!r}].__dict__"
        self.lines.append(f"p = {owner}[{table!r}][{name!r}]")
        self.lines.append("cpu = p.is_cpu")  # then the inputs' one test: ``is_cpu``
        self.lines.append("dev = None if cpu else p.device")

    def check(self, leaf: str, check: InputCheck) -> None:
        emit = self.lines.append
        if not check.is_tensor:
            if check.symbolic is not None:
                emit(f"if type({leaf}) is not int:")
                emit("    return MISS")
                self.dim(leaf, check.symbolic)
            elif check.value is not None:
                value = self.constant(check.value)
                emit(f"if type({leaf}) is not {self.constant(type(check.value))} or "
                     f"{leaf} != {value}:")
                emit("    return MISS")
            else:
                emit(f"if type({leaf}) not in {self.constant(_SIMPLE_LEAVES)}:")
                emit("    return MISS")
            return
        tests = [f"type({leaf}) is not _Tensor"]
        if self.check_inputs and check.dtype is not None:
            tests.append(f"{leaf}.dtype is not {self.constant(check.dtype)}")
        if self.probe is None:
            tests.append(f"{leaf}.is_meta")
        else:
            tests.append(f"(not {leaf}.is_cpu if cpu else {leaf}.device != dev)")
        emit(f"if {' or '.join(tests)}:")
        emit("    return MISS")
        if not self.check_inputs:
            return
        dims = check.dims
        if all(isinstance(d, int) for d in dims):
            emit(f"if {leaf}.shape != {self.constant(torch.Size(dims))}:")
            emit("    return MISS")
            return
        names = [self.fresh("n") for _ in dims]
        emit(f"{', '.join(names)}{',' if len(names) == 1 else ''} = {leaf}.shape")
        for name, want in zip(names, dims):
            self.dim(name, want)

    def dim(self, got: str, want: Any) -> None:
        """Lines that accept the size ``got`` for the exported dim ``want`` as
        ``constraints._check_dim`` does (binding a symbol at its first use)."""
        emit = self.lines.append
        if isinstance(want, int):
            emit(f"if {got} != {want}:")
            emit("    return MISS")
            return
        symbols = want.free_symbols
        if len(symbols) != 1:
            return  # a guard deferred to run time: the general path does not check it either
        symbol = next(iter(symbols))
        bound = self.symbols.get(symbol)
        if isinstance(want, sympy.Symbol):
            if bound is None:
                self.symbols[symbol] = got
            else:
                emit(f"if {got} != {bound}:")
                emit("    return MISS")
        else:
            scale, offset = _linear(want, symbol)
            if bound is None:
                emit(f"if ({got} - {offset}) % {scale}:")
                emit("    return MISS")
                name = self.fresh("s")
                emit(f"{name} = ({got} - {offset}) // {scale}")
                self.symbols[symbol] = name
            else:
                emit(f"if {got} != {scale} * {bound} + {offset}:")
                emit("    return MISS")
        if want in self.ranges:
            lo, hi = self.ranges[want]
            if lo > 2:
                emit(f"if {got} < {int(lo)}:")
                emit("    return MISS")
            if hi < math.inf:
                emit(f"if {got} > {int(hi)}:")
                emit("    return MISS")

    # --- outputs -------------------------------------------------------------------------------

    def output_tree(self, flat: str) -> str:
        counter = iter(range(self.out_spec.num_leaves))
        return unflatten_source(self.out_spec, lambda: f"{flat}[{next(counter)}]",
                                self.constant, self.constant, Unsupported)

    # --- names ---------------------------------------------------------------------------------

    def constant(self, value: Any) -> str:
        name = f"_c{len(self.scope)}"
        self.scope[name] = value
        return name

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"


def _linear(expr: Any, symbol: Any) -> tuple[int, int]:
    """``constraints.linear_form``, or ``Unsupported`` where ``expr`` is not linear."""
    line = linear_form(expr, symbol)
    if line is None:
        raise Unsupported
    return line


def probe_location(root: torch.nn.Module) -> Probe | None:
    """Where the root's device probe lives now, and the tensor there: ``(module path, table,
    name, tensor)``; ``None`` without one. O(path)."""
    fqn = root.__dict__.get("_device_probe")
    if not fqn:
        return None
    *path, name = fqn.split(".")
    owner = root
    for part in path:
        owner = owner.__dict__[MODULE_TABLE].get(part)
        if owner is None:
            return None
    for table in (PARAMETER_TABLE, BUFFER_TABLE):
        found = owner.__dict__[table].get(name)
        if isinstance(found, torch.Tensor):
            return tuple(path), table, name, found
    return None
