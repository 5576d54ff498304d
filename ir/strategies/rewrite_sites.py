"""Hypothesis strategies for rewrite sites: a rule's pattern planted into exportable programs.

:func:`rewrite_sites` draws :class:`SiteSpec` values; :func:`realize_site` builds the
``nn.Module`` and inputs a spec describes, :func:`export_site` its ``torch.export`` program. The
law ``transforms.rewrite.check_rule_in_context`` is built on them; a property suite for any
program-to-program pass over patterned programs can use them too.

What a site varies (each drawn per example):

- the pattern's arguments: one *signature* from those given (shapes and dtypes of the tensor
  arguments, values of the scalars; ints and bools where the pattern runs on them), and where
  each tensor argument comes from: a user input, a value computed from one (``flip``), a view of
  one (``view`` of a flat input, ``transpose`` of a transposed one), a buffer, or the value of an
  earlier argument of the same signature (one value read twice);
- what reads each result: returned, read through a view (``unsqueeze``) that is returned, written
  in place (``fill_``) or written through a view (``narrow(...).fill_``) and then returned, copied
  into a buffer (a state update), read by ``view(-1)`` (a reader that needs the result's strides
  to admit a flat view: ``flat``);
- where the pattern runs: in the root module, inside a child module (``inside``), or split across
  a child module's boundary (``across``: the first ops of the pattern in the root, the rest in
  the child, the values between passed as arguments); the child preserved with
  ``preserve_module_call_signature`` or not;
- a copy inside the pattern (``copied``): the pattern's traced ops run in the root with the
  value of one op (``cut``) copied before the rest read it (``clone``, ``contiguous``,
  ``to(copy=True)``: ``COPIES``), so that the match's result is fresh where the pattern's own
  is a view;
- near misses (``perturbed``): the pattern's traced ops run in the root with some of their
  number literals retyped (``1`` as ``1.0``, ``2.0`` as ``2``, ``0.0`` as ``-0.0``, ``True`` as
  ``1``), a program the pattern must not match where the literal's type changes the result;
- the level: the training IR that ``torch.export`` gives, or core aten (``run_decompositions``).

Shrinking: toward the first signature, arguments from user inputs, results returned only, the
pattern in the root, nothing preserved, the training level.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from hypothesis import strategies as st

from ir.args import thaw

SOURCES = ("input", "computed", "view", "transposed", "buffer", "shared")
"""Where a tensor argument of the pattern comes from."""
USES = ("output", "view", "write", "write_view", "buffer", "flat")
"""What reads a result of the pattern."""
PLACES = ("root", "inside", "across", "perturbed", "copied")
"""Where the pattern runs."""
COPIES = ("clone", "contiguous", "to_copy")
"""The copy put inside the pattern at ``copied``."""
LEVELS = ("training", "core")


def is_spec(a: Any) -> bool:
    """Whether signature entry ``a`` is a tensor's ``(shape, dtype)`` (not a scalar, ``None`` or
    a hyperparameter's tuple of ints). O(1)."""
    return type(a) is tuple and len(a) == 2 and isinstance(a[1], torch.dtype)


@attrs.frozen
class SiteSpec:
    """One planted pattern (see the module docstring): ``args`` one signature (per argument
    ``(shape, dtype)`` or a scalar), ``sources`` per argument (``None`` for a scalar), ``uses``
    per result (a tuple of ``USES``), ``place``, ``preserve``, ``level``, ``cut`` (for
    ``across``: how many of the pattern's ops run in the root), ``seed`` (of the values)."""

    args: tuple
    sources: tuple
    uses: tuple
    place: str = "root"
    preserve: bool = False
    level: str = "training"
    cut: int = 1
    seed: int = 0
    perturb: int = 0
    copy: str = "clone"

    def describe(self) -> str:
        """One line that names every choice."""
        parts = []
        for a, s in zip(self.args, self.sources):
            if is_spec(a):
                parts.append(f"{s} tensor{a[0]} {str(a[1]).replace('torch.', '')}")
            else:
                parts.append(repr(a))
        where = self.place + (" (preserved)" if self.preserve else "")
        if self.place == "across":
            where += f" after {self.cut} ops"
        if self.place == "perturbed":
            where += f" (literals retyped: mask {self.perturb:#b})"
        if self.place == "copied":
            where += f" (a {self.copy} after {self.cut} ops)"
        uses = "; ".join(f"result {k}: {'+'.join(u)}" for k, u in enumerate(self.uses))
        return f"pattern({', '.join(parts)}) in {where} at {self.level} level; {uses}"


