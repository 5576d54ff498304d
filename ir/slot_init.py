"""Faster construction of the IR's frozen attrs classes: each field written through its slot.

attrs' ``__init__`` of a frozen slotted class writes every field with ``object.__setattr__``,
which looks the field's descriptor up by name on each write. An import or an outline builds tens
of thousands of ``Node``s, ``Ref``s and ``Frame``s, so the lookup is a visible share of a build.
``slot_init`` gives such a class an ``__init__`` of the same signature and the same effect that
calls each slot's descriptor directly; ``slot_constructor`` gives a function that also skips the
``type.__call__`` dispatch, for the few places that build nodes in bulk.

A class that attrs' own ``__init__`` must keep (validators, converters, ``on_setattr`` hooks,
``__attrs_pre_init__``/``__attrs_post_init__``, factories that take ``self``, fields without a
slot of their own) is returned as it is, and its constructor is the class itself: the speed-up
never changes what a construction does.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MemberDescriptorType
from typing import Any, TypeVar

import attrs

C = TypeVar("C", bound=type)

_CACHED_HASH = "_attrs_cached_hash"  # the slot attrs adds for ``cache_hash=True``


def slot_init(cls: C) -> C:
    """Class decorator, applied above ``@attrs.frozen``: replace ``cls.__init__`` with one that
    takes the same arguments (names, defaults, keyword-only fields) and writes the same fields,
    each through its slot descriptor. **Law:** ``cls(*a, **k)`` equals, hashes and reprs as
    attrs' constructor would make it, and raises ``TypeError`` for the same bad calls. Classes
    outside the fast path are returned unchanged. O(fields) once per class.
    """
    made = _generated(cls)
    if made is not None:
        cls.__init__ = made[0]  # type: ignore[misc]
        hasher = _cached_hash(cls)
        if hasher is not None:
            cls.__hash__ = hasher  # type: ignore[assignment]
    return cls


def slot_constructor(cls: type) -> Callable[..., Any]:
    """A function that builds an instance of attrs frozen ``cls`` from ``cls``'s init arguments
    without ``type.__call__`` (``object.__new__`` then the slot writes of ``slot_init``); ``cls``
    itself when the class is outside the fast path. Same law as ``slot_init``. O(fields) once."""
    made = _generated(cls)
    return cls if made is None else made[1]


def _generated(cls: type) -> tuple[Callable[..., None], Callable[..., Any]] | None:
    """``(__init__, constructor)`` of ``cls``'s fields, or ``None`` outside the fast path."""
    if not attrs.has(cls) or any(
        hasattr(cls, hook) for hook in ("__attrs_pre_init__", "__attrs_post_init__")
    ):
        return None
    params: list[str] = []
    keyword_params: list[str] = []
    body: list[str] = []
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for i, field in enumerate(attrs.fields(cls)):
        setter = _slot_setter(cls, field.name)
        if setter is None or field.validator is not None or field.converter is not None:
            return None
        if field.on_setattr not in (None, attrs.setters.NO_OP):
            return None
        scope[f"_set{i}"] = setter
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            if default.takes_self:
                return None
            scope[f"_factory{i}"] = default.factory
        elif default is not attrs.NOTHING:
            scope[f"_default{i}"] = default
        if not field.init:
            if default is attrs.NOTHING:
                continue  # attrs leaves such a field unset too
            value = f"_factory{i}()" if f"_factory{i}" in scope else f"_default{i}"
            body.append(f"    _set{i}(self, {value})")
            continue
        arg = field.alias
        if f"_factory{i}" in scope:
            param = f"{arg}=_NOTHING"
            body.append(f"    _set{i}(self, _factory{i}() if {arg} is _NOTHING else {arg})")
            scope["_NOTHING"] = attrs.NOTHING
        else:
            param = arg if default is attrs.NOTHING else f"{arg}=_default{i}"
            body.append(f"    _set{i}(self, {arg})")
        (keyword_params if field.kw_only else params).append(param)
    cached = _slot_setter(cls, _CACHED_HASH)
    if cached is not None:
        scope["_set_hash"] = cached
        body.append("    _set_hash(self, None)")
    signature = ", ".join(params + (["*", *keyword_params] if keyword_params else []))
    lead = f"self, {signature}" if signature else "self"
    lines = "\n".join(body or ["    pass"])
    source = (
        f"def __init__({lead}):\n{lines}\n"
        f"def construct({signature}):\n    self = _new(_cls)\n{lines}\n    return self\n"
    )
    exec(compile(source, f"<slot_init {cls.__qualname__}>", "exec"), scope)  # noqa: S102
    init, construct = scope["__init__"], scope["construct"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(getattr(cls.__init__, "__annotations__", {}))
    construct.__qualname__ = f"construct_{cls.__qualname__}"
    return init, construct


def _cached_hash(cls: type) -> Callable[[Any], int] | None:
    """A ``__hash__`` for a ``cache_hash=True`` class that hashes the same fields as attrs' and
    caches a plain ``int`` in the same slot (attrs caches an ``int`` subclass object, one more
    object for the collector per hashed value). ``None`` when attrs' hash must stay."""
    slot = _slot_member(cls, _CACHED_HASH)
    hashed = []
    for field in attrs.fields(cls):
        if field.hash is None:
            if field.eq and field.eq_key is not None:
                return None
            if field.eq:
                hashed.append(field.name)
        elif field.hash:
            hashed.append(field.name)
    if slot is None or not getattr(cls.__hash__, "__code__", None) or (
        not cls.__hash__.__code__.co_filename.startswith("<attrs generated")
    ):
        return None
    fields = "".join(f"self.{name}, " for name in hashed)
    source = (
        "def __hash__(self):\n"
        f"    found = self.{_CACHED_HASH}\n"
        "    if found is None:\n"
        f"        found = hash((_salt, {fields}))\n"
        "        _write(self, found)\n"
        "    return found\n"
    )
    scope = {"_salt": hash(f"{cls.__module__}.{cls.__qualname__}"), "_write": slot.__set__}
    exec(compile(source, f"<slot_init {cls.__qualname__}>", "exec"), scope)  # noqa: S102
    __hash__ = scope["__hash__"]
    __hash__.__qualname__ = f"{cls.__qualname__}.__hash__"
    return __hash__


def _slot_member(cls: type, name: str) -> MemberDescriptorType | None:
    for klass in cls.__mro__:
        found = klass.__dict__.get(name)
        if found is not None:
            return found if isinstance(found, MemberDescriptorType) else None
    return None


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None] | None:
    """The ``__set__`` of the slot ``name`` of ``cls`` (from the class that declares it)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name)
        if found is not None:
            return found.__set__ if isinstance(found, MemberDescriptorType) else None
    return None
