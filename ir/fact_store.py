"""Facts kept on disk between processes, as JSON: where the store is, how an entry is sealed
and written, and the observed facts of operators the verified table lacks.

The store is the verdict store's directory (``transforms.rewrite.verdict_store`` files rule
verdicts there): ``$PUREFX_VERDICTS`` when set (a directory, or ``off`` / ``0`` / ``none`` /
empty for no store), else ``$XDG_CACHE_HOME/purefx/verdicts`` (``~/.cache/purefx/verdicts``
without it). Observed operator facts (``ir.op_known``) live in its ``operators/``
subdirectory, one file per operator, name, schema and torch version
(``<sha256>.json``): the calls observed (``ir.op_observe.Seen``: each call's tensor shapes,
dtypes and literals, what it wrote and shared, whether it is random), from which the facts are
derived again on reading.

A fact is a claim about soundness, so an entry is trusted only when it is well formed JSON of
this format, names the operator, schema and torch version asked for, and carries a checksum
(sha256 of its body) that matches; anything else is ignored (the operator is observed again and
the entry written anew). Writes are atomic (a temporary file, then ``os.replace``); a store
that cannot be written keeps nothing and raises nothing. Nothing is pickled: values are read
back from JSON by name (a dtype is ``torch.float32`` only when that is a ``torch.dtype``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ir.opset_entry import Sample, TensorSpec

__all__ = [
    "ENV",
    "OPERATORS_FORMAT",
    "VERDICTS_OFF",
    "checksum",
    "decode_sample",
    "default_directory",
    "encode_sample",
    "env_directory",
    "operators_directory",
    "read_json",
    "write_json",
]

ENV = "PUREFX_VERDICTS"
"""The environment variable naming the store's directory, or ``off`` for none."""
VERDICTS_OFF = frozenset({"", "0", "off", "none", "false", "no"})
"""Values of ``PUREFX_VERDICTS`` (any case) that turn the store off."""
OPERATORS_FORMAT = 1
"""The format of an observed operator's entry; an entry of another format is ignored."""


def default_directory() -> Path:
    """Where the store is by default: ``$XDG_CACHE_HOME/purefx/verdicts``, else
    ``~/.cache/purefx/verdicts``. O(1)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "purefx" / "verdicts"


def env_directory() -> Path | None:
    """The store's directory as the environment says: ``$PUREFX_VERDICTS`` (``None`` for one
    of ``VERDICTS_OFF``), else ``default_directory()``. Read on each call. O(1)."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in VERDICTS_OFF else Path(env)
    return default_directory()


def operators_directory() -> Path | None:
    """Where observed operator facts are kept: ``operators/`` in ``env_directory()``; ``None``
    when the store is off. O(1)."""
    base = env_directory()
    return None if base is None else base / "operators"


def checksum(body: Mapping[str, Any]) -> str:
    """The sha256 hex digest of ``body`` without its ``"sum"`` (keys sorted, as JSON): what an
    entry's ``"sum"`` must be. O(size of body)."""
    rest = {k: v for k, v in body.items() if k != "sum"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def read_json(path: Path) -> Any:
    """The JSON value in ``path`` whose ``"sum"`` matches (``checksum``), else ``None`` (missing,
    unreadable, not JSON, not sealed). Never raises. O(file size)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or body.get("sum") != checksum(body):
        return None
    return body


def write_json(path: Path, body: Mapping[str, Any]) -> bool:
    """Write ``body`` sealed with its checksum to ``path``, atomically (a temporary file in the
    directory, then ``os.replace``; the directory made when missing). Returns whether it was
    written (a read-only or full store keeps nothing and raises nothing). O(body size)."""
    sealed = {**body, "sum": checksum(body)}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(sealed, f, sort_keys=True, indent=1)
        os.replace(tmp, path)
        return True
    except (OSError, TypeError, ValueError):
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


# --- samples as JSON ----------------------------------------------------------------------------

_NAMED = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


def encode_sample(sample: Sample) -> dict[str, Any]:
    """``sample`` as a JSON value (``decode_sample`` reads it back). Raises ``ValueError`` for a
    value it cannot spell (a tensor's exact values are not kept). O(arguments)."""
    return {"args": [_encode(a) for a in sample.args],
            "kwargs": [[k, _encode(v)] for k, v in sample.kwargs]}


def decode_sample(body: Any) -> Sample:
    """The ``Sample`` ``encode_sample`` wrote. Raises ``ValueError`` on anything else (a name
    that is not a torch dtype, layout or memory format, a malformed value). O(arguments)."""
    if not isinstance(body, dict) or set(body) != {"args", "kwargs"}:
        raise ValueError("not a sample")
    args, kwargs = body["args"], body["kwargs"]
    if not isinstance(args, list) or not isinstance(kwargs, list):
        raise ValueError("not a sample")  # noqa: TRY004 - the one error of a bad entry
    pairs = []
    for pair in kwargs:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ValueError("not a keyword argument")
        pairs.append((pair[0], _decode(pair[1])))
    return Sample(tuple(_decode(a) for a in args), tuple(pairs))


def _encode(v: Any) -> Any:
    if isinstance(v, TensorSpec):
        if v.values is not None:
            raise ValueError("a tensor of exact values is not kept")
        return {"tensor": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."),
                "stride": None if v.stride is None else list(v.stride),
                "low": v.low, "high": v.high}
    if type(v) is tuple:
        return {"tuple": [_encode(x) for x in v]}
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) is complex:
        return {"complex": [v.real, v.imag]}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    for name, kind in _NAMED.items():
        if isinstance(v, kind):
            return {name: str(v).removeprefix("torch.")}
    raise ValueError(f"cannot keep a {type(v).__name__}")


def _decode(v: Any) -> Any:
    if v is None or type(v) in (bool, int, float, str):
        return v
    if not isinstance(v, dict) or not v:
        raise ValueError("not a value")
    if "tensor" in v:
        shape, stride = v.get("tensor"), v.get("stride")
        low, high = v.get("low"), v.get("high")
        if not (_ints(shape) and (stride is None or _ints(stride))
                and type(low) in (int, float) and type(high) in (int, float)):
            raise ValueError("not a tensor")
        dtype = _named(torch.dtype, v.get("dtype"))
        return TensorSpec(tuple(shape), dtype, None if stride is None else tuple(stride),
                          float(low), float(high))
    (kind, value), = v.items()
    if kind == "tuple" and isinstance(value, list):
        return tuple(_decode(x) for x in value)
    if kind == "complex" and isinstance(value, list) and len(value) == 2:
        return complex(float(value[0]), float(value[1]))
    if kind == "device" and isinstance(value, str):
        return torch.device(value)
    if kind in _NAMED:
        return _named(_NAMED[kind], value)
    raise ValueError(f"not a value: {kind}")


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(type(x) is int and x >= 0 for x in v)


def _named(kind: type, name: Any) -> Any:
    found = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(found, kind):
        raise ValueError(f"not a {kind.__name__}: {name!r}")  # noqa: TRY004 - as above
    return found
