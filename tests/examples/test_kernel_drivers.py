"""``cse``, ``fold_constants``, ``eliminate_dead_code`` and ``fold_into_state`` are drivers on
the rewriting kernel (``transforms.kernel``): a listener given to the pass hears each node the
kernel makes, replaces and erases for it, the output specs follow the kernel's finalisation
(``finalised``), and the streamed ``WorkingGraph`` (``rewired`` / ``keep`` / ``replace`` /
``drop`` / ``state_read`` / ``finish``) does what the drivers rely on."""

from __future__ import annotations

import torch
from beforeafter import program

from ir import format_program, parse_program, verify
from ir import state as st
from transforms import cse, eliminate_dead_code, fold_constants
from transforms import kernel as kn
from transforms.new_state import NewState

aten = torch.ops.aten


class Heard:
    """A ``kernel.Listener`` that writes down what it hears."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def emitted(self, node):
        self.events.append(("emitted", node.name, node.op))

    def erased(self, name):
        self.events.append(("erased", name))

    def replaced(self, old, new):
        self.events.append(("replaced", old, new))


CSE_BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg_1: user_output
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %neg_1 = call_function[aten.neg.default](%x)
      %add = call_function[aten.add.Tensor](%neg, %neg_1)
      return (%neg_1, %add)"""

CSE_EXPECTED = """\
program:
  inputs:
    %x: user_input
  outputs:
    %neg: user_output
    %add: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %add = call_function[aten.add.Tensor](%neg, %neg)
      return (%neg, %add)"""


def test_cse_merges_through_the_kernel_and_its_output_spec_follows():
    heard = Heard()
    q = cse(program(CSE_BEFORE), listener=heard)
    assert format_program(q) == format_program(program(CSE_EXPECTED))
    assert heard.events == [("replaced", "neg_1", "neg"), ("erased", "neg_1")]
    verify(q)


def test_cse_with_nothing_to_merge_hears_nothing_and_returns_p():
    heard = Heard()
    p = program(CSE_EXPECTED)
    assert cse(p, listener=heard) is p
    assert heard.events == []


DCE_BEFORE = """\
program:
  inputs:
    %x: user_input
  outputs:
    %relu: user_output
  module <root>: Top
    graph 0:
      %x = placeholder
      %neg = call_function[aten.neg.default](%x)
      %abs = call_function[aten.abs.default](%neg)
      %check = call_function[aten._assert_tensor_metadata.default](%x, None, None, torch.float32)
      %relu = call_function[aten.relu.default](%x)
      return (%relu,)"""


def test_eliminate_dead_code_drops_through_the_kernel():
    heard = Heard()
    q = eliminate_dead_code(program(DCE_BEFORE), listener=heard)
    assert [n.name for n in q.root_module.graph.nodes] == ["x", "check", "relu", "output"]
    assert heard.events == [("erased", "neg"), ("erased", "abs")]  # in graph order
    heard = Heard()
    q = eliminate_dead_code(program(DCE_BEFORE), metadata_checks=False, listener=heard)
    assert [n.name for n in q.root_module.graph.nodes] == ["x", "relu", "output"]
    assert heard.events == [("erased", "check"), ("erased", "neg"), ("erased", "abs")]


FOLD_BEFORE = """\
program:
  inputs:
    %c_k: constant_tensor k
    %x: user_input
  outputs:
    %add: user_output
  state:
    k: constant <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %c_k = placeholder
      %x = placeholder
      %ones = call_function[aten.ones.default]([2])
      %mul = call_function[aten.mul.Tensor](%ones, %c_k)
      %add = call_function[aten.add.Tensor](%x, %mul)
      return (%add,)"""

FOLD_EXPECTED = """\
program:
  inputs:
    %c_k: constant_tensor k
    %x: user_input
  outputs:
    %add: user_output
  state:
    k: constant <Tensor (2,) torch.float32>
    _folded_mul: constant <Tensor (2,) torch.float32>
  module <root>: Top
    graph 0:
      %c_k = placeholder
      %x = placeholder
      %_folded_mul = get_attr[_folded_mul]()
      %add = call_function[aten.add.Tensor](%x, %_folded_mul)
      return (%add,)"""


