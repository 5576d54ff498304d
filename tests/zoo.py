"""A catalogue of small models ("the zoo") for the purefx test-suite.

Each :class:`Case` knows how to build its eager model (with deterministic
weights), how to make fresh example inputs, and which ``torch.export`` options
to use.  ``CASES`` maps case names to cases; most cases are registered
together with their strict / decomposed variants, named like
``"buffer_mutation[strict,decomp]"``.

Note: ``ep.module()`` shares its parameter and buffer tensors with
``ep.state_dict``, so running it on a mutation case changes the exported
program.  Use :func:`fresh_export` (not the cached :func:`export_case`) when a
test will run a mutating module.

All four ``(strict, decompose)`` variants export for every case here with
torch 2.13.  Things torch 2.13 cannot export, hence not in the zoo:

* a SymInt crossing a preserved module boundary (see ``PreserveConstant``);
* effect tokens before decomposition: ``with_effects`` only shows up after
  ``run_decompositions``, so the ``effect_*[decomp]`` variants carry tokens.
"""

import functools
import itertools
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch
from torch import nn
from torch.export import Dim

from ir.torch_seam import tensor_version

D = 4  # default feature size: keep every tensor tiny


# --------------------------------------------------------------------------
# The Case record and export helpers
# --------------------------------------------------------------------------


@attrs.frozen
class Case:
    """One zoo entry: a model factory, example inputs and export options."""

    name: str
    make: Callable[[], nn.Module]
    args: Callable[[], tuple]
    kwargs: Callable[[], dict] = dict
    strict: bool = False
    decompose: bool = False
    preserve: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    dynamic_shapes: Callable[[], Any] | None = None
    features: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    alt_args: Callable[[], tuple] | None = None
    alt_kwargs: Callable[[], dict] | None = None


def eager_model(case: Case) -> nn.Module:
    """Build a fresh eager model for ``case``."""
    return case.make()


def fresh_export(case: Case) -> torch.export.ExportedProgram:
    """Export a fresh model for ``case`` with its options (never cached)."""
    ep = torch.export.export(
        case.make(),
        case.args(),
        case.kwargs(),
        strict=case.strict,
        dynamic_shapes=case.dynamic_shapes() if case.dynamic_shapes else None,
        preserve_module_call_signature=case.preserve,
    )
    if case.decompose:
        ep = ep.run_decompositions()
    return ep


@functools.cache
def export_case(case: Case) -> torch.export.ExportedProgram:
    """Memoized :func:`fresh_export`; do not run mutating modules from it.

    A decomposed variant is made by decomposing the (cached) undecomposed
    export of the same case, so the two programs share their state tensors.
    """
    if not case.decompose:
        return fresh_export(case)
    base = case.name.partition("[")[0]
    raw = attrs.evolve(case, name=variant_name(base, case.strict, False), decompose=False)
    return export_case(raw).run_decompositions()


def ep_fingerprint(ep: torch.export.ExportedProgram) -> tuple:
    """Everything about ``ep`` that a pure reader must leave as it was.

    The graph's code and node meta keys, the signature, the module call graph, the graph
    module's meta keys, the state dict and constants (names, tensor identity and ``_version``)
    and the identity of the graph module and its submodules.
    """
    graph = ep.graph_module.graph
    nodes = tuple(
        (n.op, n.name, str(n.target), str(n.args), str(n.kwargs), tuple(sorted(n.meta)))
        for n in graph.nodes
    )
    stacks = tuple(str(n.meta.get("nn_module_stack")) for n in graph.nodes)
    state = tuple((k, id(v), _version_of(v)) for k, v in ep.state_dict.items())
    constants = tuple((k, id(v), _version_of(v)) for k, v in ep.constants.items())
    children = tuple((n, id(m)) for n, m in ep.graph_module.named_children())
    return (
        nodes,
        stacks,
        str(ep.graph_signature),
        str(ep.module_call_graph),
        tuple(sorted(ep.graph_module.meta)),
        state,
        constants,
        children,
        id(ep.graph_module),
        id(graph),
    )


