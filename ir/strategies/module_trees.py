"""Export tier of purefx's hypothesis strategies: exportable ``nn.Module`` hierarchies.

A drawn example is a *spec*: a frozen, hashable tree of attrs values (tuples, never lists)
that describes an ``nn.Module`` hierarchy, its example inputs and how to export it.
:func:`realize` builds the real module (weights from a private generator seeded by the spec),
:func:`example_inputs` builds the inputs, and :func:`export_spec` runs ``torch.export`` once
per spec (memoized with ``functools.lru_cache``), so re-running a spec while hypothesis
shrinks costs a dictionary lookup instead of a trace. :func:`fresh_export` never caches.

Every activation is a float32 ``(batch, WIDTH)`` tensor and every state tensor is
``(WIDTH,)`` or ``(WIDTH, WIDTH)``, so any op composes with any other. Values stay finite:
vectors, buffers and constants stay in [-1, 1] (buffer updates average with ``tanh`` of the
activation), matrices have infinity-norm at most 1 and residuals average, so no op scales an
activation up and magnitudes grow at most linearly in the number of ops executed.

Covered
    Ops: ``neg``/``relu``/``tanh``; ``add``/``sub``/``mul`` with a vector parameter, a buffer
    (a buffer read) or a lifted constant; ``matmul`` and ``F.linear`` with parameters;
    residual; in-place ``buf.add_``/``buf.mul_``; buffer reassignment ``self.buf = ...``.
    Hierarchy: generated children, ``nn.Linear`` leaves, ``nn.Sequential`` containers,
    repeated calls, shared modules (an :class:`Alias` registers a module again under a second
    name; a ``Sequential`` may hold one module twice). State: parameters with
    ``requires_grad`` True or False, persistent and non-persistent buffers, tensor constants,
    tied parameters. Export: up to three positional and two keyword inputs, batch 1 to 3, a
    dynamic batch dimension, ``strict``, ``run_decompositions()`` and
    ``preserve_module_call_signature``.

Excluded by construction (torch 2.13 behaviour; no ``filter``/``assume`` anywhere)
    * ``self.buf = ...`` below the root, or anywhere under ``strict=True``: torch exports it
      without complaint but drops the write (:func:`assign_buffer_allowed`).
    * preserving a module called twice through one of its second names (non-strict), or
      through a second name at all (strict), or preserving a second name: ``KeyError`` while
      torch collects the call signatures (:func:`preservable_paths`).
    * ``decompose`` without ``strict`` when a module registered under two names updates a
      buffer in place: an assertion in AOT's argument deduplication
      (:func:`decompose_allowed`).

Torch behaviour the specs expose (not excluded): strict export drops buffers that no op reads
and may name a shared module's buffer by its second name; non-strict export lists a shared
module's state once per name; ``program.module()`` shares state tensors with the program.

Throughput (torch 2.13 CPU, 200 derandomized ``program_specs()`` draws, one ``fresh_export``
each, after a warm-up export): about 13 specs exported per CPU-second, 24/s for non-strict and
7/s for strict specs (dynamo dominates); 9 specs/s wall-clock on a shared 2-core machine.
Drawing a spec alone runs at about 190/s.
"""

from __future__ import annotations

import functools
import keyword
import warnings
from collections.abc import Collection, Iterator

import attrs
import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from torch import nn

__all__ = [
    "ALL_FEATURES",
    "MODULE_FEATURES",
    "PROGRAM_FEATURES",
    "WIDTH",
    "Alias",
    "AssignBuffer",
    "Binary",
    "BufferSpec",
    "Call",
    "Child",
    "ConstantSpec",
    "GeneratedModule",
    "GeneratedRoot",
    "Linear",
    "LinearSpec",
    "MatMul",
    "ModuleSpec",
    "ParamSpec",
    "ProgramSpec",
    "Residual",
    "SequentialSpec",
    "Tie",
    "Unary",
    "UpdateBuffer",
    "assign_buffer_allowed",
    "call_paths",
    "check_features",
    "check_int_range",
    "decompose_allowed",
    "example_inputs",
    "export_spec",
    "exported_programs",
    "fresh_export",
    "module_paths",
    "module_specs",
    "parameter_fqns",
    "preservable_paths",
    "program_specs",
    "realize",
    "registered_paths",
]

WIDTH = 4
"""Feature width of every activation ``(batch, WIDTH)`` and every state vector ``(WIDTH,)``."""

UNARY_FNS = ("neg", "relu", "tanh")
BINARY_FNS = ("add", "sub", "mul")
BUFFER_UPDATE_FNS = ("add_", "mul_")
PARAM_SHAPES = ("vector", "matrix")
POSITIONAL_NAMES = ("x0", "x1", "x2")
KEYWORD_NAMES = ("z0", "z1")

# --------------------------------------------------------------------------------------------
# Validators shared by the spec classes
# --------------------------------------------------------------------------------------------


def _is_identifier(value: object) -> bool:
    return isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value)


def _reserved(name: str) -> bool:
    return name in ("ops", "training") or hasattr(GeneratedRoot, name)


def _identifier(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not _is_identifier(value) or _reserved(value):
        raise ValueError(
            f"{attribute.name} must be a Python identifier that is not an nn.Module "
            f"attribute, got {value!r}"
        )


def _fqn(_instance: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, str) or not all(_is_identifier(a) or a.isdigit()
                                             for a in value.split(".")):
        raise ValueError(
            f"{attribute.name} must be a dotted path of identifiers or indices, got {value!r}"
        )


def _one_of(choices: tuple[str, ...]):
    return attrs.validators.in_(choices)


def _tuple_of(kind: type | tuple[type, ...]):
    return attrs.validators.deep_iterable(attrs.validators.instance_of(kind),
                                          attrs.validators.instance_of(tuple))


def _field_tuple(kind: type | tuple[type, ...]):
    return attrs.field(default=(), converter=tuple, validator=_tuple_of(kind))


# --------------------------------------------------------------------------------------------
# State specs
# --------------------------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class ParamSpec:
    """An ``nn.Parameter`` named ``name``: a ``(WIDTH,)`` vector or ``(WIDTH, WIDTH)`` matrix."""

    name: str = attrs.field(validator=_identifier)
    shape: str = attrs.field(default="vector", validator=_one_of(PARAM_SHAPES))
    requires_grad: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))


@attrs.frozen(cache_hash=True)
class BufferSpec:
    """A ``(WIDTH,)`` buffer; ``persistent=False`` keeps it out of the ``state_dict``."""

    name: str = attrs.field(validator=_identifier)
    persistent: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))


