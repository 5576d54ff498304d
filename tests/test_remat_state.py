"""Preserved calls that update state, and signatures that ``run_decompositions`` left stale.

- Train-mode BatchNorm preserved, called once or twice, decomposed or not, with the default
  pipeline and with ``keep_functional=True``: outputs and running statistics after each call equal
  eager's (the running statistics are ``getitem`` 3 and 4 of
  ``_native_batch_norm_legit_functional``: ``transforms.preserved.state_traffic``' table of state outputs).
- The decomposed program names the wrong ``getitem`` as the preserved BatchNorm's output (torch
  maps an old name to the *last* new node made from it): ``repair_call_signatures`` names the
  value that crosses the boundary instead (Before/Expected on the signature).
- A decomposed preserved MoE router whose signature names the caller's sorted indices (made after
  the call) for its top-k index, next to its logits, which the caller drops:
  ``repair_call_signatures`` renames the stale name only.
- A preserved call's in-place result that the caller reads only to write a buffer, next to a
  value kept on the module that crosses unsigned: no stale name, the signature is kept.
- A preserved call that hands one of its inputs back (T5's position bias) next to a sibling that
  made it: both results live in the caller under distinct names.
"""

from __future__ import annotations

import copy

import attrs
import pytest
import torch
from torch import nn

from ir import import_ep
from ir.args import EMPTY_DICT, ref
from ir.errors import PassError
from ir.verify import verify
from lowering import lower
from lowering.pass_laws import check_program
from transforms import pipeline, transform
from transforms.passes.module_stacks import fill_call_gaps
from transforms.pipeline import DEFAULT_PIPELINE
from transforms.preserved.remat import rematerialize
from transforms.preserved.signatures import repair_call_signatures

D = 4
# the passes before the preserved-call stages (``transforms.preserved``) and ``outline``
BEFORE_OUTLINE = DEFAULT_PIPELINE[: DEFAULT_PIPELINE.index(fill_call_gaps)]


class NormOnce(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.bn = nn.BatchNorm1d(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x)).relu()


class NormTwice(NormOnce):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.bn(self.lin(x)).relu())


def export_bn(model: nn.Module, strict: bool, decompose: bool) -> torch.export.ExportedProgram:
    ep = torch.export.export(
        copy.deepcopy(model), (torch.randn(5, D),), strict=strict,
        preserve_module_call_signature=("bn",),
    )
    return ep.run_decompositions() if decompose else ep


@pytest.mark.parametrize("keep_functional", [False, True], ids=["inplace", "functional"])
@pytest.mark.parametrize("decompose", [False, True], ids=["training", "decomposed"])
@pytest.mark.parametrize("cls", [NormOnce, NormTwice], ids=["once", "twice"])
def test_preserved_train_batchnorm_matches_eager(cls, decompose: bool, keep_functional: bool):
    torch.manual_seed(0)
    eager = cls().train()
    p = transform(import_ep(export_bn(eager, False, decompose)), pipeline(keep_functional=keep_functional))
    verify(p)
    m = lower(p)
    for i in range(3):
        x = torch.randn(5, D, generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(m(x), eager(x))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(m.bn, name), getattr(eager.bn, name), msg=name)
    swapped = copy.deepcopy(eager)
    m.bn = copy.deepcopy(eager.bn)
    x = torch.randn(5, D)
    torch.testing.assert_close(m(x), swapped(x))


def test_preserved_train_batchnorm_obeys_the_laws() -> None:
    torch.manual_seed(0)
    check_program(transform, import_ep(export_bn(NormTwice().train(), False, True)), idempotent=True)


def test_stale_output_name_is_repaired() -> None:
    """Before: ``bn``'s signature returns ``getitem_4`` (the new running variance) while the
    caller's ``relu`` reads ``getitem``, the normalized output. Expected: it returns ``getitem``."""
    torch.manual_seed(0)
    before = transform(import_ep(export_bn(NormOnce().train(), False, True)), BEFORE_OUTLINE)
    sig = before.call_signatures["bn"]
    assert [a.name for a in sig.outputs] == ["getitem_4"]  # torch's name: the symptom
    fixed = attrs.evolve(sig, outputs=(attrs.evolve(sig.outputs[0], name="getitem"),))
    expected = before.replace(call_signatures=before.call_signatures.set("bn", fixed))
    after = repair_call_signatures(before)
    assert after == expected
    assert repair_call_signatures(after) is after


def test_consistent_signature_is_not_touched() -> None:
    torch.manual_seed(0)
    p = transform(import_ep(export_bn(NormOnce().train(), False, False)), BEFORE_OUTLINE)
    assert repair_call_signatures(p) is p


