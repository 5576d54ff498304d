"""Planted narrow miscompiles written as ``torch.compile`` backends through ``aot_autograd``,
for the fuzzer's tests: each rewrites one aten call of the forward graph AOTAutograd hands its
compiler, under a narrow condition, as a real compiler pass would go wrong. Imports torch only,
so that a repro script run in a subprocess can use them without purefx.

Each is a callable ``compile(module) -> callable``: ``torch.compile(module, backend=...)``.
"""

import torch
from torch._dynamo.backends.common import aot_autograd

aten = torch.ops.aten


def _rewriting(rule):
    """A backend whose forward compiler applies ``rule(node)`` to every call node of the graph
    (the rule edits the node in place, or leaves it) and runs the graph so edited."""

    def fw_compiler(gm, example_inputs):
        for node in list(gm.graph.nodes):
            if node.op == "call_function":
                rule(node)
        gm.graph.lint()
        gm.recompile()
        return gm

    backend = aot_autograd(fw_compiler=fw_compiler)

    def compile(module):
        return torch.compile(module, backend=backend)

    compile.__name__ = rule.__name__.lstrip("_")
    return compile


def _alpha_ignored(node):
    # add(x, y, alpha=a) computes x + y
    if node.target is aten.add.Tensor and node.kwargs.get("alpha", 1) != 1:
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}


def _sub_doubled(node):
    # sub(x, y) computes x - 2 * y (an alpha of 2 where it should be 1)
    if node.target is aten.sub.Tensor and node.kwargs.get("alpha", 1) == 1:
        node.kwargs = {**node.kwargs, "alpha": 2}


def _softmax_first_dim(node):
    # softmax over dim d of a matrix (d not 0) is taken over dim 0 (same shape: silent)
    if node.target in (aten._softmax.default, aten._log_softmax.default):
        x, dim = node.args[0], node.args[1]
        val = x.meta.get("val") if hasattr(x, "meta") else None
        if val is not None and val.dim() >= 2 and dim % val.dim() != 0:
            node.args = (x, 0, *node.args[2:])


def _identity(node):
    pass


alpha_ignored = _rewriting(_alpha_ignored)
sub_doubled = _rewriting(_sub_doubled)
softmax_first_dim = _rewriting(_softmax_first_dim)
identity = _rewriting(_identity)


def eager(module):
    """A correct backend: the module itself."""
    return module
