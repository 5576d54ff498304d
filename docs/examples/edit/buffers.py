"""Writing a buffer the program already writes: which Ref e.write_buffer takes, and the
"written once" refusal of a flat program tested first."""

import torch

from ir import effects
from ir import signature as sg
from transforms import functional_to_inplace
from transforms.edit import rewrite_nodes

aten = torch.ops.aten


def buffer_value(e, x):
    """The Ref e.write_buffer takes for the buffer that value x reads: x when e.state(x) names
    it, else the argument an in-place op wrote (x = add_(b, 1): b), followed back."""
    while e.state(x) is None:
        node = e.graph.by_name().get(x.name)
        written = effects.written_args(node) if node is not None else ()
        if not written:
            return None
        x = next(a for a in node.inputs() if a.name == written[0])
    return x


def written_by_an_output(p, fqn):
    """Whether write_buffer on flat p refuses fqn: a buffer_mutation output writes it already."""
    return p.is_flat and any(
        s.kind == sg.BUFFER_MUTATION and s.target == fqn for s in p.signature.outputs
    )


def count_products(p):
    """Add 10 to the buffer each mul reads, before the mul (a counter of products)."""

    def visit(node, e):
        if node.target is aten.mul.Tensor:
            for x in e.args:
                b = buffer_value(e, x)
                if b is not None:
                    e.write_buffer(b, e.call(aten.add.Tensor, b, 10.0))

    if any(written_by_an_output(p, fqn) for fqn in p.state_order):
        p = functional_to_inplace(p)  # its writes become in-place copy_: write_buffer adds one
    return rewrite_nodes(p, visit)
