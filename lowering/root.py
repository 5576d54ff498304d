"""The lowered root module: pytree inputs and outputs, input checks, and the root graph."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.export.unflatten import FlatArgsAdapter, UnflattenedModule

from ir.args import ref
from ir.graph import Graph
from ir.node import Node
from ir.ops import COPY, MAKE_DEP_TOKEN
from ir.torch_seam import pytree
from lowering import tree_watch
from lowering.call_path import MISS, call_path, output_builder, probe_location
from lowering.codegen import NodeRule, compile_graph, fx_name, interpret, to_fx_graph
from lowering.constraints import input_checks, ranges_of
from lowering.inputs import flatten_inputs
from lowering.lowering_seam import (
    eval_frame_callback,
    global_module_hook_tables,
    is_fx_symbolic_tracing,
    run_frame_eagerly,
    set_eval_frame,
    tracing_state,
)
from lowering.meta import complete_meta
from lowering.modules import (
    GraphRunner,
    signature_class,
    usable_name,
)
from lowering.portable import decode_graph, encode_graph
from lowering.tree_watch import plain_call

# How the root binds its export signature (made by ``lowering.lower``; its fx graph and its direct
# code both follow it). Inputs: placeholder name -> ("state", fqn) | ("token",); outputs, one per
# output position: ("return", None) | ("copy_state", fqn) | ("copy_input", placeholder name) |
# ("drop", None). A root graph without an export signature has no plan and runs as it is.
RootPlan = tuple[dict[str, tuple], tuple[tuple[str, Any], ...]]


class LoweredRoot(GraphRunner, UnflattenedModule):
    """The module ``lower`` returns: behaves like ``torch.export.unflatten``'s result.

    ``forward(*args, **kwargs)`` takes the eager model's inputs (any keyword order, dicts in any key
    order, or another structure through ``flat_args_adapter``), checks them against the exported
    constraints (``check_input_constraints``), runs the root graph and returns the eager output
    structure.
    """

    def __init__(
        self,
        ir_graph: Graph,
        plan: RootPlan | None,
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
        # The fx graph is built from the IR, and its code compiled, on first use: calls run
        # direct code without either.
        self.__dict__.update(_ir_graph=ir_graph, _plan=plan, _fx_graph=None, _code=None)
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
        self._input_checks = input_checks(user_placeholders(ir_graph, plan))
        # set beside ``__setattr__``, which would make the call path now: ``lower`` makes it
        # once the root is complete
        self.__dict__["_ranges"] = ranges_of(range_constraints)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in _CALL_PATH_INPUTS and "_ranges" in self.__dict__:
            attach_call_path(self)  # the call path is specialised to these: made again

    @property
    def graph(self) -> torch.fx.Graph:
        """The root's fx graph (built from the IR on first use)."""
        fx_graph = self.__dict__["_fx_graph"]
        if fx_graph is None:
            fx_graph = root_fx_graph(self.__dict__["_ir_graph"], self.__dict__["_plan"])
            fx_graph.owning_module = self
            complete_meta(fx_graph, self.__dict__["_ir_graph"], self)
            self.__dict__["_fx_graph"] = fx_graph
        return fx_graph

    @graph.setter
    def graph(self, fx_graph: torch.fx.Graph) -> None:
        """Run ``fx_graph`` from now on (module by module: the direct code is dropped)."""
        fx_graph.owning_module = self
        self.__dict__.update(_fx_graph=fx_graph, _code=None)
        self.__dict__.pop("_direct", None)

    @property
    def input_placeholders(self) -> list[torch.fx.Node]:
        """The placeholders of the root's fx graph: the flat user inputs, in order."""
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    def process_forward_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """The flat inputs of a call, as the root graph takes them (checked unless tracing)."""
        return self._flat_inputs(args, kwargs)

    def _flat_inputs(self, args: Any, kwargs: Any) -> list[Any]:
        # ``args``/``kwargs`` are proxies themselves when fx traces ``forward(*args, **kwargs)``
        if self._in_spec is None:
            return list(args)
        if is_fx_symbolic_tracing():
            return traced_leaves(args, kwargs, self._in_spec)
        return flatten_inputs(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module.__call__``, which runs ``forward`` between hooks; when there is nothing
        around ``forward`` to run (no hook on the root, no global hook, no ``m.compile()``, no
        ``torch.compile`` or ``torch.jit.trace`` running, no ``forward`` set on the instance),
        the call path runs at once."""
        if not torch.compiler.is_compiling():  # dynamo traces ``nn.Module.__call__`` as ever
            state = self.__dict__
            fast = state.get("_call_path")
            if (
                fast is not None
                and not (
                    state["_forward_pre_hooks"]
                    or state["_forward_hooks"]
                    or state["_backward_pre_hooks"]
                    or state["_backward_hooks"]
                    or _GLOBAL_HOOKS[0]
                    or _GLOBAL_HOOKS[1]
                    or _GLOBAL_HOOKS[2]
                    or _GLOBAL_HOOKS[3]
                )
                and state.get("_compiled_call_impl") is None
                and "forward" not in state  # a forward patched on the instance runs as ever
                and eval_frame_callback() is None
                and tracing_state() is None
            ):
                out = fast(self, args, kwargs)
                # nothing runs around ``forward`` here, and ``forward`` would try the call path
                # first: the general path is what it would run next
                return self._general_forward(args, kwargs) if out is MISS else out
        return _MODULE_CALL(self, *args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            if eval_frame_callback():
                return self._forward_for_dynamo(args, kwargs)
            fast = self.__dict__.get("_call_path")
            if fast is not None:  # the call path of this signature (``lowering/call_path.py``)
                out = fast(self, args, kwargs)
                if out is not MISS:
                    return out
        return self._general_forward(args, kwargs)

    def _general_forward(self, args: tuple, kwargs: dict) -> Any:
        """A call the call path did not accept (or made while tracing or compiling): inputs
        flattened and checked by ``lowering.inputs`` (which words every error), the code chosen
        by ``code_to_run``, outputs unflattened by ``pytree``."""
        flat = self._flat_inputs(args, kwargs)
        out = self.code_to_run(flat)(self, *flat)
        if self._out_spec is None:
            return out
        if is_fx_symbolic_tracing():
            out = [out[i] for i in range(self._out_spec.num_leaves)]
            return pytree.tree_unflatten(out, self._out_spec)
        build = self.__dict__.get("_build_outputs")
        if build is not None and self._out_spec is self.__dict__["_out_spec_built"]:
            return build(out)
        return pytree.tree_unflatten(list(out), self._out_spec)

    def code_to_run(self, flat: list[Any]) -> Callable[..., Any]:
        """The code this call of the root runs on inputs ``flat``, chosen here and only here:

        1. *direct code* (``lowering.direct``: one function over the whole tree, skipping
           ``nn.Module.__call__``) while the tree is exactly as ``lower`` built it
           (``lowering.tree_watch``) and the inputs are plain tensors;
        2. the fx interpreter, for a root lowered with ``interpreter=True``;
        3. else the root graph's generated code (``lowering.codegen``), which calls each
           submodule as a module (hooks, swaps and patches are honoured).

        Each is called as ``code(root, *flat)``. O(1), plus an O(modules) tree check after some
        module tree changed.
        """
        direct = self.__dict__.get("_direct")
        if direct is not None and plain_call(flat) and self._tree_unchanged():
            return direct
        if self._run_with_interpreter and not torch.compiler.is_dynamo_compiling():
            return _interpreted
        return self.__dict__["_code"] or self._compile()

    def _forward_for_dynamo(self, args: tuple, kwargs: dict) -> Any:
        """A call inside ``torch.compile`` (``forward`` itself is a frame dynamo skips): inputs
        are checked and the root's code settled eagerly, out of dynamo's sight, so nothing lazy
        is guarded on; dynamo compiles the root graph's code, module by module, as one frame."""
        prior = set_eval_frame(None)
        try:
            flat = self.process_forward_inputs(*args, **kwargs)
            code = self.__dict__["_code"] or self._compile()
        finally:
            set_eval_frame(prior)
        out = code(self, *flat)  # the frame dynamo compiles
        if self._out_spec is None:
            return out
        prior = set_eval_frame(None)
        try:
            return pytree.tree_unflatten(list(out), self._out_spec)
        finally:
            set_eval_frame(prior)

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

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_fx_graph=encode_graph(self.graph), _ir_graph=None, _plan=None, _code=None)
        state.pop("_direct", None)  # generated code does not pickle; the copy runs module by module
        state.pop("_direct_checked", None)
        for name in _CALL_PATH_ATTRIBUTES:  # generated too: made again when unpickled
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__["_fx_graph"] = decode_graph(state["_fx_graph"])
        self.graph.owning_module = self
        attach_call_path(self)


