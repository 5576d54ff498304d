"""``load_program(path)``: read a ``.pt2`` file without running code from it.

``torch.export.load`` can run code from the file it reads: it unpickles weights and constants
saved with ``use_pickle`` (``torch.load(weights_only=False)``), opaque and custom objects
(``pickle.loads``), legacy ``.pt`` weight files, and sample inputs that do not load with
``weights_only=True``; it parses shape expressions with ``sympy.sympify`` (``eval``), builds node
targets by ``getattr`` from any dotted name under ``torch``/``math``/``_operator`` (a program
calling ``torch.serialization.os.system`` runs it when the graph runs), and loads AOTInductor
shared libraries. ``load_program`` reads the archive into memory once, scans it without
unpickling anything, and hands torch only an archive in which none of these paths can be reached;
``trust=True`` skips the scan (the limits still hold).
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import logging
import math
import operator
import os
import stat
import struct
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from ir import ops
from ir.errors import LoadError, UntrustedProgramError, shorten

MiB = 2**20
GiB = 2**30
_OPT_IN = "pass trust=True (purefx --trust) only for a file you trust"


@attrs.frozen
class Limits:
    """Resource caps on an archive, checked before any member is decompressed.

    ``max_members``: members in the zip; ``max_bytes``: size of the file and total uncompressed
    size of its members; ``max_ratio``: uncompressed/compressed size, for the archive as a whole
    and for each member, counted once a member (or the archive) holds more than
    ``ratio_floor`` bytes (small JSON members compress well and are harmless).
    """

    max_members: int = 65_536
    max_bytes: int = 16 * GiB
    max_ratio: float = 100.0
    ratio_floor: int = MiB


DEFAULT_LIMITS = Limits()


def load_program(
    path: str | os.PathLike[str], *, trust: bool = False, limits: Limits = DEFAULT_LIMITS
) -> torch.export.ExportedProgram:
    """Load the ``ExportedProgram`` saved at ``path`` with ``torch.export.save``.

    Returns the ``torch.export.ExportedProgram`` itself (not a ``Program``: callers compare
    against ``ep.module()`` and pass it to ``import_ep``). Without ``trust``, the archive is
    scanned first and refused, with ``UntrustedProgramError`` naming the member, when loading it
    would unpickle anything (pickled weights or constants, custom or opaque objects, legacy
    ``.pt`` members, sample inputs that need more than ``weights_only=True``), parse a shape
    expression that is not plain arithmetic, call a node target that is not an operator, or load
    compiled code; any member outside the plain program layout is refused too. Raises
    ``LoadError`` for a path that is not a regular file, an archive over ``limits``, or a file
    that is not a saved program. The file is read once (at most ``limits.max_bytes``), so what
    is scanned is what torch loads. O(size of the archive).
    """
    data = _read_regular_file(os.fspath(path), limits)
    where = os.fspath(path)
    archive = _open_archive(data, where)
    with archive:
        members = _check_limits(archive, where, limits)
        check_members(archive, members, data, where)
        if not trust:
            try:
                _scan(archive, members, where, limits)
            except _ZIP_ERRORS as err:  # checked above; a reader of the archive may still refuse
                raise _damaged(where, "", err) from None
    return _torch_load(data, where)


# --- the file -------------------------------------------------------------------------------------


def _read_regular_file(path: str, limits: Limits) -> bytes:
    try:
        info = os.stat(path)  # never open a FIFO or a device: opening one can block for ever
    except OSError as err:
        raise LoadError(f"{path}: {err.strerror or 'cannot be read'}") from None
    if stat.S_ISDIR(info.st_mode):
        raise LoadError(f"{path}: is a directory, not a .pt2 file")
    if not stat.S_ISREG(info.st_mode):
        raise LoadError(f"{path}: not a regular file (a FIFO, socket or device); give a .pt2 file")
    if info.st_size > limits.max_bytes:
        raise LoadError(
            f"{path}: {info.st_size} bytes, over the limit of {limits.max_bytes} "
            "(raise it with max_bytes / --max-bytes)"
        )
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in opens, not blocks
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise LoadError(f"{path}: {err.strerror or 'cannot be read'}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped since the stat above
            raise LoadError(f"{path}: not a regular file; give a .pt2 file")
        data = f.read(limits.max_bytes + 1)
    if len(data) > limits.max_bytes:
        raise LoadError(f"{path}: grew over the limit of {limits.max_bytes} bytes while read")
    return data


def _open_archive(data: bytes, where: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except _ZIP_ERRORS as err:
        raise LoadError(
            f"{where}: not a program saved with torch.export.save (not a zip archive: {err})"
        ) from None


# What Python's zip reader raises for a damaged archive: a bad header or CRC (BadZipFile), a
# corrupt deflate stream (zlib.error), a member cut short (EOFError), a bad seek or field
# (OSError, ValueError, struct.error), an unknown compression or encryption flag
# (NotImplementedError, RuntimeError).
_ZIP_ERRORS = (
    zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, struct.error,
    NotImplementedError, RuntimeError,
)
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # the 30 fixed bytes of a zip local file header
_LOCAL_MAGIC = b"PK\x03\x04"
_DESCRIPTOR = 0x08  # general purpose flag: CRC and sizes follow the data, not in the header
_ZIP64 = 0xFFFFFFFF


def _damaged(where: str, member: str, err: BaseException | str) -> LoadError:
    what = err if isinstance(err, str) else f"{type(err).__name__}: {' '.join(str(err).split())}"
    name = f"member {member!r}" if member else "the archive"
    return LoadError(
        f"{where}: {name} is damaged ({shorten(what, 200)}); the file is corrupt: save or copy it again"
    )


def check_members(
    archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], data: bytes, where: str
) -> None:
    """Every member of ``archive`` (whose bytes are ``data``) is intact, before torch reads it.

    Each member's local header must agree with the central directory (magic number, name,
    flags, compression method, and CRC-32 and sizes, which may be 0 when a data descriptor
    follows the data), and
    its data must decompress to its recorded size and CRC-32. torch's own reader checks none of
    this, so a flipped byte in a weight would load as a wrong weight. Raises ``LoadError`` naming
    the first damaged member.

    **Laws:** never reads past ``data``; the verdict depends only on ``data``.
    O(size of the archive): each member is read once, in 1 MiB chunks.
    """
    for info in members:
        _check_local_header(info, data, where)
        try:
            with archive.open(info) as stream:
                while stream.read(MiB):
                    pass
        except _ZIP_ERRORS as err:
            raise _damaged(where, info.filename, err) from None


def _check_local_header(info: zipfile.ZipInfo, data: bytes, where: str) -> None:
    start = info.header_offset
    fixed = data[start:start + _LOCAL_HEADER.size]
    if len(fixed) < _LOCAL_HEADER.size:
        raise _damaged(where, info.filename, "its local header lies past the end of the file")
    (magic, _, _, flags, method, _, _, crc, packed, size, name_len, _) = _LOCAL_HEADER.unpack(
        fixed
    )
    name = data[start + _LOCAL_HEADER.size:start + _LOCAL_HEADER.size + name_len]
    encoding = "utf-8" if flags & 0x800 else "cp437"
    faults = [
        what for what, bad in (
            ("bad local header magic number", magic != _LOCAL_MAGIC),
            ("its local header names another file", name.decode(encoding, "replace")
             != info.orig_filename),
            ("its flags differ from the directory's", flags != info.flag_bits),
            ("compression method differs from the directory's", method != info.compress_type),
            ("CRC-32 differs from the directory's", crc not in _allowed(flags, info.CRC)),
            ("compressed size differs from the directory's",
             packed not in _allowed(flags, info.compress_size, _ZIP64)),
            ("size differs from the directory's",
             size not in _allowed(flags, info.file_size, _ZIP64)),
        ) if bad
    ]
    if faults:
        raise _damaged(where, info.filename, faults[0])


def _allowed(flags: int, *values: int) -> tuple[int, ...]:
    """What a local header field may hold: the directory's value, or 0 when a data descriptor
    carries it after the data."""
    return (*values, 0) if flags & _DESCRIPTOR else values


def _check_limits(archive: zipfile.ZipFile, where: str, limits: Limits) -> list[zipfile.ZipInfo]:
    """The archive's members, after checking their count, total size and compression ratios."""
    members = archive.infolist()
    if len(members) > limits.max_members:
        raise LoadError(
            f"{where}: {len(members)} members, over the limit of {limits.max_members} "
            "(raise it with max_members / --max-members)"
        )
    total = sum(m.file_size for m in members)
    packed = sum(m.compress_size for m in members)
    if total > limits.max_bytes:
        raise LoadError(
            f"{where}: members expand to {total} bytes, over the limit of {limits.max_bytes} "
            "(raise it with max_bytes / --max-bytes)"
        )
    for name, size, small in [(m.filename, m.file_size, m.compress_size) for m in members] + [
        ("the archive as a whole", total, packed)
    ]:
        if size > limits.ratio_floor and size > limits.max_ratio * max(small, 1):
            raise LoadError(
                f"{where}: member {name!r} expands {size / max(small, 1):.0f} times "
                f"(limit {limits.max_ratio:g}); a zip bomb? (raise it with max_ratio / --max-ratio)"
            )
    return members


