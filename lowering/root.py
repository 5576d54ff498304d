"""The lowered root module: pytree inputs and outputs, input checks, and the root graph."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.unflatten import FlatArgsAdapter, UnflattenedModule

from lowering import tree_watch
from lowering.codegen import compile_graph
from lowering.constraints import input_checks, ranges_of
from lowering.inputs import flatten_inputs
from lowering.modules import (
    LoweredModule,
    is_tracing,
    print_readable,
    reduce_with_signature,
    signature_class,
    usable_name,
)
from lowering.portable import decode_graph, encode_graph
from lowering.tree_watch import Watched, plain_call


class LoweredRoot(Watched, UnflattenedModule):
    """The module ``lower`` returns: behaves like ``torch.export.unflatten``'s result.

    ``forward(*args, **kwargs)`` takes the eager model's inputs (any keyword order, dicts in any key
    order, or another structure through ``flat_args_adapter``), checks them against the exported
    constraints (``check_input_constraints``), runs the root graph and returns the eager output
    structure.
    """

    def __init__(
        self,
        graph: torch.fx.Graph,
        code: Callable[..., Any] | None,
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
        self.__dict__["_code"] = code  # None: compiled on the first call that needs it
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
        direct = self.__dict__.get("_direct")
        if direct is not None and plain_call(flat) and self._tree_unchanged():
            out = direct(self, *flat)
        elif self._run_with_interpreter and not torch.compiler.is_dynamo_compiling():
            out = torch.fx.Interpreter(self, graph=self.graph).run(*flat, enable_io_processing=False)
        else:
            out = (self.__dict__["_code"] or self._compile())(self, *flat)
        if self._out_spec is None:
            return out
        if is_tracing():
            out = [out[i] for i in range(self._out_spec.num_leaves)]
        return pytree.tree_unflatten(list(out), self._out_spec)

    def _compile(self) -> Callable[..., Any]:
        """Compile the root graph's module-by-module code (not needed while direct code runs)."""
        code = compile_graph(self.graph)
        self.__dict__["_code"] = code
        return code

    def _tree_unchanged(self) -> bool:
        """Whether the tree is still as built: re-checked after some tree changed, and every
        ``RECHECK_EVERY`` calls while it is not (removing a hook through its handle is silent)."""
        checked_at, unchanged = self.__dict__.get("_direct_checked", (-1, False))
        now = tree_watch.epoch()
        if checked_at != now:
            unchanged = tree_watch.tree_unchanged(self)
        elif not unchanged:
            calls = self.__dict__.get("_direct_misses", 0) + 1
            self.__dict__["_direct_misses"] = calls % RECHECK_EVERY
            if calls % RECHECK_EVERY == 0:
                unchanged = tree_watch.tree_unchanged(self)
        self.__dict__["_direct_checked"] = (now, unchanged)
        return unchanged

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

    def __reduce_ex__(self, protocol: int) -> Any:
        return reduce_with_signature(self, protocol)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["graph"] = encode_graph(self.graph)
        del state["input_placeholders"]
        state["_code"] = None
        state.pop("_direct", None)  # generated code does not pickle; the copy runs module by module
        state.pop("_direct_checked", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__["graph"] = decode_graph(state["graph"])
        self.graph.owning_module = self
        self.input_placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        self.__dict__["_code"] = None


# Calls between re-checks of a tree found changed (a check is O(modules)).
RECHECK_EVERY = 16


def root_class(in_spec: Any, arg_names: Sequence[str] | None) -> type:
    """A ``LoweredRoot`` subclass whose ``forward`` names the exported arguments.

    Its ``forward`` unwraps to ``forward(self, x, mask, scale)`` (all positional: flat order is
    args then kwargs), so ``torch.fx.symbolic_trace`` (which reads the unwrapped signature) can
    trace the lowered module; calls still go through the generic forward, so bad arity or an
    adapter's other structure reach the input checks. Falls back to ``LoweredRoot`` itself when
    the input spec is not the usual ``(args, kwargs)`` or the names are not usable as Python
    parameters. One class per signature (``lowering.modules.signature_class``).
    """
    return signature_class(LoweredRoot, _signature_names(in_spec, arg_names))


def _signature_names(in_spec: Any, arg_names: Sequence[str] | None) -> tuple[str, ...] | None:
    if in_spec is None or in_spec.type is not tuple or in_spec.num_children != 2:
        return None
    args_spec, kwargs_spec = in_spec.children()
    if args_spec.type is not tuple or kwargs_spec.type is not dict:
        return None
    keywords = tuple(str(k) for k in kwargs_spec.context)
    count = args_spec.num_children
    given = list(arg_names or [])[:count]
    for positional in (
        tuple(given[i] if i < len(given) else f"arg{i}" for i in range(count)),
        tuple(f"arg{i}" for i in range(count)),
    ):
        every = positional + keywords
        if all(map(usable_name, every)) and len(set(every)) == len(every):
            return every
    return None