def rewrite_sites(
    pattern: Callable,
    signatures: Sequence[tuple],
    *,
    results: int = 1,
    split: Any = None,
    places: Sequence[str] = PLACES,
    levels: Sequence[str] = LEVELS,
) -> st.SearchStrategy[SiteSpec]:
    """Sites of ``pattern`` (a function of tensors and scalars returning ``results`` tensors).

    Parameters:
        signatures: at least one argument signature (per argument ``(shape, dtype)`` or a
            scalar); the first is where shrinking goes.
        split: the pattern's traced graph (an ``ir`` ``Graph`` whose placeholders are the
            tensor arguments in order, traced at ``signatures[0]``) with its scalar arguments
            as literals, for ``across``; ``None`` leaves ``across`` out.
        places / levels: the choices allowed.

    Generates ``SiteSpec`` values (shrinking as the module docstring says); any spec realizes
    (``realize_site``), though ``torch.export`` may refuse a few (``export_site`` says which).
    """
    if not signatures:
        raise ValueError("rewrite_sites: signatures must hold one signature at least")
    places = tuple(
        p for p in places if p not in ("across", "perturbed", "copied") or split is not None
    )
    n_ops = 0
    if split is not None:
        n_ops = sum(1 for n in split.nodes if n.op == "call_function")
        if n_ops < 2:
            places = tuple(p for p in places if p not in ("across", "copied"))
        if not literal_slots(split):
            places = tuple(p for p in places if p != "perturbed")
    # the traced ops hold the first signature's sizes: they run at its shapes (any dtype)
    same_shapes = [i for i, sig in enumerate(signatures) if _shapes(sig) == _shapes(signatures[0])]

    @st.composite
    def draw(d: Any) -> SiteSpec:
        place = d(st.sampled_from(places))
        if place in ("across", "perturbed", "copied"):
            i = same_shapes[d(st.integers(0, len(same_shapes) - 1))]
        else:
            i = d(st.integers(0, len(signatures) - 1))
        args = tuple(signatures[i])
        sources = []
        for j, a in enumerate(args):
            if not is_spec(a):
                sources.append(None)
                continue
            s = d(st.sampled_from(SOURCES))
            if s == "transposed" and len(a[0]) < 2:
                s = "input"
            if s == "shared" and not any(args[k] == a for k in range(j)):
                s = "input"
            sources.append(s)
        uses = tuple(
            tuple(sorted(set(d(st.lists(st.sampled_from(USES), min_size=1, max_size=3)))))
            for _ in range(results)
        )
        preserve = place in ("inside", "across") and d(st.booleans())
        level = d(st.sampled_from(tuple(levels)))
        cut = d(st.integers(1, n_ops - 1)) if place in ("across", "copied") else 1
        copy = d(st.sampled_from(COPIES)) if place == "copied" else "clone"
        seed = d(st.integers(0, 2**16 - 1))
        perturb = 0
        if place == "perturbed":
            perturb = d(st.integers(1, 2 ** len(literal_slots(split)) - 1))
        return SiteSpec(args, tuple(sources), uses, place, preserve, level, cut, seed, perturb,
                        copy)

    return draw()


def _shapes(sig: Sequence) -> tuple:
    return tuple(a[0] if is_spec(a) else None for a in sig)


def literal_slots(graph: Any) -> list[tuple[str, int]]:
    """``(node name, argument position)`` of each number literal (not inside a list) among the
    call arguments of ``graph`` that a near miss may retype (see ``retyped``)."""
    found = []
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        for j, a in enumerate(n.args):
            if retyped(a) is not None:
                found.append((n.name, j))
    return found


