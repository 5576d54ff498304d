"""A finding as a standalone script a torch developer runs without purefx.

:func:`repro_script` writes one Python file that imports torch only: ``class Repro(nn.Module)``
(the program's root graph as one ``forward`` of ``torch.ops.aten`` calls, its state registered
with the exact values the fuzzer ran, tied state as one tensor under both names, buffer and input
updates written back in place as the lowered program does), ``make_inputs()`` (the positional
inputs the program reads or writes, exact values, keyword inputs made positional; an input it
no longer uses is left out; in a short script, ``exact=False``, large floating tensors are
drawn from a seed instead), ``compile_backend(module)`` (the backend
as the fuzzer ran it) and ``difference(compile=compile_backend)`` (every output, input written
and state, eager against compiled, both under ``torch.no_grad()``; the problems as sentences).
Run as a script it prints them and exits 1 when there are any.
"""

from __future__ import annotations

import keyword
import operator
from collections.abc import Callable, Mapping
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
from lowering.fuzz.error_bounds import error_budget, relative
from lowering.lowering_seam import reset_dynamo


class ReproError(PurefxError):
    """A program the repro writer cannot spell as a standalone script (a higher-order op, a
    Python function other than ``getitem``), named in the message."""


_STATE_KINDS = {"parameter", "buffer", "constant_tensor"}


def repro_script(program: Program, args: tuple, kwargs: Mapping[str, Any],
                 state: Mapping[str, Any], *, target: str, summary: str,
                 observe_state: bool = True, exact: bool = True) -> str:
    """The standalone script of a finding (module docstring).

    Parameters:
        program: the (shrunk) program; its root graph is written out, so it must be flat.
        args, kwargs: the inputs the fuzzer ran (exact values are written; kwargs in order;
            those the graph neither reads nor writes are left out).
        state: fqn -> the tensor each state fqn held before the call (tied fqns: one object).
        target: the backend's target (``lowering.fuzz.backends.REPRO_COMPILE`` key).
        summary: one line, the script's first docstring line.
        observe_state: whether ``difference`` compares the state after the call.
        exact: every tensor written with its exact values; ``False``: a floating tensor of
            more than :data:`MOST_LITERAL` elements is drawn in the script instead, uniform in
            ``[-1, 1)`` from a seed of its own (``uniform(shape, dtype, seed)``): a short
            script where the finding does not hang on the values (the caller checks that it
            still shows, else writes the exact one).

    Raises ``ReproError`` naming the node it cannot spell. Complexity: O(nodes + elements).
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
    for spec in sig.inputs:
        if spec.kind not in _STATE_KINDS or spec.target in attr_of:
            continue
        if spec.name not in read and spec.target not in read:
            continue
        fqn = spec.target
        attr = names.fresh(fqn.replace(".", "_"))
        attr_of[fqn] = attr
        value = state.get(fqn)
        if not isinstance(value, torch.Tensor):
            raise ReproError(f"state {fqn!r} is not a tensor ({type(value).__name__}); the repro "
                             "writer spells tensor state only")
        if id(value) in seen:
            init.append(f"        self.{attr} = self.{seen[id(value)]}  # tied with it")
            continue
        seen[id(value)] = attr
        literal = tensor(value)
        if isinstance(value, torch.nn.Parameter):
            init.append(f"        self.{attr} = nn.Parameter({literal}, "
                        f"requires_grad={bool(value.requires_grad)})")
        else:
            persistent = bool(spec.persistent) if spec.kind == "buffer" else False
            init.append(f"        self.register_buffer({attr!r}, {literal}, "
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
            var[spec.name] = names.fresh(spec.name)
            body.append(f"        {var[spec.name]} = self.{attr_of[spec.target]}")
        elif spec.name in user:
            if spec.name not in read and spec.name not in written:
                continue
            var[spec.name] = names.fresh(spec.name)
            params.append(var[spec.name])
        else:
            raise ReproError(f"input {spec.name!r} of kind {spec.kind!r} cannot be written as a "
                             "module argument or state")
    returns: list[str] = []
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
        var[node.name] = names.fresh(node.name)
        body.append(f"        {var[node.name]} = {_call(node, var)}")
    flat = pytree.tree_flatten((tuple(args), dict(kwargs)))[0]
    inputs = [x for x, keep in zip(flat, kept) if keep] if len(flat) == len(kept) else flat
    made = [tensor(x) if isinstance(x, torch.Tensor) else _literal(x) for x in inputs]
    rtol = {str(d): relative(d, error_budget(program))
            for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
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
        "def make_inputs():",
        "    return (",
        *(f"        {text}," for text in made),
        "    )",
        "",
        "",
        REPRO_COMPILE[target],
        "",
        f"RTOL = {rtol!r}  # relative tolerance per dtype; absolute: RTOL * the eager value's scale",
        f"OBSERVE_STATE = {observe_state!r}",
        _HARNESS,
    ]
    return "\n".join(lines)


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


def _observe(make):
    module = Repro()
    inputs = make_inputs()
    run = make(module)
    with torch.no_grad():
        torch.manual_seed(0)
        out = run(*inputs)
    holder = run if isinstance(run, nn.Module) else module
    return (_leaves(out), [x.detach().clone() for x in _leaves(list(inputs))],
            _state(holder) if OBSERVE_STATE else {})


def _differs(what, got, want):
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"{what}: got {got!r}, eager gives {want!r}"
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: got {got!r}, eager gives {want!r}"
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    if not want.is_floating_point():
        bad = g != w
    else:
        rtol = RTOL.get(str(want.dtype), 0.0)
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


def difference(compile=None):
    """Eager against compile(Repro()) (default: compile_backend): the differences as sentences."""
    compile = compile or compile_backend
    want = _observe(lambda m: m)
    try:
        got = _observe(compile)
    except Exception as exc:
        return [f"crash: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
    problems = []
    for field, g_items, w_items in zip(("output", "input"), got[:2], want[:2]):
        if len(g_items) != len(w_items):
            problems.append(f"{len(g_items)} {field}s, eager gives {len(w_items)}")
            continue
        for i, (g, w) in enumerate(zip(g_items, w_items)):
            found = _differs(f"{field} {i}", g, w)
            if found:
                problems.append(found)
    for name in sorted(set(got[2]) & set(want[2])):
        found = _differs(f"state {name!r}", got[2][name], want[2][name])
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
                   observe_state: bool = True) -> tuple[str, list[str]]:
    """The shortest script of :func:`repro_script` that shows the finding, and the problems it
    showed when run here (:func:`check_repro` with ``compile``): the short one
    (``exact=False``) where it shows any, else the exact one (its problems, perhaps none).
    Raises ``ReproError`` as :func:`repro_script` does. O(two scripts' runs) at most."""
    text, problems = "", []
    for exact in (False, True):
        script = repro_script(program, args, kwargs, state, target=target, summary=summary,
                              observe_state=observe_state, exact=exact)
        if script == text:
            break
        text = script
        try:
            problems = check_repro(text, compile)
        except Exception:  # noqa: BLE001 - a repro that does not run reproduces nothing
            problems = []
        if problems:
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
