"""Argument forms: how real models call each operator, as data the opset steps draw from.

A *form* is an operator together with the class of each non-tensor argument, in schema order
(:func:`form_of`): a tensor as ``T`` (an absent optional tensor as ``None``), a list of tensors
as ``T*n``, an int list by its length (``ints2``; ``ints2-`` when it holds a negative entry), an
int or float by its edge class (``0``, ``1``, ``-1``, ``neg``, ``int``; ``0.0``, ``1.0``,
``-1.0``, ``inf``, ``-inf``, ``nan``, ``float``), a string, bool or ``None`` as itself, a dtype
as ``dtype`` (a device, layout, memory format likewise by kind, a memory format by name), with
trailing arguments equal to the schema's defaults left out; a keyword-only argument that is not
its default is written ``name=class``. ``aten.mean.dim(T, ints2-, True)`` is global average
pooling; ``aten.unsqueeze.default(T, 0)`` and ``(T, -1)`` are two forms.

The census (``ir/strategies/model_forms.json``, written by ``python -m bench.model_forms
--write``) counts the forms of the test zoo's models and keeps one example call of each: its
tensors as specs (shape, dtype, strides, a value range or exact values), its literals exactly.
:func:`census` reads it; :func:`form_samples` gives each operator's examples as
``ir.opset.Sample`` s with their use counts, which the opset steps draw beside the table's own
samples (``ir.strategies.opset_steps``). A new form is a row of that file, not a branch of the
generator.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import torch

from ir.opset import Sample, TensorSpec
from ir.torch_seam import op_schema

__all__ = [
    "MODEL_FORMS",
    "CensusForm",
    "census",
    "decode_sample",
    "encode_sample",
    "form_of",
    "form_samples",
    "literal_class",
]

MODEL_FORMS = Path(__file__).resolve().parent / "model_forms.json"
"""The census of the test zoo's argument forms (``python -m bench.model_forms --write``):
``{"forms": {form: {"op": name, "uses": n, "models": m, "example": encoded sample}}}``."""


# --- classes of arguments -------------------------------------------------------------------------


def literal_class(value: Any) -> str:
    """The class of one non-tensor argument (module docstring): ``"ints2"``, ``"-1"``,
    ``"inf"``, ``"True"``, ``"'floor'"``, ``"dtype"``. Pure; O(len of a list)."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return {0: "0", 1: "1", -1: "-1"}.get(value, "neg" if value < 0 else "int")
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return {0.0: "0.0", 1.0: "1.0", -1.0: "-1.0"}.get(value, "float")
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, torch.dtype):
        return "dtype"
    if isinstance(value, torch.memory_format):
        return str(value).rpartition(".")[2]
    if isinstance(value, (torch.device, torch.layout)):
        return type(value).__name__
    if isinstance(value, (list, tuple)) or _is_ilist(value):
        items = list(value)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return f"ints{len(items)}" + ("-" if any(x < 0 for x in items) else "")
        if all(isinstance(x, float) for x in items):
            return f"floats{len(items)}"
        return "[" + ",".join(literal_class(x) for x in items) + "]"
    return type(value).__name__


def _is_ilist(value: Any) -> bool:
    return type(value).__name__ == "IList"


def form_of(op: Any, args: tuple, kwargs: Mapping[str, Any],
            is_tensor: Callable[[Any], bool] = lambda v: isinstance(v, torch.Tensor)) -> str:
    """The form of the call ``op(*args, **kwargs)`` (module docstring), e.g.
    ``"aten.mean.dim(T, ints2-, True)"``; ``is_tensor`` says which argument values are tensors
    (real tensors by default; ``Ref`` s for a program's nodes). Arguments are read in schema
    order, trailing positional ones equal to their default and keyword-only ones equal to
    their default left out. Pure; O(arguments)."""
    schema = op_schema(op)
    positional: list[str] = []
    keywords: list[str] = []
    trailing_defaults = 0
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            value, given = args[i], True
        elif a.name in kwargs:
            value, given = kwargs[a.name], True
        else:
            value, given = None, False
        is_default = not given or (a.has_default_value() and _same(value, a.default_value))
        cls = "" if not given else _class(value, is_tensor)
        if a.kwarg_only:
            if given and not is_default:
                keywords.append(f"{a.name}={cls}")
            continue
        if not given and not a.has_default_value():
            cls = "?"
        positional.append(cls)
        trailing_defaults = trailing_defaults + 1 if is_default else 0
    if trailing_defaults:
        positional = positional[:len(positional) - trailing_defaults]
    return f"{op}({', '.join(positional + keywords)})"