# Dynamo runs ``LoweredRoot.forward`` and ``_forward_for_dynamo`` (and so every signature class's copy, which shares its code)
# eagerly and compiles the frames it calls: see ``LoweredRoot._forward_for_dynamo``.
# ``__call__`` too: run eagerly, it finds dynamo's callback set and calls ``nn.Module.__call__``, as
# a root without it would be called.
for _code in (
    LoweredRoot.__call__.__code__,
    LoweredRoot.forward.__code__,
    LoweredRoot._forward_for_dynamo.__code__,
):
    run_frame_eagerly(_code)


_MODULE_CALL = torch.nn.Module.__call__
_GLOBAL_HOOKS = global_module_hook_tables()  # the tables themselves: hooks are added in place
_CALL_PATH_ATTRIBUTES = ("_call_path", "_build_outputs", "_out_spec_built")
# The root's attributes its call path is specialised to: assigning one makes it again.
_CALL_PATH_INPUTS = frozenset(
    {"_in_spec", "_out_spec", "check_input_constraints", "_input_checks", "_ranges"}
)


def attach_call_path(root: LoweredRoot) -> None:
    """Give ``root`` the call path of its signature (``lowering.call_path``) and the builder of
    its output tree, generated from its specs, input checks and state as they are now; a root
    whose signature cannot be spelled keeps its general path. O(leaves + dims)."""
    for name in _CALL_PATH_ATTRIBUTES:
        root.__dict__.pop(name, None)
    state = root.__dict__
    in_spec, out_spec = state.get("_in_spec"), state.get("_out_spec")
    if in_spec is None or out_spec is None:
        return
    build = output_builder(out_spec)
    if build is not None:
        state.update(_build_outputs=build, _out_spec_built=out_spec)
    if state.get("check_input_constraints") is not True:
        return  # unchecked calls take the general path
    fast = call_path(in_spec, out_spec, state["_input_checks"], state["_ranges"], probe_location(root))
    if fast is not None:
        state["_call_path"] = fast


