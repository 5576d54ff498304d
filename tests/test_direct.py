"""Direct code: the root skips per-module dispatch while the tree is as built, and falls back to
module-by-module calls, exactly like eager, as soon as a user swaps, hooks or patches a module."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from ir import import_ep
from lowering import lower, tree_watch
from lowering.modules import LoweredModule
from lowering.root import RECHECK_EVERY
from transforms import transform


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1.0)
        return torch.relu(self.linear(x)) + self.count


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Twice(nn.Module):
    def forward(self, x):
        return 2 * x


def build() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    eager = Net()
    ep = torch.export.export(copy.deepcopy(eager), (torch.randn(3, 4),), strict=False)
    return eager, lower(transform(import_ep(ep)))


def x() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(1))


def assert_same_as_eager(eager: nn.Module, lowered: nn.Module, calls: int = 2) -> None:
    for _ in range(calls):
        torch.testing.assert_close(lowered(x()), eager(x()))
    torch.testing.assert_close(dict(lowered.named_buffers()), dict(eager.named_buffers()))


def count_module_code(root: nn.Module) -> list[nn.Module]:
    """Make every lowered submodule's ordinary (module-by-module) code record its calls."""
    calls: list[nn.Module] = []
    for mod in root.modules():
        if isinstance(mod, LoweredModule):
            mod.__dict__["_codes"] = [_counting(code, calls) for code in mod._codes]
    return calls


def _counting(code, calls):
    def run(self, *args):
        calls.append(self)
        return code(self, *args)

    return run


def test_root_runs_direct_code_without_calling_submodules():
    eager, lowered = build()
    forward_calls = count_module_code(lowered)
    assert lowered._tree_unchanged()
    assert_same_as_eager(eager, lowered, calls=3)
    assert forward_calls == []


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Middle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(self.inner(x) + x)


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(Middle(), nn.Linear(4, 4))
        self.middle = Middle()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.middle(self.block(x)))


@pytest.mark.parametrize("passes", ["none", "default"])
@pytest.mark.parametrize("preserve", [(), ("middle", "block.0")])
def test_state_read_at_every_depth_runs_direct_code(passes, preserve):
    # siblings and cousins read state through shared path prefixes (``block.0.inner.lin``,
    # ``block.0.norm``, ``block.1``); preserved calls flatten and index their arguments
    torch.manual_seed(0)
    eager = Nested()
    ep = torch.export.export(
        copy.deepcopy(eager), (x(),), strict=False, preserve_module_call_signature=preserve
    )
    program = import_ep(ep)
    lowered = lower(program if passes == "none" else transform(program))
    forward_calls = count_module_code(lowered)
    assert lowered._tree_unchanged()
    assert_same_as_eager(eager, lowered)
    assert forward_calls == []


def test_submodule_called_directly_runs_its_own_code():
    eager, lowered = build()
    forward_calls = count_module_code(lowered)
    torch.testing.assert_close(lowered.blocks[1](x()), eager.blocks[1](x()))
    assert forward_calls[0] is lowered.blocks[1]


def test_forward_hook_on_a_submodule_fires():
    eager, lowered = build()
    forward_calls = count_module_code(lowered)
    seen = []
    for model in (eager, lowered):
        model.blocks[0].register_forward_hook(lambda mod, args, out: seen.append(out) or out * 3)
    assert_same_as_eager(eager, lowered)
    assert len(seen) == 4
    assert forward_calls  # module-by-module now


def test_forward_pre_hook_on_a_leaf_changes_its_input():
    eager, lowered = build()
    for model in (eager, lowered):
        model.blocks[1].linear.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    assert_same_as_eager(eager, lowered)


def test_removed_hook_returns_to_direct_code():
    _, lowered = build()
    forward_calls = count_module_code(lowered)
    handle = lowered.blocks[0].register_forward_hook(lambda mod, args, out: out)
    lowered(x())
    assert forward_calls
    handle.remove()
    for _ in range(RECHECK_EVERY):
        lowered(x())
    forward_calls.clear()
    lowered(x())
    assert forward_calls == []


def test_global_module_hook_fires_for_submodules():
    _, lowered = build()
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: seen.append(type(mod).__name__)
    )
    try:
        lowered(x())
    finally:
        handle.remove()
    assert len(seen) == 1 + 2 * 2 + 1  # root, two blocks with a linear each, head


@pytest.mark.parametrize(
    "swap",
    [
        lambda m: setattr(m.blocks, "1", Twice()),
        lambda m: m.blocks.__setitem__(0, Twice()),
        lambda m: m.add_module("head", Twice()),
        lambda m: setattr(m.blocks[0], "linear", nn.Identity()),
    ],
    ids=["setattr", "setitem", "add_module", "leaf"],
)
def test_swapped_submodule_is_called(swap):
    eager, lowered = build()
    torch.manual_seed(3)
    swap(eager)
    torch.manual_seed(3)
    swap(lowered)
    assert not lowered._tree_unchanged()
    assert_same_as_eager(eager, lowered)


def test_lowered_module_written_into_a_modules_table_runs_its_own_code():
    # a write to ``_modules`` itself does not pass through ``__setattr__`` (no epoch moves), so
    # direct code must look each child's function up on the module it finds there
    eager, lowered = build()
    for model in (eager, lowered):
        model._modules["head"] = model.blocks[0]
    assert_same_as_eager(eager, lowered)


