"""A finding as a standalone script a torch developer runs without purefx.

:func:`repro_script` writes one Python file that imports torch only: ``class Repro(nn.Module)``
(the program's root graph as one ``forward`` of ``torch.ops.aten`` calls, its state registered
with the exact values the fuzzer ran, tied state as one tensor under both names, buffer and input
updates written back in place as the lowered program does), ``make_inputs()`` (the positional
inputs the program reads or writes, exact values, keyword inputs made positional; an input it
no longer uses is left out, but not state tied with state it uses; in a short script, ``exact=False``, large floating tensors are
drawn from a seed instead), ``compile_backend(module)`` (the backend
as the fuzzer ran it) and ``difference(compile=compile_backend)`` (every output, input written
and state, eager against compiled, both under ``torch.no_grad()``; the problems as sentences,
an input that eager refuses and the backend accepts among them, so that every kind of finding
the fuzzer makes is one its repro can show).
Run as a script it prints them and exits 1 when there are any. A finding of several sizes
(``differential(..., sizes=k)``) is written with the inputs of every call up to the one that
showed it (``make_inputs(call)``, ``CALLS``, ``SIZES``; ``DYNAMIC`` and ``DYNAMIC_SHAPES`` for
``compile_backend``): ``difference`` builds the callable once and calls it with each. One of
``grad=True`` also backpropagates the fuzzer's weighting of the outputs
(``lowering.fuzz.gradients``) and compares every input's and parameter's gradient.
For a backend that reads preserved calls (``"unflatten"``) the script is *nested*: the
program's module calls are nested modules again, each call made with its preserved signature
(``lowering.fuzz.repro_calls``), and ``compile_backend`` exports with
``preserve_module_call_signature``, so that torch's unflatten sees what the fuzzer gave it.
"""

from __future__ import annotations

import keyword
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ir.args import thaw
from ir.errors import PurefxError
from ir.literals import PRELUDE, scalar_literal
from ir.names import Names, fresh_name
from ir.node import CALL_FUNCTION, GET_ATTR, OUTPUT, PLACEHOLDER
from ir.program import Program
from ir.torch_seam import OpOverload, op_schema, pytree
from lowering.fuzz.backends import REPRO_COMPILE
from lowering.fuzz.call_sizes import dynamic_dims, sizes_text
from lowering.fuzz.error_bounds import error_budget, relative
from lowering.fuzz.gradients import written_inputs
from lowering.fuzz.judge import GRAD_BUDGET_FACTOR
from lowering.fuzz.repro_calls import (
    MOD_CLASS,
    NESTED_COMPILE,
    CallsError,
    functional_state,
    module_paths,
    nested_forward,
    preserved_paths,
)
from lowering.fuzz.repro_calls import value as value_name
from lowering.lowering_seam import reset_dynamo


class ReproError(PurefxError):
    """A program the repro writer cannot spell as a standalone script (a higher-order op, a
    Python function other than ``getitem``), named in the message."""


_STATE_KINDS = {"parameter", "buffer", "constant_tensor"}


