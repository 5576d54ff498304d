"""The torch module classes that ``lower`` builds.

Graph-running modules are instances of torch's public ``InterpreterModule`` (and, when a module's
calls run different graphs, of ``InterpreterModuleDispatcher`` too), so code that checks for those
classes keeps working. Containers keep their container behaviour (indexing, ``len``).
"""

from __future__ import annotations

from typing import Any, Callable

import sys

import torch
import torch.fx
from torch.export.unflatten import InterpreterModule, InterpreterModuleDispatcher
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from ir.module import MODULE_DICT, MODULE_LIST, PARAMETER_DICT, PARAMETER_LIST, SEQUENTIAL


class Holder(torch.nn.Module):
    """A module that runs no graph of its own (never called in the program); keeps the type name."""

    def __init__(self, type_name: str | None = None) -> None:
        super().__init__()
        self._ty = type_name

    def type_name(self) -> str | None:
        """The original class's qualified name, as ``torch.export.unflatten`` reports it."""
        return self._ty


class LoweredModule(InterpreterModule):
    """A module that runs one fx graph (or, per call, one of several) as generated code.

    ``interpreter=True`` runs ``torch.fx.Interpreter`` instead, for debugging.
    """

    def __init__(
        self,
        graphs: list[torch.fx.Graph],
        codes: list[Callable[..., Any]],
        call_graphs: tuple[int, ...],
        type_name: str | None,
        interpreter: bool,
    ) -> None:
        torch.nn.Module.__init__(self)
        for g in graphs:
            g.owning_module = self
        self.graph = graphs[0]
        self.graphs = graphs
        self._codes = codes
        self._call_graphs = call_graphs
        self._num_calls = 0
        self._ty = type_name
        self._run_with_interpreter = interpreter
        self.arg_names = [n.target for n in graphs[0].nodes if n.op == "placeholder"]
        self.__dict__["graph_module"] = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        index = 0
        if self._call_graphs:
            index = self._call_graphs[self._num_calls]
            self._num_calls = (self._num_calls + 1) % len(self._call_graphs)
        if self._run_with_interpreter and not torch.compiler.is_dynamo_compiling():
            return self._interpret(self.graphs[index], args, kwargs)
        return self._codes[index](self, *args, **kwargs)

    def _interpret(self, graph: torch.fx.Graph, args: tuple, kwargs: dict) -> Any:
        if kwargs:
            names = [n.target for n in graph.nodes if n.op == "placeholder"][len(args):]
            args = args + tuple(kwargs[name] for name in names)
        return torch.fx.Interpreter(self, graph=graph).run(*args, enable_io_processing=False)

    def reset_calls(self) -> None:
        """Start the per-call graph dispatch over (the root does this before each call)."""
        self._num_calls = 0

    def finalize(self) -> None:
        """Kept for API parity with ``InterpreterModule``; code is generated at lowering."""

    def print_readable(
        self,
        print_output: bool = True,
        include_stride: bool = False,
        include_device: bool = False,
        colored: bool = False,
    ) -> str:
        """Generated code of this module and every submodule below it, nested by name."""
        return print_readable(self, print_output, include_stride, include_device, colored)

    def __deepcopy__(self, memo: dict) -> LoweredModule:
        return _deepcopy_module(self, memo)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_codes"] = None
        state["graph_module"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        from lowering.codegen import compile_graph

        self._codes = [compile_graph(g) for g in self.graphs]


class LoweredDispatcher(LoweredModule, InterpreterModuleDispatcher):
    """A lowered module whose calls run different graphs (one per call, in program order)."""

    def call_modules(self) -> list[LoweredModule]:
        """One view per distinct graph, for parity with ``InterpreterModuleDispatcher``."""
        return [self]


def print_readable(
    mod: torch.nn.Module,
    print_output: bool = True,
    include_stride: bool = False,
    include_device: bool = False,
    colored: bool = False,
) -> str:
    """Readable generated code of ``mod`` and of each submodule with a graph (shared ones once)."""
    options = dict(verbose=True, include_stride=include_stride, include_device=include_device, colored=colored)
    text = _readable(mod, type(mod).__name__, options, set())
    if print_output:
        sys.stdout.write(text + "\n")  # the caller asked for it, as in torch
    return text


def _readable(mod: torch.nn.Module, name: str, options: dict, seen: set[int]) -> str:
    seen.add(id(mod))
    lines = [f"class {name}(torch.nn.Module):"]
    graphs = mod.__dict__.get("graphs") or [mod.__dict__.get("graph")]
    for i, graph in enumerate(g for g in graphs if g is not None):
        if i:
            lines.append(f"    # call variant {i}")
        src = graph.python_code(root_module="self", **options).src.strip("\n")
        lines += ["    " + line if line else line for line in src.split("\n")]
    for child_name, child in mod.named_children():
        if id(child) in seen:
            lines.append(f"    # {child_name}: shared, printed above")
            continue
        if any(isinstance(m, (LoweredModule,)) for m in child.modules()):
            nested = _readable(child, child_name, options, seen)
            lines += ["    " + line if line else line for line in nested.split("\n")]
    return "\n".join(lines)


_SHARED_ON_COPY = ("_codes", "_code")
_REBUILT_ON_COPY = ("graph", "graphs", "input_placeholders")


def _deepcopy_module(mod: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """Deep-copy a lowered module: state and children copied, compiled code shared, fx graphs
    copied node by node (their meta is shared, as fx does)."""
    import copy

    cls = type(mod)
    new = cls.__new__(cls)
    memo[id(mod)] = new
    for key, value in mod.__dict__.items():
        if key in _SHARED_ON_COPY:
            new.__dict__[key] = value
        elif key not in _REBUILT_ON_COPY:
            new.__dict__[key] = copy.deepcopy(value, memo)
    graphs = []
    for g in mod.__dict__.get("graphs") or [mod.__dict__["graph"]]:
        fresh = torch.fx.Graph()
        fresh.output(fresh.graph_copy(g, {}))
        fresh.owning_module = new
        graphs.append(fresh)
    new.__dict__["graph"] = graphs[0]
    if "graphs" in mod.__dict__:
        new.__dict__["graphs"] = graphs
    if "input_placeholders" in mod.__dict__:
        new.__dict__["input_placeholders"] = [n for n in graphs[0].nodes if n.op == "placeholder"]
    return new


class LoweredSequential(LoweredModule, torch.nn.Sequential):
    """A lowered ``nn.Sequential``: runs its graph, and still indexes and iterates like one."""

    forward = LoweredModule.forward


class HolderSequential(Holder, torch.nn.Sequential):
    """An ``nn.Sequential`` that is never called in the program."""


class HolderModuleList(Holder, torch.nn.ModuleList):
    """An ``nn.ModuleList`` (containers of this kind are never called)."""


class HolderModuleDict(Holder, torch.nn.ModuleDict):
    """An ``nn.ModuleDict``."""


class HolderParameterList(Holder, torch.nn.ParameterList):
    """An ``nn.ParameterList``."""


class HolderParameterDict(Holder, torch.nn.ParameterDict):
    """An ``nn.ParameterDict``."""


HOLDER_CLASSES = {
    SEQUENTIAL: HolderSequential,
    MODULE_LIST: HolderModuleList,
    MODULE_DICT: HolderModuleDict,
    PARAMETER_LIST: HolderParameterList,
    PARAMETER_DICT: HolderParameterDict,
}
LOWERED_CLASSES = {SEQUENTIAL: LoweredSequential}


def is_tracing() -> bool:
    """Whether an fx symbolic trace is running (input checks are skipped then, as torch does)."""
    return is_fx_symbolic_tracing()