def test_fold_constants_makes_its_constant_reads_and_replacements_through_the_kernel():
    p = program(FOLD_BEFORE)
    heard = Heard()
    q = fold_constants(p, listener=heard)
    assert format_program(q) == format_program(program(FOLD_EXPECTED, like=q))
    # the kernel dropped what only the folded value read, made the node that reads the new
    # constant after its naming policy (a get_attr: this root has no call signature that
    # binds placeholders to state), and moved the folded node's readers to it
    assert heard.events == [
        ("erased", "ones"),
        ("emitted", "_folded_mul", "get_attr"),
        ("replaced", "mul", "_folded_mul"),
        ("erased", "mul"),
    ]
    k = p.tensor("k")
    torch.testing.assert_close(q.tensor("_folded_mul"), torch.ones(2) * k)
    verify(q)


# --- the streamed working graph and the finalisation ---------------------------------------------


def test_streamed_working_graph_rewires_replaces_drops_and_finishes():
    p = program(CSE_BEFORE)
    graph = p.root_module.graph
    w = kn.WorkingGraph(graph, indexed=False)
    assert w.rewired(graph.node("add")) is graph.node("add")  # nothing replaced yet
    for n in graph.nodes:
        if n.name == "neg_1":
            w.replace("neg_1", graph.node("neg").ref)
        else:
            w.keep(n)
    out, renames = w.finish()
    assert renames == {"neg_1": "neg"}
    assert [str(a) for a in out.node("add").args] == ["%neg", "%neg"]
    # nothing changed: the input graph itself
    w = kn.WorkingGraph(graph, indexed=False)
    for n in graph.nodes:
        w.keep(n)
    assert w.finish() == (graph, {})


def test_state_read_names_and_places_a_new_root_input_and_finalised_applies_it():
    p = program(CSE_BEFORE)
    graph = p.root_module.graph
    new = NewState(p)
    heard = Heard()
    w = kn.WorkingGraph(graph, indexed=False, listener=heard)
    for n in graph.nodes:
        if n.name == "neg":
            read, fqn = w.state_read(new, st.CONSTANT, "neg", torch.zeros(2), mid=p.root,
                                     anchor=n, root=True)
            w.add(read)
            w.replace("neg", read.ref)
        else:
            w.keep(n)
    out, renames = w.finish()
    assert (read.name, fqn) == ("c_neg", "neg")
    assert [n.name for n in out.nodes] == ["c_neg", "x", "neg_1", "add", "output"]
    assert heard.events == [("emitted", "c_neg", "placeholder"), ("replaced", "neg", "c_neg"),
                            ("erased", "neg")]
    q = p.replace(modules=p.modules.set(p.root, p.root_module.replace(graphs=(out,))))
    r = kn.finalised(p, q, {p.root: renames}, new)
    assert [(s.kind, s.name, s.target) for s in r.signature.inputs] == [
        ("constant_tensor", "c_neg", "neg"), ("user_input", "x", None)]
    assert r.state["neg"].kind == st.CONSTANT
    assert kn.finalised(p, p, {}) is p and kn.finalised(p, p, {}, NewState(p)) is p


HALF = """\
program:
  inputs:
    %x: user_input
  outputs:
    %mul: user_output
  module <root>: Top
    graph 0:
      %x = placeholder  # float32[3]
      %relu = call_function[aten.relu.default](%x)  # float32[3]
      %mul = call_function[aten.mul.Tensor](%relu, 1.0)  # float32[3]
      return (%mul,)"""


def test_apply_match_renames_the_output_spec_through_the_finalisation():
    from transforms.rewrite import Rule, apply_match, apply_rules, matches

    p = parse_program(HALF)
    rule = Rule(lambda a: a * 1.0, lambda a: a, (torch.randn(3),), name="mul_one",
                max_examples=5)
    q = apply_match(p, matches(p, rule)[0])  # raised AttributeError before
    assert [s.name for s in q.signature.outputs] == ["relu"]
    assert format_program(q) == format_program(apply_rules(p, [rule])[0])
    verify(q)