def _class(value: Any, is_tensor: Callable[[Any], bool]) -> str:
    if is_tensor(value):
        return "T"
    if (isinstance(value, (list, tuple)) or _is_ilist(value)) and len(value) and all(
            is_tensor(v) for v in value):
        return f"T*{len(value)}"
    if (isinstance(value, (list, tuple)) or _is_ilist(value)) and any(
            is_tensor(v) for v in value):
        return "[" + ",".join("T" if is_tensor(v) else literal_class(v) for v in value) + "]"
    return literal_class(value)


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) or _is_ilist(value):
        if not isinstance(default, (list, tuple)) or len(value) != len(default):
            return False
        return all(_same(v, d) for v, d in zip(value, default))
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    if isinstance(value, float) and math.isnan(value):
        return isinstance(default, float) and math.isnan(default)
    try:
        return type(value) is type(default) and value == default or (
            isinstance(value, (int, float)) and isinstance(default, (int, float))
            and value == default)
    except Exception:  # noqa: BLE001 - values that do not compare are different
        return False


# --- examples as data -----------------------------------------------------------------------------


def encode_sample(sample: Sample) -> dict:
    """``sample`` as JSON data (:func:`decode_sample` inverts it): tensors as
    ``{"shape", "dtype", "stride", "low", "high", "values"}``, floats that JSON cannot hold
    (inf, nan) and dtypes, memory formats, devices and layouts as one-key objects."""
    return {"args": [_encode(a) for a in sample.args],
            "kwargs": [[k, _encode(v)] for k, v in sample.kwargs]}


def decode_sample(data: Mapping[str, Any]) -> Sample:
    """The ``Sample`` :func:`encode_sample` wrote (lists as tuples, as the table's)."""
    return Sample(tuple(_decode(a) for a in data["args"]),
                  tuple((k, _decode(v)) for k, v in data["kwargs"]))


def _encode(v: Any) -> Any:
    if isinstance(v, TensorSpec):
        return {"tensor": {"shape": list(v.shape), "dtype": str(v.dtype).rpartition(".")[2],
                           "stride": None if v.stride is None else list(v.stride),
                           "low": v.low, "high": v.high,
                           "values": None if v.values is None else list(v.values)}}
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).rpartition(".")[2]}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).rpartition(".")[2]}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).rpartition(".")[2]}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    return v


def _decode(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_decode(x) for x in v)
    if not isinstance(v, dict):
        return v
    if "tensor" in v:
        t = v["tensor"]
        values = None if t["values"] is None else tuple(t["values"])
        return TensorSpec(tuple(t["shape"]), getattr(torch, t["dtype"]),
                          None if t["stride"] is None else tuple(t["stride"]),
                          float(t["low"]), float(t["high"]), values)
    if "float" in v:
        return float(v["float"])
    if "dtype" in v:
        return getattr(torch, v["dtype"])
    if "memory_format" in v:
        return getattr(torch, v["memory_format"])
    if "device" in v:
        return torch.device(v["device"])
    if "layout" in v:
        return getattr(torch, v["layout"])
    raise ValueError(f"model_forms.json: an argument it cannot read: {v!r}")


# --- the census -----------------------------------------------------------------------------------


@attrs.frozen
class CensusForm:
    """One form of the census: its key (:func:`form_of`), operator, how many calls of the
    models have it (``uses``), how many models (``models``), and one example call (``None``
    where the census kept none)."""

    form: str
    op: str
    uses: int
    models: int
    example: Sample | None


@functools.cache
def census() -> Mapping[str, CensusForm]:
    """Every form of :data:`MODEL_FORMS` by key, in the file's (sorted) order; empty when the
    file is missing. Read once; O(forms)."""
    try:
        data = json.loads(MODEL_FORMS.read_text())
    except FileNotFoundError:
        return MappingProxyType({})
    out = {}
    for form, row in sorted(data["forms"].items()):
        example = row.get("example")
        out[form] = CensusForm(form, row["op"], int(row["uses"]), int(row["models"]),
                               None if example is None else decode_sample(example))
    return MappingProxyType(out)


@functools.cache
def form_samples() -> Mapping[str, tuple[tuple[str, int, Sample], ...]]:
    """Operator name -> ``(form, uses, example)`` of each census form of it that has an
    example, commonest first (ties by form key). Read once; O(forms log forms)."""
    by_op: dict[str, list[tuple[str, int, Sample]]] = {}
    for f in census().values():
        if f.example is not None:
            by_op.setdefault(f.op, []).append((f.form, f.uses, f.example))
    return MappingProxyType({op: tuple(sorted(rows, key=lambda r: (-r[1], r[0])))
                             for op, rows in sorted(by_op.items())})