class Router(nn.Module):
    """A MoE router (as Mixtral's): logits, normalized top-k weights, top-k indices."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, 3, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.lin(x)
        weights, index = logits.softmax(-1).topk(2)
        return logits, weights / weights.sum(-1, keepdim=True), index


class Routed(nn.Module):
    """Drops the router's logits and sorts its indices (as a MoE experts block does)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = Router()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, weights, index = self.gate(x)
        order, slot = index.view(-1).sort()
        return x[slot // 2] * order.unsqueeze(-1).float() + weights.sum()


def test_stale_output_next_to_a_dropped_one_is_repaired() -> None:
    """Before: the decomposed ``gate``'s signature returns ``getitem_2`` (in the decomposed graph
    the caller's sorted indices, made after the call) for the top-k index ``getitem_1``, and its
    logits ``mm``, which the caller drops (read by nothing after the call). Expected: the stale
    name alone is renamed, to the one value that crosses out of the call (``mm`` is kept), and
    the pipeline matches eager, also with the eager router swapped in."""
    torch.manual_seed(0)
    eager, x = Routed(), torch.randn(5, D)
    ep = torch.export.export(copy.deepcopy(eager), (x,), preserve_module_call_signature=("gate",))
    before = transform(import_ep(ep.run_decompositions()), BEFORE_OUTLINE)
    sig = before.call_signatures["gate"]
    assert [a.name for a in sig.outputs] == ["mm", "div", "getitem_2"]  # torch's: the symptom
    after = repair_call_signatures(before)
    assert [a.name for a in after.call_signatures["gate"].outputs] == ["mm", "div", "getitem_1"]
    assert repair_call_signatures(after) is after
    m = lower(transform(import_ep(ep.run_decompositions())))
    torch.testing.assert_close(m(x), eager(x))
    m.gate = copy.deepcopy(eager.gate)
    torch.testing.assert_close(m(x), eager(x))


def test_a_signature_naming_a_later_value_is_a_named_error() -> None:
    """Without ``repair_call_signatures``, ``rematerialize`` says that ``gate`` returns a value
    made only after it ends (``outline`` would report it as a read across the boundary)."""
    torch.manual_seed(0)
    ep = torch.export.export(Routed(), (torch.randn(5, D),), preserve_module_call_signature=("gate",))
    stale = transform(import_ep(ep.run_decompositions()), BEFORE_OUTLINE)
    with pytest.raises(PassError, match=r"'gate' returns %getitem_2, which is computed only after"):
        rematerialize(stale)


class PassesBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x) + bias, bias


class BiasChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = PassesBias()
        self.b = PassesBias()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, bias = self.a(x, x.mean(0))
        h, bias = self.b(h, bias)
        return h + bias


@pytest.mark.parametrize("decompose", [False, True], ids=["training", "decomposed"])
def test_siblings_handing_back_one_value_verify_and_run(decompose: bool) -> None:
    torch.manual_seed(0)
    eager, x = BiasChain(), torch.randn(3, D)
    ep = torch.export.export(copy.deepcopy(eager), (x,), preserve_module_call_signature=("a", "b"))
    if decompose:
        ep = ep.run_decompositions()
    p = transform(import_ep(ep))
    verify(p)
    m = lower(p)
    torch.testing.assert_close(m(x), eager(x))
    m.b = copy.deepcopy(eager.b)
    torch.testing.assert_close(m(x), eager(x))


def test_batchnorm_statistics_read_by_the_next_call_are_written_back() -> None:
    """Before (flat, decomposed, twice): ``bn@1`` reads ``add``, ``getitem_3`` and ``getitem_4``,
    the batch count and running statistics ``bn`` computed. Expected: a ``copy_`` into each
    buffer right after each of them (in ``bn``), so that ``bn@1`` reads the buffers; and, since
    ``bn@1`` writes each buffer again after reading it, a snapshot ``<value>_read =
    clone(<value>)`` right before its first reader there, which the reader reads (an operator
    that saved the buffer for the backward would see the later write); nothing else
    changes."""
    from ir.args import map_refs
    from ir.graph import Graph
    from ir.node import CALL_FUNCTION, Node
    from ir.ops import CLONE, COPY
    from transforms.preserved.ivals import insert_ivals

    def by_name(p):
        return p.root_module.graph.by_name()

    def _in_second_call(node) -> bool:
        stack = node.meta.get("nn_module_stack") or {}
        return any(key.endswith("@1") for key in stack)

    torch.manual_seed(0)
    flat = transform(import_ep(export_bn(NormTwice().train(), False, True)), BEFORE_OUTLINE)
    before = rematerialize(repair_call_signatures(flat))
    after = insert_ivals(before)
    writes = {
        "add": "b_bn_num_batches_tracked",
        "getitem_3": "b_bn_running_mean",
        "getitem_4": "b_bn_running_var",
    }
    nodes, names = [], {n.name for n in before.root_module.graph.nodes}
    snapshot: dict[str, str] = {}
    for node in before.root_module.graph.nodes:
        read = [r.name for r in node.inputs() if r.name in writes and node.name != "copy_"
                and _in_second_call(node)]
        for value in read:
            if value not in snapshot:
                snapshot[value] = f"{value}_read"
                val = {**node.meta, "val": by_name(before)[value].meta["val"]}
                nodes.append(Node(CALL_FUNCTION, snapshot[value], CLONE, (ref(value),),
                                  EMPTY_DICT, val))
        if read:
            node = node.replace(args=map_refs(
                node.args, lambda r: ref(snapshot[r.name]) if r.name in snapshot else r))
        nodes.append(node)
        if node.name in writes:
            name = next(f"copy__{i}" for i in range(1, 99) if f"copy__{i}" not in names)
            names.add(name)
            args = (ref(writes[node.name]), node.ref)
            nodes.append(Node(CALL_FUNCTION, name, COPY, args, EMPTY_DICT, node.meta))
    root = before.root_module.replace(graphs=(Graph.of(nodes),))
    expected = before.replace(modules=before.modules.set(before.root, root))
    assert after == expected
    assert insert_ivals(after) is after


class NormBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(D)
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.bn(x)).relu()


class TwoNormBlocks(nn.Module):
    """``a`` is called twice, ``b`` once; each updates its BatchNorm's running statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.a = NormBlock()
        self.b = NormBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + self.a(x)


class Counts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n.add_(x.mean(0))
        return x + self.n


class ReadsCount(nn.Module):
    def __init__(self, peer: Counts) -> None:
        super().__init__()
        self._peer = (peer,)  # not registered: the buffer is its peer's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self._peer[0].n


class CountsAndReads(nn.Module):
    """``c`` mutates its buffer (called twice); sibling ``r`` reads it in between."""

    def __init__(self) -> None:
        super().__init__()
        self.c = Counts()
        self.r = ReadsCount(self.c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.r(self.c(x)) + self.c(x)


STATE_SETS = [
    (TwoNormBlocks, ("a", "b")),  # siblings, one called twice
    (TwoNormBlocks, ("a", "a.bn")),  # parent and child
    (CountsAndReads, ("c", "r")),  # a buffer mutated by one preserved call, read by another
]


@pytest.mark.parametrize("keep_functional", [False, True], ids=["inplace", "functional"])
@pytest.mark.parametrize("decompose", [False, True], ids=["training", "decomposed"])
@pytest.mark.parametrize(("cls", "fqns"), STATE_SETS,
                         ids=["+".join(f) for _, f in STATE_SETS])
def test_state_updates_in_sets_of_preserved_calls(cls, fqns, decompose, keep_functional):
    """Outputs and every buffer after each of two calls equal eager's, for each set of
    preserved modules that update state, in both mutation modes."""
    torch.manual_seed(0)
    model, x = cls().train(), torch.randn(6, D)
    ep = torch.export.export(copy.deepcopy(model), (x,), preserve_module_call_signature=fqns)
    if decompose:
        ep = ep.run_decompositions()
    p = transform(import_ep(ep), pipeline(keep_functional=keep_functional))
    verify(p)
    m = lower(p)
    for _ in range(2):
        torch.testing.assert_close(m(x), model(x))
        got = dict(m.named_buffers())
        for name, value in model.named_buffers():
            torch.testing.assert_close(got[name], value, msg=name)


class Stashes(nn.Module):
    """Returns an in-place result and keeps another value on itself (as a block that keeps
    its attention weights for inspection): the caller reads it without the signature."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(D))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.copy_(x.mean(0))
        y = x.clone().add_(x)
        t = torch.tanh(y)
        self.kept = torch.sigmoid(t)
        return t, y


class StoresResult(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Stashes()
        self.register_buffer("mean", torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, y = self.a(x)
        self.mean.copy_(y.mean(0))  # the caller reads a's result only into state
        return t * 2 + self.a.kept


@pytest.mark.filterwarnings("ignore:The tensor attribute self.a.kept was assigned")
def test_a_result_the_caller_reads_into_state_is_no_stale_name() -> None:
    """``a`` returns ``add_`` (an in-place result), which the caller reads only to write a buffer,
    while ``sigmoid`` crosses out of ``a`` unsigned. ``add_`` is no stale name, so the signature
    is kept (renamed to ``sigmoid``, it left the caller's read of ``add_`` unresolvable: a
    ``PassError``), and the pipeline matches eager, the buffers included."""
    torch.manual_seed(0)
    eager, x = StoresResult(), torch.randn(3, D)
    ep = torch.export.export(copy.deepcopy(eager), (x,), preserve_module_call_signature=("a",),
                             strict=False)
    before = transform(import_ep(ep), BEFORE_OUTLINE)
    assert repair_call_signatures(before) is before
    m = lower(transform(import_ep(ep)))
    torch.testing.assert_close(m(x), eager(x))
    torch.testing.assert_close(m.mean, eager.mean)
    torch.testing.assert_close(m.a.seen, eager.a.seen)
