"""Laws of ``fill_call_gaps`` on generated programs (``transforms.stacks``).

- a generated program's calls are whole, so it is returned as it is (``is``);
- a node inside a call whose stack lost its innermost entry (as strict export and
  ``run_decompositions`` lose it for a higher-order op and its inlined body) gets that call's
  stack back, and ``outline`` makes of it what it makes of the program before the loss.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lawcases import before, examples

from ir import alpha_equivalent
from ir.errors import PassError
from transforms.machinery.frames import node_frames
from transforms.passes.module_stacks import _truncated_stack, fill_call_gaps
from transforms.passes.outline import outline


def _frames(node):
    if node.op in ("placeholder", "output") or not node.meta.get("nn_module_stack"):
        return None
    return node_frames(node)


def _inside_a_call(nodes) -> list[int]:
    """Positions of nodes in a call whose neighbours run in that same call."""
    found = []
    for i in range(1, len(nodes) - 1):
        mine = _frames(nodes[i])
        if mine and _frames(nodes[i - 1]) == mine and _frames(nodes[i + 1]) == mine:
            found.append(i)
    return found


@settings(max_examples=examples(100), deadline=None)
@given(before(fill_call_gaps), st.data())
def test_a_node_that_lost_its_call_gets_it_back(p, data):
    assert fill_call_gaps(p) is p
    nodes = p.root_module.graph.nodes
    inside = _inside_a_call(nodes)
    if not inside:
        return
    i = data.draw(st.sampled_from(inside), label="node")
    frames = _frames(nodes[i])
    lost = _truncated_stack(nodes[i].meta["nn_module_stack"], len(frames) - 1)
    graph = p.root_module.graph
    changed = list(graph.nodes)
    changed[i] = nodes[i].with_meta(nn_module_stack=lost)
    root = p.root_module.replace(graphs=(graph.of(changed),) + p.root_module.graphs[1:])
    q = p.replace(modules=p.modules.set(p.root, root))
    filled = fill_call_gaps(q)
    assert _frames(filled.root_module.graph.nodes[i]) == frames
    assert filled == q  # meta only
    assert fill_call_gaps(filled) is filled
    try:
        expected = outline(p)
    except PassError:  # a program outline refuses (state carried across a call after a write)
        with pytest.raises(PassError):
            outline(q)
        return
    assert alpha_equivalent(outline(q), expected)
