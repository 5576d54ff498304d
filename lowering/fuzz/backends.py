"""The backends the fuzzer compares with eager: torch's built-in compilers by name, or a callable.

A backend is a :class:`Backend`: its name in the report, its ``target`` (a built-in name or
``"callable"``), and ``build(program, module, setup)``, which returns what runs (a callable
taking the program's inputs) and what holds the state after the call. Each built-in also gives
the lines of a standalone repro script that compile ``Repro()`` the same way
(``lowering.fuzz.repro``).

Built-ins:

- ``"inductor"``: ``torch.compile(module)`` with its defaults, on the lowered module;
- ``"aot_inductor"``: ``lowering.export_ep``, then ``torch._inductor.aoti_compile_and_package``
  and ``aoti_load_package`` (state is not observed: the package holds its own copy);
- ``"decompositions"``: ``export_ep(p).run_decompositions().module()``.

A callable ``compile(module) -> callable`` is applied to the freshly lowered module.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from ir.errors import PurefxError
from ir.program import Program
from lowering.export import export_ep
from lowering.fuzz.judge import Setup
from lowering.lowering_seam import aoti_compile_and_load, reset_dynamo

BUILTINS = ("inductor", "aot_inductor", "decompositions")
"""The built-in backends, by name."""


class FuzzError(PurefxError):
    """A bad argument to the fuzzer (a backend, a strategy, a budget), named in the message."""


@attrs.frozen
class Backend:
    """One backend: ``name`` (as the caller keyed it), ``target`` (one of :data:`BUILTINS` or
    ``"callable"``), ``compile`` (the user's callable, for ``"callable"``)."""

    name: str
    target: str
    compile: Callable[[torch.nn.Module], Callable[..., Any]] | None = None

    @property
    def observes_state(self) -> bool:
        """Whether the state after the call can be read (not from an AOTInductor package)."""
        return self.target != "aot_inductor"

    def build(self, program: Program, module: torch.nn.Module, setup: Setup
              ) -> tuple[Callable[..., Any], Any]:
        """What runs for ``program`` (``module`` is its fresh lowered module) and what holds
        its state after the call. Compiling may raise: the caller counts that as a crash."""
        reset_dynamo()  # a fresh compile: no cache hit, no recompile limit reached
        if self.target == "callable":
            return self.compile(module), module
        if self.target == "inductor":  # other sizes: compiled for every size at once
            return torch.compile(module, dynamic=True if setup.sizes > 1 else None), module
        ep = export_ep(program)
        if self.target == "decompositions":
            run = ep.run_decompositions().module()
            if setup.dtype is not None:
                run = run.to(setup.dtype)
            return run, run
        if setup.dtype is not None:
            raise FuzzError("backend 'aot_inductor' runs the program's own state; dtype= "
                            "is not supported for it (use 'inductor')")
        with tempfile.TemporaryDirectory() as tmp:
            loaded = aoti_compile_and_load(ep, os.path.join(tmp, "program.pt2"))
        return loaded, None


def resolve(backends: Mapping[str, Any]) -> tuple[Backend, ...]:
    """``backends`` (name -> built-in name or callable) as :class:`Backend` values; a
    ``FuzzError`` naming the entry for anything else. O(len(backends))."""
    if not isinstance(backends, Mapping) or not backends:
        raise FuzzError(f"backends must be a non-empty mapping name -> backend, got {backends!r}")
    out = []
    for name, spec in backends.items():
        if not isinstance(name, str):
            raise FuzzError(f"backend names must be strings, got {name!r}")
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


REPRO_COMPILE: Mapping[str, str] = {
    "inductor": (
        "def compile_backend(module):\n"
        "    \"\"\"The backend as the fuzzer ran it: torch.compile (dynamic=True at several\n"
        "    sizes).\"\"\"\n"
        "    return torch.compile(module, dynamic=DYNAMIC)\n"),
    "decompositions": (
        "def compile_backend(module):\n"
        "    \"\"\"The backend as the fuzzer ran it: export, run_decompositions, run.\"\"\"\n"
        "    ep = torch.export.export(module, make_inputs(), dynamic_shapes=DYNAMIC_SHAPES)\n"
        "    return ep.run_decompositions().module()\n"),
    "aot_inductor": (
        "def compile_backend(module):\n"
        "    \"\"\"The backend as the fuzzer ran it: export, AOTInductor package, load.\"\"\"\n"
        "    import os, tempfile\n"
        "    ep = torch.export.export(module, make_inputs(), dynamic_shapes=DYNAMIC_SHAPES)\n"
        "    tmp = tempfile.mkdtemp()\n"
        "    path = torch._inductor.aoti_compile_and_package(\n"
        "        ep, package_path=os.path.join(tmp, 'repro.pt2'))\n"
        "    return torch._inductor.aoti_load_package(path)\n"),
    "callable": (
        "def compile_backend(module):\n"
        "    \"\"\"Stands for your backend: run this file's difference(your_compile) with your\n"
        "    compile(module) -> callable; run as a script, it compares eager with eager.\"\"\"\n"
        "    return module\n"),
}
"""Per target, the ``compile_backend(module)`` a repro script defines (the script defines
``DYNAMIC``, ``None`` or ``True`` at several sizes, and ``DYNAMIC_SHAPES``, ``None`` or the
``torch.export.Dim`` spec of ``make_inputs()``)."""


__all__ = ["BUILTINS", "REPRO_COMPILE", "Backend", "FuzzError", "resolve"]
