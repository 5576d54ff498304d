"""``ir.parse_program``: the inverse of ``ir.format_program`` (``ir/parser.py``).

Laws: ``parse_program(format_program(p), like=p) == p`` on generated programs and on every zoo
case (after ``import_ep`` and after the default pipeline); ``format_program`` of a parse without
``like`` gives the same text (placeholder tensors print as the originals). Bad text raises
``ParseError`` naming the line.
"""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings

from ir import (
    Graph,
    Node,
    ParseError,
    PurefxError,
    alpha_equivalent,
    format_program,
    import_ep,
    parse_program,
    verify,
)
from ir.printer import format_val
from ir.strategies import programs
from transforms import transform

try:
    from .zoo import CASES, export_case
except ImportError:  # tests/ is not a package
    from zoo import CASES, export_case


@settings(max_examples=60)
@given(programs())
def test_parse_inverts_format_on_generated_programs(p):
    text = format_program(p, vals=False)
    back = parse_program(text, like=p)
    assert back == p
    verify(back)
    placeholders = parse_program(text)  # fresh zero tensors of the printed shapes and dtypes
    # the symbolic sizes' range constraints print as symbols and ranges, and read back
    assert format_program(placeholders, vals=False) == text
    assert placeholders.tensors != p.tensors or not p.tensors  # tensors compare by identity


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_inverts_format_on_the_zoo(name, caplog):
    caplog.set_level(logging.ERROR)
    imported = import_ep(export_case(CASES[name]))
    for p in (imported, transform(imported)):
        assert parse_program(format_program(p, vals=False), like=p) == p


SMALL = """\
program:
  inputs:
    %p_w: parameter w
    %b_n: buffer n persistent=False
    %x: user_input
  outputs:
    %out: user_output
    <literal>: user_output
  state:
    w: parameter <Parameter (2, 2) torch.float32> requires_grad
    n: buffer <Tensor (2,) torch.int64> non-persistent
    v: parameter <Parameter (2, 2) torch.float32> = w requires_grad
  preserved calls:
    '':
      inputs: (%x, constant(name='', value=2))
      outputs: (%out,)
      in_spec: tree(tuple, [tree(tuple, [leaf]), tree(dict, [], [])])
      out_spec: tree(tuple, [leaf, leaf])
      forward_arg_names: ('x',)
  call order: ('', 'lin')
  module <root>: ? [module] id='r'
    graph 0:
      %p_w = placeholder
      %b_n = placeholder
      %x = placeholder
      %t = call_function[aten.t.default](%p_w)
      %mm = call_function[aten.mm.default](%x, %t)
      %s = call_function[aten.sum.dim_IntList](%mm, [-1], keepdim=True, dtype=torch.float32)
      %sl = call_function[aten.slice.Tensor](%s, 0, 0, 9223372036854775807)
      %f = call_function[aten.full.default]([2], -inf, device=device(type='cpu'), pin_memory=False)
      %g = call_function[_operator.getitem](%f, slice(None, 1, None))
      %out = call_module[lin](%sl, {'k': (%g,), 'n': None, 'p': '%not_a_ref'})
      return (%out, None)
  module lin: torch.nn.modules.linear.Linear [module] id='l'
    graph 0:
      %a = placeholder
      %b = placeholder
      %c = call_method[relu](%a)
      return[output_1] %c
  module alias: same object as lin"""


def test_a_hand_written_program_reads_as_written():
    p = parse_program(SMALL)
    assert format_program(p, vals=False) == SMALL
    root = p.modules["r"]
    assert root.children == (("lin", "l"), ("alias", "l"))
    assert p.state["v"].tensor == "w" and p.tensor("v") is p.tensor("w")
    w = p.tensor("w")
    assert isinstance(w, torch.nn.Parameter) and w.requires_grad and w.shape == (2, 2)
    assert p.tensor("n").dtype == torch.int64 and not p.state["n"].persistent
    nodes = root.graph.by_name()
    assert nodes["t"].target is torch.ops.aten.t.default
    assert nodes["s"].kwargs.get("dtype") is torch.float32
    assert nodes["f"].args[1] == float("-inf")
    assert nodes["out"].args[1].get("p") == "%not_a_ref"  # a '%' inside a string is text
    assert p.modules["l"].graph.output_node.name == "output_1"
    assert p.call_signatures[""].inputs[1].name == "" and p.call_signatures[""].inputs[1].value == 2
    assert p.call_order == ("", "lin")