def _version_of(value: Any) -> int | None:
    return tensor_version(value) if isinstance(value, torch.Tensor) else None


def seeded(build: Callable[[], nn.Module], seed: int = 0) -> Callable[[], nn.Module]:
    """Wrap ``build`` so weights are deterministic and global RNG is untouched."""

    @functools.wraps(build)
    def make() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build()

    return make


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """Deterministic normal tensor that leaves the global RNG alone."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def randint(high: int, *shape: int, seed: int = 0) -> torch.Tensor:
    """Deterministic int64 tensor in ``[0, high)``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(high, shape, generator=gen)


# --------------------------------------------------------------------------
# Registry and variants
# --------------------------------------------------------------------------

CASES: dict[str, Case] = {}

ALL_VARIANTS: tuple[tuple[bool, bool], ...] = tuple(
    itertools.product((False, True), (False, True))
)  # (strict, decompose)


def variant_name(base: str, strict: bool, decompose: bool) -> str:
    """``base`` plus a ``[strict,decomp]``-style suffix for the flags set."""
    tags = [t for t, on in (("strict", strict), ("decomp", decompose)) if on]
    return f"{base}[{','.join(tags)}]" if tags else base


def variants(
    base: Case,
    combos: Iterable[tuple[bool, bool]] = ALL_VARIANTS,
) -> list[Case]:
    """Copies of ``base`` for each ``(strict, decompose)`` combination."""
    return [
        attrs.evolve(
            base,
            name=variant_name(base.name, strict, decompose),
            strict=strict,
            decompose=decompose,
        )
        for strict, decompose in combos
    ]


def register(
    base: Case,
    combos: Iterable[tuple[bool, bool]] = ALL_VARIANTS,
    into: dict[str, Case] | None = None,
) -> Case:
    """Add ``base``'s variants to ``into`` (default :data:`CASES`)."""
    table = CASES if into is None else into
    for case in variants(base, combos):
        if case.name in table:
            raise ValueError(f"duplicate zoo case {case.name!r}")
        table[case.name] = case
    return base


def cases_with(feature: str, table: dict[str, Case] | None = None) -> list[Case]:
    """All cases in ``table`` (default :data:`CASES`) tagged with ``feature``."""
    return [c for c in (CASES if table is None else table).values() if feature in c.features]


# --------------------------------------------------------------------------
# Custom ops and opaque classes (registered once per process)
# --------------------------------------------------------------------------

_OPS_MODULE = "_purefx_zoo_ops"


