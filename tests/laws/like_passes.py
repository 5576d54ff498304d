"""User passes written from ``docs/passes.md`` alone, each with planted bugs, and the small models
``tests/laws/test_planted_bugs_programs_like.py`` checks them on.

Every pass takes ``bug=None`` (the correct pass) or the name of one planted bug (``BUGS``): one
line differs, as a slip a researcher makes. The issue's three passes (swap activations, int8
fake quantization after every matmul, drop a ``mul`` by an all-ones buffer) come first, then
five of our own: split every linear in two (tensor parallelism's first step), fold a chain of
scalar multiplications, drop copies nothing writes, put the state operand of an ``add`` second,
freeze buffers nothing writes into constants.
"""

from __future__ import annotations

import torch

from ir import ops
from ir.args import Ref
from ir.effects import written_state
from ir.node import CALL_FUNCTION
from ir.program import Program
from transforms.edit import rewrite_nodes

aten = torch.ops.aten
MATMULS = {aten.matmul.default, aten.mm.default, aten.linear.default, aten.addmm.default}


# --- the three ---------------------------------------------------------------------------


def swap_activations(p: Program, bug: str | None = None) -> Program:
    """``relu`` -> ``gelu`` (changes numerics by design: checked against an eager reference).
    ``by_hand_forgets_outputs``: rewires the readers by hand and leaves the outputs reading
    the ``relu``."""
    if bug == "by_hand_forgets_outputs":
        return _swap_by_hand(p)

    def visit(node, e):
        if node.target == aten.relu.default:
            return e.call(aten.gelu.default, *e.args)

    return rewrite_nodes(p, visit)


def _swap_by_hand(p: Program) -> Program:
    graph = p.root_module.graph
    nodes, renamed = [], {}
    for n in graph.nodes:
        if n.op == CALL_FUNCTION and n.target == aten.relu.default:
            gelu = n.replace(name=n.name + "_gelu", target=aten.gelu.default)
            nodes += [n, gelu]
            renamed[n.name] = Ref(gelu.name)
            continue
        if n.op == CALL_FUNCTION:  # the readers are rewired; the output node is forgotten
            n = n.replace(args=tuple(renamed.get(a.name, a) if isinstance(a, Ref) else a
                                     for a in n.args))
        nodes.append(n)
    from ir.graph import Graph

    root = p.root_module.replace(graphs=(Graph(tuple(nodes)),))
    return p.replace(modules=p.modules.set(p.root, root))


def fake_quant_matmuls(p: Program, bug: str | None = None, scale: float = 0.05) -> Program:
    """int8 fake quantization (``fake_quantize_per_tensor_affine``, no Meta kernel: it runs on
    ``FakeTensor`` vals only) of every matmul's output of static sizes (on a symbolic size
    the op has no kernel to run its val with: such a matmul is left as it is)."""

    def visit(node, e):
        if node.target in MATMULS and not any(isinstance(d, torch.SymInt)
                                              for d in e.val(node.ref).shape):
            return e.call(aten.fake_quantize_per_tensor_affine.default, node.ref, scale, 0,
                          -128, 127)

    return rewrite_nodes(p, visit)


def drop_ones_masks(p: Program, bug: str | None = None) -> Program:
    """``x * mask`` -> ``x`` where ``mask`` is a buffer of ones that nothing writes (the shape
    and dtype of the product are ``x``'s). ``ignores_writes``: drops it even when the buffer
    is written in the program."""
    written = written_state(p)

    def visit(node, e):
        if node.target != aten.mul.Tensor:
            return None
        for i, a in enumerate(e.args[:2]):
            held = e.state(a)
            other = e.args[1 - i]
            if held is None or not isinstance(other, Ref):
                continue
            if bug != "ignores_writes" and p.slot(held[0]).tensor in written:
                continue
            same = (e.val(other).shape, e.val(other).dtype) == (e.val(node.ref).shape,
                                                                   e.val(node.ref).dtype)
            if same and bool((held[1] == 1).all()):
                return other
        return None

    return rewrite_nodes(p, visit)


# --- our own ----------------------------------------------------------------------------------


def split_linears(p: Program, bug: str | None = None) -> Program:
    """Each ``linear`` with two or more output features becomes two linears on the halves of
    its weight (and bias), concatenated. ``off_by_one``: the second half starts one row late;
    ``bias_whole``: both halves take the whole bias."""

    def visit(node, e):
        if node.target != aten.linear.default or len(e.args) < 2:
            return None
        x, w, b = e.args[0], e.args[1], (e.args[2] if len(e.args) > 2 else None)
        n = int(e.val(w).shape[0])
        if n < 2:
            return None
        h = n // 2
        start = h + 1 if bug == "off_by_one" else h
        halves = []
        for lo, hi in ((0, h), (start, n)):
            part = e.call(aten.slice.Tensor, w, 0, lo, hi)
            if b is None:
                halves.append(e.call(aten.linear.default, x, part))
                continue
            bias = b if bug == "bias_whole" else e.call(aten.slice.Tensor, b, 0, lo, hi)
            halves.append(e.call(aten.linear.default, x, part, bias))
        return e.call(aten.cat.default, halves, -1)

    return rewrite_nodes(p, visit)