def test_patched_forward_is_called():
    eager, lowered = build()
    for model in (eager, lowered):
        model.blocks[1].forward = lambda inp: inp - 1
    assert_same_as_eager(eager, lowered)


def test_parametrized_weight_is_used():
    eager, lowered = build()
    for model in (eager, lowered):
        torch.nn.utils.parametrize.register_parametrization(model.head, "weight", Twice())
    assert_same_as_eager(eager, lowered)


def test_new_parameter_and_loaded_state_are_read_on_each_call():
    eager, lowered = build()
    forward_calls = count_module_code(lowered)
    weight = torch.randn(4, 4)
    for model in (eager, lowered):
        model.blocks[0].linear.weight = nn.Parameter(weight.clone())
    state = {k: v + 1 for k, v in eager.state_dict().items()}
    eager.load_state_dict(state)
    lowered.load_state_dict(state)
    assert_same_as_eager(eager, lowered)
    assert forward_calls == []


def test_converted_dtype_is_used():
    eager, lowered = build()
    eager.double()
    lowered.double()
    lowered.check_input_constraints = False  # the program was exported for float32 inputs
    out = lowered(x().double())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, eager(x().double()))


def test_deep_copy_runs_direct_code_on_its_own_state():
    _, lowered = build()
    twin = copy.deepcopy(lowered)
    forward_calls = count_module_code(twin)
    twin(x())
    assert forward_calls == []
    assert torch.equal(twin.blocks[0].count, torch.ones(4))
    assert torch.equal(lowered.blocks[0].count, torch.zeros(4))
    assert twin.blocks[0].__dict__["_direct_children"]["linear"] is twin.blocks[0].linear


def test_unpickled_copy_runs_module_by_module():
    eager, lowered = build()
    twin = pickle.loads(pickle.dumps(lowered))
    forward_calls = count_module_code(twin)
    assert_same_as_eager(eager, twin)
    assert forward_calls


def test_symbolic_trace_still_sees_submodules():
    _, lowered = build()
    traced = torch.fx.symbolic_trace(lowered)
    torch.testing.assert_close(traced(x()), build()[1](x()))


def test_epoch_moves_on_tree_changes_only():
    _, lowered = build()
    before = tree_watch.epoch()
    lowered(x())
    lowered.blocks[0].count = torch.ones(4)  # a buffer write needs no re-check
    lowered.train(False)
    assert tree_watch.epoch() == before
    lowered.blocks[0].register_forward_pre_hook(lambda mod, args: None)
    assert tree_watch.epoch() == before + 1


def test_root_fx_graph_is_built_only_when_read():
    eager, lowered = build()
    assert lowered.__dict__["_fx_graph"] is None  # lower did not build it
    assert_same_as_eager(eager, lowered)  # calls run direct code without it
    assert lowered.__dict__["_fx_graph"] is None
    graph = lowered.graph
    assert lowered.graph is graph and graph.owning_module is lowered
    assert [n.name for n in lowered.input_placeholders] == ["x"]
    assert [n.op for n in graph.nodes].count("placeholder") == 1  # state became get_attr


def test_copies_made_before_the_graph_is_read_build_their_own():
    eager, lowered = build()
    eager_twin = copy.deepcopy(eager)
    twin = copy.deepcopy(lowered)
    assert lowered.__dict__["_fx_graph"] is None and twin.__dict__["_fx_graph"] is None
    unpickled = pickle.loads(pickle.dumps(lowered))  # pickling encodes the graph: builds it
    assert twin.graph is not lowered.graph and twin.graph.owning_module is twin
    assert unpickled.graph.owning_module is unpickled
    assert_same_as_eager(eager, twin)
    assert_same_as_eager(eager_twin, unpickled)


def test_assigned_root_graph_is_run():
    eager, lowered = build()
    graph = copy.deepcopy(lowered.graph)
    output = graph.output_node()
    (result,) = output.args[0]
    with graph.inserting_before(output):
        doubled = graph.call_function(torch.ops.aten.mul.Tensor, (result, 2.0))
    output.args = ((doubled,),)
    lowered.graph = graph
    assert lowered.graph is graph and graph.owning_module is lowered
    for _ in range(2):
        torch.testing.assert_close(lowered(x()), 2 * eager(x()))


class _TimesInt(nn.Module):
    def forward(self, x):
        return x * 2


class _TimesFloat(nn.Module):
    def forward(self, x):
        return x * 2.0


class _IntAndFloat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _TimesInt()
        self.b = _TimesFloat()

    def forward(self, x):
        return self.a(x), self.b(x)


def test_literals_equal_in_python_but_of_other_types_share_no_code():
    # ``2 == 2.0``: modules that differ only there must not share code (or an alpha key),
    # neither within one program nor across two lowerings
    x = torch.tensor([3])
    ep = torch.export.export(_IntAndFloat(), (x,))
    outs = lower(transform(import_ep(ep)))(x)
    assert [o.dtype for o in outs] == [torch.int64, torch.float32]
    for model in (_TimesInt(), _TimesFloat()):
        ep = torch.export.export(model, (x,))
        assert lower(transform(import_ep(ep)))(x).dtype == model(x).dtype
