"""The root's call path (``lowering/call_path.py``): what it accepts, what it hands on.

Valid calls run the generated code (``root._call_path`` returns the output, not ``MISS``); every
bad call is handed to the general path, which raises the same ``InputError`` text as before the
call path existed (the texts below were captured from the code before it). Hooks, swaps,
copies and pickles behave as with the general path.
"""

from __future__ import annotations

import copy
import linecache
import pickle
import re

import pytest
import torch
from torch import nn

from ir import InputConstraintError, InputError, import_ep
from lowering import lower
from lowering.call_path import MISS, call_path, output_builder
from transforms import transform


class DictModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, batch: dict, *, scale: torch.Tensor) -> dict:
        return {"out": self.fc(batch["x"]) * scale + batch["y"]}


def _inputs(n: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)


@pytest.fixture(scope="module")
def built() -> tuple[nn.Module, nn.Module, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    model = DictModel().eval()
    x, y, s = _inputs()
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(
        model,
        ({"x": x, "y": y},),
        {"scale": s},
        dynamic_shapes={"batch": {"x": {0: batch}, "y": {0: batch}}, "scale": {0: batch}},
        strict=False,
    )
    return model, lower(transform(import_ep(ep))), ep


def _symbol(ep: torch.export.ExportedProgram) -> str:
    x = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name.endswith("x"))
    return str(x.meta["val"].shape[0])


def test_valid_calls_run_the_call_path(built) -> None:
    model, m, _ = built
    x, y, s = _inputs(5, seed=1)
    want = model({"x": x, "y": y}, scale=s)
    for args, kwargs in [
        (({"x": x, "y": y},), {"scale": s}),
        (({"y": y, "x": x},), {"scale": s}),  # the dict in another key order
    ]:
        got = m._call_path(m, args, kwargs)
        assert got is not MISS
        assert list(got) == ["out"]
        torch.testing.assert_close(got["out"], want["out"])
        torch.testing.assert_close(m(*args, **kwargs)["out"], want["out"])


# (call, error class, text before the call path; ``{s}`` is the batch symbol)
BAD_CALLS = {
    "wrong structure": (
        lambda m, x, y, s: m((x, y), scale=s),
        InputError,
        ("There is no flat args adapter specified. Are you sure you are calling this with the "
        "right arguments? Input treespec: TreeSpec(tuple, None, [TreeSpec(tuple, None, "
        "[TreeSpec(tuple, None, [*,\n      *])]),\n  TreeSpec(dict, ['scale'], [*])]). Exported "
        "module treespec: TreeSpec(tuple, None, [TreeSpec(tuple, None, [TreeSpec(dict, ['x', "
        "'y'], [*,\n      *])]),\n  TreeSpec(dict, ['scale'], [*])])"),
    ),
    "missing key": (
        lambda m, x, y, s: m({"x": x}, scale=s),
        InputError,
        ("There is no flat args adapter specified. Are you sure you are calling this with the "
        "right arguments? Input treespec: TreeSpec(tuple, None, [TreeSpec(tuple, None, "
        "[TreeSpec(dict, ['x'], [*])]),\n  TreeSpec(dict, ['scale'], [*])]). Exported module "
        "treespec: TreeSpec(tuple, None, [TreeSpec(tuple, None, [TreeSpec(dict, ['x', 'y'], "
        "[*,\n      *])]),\n  TreeSpec(dict, ['scale'], [*])])"),
    ),
    "missing keyword": (
        lambda m, x, y, s: m({"x": x, "y": y}),
        InputError,
        "forward() got missing keyword argument 'scale'; it takes the keywords ['scale'] (got [])",
    ),
    "wrong dtype": (
        lambda m, x, y, s: m({"x": x.half(), "y": y}, scale=s),
        InputConstraintError,
        ("Expected input at *args[0]['x'] to have dtype torch.float32 (exported as "
        "torch.float32), but got torch.float16"),
    ),
    "wrong rank": (
        lambda m, x, y, s: m({"x": x[None], "y": y}, scale=s),
        InputConstraintError,
        ("Unexpected number of dimensions in input at *args[0]['x'].shape (expected "
        "torch.Size([{s}, 8]), got torch.Size([1, 4, 8]))"),
    ),
    "size outside the range": (
        lambda m, x, y, s: m(
            {"x": torch.randn(65, 8), "y": torch.randn(65, 8)}, scale=torch.randn(65, 1)
        ),
        InputConstraintError,
        "Expected input at *args[0]['x'].shape[0] to be <= 64, but got 65",
    ),
    "violated dim equality": (
        lambda m, x, y, s: m({"x": x, "y": torch.randn(5, 8)}, scale=s),
        InputConstraintError,
        "Expected input at *args[0]['y'].shape[0] to be equal to 4, but got 5",
    ),
    "wrong static size": (
        lambda m, x, y, s: m({"x": torch.randn(4, 7), "y": y}, scale=s),
        InputConstraintError,
        ("Expected input at *args[0]['x'].shape[1] to be equal to 8, but got 7. If you meant for "
        "this dimension to be dynamic, please re-export and specify dynamic_shapes (e.g. with "
        "Dim.DYNAMIC)"),
    ),
    "not a tensor": (
        lambda m, x, y, s: m({"x": 3, "y": y}, scale=s),
        InputConstraintError,
        "Expected input at *args[0]['x'] to be a tensor, but got <class 'int'>",
    ),
}


