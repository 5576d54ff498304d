"""The lowered root module: pytree inputs and outputs, input checks, and the root graph."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.unflatten import FlatArgsAdapter, UnflattenedModule

from lowering.codegen import compile_graph
from lowering.constraints import input_checks, ranges_of
from lowering.inputs import flatten_inputs
from lowering.portable import decode_graph, encode_graph
from lowering.modules import LoweredModule, is_tracing, print_readable


class LoweredRoot(UnflattenedModule):
    """The module ``lower`` returns: behaves like ``torch.export.unflatten``'s result.

    ``forward(*args, **kwargs)`` takes the eager model's inputs (any keyword order, dicts in any key
    order, or another structure through ``flat_args_adapter``), checks them against the exported
    constraints (``check_input_constraints``), runs the root graph and returns the eager output
    structure.
    """

    def __init__(
        self,
        graph: torch.fx.Graph,
        code: Callable[..., Any],
        *,
        type_name: str | None,
        in_spec: Any,
        out_spec: Any,
        range_constraints: Any,
        module_call_graph: list,
        flat_args_adapter: FlatArgsAdapter | None,
        interpreter: bool,
    ) -> None:
        torch.nn.Module.__init__(self)
        graph.owning_module = self
        self.graph = graph
        self._code = code
        self._ty = type_name
        self._in_spec = in_spec
        self._out_spec = out_spec
        self.range_constraints = range_constraints
        self.equality_constraints: list = []
        self.module_call_graph = module_call_graph
        self.flat_args_adapter = flat_args_adapter
        self.adapted = False
        self.check_input_constraints = True
        self._run_with_interpreter = interpreter
        self.meta: dict[str, Any] = {}
        self.input_placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self._input_checks = input_checks(self.input_placeholders)
        self._ranges = ranges_of(range_constraints)
        self._dispatchers: list[LoweredModule] = []

    def process_forward_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """The flat inputs of a call, as the root graph takes them (checked unless tracing)."""
        if self._in_spec is None:
            return list(args)
        if is_tracing():
            return pytree.tree_leaves((args, kwargs))
        return flatten_inputs(self, args, kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        flat = self.process_forward_inputs(*args, **kwargs)
        for mod in self._dispatchers:
            mod.reset_calls()
        if self._run_with_interpreter and not torch.compiler.is_dynamo_compiling():
            out = torch.fx.Interpreter(self, graph=self.graph).run(*flat, enable_io_processing=False)
        else:
            out = self._code(self, *flat)
        if self._out_spec is None:
            return out
        if is_tracing():
            out = [out[i] for i in range(self._out_spec.num_leaves)]
        return pytree.tree_unflatten(list(out), self._out_spec)

    def finalize(self) -> None:
        """Kept for API parity with ``UnflattenedModule``; code is generated at lowering."""

    def print_readable(
        self,
        print_output: bool = True,
        include_stride: bool = False,
        include_device: bool = False,
        colored: bool = False,
    ) -> str:
        """Generated code of the root and every submodule with a graph, nested by name."""
        return print_readable(self, print_output, include_stride, include_device, colored)

    def __deepcopy__(self, memo: dict) -> LoweredRoot:
        from lowering.modules import _deepcopy_module

        return _deepcopy_module(self, memo)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["graph"] = encode_graph(self.graph)
        del state["_code"], state["input_placeholders"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__["graph"] = decode_graph(state["graph"])
        self.graph.owning_module = self
        self.input_placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        self._code = compile_graph(self.graph)
