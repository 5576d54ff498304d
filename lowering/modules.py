"""The torch module classes that ``lower`` builds.

Graph-running modules are instances of torch's public ``InterpreterModule`` (and, when a module's
calls run different graphs, of ``InterpreterModuleDispatcher`` too), so code that checks for those
classes keeps working. Containers keep their container behaviour (indexing, ``len``).
"""

from __future__ import annotations

import re
import sys
import types
import weakref
from collections.abc import Callable, Sequence
from keyword import iskeyword
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.export.unflatten import InterpreterModule, InterpreterModuleDispatcher

from ir.args import IDict
from ir.errors import InputError, LoweringError
from ir.graph import Graph
from ir.module import MODULE_DICT, MODULE_LIST, PARAMETER_DICT, PARAMETER_LIST, SEQUENTIAL
from ir.torch_seam import module_buffers, module_children, module_parameters
from ir.tree_calls import flattened_arguments
from lowering.codegen import GRAPH_KEYWORD, compile_graph, interpret
from lowering.hop_bodies import held_bodies
from lowering.lowering_seam import init_module_state
from lowering.portable import decode_graph, encode_graph
from lowering.source import compile_function
from lowering.tree_watch import Watched

if TYPE_CHECKING:
    from typing_extensions import Self


class Holder(Watched, torch.nn.Module):
    """A module that runs no graph of its own (never called in the program); keeps the type name."""

    def __init__(self, type_name: str | None = None) -> None:
        super().__init__()
        self.__dict__["_ty"] = type_name

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
        return {**module_parameters(self), **module_buffers(self), **module_children(self)}

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


class GraphRunner(Watched):
    """What every lowered module that runs a graph shares (the root and ``LoweredModule``):
    torch's ``finalize``/``print_readable`` API, deep copies that share compiled code and IR, and
    pickling that keeps the per-signature class."""

    def finalize(self) -> None:
        """Kept for API parity with torch's ``InterpreterModule`` and ``UnflattenedModule``; code
        is generated at lowering."""

    def print_readable(
        self,
        print_output: bool = True,
        include_stride: bool = False,
        include_device: bool = False,
        colored: bool = False,
    ) -> str:
        """Generated code of this module and every submodule below it, nested by name."""
        return print_readable(self, print_output, include_stride, include_device, colored)

    def __deepcopy__(self, memo: dict) -> Any:
        return _deepcopy_module(self, memo)

    def __reduce_ex__(self, protocol: int) -> Any:
        return reduce_with_signature(self, protocol)