def _interpreted(root: torch.nn.Module, *flat: Any) -> Any:
    """The root graph run by the fx interpreter (``code_to_run``'s second choice)."""
    return interpret(root, root.graph, list(flat))


def traced_leaves(args: tuple, kwargs: dict, in_spec: Any) -> list[Any]:
    """The flat inputs of a call under ``torch.fx.symbolic_trace``, in ``in_spec``'s order.

    fx passes one proxy per parameter of the named signature (``root_class``): the positional
    arguments, then the keyword arguments, all positionally. A proxy that stands for a tuple,
    list or dict input is indexed as ``in_spec`` says (``pair[1][0]``, ``cfg["gain"]``), so the
    traced module takes the eager structure. Without proxies (``concrete_args`` of the flat
    convention, one per leaf) the leaves are taken as given. O(leaves).
    """
    if in_spec is None:
        return pytree.tree_leaves((args, kwargs))
    args_spec, kwargs_spec = in_spec.children()
    if isinstance(args, torch.fx.Proxy) or isinstance(kwargs, torch.fx.Proxy):
        # fx traced ``forward(*args, **kwargs)`` itself: one proxy for each of args and kwargs
        leaves: list[Any] = []
        _index_leaves(args, args_spec, leaves)
        _index_leaves(kwargs, kwargs_spec, leaves)
        return leaves
    given = list(args) + list(kwargs.values())
    if not any(isinstance(a, torch.fx.Proxy) for a in given):
        return pytree.tree_leaves((args, kwargs))
    specs = list(args_spec.children()) + list(kwargs_spec.children())
    if len(given) != len(specs):
        return pytree.tree_leaves((args, kwargs))  # the flat convention: one value per leaf
    leaves: list[Any] = []
    for value, spec in zip(given, specs):
        _index_leaves(value, spec, leaves)
    return leaves


