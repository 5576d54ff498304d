"""Generated code only from validated identifiers: a crafted program never runs code by lowering.

Each hostile program carries a payload that would create a marker file if any string of it were
pasted into generated Python source. Lowering must raise a purefx error naming the node (or,
for odd but harmless names, work), and the marker must never appear — neither at lowering nor
at a call, in generated-code or interpreter mode.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
from pyrsistent import pmap

from ir import Graph, Module, Node, Program, ref
from ir.args import IDict
from ir.errors import LoweringError
from ir.signature import USER_INPUT, USER_OUTPUT, ExportSignature, InputSpec, OutputSpec
from lowering import lower
from lowering.identifiers import check_graph, is_path_step
from lowering.modules import LoweredModule, signature_class


def _program(nodes, children=(), extra=None) -> Program:
    modules = {"": Module(type_name="M", children=children, graphs=(Graph(tuple(nodes)),))}
    modules.update(extra or {})
    return Program(
        root="",
        modules=pmap(modules),
        signature=ExportSignature((InputSpec(USER_INPUT, "x"),), (OutputSpec(USER_OUTPUT, "y"),)),
    )


def _payload(marker: Path) -> str:
    assert "." not in str(marker)  # module names may not contain dots: keep the payload dot-free
    return f"getattr(__import__('os'), 'system')('touch {marker}')"


def _x(name: str = "x") -> Node:
    return Node("placeholder", name, name)


def _out(name: str = "y") -> Node:
    return Node("output", "output", "output", ((ref(name),),))


def _hostile_programs(marker: Path) -> dict[str, Program]:
    run = _payload(marker)
    relu = torch.ops.aten.relu.default
    add = torch.ops.aten.add.Tensor
    sub = Module(
        type_name="Sub",
        graphs=(Graph((_x("a"), Node("call_function", "b", relu, (ref("a"),)), _out("b"))),),
    )
    quote_child = f'a"); {run}; ("'
    return {
        "method": _program(
            [_x(), Node("call_method", "y", f"__class__; {run}  #", (ref("x"),)), _out()]
        ),
        "method_with_quote": _program(
            [_x(), Node("call_method", "y", f'relu(); {run}; x.relu', (ref("x"),)), _out()]
        ),
        "dotted_method": _program(
            [_x(), Node("call_method", "y", f'a"), {run}, getattr(x, "b', (ref("x"),)), _out()]
        ),
        "node_name": _program(
            [_x(), Node("call_function", f"v = 0; {run}; z", relu, (ref("x"),)),
             Node("call_function", "y", relu, (ref(f"v = 0; {run}; z"),)), _out()]
        ),
        "placeholder_target": _program(
            [Node("placeholder", "x", f"x):\n    {run}\ndef f(x"),
             Node("call_function", "y", relu, (ref("x"),)), _out()]
        ),
        "placeholder_name": _program(
            [_x(), Node("call_module", "y", "sub", (ref("x"),)), _out()],
            children=(("sub", "sub"),),
            extra={
                "sub": Module(
                    type_name="Sub",
                    graphs=(Graph((
                        Node("placeholder", f"a, {run}", "a"),
                        Node("call_function", "b", relu, (ref(f"a, {run}"),)),
                        _out("b"),
                    )),),
                )
            },
        ),
        "keyword_name": _program(
            [_x(), Node("call_function", "y", add, (ref("x"), ref("x")),
                        IDict(((f"alpha={run}, other", 1),))), _out()]
        ),
        "module_path_quote": _program(
            [_x(), Node("call_module", "y", quote_child, (ref("x"),)), _out()],
            children=((quote_child, "sub"),),
            extra={"sub": sub},
        ),
        "module_path_newline": _program(
            [_x(), Node("call_module", "y", f"s\n{run}", (ref("x"),)), _out()],
            children=((f"s\n{run}", "sub"),),
            extra={"sub": sub},
        ),
        "child_graph": _program(
            [_x(), Node("call_module", "y", "sub", (ref("x"),)), _out()],
            children=(("sub", "sub"),),
            extra={
                "sub": Module(
                    type_name="Sub",
                    graphs=(Graph((
                        _x("a"), Node("call_method", "b", f"relu(); {run}  #", (ref("a"),)),
                        _out("b"),
                    )),),
                )
            },
        ),
    }


# Node names and placeholder targets are never spelled as given: these lower and run.
ESCAPED = ("node_name", "placeholder_name", "placeholder_target")
REFUSED = sorted(set(_hostile_programs(Path("/nonexistent"))) - set(ESCAPED))
MODES = pytest.mark.parametrize("interpreter", [False, True], ids=["codegen", "interpreter"])


@MODES
@pytest.mark.parametrize("name", REFUSED)
def test_hostile_strings_raise_and_run_nothing(name: str, interpreter: bool, tmp_path: Path):
    marker = tmp_path / "marker"
    program = _hostile_programs(marker)[name]
    with pytest.raises(LoweringError, match="cannot spell safely"):
        m = lower(program, interpreter=interpreter)
        m(torch.ones(2))  # not reached; if it were, it must not run the payload either
    assert not marker.exists()


@MODES
@pytest.mark.parametrize("name", ESCAPED)
def test_hostile_names_are_escaped_and_run_nothing(name: str, interpreter: bool, tmp_path: Path):
    marker = tmp_path / "marker"
    m = lower(_hostile_programs(marker)[name], interpreter=interpreter)
    x = torch.tensor([-1.0, 2.0])
    out = pytree.tree_leaves(m(x))[0]
    expected = torch.relu(torch.relu(x)) if name == "node_name" else torch.relu(x)
    assert torch.equal(out, expected)
    twin = pickle.loads(pickle.dumps(m))  # runs the fx code of every module
    assert torch.equal(pytree.tree_leaves(twin(x))[0], expected)
    assert not marker.exists()


def test_lowering_error_names_the_node(tmp_path: Path):
    program = _hostile_programs(tmp_path / "marker")["method"]
    with pytest.raises(LoweringError, match=r"node 'y' \(call_method\).*method name"):
        lower(program)


def test_odd_but_harmless_module_names_work():
    relu = torch.ops.aten.relu.default
    sub = Module(
        type_name="Sub",
        graphs=(Graph((_x("a"), Node("call_function", "b", relu, (ref("a"),)), _out("b"))),),
    )
    for child in ("my-block", "0", "a b"):
        program = _program(
            [_x(), Node("call_module", "y", child, (ref("x"),)), _out()],
            children=((child, "sub"),),
            extra={"sub": sub},
        )
        for interpreter in (False, True):
            m = lower(program, interpreter=interpreter)
            x = torch.tensor([-1.0, 2.0])
            out = m(x)
            assert torch.equal(pytree.tree_leaves(out)[0], torch.relu(x)), out
            assert isinstance(getattr(m, child), LoweredModule)
            assert child in m.graph.python_code("self").src


def test_check_graph_on_attribute_paths():
    good = Graph((Node("get_attr", "w", "layers.0.weight"), _out("w")))
    check_graph(good, "test")
    bad = Graph((Node("get_attr", "w", 'layers.0"); x = ("'), _out("w")))
    with pytest.raises(LoweringError, match="attribute path"):
        check_graph(bad, "test")
    assert is_path_step("my-layer") and is_path_step("0")
    assert not any(map(is_path_step, ["", "a'b", 'a"b', "a\\b", "a\nb", None, 3]))


def test_repeated_keywords_raise():
    node = Node("call_function", "y", torch.ops.aten.add.Tensor, (ref("x"), ref("x")),
                IDict((("alpha", 1), ("alpha", 2))))
    with pytest.raises(LoweringError, match="repeated keyword"):
        check_graph(Graph((_x(), node, _out())), "test")


def test_signature_class_refuses_names_that_are_not_identifiers():
    with pytest.raises(LoweringError, match="not distinct Python names"):
        signature_class(LoweredModule, ("x", "y): pass\nimport os\ndef f(z"))
    with pytest.raises(LoweringError):
        signature_class(LoweredModule, ("x", "x"))
