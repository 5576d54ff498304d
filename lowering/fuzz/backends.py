"""The backends the fuzzer compares with eager: torch's built-in compilers by name, or a callable.

A backend is a :class:`Backend`: its name in the report, its ``target`` (a built-in name or
``"callable"``), and ``build(program, module, setup)``, which returns what runs (a callable
taking the program's inputs) and what holds the state after the call. Per target, a row of
:data:`TARGETS` says how it is built, the lines of a standalone repro script that compile
``Repro()`` the same way (``lowering.fuzz.repro``), and its *reference*: the identity compiler
through the same machinery, which ``lowering.fuzz.refusals`` runs to tell a refusal of the
machinery (shared, so not the backend's) from the backend's own crash.

Built-ins (:data:`BUILTINS`):

- ``"inductor"``: ``torch.compile(module)`` with its defaults, on the lowered module (every
  ``torch.compile`` target, references included, with ``dynamic=True`` under ``sizes > 1``);
- ``"aot_eager"``: ``torch.compile(module, backend="aot_eager")``: dynamo, AOTAutograd and its
  functionalization without inductor (separates their bugs from inductor's);
- ``"aot_inductor"``: ``lowering.export_ep``, then ``torch._inductor.aoti_compile_and_package``
  and ``aoti_load_package`` (state is not observed: the package holds its own copy);
- ``"decompositions"``: ``export_ep(p).run_decompositions().module()``;
- ``"export_roundtrip"``: ``torch.export.export`` of the lowered module (with
  :func:`export_shapes` where a size is symbolic), ``torch.export.save`` into an in-memory
  buffer, ``torch.export.load`` from it, ``.module()``; the state after the call is read from
  it, else (state the exported graph does not use, which export leaves out) from the lowered
  module (:class:`Either`);
- ``"unflatten"``: ``torch.export.unflatten(export_ep(p))``: torch's own rebuild of the
  module hierarchy from the program's preserved calls (what purefx's lowering replaces); the
  fuzzer keeps the preserved call signatures for it (:attr:`Backend.wants_calls`) and draws
  programs whose values and state cross them (``lowering.fuzz.fuzz_programs``).

A callable ``compile(module) -> callable`` is applied to the freshly lowered module; its
reference is the identity ``aot_autograd`` backend through ``torch.compile`` (a custom backend
is most often written as one).
"""

from __future__ import annotations

import inspect
import io
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from ir.errors import PurefxError
from ir.program import Program
from lowering.export import export_ep
from lowering.fuzz.call_sizes import export_dynamic_shapes
from lowering.fuzz.judge import Setup, example_inputs
from lowering.lowering_seam import aoti_compile_and_load, identity_aot_backend, reset_dynamo

Built = tuple[Callable[..., Any], Any]
"""What a build gives: the callable that runs and what holds the state after the call."""


class FuzzError(PurefxError):
    """A bad argument to the fuzzer (a backend, a strategy, a budget), named in the message."""


def _cast(module: Any, setup: Setup) -> Any:
    return module.to(setup.dtype) if setup.dtype is not None else module


def _dynamic(setup: Setup) -> bool | None:
    """``torch.compile``'s ``dynamic``: ``True`` under ``sizes > 1`` (one compile for every
    size the program is called at), else its default."""
    return True if setup.sizes > 1 else None


