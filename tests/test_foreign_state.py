"""A preserved module that reads state owned outside its subtree can be swapped for the eager one.

Eager modules reach another module's state through a plain attribute (``self._owner = (m,)``):
a block reads the parameter of its parent's sibling, or of the root. After ``lower``, the
preserved module takes exactly the eager ``forward``'s arguments and reads that state through a
peer (``transforms.passes.foreign_state.hold_foreign_state``), so replacing it by a copy of the eager
module (``setattr`` on its parent) gives eager's outputs; the tree, the state dict and the
numbers over two calls are eager's, with generated code and with the interpreter.
"""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch
from torch import nn

from ir import format_program, import_ep
from lowering import lower
from transforms import DEFAULT_PIPELINE, hold_foreign_state, transform

D = 4


class Scale(nn.Module):
    """Owns the state that another branch of the tree reads."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D))
        self.register_buffer("b", torch.randn(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w + self.b


class Reader(nn.Module):
    """Reads ``Scale``'s parameter and buffer (not a call of it) through a plain attribute."""

    def __init__(self, owner: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self._owner = (owner,)  # a tuple: not registered, as in ``tests.zoo.Leaf``

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        owner = self._owner[0]
        return self.lin(x) * owner.w + owner.b


class Block(nn.Module):
    def __init__(self, owner: nn.Module) -> None:
        super().__init__()
        self.reader = Reader(owner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reader(x).relu() + x


class SiblingOwned(nn.Module):
    """``block.reader`` reads the state of ``scale``, a sibling of its ancestor ``block``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()
        self.block = Block(self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(self.block(x))


class RootReader(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self._root: tuple[nn.Module, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) - self._root[0].w


class AncestorOwned(nn.Module):
    """``child`` reads ``w``, a parameter of the root, its ancestor."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D))
        self.child = RootReader()
        self.child._root = (self,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(x) * self.w


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.n


class Bump(nn.Module):
    """Updates ``Counter``'s buffer in place, through a plain attribute, then reads it."""

    def __init__(self, owner: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self._owner = (owner,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._owner[0].n.add_(1.0)
        return self.lin(x) * self._owner[0].n


class SiblingMutated(nn.Module):
    """``bump`` writes the buffer of its sibling ``counter``."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.bump = Bump(self.counter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.counter(self.bump(x))


MODELS = {
    "sibling_owned": SiblingOwned,
    "ancestor_owned": AncestorOwned,
    "sibling_mutated": SiblingMutated,
}
CASES = [
    ("sibling_owned", ("block",)),
    ("sibling_owned", ("block.reader",)),
    ("sibling_owned", ("scale", "block")),
    ("ancestor_owned", ("child",)),
    ("sibling_mutated", ("bump",)),
]
OWNER = {"sibling_owned": ("scale", "w"), "ancestor_owned": ("", "w"), "sibling_mutated": None}


def _eager(model: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[model]()


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(3, D, generator=torch.Generator().manual_seed(1)),)


def _lowered(model: str, preserve: tuple[str, ...], decomp: bool, interpreter: bool = False):
    ep = torch.export.export(
        _eager(model), _inputs(), strict=False, preserve_module_call_signature=preserve
    )
    if decomp:
        ep = ep.run_decompositions()
    return ep, lower(transform(import_ep(ep)), interpreter=interpreter)


def _swap_in_eager(m: nn.Module, preserve: tuple[str, ...], eager: nn.Module) -> None:
    for fqn in preserve:
        parent, _, leaf = fqn.rpartition(".")
        setattr(m.get_submodule(parent), leaf, copy.deepcopy(eager.get_submodule(fqn)))


@pytest.mark.parametrize("interpreter", [False, True], ids=["code", "interpreter"])
@pytest.mark.parametrize("decomp", [False, True], ids=["train", "decomp"])
@pytest.mark.parametrize(("model", "preserve"), CASES, ids=[f"{m}-{'+'.join(p)}" for m, p in CASES])
def test_swapped_in_eager_module_gives_eager_outputs(
    model: str, preserve: tuple[str, ...], decomp: bool, interpreter: bool
) -> None:
    ep, m = _lowered(model, preserve, decomp, interpreter)
    fresh = copy.deepcopy(m)
    eager, reference = _eager(model), ep.module()
    for _ in range(2):
        x = _inputs()
        want = eager(*x)
        torch.testing.assert_close(m(*x), want)
        torch.testing.assert_close(reference(*x), want)
        torch.testing.assert_close(dict(m.named_buffers()), dict(eager.named_buffers()))
    assert list(m.state_dict()) == list(eager.state_dict())
    assert [n for n, _ in m.named_modules()] == [n for n, _ in eager.named_modules()]
    for fqn in preserve:  # the preserved module takes exactly the eager forward's arguments
        got = inspect.signature(m.get_submodule(fqn).forward).parameters
        assert len(got) == len(inspect.signature(eager.get_submodule(fqn).forward).parameters)
    # a copy of an eager module keeps its own copy of what it refers to, in eager as here
    source, swapped_eager = _eager(model), _eager(model)
    _swap_in_eager(fresh, preserve, source)
    _swap_in_eager(swapped_eager, preserve, source)
    for _ in range(2):
        torch.testing.assert_close(fresh(*_inputs()), swapped_eager(*_inputs()))


READS = [(m, p) for m, p in CASES if OWNER[m] is not None]


@pytest.mark.parametrize(("model", "preserve"), READS, ids=[f"{m}-{'+'.join(p)}" for m, p in READS])
def test_the_lowered_module_reads_the_owner_current_state(
    model: str, preserve: tuple[str, ...]
) -> None:
    """An in-place edit of the owner's parameter reaches the preserved module that reads it,
    also in a deep copy and a pickled copy of the lowered tree (the peer is the owner there)."""
    _, m = _lowered(model, preserve, decomp=False)
    eager = _eager(model)
    owner, name = OWNER[model]
    for mod in (eager, m):
        with torch.no_grad():
            getattr(mod.get_submodule(owner), name).add_(1.5)
    want = eager(*_inputs())
    for copied in (m, copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        torch.testing.assert_close(copied(*_inputs()), want)


def test_direct_code_reads_through_the_peer() -> None:
    """The root's direct code (``lowering.direct``) reaches a peer's state too: the tree as built
    keeps it, and its outputs are eager's."""
    _, m = _lowered("sibling_owned", ("block.reader",), decomp=False)
    assert m.__dict__.get("_direct") is not None
    torch.testing.assert_close(m(*_inputs()), _eager("sibling_owned")(*_inputs()))


class Experts(nn.Module):
    """Reads the routing its parent hands it as an attribute (not an argument)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, D, D))
        self.routed: tuple[torch.Tensor, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx, weights = self.routed
        out = torch.zeros_like(x)
        for e in range(2):
            out = out + (idx == e).any(-1, keepdim=True).to(x.dtype) * (x @ self.w[e])
        return out * weights.sum(-1, keepdim=True)


class RoutedMoE(nn.Module):
    """``experts`` reads top-k values made from ``router``'s output outside its preserved call:
    ``rematerialize`` recomputes them inside ``experts`` from ``router``'s parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D, 2)
        self.experts = Experts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = torch.topk(self.router(x).softmax(-1), 1)
        self.experts.routed = (idx, weights)
        return self.experts(x)


@pytest.mark.parametrize("decomp", [False, True], ids=["train", "decomp"])
def test_a_recomputed_read_of_a_sibling_parameter_goes_through_a_peer(decomp: bool) -> None:
    """The recomputed top-k reads ``router``'s parameters through a peer: ``experts`` still takes
    only the eager ``forward``'s one argument, and its result is eager's."""
    torch.manual_seed(0)
    eager = RoutedMoE()
    ep = torch.export.export(
        eager, _inputs(), strict=False, preserve_module_call_signature=("experts",)
    )
    if decomp:
        ep = ep.run_decompositions()
    m = lower(transform(import_ep(ep)))
    assert len(inspect.signature(m.experts.forward).parameters) == 1
    assert [n for n, _ in m.named_modules()] == [n for n, _ in eager.named_modules()]
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(m(*_inputs()), eager(*_inputs()))


@pytest.mark.parametrize(("model", "preserve"), CASES, ids=[f"{m}-{'+'.join(p)}" for m, p in CASES])
def test_listing_the_pass_leaves_the_default_pipeline_output_as_it_was(
    model: str, preserve: tuple[str, ...]
) -> None:
    """``hold_foreign_state`` is a listed pass and still ``sink_state``'s last step: the default
    pipeline's output is the same text as the passes run one by one with the listed pass named
    after ``sink_state``, and the pass given that output returns it as it is."""
    ep = torch.export.export(
        _eager(model), _inputs(), strict=False, preserve_module_call_signature=preserve
    )
    p = import_ep(ep)
    default = transform(p)
    names = [f.__name__ for f in DEFAULT_PIPELINE]
    at = names.index("sink_state") + 1
    listed = transform(p, [*names[:at], "hold_foreign_state", *names[at:]], check=True)
    assert format_program(listed, vals=False) == format_program(default, vals=False)
    assert hold_foreign_state(default) is default
    if OWNER[model] is not None:  # the pass has work to do here: a peer is read
        assert any(m.peers for m in default.modules.values())