@attrs.frozen(cache_hash=True)
class ConstantSpec:
    """A plain ``(WIDTH,)`` tensor attribute (neither parameter nor buffer): a lifted constant."""

    name: str = attrs.field(validator=_identifier)


# --------------------------------------------------------------------------------------------
# Op specs: one step of a generated forward, ``h -> h'`` (``x`` is the module's input)
# --------------------------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class Unary:
    """``h = fn(h)`` for ``fn`` in :data:`UNARY_FNS`."""

    fn: str = attrs.field(validator=_one_of(UNARY_FNS))


@attrs.frozen(cache_hash=True)
class Binary:
    """``h = fn(h, self.<operand>)``; the operand is a vector parameter, buffer or constant."""

    fn: str = attrs.field(validator=_one_of(BINARY_FNS))
    operand: str = attrs.field(validator=_identifier)


@attrs.frozen(cache_hash=True)
class MatMul:
    """``h = h @ self.<weight>`` with a matrix parameter."""

    weight: str = attrs.field(validator=_identifier)


@attrs.frozen(cache_hash=True)
class Linear:
    """``h = F.linear(h, self.<weight>, self.<bias>)``; ``bias`` may be ``None``."""

    weight: str = attrs.field(validator=_identifier)
    bias: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_identifier))


@attrs.frozen(cache_hash=True)
class Call:
    """``h = self.<child>(h)``: call a child or an alias; the same name twice is a repeated call.

    ``handed``: a buffer of the caller through which it hands the child values outside the
    call's signature. The caller makes ``y = 0.5 * (self.<handed> + s)`` (``s`` as in
    :class:`UpdateBuffer`) and hands it over; the child (a generated module) runs on ``x * y``
    and hands back ``z = y - tanh(h).mean(0).detach()`` from its result ``h``, which the caller
    writes into ``self.<handed>`` with ``copy_`` after the call. With the child preserved,
    ``y`` and ``z`` cross the preserved boundary unsigned: values of state a call reads and
    makes (torch's "ivals"). Only in the root of a non-strict export
    (:func:`assign_buffer_allowed`), and only to a generated module.
    """

    child: str = attrs.field(validator=_identifier)
    handed: str | None = attrs.field(default=None,
                                     validator=attrs.validators.optional(_identifier))


@attrs.frozen(cache_hash=True)
class UpdateBuffer:
    """In-place update of a buffer from ``s = tanh(h).mean(0).detach()``; ``h`` is unchanged.

    ``add_``: ``buf.add_(0.5 * (s - buf))`` (a running average); ``mul_``: ``buf.mul_(s)``.
    Both keep ``|buf| <= 1``.
    """

    buffer: str = attrs.field(validator=_identifier)
    fn: str = attrs.field(default="add_", validator=_one_of(BUFFER_UPDATE_FNS))


@attrs.frozen(cache_hash=True)
class AssignBuffer:
    """``self.<buffer> = 0.5 * (self.<buffer> + tanh(h).mean(0).detach())`` (no in-place op)."""

    buffer: str = attrs.field(validator=_identifier)


@attrs.frozen(cache_hash=True)
class Residual:
    """``h = 0.5 * (h + x)`` where ``x`` is the input of the enclosing module's forward."""


OpSpec = Unary | Binary | MatMul | Linear | Call | UpdateBuffer | AssignBuffer | Residual
_OP_TYPES = (Unary, Binary, MatMul, Linear, Call, UpdateBuffer, AssignBuffer, Residual)

# --------------------------------------------------------------------------------------------
# Module specs
# --------------------------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class LinearSpec:
    """A leaf ``nn.Linear(WIDTH, WIDTH, bias=bias)``."""

    bias: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))


@attrs.frozen(cache_hash=True)
class Child:
    """A child module registered under ``name``."""

    name: str = attrs.field(validator=_identifier)
    spec: ChildSpec = attrs.field()

    @spec.validator
    def _check_spec(self, attribute: attrs.Attribute, value: object) -> None:
        if not isinstance(value, (ModuleSpec, LinearSpec, SequentialSpec)):
            raise TypeError(f"{attribute.name} must be a ModuleSpec, LinearSpec or "
                             f"SequentialSpec, got {type(value).__name__}")


@attrs.frozen(cache_hash=True)
class Alias:
    """Register the existing module at dotted path ``target`` again under ``name`` (sharing)."""

    name: str = attrs.field(validator=_identifier)
    target: str = attrs.field(validator=_fqn)


@attrs.frozen(cache_hash=True)
class ModuleSpec:
    """A generated module: children, aliases, owned state and the ops its forward runs.

    Registration order is: children, then aliases (so an alias never precedes its target),
    then parameters, buffers and constants. ``forward(x)`` starts from ``h = x``, applies
    ``ops`` in order and returns ``h``.
    """

    ops: tuple[OpSpec, ...] = _field_tuple(_OP_TYPES)
    children: tuple[Child, ...] = _field_tuple(Child)
    aliases: tuple[Alias, ...] = _field_tuple(Alias)
    params: tuple[ParamSpec, ...] = _field_tuple(ParamSpec)
    buffers: tuple[BufferSpec, ...] = _field_tuple(BufferSpec)
    constants: tuple[ConstantSpec, ...] = _field_tuple(ConstantSpec)

    def __attrs_post_init__(self) -> None:
        _check_module_spec(self)


@attrs.frozen(cache_hash=True)
class SequentialSpec:
    """``nn.Sequential`` over ``items`` in ``order``; an index used twice shares one module."""

    items: tuple[ModuleSpec | LinearSpec, ...] = attrs.field(
        converter=tuple, validator=_tuple_of((ModuleSpec, LinearSpec)))
    order: tuple[int, ...] = attrs.field(converter=tuple, validator=_tuple_of(int))

    def __attrs_post_init__(self) -> None:
        if sorted(set(self.order)) != list(range(len(self.items))) or not self.items:
            raise ValueError(f"order must use every index of items (0..{len(self.items) - 1}) "
                             f"at least once, got {self.order!r}")


ChildSpec = ModuleSpec | LinearSpec | SequentialSpec


@attrs.frozen(cache_hash=True)
class Tie:
    """After realization, parameter ``target`` becomes the very ``nn.Parameter`` at ``source``."""

    target: str = attrs.field(validator=_fqn)
    source: str = attrs.field(validator=_fqn)