def _inductor(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    return torch.compile(module, dynamic=_dynamic(setup)), module


def _aot_eager(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    return torch.compile(module, backend="aot_eager", dynamic=_dynamic(setup)), module


def _dynamo_eager(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    return torch.compile(module, backend="eager", dynamic=_dynamic(setup)), module


def _aot_identity(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    return torch.compile(module, backend=identity_aot_backend(), dynamic=_dynamic(setup)), module


def _decompositions(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    run = _cast(export_ep(program).run_decompositions().module(), setup)
    return run, run


def _export_module(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    run = _cast(export_ep(program).module(), setup)
    return run, run


def _aot_inductor(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    if setup.dtype is not None:
        raise FuzzError("backend 'aot_inductor' runs the program's own state; dtype= "
                        "is not supported for it (use 'inductor')")
    ep = export_ep(program)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = aoti_compile_and_load(ep, os.path.join(tmp, "program.pt2"))
    return loaded, None


def dynamic_shapes(program: Program, module: torch.nn.Module) -> dict[str, Any] | None:
    """What ``torch.export.export(module, ...)`` of ``program``'s lowered ``module`` is given
    as ``dynamic_shapes``: per parameter of ``module.forward`` (the flat user inputs, in
    order), ``Dim.AUTO`` at each symbolic size of its placeholder's value (the lowered module's
    input checks give export the program's ranges, ``docs/export.md``); ``None`` when no size
    is symbolic (exporting without them fails: the checks name symbols export never made).
    O(user inputs)."""
    users = {s.name for s in program.signature.user_inputs()}
    vals = [n.meta.get("val") for n in program.root_module.graph.placeholders
            if n.name in users]
    names = list(inspect.signature(module.forward).parameters)
    shapes, symbolic = {}, False
    for name, val in zip(names, vals):
        dims = {}
        if isinstance(val, torch.Tensor):
            dims = {i: torch.export.Dim.AUTO for i, d in enumerate(val.shape)
                    if not isinstance(d, int)}
        symbolic |= bool(dims)
        shapes[name] = dims or None
    return shapes if symbolic and len(names) == len(vals) else None


def export_shapes(program: Program, module: torch.nn.Module, setup: Setup
                  ) -> dict[str, Any] | None:
    """The ``dynamic_shapes`` an exporting backend gives ``torch.export.export`` of
    ``program``'s lowered ``module``: :func:`dynamic_shapes` (``Dim.AUTO`` at every symbolic
    size), and under ``setup.sizes > 1`` each whole-dimension symbol as the named ``Dim`` of
    ``lowering.fuzz.call_sizes.export_dynamic_shapes`` over it (its range the program's, as
    the repro script's ``DYNAMIC_SHAPES`` says: the export must take every size the fuzzer
    calls it at, not only the drawn one). ``None`` when no size is symbolic. O(user inputs'
    dims)."""
    auto = dynamic_shapes(program, module)
    named = export_dynamic_shapes(program, module) if setup.sizes > 1 else None
    if named is None:
        return auto
    if auto is None:
        return named
    return {k: {**(auto.get(k) or {}), **(named.get(k) or {})} or None for k in auto}


def _exported(program: Program, module: torch.nn.Module, setup: Setup
              ) -> torch.export.ExportedProgram:
    args, kwargs = example_inputs(program, setup)
    for sub in module.modules():
        # a lowered module builds its fx graph (and its meta, from the program's own symbolic
        # values) on first use: settled here, before export's tracer would see those symbols
        getattr(sub, "graph", None)
    return torch.export.export(module, args, kwargs,
                               dynamic_shapes=export_shapes(program, module, setup))


class Either:
    """Reads state from ``first``, else from ``second``: the module an export made, which
    holds only the state its graph uses, over the lowered module it was made from, whose state
    the call could not have written (so a write the export lost still differs from eager)."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def __getattr__(self, name: str) -> Any:
        a = getattr(self.first, name, None)
        b = getattr(self.second, name, None)
        if isinstance(a, torch.Tensor) or b is None:
            return a
        if a is None or isinstance(b, torch.Tensor):
            return b
        return Either(a, b)


def _export(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    run = _exported(program, module, setup).module()
    return run, Either(run, module)


def _export_roundtrip(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    buffer = io.BytesIO()
    torch.export.save(_exported(program, module, setup), buffer)
    buffer.seek(0)
    run = torch.export.load(buffer).module()
    return run, Either(run, module)


def _unflatten(program: Program, module: torch.nn.Module, setup: Setup) -> Built:
    run = _cast(torch.export.unflatten(export_ep(program)), setup)
    return run, run


_EXPORT_INPUTS = ("    ep = torch.export.export(module, make_inputs(), "
                  "dynamic_shapes=DYNAMIC_SHAPES)\n")


@attrs.frozen
class Target:
    """How one target is built: ``build(program, module, setup) -> (run, holder)``; ``repro``
    (the ``compile_backend(module)`` a repro script defines); ``reference`` (the target of the
    identity compiler through the same machinery, ``None`` for none below it);
    ``observes_state`` (the state after the call can be read); ``wants_calls`` (it reads the
    program's preserved call signatures)."""

    build: Callable[[Program, torch.nn.Module, Setup], Built]
    repro: str
    reference: str | None
    observes_state: bool = True
    wants_calls: bool = False


def _repro(doc: str, *body: str) -> str:
    return ("def compile_backend(module):\n"
            f"    \"\"\"The backend as the fuzzer ran it: {doc}\"\"\"\n" + "".join(body))


TARGETS: Mapping[str, Target] = {
    # public built-ins
    "inductor": Target(_inductor, _repro("torch.compile (dynamic=True at several sizes).",
                                         "    return torch.compile(module, dynamic=DYNAMIC)\n"),
                       "aot_eager"),
    "aot_eager": Target(_aot_eager, _repro("dynamo and AOTAutograd, no inductor.",
                                           "    return torch.compile(module, "
                                           "backend='aot_eager', dynamic=DYNAMIC)\n"),
                        "dynamo_eager"),
    "aot_inductor": Target(_aot_inductor, _repro(
        "export, AOTInductor package, load.",
        "    import os, tempfile\n", _EXPORT_INPUTS,
        "    tmp = tempfile.mkdtemp()\n"
        "    path = torch._inductor.aoti_compile_and_package(\n"
        "        ep, package_path=os.path.join(tmp, 'repro.pt2'))\n"
        "    return torch._inductor.aoti_load_package(path)\n"), "decompositions",
        observes_state=False),
    "decompositions": Target(_decompositions, _repro(
        "export, run_decompositions, run.", _EXPORT_INPUTS,
        "    return ep.run_decompositions().module()\n"), "export_module"),
    "export_roundtrip": Target(_export_roundtrip, _repro(
        "export, save and load through a buffer, run.",
        "    import io\n", _EXPORT_INPUTS,
        "    buffer = io.BytesIO()\n"
        "    torch.export.save(ep, buffer)\n"
        "    buffer.seek(0)\n"
        "    return torch.export.load(buffer).module()\n"), "export"),
    "unflatten": Target(_unflatten, _repro(
        "export, torch.export.unflatten, run.\n"
        "    (The flat form, for a program whose calls cannot be written nested; the nested\n"
        "    form keeps them: lowering.fuzz.repro_calls.NESTED_COMPILE.)",
        _EXPORT_INPUTS, "    return torch.export.unflatten(ep)\n"), "export_module",
        wants_calls=True),
    "callable": Target(lambda p, m, s: (m, m), _repro(
        "stands in for your backend.\n"
        "    Run this file's difference(your_compile) with your compile(module) -> callable;\n"
        "    run as a script, it compares eager with eager.", "    return module\n"),
        "aot_identity"),
    # references only: the identity compiler through a built-in's machinery
    "dynamo_eager": Target(_dynamo_eager, _repro("dynamo alone.",
                                                 "    return torch.compile(module, "
                                                 "backend='eager', dynamic=DYNAMIC)\n"), None),
    "aot_identity": Target(_aot_identity, _repro(
        "an identity compiler through aot_autograd.",
        "    from torch._dynamo.backends.common import aot_autograd\n"
        "    return torch.compile(module, backend=aot_autograd(fw_compiler=lambda gm, ex: gm),\n"
        "                         dynamic=DYNAMIC)\n"),
        "dynamo_eager"),
    "export_module": Target(_export_module, _repro("export, run.", _EXPORT_INPUTS,
                                                   "    return ep.module()\n"), None),
    "export": Target(_export, _repro("export, run.", _EXPORT_INPUTS,
                                     "    return ep.module()\n"), None),
}
"""Every target by name: the public built-ins, ``"callable"`` and the references."""

BUILTINS = ("inductor", "aot_eager", "aot_inductor", "decompositions", "export_roundtrip",
            "unflatten")
"""The built-in backends, by name."""

REPRO_COMPILE: Mapping[str, str] = {name: t.repro for name, t in TARGETS.items()}
"""Per target, the ``compile_backend(module)`` a repro script defines (the script defines
``DYNAMIC``, ``None`` or ``True`` at several sizes, and ``DYNAMIC_SHAPES``, ``None`` or the
``torch.export.Dim`` spec of ``make_inputs()``)."""


@attrs.frozen
class Backend:
    """One backend: ``name`` (as the caller keyed it), ``target`` (a key of :data:`TARGETS`:
    one of :data:`BUILTINS`, ``"callable"`` or a reference), ``compile`` (the user's callable,
    for ``"callable"``)."""

    name: str
    target: str
    compile: Callable[[torch.nn.Module], Callable[..., Any]] | None = None

    @property
    def observes_state(self) -> bool:
        """Whether the state after the call can be read (not from an AOTInductor package)."""
        return TARGETS[self.target].observes_state

    @property
    def wants_calls(self) -> bool:
        """Whether it reads the program's preserved call signatures (``"unflatten"``)."""
        return TARGETS[self.target].wants_calls

    @property
    def reference(self) -> Backend | None:
        """The identity compiler through this backend's machinery (:data:`TARGETS`), named
        ``"<name>~<target>"``; ``None`` where there is none below it. O(1)."""
        below = TARGETS[self.target].reference
        return None if below is None else Backend(f"{self.name}~{below}", below)

    def build(self, program: Program, module: torch.nn.Module, setup: Setup) -> Built:
        """What runs for ``program`` (``module`` is its fresh lowered module) and what holds
        its state after the call. Compiling may raise: the caller counts that as a crash."""
        reset_dynamo()  # a fresh compile: no cache hit, no recompile limit reached
        if self.target == "callable":
            return self.compile(module), module
        return TARGETS[self.target].build(program, module, setup)


def resolve(backends: Mapping[str, Any]) -> tuple[Backend, ...]:
    """``backends`` (name -> built-in name or callable) as :class:`Backend` values; a
    ``FuzzError`` naming the entry for anything else. O(len(backends))."""
    if not isinstance(backends, Mapping) or not backends:
        raise FuzzError(f"backends must be a non-empty mapping name -> backend, got {backends!r}")
    out = []
    for name, spec in backends.items():
        if not isinstance(name, str) or "~" in name:
            raise FuzzError(f"backend names must be strings without '~', got {name!r}")
        if isinstance(spec, str):
            if spec not in BUILTINS:
                raise FuzzError(f"backend {name!r}: unknown built-in {spec!r}; the built-ins "
                                f"are {list(BUILTINS)}, or pass a callable compile(module)")
            out.append(Backend(name, spec))
        elif callable(spec):
            out.append(Backend(name, "callable", spec))
        else:
            raise FuzzError(f"backend {name!r} must be one of {list(BUILTINS)} or a callable "
                            f"compile(module) -> callable, got {spec!r}")
    return tuple(out)


__all__ = ["BUILTINS", "REPRO_COMPILE", "TARGETS", "Backend", "Built", "Either", "FuzzError",
           "Target", "dynamic_shapes", "export_shapes", "resolve"]