class LoweredModule(GraphRunner, InterpreterModule):
    """A module that runs one fx graph (or, per call, one of several) as generated code.

    ``interpreter=True`` runs ``torch.fx.Interpreter`` instead, for debugging.

    Constructing one gives an instance of a subclass made once per forward signature (see
    ``forward_names``): its ``forward`` is the same generic ``forward(*args, **kwargs)``, but
    unwraps (``__wrapped__``) to ``forward(self, x, ...)`` naming the graph's inputs, so
    ``torch.fx.symbolic_trace`` and ``inspect.signature`` see named parameters. Every module with
    the same names shares one class: a stack of N blocks makes a handful of classes, not N.
    """

    _forward_names: tuple[str, ...] | None = None
    # ``codegen.TAKES_GRAPH``: ``forward`` takes ``GRAPH_KEYWORD`` (see ``codegen.call_graph``)
    _purefx_takes_graph = True

    def __new__(cls, ir_graphs: Sequence[Graph] = (), *args: Any, **kwargs: Any) -> Self:
        # Without graphs (deepcopy, unpickling, ``__new__(type(m))``) the class stays as it is.
        return super().__new__(lowered_class(cls, ir_graphs))

    def __init__(
        self,
        ir_graphs: tuple,
        codes: list[Callable[..., Any]],
        type_name: str | None,
        interpreter: bool,
        fx_graphs: list[torch.fx.Graph | None] | None = None,
    ) -> None:
        init_module_state(self)  # as torch.nn.Module.__init__(self)
        # plain attributes, written past nn.Module.__setattr__ (a stack builds thousands)
        self.__dict__.update(
            _ir_graphs=ir_graphs,
            _fx_graphs=fx_graphs or [None] * len(ir_graphs),
            _codes=codes,
            _ty=type_name,
            _run_with_interpreter=interpreter,
            graph_module=None,
        )

    @property
    def graphs(self) -> list[torch.fx.Graph]:
        """The fx graph of each call variant (built on first use from the IR)."""
        fx_graphs = self.__dict__["_fx_graphs"]
        if any(g is None for g in fx_graphs):
            from lowering.codegen import to_fx_graph
            from lowering.meta import complete_meta

            for i, g in enumerate(fx_graphs):
                if g is None:
                    fx_graphs[i] = to_fx_graph(self.__dict__["_ir_graphs"][i])[0]
                    fx_graphs[i].owning_module = self
                    complete_meta(fx_graphs[i], self.__dict__["_ir_graphs"][i], self)
        return fx_graphs

    @property
    def graph(self) -> torch.fx.Graph:
        """The fx graph of the first call variant."""
        return self.graphs[0]

    @property
    def arg_names(self) -> list[str]:
        return [n.target for n in self.graph.nodes if n.op == "placeholder"]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run one of this module's graphs on the arguments; which one is decided by the call.

        A module whose calls in the program run different graphs (a ``LoweredDispatcher``) is
        told by its caller: the generated code of the calling module passes graph ``k`` as the
        keyword ``_purefx_graph=k`` (``lowering.codegen.GRAPH_KEYWORD``; hooks that take keyword
        arguments see it). A call without it (a user's direct call, or a caller's call of graph
        0) runs the first graph, in program order, whose inputs the arguments fill (same count
        of positional arguments; keywords by placeholder or signature name) — graph 0 whenever
        it fits — and raises ``InputError`` when none does. Nothing on the module changes
        between calls, so calls from several threads, copies and hooks all run the same graph.
        """
        if kwargs or len(self._codes) > 1:
            index, args = self._select(args, kwargs)
        else:
            index = 0
        if self._run_with_interpreter and not torch.compiler.is_dynamo_compiling():
            return interpret(self, self.graphs[index], args)
        return self._codes[index](self, *args)

    def _select(self, args: tuple, kwargs: dict) -> tuple[int, tuple]:
        """``(graph index, positional arguments)`` for a call (see ``forward``)."""
        index = kwargs.pop(GRAPH_KEYWORD, None)
        count = len(self._codes)
        if index is None:
            for i in range(count):
                if count == 1 or self._fits(i, args, kwargs):
                    return i, (self._bind(i, args, kwargs) if kwargs else args)
            shapes = [self._placeholder_names(i) for i in range(count)]
            raise InputError(
                f"{type(self).__name__}.forward() got {len(args)} positional arguments and "
                f"keywords {sorted(kwargs)}, which fit none of its graphs (inputs of each: "
                f"{shapes}); pass {GRAPH_KEYWORD}=k to run graph k"
            )
        if type(index) is not int or not 0 <= index < count:
            raise InputError(
                f"{type(self).__name__}.forward() got {GRAPH_KEYWORD}={index!r}; it has graphs "
                f"0 to {count - 1}"
            )
        return index, (self._bind(index, args, kwargs) if kwargs else args)

    def _fits(self, index: int, args: tuple, kwargs: dict) -> bool:
        """Whether a call with these arguments fills exactly the inputs of graph ``index``."""
        names = self._placeholder_names(index)
        if len(args) > len(names):
            return False
        if not kwargs:
            return len(args) == len(names)
        try:
            self._bind(index, args, kwargs)
        except InputError:
            return False
        return True

    def _bind(self, index: int, args: tuple, kwargs: dict) -> tuple:
        """Positional arguments for graph ``index`` from a call with keyword arguments.

        An input is passed by its placeholder name or by the name the signature shows for it.
        """
        names = self._placeholder_names(index)
        shown = type(self)._forward_names or ()
        bound = list(args)
        used = set()
        missing = []
        for i in range(len(args), len(names)):
            for name in (names[i], shown[i] if i < len(shown) else None):
                if name in kwargs:
                    bound.append(kwargs[name])
                    used.add(name)
                    break
            else:
                missing.append(names[i])
        unknown = sorted(set(kwargs) - used)
        if unknown or missing:
            problem = (
                f"unexpected keyword arguments {unknown}" if unknown else f"no value for {missing}"
            )
            raise InputError(
                f"{type(self).__name__}.forward() got {problem}; it takes {list(names)} "
                f"(positionally, or by these names)"
            )
        return tuple(bound)

    def _placeholder_names(self, index: int) -> list[str]:
        ir_graphs = self.__dict__.get("_ir_graphs")
        if ir_graphs is not None:
            return [n.name for n in ir_graphs[index].placeholders]
        return [n.target for n in self.graphs[index].nodes if n.op == "placeholder"]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fx_graphs"] = [encode_graph(g) for g in self.graphs]
        state["_ir_graphs"] = None
        del state["_codes"]
        state["_direct"] = None  # generated code does not pickle; the copy runs module by module
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        fx_graphs = [decode_graph(g) for g in state["_fx_graphs"]]
        for g in fx_graphs:
            g.owning_module = self
        self.__dict__["_fx_graphs"] = fx_graphs
        self._codes = [compile_graph(g) for g in fx_graphs]


class LoweredDispatcher(LoweredModule, InterpreterModuleDispatcher):
    """A lowered module whose calls run different graphs: each caller names the graph it runs
    (see ``LoweredModule.forward``)."""

    def call_modules(self) -> list[LoweredModule]:
        """One view per distinct graph, for parity with ``InterpreterModuleDispatcher``."""
        return [self]


def lowered_class(base: type, ir_graphs: Sequence[Graph]) -> type:
    """The class of the module that ``base(ir_graphs, ...)`` builds (``base`` a lowered module
    class): the signature class of ``forward_names(ir_graphs)``, or ``base`` itself when it is
    one already or there are no graphs. O(placeholders)."""
    if ir_graphs and base.__dict__.get("_forward_names") is None:
        return _signature_class(base, forward_names(ir_graphs))
    return base


def build_lowered(
    cls: type,
    ir_graphs: tuple,
    codes: list[Callable[..., Any]],
    type_name: str | None,
    interpreter: bool,
    fx_graphs: list[torch.fx.Graph | None] | None = None,
) -> LoweredModule:
    """The module ``base(ir_graphs, codes, type_name, interpreter, fx_graphs)`` for
    ``cls = lowered_class(base, ir_graphs)``, made without the class call (no second look at
    the graphs' signature): for ``lower``, which knows the class of many equal modules. O(1)."""
    made = object.__new__(cls)
    cls.__init__(made, ir_graphs, codes, type_name, interpreter, fx_graphs)
    return made


# --- forward signatures ------------------------------------------------------------------------

# Classes live as long as some module (or pickle in progress) uses them.
_SIGNATURE_CLASSES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_SSA_SUFFIX = re.compile(r"_\d+$")


def forward_names(ir_graphs: Sequence[Graph]) -> tuple[str, ...] | None:
    """The parameter names a lowered module's ``forward`` shows, or ``None`` for ``(*args, **kwargs)``.

    For a graph that takes a preserved call's eager arguments (it begins by flattening them with
    the call's input spec): ``arg0, arg1, ...`` for the positional arguments (the export does not
    record a submodule's parameter names) then each keyword argument under its own name. For
    any other graph: its placeholder names, without the ``_<n>`` suffix that made them unique
    in the program (``add_3`` -> ``add``), so that the blocks of a stack share one signature; the
    full names where stripping would make two equal. All parameters are positional-or-keyword
    (fx passes them positionally). The variants of a dispatching module must agree; when only
    their positional names differ they become ``arg0, ...``; when their arity or keywords differ
    there is no single signature and the result is ``None``. O(number of placeholders).
    """
    positional, keywords = _graph_signature(ir_graphs[0])
    if len(ir_graphs) > 1:
        split = [(positional, keywords)] + [_graph_signature(g) for g in ir_graphs[1:]]
        if any(s != split[0] for s in split[1:]):
            if any(len(p) != len(positional) or k != keywords for p, k in split[1:]):
                return None
            positional = tuple(f"arg{i}" for i in range(len(positional)))
    names = positional + keywords if keywords else positional
    if len(set(names)) != len(names) or not all(map(usable_name, names)):
        return None
    return names


def signature_class(base: type, names: tuple[str, ...] | None) -> type:
    """The subclass of ``base`` whose ``forward`` unwraps to ``forward(self, *names)`` (cached).

    ``base`` itself when ``names`` is ``None``. The subclass's ``forward`` is a copy of
    ``base.forward`` (same code, so calls cost the same) whose ``__wrapped__`` carries the names.
    Raises ``LoweringError`` unless ``names`` are distinct identifiers (``usable_name``): they are
    spelled in source.
    """
    if names is None:
        return base
    if not all(map(usable_name, names)) or len(set(names)) != len(names):
        raise LoweringError(
            f"forward parameters {names!r} of a {base.__name__} are not distinct Python names; "
            "generated code cannot spell them"
        )
    return _signature_class(base, names)


def _signature_class(base: type, names: tuple[str, ...] | None) -> type:
    """``signature_class`` for ``names`` already known to be ``None`` or distinct usable names
    (``forward_names`` returns only such)."""
    if names is None:
        return base
    key = (base, names)
    cls = _SIGNATURE_CLASSES.get(key)
    if cls is None:
        generic = base.forward
        forward = types.FunctionType(
            generic.__code__,
            generic.__globals__,
            "forward",
            generic.__defaults__,
            generic.__closure__,
        )
        forward.__kwdefaults__ = generic.__kwdefaults__
        forward.__qualname__ = generic.__qualname__
        forward.__doc__ = generic.__doc__
        # fx and inspect read the parameters of ``inspect.unwrap(forward)``; names are checked
        # identifiers, so this source is exactly ``def forward(self, a, b): pass``.
        source = f"def forward({', '.join(('self',) + names)}):\n    pass\n"
        wrapped = compile_function(source, {}, "forward")
        forward.__wrapped__ = wrapped  # type: ignore[attr-defined]
        attrs = {
            "forward": forward,
            "_forward_names": names,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
        }
        cls = _SIGNATURE_CLASSES.setdefault(key, type(base.__name__, (base,), attrs))
    return cls


def _graph_signature(graph: Graph) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(positional names, keyword names)`` of one graph's forward. O(placeholders), plus the
    state reads before the graph's first computation."""
    placeholders = graph.placeholders
    eager = _eager_arguments(graph, placeholders) if placeholders else None
    if eager is not None:
        count, keywords = eager
        return tuple(f"arg{i}" for i in range(count)), keywords
    return _plain_names(graph), ()


def _plain_names(graph: Graph) -> tuple[str, ...]:
    """The positional names of a graph that does not take a preserved call's arguments: its
    placeholder names without their SSA suffixes, or as they are where that would make two
    equal. O(placeholders)."""
    full = tuple(map(_NAME, graph.placeholders))
    stripped = tuple(map(_without_ssa_suffix, full))
    return stripped if len(set(stripped)) == len(stripped) else full


_NAME = attrgetter("name")


def _without_ssa_suffix(name: str) -> str:
    r"""``name`` without a final ``_<digits>`` (``_SSA_SUFFIX``): ``add_3`` -> ``add``. The
    common case without the regular expression (``\d`` is ``str.isdecimal``'s digits)."""
    if type(name) is not str or name.endswith("\n"):  # ``$`` also matches before a final newline
        return _SSA_SUFFIX.sub("", name)
    head, underscore, digits = name.rpartition("_")
    return head if underscore and digits.isdecimal() else name


def _eager_arguments(graph: Graph, placeholders: tuple) -> tuple[int, tuple[str, ...]] | None:
    """``(positional count, keyword names)`` when ``graph`` (whose ``placeholders`` these are,
    at least one) takes a preserved call's arguments: its first computation flattens them
    (``_eager_tree``) and each keyword argument is the placeholder of its own name."""
    tree = _eager_tree(graph, placeholders)
    if tree is None:
        return None
    positional, keywords = tree
    if any(key != value.name for key, value in keywords.items):
        return None
    return len(positional), tuple(key for key, _ in keywords.items)


def _eager_tree(graph: Graph, placeholders: tuple) -> tuple[tuple, IDict] | None:
    """``(positional, keywords)``, the argument tree of the graph's first computation (after
    its placeholders, at least one, and its state reads) when that flattens exactly its
    placeholders, in order, as ``tree_flatten_spec(((p0, p1, ...), {"key": key, ...}),
    in_spec)``; else ``None``. Reads no node name but through references to placeholders, so
    graphs with equal alpha keys get the same answer (equal up to those names)."""
    tree = flattened_arguments(graph)
    if tree is None:
        return None
    positional, keywords = tree
    names = tuple(r.name for r in (*positional, *keywords.values()))
    return tree if names == tuple(n.name for n in placeholders) else None


class SharedSignatures:
    """The classes of lowered modules whose graphs have equal alpha keys (``lower`` keeps one of
    these per module kind and keys): ``class_of(ir_graphs)`` is ``lowered_class(base,
    ir_graphs)``.

    Where no graph begins by flattening a preserved call's arguments, which graphs with equal
    alpha keys agree on (``_eager_tree``), ``forward_names`` reads nothing of a graph but its
    placeholder names once stripped (``_plain_names``): modules whose stripped names are equal
    (every block of a stack: ``add_3`` and ``add_4`` are both ``add``) get their class by one
    look-up. O(placeholders) per module, plus ``lowered_class`` once per distinct names.
    """

    __slots__ = ("base", "classes", "plain")

    def __init__(self, base: type, ir_graphs: Sequence[Graph]) -> None:
        self.base = base
        self.plain = not any(
            g.placeholders and _eager_tree(g, g.placeholders) is not None for g in ir_graphs
        )
        self.classes: dict[tuple, type] = {}

    def class_of(self, ir_graphs: Sequence[Graph]) -> type:
        """``lowered_class(base, ir_graphs)`` for graphs with the keys this was made for."""
        if not self.plain:
            return lowered_class(self.base, ir_graphs)
        if len(ir_graphs) == 1:
            names = _plain_names(ir_graphs[0])
        else:
            names = tuple(map(_plain_names, ir_graphs))
        cls = self.classes.get(names)
        if cls is None:
            cls = self.classes[names] = lowered_class(self.base, ir_graphs)
        return cls


def usable_name(name: object) -> bool:
    """Whether ``name`` can be a parameter of a generated ``forward(self, ...)``."""
    return isinstance(name, str) and name.isidentifier() and not iskeyword(name) and name != "self"


def reduce_with_signature(obj: torch.nn.Module, protocol: int) -> Any:
    """``__reduce_ex__`` for a module whose class may be a ``signature_class``: such a class is made
    at run time, so the pickle names its base and its signature instead."""
    names = type(obj).__dict__.get("_forward_names")
    if names is None:
        return object.__reduce_ex__(obj, protocol)
    return (_restore_module, (type(obj).__base__, names), obj.__getstate__())


def _restore_module(base: type, names: tuple[str, ...]) -> torch.nn.Module:
    cls = signature_class(base, names)
    return cls.__new__(cls)


# --- printing and copying -----------------------------------------------------------------------


def print_readable(
    mod: torch.nn.Module,
    print_output: bool = True,
    include_stride: bool = False,
    include_device: bool = False,
    colored: bool = False,
) -> str:
    """Readable generated code of ``mod`` and of each submodule with a graph (shared ones once)."""
    options = {
        "verbose": True,
        "include_stride": include_stride,
        "include_device": include_device,
        "colored": colored,
    }
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
    path = mod.__dict__.get("_call_path")
    if path is not None:  # the root's call path (``lowering/call_path.py``), run on every call
        lines.append("    # call path: inputs flattened and checked, outputs built (else the general path)")
        lines += ["    " + line if line else line for line in path.source.strip("\n").split("\n")]
    for child_name, child in [*mod.named_children(), *held_bodies(mod)]:
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
        if key in ("_codes", "_code", "_ir_graphs", "_ir_graph", "_plan"):
            new.__dict__[key] = value
        elif key == "_fx_graphs":
            new.__dict__[key] = [_copy_graph(g, new) if g is not None else None for g in value]
        elif key == "_fx_graph":
            new.__dict__[key] = _copy_graph(value, new) if value is not None else None
        else:
            new.__dict__[key] = copy.deepcopy(value, memo)
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