def _index_leaves(value: Any, spec: Any, into: list[Any]) -> None:
    if spec.is_leaf():
        into.append(value)
    elif not isinstance(value, torch.fx.Proxy):
        into.extend(pytree.tree_leaves(value))
    elif spec.type is dict:
        for key, child in zip(spec.context, spec.children()):
            _index_leaves(value[key], child, into)
    else:
        for i, child in enumerate(spec.children()):
            _index_leaves(value[i], child, into)


def user_placeholders(graph: Graph, plan: RootPlan | None) -> list[Node]:
    """The placeholders of the root ``graph`` that callers fill: those ``plan`` does not bind."""
    bound = plan[0] if plan is not None else {}
    return [node for node in graph.placeholders if node.name not in bound]


def root_fx_graph(graph: Graph, plan: RootPlan | None) -> torch.fx.Graph:
    """The root's fx graph: ``graph`` whose state inputs read module attributes, whose tokens are
    made fresh and whose mutation outputs are ``copy_`` into their buffer or input, as ``plan``
    says; its placeholders are ``user_placeholders(graph, plan)``."""
    return to_fx_graph(graph, None if plan is None else _plan_rules(graph, plan))[0]


def _plan_rules(graph: Graph, plan: RootPlan) -> dict[str, NodeRule]:
    bound, outputs = plan
    rules: dict[str, NodeRule] = {}
    state_nodes: dict[str, torch.fx.Node] = {}

    def read_state(target: str) -> NodeRule:
        def rule(g: torch.fx.Graph, node: Node, thawed: Callable) -> torch.fx.Node:
            made = g.get_attr(target)
            made._rename(fx_name(node.name))  # a unique, safe identifier
            state_nodes[target] = made
            return made

        return rule

    def make_token(g: torch.fx.Graph, node: Node, thawed: Callable) -> torch.fx.Node:
        return g.call_function(MAKE_DEP_TOKEN, ())

    for name, binding in bound.items():
        rules[name] = make_token if binding[0] == "token" else read_state(binding[1])

    def output(g: torch.fx.Graph, node: Node, thawed: Callable) -> torch.fx.Node:
        values = node.args[0] if isinstance(node.args[0], tuple) else (node.args[0],)
        kept = []
        for value, (kind, target) in zip(values, outputs):
            if kind == "return":
                kept.append(thawed(value))
            elif kind == "copy_state":
                dest = state_nodes.get(target) or g.get_attr(target)
                g.call_function(COPY, (dest, thawed(value)))
            elif kind == "copy_input":
                dest = thawed(ref(target))
                g.call_function(COPY, (dest, thawed(value)))
        return g.output(tuple(kept))

    rules[graph.output_node.name] = output
    return rules


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
    if not all(c.is_leaf() for c in (*args_spec.children(), *kwargs_spec.children())):
        return None  # structured inputs: (*args, **kwargs), for fx's flat convention
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