def _define_ops() -> types.ModuleType:
    """Create the zoo's custom ops inside a synthetic module.

    Living in ``sys.modules`` under a fixed name keeps the torch.library
    registrations valid even if this file is imported twice under different
    module names (e.g. ``zoo`` and ``tests.zoo``), and lets the opaque object
    be pickled by reference.
    """
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op
    from torch._library.opaque_object import register_opaque_type
    from torch._opaque_base import OpaqueBase

    mod = types.ModuleType(_OPS_MODULE)
    mod.LOG = []  # values recorded by purefx_zoo::record

    class Scaler(OpaqueBase):
        """Opaque (reference-type) object holding a python float."""

        def __init__(self, k: float) -> None:
            self.k = k

    Scaler.__module__ = _OPS_MODULE
    Scaler.__qualname__ = "Scaler"
    mod.Scaler = Scaler
    register_opaque_type(Scaler, typ="reference")

    @torch.library.custom_op("purefx_zoo::scale_by", mutates_args=())
    def scale_by(s: Scaler, x: torch.Tensor) -> torch.Tensor:
        return x * s.k

    @scale_by.register_fake
    def _(s: Scaler, x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    @torch.library.custom_op("purefx_zoo::record", mutates_args=())
    def record(x: torch.Tensor) -> None:
        mod.LOG.append(float(x.sum()))

    @record.register_fake
    def _(x: torch.Tensor) -> None:
        return None

    _register_effectful_op(torch.ops.purefx_zoo.record.default, _EffectType.ORDERED)
    sys.modules[_OPS_MODULE] = mod
    return mod


def zoo_ops() -> types.ModuleType:
    """The process-wide module holding ``Scaler`` and ``LOG``."""
    return sys.modules.get(_OPS_MODULE) or _define_ops()


zoo_ops()


# --------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------


class Inner(nn.Module):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Middle(nn.Module):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.inner = Inner(d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.inner(x) + x)


class Outer(nn.Module):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.middle = Middle(d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.middle(x))


# --------------------------------------------------------------------------
# Structure: nesting, containers, odd call paths
# --------------------------------------------------------------------------


class NestedMLP(nn.Module):
    """root -> block -> middle -> inner -> lin (four levels deep)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Outer()
        self.head = nn.Linear(D, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


class Containers(nn.Module):
    """Sequential, ModuleList (holding a Sequential) and ModuleDict."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D))
        self.layers = nn.ModuleList([nn.Linear(D, D), nn.Sequential(nn.Linear(D, D), nn.Tanh())])
        self.heads = nn.ModuleDict({"a": nn.Linear(D, 2), "b": nn.Linear(D, 2)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.seq(x)
        for layer in self.layers:
            x = layer(x)
        return self.heads["a"](x) - self.heads["b"](x)


class NeverCalled(nn.Module):
    """A container whose forward is never run; root reaches into it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("NeverCalled.forward must not run")


class ParentNeverRuns(nn.Module):
    """Calls ``self.outer.inner`` directly and reads ``self.outer.scale``."""

    def __init__(self) -> None:
        super().__init__()
        self.outer = NeverCalled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer.inner(x) * self.outer.scale


class Codec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(D, D)
        self.dec = nn.Linear(D, D)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.enc(x).relu()

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.dec(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))


class HelperMethod(nn.Module):
    """Calls ``codec.encode``/``codec.decode`` as well as ``codec(...)``."""

    def __init__(self) -> None:
        super().__init__()
        self.codec = Codec()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.codec.encode(x)
        return self.codec.decode(z * 2) + self.codec(x)


class Leaf(nn.Module):
    """Calls a module owned elsewhere in the tree (kept out of its children)."""

    def __init__(self, peer: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self._peer = (peer,)  # a tuple, so nn.Module does not register it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._peer[0](self.lin(x))


class Branch(nn.Module):
    def __init__(self, peer: nn.Module) -> None:
        super().__init__()
        self.leaf = Leaf(peer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.leaf(x) + x


class AncestorSibling(nn.Module):
    """``a.leaf`` calls ``norm``, a sibling of its ancestor ``a``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.a = Branch(self.norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) * 2


# --------------------------------------------------------------------------
# State: parameters, buffers, constants, ties
# --------------------------------------------------------------------------


class ParamZoo(nn.Module):
    """Every flavour of module state in one place."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D))
        self.frozen = nn.Parameter(torch.randn(D), requires_grad=False)
        self.unused = nn.Parameter(torch.randn(3))
        self.register_buffer("scale", torch.rand(D) + 0.5)
        self.register_buffer("offset", torch.randn(D), persistent=False)
        self.register_buffer("unused_buf", torch.zeros(2))
        self.const = torch.arange(D, dtype=torch.float32)  # plain attribute
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(D)) for _ in range(2)])
        self.pdict = nn.ParameterDict(
            {"gain": nn.Parameter(torch.ones(D)), "bias": nn.Parameter(torch.zeros(D))}
        )
        self.child = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.w + self.frozen
        y = y * self.scale + self.offset + self.const
        for p in self.plist:
            y = y + p
        y = y * self.pdict["gain"] + self.pdict["bias"]
        return self.child(y)


class TiedLM(nn.Module):
    """GPT-style embedding/lm_head tie plus two Linears sharing a weight."""

    VOCAB = 11

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(self.VOCAB, D)
        self.enc = nn.Linear(D, D)
        self.dec = nn.Linear(D, D)
        self.dec.weight = self.enc.weight
        self.lm_head = nn.Linear(D, self.VOCAB, bias=False)
        self.lm_head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = self.dec(torch.relu(self.enc(h)))
        return self.lm_head(h)


# --------------------------------------------------------------------------
# Mutation
# --------------------------------------------------------------------------


class Accumulator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x.sum(0))
        return x * 2 + self.total


class BufferMutation(nn.Module):
    """In-place buffer updates in a submodule and at the root."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.acc = Accumulator()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        return self.acc(self.lin(x)) + self.steps


class Writer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.ones(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.mul_(0.5).add_(x.mean(0))
        return x.relu()


class Reader(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + state


class CrossModuleMutation(nn.Module):
    """``writer`` mutates its buffer; root and ``reader`` read it afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.writer = Writer()
        self.reader = Reader()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.writer(x)
        return self.reader(x, self.writer.state) + self.writer.state.sum()


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


class RepeatedMutation(nn.Module):
    """A mutating module called three times."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.counter(x) * 0.5
        return x


class InputMutation(nn.Module):
    """Mutates its first user input in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return self.lin(x) + y


def _batchnorm_train() -> nn.Module:
    return nn.Sequential(nn.Linear(D, D), nn.BatchNorm1d(D), nn.ReLU()).train()


# --------------------------------------------------------------------------
# Sharing and repeated calls
# --------------------------------------------------------------------------


class Parent(nn.Module):
    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.shared = shared
        self.own = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.own(self.shared(x)).tanh()


class SharedTwoParents(nn.Module):
    """One Linear registered under ``p1.shared`` and ``p2.shared``."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(D, D)
        self.p1 = Parent(shared)
        self.p2 = Parent(shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.p2(self.p1(x))


class SharedSequential(nn.Module):
    """The same Linear at positions 0 and 2 of a Sequential."""

    def __init__(self) -> None:
        super().__init__()
        lin = nn.Linear(D, D)
        self.seq = nn.Sequential(lin, nn.ReLU(), lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x)


class Aliased(nn.Module):
    """``self.b = self.a``: one module under two attribute names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, D)
        self.b = self.a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class RepeatedSameGraph(nn.Module):
    """The same block applied three times to same-shaped inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.block(x) + x
        return x


class RepeatedDiffShapes(nn.Module):
    """A block called on inputs of different (static) shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Inner()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.block(x).sum(0) + self.block(y).sum(0)


class Flagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, negate: bool = False) -> torch.Tensor:
        y = self.lin(x)
        if negate:
            y = -y.exp()
        return y


class RepeatedDiffFlag(nn.Module):
    """A block whose python branch depends on a flag argument."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Flagged()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + self.block(x, negate=True)


# --------------------------------------------------------------------------
# Pytrees
# --------------------------------------------------------------------------


class KwargsModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(
        self, x: torch.Tensor, *, bias: torch.Tensor | None = None, scale: float = 1.0
    ) -> torch.Tensor:
        y = self.lin(x) * scale
        return y + bias if bias is not None else y


class NestedInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(
        self,
        pair: tuple[torch.Tensor, list[torch.Tensor]],
        cfg: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        a, rest = pair
        y = self.lin(a)
        for r in rest:
            y = y + r
        return y * cfg["gain"] + cfg["shift"]


class PytreeOutputs(nn.Module):
    """Returns a dict with a nested tuple, a None and an int constant."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        y = self.lin(x)
        return {"y": y, "aux": (y.sum(), None, [x * 2]), "n": 3}


# --------------------------------------------------------------------------
# Dynamic shapes
# --------------------------------------------------------------------------


class SymView(nn.Module):
    """Flattens with ``view(batch, -1)`` using the symbolic batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        y = self.lin(x.view(b, -1))
        return y.view(b, 2, D // 2) + x.new_ones(b, 1, 1) * b


def _batch_dim() -> Any:
    return {"x": {0: Dim("batch", min=2, max=64)}}


# --------------------------------------------------------------------------
# Control flow
# --------------------------------------------------------------------------


class CondModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Linear(D, D)
        self.neg = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0,
            lambda t: self.pos(t).sin(),
            lambda t: self.neg(t).cos(),
            (x,),
        )


class MapModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as hop_map

        return hop_map(lambda x, b: self.lin(x) + b, xs, y)


class WhileModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torch._higher_order_ops.while_loop import while_loop

        return while_loop(
            lambda i, x: i < 3,
            lambda i, x: (i + 1, self.lin(x).tanh()),
            (i, x),
        )


# --------------------------------------------------------------------------
# Effects and opaque objects
# --------------------------------------------------------------------------


class PrintEffect(nn.Module):
    """Calls ``aten._print``: PRINTS "purefx-zoo" to stdout on every run.

    Effect tokens (``with_effects``) only appear after ``run_decompositions``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.ops.aten._print("purefx-zoo")
        return self.lin(x)


class RecordEffect(nn.Module):
    """Quiet effectful op: appends sums to ``zoo_ops().LOG`` (twice per run).

    Effect tokens (``with_effects``) only appear after ``run_decompositions``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.ops.purefx_zoo.record(x)
        y = self.lin(x)
        torch.ops.purefx_zoo.record(y)
        return y


class OpaqueModel(nn.Module):
    """Holds an opaque python object consumed by a custom op."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.scaler = zoo_ops().Scaler(3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.purefx_zoo.scale_by(self.scaler, self.lin(x))


# --------------------------------------------------------------------------
# Preserved module call signatures
# --------------------------------------------------------------------------


class TwoArg(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, *, gate: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x) + y
        if gate is not None:
            h = h * torch.sigmoid(gate)
        return h, h.sum(-1)


class PreserveKwargs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = TwoArg()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h, s = self.sub(x, y, gate=y * 2)
        return h + s.unsqueeze(-1)


class PreserveNested(nn.Module):
    """Preserves ``outer`` and ``outer.middle`` and ``outer.middle.inner``."""

    def __init__(self) -> None:
        super().__init__()
        self.outer = Outer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(x) * 2


class PreserveTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(self.sub(x) + 1)


class ConstSub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
        return self.lin(x) + k, k + 1


class PreserveConstant(nn.Module):
    """Preserved ``sub`` takes an int constant and returns one.

    A SymInt crossing a preserved boundary (e.g. passing ``x.shape[0]`` in,
    or returning it) is rejected by torch 2.13 export in both modes:
    non-strict "Only Tensors or scalars are supported as pytree flattened
    inputs", strict "Symint input is not implemented yet for submodule call
    signature".  See ``preserve_dynamic`` for the closest supported case.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sub = ConstSub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, k = self.sub(x, 2)
        return y * k


class PreserveDynamic(nn.Module):
    """Preserved ``sub`` sees a dynamic batch and uses it in a view."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = SymView()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(x).sum(-1)


# --------------------------------------------------------------------------
# Bigger models
# --------------------------------------------------------------------------


def _transformer() -> nn.Module:
    layer = nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


def _lstm() -> nn.Module:
    return nn.LSTM(input_size=D, hidden_size=8, num_layers=2, batch_first=True).eval()


class MHA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.attn(q, kv, kv, need_weights=True)


# --------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------


def _x(batch: int = 3, seed: int = 0) -> Callable[[], tuple]:
    return lambda: (randn(batch, D, seed=seed),)


register(Case("mlp_nested", seeded(NestedMLP), _x(), features={"nesting"}))
register(Case("containers", seeded(Containers), _x(), features={"containers"}))
register(
    Case(
        "parent_never_runs",
        seeded(ParentNeverRuns),
        _x(),
        features={"parent_not_called", "nesting"},
    )
)
register(Case("helper_method", seeded(HelperMethod), _x(), features={"method_call"}))
register(Case("ancestor_sibling", seeded(AncestorSibling), _x(), features={"ancestor_sibling"}))

register(
    Case(
        "param_zoo",
        seeded(ParamZoo),
        _x(),
        features={
            "params",
            "frozen_param",
            "buffers",
            "non_persistent_buffer",
            "constant",
            "constant_tensor",
            "unused_param",
            "unused_buffer",
            "param_containers",
        },
    )
)
register(
    Case(
        "tied_weights",
        seeded(TiedLM),
        lambda: (randint(TiedLM.VOCAB, 2, 5),),
        features={"tied_weights"},
    )
)

register(Case("buffer_mutation", seeded(BufferMutation), _x(), features={"buffer_mutation"}))
register(
    Case(
        "buffer_mutation_cross",
        seeded(CrossModuleMutation),
        _x(),
        features={"buffer_mutation", "cross_module_mutation"},
    )
)
register(
    Case(
        "buffer_mutation_repeated",
        seeded(RepeatedMutation),
        _x(),
        features={"buffer_mutation", "repeated_call", "repeated_mutation"},
    )
)
register(
    Case(
        "input_mutation",
        seeded(InputMutation),
        lambda: (randn(3, D), randn(3, D, seed=1)),
        features={"input_mutation"},
    )
)
register(
    Case(
        "batchnorm_train",
        seeded(_batchnorm_train),
        _x(batch=5),
        features={"buffer_mutation", "batchnorm_train"},
    )
)

register(
    Case(
        "shared_two_parents",
        seeded(SharedTwoParents),
        _x(),
        features={"shared_module", "repeated_call"},
    )
)
register(
    Case(
        "shared_sequential",
        seeded(SharedSequential),
        _x(),
        features={"shared_module", "repeated_call", "containers"},
    )
)
register(
    Case(
        "aliased_attr",
        seeded(Aliased),
        _x(),
        features={"shared_module", "aliased_module", "repeated_call"},
    )
)
register(
    Case(
        "repeated_same_graph",
        seeded(RepeatedSameGraph),
        _x(),
        features={"repeated_call"},
    )
)
register(
    Case(
        "repeated_diff_shapes",
        seeded(RepeatedDiffShapes),
        lambda: (randn(2, D), randn(5, D, seed=1)),
        features={"repeated_call", "repeated_call_diff_graph"},
    )
)
register(
    Case(
        "repeated_diff_flag",
        seeded(RepeatedDiffFlag),
        _x(),
        features={"repeated_call", "repeated_call_diff_graph"},
    )
)

register(
    Case(
        "kwargs",
        seeded(KwargsModel),
        _x(),
        kwargs=lambda: {"bias": randn(D, seed=1), "scale": 2.0},
        features={"kwargs", "pytree_inputs"},
    )
)
register(
    Case(
        "nested_inputs",
        seeded(NestedInputs),
        lambda: ((randn(3, D), [randn(3, D, seed=1), randn(D, seed=2)]),),
        kwargs=lambda: {"cfg": {"gain": randn(D, seed=3), "shift": randn(D, seed=4)}},
        features={"pytree_inputs", "kwargs"},
    )
)
register(
    Case(
        "pytree_outputs",
        seeded(PytreeOutputs),
        _x(),
        features={"pytree_outputs", "none_output", "constant_output"},
    )
)

register(
    Case(
        "dynamic_batch",
        seeded(NestedMLP),
        _x(batch=3),
        dynamic_shapes=_batch_dim,
        alt_args=_x(batch=7, seed=1),
        features={"dynamic_shapes", "nesting"},
    )
)
register(
    Case(
        "dynamic_view",
        seeded(SymView),
        lambda: (randn(3, 2, D),),
        dynamic_shapes=_batch_dim,
        alt_args=lambda: (randn(6, 2, D, seed=1),),
        features={"dynamic_shapes", "symint"},
    )
)

register(Case("cond", seeded(CondModel), _x(), features={"cond", "control_flow"}))
register(
    Case(
        "map",
        seeded(MapModel),
        lambda: (randn(3, 2, D), randn(2, D, seed=1)),
        features={"map", "control_flow"},
    )
)
register(
    Case(
        "while_loop",
        seeded(WhileModel),
        lambda: (torch.tensor(0), randn(2, D)),
        features={"while_loop", "control_flow"},
    )
)

register(
    Case(
        "effect_print",
        seeded(PrintEffect),
        _x(),
        features={"effects", "prints"},
    )
)
register(Case("effect_record", seeded(RecordEffect), _x(), features={"effects"}))
register(Case("opaque_object", seeded(OpaqueModel), _x(), features={"opaque_object"}))

register(
    Case(
        "preserve_kwargs",
        seeded(PreserveKwargs),
        lambda: (randn(3, D), randn(3, D, seed=1)),
        preserve=("sub",),
        features={"preserve", "kwargs"},
    )
)
register(
    Case(
        "preserve_nested",
        seeded(PreserveNested),
        _x(),
        preserve=("outer", "outer.middle", "outer.middle.inner"),
        features={"preserve", "preserve_nested", "nesting"},
    )
)
register(
    Case(
        "preserve_twice",
        seeded(PreserveTwice),
        _x(),
        preserve=("sub",),
        features={"preserve", "preserve_repeated", "repeated_call"},
    )
)
register(
    Case(
        "preserve_constant",
        seeded(PreserveConstant),
        _x(),
        preserve=("sub",),
        features={"preserve", "preserve_constant"},
    )
)
register(
    Case(
        "preserve_dynamic",
        seeded(PreserveDynamic),
        lambda: (randn(3, 2, D),),
        preserve=("sub",),
        dynamic_shapes=_batch_dim,
        alt_args=lambda: (randn(5, 2, D, seed=1),),
        features={"preserve", "dynamic_shapes", "symint"},
    )
)

register(
    Case(
        "transformer_encoder",
        seeded(_transformer),
        lambda: (randn(2, 5, 16),),
        features={"big", "containers"},
    )
)
register(Case("lstm", seeded(_lstm), lambda: (randn(2, 5, D),), features={"big", "rnn"}))
register(
    Case(
        "mha",
        seeded(MHA),
        lambda: (randn(2, 3, 16), randn(2, 5, 16, seed=1)),
        features={"big", "attention"},
    )
)


# --------------------------------------------------------------------------
# Higher-order-op bodies that export makes (set-grad, autocast)
# --------------------------------------------------------------------------


class Rotary(nn.Module):
    """A rotary-embedding table computed under ``torch.no_grad()`` (as Llama's is)."""

    def __init__(self) -> None:
        super().__init__()
        inv_freq = 1.0 / (100 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(x.shape[-2], dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class GradBody(nn.Module):
    """``rotary`` runs under ``no_grad``: export wraps it in ``wrap_with_set_grad_enabled``."""

    def __init__(self) -> None:
        super().__init__()
        self.rotary = Rotary()
        self.proj = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary(x)
        return self.proj(x) * cos + x * sin


class AutocastBody(nn.Module):
    """A block under ``torch.autocast``: export wraps it in ``wrap_with_autocast``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.lin(x).relu()
        return self.out(h.float())


register(Case("grad_body", seeded(GradBody), _x(batch=5), features={"set_grad_body"}))
# Not strict: torch 2.13's strict export asserts the body's result is float32 while it is
# bfloat16, so its own ep.module() fails (and run_decompositions of it).
register(
    Case("autocast_body", seeded(AutocastBody), _x(batch=5), features={"autocast_body"}),
    ((False, False), (False, True)),
)