def fold_scalar_muls(p: Program, bug: str | None = None) -> Program:
    """``(x * a) * b`` -> ``x * (a * b)`` for Python scalars ``a``, ``b``. ``by_hand``: the
    outer ``mul`` is rebuilt by hand, readers rewired, the output node forgotten and the
    replaced node deleted; ``to_identity``: a product of 1 returns ``x`` itself (an integer
    ``x`` times ``0.5`` times ``2`` was a float: a dtype slip)."""
    if bug == "by_hand":
        return _fold_by_hand(p)
    inner: dict = {}

    def visit(node, e):
        if node.target != aten.mul.Tensor or not isinstance(e.args[0], Ref):
            return None
        x, a = e.args[0], e.args[1]
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            inner[id(e.graph), node.name] = node
            first = inner.get((id(e.graph), x.name))
            if first is not None and first.args[1] is not None:
                b = first.args[1]
                if bug == "to_identity" and a * b == 1:
                    return first.args[0]
                return e.call(aten.mul.Tensor, first.args[0], a * b)
        return None

    return rewrite_nodes(p, visit)


def _fold_by_hand(p: Program) -> Program:
    from ir.graph import Graph

    graph = p.root_module.graph
    by_name = graph.by_name()
    nodes, renamed = [], {}
    for n in graph.nodes:
        if n.op == CALL_FUNCTION and n.target == aten.mul.Tensor and isinstance(n.args[0], Ref) \
                and isinstance(n.args[1], (int, float)):
            first = by_name[n.args[0].name]
            if first.op == CALL_FUNCTION and first.target == aten.mul.Tensor \
                    and isinstance(first.args[1], (int, float)):
                folded = n.replace(name=n.name + "_folded", args=(first.args[0],
                                                                 first.args[1] * n.args[1]))
                nodes.append(folded)  # the replaced node is deleted
                renamed[n.name] = Ref(folded.name)
                continue
        if n.op == CALL_FUNCTION:  # readers rewired; the output node is forgotten
            n = n.replace(args=tuple(renamed.get(a.name, a) if isinstance(a, Ref) else a
                                     for a in n.args))
        nodes.append(n)
    root = p.root_module.replace(graphs=(Graph(tuple(nodes)),))
    return p.replace(modules=p.modules.set(p.root, root))


def _written(graph) -> set[str]:
    """Values some node of ``graph`` writes in place (through views too)."""
    found: set[str] = set()
    for n in reversed(graph.nodes):
        if n.op == CALL_FUNCTION and ops.is_mutating(n.target):
            found.update(r.name for r in n.inputs()[:1])
        if n.name in found and n.op == CALL_FUNCTION and ops.is_view(n.target):
            found.update(r.name for r in n.inputs()[:1])
    return found


COPIES = {aten.clone.default, aten._to_copy.default, aten.to.dtype}


def drop_copies(p: Program, bug: str | None = None) -> Program:
    """A ``clone`` / ``_to_copy`` / ``to`` that keeps the dtype, of a value that neither it nor its
    source is written in place later and that the graph does not return (forwarded, the output
    would share its source's memory), reads the source. ``ignores_writes_to_copy``: the copy
    may be written; ``ignores_writes_to_source``: the source may be; ``ignores_dtype``: a
    ``_to_copy`` to another dtype goes too."""
    writes: dict = {}

    def visit(node, e):
        if node.target not in COPIES or not isinstance(e.args[0], Ref):
            return None
        if id(e.graph) not in writes:
            writes[id(e.graph)] = _written(e.graph)
        written = writes[id(e.graph)]
        # a copy the graph returns stays: forwarded, the output would be its source's memory (an
        # input, a parameter) where the program returned a new tensor
        returned = e.graph.nodes[-1].name in e.graph.users().get(node.name, ())
        if returned and bug is None:
            return None
        if node.name in written and bug != "ignores_writes_to_copy":
            return None
        if e.args[0].name in written and bug != "ignores_writes_to_source":
            return None
        src = e.val(e.args[0])
        if bug != "ignores_dtype" and (src.dtype != e.val(node.ref).dtype
                                       or node.kwargs.get("memory_format") is not None):
            return None
        return e.args[0]

    return rewrite_nodes(p, visit)


def _same_sizes(x, y) -> bool:
    """Shapes equal as written, symbolic sizes by their expressions (``==`` on a ``SymInt``
    would guard the dynamic size to one value): different expressions count as different."""
    if len(x) != len(y):
        return False
    for m, n in zip(x, y):
        m_sym, n_sym = isinstance(m, torch.SymInt), isinstance(n, torch.SymInt)
        if m_sym != n_sym or (m.node.expr != n.node.expr if m_sym else m != n):
            return False
    return True


