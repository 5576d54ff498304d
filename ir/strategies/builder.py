"""The program under construction, and what a step may do to it.

``ir.strategies.programs`` decodes a program from its bytes: the module tree, the bodies,
the calls, the outputs. Each body step is a function of ``ir.strategies.step_kinds``' table
that adds nodes through a :class:`ProgramBuilder`: a call in the current frame with its fake
``val`` (:meth:`ProgramBuilder.op`), a read or an update of state or of a user input, a new
placeholder of state or input (``commit``, ``new_constant``). The builder is local to one
draw and frozen once at its end (``Program``); nothing here draws.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import torch

from ir import signature as sg
from ir import state as stt
from ir.args import EMPTY_DICT, IDict, IList, Ref, ref
from ir.effects import aliased_args
from ir.node import CALL_FUNCTION, PLACEHOLDER, Node
from ir.state import Opaque, Slot
from ir.strategies.opset_steps import Plan, fake_call
from ir.strategies.vocabulary import (
    ACTIVATIONS,
    FUNCTIONAL,
    INPLACE,
    STATE_INPUTS,
    UNARY,
    WIDTH,
    base_name,
)
from ir.torch_seam import new_fake, new_fake_mode

aten = torch.ops.aten

ROOT_TYPE = "purefx.generated.Root"
"""The class name the root module's stack entries carry."""


def size_key(sizes: Any) -> tuple:
    """``sizes`` as a hashable key that compares without a guard: a symbolic size as its
    expression's text, an int as itself. O(len(sizes))."""
    return tuple(str(n.node.expr) if isinstance(n, torch.SymInt) else int(n) for n in sizes)


class ModuleObject:
    """One module object of the drawn model: its class, state and registered children."""

    def __init__(self, index: int, type_name: str, record: bytes) -> None:
        self.index = index
        self.type_name = type_name
        self.record = record
        self.state: list[tuple[str, str, tuple[int, ...]]] = []  # (name, kind, shape)
        self.children: list[tuple[str, int]] = []  # (registered name, object index)
        self.body: list[tuple[int, ...]] | None = None


class Scope:
    """The values a body may read: all values so far, or a preserved call's own."""

    def __init__(self, vals: list[Ref], preserved: bool) -> None:
        self.vals = vals
        self.preserved = preserved