def test_lower_makes_the_call_path_once_and_a_later_assignment_again(built, monkeypatch) -> None:
    import importlib

    lower_module = importlib.import_module("lowering.lower")  # (the package's lower is the function)
    root_module = importlib.import_module("lowering.root")

    _, _, ep = built
    made: list[object] = []
    real = root_module.attach_call_path

    def counted(root):
        made.append(root)
        real(root)

    monkeypatch.setattr(root_module, "attach_call_path", counted)
    monkeypatch.setattr(lower_module, "attach_call_path", counted)
    m = lower(import_ep(ep))
    assert made == [m]  # once, on the finished root (its device probe and direct code set)
    assert m._call_path is not None
    m.check_input_constraints = True  # an input of the call path assigned: made again
    assert made == [m, m]


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_calls_miss_and_raise_the_same_text(built, case: str) -> None:
    _, m, ep = built
    call, error, text = BAD_CALLS[case]
    x, y, s = _inputs()
    seen = []

    class Spy:  # records what the call path answered, then lets the call go on
        def __call__(self, root, args, kwargs):
            seen.append(fast(root, args, kwargs))
            return seen[-1]

    fast = m.__dict__["_call_path"]
    m.__dict__["_call_path"] = Spy()
    try:
        with pytest.raises(error) as info:
            call(m, x, y, s)
    finally:
        m.__dict__["_call_path"] = fast
    assert seen == [MISS]
    assert str(info.value) == text.replace("{s}", _symbol(ep))


def test_a_size_below_the_range_minimum_still_runs_as_torch_lets_it(built) -> None:
    """torch's checks let a size of 0 or 1 through below a minimum of 2; the call path too."""
    model, m, _ = built
    x, y, s = _inputs(1)
    assert m._call_path(m, ({"x": x, "y": y},), {"scale": s}) is not MISS
    torch.testing.assert_close(m({"x": x, "y": y}, scale=s)["out"], model({"x": x, "y": y}, scale=s)["out"])


def test_unchecked_calls_take_the_general_path(built) -> None:
    _, m, _ = built
    m = copy.deepcopy(m)
    m.check_input_constraints = False
    assert "_call_path" not in m.__dict__
    x, y, s = _inputs(65)  # outside the range: unchecked, it runs
    assert m({"x": x, "y": y}, scale=s)["out"].shape == (65, 8)
    m.check_input_constraints = True
    assert "_call_path" in m.__dict__