def test_ids_and_kinds_may_be_left_out_by_hand():
    short = parse_program(
        "program:\n  module <root>: Top\n    graph 0:\n      %x = placeholder\n      return %x"
    )
    assert short.root == "<root>" and short.root_module.kind == "module"
    assert short.root_module.type_name == "Top"
    full = parse_program(
        "program:\n  module <root>: Top [module] id='m7'\n    graph 0:\n"
        "      %y = placeholder\n      return %y"
    )
    assert alpha_equivalent(short, full) and short != full


def test_a_node_that_differs_from_the_short_forms_prints_in_full():
    p = parse_program(SMALL)
    graph = p.modules["l"].graph
    odd = graph.nodes[0].replace(target="other", args=(1,))
    lin = p.modules["l"].replace(graphs=(Graph.of((odd, *graph.nodes[1:])),))
    q = p.replace(modules=p.modules.set("l", lin))
    text = format_program(q, vals=False)
    assert "%a = placeholder[other](1)" in text
    assert parse_program(text, like=q) == q


def test_a_custom_object_needs_like():
    p = parse_program(SMALL)
    obj = p.tensors["w"].__class__(object())
    q = p.replace(tensors=p.tensors.set("w", obj))
    text = format_program(q, vals=False)
    with pytest.raises(ParseError, match="line 10.*cannot be rebuilt from text.*like="):
        parse_program(text)
    assert parse_program(text, like=q) == q


ROOT = "program:\n  module <root>: T\n"
NODE = ROOT + "    graph 0:\n      "


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "starts with 'program:'"),
        ("prog:", "starts with 'program:'"),
        ("program:\n  inputs:\n    x user_input", "line 3: an input reads"),
        ("program:\n  widgets:", "line 2: expected a section"),
        ("program:\n  state:\n    w: parameter <Tensor (2,) torch.nonsense>", "torch.nonsense"),
        ("program:\n  state:\n    w: parameter tensor", "line 3: a state line reads"),
        ("program:\n  inputs:", "no 'module <root>"),
        ("program:\n  module a: T", "line 2: the first module is the root"),
        (ROOT + "    graph 1:", "line 3: expected 'graph 0:'"),
        (NODE + "%y = call_function[aten.nope.default]()", "line 4: cannot resolve 'aten.nope"),
        (NODE + "%y = call_function[aten.relu.default](%x", "line 4: a node reads"),
        (NODE + "%y = call_function[aten.relu.default](x + 1)", "line 4: 'x \\+ 1' is not an"),
        (NODE + "%y = call_function[aten.relu.default](os.system('x'))", "os.system\\(...\\)"),
        (NODE + "y = placeholder", "line 4: a node reads"),
        (ROOT + "  module <root>: T", "line 3: module path '<root>' is printed twice"),
        (ROOT + "  module a: same object as b", "line 3: 'same object as' names 'b'"),
        (ROOT + "      %x = placeholder", "line 3: expected 4 spaces"),
        ("program:\n  call order: 3", "line 2: the call order is a tuple"),
    ],
)
def test_bad_text_raises_a_parse_error_naming_the_line(text, message):
    with pytest.raises(ParseError, match=message) as info:
        parse_program(text)
    assert isinstance(info.value, PurefxError)


def test_like_must_hold_the_printed_tensors():
    p = parse_program(SMALL)
    other = parse_program(SMALL.replace("(2, 2) torch.float32", "(3, 3) torch.float32"))
    with pytest.raises(ParseError, match="line 10: like's tensor 'w' is <Parameter \\(3, 3\\)"):
        parse_program(SMALL, like=other)
    empty = p.replace(tensors=p.tensors.discard("w"))
    with pytest.raises(ParseError, match="tensor 'w' is not in like's tensor table"):
        parse_program(SMALL, like=empty)


