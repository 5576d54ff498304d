"""Values one preserved call makes and another reads (``transforms.preserved.remat``), on torch models.

Sibling preserved calls that share an internal value in both directions (the first call's value
read by the second, and the second's read by the first), passed as an argument by their caller
or read in the body; a parent that returns a value its preserved child made inside (the parent
recomputes it); a no-op alias of a call's output passed on (read from that output, so a
swapped module is seen); symbolic-size arithmetic of a derived ``Dim`` made in one preserved
call and read in another; a parent and its children all preserved; repeated calls. Each is
exported in training IR and after ``run_decompositions()``, run twice against eager, and run
again after each preserved module is replaced by a copy of the eager one.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ir import import_ep, verify
from ir.errors import PassError
from lowering import lower
from transforms import transform

D = 4


class Stat(nn.Module):
    """Makes a statistic of its input that others read (``self.stat``), not one it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.stat: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stat = x.abs().amax(-1, keepdim=True) + 1
        return self.lin(x) / self.stat


class ReadsPeer(nn.Module):
    """Reads its peer's statistic of the same input (a module owned elsewhere in the tree)."""

    def __init__(self, peer: Stat) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self._peer = (peer,)  # a tuple, so nn.Module does not register it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self._peer[0].stat


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self.lin(y) * s