class ProgramBuilder:
    """One program under construction: its nodes and their vals, names, call frames, state
    and its updates, and what the steps made (for the outputs).

    The steps build through the methods without a leading underscore and read the fields;
    the decoder (``ir.strategies.programs``) fills the module tree (``objects``, ``paths``,
    ``index_of``, ``sites``, ``fqns``) and the state before the first step.
    """

    def __init__(
        self,
        draw: Callable[..., Any],
        on: frozenset[str],
        *,
        batch: Any,
        mode: Any,
        max_nodes: int,
        limit: int,
        rng: torch.Generator,
        edges: tuple[float, ...],
        poisons: tuple[tuple[float, ...], ...],
        opset_rows: tuple = (),
        row_weights: tuple = (),
        asked: bool = False,
    ) -> None:
        self.draw = draw  # the opset steps draw their own bytes
        self.on = on
        # the batch: an int, or a symbolic size of ``mode``'s shape env
        self.batch = batch
        self.symbolic = "symbolic_sizes" in on
        self.mode = mode  # the program's fake mode (made at its first val when None)
        self.act_key = size_key(self.act())
        self.max_nodes = max_nodes
        self.limit = limit  # where the body's ordinary steps stop (``full``)
        self.rng = rng  # the state's values, and the constants the steps make
        # the values at the edges the edge features may draw (``programs``' ``assumes``)
        self.edges = edges
        self.poisons = poisons
        # the models' activations are everyday steps in every program (``activations`` adds
        # an activation of its own result and ``near_duplicates``' two ``gelu`` spellings)
        self.unary = UNARY + ACTIVATIONS
        # the opset steps: rows this program may draw (uniform where ``asked``, else by the
        # models' use of them), values by (shape, dtype, strides), placeholders made during the
        # body (spliced in at the end), results for the outputs
        self.opset_rows = opset_rows
        self.row_weights = row_weights
        self.asked = asked
        self.pool: dict[tuple, list[Ref]] = {}
        self.rows_used: set[int] = set()
        self.forms_used: set[int] = set()  # the census forms called (``opset_step``)
        self.late_state: list[tuple[str, str, str]] = []  # (kind, fqn, input name)
        self.late_inputs: list[str] = []
        self.late_count = 0  # state the steps made (numbers their fqns)
        self.opset_results: list[Ref] = []
        self.motif_results: list[Ref] = []  # the motif steps' results (outside preserved calls)
        self.plain_results: list[Ref] = []  # the other steps' results (outside preserved calls)
        # the hashes the steps scatter their choices with (set by the decoder)
        self.opset_seed = 0
        self.mix = 0
        # the module tree and the state's names (set by the decoder)
        self.objects: list[ModuleObject] = []
        self.paths: list[tuple[str, int]] = []
        self.index_of: dict[str, int] = {}
        self.sites: collections.Counter = collections.Counter()
        self.fqns: dict[tuple[str, str], str] = {}
        self.state: dict[str, Slot] = {}
        self.tensors: dict[str, Opaque] = {}
        self.tensor_of: dict[str, Any] = {}
        self.input_of: dict[str, str] = {}
        self.inputs: list[sg.InputSpec] = []
        self.user_inputs: list[str] = []
        # the nodes
        self.nodes: list[Node] = []
        self.counts: dict[str, int] = {}
        self.taken: set[str] = set()
        self.frames: list[tuple[str, tuple[str, str]]] = [("L__self__", ("", ROOT_TYPE))]
        self.val_of: dict[str, Any] = {}  # node name -> its val (a FakeTensor, or a tuple)
        self.made_in: dict[str, tuple[int, str]] = {}  # value -> the call frame computing it
        self.last_read: Ref | None = None  # the first operand of the latest op
        # state and inputs as the steps update them
        self.current: dict[Any, Ref] = {}  # tensor id -> its value after the latest update
        self.mutated: dict[Any, tuple[str, str]] = {}  # tensor id -> (style, first fqn)
        self.styles: dict[Any, str] = {}
        self.input_current: dict[str, Ref] = {}
        self.input_styles: dict[str, str] = {}
        # new values of state and inputs (update chains), values read into preserved calls
        # unsigned: kept out of ``grad_regions`` bodies
        self.state_values: set[str] = set()
        self.crossing_only: set[Ref] = set()  # values read across a preserved boundary unsigned
        self.large_read: set[str] = set()  # paths whose large linears a step has read

    def fresh_name(self, base: str) -> str:
        """A node name not taken yet: ``base``, else ``base_1``, ``base_2``, ... (as fx names
        nodes). O(1) amortized."""
        n = self.counts.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.counts[base] = n + 1
        self.taken.add(name)
        return name

    def fake(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A new ``FakeTensor`` of ``shape`` and ``dtype`` in memory of its own, made under the
        program's own fake mode as ``torch.export`` makes its ``val`` s (never written). One
        per value: the guards read whether two values share memory from their ``val`` s
        (``transforms.rewrite.guards.shares_storage``), so values of one shape must not."""
        if self.mode is None:
            self.mode = new_fake_mode()
        return new_fake(self.mode, shape, dtype)  # ``torch.empty`` under the mode, undispatched

    def _aliasing_val(self, node: Node, shape: Any) -> Any:
        """The ``val`` of a node whose result may share an argument's memory (a view, an
        in-place write, a ``getitem``: ``ir.effects.aliased_args``): the operator run on its
        arguments' ``val`` s under the fake mode, so it shares their storage as export's
        does; a new value where that cannot run. O(arguments)."""
        if node.target is operator.getitem:
            return self.val_of[node.args[0].name][node.args[1]]
        try:
            return fake_call(self.mode, node.target, node.args, node.kwargs,
                             lambda r: self.val_of.get(r.name))
        except (RuntimeError, TypeError, ValueError, NotImplementedError):  # fake mode cannot
            # run it: a value of its own
            return self._val(shape)

    def _val(self, shape: Any) -> Any:
        if shape is None:
            return None
        if shape[0] == "sort":
            return (self.fake(shape[1]), self.fake(shape[1], torch.int64))
        if shape[0] == "dtype":
            return self.fake(shape[1], shape[2])
        return self.fake(shape)

    def placeholder(self, name: str, val: Any) -> Ref:
        """A placeholder ``name`` of ``val``, appended (``_splice_late`` orders the late ones)."""
        self.val_of[name] = val
        self.nodes.append(Node(PLACEHOLDER, name, name, meta=MappingProxyType({"val": val})))
        return ref(name)

    def op(self, target: Any, args: tuple, kwargs: IDict = EMPTY_DICT, shape: Any = None) -> Ref:
        """A call of ``target`` in the current frame, its ``val`` run under the program's fake
        mode where it may alias an argument, else a new value of ``shape`` (``None``: no val;
        ``("sort", s)``: a values and indices pair; ``("dtype", s, dtype)``). O(arguments)."""
        name = self.fresh_name(base_name(target))
        bare = Node(CALL_FUNCTION, name, target, args, kwargs)
        val = (self._aliasing_val(bare, shape) if shape is not None and aliased_args(bare)
               else self._val(shape))
        self.last_read = next((r for r in args if isinstance(r, Ref)), self.last_read)
        return self.add_node(name, target, args, kwargs, val, named=True)

    def full(self) -> bool:
        """Whether the graph has reached the node budget of the steps now running."""
        return len(self.nodes) >= self.limit

    def act(self) -> tuple[int, int]:
        """The shape of every activation: ``(batch, WIDTH)``."""
        return (self.batch, WIDTH)

    def module_state(self, path: str) -> list[tuple[str, str, tuple[int, ...]]]:
        """The state rows ``(name, kind, shape)`` of the module object at ``path``."""
        return self.objects[self.index_of[path] + 1].state

    def new_constant(self, path: str, scope: Scope, value: torch.Tensor) -> Ref | None:
        """A new constant of the module at ``path`` holding ``value`` (its placeholder), as the
        opset steps add state; ``None`` in a preserved call or a module at two paths (its new
        state would cross the boundary unsigned, or be one path's only)."""
        if scope.preserved or self.sites[self.index_of[path]] != 1:
            return None
        fqn_name = f"int{self.late_count}"
        self.late_count += 1
        fqn = f"{path}.{fqn_name}" if path else fqn_name
        name = self.fresh_name(STATE_INPUTS[stt.CONSTANT][0] + fqn.replace(".", "_"))
        plan = Plan()
        plan.placeholders.append((stt.CONSTANT, name, self.fake(tuple(value.shape),
                                                                value.dtype), (fqn, value)))
        self.commit(plan)
        return ref(name)

    def commit(self, plan: Plan) -> None:
        """Add a step's placeholders (state, inputs) and layout nodes to the program."""
        for kind, name, val, extra in plan.placeholders:
            self.placeholder(name, val)
            if kind == sg.USER_INPUT:
                self.late_inputs.append(name)
                continue
            fqn, tensor = extra
            self.tensors[fqn] = Opaque(tensor)
            self.state[fqn] = Slot(kind, fqn, True, kind == stt.PARAMETER and tensor.requires_grad)
            self.tensor_of[fqn] = ("opset", fqn)
            self.input_of[fqn] = name
            self.late_state.append((kind, fqn, name))
            self.state_values.add(name)
        for name, target, args, val in plan.layout:
            self.add_node(name, target, args, EMPTY_DICT, val, named=True)

    def add_node(self, base: str, target: Any, args: tuple, kwargs: IDict, val: Any,
                 named: bool = False) -> Ref:
        """A call node of ``val`` in the current frame (its module stack), named ``base`` (or
        after it, unless ``named``)."""
        name = base if named else self.fresh_name(base)
        self.val_of[name] = val
        meta = {"nn_module_stack": dict(self.frames), "val": val}
        self.made_in[name] = len(self.frames), self.frames[-1][0]
        self.nodes.append(Node(CALL_FUNCTION, name, target, args, kwargs, MappingProxyType(meta)))
        return ref(name)

    def styles_on(self) -> tuple[str, ...]:
        """The buffer update styles switched on (in place, functional)."""
        return tuple(s for s in ("inplace_mutation", "functional_mutation") if s in self.on)

    def read_state(self, path: str, name: str) -> Ref:
        """The current value of state ``name`` of the module at ``path``: its latest update, else
        its placeholder."""
        fqn = self.fqns[(path, name)]
        found = self.current.get(self.tensor_of[fqn])
        return found if found is not None else ref(self.input_of[fqn])

    def update(self, path: str, name: str, a: Ref, z: int, overwrite: Any = None,
               delta: Ref | None = None) -> None:
        """An update of state ``name`` by ``mean(a, [0])`` in the style its tensor has (drawn
        by ``z`` at its first update), or ``overwrite`` (``copy_``) of it in place; ``delta``:
        the value to update it by, made already (in another frame), instead of that mean."""
        fqn = self.fqns[(path, name)]
        tid = self.tensor_of[fqn]
        styles = ("inplace_mutation",) if overwrite is not None else self.styles_on()
        style = self.styles.setdefault(tid, styles[z % len(styles)])
        old = self.read_state(path, name)
        if delta is None:
            delta = self.op(aten.mean.dim, (a, IList((0,))), shape=(WIDTH,))
        ops = INPLACE if style == "inplace_mutation" else FUNCTIONAL
        new = self.op(overwrite or ops[z // 2 % len(ops)], (old, delta), shape=(WIDTH,))
        self.state_values.add(new.name)
        self.current[tid] = new
        self.mutated.setdefault(tid, (style, fqn))

    def update_input(self, scope: Scope, name: str, a: Ref, z: int, overwrite: Any = None
                     ) -> tuple[Ref, Ref]:
        """User input ``name`` plus ``a`` in the style the input has (drawn by ``z`` at its
        first update), or ``overwrite`` (``copy_``) of ``a`` into it; its old and new value."""
        styles = ("inplace_mutation", "functional_mutation")[:1 if overwrite else 2]
        style = self.input_styles.setdefault(name, styles[z % len(styles)])
        old = self.input_current.get(name, ref(name))
        target = aten.add_.Tensor if style == "inplace_mutation" else aten.add.Tensor
        new = self.op(overwrite or target, (old, a), shape=self.act())
        self.state_values.add(new.name)
        # as export writes them, later reads take the new value: the in-place result (the same
        # tensor) or, in a functionalized program, the functional one
        scope.vals[:] = [new if v == old else v for v in scope.vals]
        self.input_current[name] = new
        return old, new