def _torch_load(data: bytes, where: str) -> torch.export.ExportedProgram:
    """``torch.export.load`` on the bytes read; one ``LoadError`` for any failure, and torch's
    own log records (a traceback, then a vaguer error) kept off the user's handlers."""
    caught = _Caught()
    logger = logging.getLogger("torch.export")
    handlers, propagate = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [caught], False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.load(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001 - torch raises many kinds for a file that is not a program
        cause = caught.errors[0] if caught.errors else err
        text = " ".join(str(cause).split()).split(". ")[0]
        raise LoadError(
            f"{where}: not a program saved with torch.export.save ({type(cause).__name__}: "
            f"{shorten(text, 200)})"
        ) from None
    finally:
        logger.handlers, logger.propagate = handlers, propagate
    if not isinstance(ep, torch.export.ExportedProgram):
        raise LoadError(f"{where}: holds a {type(ep).__name__}, not an ExportedProgram")
    return ep


class _Caught(logging.Handler):
    """Keeps the exceptions of the log records it is handed, and writes nothing."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


# --- the scan -------------------------------------------------------------------------------------

_FIXED = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"}
_WEIGHTS, _CONSTANTS = "data/weights/", "data/constants/"
_MODELS, _SAMPLES, _EXTRA = "models/", "data/sample_inputs/", "extra/"
_WEIGHTS_CONFIG, _CONSTANTS_CONFIG = "_weights_config.json", "_constants_config.json"
_TENSOR_PREFIX = "tensor_"


def _refuse(where: str, member: str, what: str) -> UntrustedProgramError:
    return UntrustedProgramError(
        f"{where}: member {member!r} {what}; loading it could run code from the file: {_OPT_IN}"
    )


def _scan(
    archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], where: str, limits: Limits
) -> None:
    """Refuse the archive unless every member is part of a plain program that torch loads
    without unpickling, ``eval`` or compiled code. O(size of the members read)."""
    names = [m.filename for m in members]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise LoadError(f"{where}: member {dup!r} appears twice; the archive is corrupt")
    root = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
    if not root or any(not n.startswith(root) for n in names):
        raise LoadError(
            f"{where}: not a program saved with torch.export.save (no single top folder)"
        )
    local = {n[len(root):]: n for n in names}
    if "archive_version" not in local:
        raise _refuse(where, root, "has no archive_version (an older or foreign format)")
    raw: set[str] = set()  # raw tensor payloads named by the configs
    configs = set()
    for name, full in local.items():
        for folder, config in ((_WEIGHTS, _WEIGHTS_CONFIG), (_CONSTANTS, _CONSTANTS_CONFIG)):
            if name.startswith(folder) and name.endswith(config):
                constants = folder == _CONSTANTS
                raw |= _check_payload_config(archive, full, where, folder, constants=constants)
                configs.add(name)
    for name, full in local.items():
        if name in _FIXED or name in raw or name in configs or name.startswith(_EXTRA):
            continue
        if name.startswith(_MODELS) and name.endswith(".json"):
            _check_model(_read_json(archive, full, where), full, where)
        elif name.startswith(_SAMPLES) and name.endswith(".pt"):
            _check_sample_inputs(archive.read(full), full, where, limits)
        elif name.endswith((".pt", ".pkl", ".pickle")) or "/data.pkl" in name:
            raise _refuse(where, full, "is a pickle (legacy weights or a torch.save file)")
        elif name.startswith("data/aotinductor/"):
            raise _refuse(where, full, "is AOTInductor compiled code")
        else:
            raise _refuse(where, full, "is not part of a plain exported program")


def _read_json(archive: zipfile.ZipFile, member: str, where: str) -> Any:
    try:
        return json.loads(archive.read(member))
    except (ValueError, RecursionError, UnicodeDecodeError) as err:
        raise LoadError(f"{where}: member {member!r} is not valid JSON ({err})") from None


def _check_payload_config(
    archive: zipfile.ZipFile, member: str, where: str, folder: str, *, constants: bool
) -> set[str]:
    """The raw tensor members a weights/constants config names; refuses pickled entries."""
    config = _read_json(archive, member, where)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise LoadError(f"{where}: member {member!r} has no 'config' table; the archive is corrupt")
    root = member[: member.index(folder)]
    raw = set()
    for fqn, entry in entries.items():
        path_name = entry.get("path_name") if isinstance(entry, dict) else None
        if not isinstance(path_name, str):
            raise LoadError(f"{where}: entry {fqn!r} of {member!r} has no path_name")
        payload = f"{root}{folder}{path_name}"
        if entry.get("use_pickle") is not False:
            raise _refuse(where, payload, f"holds {fqn!r} pickled (use_pickle)")
        if constants and not path_name.startswith(_TENSOR_PREFIX):
            raise _refuse(where, payload, f"holds {fqn!r} as a custom or opaque object")
        raw.add(f"{folder}{path_name}")
    return raw


def _check_sample_inputs(data: bytes, member: str, where: str, limits: Limits) -> None:
    """Sample inputs must load with ``weights_only=True`` (torch falls back to unpickling); the
    ``torch.save`` archive they are is held to the same limits (a bomb may nest)."""
    if not data:
        return
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            _check_limits(inner, f"{where}: member {member!r}", limits)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        raise _refuse(
            where, member, "holds sample inputs that are not a torch.save archive"
        ) from None
    try:
        torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - anything the restricted unpickler rejects
        raise _refuse(
            where, member, "holds sample inputs that do not load with weights_only=True"
        ) from None


# --- the model JSON -------------------------------------------------------------------------------


def _check_model(model: Any, member: str, where: str) -> None:
    """Every node target must resolve to an operator, every shape expression be arithmetic."""
    for value in _walk(model):
        if not isinstance(value, dict):
            continue
        target = value.get("target")
        if isinstance(target, str) and "inputs" in value and "outputs" in value:
            _check_target(target, member, where)
        operator_arg = value.get("as_operator")
        if isinstance(operator_arg, str):
            _check_target(operator_arg, member, where)
        expr = value.get("expr_str")
        if isinstance(expr, str):
            _check_expression(expr, member, where)


def _walk(tree: Any) -> Iterator[Any]:
    """Every value in a JSON tree, iteratively (a deep tree must not overflow the stack)."""
    stack = [tree]
    while stack:
        value = stack.pop()
        yield value
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


_FILE_ARGUMENTS = {"filename", "path", "file", "f"}


def _check_target(target: str, member: str, where: str) -> None:
    """Resolve ``target`` as torch's deserializer does, refusing what is not an operator."""
    if target.startswith("#"):
        raise _refuse(where, member, f"calls extension target {target!r}")
    bases = (("_operator", operator), ("torch", torch), ("math", math))
    base = next((mod for prefix, mod in bases if target.startswith(prefix)), None)
    if base is None:
        return  # torch leaves it a string and fails to load the program
    obj: Any = base
    for part in target.split(".")[1:]:
        if part.startswith("__"):
            raise _refuse(where, member, f"calls {target!r}, which is not an operator")
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return  # torch leaves it a string and fails to load the program
    found = ops.facts(obj)
    if found.kind == ops.HOP:
        return
    if found.kind == ops.OVERLOAD:
        if any(p.name in _FILE_ARGUMENTS and p.type == "str" for p in found.params):
            raise _refuse(where, member, f"calls {target!r}, an operator that opens files")
        return
    scalar = found.kind == ops.FUNCTION and (found.size_arithmetic or found.getitem)
    if not (scalar or obj is operator.matmul):  # Python's arithmetic, torch's sym_* functions
        raise _refuse(where, member, f"calls {target!r}, which is not an operator")


_MISSING = object()
_SYMPY_CALLS = frozenset({  # the functions torch prints in shape expressions
    "Max", "Min", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan",
    "LessThan", "GreaterThan", "And", "Or", "Not", "Xor", "ITE", "Piecewise", "floor", "ceiling",
    "Abs", "Mod", "sqrt", "Integer", "Float", "Rational", "Symbol", "Pow", "FloorDiv",
    "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "IntTrueDiv", "FloatTrueDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
    "OpaqueUnaryFn_sqrt", "Mul", "Add", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or", "TrueDiv",
})
_EXPRESSION_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.Name,
    ast.Constant, ast.Tuple, ast.Load, ast.keyword, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)