@attrs.frozen(cache_hash=True)
class ProgramSpec:
    """A root module plus inputs and ``torch.export`` options.

    The root's forward is ``forward(x0, x1=None, x2=None, *, z0=None, z1=None)``; the first
    ``n_args`` positional and ``n_kwargs`` keyword inputs are passed, each ``(batch, WIDTH)``,
    and summed before the root's ops run. ``dynamic`` marks the batch dimension dynamic.
    """

    root: ModuleSpec = attrs.field(validator=attrs.validators.instance_of(ModuleSpec))
    batch: int = attrs.field(default=2)
    n_args: int = attrs.field(default=1)
    n_kwargs: int = attrs.field(default=0)
    strict: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    decompose: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    dynamic: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    preserve: tuple[str, ...] = _field_tuple(str)
    ties: tuple[Tie, ...] = _field_tuple(Tie)
    seed: int = attrs.field(default=0)

    def __attrs_post_init__(self) -> None:
        _check_program_spec(self)


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def check_int_range(name: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ``InvalidArgument`` unless ``value`` is an int in ``[low, high]``."""
    bound = f"[{low}, {high}]" if high is not None else f">= {low}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int {bound}, got {value!r} "
                              f"of type {type(value).__name__}")
    if value < low or (high is not None and value > high):
        raise InvalidArgument(f"{name} must be an int {bound}, got {value!r}")


def check_features(name: str, value: object, allowed: Collection[str]
                   ) -> frozenset[str] | None:
    """Raise ``InvalidArgument`` unless ``value`` is ``None`` or a collection of names in
    ``allowed``; return it as a frozenset (or ``None``)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Collection):
        raise InvalidArgument(f"{name} must be None or a collection of feature names, "
                              f"got {value!r}")
    unknown = sorted(str(v) for v in value if v not in allowed)
    if unknown:
        raise InvalidArgument(f"{name} must contain only {sorted(allowed)}, got unknown "
                              f"{unknown}")
    return frozenset(value)


def _check_value(name: str, value: object, low: int, high: int | None) -> None:
    try:
        check_int_range(name, value, low, high)
    except InvalidArgument as error:
        raise ValueError(str(error)) from None


def _check_module_spec(spec: ModuleSpec) -> None:
    names = [c.name for c in spec.children] + [a.name for a in spec.aliases]
    names += [p.name for p in spec.params] + [b.name for b in spec.buffers]
    names += [k.name for k in spec.constants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"ModuleSpec names must be unique, got duplicates {duplicates}")
    owned = module_paths(spec)
    for alias in spec.aliases:
        if alias.target not in owned:
            raise ValueError(f"Alias.target must be the path of a module owned below this one "
                             f"({list(owned)}), got {alias.target!r}")
    for op in spec.ops:
        _check_op(spec, op)


def _state_names(spec: ModuleSpec) -> dict[str, tuple[str, ...]]:
    vectors = tuple(p.name for p in spec.params if p.shape == "vector")
    return {
        "vector": vectors + tuple(b.name for b in spec.buffers)
        + tuple(k.name for k in spec.constants),
        "vector_param": vectors,
        "matrix": tuple(p.name for p in spec.params if p.shape == "matrix"),
        "buffer": tuple(b.name for b in spec.buffers),
        "callable": tuple(c.name for c in spec.children) + tuple(a.name for a in spec.aliases),
    }


# op type -> ((field, namespace in _state_names), ...): what each reference must name
_OP_REFERENCES: dict[type, tuple[tuple[str, str], ...]] = {
    Unary: (),
    Binary: (("operand", "vector"),),
    MatMul: (("weight", "matrix"),),
    Linear: (("weight", "matrix"), ("bias", "vector_param")),
    Call: (("child", "callable"), ("handed", "buffer")),
    UpdateBuffer: (("buffer", "buffer"),),
    AssignBuffer: (("buffer", "buffer"),),
    Residual: (),
}


def _check_op(spec: ModuleSpec, op: OpSpec) -> None:
    names = _state_names(spec)
    for field, namespace in _OP_REFERENCES[type(op)]:
        value = getattr(op, field)
        if value is not None and value not in names[namespace]:
            raise ValueError(f"{type(op).__name__}.{field} must be one of "
                             f"{list(names[namespace])} ({namespace}), got {value!r}")
    if isinstance(op, Call) and op.handed is not None \
            and not isinstance(_resolve_child(spec, "", op.child)[0], ModuleSpec):
        raise ValueError(f"Call.handed needs a generated module (a ModuleSpec) to hand values "
                         f"to, got a call of {op.child!r}")


def _check_program_spec(spec: ProgramSpec) -> None:
    _check_value("batch", spec.batch, 2 if spec.dynamic else 1, None)
    _check_value("n_args", spec.n_args, 1, len(POSITIONAL_NAMES))
    _check_value("n_kwargs", spec.n_kwargs, 0, len(KEYWORD_NAMES))
    _check_value("seed", spec.seed, 0, 2**63 - 1)
    eligible = preservable_paths(spec.root, spec.strict)
    bad = [p for p in spec.preserve if p not in eligible]
    if bad or len(set(spec.preserve)) != len(spec.preserve):
        raise ValueError(f"preserve must be distinct paths from {list(eligible)}, "
                         f"got {list(spec.preserve)}")
    _check_ties(spec.root, spec.ties)
    if spec.decompose and not decompose_allowed(spec.root, spec.strict):
        raise ValueError("decompose=True needs strict=True when a module registered under "
                         "two names updates a buffer in place (see decompose_allowed)")
    for path, kind in _walk_assignments(spec.root):
        if not assign_buffer_allowed(spec.strict, root=not path):
            where = f"module {path!r}" if path else "the root under strict=True"
            raise ValueError(f"{kind} is only exported faithfully in the root of a "
                             f"non-strict export (see assign_buffer_allowed), got one in {where}")