def retyped(x: Any) -> Any:
    """``x`` as a literal of another type with an equal value (``1`` -> ``1.0``, ``2.0`` ->
    ``2``, ``0.0`` -> ``-0.0``, ``True`` -> ``1``), or ``None`` when there is none."""
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, int):
        return float(x)
    if isinstance(x, float):
        if x == 0.0:
            return -x
        if x.is_integer() and abs(x) < 2**31:
            return int(x)
    return None


def _values(spec: SiteSpec) -> list:
    gen = torch.Generator().manual_seed(spec.seed)
    out = []
    for a in spec.args:
        if not is_spec(a):
            out.append(a)
            continue
        shape, dtype = a
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            out.append(torch.randint(-3, 4, shape, generator=gen).to(dtype))
    return out


class SiteChild(torch.nn.Module):
    """The child module of a site: the pattern (``inside``) or its last ops (``across``)."""

    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Any) -> Any:
        return self.fn(*xs)


class SiteRoot(torch.nn.Module):
    """The root module of a site (built by ``realize_site``)."""

    def __init__(self, spec: SiteSpec, pattern: Callable, split: Any, values: list) -> None:
        super().__init__()
        self.spec = spec
        self.pattern = pattern
        self.split = split
        for j, (s, v) in enumerate(zip(spec.sources, values)):
            if s == "buffer":
                self.register_buffer(f"arg{j}", v.clone())
        with torch.no_grad():
            outs = pattern(*values)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for k, (u, r) in enumerate(zip(spec.uses, outs)):
            if "buffer" in u:
                self.register_buffer(f"acc{k}", torch.zeros_like(r))
        if spec.place == "inside":
            self.child = SiteChild(self._inner)
        elif spec.place == "across":
            self.child = SiteChild(self._rest)

    def _inner(self, *xs: torch.Tensor) -> Any:
        return self.pattern(*self._args(xs))

    def _args(self, tensors: Sequence[torch.Tensor]) -> list:
        it = iter(tensors)
        return [next(it) if is_spec(a) else a for a in self.spec.args]

    def _rest(self, *xs: Any) -> Any:
        env = dict(zip(self._live, xs))
        _run_nodes(self._nodes[self.spec.cut:], env)
        return _results(self.split, env)

    def forward(self, *inputs: torch.Tensor) -> Any:
        spec = self.spec
        vals: list = []
        it = iter(inputs)
        for j, (a, s) in enumerate(zip(spec.args, spec.sources)):
            if s is None:
                continue
            shape = a[0]
            if s == "buffer":
                v = getattr(self, f"arg{j}")
            elif s == "shared":
                k = next(k for k in range(j) if spec.args[k] == a)
                v = vals[sum(1 for x in spec.args[:k] if is_spec(x))]
            else:
                u = next(it)
                if s == "computed":
                    v = u.flip(-1) if len(shape) else u.clone()
                elif s == "view":
                    v = u.view(shape)
                elif s == "transposed":
                    v = u.transpose(-1, -2)
                else:
                    v = u
            vals.append(v)
        if spec.place in ("perturbed", "copied", "across"):  # the traced ops, run here
            nodes = [n for n in self.split.nodes if n.op == "call_function"]
            env = dict(zip([n.name for n in self.split.nodes if n.op == "placeholder"], vals))
        if spec.place == "inside":
            outs = self.child(*vals)
        elif spec.place == "perturbed":
            slots = literal_slots(self.split)
            chosen = {slots[b] for b in range(len(slots)) if spec.perturb >> b & 1}
            _run_nodes([_retype(n, chosen) for n in nodes], env)
            outs = _results(self.split, env)
        elif spec.place == "copied":
            _run_nodes(nodes[:spec.cut], env)
            copied = nodes[spec.cut - 1].name
            env[copied] = _copied(env[copied], spec.copy)
            _run_nodes(nodes[spec.cut:], env)
            outs = _results(self.split, env)
        elif spec.place == "across":
            _run_nodes(nodes[:spec.cut], env)
            later = {r.name for n in nodes[spec.cut:] for r in n.inputs()}
            later |= {r.name for r in _output_refs(self.split)}
            self._nodes = nodes
            self._live = [k for k in env if k in later]
            outs = self.child(*[env[k] for k in self._live])
        else:
            outs = self.pattern(*self._args(vals))
        outs = outs if isinstance(outs, tuple) else (outs,)
        returned = []
        for k, (u, r) in enumerate(zip(spec.uses, outs)):
            if "buffer" in u:
                getattr(self, f"acc{k}").copy_(r)
            if "write" in u:
                r.fill_(1)
            if "write_view" in u:
                (r.narrow(-1, 0, 1) if r.dim() else r.unsqueeze(0)).fill_(0)
            if "view" in u:
                returned.append(r.unsqueeze(0))
            if "flat" in u:
                returned.append(r.view(-1))
            if "output" in u or "write" in u or "write_view" in u or not returned:
                returned.append(r)
        return tuple(returned)