_BUILTINS = frozenset(dir(builtins))


def _check_expression(text: str, member: str, where: str) -> None:
    """A shape expression (``sympy.sympify`` evaluates it) must be arithmetic on symbols."""
    shown = shorten(text, 80)
    bad = _refuse(where, member, f"holds shape expression {shown!r}, which is not arithmetic")
    if len(text) > 10_000:
        raise bad
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise bad from None
    names = {id(c.args[0]) for c in ast.walk(tree) if _is_symbol_call(c)}  # Symbol('s0', ...)
    for node in ast.walk(tree):
        if not isinstance(node, _EXPRESSION_NODES):
            raise bad
        if isinstance(node, ast.Name) and (node.id.startswith("_") or node.id in _BUILTINS):
            raise bad
        if isinstance(node, ast.Call) and not _is_plain_call(node):
            raise bad
        if isinstance(node, ast.keyword) and not (
            isinstance(node.value, ast.Constant) and isinstance(node.value.value, (bool, int))
        ):
            raise bad
        if (
            isinstance(node, ast.Constant)
            and not isinstance(node.value, (int, float, bool))
            and not (id(node) in names and str(node.value).isidentifier())
        ):
            raise bad
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Pow)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.right, ast.Constant)
        ):
            raise bad  # a power of literals is never printed by torch; 9**9**9 never ends


def _is_plain_call(node: ast.Call) -> bool:
    """A call of a known sympy function by name, keywords (if any) named plainly."""
    return (
        isinstance(node.func, ast.Name)
        and node.func.id in _SYMPY_CALLS
        and all(k.arg is not None and not k.arg.startswith("_") for k in node.keywords)
    )


def _is_symbol_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Symbol"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
    )