def test_hooks_and_swaps_still_run(built) -> None:
    _model, m, _ = built
    m = copy.deepcopy(m)
    x, y, s = _inputs()
    seen = []
    handle = m.fc.register_forward_hook(lambda mod, a, out: seen.append("fc"))
    m({"x": x, "y": y}, scale=s)
    handle.remove()
    assert seen == ["fc"]
    pre = m.register_forward_pre_hook(lambda mod, a: seen.append("root pre"))
    post = m.register_forward_hook(lambda mod, a, out: seen.append("root"))
    m({"x": x, "y": y}, scale=s)
    pre.remove()
    post.remove()
    assert seen == ["fc", "root pre", "root"]
    glob = torch.nn.modules.module.register_module_forward_hook(lambda mod, a, out: seen.append(type(mod).__name__))
    try:
        m({"x": x, "y": y}, scale=s)
    finally:
        glob.remove()
    assert seen[3:] == ["LoweredModule", "LoweredRoot"]  # global hooks: every module, the root last
    m.fc = nn.Identity()
    got = m({"x": x, "y": y}, scale=s)["out"]
    torch.testing.assert_close(got, x * s + y)


def test_copies_and_pickles_keep_a_working_call_path(built) -> None:
    model, m, _ = built
    x, y, s = _inputs(3)
    want = model({"x": x, "y": y}, scale=s)["out"]
    for twin in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert twin._call_path(twin, ({"x": x, "y": y},), {"scale": s}) is not MISS
        torch.testing.assert_close(twin({"x": x, "y": y}, scale=s)["out"], want)


def test_print_readable_shows_the_call_path(built) -> None:
    _, m, _ = built
    text = m.print_readable(print_output=False)
    assert "def call_path(self, args, kwargs):" in text
    assert "return MISS" in text


def test_generated_source_for_one_tensor() -> None:
    """Before/Expected on the generated text: one static tensor input, one output."""
    from lowering.constraints import InputCheck

    spec = torch.utils._pytree.tree_structure(((torch.zeros(1),), {}))
    out = torch.utils._pytree.tree_structure((torch.zeros(1),))
    fn = call_path(spec, out, (InputCheck(True, (2, 3), dtype=torch.float32),), {}, None)
    body = re.sub(r"_c\d+", "_c", fn.source.split("try:\n")[1].split("    except")[0])
    assert body == (
        "        i0 = args[0]\n"
        "        if type(i0) is not _Tensor or i0.dtype is not _c or i0.is_meta:\n"
        "            return MISS\n"
        "        if i0.shape != _c:\n"
        "            return MISS\n"
    )
    assert fn.__code__.co_filename in linecache.cache


def test_output_builder_matches_tree_unflatten() -> None:
    tree = {"a": (1, [2, 3]), "b": None, "c": 4}
    leaves, spec = torch.utils._pytree.tree_flatten(tree)
    build = output_builder(spec)
    assert build(leaves) == torch.utils._pytree.tree_unflatten(leaves, spec) == tree
    with pytest.raises(ValueError):
        build(leaves[:-1])


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, gain: torch.Tensor) -> tuple:
        return torch.relu(self.fc(x)) * gain, x


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.inner(x, gain=x.sum())
        return a + b


def test_preserved_call_plumbing_is_spelled_inline() -> None:
    """The direct code of a preserved call and of its caller has no pytree call left."""
    torch.manual_seed(0)
    model = Outer().eval()
    x = torch.randn(4, 8)
    ep = torch.export.export(model, (x,), preserve_module_call_signature=("inner",), strict=False)
    m = lower(transform(import_ep(ep)))
    scope = {**m._direct.__globals__, **m.inner._direct[0].__globals__}
    assert not any(
        getattr(v, "__name__", "") in ("flatten_by_spec", "unflatten_tree") for v in scope.values()
    )
    torch.testing.assert_close(m(x), model(x))

    class Swapped(nn.Module):
        def forward(self, x: torch.Tensor, *, gain: torch.Tensor) -> tuple:
            return x * 2, x

    m.inner = Swapped()
    torch.testing.assert_close(m(x), x * 3)


def test_interpreter_roots_take_the_call_path_too(built) -> None:
    model, _, ep = built
    m = lower(transform(import_ep(ep)), interpreter=True)
    x, y, s = _inputs(6)
    got = m._call_path(m, ({"x": x, "y": y},), {"scale": s})
    assert got is not MISS
    torch.testing.assert_close(got["out"], model({"x": x, "y": y}, scale=s)["out"])
    with pytest.raises(InputConstraintError, match=r"\['y'\]\.shape\[0\] to be equal to 6"):
        m({"x": x, "y": torch.randn(5, 8)}, scale=s)