def test_meta_is_not_part_of_the_text():
    p = parse_program(SMALL)
    node = p.modules["l"].graph.nodes[2]
    assert isinstance(node, Node) and not node.meta


# --- vals: a printed program that runs again ---------------------------------------------------


@settings(max_examples=25)
@given(programs())
def test_printed_vals_parse_back_into_a_program_the_laws_run(p):
    from lowering.pass_laws import check_program

    text = format_program(p, vals=True)
    back = parse_program(text, like=p)  # tensors (an opset constant: lu pivots) from p
    assert format_program(back, vals=True) == text
    for (_, mid), (_, back_mid) in zip(p.walk(), back.walk()):
        for g, h in zip(p.module_table()[mid].graphs, back.module_table()[back_mid].graphs):
            for n, m in zip(g.nodes, h.nodes):
                # a val format_val cannot write (an unbacked size: no hint) is not printed, so
                # it parses back as None (format_val's contract)
                want = n.meta.get("val") if format_val(n.meta.get("val")) is not None else None
                assert _val_key(want) == _val_key(m.meta.get("val")), n.name
    check_program(lambda q: q, back)  # was: "placeholder 'x0' has meta['val'] None"


def _val_key(val):
    if isinstance(val, torch.Tensor):
        return (val.dtype, tuple(val.shape), tuple(val.stride()), val.device.type)
    if isinstance(val, (tuple, list)):
        return type(val), tuple(_val_key(v) for v in val)
    return val


def test_vals_keep_strides_devices_tuples_and_scalars():
    text = SMALL_VALS
    p = parse_program(text)
    nodes = p.root_module.graph.by_name()
    x, t, s = nodes["x"].meta["val"], nodes["t"].meta["val"], nodes["s"].meta["val"]
    assert (x.shape, x.dtype, x.device.type) == ((2, 3), torch.float32, "cpu")
    assert t.stride() == (1, 3) and t.shape == (3, 2)
    assert s[0].dtype == torch.float32 and s[1].dtype == torch.int64 and s[1].stride() == (1, 3)
    assert nodes["n"].meta["val"] == 2 and nodes["m"].meta["val"].device.type == "meta"
    assert nodes["m"].meta["val"].shape == ()
    assert "val" not in nodes["u"].meta  # no comment, no val
    assert format_program(p, vals=True) == text
    without = "\n".join(line.split("  #")[0] for line in text.splitlines())
    assert format_program(p, vals=False) == without


SMALL_VALS = """\
program:
  inputs:
    %x: user_input
  outputs:
    %s: user_output
  state:
  module <root>: ? [module] id='r'
    graph 0:
      %x = placeholder  # float32[2, 3]
      %t = call_function[aten.t.default](%x)  # float32[3, 2](stride=(1, 3))
      %s = call_function[aten.sort.default](%t, 0, True)  # (float32[3, 2](stride=(1, 3)), int64[3, 2](stride=(1, 3)))
      %n = call_function[aten.sym_size.int](%x, 0)  # 2
      %m = call_function[aten.sum.default](%x)  # float32[()](device='meta')
      %u = call_function[aten.add.Tensor](%x, '# not a val')
      return %s"""


@pytest.mark.parametrize(
    "val, error",
    [
        ("float32[2](stride=(1, 1))", "does not match"),
        ("floaty[2]", "not 'DTYPE"),
        ("float32[2](layout=1)", "only stride= and device="),
        ("foo(1)", "not a val"),
    ],
)
def test_a_bad_val_is_a_parse_error_naming_the_line(val, error):
    text = f"program:\n  module <root>: ?\n    graph 0:\n      %x = placeholder  # {val}"
    with pytest.raises(ParseError, match=f"line 4: .*{error}"):
        parse_program(text)