def commute_adds(p: Program, bug: str | None = None) -> Program:
    """``add(b, a)`` -> ``add(a, b)``: operands in name order, so that a later CSE sees one
    sum (only where ``alpha`` is 1). ``forgets_alpha``: swaps with an ``alpha`` and drops it;
    ``sub_too``: swaps ``sub`` as well."""
    targets = {aten.add.Tensor} | ({aten.sub.Tensor} if bug == "sub_too" else set())

    def visit(node, e):
        if node.target not in targets or len(e.args) != 2:
            return None
        a, b = e.args
        if not isinstance(a, Ref) or not isinstance(b, Ref) or a.name <= b.name:
            return None
        if not _same_sizes(e.val(a).shape, e.val(b).shape) or e.val(a).dtype != e.val(b).dtype:
            return None
        alpha = e.kwargs.get("alpha", 1)
        if alpha != 1 and bug != "forgets_alpha":
            return None
        return e.call(node.target, b, a)

    return rewrite_nodes(p, visit)


def freeze_buffers(p: Program, bug: str | None = None) -> Program:
    """Reads of a buffer nothing writes become reads of a new constant with its value (so
    constant folding may fold them). ``ignores_writes``: written buffers are frozen too."""
    written = written_state(p)

    def visit(node, e):
        held = e.state(node.ref)
        if held is None or p.slot(held[0]).kind != "buffer" or node.op == CALL_FUNCTION:
            return None
        if bug != "ignores_writes" and p.slot(held[0]).tensor in written:
            return None
        return e.constant(held[1].detach().clone())

    return rewrite_nodes(p, visit)


def relu_in_place(p: Program, bug: str | None = None) -> Program:
    """A ``relu`` of an intermediate nothing else reads becomes ``relu_`` (saves a buffer).
    ``on_inputs``: also on an input (a user input, or a value a preserved call's signature
    names: its module's input); ``read_later``: also where others read the value."""
    users_of: dict = {}
    inputs = {s.name for s in p.signature.user_inputs()}
    # a value a preserved call's signature names is also read across the call's boundary (an
    # argument: the called module's input, which relu_ would write in its caller)
    signed = {a.name for sig in p.call_signatures.values() for a in (*sig.inputs, *sig.outputs)}

    def visit(node, e):
        if node.target != aten.relu.default or not isinstance(e.args[0], Ref):
            return None
        x = e.args[0]
        if x.name in signed and bug != "on_inputs":
            return None
        if id(e.graph) not in users_of:
            users_of[id(e.graph)] = e.graph.users()
        source = e.graph.by_name().get(x.name)
        if source is None:
            return None
        if source.op != CALL_FUNCTION and not (bug == "on_inputs" and x.name in inputs):
            return None
        if source.op == CALL_FUNCTION and not ops.is_recomputable(source.target):
            return None
        if len(users_of[id(e.graph)][x.name]) > 1 and bug != "read_later":
            return None
        return e.call(aten.relu_.default, x)

    return rewrite_nodes(p, visit)


def quantize_weights_unused(p: Program, bug: str | None = None) -> Program:
    """Weight-only fake quantization whose result is never used (``e.apply`` and nothing
    else): a no-op that must be reported vacuous."""

    def fake_quant(w):
        scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
        return torch.round(w / scale).clamp(-128, 127).to(torch.int8).to(w.dtype) * scale

    def visit(node, e):
        if node.target in (aten.linear.default, aten.mm.default, aten.matmul.default):
            e.apply(fake_quant, e.args[1])

    return rewrite_nodes(p, visit)


# --- the models -------------------------------------------------------------------------------


class MaskedMLP(torch.nn.Module):
    """An MLP whose hidden features are multiplied by a buffer of ones (a mask left all ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 4)
        self.register_buffer("mask", torch.ones(16))
        self.register_buffer("steps", torch.arange(4))

    def forward(self, x):
        h = torch.relu(self.up(x)) * self.mask
        h = h * 0.5 * 2.0 + h.clone().to(torch.float16).to(torch.float32)
        return self.down(h), self.steps * 2 * 0.5


def masked_mlp(dynamic: bool = True) -> tuple[torch.nn.Module, torch.export.ExportedProgram]:
    """The model and its export with a dynamic batch (1..16, exported at 3), or a static one
    (an operator without a Meta kernel, such as fake quantization, runs on fake values only at
    static sizes: torch's fallback runs it on real zeros)."""
    torch.manual_seed(0)
    model = MaskedMLP().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    ep = torch.export.export(model, (torch.randn(3, 8),),
                             dynamic_shapes=({0: batch},) if dynamic else None)
    return model, ep
