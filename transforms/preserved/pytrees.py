"""Preserved calls: the pytree plumbing at a ``preserve_module_call_signature`` boundary.

A preserved call takes exactly the eager ``(args, kwargs)`` pytree and returns exactly the eager
output pytree, so that a user can swap the module for any module with the same forward
signature. ``outline`` builds three pieces of plumbing for each one, in the call and its caller:

- ``open_preserved`` (callee, at its first node): one placeholder per positional argument, one
  per keyword argument (by its exact name), ``tree_flatten_spec`` of them with the signature's
  input spec, and one ``getitem`` per flat input, named as the flat value it stands for
  (a constant input is checked with ``expect_constant``);
- ``close_preserved`` (callee, at its end): the flat outputs ``tree_unflatten``-ed with the
  signature's output spec and returned;
- ``call_preserved`` (caller): the flat input values ``tree_unflatten``-ed into ``(args,
  kwargs)`` (passed as they are when each argument is one leaf), the ``call_module``, its
  result ``tree_flatten_spec``-ed, one ``getitem`` per flat output, which later readers in the
  caller read.

State (and state threaded in, ``OpenCall.extra_inputs``) is the only other thing that crosses:
``transforms.preserved.remat`` and ``transforms.preserved.ivals`` have made every other crossing
value part of the signature or state before outlining starts.

Every node of the plumbing carries the ``val`` of what it holds (the eager argument and output
trees, built from the flat values' vals), as the call itself does.

**Laws:** the callee's graph reads nothing but its placeholders and state; the caller's call
passes ``len(args)`` positional and ``len(kwargs)`` keyword arguments (plus threaded state).
Complexity: O(size of the signature) per call.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ir.args import IDict, Ref, ref
from ir.errors import PassError
from ir.node import CALL_FUNCTION, CALL_MODULE, EMPTY_META, OUTPUT, PLACEHOLDER, Node
from ir.runtime import expect_constant
from ir.signature import CONSTANT, CallSignature
from ir.tree_calls import flatten_by_spec, unflatten_tree
from transforms import kernel as kn
from transforms.machinery.call_builder import OpenCall, call_base

Read = Callable[[OpenCall, str], Any]


def open_preserved(
    call: OpenCall,
    sig: CallSignature,
    w: kn.WorkingGraph,
    by_name: dict[str, Node],
    mutated_input: Callable[[str], str | None],
) -> None:
    """Start the graph of preserved ``call``: its argument placeholders and the flat inputs.

    ``w`` (the outlining walk's working graph) names and makes the new nodes; ``by_name`` the
    flat graph's nodes (a flat input takes its node's meta); ``mutated_input(v)`` the user input
    that flat value ``v`` is a state of, if any (writes to that input inside the call write to
    the argument).
    Raises ``PassError`` naming the call when its input spec is not torch's (args, kwargs).
    """
    args_spec, kwargs_spec = split_in_spec(sig, call.frame.call_name)
    flat_vals, _, arg_vals, kwarg_vals = _input_vals(
        sig, by_name, args_spec.num_children, kwargs_spec.context
    )
    arg_refs = []
    for i in range(args_spec.num_children):
        made = w.make_carrying(PLACEHOLDER, base=f"_positional_arg_{i}", val=_val(arg_vals[i]))
        call.placeholders.append(made)
        arg_refs.append(made.ref)
    call.n_positional = len(arg_refs)
    kwarg_refs = []
    keys = {str(k) for k in kwargs_spec.context}
    for key in kwargs_spec.context:
        # keyword placeholders keep their exact names: callers pass them by keyword
        val = _val(kwarg_vals[key])
        call.placeholders.append(w.make_carrying(PLACEHOLDER, name=str(key), val=val))
        kwarg_refs.append((key, ref(str(key))))
    flat = w.make_carrying(
        CALL_FUNCTION, flatten_by_spec, ((tuple(arg_refs), IDict(tuple(kwarg_refs))), sig.in_spec),
        base="_flat_args", val=_val(flat_vals),
    )
    call.body.append(flat)
    for i, arg in enumerate(sig.inputs):
        named = arg.kind != CONSTANT and bool(arg.name)
        if named and arg.name not in keys and arg.name not in call.env:
            name = arg.name
        else:
            name = w.fresh(f"_constant_{i}" if not named else arg.name)
        if arg.name in by_name:
            meta, val = by_name[arg.name].meta, kn.KEEP
        else:  # a constant: its value is its val
            meta, val = EMPTY_META, arg.value if arg.kind == CONSTANT else kn.KEEP
        call.body.append(w.make_carrying(CALL_FUNCTION, operator.getitem, (flat.ref, i), name=name,
                                         meta=meta, val=val))
        if named:
            call.env.setdefault(arg.name, ref(name))
            mutated = mutated_input(arg.name)
            if mutated is not None:
                # the caller passes the user input itself (it holds this value now), so
                # writes to the input in here write to this argument
                call.env.setdefault(mutated, ref(name))
        elif arg.kind == CONSTANT:
            where = f"input {i} of preserved call {call.frame.call_name!r}"
            call.body.append(
                w.make_carrying(
                    CALL_FUNCTION, expect_constant, (ref(name), arg.value, where),
                    base=f"_checked_{i}", val=arg.value,
                )
            )


def close_preserved(
    call: OpenCall, w: kn.WorkingGraph, by_name: dict[str, Node], read: Read
) -> list[Node]:
    """The body of preserved ``call``'s graph, ending in the output pytree it returns (its
    nodes made by ``w``); ``read(call, v)`` gives flat value ``v`` in the call."""
    sig = call.sig
    leaves = _flat_values(sig.outputs, by_name, lambda name: read(call, name))
    out_vals = _flat_vals(sig.outputs, by_name)
    val = kn.KEEP if out_vals is None else unflatten_tree(out_vals, sig.out_spec)
    tree = w.make_carrying(
        CALL_FUNCTION, unflatten_tree, (tuple(leaves), sig.out_spec), base="_tree_out", val=val
    )
    return call.body + [tree, w.make_carrying(OUTPUT, "output", (tree.ref,), base="output")]


def call_preserved(
    call: OpenCall,
    parent: OpenCall,
    target: str,
    state_args: Callable[[], list[Any]],
    w: kn.WorkingGraph,
    by_name: dict[str, Node],
    read: Read,
) -> list[str]:
    """Append to ``parent`` the call of preserved ``call`` (module ``target``), passing its
    inputs as the eager ``(args, kwargs)`` and ``state_args()`` (read once the pytree plumbing is
    built) after the positional ones, and define each flat output in ``parent``; ``w`` names
    and makes the new nodes. Returns the flat outputs the caller now holds."""
    sig = call.sig
    args_spec, kwargs_spec = split_in_spec(sig, call.frame.call_name)

    def new(
        base: str, op_target: Any, args: tuple, kwargs: IDict | None = None, val: Any = _UNKNOWN
    ) -> Ref:
        node = w.make_carrying(
            CALL_FUNCTION, op_target, args, kwargs or IDict(()), base=base, val=_val(val)
        )
        parent.body.append(node)
        return node.ref

    values = _flat_values(sig.inputs, by_name, lambda name: read(parent, name))
    n_args = args_spec.num_children
    if _all_leaves(args_spec) and _all_leaves(kwargs_spec):
        # each argument is one flat value (args' leaves first, then kwargs' in key order):
        # passed as it is, the tree built and taken apart again would give the same objects
        call_args = list(values[:n_args])
        call_kwargs = list(zip(kwargs_spec.context, values[n_args:]))
    else:
        # each plumbing node's ``val`` is the tree it holds, built from the inputs' vals
        _, vals_in, arg_vals, kwarg_vals = _input_vals(sig, by_name, n_args, kwargs_spec.context)
        tree = new("_tree_in", unflatten_tree, (tuple(values), sig.in_spec), val=vals_in)
        args_ref = new("_args", operator.getitem, (tree, 0), val=_part(vals_in, 0))
        kwargs_ref = new("_kwargs", operator.getitem, (tree, 1), val=_part(vals_in, 1))
        call_args = [
            new("_arg", operator.getitem, (args_ref, i), val=arg_vals[i]) for i in range(n_args)
        ]
        call_kwargs = [
            (k, new(f"_kwarg_{k}", operator.getitem, (kwargs_ref, k), val=kwarg_vals[k]))
            for k in kwargs_spec.context
        ]
    call_args += state_args()
    out_vals = _flat_vals(sig.outputs, by_name)
    called = w.make_carrying(
        CALL_MODULE, target, tuple(call_args), IDict(tuple(call_kwargs)), base=call_base(target),
        meta=call.meta,
        # the call returns the eager output tree
        val=kn.KEEP if out_vals is None else unflatten_tree(out_vals, sig.out_spec),
    )
    parent.body.append(called)
    name = called.name
    flat = new(
        "_flat_out", flatten_by_spec, (ref(name), sig.out_spec),
        val=_UNKNOWN if out_vals is None else list(out_vals),
    )
    held = []
    for i, out in enumerate(sig.outputs):
        if out.kind == CONSTANT or not out.name or out.name not in by_name:
            continue
        # an output the caller already holds (an input handed back, or the same value out of
        # two calls) gets a new local name; readers after the call read the call's result
        local = w.fresh(out.name) if out.name in parent.env else out.name
        meta = by_name[out.name].meta
        parent.body.append(
            w.make_carrying(CALL_FUNCTION, operator.getitem, (flat, i), name=local, meta=meta)
        )
        if out.name not in parent.env:
            parent.defined.append(out.name)
        parent.env[out.name] = ref(local)
        held.append(out.name)
    return held


def _all_leaves(spec: Any) -> bool:
    """Whether every child of a tuple or dict pytree spec is a single leaf."""
    return all(c.num_children == 0 and c.num_leaves == 1 for c in spec.children())


def split_in_spec(sig: CallSignature, call_name: str) -> tuple[Any, Any]:
    """The (args, kwargs) children of ``sig``'s input spec; ``PassError`` naming the call when
    the spec is not the pair torch.export records."""
    spec = sig.in_spec
    children = spec.children() if spec.type is tuple and spec.num_children == 2 else None
    if not children or children[0].type is not tuple or children[1].type is not dict:
        raise PassError(
            f"preserved call {call_name!r} has input spec {spec}, not the (args, kwargs) pair "
            "torch.export records; re-export the program"
        )
    return children[0], children[1]


_UNKNOWN: Any = object()  # a plumbing node whose value's ``val`` is not known gets none


def _flat_vals(specs: Sequence[Any], by_name: Mapping[str, Node]) -> list | None:
    """The ``val`` of each flat input or output of a signature (a constant's value), or ``None``
    when one of them has none."""
    vals = []
    for spec in specs:
        if spec.kind == CONSTANT or not spec.name:
            vals.append(spec.value)
            continue
        node = by_name.get(spec.name)
        if node is None or "val" not in node.meta:
            return None
        vals.append(node.meta["val"])
    return vals


def _part(tree: Any, key: Any) -> Any:
    return _UNKNOWN if tree is _UNKNOWN else tree[key]


def _input_vals(sig: CallSignature, by_name: Mapping[str, Node], n_args: int, keys: Sequence[Any]):
    """``(flat vals, (args, kwargs) tree of vals, per-argument vals, per-keyword vals)`` of a
    preserved call's inputs, ``_UNKNOWN`` throughout when an input has no ``val``."""
    flat = _flat_vals(sig.inputs, by_name)
    if flat is None:
        return _UNKNOWN, _UNKNOWN, [_UNKNOWN] * n_args, dict.fromkeys(keys, _UNKNOWN)
    tree = unflatten_tree(flat, sig.in_spec)
    return list(flat), tree, tree[0], tree[1]


def _val(val: Any) -> Any:
    """A plumbing node's ``val`` for ``kernel.WorkingGraph.make_carrying`` (none: unknown)."""
    return kn.KEEP if val is _UNKNOWN else val


def _flat_values(
    specs: Sequence[Any], by_name: Mapping[str, Any], read: Callable[[str], Any]
) -> list:
    """The flat values of a signature's inputs or outputs: a constant's value, ``read(name)`` for
    a value the program defines, ``None`` for one it does not."""
    return [
        spec.value if spec.kind == CONSTANT or not spec.name
        else read(spec.name) if spec.name in by_name
        else None
        for spec in specs
    ]
