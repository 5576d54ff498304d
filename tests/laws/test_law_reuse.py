"""The laws' shortcuts judge what the pass changed (issue 72): each is keyed so that a pass
that changes a value, a shape or a write is still judged.

- ``verify`` fake-runs only the nodes a pass changed (``ir.verify.verify(..., since=input)``):
  a node whose ``val`` object, target or arguments changed is run again, and so is a node
  left as it was whose input's ``val`` changed;
- ``semantics`` runs nothing when the pass returned its input itself (the same object): a
  result that is a new program, even one equal but for a dropped write, is run.
"""

from __future__ import annotations

import pytest
import torch

from ir import import_ep
from ir.errors import VerifyError
from ir.graph import Graph
from ir.node import CALL_FUNCTION, Node
from ir.program import Program
from ir.torch_seam import new_fake, new_fake_mode, storage_identity
from ir.verify import unchanged_since, verify
from lowering.pass_laws import LawViolation, check_semantics, check_verify

aten = torch.ops.aten


class _ReluPlusOne(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return torch.relu(x) + 1


@pytest.fixture(scope="module")
def program() -> Program:
    ep = torch.export.export(_ReluPlusOne(), (torch.randn(2, 3),))
    return import_ep(ep)


def _with_nodes(p: Program, change) -> Program:
    """``p`` with each root node ``n`` replaced by ``change(n)`` (``n`` itself: kept)."""
    graph = Graph(tuple(change(n) for n in p.root_module.graph.nodes))
    return p.replace(modules=p.modules.set(p.root, p.root_module.replace(graphs=(graph,))))


def _node(p: Program, target) -> Node:
    return next(n for n in p.root_module.graph.nodes
                if n.op == CALL_FUNCTION and n.target is target)


def _fake_like(val: torch.Tensor, shape: tuple) -> torch.Tensor:
    return new_fake(val.fake_mode, shape, val.dtype)


def test_a_program_verifies_since_itself_and_a_copy_of_it(program):
    assert verify(program, vals=True, since=program) is program
    same = _with_nodes(program, lambda n: n.replace(meta=dict(n.meta)))  # new objects, same vals
    assert verify(same, vals=True, since=program) is same
    relu = _node(program, aten.relu.default)
    assert unchanged_since(relu, program.root_module.graph, program.root_module.graph)


def test_a_val_the_pass_changed_is_checked(program):
    relu = _node(program, aten.relu.default)
    wrong = _fake_like(relu.meta["val"], (3, 2))  # a shape the node does not compute

    def stale_val(p: Program) -> Program:
        return _with_nodes(p, lambda n: n.with_meta(val=wrong) if n.name == relu.name else n)

    result = stale_val(program)
    assert not unchanged_since(_node(result, aten.relu.default), result.root_module.graph,
                               program.root_module.graph)
    with pytest.raises(VerifyError, match=relu.name):
        verify(result, vals=True, since=program)
    with pytest.raises(LawViolation, match="law 'verify'"):
        check_verify(stale_val, program)


def test_a_node_left_alone_whose_input_changed_shape_is_checked(program):
    # the pass transposes relu's input and gives relu its right new val; the add after it is
    # the very same node object, its val now stale: it is run again because its input's val
    # is another object
    relu = _node(program, aten.relu.default)
    add = _node(program, aten.add.Tensor)
    new_val = _fake_like(relu.meta["val"], (3, 2))

    def transposed(p: Program) -> Program:
        def change(n: Node) -> Node:
            if n.name != relu.name:
                return n
            return n.replace(target=aten.t.default).with_meta(val=new_val)

        return _with_nodes(p, change)

    result = transposed(program)
    assert _node(result, aten.add.Tensor) is add
    with pytest.raises(VerifyError, match=add.name):
        verify(result, vals=True, since=program)
    with pytest.raises(LawViolation, match="law 'verify'"):
        check_verify(transposed, program)


def test_a_target_changed_under_the_same_val_is_checked(program):
    relu = _node(program, aten.relu.default)

    def summed(p: Program) -> Program:  # sum of all elements: a scalar, val still (2, 3)
        return _with_nodes(p, lambda n: n.replace(target=aten.sum.default)
                           if n.name == relu.name else n)

    with pytest.raises(LawViolation, match="law 'verify'"):
        check_verify(summed, program)


def test_a_stale_val_of_the_input_is_still_excused(program):
    # the input's own stale val is not the pass's fault, with or without the shortcut
    relu = _node(program, aten.relu.default)
    mode = new_fake_mode()
    stale = _with_nodes(program, lambda n: n.with_meta(val=new_fake(mode, (3, 2)))
                        if n.name == relu.name else n)
    assert check_verify(lambda p: p, stale) is stale
    assert check_verify(lambda p: _with_nodes(p, lambda n: n), stale) is not None


def test_a_pass_that_drops_a_write_is_run_by_semantics(program):
    # the program writes its buffer in place (``add_``); a result that drops the write is a
    # new object, so the shortcut for a returned input does not apply and the law runs it
    write = _node(program, aten.add_.Tensor)

    def drops_write(p: Program) -> Program:
        graph = Graph(tuple(n for n in p.root_module.graph.nodes if n.name != write.name))
        return p.replace(modules=p.modules.set(p.root, p.root_module.replace(graphs=(graph,))))

    with pytest.raises(LawViolation, match="law 'semantics'"):
        check_semantics(drops_write, program)
    assert check_semantics(lambda p: p, program) is program  # the input itself: nothing to run


def test_the_input_program_still_runs_when_the_pass_returns_it(program):
    # no side of the result's own, but the input program is lowered and run: an error there is
    # still raised as not the pass's fault
    def raising(*args, **kwargs):
        raise ValueError("no inputs here")

    with pytest.raises(ValueError, match="no inputs here"):
        check_semantics(lambda p: p, program, inputs=raising)


@pytest.mark.parametrize("shape,dtype", [((2, 3), torch.float32), ((4,), torch.int64), ((), torch.bool)])
def test_new_fake_is_what_empty_makes_under_the_mode(shape, dtype):
    # the generator's vals, made without a dispatch: the same metadata, a storage of their own
    mode = new_fake_mode()
    with mode:
        want = torch.empty(shape, dtype=dtype)
        inside = new_fake(mode, shape, dtype)  # under an active mode: dispatched
    got, other = new_fake(mode, shape, dtype), new_fake(mode, shape, dtype)
    for t in (got, inside):
        assert type(t) is type(want) and t.fake_mode is mode
        assert (t.shape, t.dtype, t.device, t.stride()) == (want.shape, want.dtype, want.device,
                                                            want.stride())
    assert storage_identity(got) != storage_identity(other)