def _check_ties(root: ModuleSpec, ties: tuple[Tie, ...]) -> None:
    shapes = dict(parameter_fqns(root))
    targets = [t.target for t in ties]
    for tie in ties:
        if tie.target not in shapes or tie.source not in shapes:
            raise ValueError(f"ties must name parameters from {sorted(shapes)}, got {tie!r}")
        if shapes[tie.target] != shapes[tie.source] or tie.target == tie.source:
            raise ValueError(f"ties must join two distinct parameters of one shape, got {tie!r}")
        if tie.source in targets:
            raise ValueError(f"a tie source must not itself be a tie target, got {tie!r}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"each parameter may be a tie target once, got {targets}")


# --------------------------------------------------------------------------------------------
# Structural queries on specs (pure; mirror what realize() registers)
# --------------------------------------------------------------------------------------------


def _child_items(spec: ChildSpec) -> Iterator[tuple[str, ChildSpec, bool]]:
    """(name, spec, owned) of each registered child; ``owned`` is False for a second name."""
    if isinstance(spec, ModuleSpec):
        for child in spec.children:
            yield child.name, child.spec, True
    elif isinstance(spec, SequentialSpec):
        seen: set[int] = set()
        for position, index in enumerate(spec.order):
            yield str(position), spec.items[index], index not in seen
            seen.add(index)


def _canonical_walk(spec: ChildSpec, prefix: str = "") -> Iterator[tuple[str, ChildSpec]]:
    """Pre-order (path, spec) of every module object at its first (canonical) path.

    Aliases are skipped: an alias always targets a module already reached through its owner,
    which is registered earlier, so the owner's path is the canonical one.
    """
    yield prefix, spec
    for name, child, owned in _child_items(spec):
        if owned:
            yield from _canonical_walk(child, f"{prefix}.{name}" if prefix else name)


def module_paths(root: ModuleSpec) -> tuple[str, ...]:
    """Canonical fqns of all non-root modules, in ``named_modules()`` order."""
    return tuple(path for path, _ in _canonical_walk(root) if path)


def parameter_fqns(root: ModuleSpec) -> tuple[tuple[str, str], ...]:
    """``(fqn, shape)`` of every parameter at its canonical path, before ties are applied."""
    found = []
    for path, spec in _canonical_walk(root):
        prefix = f"{path}." if path else ""
        if isinstance(spec, ModuleSpec):
            found += [(prefix + p.name, p.shape) for p in spec.params]
        elif isinstance(spec, LinearSpec):
            found.append((prefix + "weight", "matrix"))
            found += [(prefix + "bias", "vector")] if spec.bias else []
    return tuple(found)


def assign_buffer_allowed(strict: bool, root: bool) -> bool:
    """Whether an :class:`AssignBuffer` op exports faithfully: only in the root, non-strict.

    torch 2.13 exports ``self.buf = ...`` without writing the new value back (the program
    runs, but the buffer keeps its old value) under ``strict=True`` at any level, and under
    ``strict=False`` in any module below the root.
    """
    return root and not strict


def _walk_assignments(spec: ChildSpec, path: str = "") -> Iterator[tuple[str, str]]:
    """``(path, kind)`` of the modules (canonical) whose ops write a buffer outside an in-place
    op of their own: an AssignBuffer, or a Call that hands its child values (``handed``)."""
    for module_path, module in _canonical_walk(spec, path):
        if not isinstance(module, ModuleSpec):
            continue
        if any(isinstance(op, AssignBuffer) for op in module.ops):
            yield module_path, "AssignBuffer"
        if any(isinstance(op, Call) and op.handed is not None for op in module.ops):
            yield module_path, "Call.handed"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _resolve_child(spec: ChildSpec, canonical: str, name: str) -> tuple[ChildSpec, str]:
    """Spec and canonical path of the module registered as ``name`` in ``spec``."""
    if isinstance(spec, SequentialSpec):
        index = spec.order[int(name)]
        return spec.items[index], _join(canonical, str(spec.order.index(index)))
    for child in spec.children:
        if child.name == name:
            return child.spec, _join(canonical, name)
    target = next(alias.target for alias in spec.aliases if alias.name == name)
    for part in target.split("."):
        spec, canonical = _resolve_child(spec, canonical, part)
    return spec, canonical


def _callees(spec: ChildSpec) -> tuple[str, ...]:
    """Names of the children that ``spec``'s forward calls, in call order."""
    if isinstance(spec, ModuleSpec):
        return tuple(op.child for op in spec.ops if isinstance(op, Call))
    if isinstance(spec, SequentialSpec):
        return tuple(str(slot) for slot in range(len(spec.order)))
    return ()


def call_paths(root: ModuleSpec) -> dict[str, tuple[str, int]]:
    """``{call path: (canonical path, calls)}`` for one run of the root's forward.

    The call path is the attribute path a call goes through (what non-strict export records
    in ``nn_module_stack``); ``calls`` saturates at 2 ("more than once"). A repeated path is
    not walked again: everything below it is marked as called more than once.
    """
    found: dict[str, tuple[str, int]] = {}

    def visit(spec: ChildSpec, canonical: str, path: str) -> None:
        for name in _callees(spec):
            child, child_canonical = _resolve_child(spec, canonical, name)
            child_path = _join(path, name)
            if child_path in found:
                for key, (owner, _) in list(found.items()):
                    if key == child_path or key.startswith(child_path + "."):
                        found[key] = (owner, 2)
            else:
                found[child_path] = (child_canonical, 1)
                visit(child, child_canonical, child_path)

    visit(root, "", "")
    return found


def registered_paths(root: ModuleSpec) -> dict[str, str]:
    """``{path: canonical path}`` for every name of every module, second names included
    (what ``named_modules(remove_duplicate=False)`` lists)."""
    found: dict[str, str] = {}

    def visit(spec: ChildSpec, canonical: str, path: str) -> None:
        names = [child.name for child in spec.children] + [a.name for a in spec.aliases] \
            if isinstance(spec, ModuleSpec) else list(_callees(spec))
        for name in names:
            child, child_canonical = _resolve_child(spec, canonical, name)
            found[_join(path, name)] = child_canonical
            visit(child, child_canonical, _join(path, name))

    visit(root, "", "")
    return found


def decompose_allowed(root: ModuleSpec, strict: bool) -> bool:
    """Whether ``run_decompositions()`` succeeds on the export of ``root``.

    Non-strict export lists the state of a module registered under two names twice (once
    per name); torch 2.13's decomposition then fails (``AssertionError: expected compiled_fn
    to be GraphModule``) when such a module mutates a buffer in place. Strict export is fine.
    """
    if strict:
        return True
    canonical = list(registered_paths(root).values())
    shared = {path for path in canonical if canonical.count(path) > 1}
    return not any(path in shared and isinstance(spec, ModuleSpec)
                   and any(isinstance(op, UpdateBuffer) for op in spec.ops)
                   for path, spec in _canonical_walk(root))


def preservable_paths(root: ModuleSpec, strict: bool = False) -> tuple[str, ...]:
    """Canonical module paths that export cleanly in ``preserve_module_call_signature``.

    torch 2.13 raises a ``KeyError`` while it collects call signatures when a preserved
    module is called twice through one name other than the preserved one. So a module is
    offered only when each of its second names (aliases, repeated ``nn.Sequential`` slots,
    paths through a shared ancestor) is called at most once, or under ``strict=True`` never:
    dynamo misnames ``nn.Sequential`` items reached through an alias (``c0.1`` for ``a0.0``),
    which makes the counting unreliable. Calls through the canonical path may repeat freely.
    Second names themselves are never offered (conservative: preserving one fails whenever
    the canonical name is called twice).
    """
    other_names: dict[str, list[int]] = {}
    for path, (canonical, calls) in call_paths(root).items():
        if path != canonical:
            other_names.setdefault(canonical, []).append(calls)

    def clean(path: str) -> bool:
        calls = other_names.get(path, [])
        return not calls if strict else all(count == 1 for count in calls)

    return tuple(path for path in module_paths(root) if clean(path))


# --------------------------------------------------------------------------------------------
# Realization: specs -> nn.Modules
# --------------------------------------------------------------------------------------------


def _signal(h: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h).mean(0).detach()


def _apply_update(m: nn.Module, op: UpdateBuffer, h: torch.Tensor, x: torch.Tensor
                  ) -> torch.Tensor:
    _BUFFER_UPDATE_IMPLS[op.fn](getattr(m, op.buffer), _signal(h))
    return h


def _apply_assign(m: nn.Module, op: AssignBuffer, h: torch.Tensor, x: torch.Tensor
                  ) -> torch.Tensor:
    setattr(m, op.buffer, (getattr(m, op.buffer) + _signal(h)) * 0.5)
    return h


def _call(m: nn.Module, op: Call, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    child = getattr(m, op.child)
    if op.handed is None:
        return child(h)
    buffer = getattr(m, op.handed)
    object.__setattr__(child, "_handed", (buffer + _signal(h)) * 0.5)
    h = child(h)
    buffer.copy_(child.__dict__.pop("_handed_back"))
    return h


def _add_toward(buffer: torch.Tensor, signal: torch.Tensor) -> torch.Tensor:
    return buffer.add_((signal - buffer) * 0.5)


_UNARY_IMPLS = {"neg": torch.neg, "relu": torch.relu, "tanh": torch.tanh}
_BINARY_IMPLS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}
_BUFFER_UPDATE_IMPLS = {"add_": _add_toward, "mul_": torch.Tensor.mul_}

# op type -> rule(module, op, h, x) -> new h
_RULES = {
    Unary: lambda m, op, h, x: _UNARY_IMPLS[op.fn](h),
    Binary: lambda m, op, h, x: _BINARY_IMPLS[op.fn](h, getattr(m, op.operand)),
    MatMul: lambda m, op, h, x: torch.matmul(h, getattr(m, op.weight)),
    Linear: lambda m, op, h, x: F.linear(h, getattr(m, op.weight),
                                         None if op.bias is None else getattr(m, op.bias)),
    Call: _call,
    UpdateBuffer: _apply_update,
    AssignBuffer: _apply_assign,
    Residual: lambda m, op, h, x: (h + x) * 0.5,
}


def _run_ops(module: nn.Module, ops: tuple[OpSpec, ...], x: torch.Tensor) -> torch.Tensor:
    h = x
    for op in ops:
        h = _RULES[type(op)](module, op, h, x)
    return h


class GeneratedModule(nn.Module):
    """The module :func:`realize` builds for a :class:`ModuleSpec`; runs its ops on ``x``."""

    def __init__(self, ops: tuple[OpSpec, ...]) -> None:
        super().__init__()
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handed = self.__dict__.pop("_handed", None)  # a caller's ``Call.handed`` value
        if handed is None:
            return _run_ops(self, self.ops, x)
        h = _run_ops(self, self.ops, x * handed)
        object.__setattr__(self, "_handed_back", handed - _signal(h))
        return h


class GeneratedRoot(GeneratedModule):
    """The root built for a :class:`ProgramSpec`: sums its given inputs, then runs its ops."""

    def forward(self, x0: torch.Tensor, x1: torch.Tensor | None = None,
                x2: torch.Tensor | None = None, *, z0: torch.Tensor | None = None,
                z1: torch.Tensor | None = None) -> torch.Tensor:
        x = x0
        for extra in (x1, x2, z0, z1):
            if extra is not None:
                x = x + extra
        return _run_ops(self, self.ops, x)


def _uniform(rng: torch.Generator, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
    return (torch.rand(shape, generator=rng) * 2.0 - 1.0) * scale


def _initial(rng: torch.Generator, shape: str) -> torch.Tensor:
    # Entries within 1/WIDTH: every row and column of |w| sums to at most 1, for h @ w and F.linear.
    if shape == "matrix":
        return _uniform(rng, (WIDTH, WIDTH), 1.0 / WIDTH)
    return _uniform(rng, (WIDTH,))


def _build_generated(spec: ModuleSpec, rng: torch.Generator, cls: type = GeneratedModule
                     ) -> nn.Module:
    module = cls(spec.ops)
    for child in spec.children:
        module.add_module(child.name, _build(child.spec, rng))
    for alias in spec.aliases:
        module.add_module(alias.name, module.get_submodule(alias.target))
    for param in spec.params:
        data = _initial(rng, param.shape)
        module.register_parameter(param.name, nn.Parameter(data, param.requires_grad))
    for buffer in spec.buffers:
        module.register_buffer(buffer.name, _initial(rng, "vector"), buffer.persistent)
    for constant in spec.constants:
        setattr(module, constant.name, _initial(rng, "vector"))
    return module


def _build_linear(spec: LinearSpec, rng: torch.Generator) -> nn.Module:
    # skip_init: nn.Linear's own initializer would draw from torch's global generator.
    module = torch.nn.utils.skip_init(nn.Linear, WIDTH, WIDTH, bias=spec.bias)
    with torch.no_grad():
        module.weight.copy_(_initial(rng, "matrix"))
        if spec.bias:
            module.bias.copy_(_initial(rng, "vector"))
    return module


def _build_sequential(spec: SequentialSpec, rng: torch.Generator) -> nn.Module:
    items = [_build(item, rng) for item in spec.items]
    return nn.Sequential(*(items[index] for index in spec.order))


def _build(spec: ChildSpec, rng: torch.Generator) -> nn.Module:
    return _BUILDERS[type(spec)](spec, rng)


_BUILDERS = {
    ModuleSpec: _build_generated,
    LinearSpec: _build_linear,
    SequentialSpec: _build_sequential,
}


def _apply_ties(root: nn.Module, ties: tuple[Tie, ...]) -> None:
    for tie in ties:
        owner, _, name = tie.target.rpartition(".")
        setattr(root.get_submodule(owner), name, root.get_parameter(tie.source))


def _as_program(spec: ProgramSpec | ModuleSpec) -> ProgramSpec:
    if isinstance(spec, ProgramSpec):
        return spec
    if isinstance(spec, ModuleSpec):
        return ProgramSpec(root=spec)
    raise TypeError(f"spec must be a ProgramSpec or ModuleSpec, got {type(spec).__name__}")


def realize(spec: ProgramSpec | ModuleSpec) -> nn.Module:
    """Build a fresh :class:`GeneratedRoot` for ``spec`` (a ModuleSpec means default options).

    Deterministic: weights come from a private generator seeded with ``spec.seed`` (torch's
    global generator is not touched), so equal specs give equal modules.
    """
    spec = _as_program(spec)
    rng = torch.Generator().manual_seed(spec.seed)
    root = _build_generated(spec.root, rng, GeneratedRoot)
    _apply_ties(root, spec.ties)
    return root


def example_inputs(spec: ProgramSpec | ModuleSpec
                   ) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """Fresh ``(args, kwargs)`` for the root's forward, deterministic in ``spec``."""
    spec = _as_program(spec)
    rng = torch.Generator().manual_seed(spec.seed + 1)
    args = tuple(_uniform(rng, (spec.batch, WIDTH)) for _ in range(spec.n_args))
    kwargs = {name: _uniform(rng, (spec.batch, WIDTH)) for name in KEYWORD_NAMES[:spec.n_kwargs]}
    return args, kwargs


def _dynamic_shapes(spec: ProgramSpec) -> dict[str, dict[int, object]] | None:
    if not spec.dynamic:
        return None
    batch = torch.export.Dim("batch")
    names = POSITIONAL_NAMES[:spec.n_args] + KEYWORD_NAMES[:spec.n_kwargs]
    return {name: {0: batch} for name in names}


def fresh_export(spec: ProgramSpec | ModuleSpec) -> torch.export.ExportedProgram:
    """Realize ``spec`` and run ``torch.export.export`` (then ``run_decompositions()`` when
    ``spec.decompose``) every time, with nothing cached. Torch's warnings are silenced."""
    spec = _as_program(spec)
    args, kwargs = example_inputs(spec)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torch(\.|$)")
        warnings.filterwarnings("ignore", category=FutureWarning)
        program = torch.export.export(
            realize(spec), args, kwargs, strict=spec.strict,
            preserve_module_call_signature=spec.preserve, dynamic_shapes=_dynamic_shapes(spec))
        if spec.decompose:
            program = program.run_decompositions()
    return program


def _state_tensors(program: torch.export.ExportedProgram) -> dict[tuple[str, str], torch.Tensor]:
    tables = {"state": program.state_dict, "constant": program.constants}
    return {(table, name): value for table, values in tables.items()
            for name, value in values.items() if isinstance(value, torch.Tensor)}


@functools.lru_cache(maxsize=256)
def _cached_export(spec: ProgramSpec) -> tuple[torch.export.ExportedProgram, dict]:
    program = fresh_export(spec)
    pristine = {key: value.detach().clone() for key, value in _state_tensors(program).items()}
    return program, pristine


def export_spec(spec: ProgramSpec | ModuleSpec) -> torch.export.ExportedProgram:
    """The memoized export of ``spec``: equal specs give the *same* ``ExportedProgram`` object.

    ``program.module()`` shares state tensors with the program, so running it mutates the
    cached program's buffers; every call of ``export_spec`` first copies back any state that
    changed since the export, so each caller starts from the realized initial state. Treat the
    result as read-only otherwise; use :func:`fresh_export` for a private copy.
    """
    program, pristine = _cached_export(_as_program(spec))
    current = _state_tensors(program)
    with torch.no_grad():
        for key, value in pristine.items():
            if not torch.equal(current[key], value):
                current[key].copy_(value)
    return program


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------

MODULE_FEATURES = (
    "binary",  # Binary ops on vector params (and buffers / constants when those are on)
    "matmul",  # MatMul with matrix params
    "linear",  # Linear ops (F.linear) on params
    "residual",  # Residual
    "children",  # generated child modules (with max_depth > 0)
    "linear_children",  # nn.Linear leaf children
    "sequential",  # nn.Sequential children
    "repeat_calls",  # calling a child again (needs a child feature)
    "sharing",  # Alias children and repeated nn.Sequential slots (needs a child feature)
    "buffers",  # buffers, read by Binary ops
    "buffer_updates",  # in-place add_/mul_ on buffers (needs "buffers")
    "buffer_assign",  # self.buf = ... and Call.handed (values handed to a child and a buffer
    # written from what it hands back) in the root (needs "buffers")
    "non_persistent",  # persistent=False buffers (needs "buffers")
    "constants",  # plain tensor attributes (lifted constants)
    "frozen_params",  # requires_grad=False parameters
)
"""Features that :func:`module_specs` can switch on (unary ops are always available)."""

PROGRAM_FEATURES = (
    "extra_args",  # more positional inputs
    "kwargs",      # keyword inputs
    "dynamic",     # dynamic batch dimension
    "strict",      # strict=True (dynamo)
    "decompose",   # run_decompositions()
    "preserve",    # preserve_module_call_signature
    "ties",        # tied parameters
)
"""Features that :func:`program_specs` adds on top of :data:`MODULE_FEATURES`."""

ALL_FEATURES = MODULE_FEATURES + PROGRAM_FEATURES


@attrs.frozen
class _Limits:
    max_depth: int
    max_children: int
    max_ops: int
    features: frozenset[str]

    def has(self, feature: str) -> bool:
        return feature in self.features


def _check_limits(max_depth: object, max_children: object, max_ops: object) -> None:
    check_int_range("max_depth", max_depth, 0, 6)
    check_int_range("max_children", max_children, 0, 8)
    check_int_range("max_ops", max_ops, 0, 32)


def _draw_features(draw: st.DrawFn, fixed: frozenset[str] | None,
                   pool: tuple[str, ...]) -> frozenset[str]:
    """Swarm testing: with ``fixed`` None, each feature is on with probability 1/2 and shrinks
    to off; otherwise exactly ``fixed`` is on."""
    if fixed is not None:
        return fixed
    return frozenset(name for name in pool if draw(st.booleans()))


def _draw_state(draw: st.DrawFn, limits: _Limits) -> dict[str, tuple]:
    wants_vectors = limits.has("binary") or limits.has("linear")
    wants_matrices = limits.has("matmul") or limits.has("linear")
    n_vectors = draw(st.integers(0, 2)) if wants_vectors else 0
    n_matrices = draw(st.integers(0, 2)) if wants_matrices else 0
    n_buffers = draw(st.integers(0, 2)) if limits.has("buffers") else 0
    n_constants = draw(st.integers(0, 1)) if limits.has("constants") else 0

    def frozen() -> bool:
        return limits.has("frozen_params") and draw(st.booleans())

    def transient() -> bool:
        return limits.has("non_persistent") and draw(st.booleans())

    params = tuple(ParamSpec(f"v{i}", "vector", not frozen()) for i in range(n_vectors))
    params += tuple(ParamSpec(f"w{i}", "matrix", not frozen()) for i in range(n_matrices))
    return {
        "params": params,
        "buffers": tuple(BufferSpec(f"b{i}", not transient()) for i in range(n_buffers)),
        "constants": tuple(ConstantSpec(f"k{i}") for i in range(n_constants)),
    }


@attrs.define
class _ModuleDraft:
    """Mutable scratch state while drawing one module's ops (local to one draw)."""

    state: dict[str, tuple]
    assign_ok: bool
    ops: list = attrs.field(factory=list)
    children: list = attrs.field(factory=list)
    aliases: list = attrs.field(factory=list)
    called: list = attrs.field(factory=list)

    def spec(self, with_ops: bool = True) -> ModuleSpec:
        return ModuleSpec(tuple(self.ops) if with_ops else (), tuple(self.children),
                          tuple(self.aliases), **self.state)


def _op_kinds(draft: _ModuleDraft, limits: _Limits, depth_left: int) -> list[str]:
    """Op kinds drawable now, simplest first (hypothesis shrinks toward the front)."""
    names = _state_names(draft.spec(with_ops=False))
    can_nest = depth_left > 0 and len(draft.children) < limits.max_children
    nestable = [f for f in ("children", "linear_children", "sequential") if limits.has(f)]
    rows = [
        ("unary", True),
        ("binary", limits.has("binary") and bool(names["vector"])),
        ("matmul", limits.has("matmul") and bool(names["matrix"])),
        ("linear", limits.has("linear") and bool(names["matrix"])),
        ("residual", limits.has("residual")),
        ("call_new", can_nest and bool(nestable)),
        ("call_again", limits.has("repeat_calls") and bool(draft.called)),
        ("call_alias", limits.has("sharing") and len(draft.aliases) < limits.max_children
         and bool(module_paths(draft.spec(with_ops=False)))),
        ("update_buffer", limits.has("buffer_updates") and bool(names["buffer"])),
        ("assign_buffer", draft.assign_ok and bool(names["buffer"])),
        ("call_handed", draft.assign_ok and bool(names["buffer"]) and bool(_generated(draft))),
    ]
    return [kind for kind, available in rows if available]


def _draw_child(draw: st.DrawFn, limits: _Limits, depth_left: int) -> ChildSpec:
    kinds = [k for k in ("children", "linear_children", "sequential") if limits.has(k)]
    kind = draw(st.sampled_from(kinds))
    if kind == "children":
        return draw(_modules(limits, depth_left - 1))
    if kind == "linear_children":
        return LinearSpec(bias=not draw(st.booleans()))
    return _draw_sequential(draw, limits, depth_left)


def _draw_sequential(draw: st.DrawFn, limits: _Limits, depth_left: int) -> SequentialSpec:
    n_items = draw(st.integers(1, 2))
    items = []
    for _ in range(n_items):
        nested = limits.has("children") and depth_left > 1 and draw(st.booleans())
        items.append(draw(_modules(limits, depth_left - 2)) if nested
                     else LinearSpec(bias=not draw(st.booleans())))
    order = tuple(range(n_items))
    if limits.has("sharing") and draw(st.booleans()):
        order += (draw(st.integers(0, n_items - 1)),)
    return SequentialSpec(tuple(items), order)


def _draw_op(draw: st.DrawFn, draft: _ModuleDraft, limits: _Limits, depth_left: int) -> OpSpec:
    names = _state_names(draft.spec(with_ops=False))
    kind = draw(st.sampled_from(_op_kinds(draft, limits, depth_left)))
    if kind == "unary":
        return Unary(draw(st.sampled_from(UNARY_FNS)))
    if kind == "binary":
        return Binary(draw(st.sampled_from(BINARY_FNS)), draw(st.sampled_from(names["vector"])))
    if kind == "matmul":
        return MatMul(draw(st.sampled_from(names["matrix"])))
    if kind == "linear":
        bias = draw(st.none() | st.sampled_from(names["vector_param"])) \
            if names["vector_param"] else None
        return Linear(draw(st.sampled_from(names["matrix"])), bias)
    if kind == "residual":
        return Residual()
    if kind == "update_buffer":
        return UpdateBuffer(draw(st.sampled_from(names["buffer"])),
                            draw(st.sampled_from(BUFFER_UPDATE_FNS)))
    if kind == "assign_buffer":
        return AssignBuffer(draw(st.sampled_from(names["buffer"])))
    return _draw_call(draw, draft, limits, depth_left, kind)


def _generated(draft: _ModuleDraft) -> list[str]:
    """The children of ``draft`` that are generated modules (what ``Call.handed`` calls)."""
    return [child.name for child in draft.children if isinstance(child.spec, ModuleSpec)]


def _draw_call(draw: st.DrawFn, draft: _ModuleDraft, limits: _Limits, depth_left: int,
               kind: str) -> Call:
    if kind == "call_handed":
        names = _state_names(draft.spec(with_ops=False))
        return Call(draw(st.sampled_from(_generated(draft))),
                    draw(st.sampled_from(names["buffer"])))
    if kind == "call_new":
        name = f"c{len(draft.children)}"
        draft.children.append(Child(name, _draw_child(draw, limits, depth_left)))
    elif kind == "call_alias":
        target = draw(st.sampled_from(module_paths(draft.spec(with_ops=False))))
        name = f"a{len(draft.aliases)}"
        draft.aliases.append(Alias(name, target))
    else:
        name = draw(st.sampled_from(draft.called))
    if name not in draft.called:
        draft.called.append(name)
    return Call(name)


def _modules(limits: _Limits, depth_left: int, assign_ok: bool = False
             ) -> st.SearchStrategy[ModuleSpec]:
    """Modules nesting at most ``depth_left`` levels; ``assign_ok`` allows AssignBuffer ops
    (only the root of a non-strict export, see :func:`assign_buffer_allowed`)."""

    @st.composite
    def draw_module(draw: st.DrawFn) -> ModuleSpec:
        draft = _ModuleDraft(_draw_state(draw, limits), assign_ok)
        for _ in range(draw(st.integers(0, limits.max_ops))):
            draft.ops.append(_draw_op(draw, draft, limits, depth_left))
        return draft.spec()

    return draw_module()


def module_specs(max_depth: int = 3, max_children: int = 3, max_ops: int = 6,
                 features: Collection[str] | None = None
                 ) -> st.SearchStrategy[ModuleSpec]:
    """Generate :class:`ModuleSpec` trees that export with default options.

    Each module owns up to two vector and two matrix parameters, two buffers and one
    constant, and runs up to ``max_ops`` ops; calling a *new* child is one of the ops, so every
    child is called at least once, and a module has at most ``max_children`` children and
    ``max_children`` aliases. Children nest at most ``max_depth`` levels below the root
    (``nn.Sequential`` items count as a level), and are generated modules, ``nn.Linear``
    leaves or ``nn.Sequential`` containers. ``max_depth`` must be in [0, 6],
    ``max_children`` in [0, 8] and ``max_ops`` in [0, 32].

    ``features`` is ``None`` or a collection of names from :data:`MODULE_FEATURES`. ``None``
    (default) means swarm testing: each example switches each feature on with probability
    1/2, so the shrinker also minimizes the set of features in play. A collection switches
    exactly those features on in every example. Unary ops are always available.

    Shrinks toward fewer features, then fewer ops, children and state, simpler ops (unary
    before the rest; ``neg`` first) and shallower trees; the minimal example is a
    ``ModuleSpec()`` with no ops (identity forward).
    """
    _check_limits(max_depth, max_children, max_ops)
    fixed = check_features("features", features, MODULE_FEATURES)

    @st.composite
    def draw_spec(draw: st.DrawFn) -> ModuleSpec:
        enabled = _draw_features(draw, fixed, MODULE_FEATURES)
        limits = _Limits(max_depth, max_children, max_ops, enabled)
        return draw(_modules(limits, max_depth, "buffer_assign" in enabled))

    return draw_spec()


def _draw_subset(draw: st.DrawFn, pool: tuple, max_size: int) -> tuple:
    if not pool:
        return ()
    return tuple(draw(st.lists(st.sampled_from(pool), unique=True, max_size=max_size)))


def _draw_preserve(draw: st.DrawFn, root: ModuleSpec, strict: bool) -> tuple[str, ...]:
    """Up to three preservable paths, in ``named_modules()`` order (one spec per set)."""
    eligible = preservable_paths(root, strict)
    chosen = set(_draw_subset(draw, eligible, 3))
    return tuple(path for path in eligible if path in chosen)


def _draw_ties(draw: st.DrawFn, root: ModuleSpec) -> tuple[Tie, ...]:
    params = parameter_fqns(root)
    shapes = dict(params)
    targets = _draw_subset(draw, tuple(shapes), 2)
    ties = []
    for target in targets:
        sources = [fqn for fqn, shape in params if shape == shapes[target] and fqn not in targets]
        if sources:
            ties.append(Tie(target, draw(st.sampled_from(sources))))
    return tuple(sorted(ties, key=lambda tie: tie.target))


def program_specs(max_depth: int = 3, max_children: int = 3, max_ops: int = 6,
                  features: Collection[str] | None = None
                  ) -> st.SearchStrategy[ProgramSpec]:
    """Generate :class:`ProgramSpec` values: a :func:`module_specs` root plus export options.

    Limits as in :func:`module_specs`; ``features`` is ``None`` (swarm testing over
    :data:`ALL_FEATURES`) or a collection of names from :data:`ALL_FEATURES`, switched on in
    every example. Options, each behind its feature: up to three positional and two keyword
    inputs, batch 2, 1 or 3 (2 or 3 with a dynamic batch), ``strict``, ``decompose`` (only
    where :func:`decompose_allowed`), ``preserve`` (up to three fqns from
    :func:`preservable_paths`, in module order), up to two parameter :class:`Tie` s; and a
    weight ``seed`` in [0, 255]. Every spec exports without error.

    Shrinks toward fewer features, a smaller root (see :func:`module_specs`), then simpler
    options: one input, batch 2, ``strict=False``, ``decompose=False``, ``dynamic=False``,
    ``preserve=()``, no ties and ``seed=0``.
    """
    _check_limits(max_depth, max_children, max_ops)
    fixed = check_features("features", features, ALL_FEATURES)

    @st.composite
    def draw_program(draw: st.DrawFn) -> ProgramSpec:
        enabled = _draw_features(draw, fixed, ALL_FEATURES)
        limits = _Limits(max_depth, max_children, max_ops, enabled)

        def option(feature: str) -> bool:
            return feature in enabled and draw(st.booleans())

        strict = option("strict")
        assign_ok = "buffer_assign" in enabled and assign_buffer_allowed(strict, root=True)
        root = draw(_modules(limits, max_depth, assign_ok))
        dynamic = option("dynamic")
        return ProgramSpec(
            root=root,
            n_args=1 + (draw(st.integers(0, 2)) if "extra_args" in enabled else 0),
            n_kwargs=draw(st.integers(0, 2)) if "kwargs" in enabled else 0,
            dynamic=dynamic,
            batch=draw(st.sampled_from((2, 3) if dynamic else (2, 1, 3))),
            strict=strict,
            decompose=decompose_allowed(root, strict) and option("decompose"),
            preserve=_draw_preserve(draw, root, strict) if "preserve" in enabled else (),
            ties=_draw_ties(draw, root) if "ties" in enabled else (),
            seed=draw(st.integers(0, 255)),
        )

    return draw_program()


def exported_programs(max_depth: int = 3, max_children: int = 3, max_ops: int = 6,
                      features: Collection[str] | None = None
                      ) -> st.SearchStrategy[tuple[ProgramSpec,
                                                   torch.export.ExportedProgram]]:
    """Generate ``(spec, export_spec(spec))`` for ``spec`` drawn from :func:`program_specs`.

    The program is the memoized one (shared between equal specs, state restored on every
    draw; see :func:`export_spec`). Shrinks exactly as :func:`program_specs`. Exporting
    happens while drawing (about 0.1 s per new spec), so tests using this strategy want
    ``deadline=None`` and ``suppress_health_check=[HealthCheck.too_slow]``.
    """
    return program_specs(max_depth, max_children, max_ops, features).map(
        lambda spec: (spec, export_spec(spec)))