def repro_script(program: Program, args: tuple, kwargs: Mapping[str, Any],
                 state: Mapping[str, Any], *, target: str, summary: str,
                 observe_state: bool = True,
                 calls: Sequence[tuple[Mapping[str, int], tuple, Mapping[str, Any]]] = (),
                 dynamic: bool = False, grad: bool = False, seed: int = 0,
                 exact: bool = True, nested: bool = False) -> str:
    """The standalone script of a finding (module docstring).

    Parameters:
        program: the (shrunk) program; its root graph is written out, so it must be flat.
        args, kwargs: the inputs the fuzzer ran (exact values are written; kwargs in order;
            those the graph neither reads nor writes are left out).
        state: fqn -> the tensor each state fqn held before the call (tied fqns: one object).
        target: the backend's target (``lowering.fuzz.backends.REPRO_COMPILE`` key).
        summary: one line, the script's first docstring line.
        observe_state: whether ``difference`` compares the state after the call.
        calls: ``(sizes, args, kwargs)`` per call of the compiled callable, in order (the
            callable is built once and called with each: ``make_inputs(call)``); empty: one
            call, with ``args`` / ``kwargs``.
        dynamic: the backend compiled for several sizes (``DYNAMIC = True``, and
            ``DYNAMIC_SHAPES`` the ``torch.export.Dim`` spec of the program's dynamic
            dimensions).
        grad: each call also backpropagates the weighting of ``lowering.fuzz.gradients``
            (seeded with ``seed``) and compares every input's and parameter's gradient.
        exact: every tensor written with its exact values; ``False``: a floating tensor of
            more than :data:`MOST_LITERAL` elements is drawn in the script instead, uniform in
            ``[-1, 1)`` from a seed of its own (``uniform(shape, dtype, seed)``): a short
            script where the finding does not hang on the values (the caller checks that it
            still shows, else writes the exact one).
        nested: the program's module calls written as nested modules
            (``lowering.fuzz.repro_calls``: state at its fqn, each call of a submodule made
            with its preserved signature) and ``compile_backend`` exporting with
            ``preserve_module_call_signature``, for a backend that reads preserved calls
            (``target`` ``"unflatten"``).

    Raises ``ReproError`` naming the node it cannot spell, ``CallsError``
    (``lowering.fuzz.repro_calls``) for calls that ``nested`` cannot write. Complexity:
    O(nodes + elements).
    """
    graph = program.root_module.graph
    sig = program.signature
    names = _Names()
    tensor = _Tensors(exact)
    attr_of: dict[str, str] = {}
    init: list[str] = []
    seen: dict[int, str] = {}
    users = graph.users()
    read = {s.name for s in sig.inputs if users.get(s.name)}
    read |= {o.target for o in sig.outputs if o.kind == "buffer_mutation"}
    if nested:  # a call's signature reads its inputs, and a holder module is made per path
        read |= {a.name for c in program.call_signatures.values() for a in c.inputs if a.name}
        init += [f"        self.{path} = Mod({path!r})" for path in module_paths(program)]
    # a state tied with state read is kept even where unread: torch sees the two names alias
    read_values = {id(state[s.target]) for s in sig.inputs
                   if s.kind in _STATE_KINDS and (s.name in read or s.target in read)
                   and isinstance(state.get(s.target), torch.Tensor)}
    for spec in sig.inputs:
        if spec.kind not in _STATE_KINDS or spec.target in attr_of:
            continue
        if spec.name not in read and spec.target not in read \
                and id(state.get(spec.target)) not in read_values:
            continue
        fqn = spec.target
        attr = fqn if nested else names.fresh(fqn.replace(".", "_"))
        attr_of[fqn] = attr
        owner, _, last = fqn.rpartition(".") if nested else ("", "", attr)
        holder = f"self.{owner}" if owner else "self"
        value = state.get(fqn)
        if not isinstance(value, torch.Tensor):
            raise ReproError(f"state {fqn!r} is not a tensor ({type(value).__name__}); the repro "
                             "writer spells tensor state only")
        if id(value) in seen:  # a buffer is tied by registering it (an attribute is a constant)
            init.append(f"        {holder}.register_buffer({last!r}, self.{seen[id(value)]}, "
                        f"persistent={bool(spec.persistent)})  # tied with it"
                        if spec.kind == "buffer" else
                        f"        self.{attr} = self.{seen[id(value)]}  # tied with it")
            continue
        seen[id(value)] = attr
        literal = tensor(value)
        if isinstance(value, torch.nn.Parameter):
            init.append(f"        self.{attr} = nn.Parameter({literal}, "
                        f"requires_grad={bool(value.requires_grad)})")
        else:
            persistent = bool(spec.persistent) if spec.kind == "buffer" else False
            init.append(f"        {holder}.register_buffer({last!r}, {literal}.clone(), "
                        f"persistent={persistent})")
    var: dict[str, str] = {}
    params: list[str] = []
    body: list[str] = []
    user = {s.name for s in sig.user_inputs()}
    written = {o.target for o in sig.outputs if o.kind == "user_input_mutation"}
    kept = [s.name in read or s.name in written for s in sig.user_inputs()]
    for spec in sig.inputs:
        if spec.kind in _STATE_KINDS:
            if spec.target not in attr_of:
                continue
            var[spec.name] = value_name(spec.name) if nested else names.fresh(spec.name)
            body.append(f"        {var[spec.name]} = self.{attr_of[spec.target]}")
        elif spec.name in user:
            if spec.name not in read and spec.name not in written:
                continue
            param = names.fresh(spec.name)
            params.append(param)
            var[spec.name] = value_name(spec.name) if nested else param
            if nested:
                body.append(f"        {var[spec.name]} = {param}")
        else:
            raise ReproError(f"input {spec.name!r} of kind {spec.kind!r} cannot be written as a "
                             "module argument or state")
    returns: list[str] = []
    head, lines = body, {}
    if nested:
        body = []
    for node in graph.nodes:
        if node.op == PLACEHOLDER:
            continue
        if node.op == OUTPUT:
            flat = pytree.tree_flatten(_plain(node.args[0], var))[0] if node.args else []
            for value, spec in zip(flat, sig.outputs):
                if spec.kind == "buffer_mutation":
                    body.append(f"        self.{attr_of[spec.target]}.copy_({value})")
                elif spec.kind == "user_input_mutation":
                    body.append(f"        {var[spec.target]}.copy_({value})")
                else:
                    returns.append(str(value))
            continue
        var[node.name] = value_name(node.name) if nested else names.fresh(node.name)
        lines[node.name] = f"{var[node.name]} = {_call(node, var)}"
        if not nested:
            body.append(f"        {lines[node.name]}")
    functions: list[str] = []
    if nested:
        body, functions = nested_forward(program, [b.strip() for b in head], lines,
                                         [b.strip() for b in body])
    runs = list(calls) or [({}, tuple(args), dict(kwargs))]
    made = [[tensor(x) if isinstance(x, torch.Tensor) else _literal(x)
             for x in _kept_inputs(a, k, kept)] for _, a, k in runs]
    names = [s.name for s, keep in zip(sig.user_inputs(), kept) if keep]
    rtol = {str(d): relative(d, error_budget(program))
            for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
    grad_rtol = {str(d): relative(d, error_budget(program) * GRAD_BUDGET_FACTOR)
                 for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
    dims = [d for d, keep in zip(dynamic_dims(program), kept) if keep] \
        if len(dynamic_dims(program)) == len(kept) else []
    settings = [
        f"CALLS = {len(runs)}  # the compiled callable is built once and called this often",
        f"SIZES = {[sizes_text(sz) for sz, _, _ in runs]!r}",
        f"DYNAMIC = {True if dynamic else None!r}",
        *_dynamic_shapes(dims if dynamic else []),
        f"GRAD = {grad!r}  # inputs and parameters require grad; a weighting is backpropagated",
        (f"WRITTEN = {sorted(i for i, n in enumerate(names) if n in written_inputs(program))!r}"
         "  # inputs written in place: passed as clones of their leaves"),
        f"WEIGHT_SEED = {seed!r}",
        *([f"PRESERVED = {preserved_paths(program)!r}  # preserve_module_call_signature",
           f"FUNCTIONAL = {functional_state(program)!r}  # state written as the program does"]
          if nested else []),
    ]
    lines = [
        f'"""{summary}',
        "",
        f"Written by purefx's differential fuzzer (torch {torch.__version__}). Imports torch only.",
        "Run: python repro.py  (prints the differences; exit status 1 when there are any).",
        "For your own backend: import this file and call difference(your_compile).",
        '"""',
        "import sys",
        "",
        "import torch",
        "from torch import nn",
        "",
        PRELUDE,
        *([] if not tensor.drawn else ["", "", _UNIFORM.rstrip("\n")]),
        *(["", "", MOD_CLASS.rstrip("\n"), *functions] if nested else []),
        "",
        "",
        "class Repro(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        *(init or ["        pass"]),
        "",
        f"    def forward(self{''.join(', ' + p for p in params)}):",
        *body,
        f"        return ({''.join(r + ', ' for r in returns)})",
        "",
        "",
        "def make_inputs(call=0):",
        "    \"\"\"The inputs of call `call` (one per size the fuzzer called at, in order).\"\"\"",
        *_inputs_body(made),
        "",
        "",
        *settings,
        "",
        "",
        NESTED_COMPILE if nested else REPRO_COMPILE[target],
        "",
        f"RTOL = {rtol!r}  # relative tolerance per dtype; absolute: RTOL * the eager value's scale",
        f"GRAD_RTOL = {grad_rtol!r}  # the same, for gradients",
        f"OBSERVE_STATE = {observe_state!r}",
        _HARNESS,
    ]
    return "\n".join(lines)


def _kept_inputs(args: tuple, kwargs: Mapping[str, Any], kept: list[bool]) -> list[Any]:
    flat = pytree.tree_flatten((tuple(args), dict(kwargs)))[0]
    return [x for x, keep in zip(flat, kept) if keep] if len(flat) == len(kept) else flat


def _inputs_body(per_call: list[list[str]]) -> list[str]:
    def spelled(inputs: list[str], indent: str) -> list[str]:
        return [f"{indent}{text}," for text in inputs]

    if len(per_call) == 1:
        return ["    return (", *spelled(per_call[0], "        "), "    )"]
    lines = []
    for i, inputs in enumerate(per_call):
        lines += [f"    if call == {i}:", "        return (", *spelled(inputs, "            "),
                  "        )"]
    lines.append("    raise IndexError(call)")
    return lines


def _dynamic_shapes(dims: list[dict[int, tuple[str, int, int | None]]]) -> list[str]:
    """``DYNAMIC_SHAPES``: the ``torch.export.Dim`` of each dynamic dimension of each input."""
    if not any(dims):
        return ["DYNAMIC_SHAPES = None"]
    symbols = {name: (lo, hi) for d in dims for name, lo, hi in d.values()}
    lines = [f"{_dim_var(name)} = torch.export.Dim({name!r}, min={lo!r}"
             + (f", max={hi!r})" if hi is not None else ")") for name, (lo, hi) in symbols.items()]
    specs = ["{" + ", ".join(f"{i}: {_dim_var(name)}" for i, (name, _, _) in d.items()) + "}"
             if d else "None" for d in dims]
    return [*lines, f"DYNAMIC_SHAPES = ({''.join(x + ', ' for x in specs)})"]


def _dim_var(name: str) -> str:
    return "DIM_" + "".join(c if c.isalnum() else "_" for c in name).upper()


_HARNESS = '''

def _leaves(x):
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in _leaves(item)]
    if isinstance(x, dict):
        return [leaf for key in x for leaf in _leaves(x[key])]
    return [x]


def _state(holder):
    if not isinstance(holder, nn.Module):
        return {}
    found = dict(holder.named_parameters(remove_duplicate=False))
    found.update(holder.named_buffers(remove_duplicate=False))
    return {name.replace("_orig_mod.", ""): t.detach().clone() for name, t in found.items()}


def _floating(x):
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _weights(outs, positions, call):
    gen = torch.Generator().manual_seed(WEIGHT_SEED * 1000 + call)
    return [(torch.rand(tuple(outs[i].shape), generator=gen, dtype=torch.float32) * 2 - 1)
            .to(device=outs[i].device, dtype=outs[i].dtype) for i in positions]


def _backward(outs, positions, leaves, holder, call):
    """The weighted outputs backpropagated; the gradients (zeros where none reached)."""
    if not positions:
        raise RuntimeError("no floating output requires grad")
    loss = sum((w * outs[i]).sum() for w, i in zip(_weights(outs, positions, call), positions))
    loss.backward()
    grads = {}
    for i, x in enumerate(leaves):
        if _floating(x):
            grads[f"input {i}"] = torch.zeros_like(x) if x.grad is None else x.grad.clone()
    params = holder.named_parameters(remove_duplicate=False) \
        if isinstance(holder, nn.Module) else ()
    for name, p in params:
        if _floating(p):
            g = torch.zeros_like(p.detach()) if p.grad is None else p.grad.clone()
            grads[f"parameter {name.replace('_orig_mod.', '')!r}"] = g
            p.grad = None
    for b in holder.buffers() if isinstance(holder, nn.Module) else ():
        if b.grad_fn is not None and call + 1 < CALLS:
            b.detach_()  # a buffer written with a value that requires grad: not into the next call
    return grads


def _differentiable(module):
    if GRAD and isinstance(module, nn.Module):
        for p in module.parameters():
            if _floating(p):
                p.requires_grad_(True)
    return module


def _observe(make, positions=None):
    """Each call's (outputs, inputs after it, state, gradients, outputs weighted)."""
    module = _differentiable(Repro())
    run = make(module)
    holder = _differentiable(run if isinstance(run, nn.Module) else module)
    seen = []
    for call in range(CALLS):
        leaves = list(make_inputs(call))
        inputs = leaves
        if GRAD:
            leaves = [x.requires_grad_() if _floating(x) else x for x in leaves]
            inputs = [x.clone() if i in WRITTEN and _floating(x) else x
                      for i, x in enumerate(leaves)]
        torch.manual_seed(0)
        with torch.enable_grad() if GRAD else torch.no_grad():
            out = _leaves(run(*inputs))
        weighted = positions[call] if positions else [
            i for i, o in enumerate(out) if _floating(o) and o.requires_grad]
        state = _state(holder) if OBSERVE_STATE else {}
        grads = _backward(out, weighted, leaves, holder, call) if GRAD else {}
        seen.append(([o.detach().clone() if isinstance(o, torch.Tensor) else o for o in out],
                     [x.detach().clone() for x in _leaves(list(inputs))], state, grads,
                     weighted))
    return seen


def _differs(what, got, want, table=None):
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"{what}: got {got!r}, eager gives {want!r}"
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: got {got!r}, eager gives {want!r}"
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    if not want.is_floating_point():
        bad = g != w
    else:
        rtol = (table or RTOL).get(str(want.dtype), 0.0)
        finite = w[torch.isfinite(w)]
        scale = float(finite.abs().max()) if finite.numel() else 1.0
        close = (g - w).abs() <= rtol * (scale or 1.0) + rtol * w.abs()
        same = (torch.isnan(g) & torch.isnan(w)) | (g == w)
        bad = ~(close | same)
    if not bool(bad.any()):
        return None
    j = int(bad.reshape(-1).nonzero()[0])
    err = float((g - w).abs().nan_to_num(float("inf"))[bad].max())
    return (f"{what}: {int(bad.sum())} of {bad.numel()} values differ, largest by {err:.4g}; "
            f"first at flat index {j}: got {g.reshape(-1)[j].item()!r}, "
            f"eager gives {w.reshape(-1)[j].item()!r}")


def _said(exc):
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def difference(compile=None):
    """Eager against compile(Repro()) (default: compile_backend), built once and called at
    each of the CALLS inputs in order: the differences as sentences. Both refusing the inputs
    is no difference; the backend alone refusing them is a crash, eager alone refusing them is
    one too (the backend accepts an input eager refuses)."""
    compile = compile or compile_backend
    try:
        want = _observe(lambda m: m)
    except Exception as refused:
        try:
            _observe(compile)
        except Exception:
            return []
        return [f"the backend accepts an input eager refuses (eager: {_said(refused)})"]
    try:
        got = _observe(compile, [w[4] for w in want])
    except Exception as exc:
        return [f"crash: {_said(exc)}"]
    problems = []
    for call, (g_call, w_call) in enumerate(zip(got, want)):
        at = f"call {call} ({SIZES[call]}): " if CALLS > 1 else ""
        for field, g_items, w_items in zip(("output", "input"), g_call[:2], w_call[:2]):
            if len(g_items) != len(w_items):
                problems.append(f"{at}{len(g_items)} {field}s, eager gives {len(w_items)}")
                continue
            for i, (g, w) in enumerate(zip(g_items, w_items)):
                found = _differs(f"{at}{field} {i}", g, w)
                if found:
                    problems.append(found)
        for name in sorted(set(g_call[2]) & set(w_call[2])):
            found = _differs(f"{at}state {name!r}", g_call[2][name], w_call[2][name])
            if found:
                problems.append(found)
        for key in w_call[3]:
            if key in g_call[3] or key.startswith("input"):
                found = _differs(f"{at}gradient of {key}", g_call[3].get(key), w_call[3][key],
                                 GRAD_RTOL)
                if found:
                    problems.append(found)
    return problems


if __name__ == "__main__":
    found = difference()
    print("\\n".join(found) if found else "no difference")
    sys.exit(1 if found else 0)
'''


def check_repro(source: str, compile: Callable[[torch.nn.Module], Any] | None = None) -> list[str]:
    """Run a script from :func:`repro_script` in this process: its ``difference(compile)``
    (``None``: the script's own ``compile_backend``). The problems it finds, as sentences.
    O(two runs of the program)."""
    namespace: dict[str, Any] = {"__name__": "purefx_repro"}
    exec(compile_source(source), namespace)  # noqa: S102 - our own generated script
    reset_dynamo()
    return list(namespace["difference"](compile))


def shortest_repro(program: Program, args: tuple, kwargs: Mapping[str, Any],
                   state: Mapping[str, Any], *, target: str, summary: str,
                   compile: Callable[[torch.nn.Module], Any] | None = None,
                   observe_state: bool = True,
                   calls: Sequence[tuple[Mapping[str, int], tuple, Mapping[str, Any]]] = (),
                   dynamic: bool = False, grad: bool = False, seed: int = 0,
                   nested: bool = False,
                   shows: Callable[[list[str]], bool] = bool) -> tuple[str, list[str]]:
    """The shortest script of :func:`repro_script` that shows the finding, and the problems it
    showed when run here (:func:`check_repro` with ``compile``): the short one
    (``exact=False``) where ``shows(problems)`` (default: it shows any; the fuzzer's
    ``lowering.fuzz.shown.shows``: the finding's own kind), else the exact one (its problems,
    perhaps none, perhaps another kind's).
    ``calls``, ``dynamic``, ``grad`` and ``seed`` are :func:`repro_script`'s (every call's
    inputs, drawn or exact alike). ``nested``: the scripts are :func:`repro_script`'s nested
    ones (the program's module calls kept), the flat ones where the calls cannot be written
    nested (``CallsError``). Raises ``ReproError`` as :func:`repro_script` does.
    O(two scripts' runs) at most."""
    text, problems = "", []
    for exact in (False, True):
        try:
            script = repro_script(program, args, kwargs, state, target=target, summary=summary,
                                  observe_state=observe_state, calls=calls, dynamic=dynamic,
                                  grad=grad, seed=seed, exact=exact, nested=nested)
        except CallsError:
            script = repro_script(program, args, kwargs, state, target=target, summary=summary,
                                  observe_state=observe_state, calls=calls, dynamic=dynamic,
                                  grad=grad, seed=seed, exact=exact)
        if script == text:
            break
        text = script
        try:
            problems = check_repro(text, compile)
        except Exception:  # noqa: BLE001 - a repro that does not run reproduces nothing
            problems = []
        if shows(problems):
            break
    return text, problems


def compile_source(source: str) -> Any:
    """``source`` compiled as the file ``repro.py``. O(len(source))."""
    return compile(source, "repro.py", "exec")


class _Names:
    def __init__(self) -> None:
        self.used = Names({"self", "torch", "nn", "sys", "inf", "nan"})

    def fresh(self, base: str) -> str:
        name = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "v"
        if name[0].isdigit() or keyword.iskeyword(name):
            name = "v_" + name
        return fresh_name(name, self.used)


def _call(node: Any, var: Mapping[str, str]) -> str:
    target = node.target
    if node.op == GET_ATTR:
        raise ReproError(f"node {node.name!r} reads attribute {target!r}; the repro writer "
                         "spells a flat program whose state comes in as placeholders")
    if node.op != CALL_FUNCTION:
        raise ReproError(f"node {node.name!r} is a {node.op}; the repro writer spells a flat "
                         "program of operator calls (inline it first)")
    args = [_literal(_plain(a, var)) for a in node.args]
    kwargs = [f"{k}={_literal(_plain(v, var))}" for k, v in node.kwargs.items]
    if target is operator.getitem:
        return f"{args[0]}[{args[1]}]"
    if isinstance(target, OpOverload):
        space, name = target.namespace, op_schema(target).name.split("::")[-1]
        callee = f"torch.ops.{space}.{name}.{target._overloadname}"
        return f"{callee}({', '.join(args + kwargs)})"
    raise ReproError(f"node {node.name!r} calls {target!r}; the repro writer spells operator "
                     "overloads and getitem only")


class _Var:
    """A variable name, written bare by :func:`_literal`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _plain(x: Any, var: Mapping[str, str]) -> Any:
    """``x`` with each ``Ref`` a :class:`_Var` of its variable, lists and dicts thawed."""
    return thaw(x, lambda r: _Var(var[r.name]))


def _literal(x: Any) -> str:
    if isinstance(x, _Var):
        return x.name
    if isinstance(x, list):
        return "[" + ", ".join(_literal(a) for a in x) + "]"
    if isinstance(x, tuple):
        inner = ", ".join(_literal(a) for a in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {_literal(v)}" for k, v in x.items()) + "}"
    text = scalar_literal(x)
    if text is not None:
        return text
    raise ReproError(f"the repro writer cannot spell the literal {x!r} ({type(x).__name__})")


MOST_LITERAL = 8
"""The most elements of a floating tensor a short repro writes as a literal."""

_UNIFORM = '''def uniform(shape, dtype, seed):
    """Values in [-1, 1) drawn from seed: the finding does not hang on them."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
'''


class _Tensors:
    """Writes tensors: as literals, or (not ``exact``) large floating ones drawn by seed."""

    def __init__(self, exact: bool) -> None:
        self.exact, self.drawn = exact, 0

    def __call__(self, t: torch.Tensor) -> str:
        if self.exact or not t.is_floating_point() or t.numel() <= MOST_LITERAL:
            return _tensor(t)
        self.drawn += 1
        text = f"uniform({tuple(t.shape)!r}, {t.dtype}, {self.drawn})"
        return text if t.device.type == "cpu" else f"{text}.to({str(t.device)!r})"


def _tensor(t: torch.Tensor) -> str:
    values = t.detach().cpu().reshape(-1).tolist()
    flat = "[" + ", ".join(_literal(v) for v in values) + "]"
    shape = tuple(t.shape)
    text = f"torch.tensor({flat}, dtype={t.dtype}).reshape({shape!r})"
    if t.device.type != "cpu":
        text += f".to({str(t.device)!r})"
    return text


__all__ = ["MOST_LITERAL", "ReproError", "check_repro", "compile_source", "repro_script",
           "shortest_repro"]