class PassesStat(nn.Module):
    """The caller passes ``a``'s internal statistic to ``b`` as an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Stat()
        self.b = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(y, self.a.stat)


class FirstReadsSecond(nn.Module):
    """``b`` runs first and makes the statistic; ``a`` reads it in its body."""

    def __init__(self) -> None:
        super().__init__()
        self.b = Stat()
        self.a = ReadsPeer(self.b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(x)
        return self.a(x) + y


class SecondReadsFirst(nn.Module):
    """``a`` runs first and makes the statistic; ``b`` reads it in its body."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Stat()
        self.b = ReadsPeer(self.a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.b(x) + y


class Cast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)  # a no-op: export then names the caller's ``x`` after it
        return x.sin()


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class CastThenSibling(nn.Module):
    """``b`` is passed the no-op cast made inside ``a``: it is the caller's ``x``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Cast()
        self.b = Lin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


class KeepsView(nn.Module):
    """Returns its result and keeps a no-op view of it (``self.h``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.h: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        self.h = out.view(out.shape)
        return out


class PassesView(nn.Module):
    """The caller passes ``a.h`` (a no-op view of ``a``'s output) to ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = KeepsView()
        self.b = Lin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a(x)
        return self.b(self.a.h)


class Halves(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0] // 2, -1)


class FirstHalf(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y[: x.shape[0] // 2] * 2


class SharedHalfSize(nn.Module):
    """``a`` and ``b`` both divide the dynamic batch: export computes ``floordiv`` once, in
    ``a``, and ``b`` reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Halves()
        self.b = FirstHalf()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(x, h.sum(-1)).sum() + h.sum()


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = PassesStat()
        self.q = Lin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(self.p(x))


class ReturnsInner(nn.Module):
    """Returns its child's internal statistic next to the child's result."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Stat()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.a(x)
        return y, self.a.stat


class UsesReturned(nn.Module):
    """``p`` returns ``p.a``'s statistic; the root also reads it as ``p.a.stat``."""

    def __init__(self) -> None:
        super().__init__()
        self.p = ReturnsInner()
        self.q = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, s = self.p(x)
        return self.q(y, s * self.p.a.stat)


class Repeated(nn.Module):
    """``a`` and ``b`` called twice each; each call of ``b`` is passed the statistic the call
    of ``a`` before it made."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Stat()
        self.b = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(self.a(x), self.a.stat)
        return self.b(self.a(y), self.a.stat)


class RandomStat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stat: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stat = torch.rand_like(x)
        return x * self.stat


class PassesRandom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = RandomStat()
        self.b = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x), self.a.stat)


def _b() -> torch.export.Dim:
    return torch.export.Dim("b", min=1, max=64)


# (name, model factory, preserved fqns, the fqns to swap, dynamic shapes)
CASES = [
    ("argument_made_in_sibling", PassesStat, ("a", "b"), ("a", "b"), None),
    ("second_reads_first", SecondReadsFirst, ("a", "b"), ("a",), None),
    ("first_reads_second", FirstReadsSecond, ("b", "a"), ("b",), None),
    ("no_op_cast_passed_on", CastThenSibling, ("a", "b"), ("a", "b"), None),
    ("view_of_output_passed_on", PassesView, ("a", "b"), ("a", "b"), None),
    ("derived_dim_across_calls", SharedHalfSize, ("a", "b"), ("a", "b"), lambda: ({0: 2 * _b()},)),
    ("parent_and_children", Outer, ("p", "p.a", "p.b"), ("p.a", "p.b", "p"), None),
    ("parent_and_one_child", Outer, ("p", "p.b"), ("p.b", "p"), None),
    ("children_and_uncle", Outer, ("p.a", "p.b", "q"), ("p.a", "p.b", "q"), None),
    ("repeated_calls", Repeated, ("a", "b"), ("a", "b"), None),
    ("parent_returns_childs_value", UsesReturned, ("p", "p.a"), ("p.a", "p"), None),
    ("parent_returns_childs_value_to_sibling", UsesReturned, ("p", "p.a", "q"), ("p", "q"), None),
]


def swapped(m: nn.Module, fqn: str, replacement: nn.Module) -> nn.Module:
    parent, _, name = fqn.rpartition(".")
    setattr(m.get_submodule(parent) if parent else m, name, replacement)
    return m


def eager_copy(model: nn.Module, fqn: str) -> nn.Module:
    """A deep copy of ``model``'s submodule ``fqn`` (tensors an earlier call left on it are
    dropped: they are not state)."""
    clean = copy.copy(model.get_submodule(fqn))
    for sub in clean.modules():
        for attr in ("stat", "h"):
            if isinstance(getattr(sub, attr, None), torch.Tensor):
                setattr(sub, attr, None)
    return copy.deepcopy(clean)


@pytest.mark.parametrize("decompose", [False, True], ids=["training", "decomposed"])
@pytest.mark.parametrize(("make", "preserve", "swap", "shapes"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_value_made_in_one_call_and_read_in_another(make, preserve, swap, shapes, decompose):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(6, D)
    ep = torch.export.export(
        eager_copy(model, ""), (x,), preserve_module_call_signature=preserve,
        dynamic_shapes=shapes() if shapes else None,
    )
    if decompose:
        ep = ep.run_decompositions()
    p = transform(import_ep(ep))
    verify(p)
    m = lower(p)
    inputs = [x, torch.randn(10, D)] if shapes else [x, x]
    for arg in inputs:  # two calls (another size when the batch is dynamic)
        torch.testing.assert_close(m(arg), model(arg))
    for fqn in swap:
        swapped(m, fqn, eager_copy(model, fqn))
        torch.testing.assert_close(m(x), model(x), msg=f"after swapping {fqn}")


def test_swapped_producer_is_seen_through_the_alias():
    """``b`` is passed ``a``'s output (the no-op view ``a.h`` of it): a user's ``a`` that
    returns something else changes what ``b`` gets, as in eager."""

    class Zeros(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.h = torch.zeros_like(x)
            return self.h

    torch.manual_seed(0)
    model, x = PassesView(), torch.randn(3, D)
    p = import_ep(torch.export.export(eager_copy(model, ""), (x,),
                                      preserve_module_call_signature=("a", "b")))
    m = swapped(lower(transform(p)), "a", Zeros())
    swapped(model, "a", Zeros())
    torch.testing.assert_close(m(x), model(x))


def test_random_argument_made_in_a_sibling_is_a_named_error():
    x = torch.randn(3, D)
    ep = torch.export.export(PassesRandom(), (x,), preserve_module_call_signature=("a", "b"))
    with pytest.raises(PassError) as info:
        transform(import_ep(ep))
    message = str(info.value)
    assert "produced inside a preserved call 'a'" in message
    assert "passed as an argument to the preserved call 'b' in '<root>'" in message
    assert "is random" in message
    assert "Return it from 'a'" in message
