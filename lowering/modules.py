"""The torch module classes that ``lower`` builds.

Graph-running modules are instances of torch's public ``InterpreterModule`` (and, when a module's
calls run different graphs, of ``InterpreterModuleDispatcher`` too), so code that checks for those
classes keeps working. Containers keep their container behaviour (indexing, ``len``).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.fx
from torch.export.unflatten import InterpreterModule, InterpreterModuleDispatcher
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from ir.module import MODULE_DICT, MODULE_LIST, PARAMETER_DICT, PARAMETER_LIST, SEQUENTIAL
from lowering.codegen import compile_graph
from lowering.portable import decode_graph, encode_graph


class Holder(torch.nn.Module):
    """A module that runs no graph of its own (never called in the program); keeps the type name."""

    def __init__(self, type_name: str | None = None) -> None:
        super().__init__()
        self._ty = type_name

    def type_name(self) -> str | None:
        """The original class's qualified name, as ``torch.export.unflatten`` reports it."""
        return self._ty


class PlainHolder(Holder):
    """A never-called module of no known container class, readable like a dict of its members.

    A container that is never called leaves no class name in the program, so an
    ``nn.ModuleDict`` or ``nn.ParameterDict`` comes back as a holder; ``holder["a"]``, ``len``,
    ``keys()`` and iteration over names keep working (over children, parameters and buffers).
    """

    def _members(self) -> dict[str, Any]:
        return {**self._parameters, **self._buffers, **self._modules}

    def __getitem__(self, key: str) -> Any:
        found = self._members().get(key) if isinstance(key, str) else None
        if found is None:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        return key in self._members()

    def __len__(self) -> int:
        return len(self._members())

    def __iter__(self):
        return iter(self._members())

    def keys(self):
        return self._members().keys()

    def items(self):
        return self._members().items()

    def values(self):
        return self._members().values()

    def __bool__(self) -> bool:
        return True


class LoweredModule(InterpreterModule):
    """A module that runs one fx graph (or, per call, one of several) as generated code.

    ``interpreter=True`` runs ``torch.fx.Interpreter`` instead, for debugging.
    """

    def __init__(
        self,
        ir_graphs: tuple,
        codes: list[Callable[..., Any]],
        call_graphs: tuple[int, ...],
        type_name: str | None,
        interpreter: bool,
        fx_graphs: list[torch.fx.Graph | None] | None = None,
    ) -> None:
        torch.nn.Module.__init__(self)
        self.__dict__["_ir_graphs"] = ir_graphs
        self.__dict__["_fx_graphs"] = fx_graphs or [None] * len(ir_graphs)
        self._codes = codes
        self._call_graphs = call_graphs
        self._num_calls = 0
        self._ty = type_name
        self._run_with_interpreter = interpreter
        self.__dict__["graph_module"] = None

    @property
    def graphs(self) -> list[torch.fx.Graph]:
        """The fx graph of each call variant (built on first use from the IR)."""
        fx_graphs = self.__dict__["_fx_graphs"]
        if any(g is None for g in fx_graphs):
            from lowering.codegen import to_fx_graph

            for i, g in enumerate(fx_graphs):
                if g is None:
                    fx_graphs[i] = to_fx_graph(self.__dict__["_ir_graphs"][i])[0]
                    fx_graphs[i].owning_module = self
        return fx_graphs

    @property
    def graph(self) -> torch.fx.Graph:
        """The fx graph of the first call variant."""
        return self.graphs[0]

    @property
    def arg_names(self) -> list[str]:
        return [n.target for n in self.graph.nodes if n.op == "placeholder"]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        index = 0
        if self._call_graphs:
            index = self._call_graphs[self._num_calls]
            self._num_calls = (self._num_calls + 1) % len(self._call_graphs)
        if self._run_with_interpreter and not torch.compiler.is_dynamo_compiling():
            return self._interpret(self.graphs[index], args, kwargs)
        if kwargs:
            args = self._bind(index, args, kwargs)
        return self._codes[index](self, *args)

    def _bind(self, index: int, args: tuple, kwargs: dict) -> tuple:
        """Positional arguments for graph ``index`` from a call with keyword arguments."""
        names = self._placeholder_names(index)[len(args):]
        unknown = set(kwargs) - set(names)
        if unknown:
            raise TypeError(f"{type(self).__name__}.forward() got unexpected keyword arguments {sorted(unknown)}")
        missing = [n for n in names if n not in kwargs]
        if missing:
            raise TypeError(f"{type(self).__name__}.forward() is missing arguments {missing}")
        return args + tuple(kwargs[n] for n in names)

    def _placeholder_names(self, index: int) -> list[str]:
        ir_graphs = self.__dict__.get("_ir_graphs")
        if ir_graphs is not None:
            return [n.name for n in ir_graphs[index].placeholders]
        return [n.target for n in self.graphs[index].nodes if n.op == "placeholder"]

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
        state["_fx_graphs"] = [encode_graph(g) for g in self.graphs]
        state["_ir_graphs"] = None
        del state["_codes"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        fx_graphs = [decode_graph(g) for g in state["_fx_graphs"]]
        for g in fx_graphs:
            g.owning_module = self
        self.__dict__["_fx_graphs"] = fx_graphs
        self._codes = [compile_graph(g) for g in fx_graphs]


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
    graphs = mod.graphs if isinstance(mod, LoweredModule) else [getattr(mod, "graph", None)]
    for i, graph in enumerate(g for g in graphs if isinstance(g, torch.fx.Graph)):
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


def _deepcopy_module(mod: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """Deep-copy a lowered module: state and children copied; compiled code and the immutable
    IR graphs shared; fx graphs rebuilt on demand (node meta is shared, as fx copies do)."""
    import copy

    cls = type(mod)
    new = cls.__new__(cls)
    memo[id(mod)] = new
    for key, value in mod.__dict__.items():
        if key in ("_codes", "_code", "_ir_graphs"):
            new.__dict__[key] = value
        elif key == "_fx_graphs":
            new.__dict__[key] = [_copy_graph(g, new) if g is not None else None for g in value]
        elif key == "graph":
            new.__dict__[key] = _copy_graph(value, new)
        elif key != "input_placeholders":
            new.__dict__[key] = copy.deepcopy(value, memo)
    if "input_placeholders" in mod.__dict__:
        new.__dict__["input_placeholders"] = [n for n in new.graph.nodes if n.op == "placeholder"]
    return new


def _copy_graph(graph: torch.fx.Graph, owner: torch.nn.Module) -> torch.fx.Graph:
    fresh = torch.fx.Graph()
    fresh.output(fresh.graph_copy(graph, {}))
    fresh.owning_module = owner
    return fresh


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