def _copied(v: Any, kind: str) -> Any:
    if not isinstance(v, torch.Tensor):
        return v
    if kind == "contiguous":
        return v.contiguous()
    if kind == "to_copy":
        return v.to(v.dtype, copy=True)
    return v.clone()


def _retype(node: Any, chosen: set) -> Any:
    args = tuple(retyped(a) if (node.name, j) in chosen else a for j, a in enumerate(node.args))
    return node.replace(args=args)


def _results(graph: Any, env: dict) -> Any:
    out = next(n for n in graph.nodes if n.op == "output")
    res = thaw(out.args[0], lambda r: env[r.name])
    if isinstance(res, (tuple, list)):
        return tuple(res) if len(res) != 1 else res[0]
    return res


def _output_refs(graph: Any) -> list:
    out = next(n for n in graph.nodes if n.op == "output")
    return list(out.inputs())


def _run_nodes(nodes: Sequence[Any], env: dict) -> None:
    def read(r: Any) -> Any:
        return env[r.name]

    for n in nodes:
        env[n.name] = n.target(*thaw(n.args, read), **thaw(n.kwargs, read))


def realize_site(spec: SiteSpec, pattern: Callable, split: Any = None
                 ) -> tuple[torch.nn.Module, tuple]:
    """The module ``spec`` describes and its user inputs (fresh tensors, deterministic)."""
    values = _values(spec)
    model = SiteRoot(spec, pattern, split, [v for v in values])
    inputs = []
    for a, s, v in zip(spec.args, spec.sources, values):
        if s in (None, "buffer", "shared"):
            continue
        if s == "view":
            inputs.append(v.reshape(-1).clone())
        elif s == "transposed":
            inputs.append(v.transpose(-1, -2).contiguous())
        elif s == "computed" and v.dim():
            inputs.append(v.flip(-1).clone())
        else:
            inputs.append(v.clone())
    return model, tuple(inputs)


def export_site(spec: SiteSpec, pattern: Callable, split: Any = None
                ) -> tuple[torch.export.ExportedProgram, tuple] | None:
    """``torch.export`` of ``realize_site(spec, ...)`` (the child preserved when
    ``spec.preserve``; ``run_decompositions()`` at the core level) and its inputs; ``None``
    when export refuses the module (say, a preserved call returning an alias of its input)."""
    model, inputs = realize_site(spec, pattern, split)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(
                model, tuple(x.clone() for x in inputs),
                preserve_module_call_signature=("child",) if spec.preserve else (),
            )
            if spec.level == "core":
                ep = ep.run_decompositions()
    except Exception:  # noqa: BLE001 - export's errors share no base class
        return None
    return ep, inputs


__all__ = [
    "COPIES", "LEVELS", "PLACES", "SOURCES", "USES", "SiteSpec", "export_site", "literal_slots",
    "realize_site", "retyped", "rewrite_sites",
]
