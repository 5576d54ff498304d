"""``parse_program``: the inverse of ``ir.format_program``, so a test can state a Program as text.

The text is the printer's (``ir/printer.py``). Law: ``parse_program(format_program(p), like=p) ==
p`` (``==`` ignores node meta; the parser makes none but ``val``). Three things exist only as
objects and are printed as descriptions, so the parser cannot spell them:

- **tensors**: with ``like`` given, each tensor key is looked up in ``like.tensors`` (the printed
  description must match); without it, every key gets a placeholder: ``torch.zeros`` of the
  printed shape and dtype (an ``nn.Parameter`` for a printed ``Parameter``, requiring grad as the
  slot says). Placeholder tensors are new objects, and the tensor table compares by identity
  (``Opaque``), so two parses of one text are ``==`` only up to their tensor tables: parse the
  Expected text of a test ``like=`` the Before program to share the tensors;
- **script objects** (custom objects): only with ``like``.

**Symbolic sizes.** The ``range constraints:`` section lists symbols as ``NAME in [LOW, HIGH]
# hint=N`` (``int_oo`` for an open end; the hint only where vals are printed), and a
``symbols:`` section, in the same form, the other symbols the vals name. The parser makes one
shape env with those symbols (``ir.torch_seam.new_symbolic_sizes``: same names, hints and
ranges) and reads each size of a val (``s26``, ``4*s26``, ``Min(4, s26)``, ``(s26//2)``) as a
``SymInt`` of it; the program's ``range_constraints`` are the listed ones (``like``'s, with
``like``). An old text's ``range constraints: N (opaque)`` line is read as before: the
constraints come from ``like``, else there are none.

A node line may end in ``  # VAL``, its ``meta["val"]`` as ``format_program(p)`` prints it
by default (``ir.printer.format_val``): the node gets that val back, tensors as ``FakeTensor``s of
the printed dtype, sizes, strides and device made under one fake mode per text, so the parsed
program runs (``lower``, the laws) as the printed one did. Without the comment a node has no
meta.

Hand-written texts may leave out what the printer always writes: any section, a module's
``[kind]`` (``module``) and ``id=`` (its path, ``<root>`` for the root).

A target is resolved from its printed name without importing arbitrary code: aten and other
``torch.ops`` overloads by namespace, functions by dotted name from modules already imported
(purefx's own packages, ``torch`` and the standard ``operator``/``builtins``/``math`` modules are
imported on demand). Errors are ``ParseError`` naming the line.
"""

from __future__ import annotations

import ast
import importlib
import io
import itertools
import math
import operator
import re
import sys
import tokenize
from collections.abc import Iterator
from typing import Any

import attrs
import torch
from pyrsistent import pmap

from ir import ops
from ir.args import IDict, IList, ISlice, ref
from ir.errors import PurefxError
from ir.graph import Graph
from ir.module import PLAIN, Module
from ir.names import target_name
from ir.node import CALL_FUNCTION, OUTPUT, PLACEHOLDER, Node, frozen_meta
from ir.printer import contiguous_strides
from ir.program import NO_CONSTRAINTS, Program
from ir.signature import ArgSpec, CallSignature, ExportSignature, InputSpec, OutputSpec
from ir.state import Opaque, Slot
from ir.torch_seam import new_fake_mode, new_symbolic_sizes, pytree

__all__ = ["ParseError", "parse_program"]


class ParseError(PurefxError, ValueError):
    """Text that ``parse_program`` cannot read back; the message names the line."""


def parse_program(text: str, *, like: Program | None = None) -> Program:
    """Read the text of ``ir.format_program`` back into a ``Program``.

    Parameters:
        text: a program as ``format_program`` prints it (or written by hand in that form).
        like: a Program to take tensors, script objects and range constraints from (by key);
            without it, tensors are zero placeholders of the printed shape and dtype.

    Returns:
        The Program. Node meta is empty except ``val`` where the node line prints one
        (``format_program(p)`` prints them; ``vals=False`` does not); modules not reachable
        from the root are not in the text, hence not in the result.

    Raises:
        ParseError: naming the line (number and text) and what was expected there.

    **Laws:** ``parse_program(format_program(p), like=p) == p``;
    ``format_program(parse_program(t)) == t`` for a printed ``t`` without script objects or
    opaque range constraints; ``parse_program(format_program(p))`` gives every node whose
    val prints a val of the same structure, dtypes, sizes (symbolic ones: same expressions,
    symbols, hints and ranges), strides and devices, and has ``p``'s range constraints by
    name and bounds.

    Complexity: O(size of the text).
    """
    return _Reader(text, like).program()


_REF_MARK = "__purefx_ref__"
_KNOWN_ROOTS = (
    "ir", "transforms", "lowering", "torch", "operator", "_operator", "builtins", "math",
)
_NAMED_FLOATS = {"inf": math.inf, "nan": math.nan}
_DESCRIPTION = re.compile(r"<(\w+)(?: \(([\d, ]*)\) (torch\.\w+))?>")
_STATE_LINE = re.compile(
    r"(\S+): (\w+) (<[^>]*>)(?: = (\S+))?( non-persistent)?( requires_grad)?"
)
_MODULE_LINE = re.compile(r"(\S+?)(?: \[(\w+)\])?(?: id=(.+))?")


class _Line:
    __slots__ = ("number", "text")

    def __init__(self, number: int, text: str) -> None:
        self.number = number
        self.text = text

    def error(self, what: str) -> ParseError:
        return ParseError(f"line {self.number}: {what}: {self.text.strip()!r}")


class _Reader:
    """Reads the sections of a program text in order (one pass over the lines)."""

    def __init__(self, text: str, like: Program | None) -> None:
        self.lines = [
            _Line(i + 1, t.rstrip()) for i, t in enumerate(text.splitlines()) if t.strip()
        ]
        self.at = 0
        self.like = like
        self.tensors: dict[str, Opaque] = {}
        self.targets: dict[str, Any] = {}  # printed name -> resolved object, for this text
        self.fake_mode: Any = None  # made on the first printed tensor val
        # declared symbols: name -> (line, hint, low, high); those of ``range constraints:``
        self.symbols: dict[str, tuple[_Line, int | None, int, int | None]] = {}
        self.constrained: list[str] = []
        self.symbol_table: dict[str, Any] | None = None  # made with the fake mode
        self.symbol_ranges: dict = {}

    # --- the sections ------------------------------------------------------------------------

    def program(self) -> Program:
        first = self._next()
        if first is None or first.text != "program:":
            raise (first or _Line(1, text="")).error("a program text starts with 'program:'")
        inputs: tuple = ()
        outputs: tuple = ()
        state: dict[str, Slot] = {}
        calls: dict[str, CallSignature] = {}
        call_order: tuple[str, ...] = ("",)
        modules: dict[str, Module] = {}
        while (line := self._peek()) is not None:
            head = line.text
            if head == "  inputs:":
                self.at += 1
                inputs = tuple(self._input(x) for x in self._items(4))
            elif head == "  outputs:":
                self.at += 1
                outputs = tuple(self._output(x) for x in self._items(4))
            elif head == "  state:":
                self.at += 1
                for x in self._items(4):
                    fqn, slot = self._slot(x)
                    if fqn in state:
                        raise x.error(f"state {fqn!r} is listed twice")
                    state[fqn] = slot
            elif head == "  unused tensors:":
                self.at += 1
                for x in self._items(4):
                    key, _, desc = x.text.strip().partition(": ")
                    self._tensor(x, key, desc, requires_grad=False)
            elif head == "  preserved calls:":
                self.at += 1
                self._calls(calls)
            elif head.startswith("  call order: "):
                self.at += 1
                call_order = self._literal(line, head.removeprefix("  call order: "))
                if type(call_order) is not tuple:
                    raise line.error("the call order is a tuple of call names")
            elif head in ("  range constraints:", "  symbols:"):
                self.at += 1
                self._symbols(line, constrained=head == "  range constraints:")
            elif head.startswith("  range constraints: "):  # opaque: only ``like`` has them
                self.at += 1
            elif head.startswith("  module "):
                self._modules(modules)
            else:
                raise line.error("expected a section ('  inputs:', '  module PATH: ...', ...)")
        if not modules:
            raise ParseError("the program text has no 'module <root>: ...' line")
        root = next(iter(modules))
        return Program(
            root=root,
            modules=pmap(modules),
            state=pmap(state),
            state_order=tuple(state),
            tensors=pmap(self.tensors),
            signature=ExportSignature(inputs, outputs),
            call_signatures=pmap(calls),
            call_order=call_order,
            range_constraints=self.like.range_constraints if self.like else self._constraints(),
        )

    def _symbols(self, head: _Line, *, constrained: bool) -> None:
        """The items of a ``range constraints:`` or ``symbols:`` section, ``NAME in [LOW,
        HIGH]  # hint=N`` each (``ir.printer.format_symbol``)."""
        if self.fake_mode is not None:
            raise head.error("symbols are declared before the first node val (the modules)")
        for line in self._items(4):
            text, comment = _split_comment(line.text.strip())
            found = _SYMBOL_LINE.fullmatch(text)
            hint_text = None if comment is None else comment.partition("hint=")[2]
            if found is None or not (comment is None or (comment.startswith("hint=")
                                                         and hint_text.isdigit())):
                raise line.error("a symbol reads 'NAME in [LOW, HIGH]  # hint=N' (s26 in [2, 8]"
                                 "  # hint=2; int_oo for an open end; no hint: no vals)")
            name, low, high = found.groups()
            if name in self.symbols:
                raise line.error(f"symbol {name!r} is declared twice")
            if low == "-int_oo" or high == "-int_oo":
                raise line.error("a size's range starts at an integer")
            bounds = (int(low), None if high == "int_oo" else int(high))
            if bounds[1] is not None and bounds[1] < bounds[0]:
                raise line.error(f"the range of {name!r} is empty")
            hint = None if hint_text is None else int(hint_text)
            self.symbols[name] = (line, hint, *bounds)
            if constrained:
                self.constrained.append(name)

    def _symbol_sizes(self, line: _Line) -> dict[str, Any]:
        """The declared symbols (name -> ``SymInt``, or the sympy symbol of one without a
        hint), made once, with the fake mode every val of the text is made under."""
        if self.symbol_table is None:
            declared = [(name, hint, low, high) for name, (_, hint, low, high) in
                        self.symbols.items()]
            try:
                self.fake_mode, self.symbol_table, self.symbol_ranges = new_symbolic_sizes(
                    declared)
            except ValueError as e:
                bad = next((self.symbols[n][0] for n in self.symbols if repr(n) in str(e)), line)
                raise bad.error(str(e)) from None
        return self.symbol_table

    def _constraints(self) -> Opaque:
        """The declared range constraints, keyed by the symbols the vals use."""
        if not self.constrained:
            return NO_CONSTRAINTS
        self._symbol_sizes(self.symbols[self.constrained[0]][0])
        by_name = {str(k): (k, v) for k, v in self.symbol_ranges.items()}
        return Opaque(dict(by_name[n] for n in self.constrained))

    def _input(self, line: _Line) -> InputSpec:
        words = line.text.split()
        persistent = None
        if words and words[-1].startswith("persistent="):
            persistent = {"persistent=True": True, "persistent=False": False}.get(words.pop())
            if persistent is None:
                raise line.error("persistent= is True or False")
        if len(words) not in (2, 3) or not words[0].startswith("%") or not words[0].endswith(":"):
            raise line.error("an input reads '%NAME: KIND [TARGET] [persistent=BOOL]'")
        target = words[2] if len(words) == 3 else None
        return InputSpec(words[1], words[0][1:-1], target, persistent)

    def _output(self, line: _Line) -> OutputSpec:
        words = line.text.split()
        if words[:2] == ["<literal", "name=''>:"]:
            words[:2] = ["<literal name=''>:"]
        if len(words) not in (2, 3) or not words[0].endswith(":"):
            raise line.error("an output reads '%NAME: KIND [TARGET]' or '<literal>: KIND'")
        head = words[0][:-1]
        if head == "<literal>":
            name = None
        elif head == "<literal name=''>":
            name = ""
        elif head.startswith("%"):
            name = head[1:]
        else:
            raise line.error("an output names a value '%NAME' or '<literal>'")
        return OutputSpec(words[1], name, words[2] if len(words) == 3 else None)

    def _slot(self, line: _Line) -> tuple[str, Slot]:
        found = _STATE_LINE.fullmatch(line.text.strip())
        if found is None:
            raise line.error(
                "a state line reads 'FQN: KIND <Type (shape) dtype> [= KEY] [non-persistent] "
                "[requires_grad]'"
            )
        fqn, kind, desc, key, non_persistent, grad = found.groups()
        key = key or fqn
        self._tensor(line, key, desc, requires_grad=bool(grad))
        return fqn, Slot(kind, key, not non_persistent, bool(grad))

    def _tensor(self, line: _Line, key: str, desc: str, requires_grad: bool) -> None:
        """Put the tensor for ``key`` into the table (once: aliases share it)."""
        if key in self.tensors:
            if repr(self.tensors[key]) != desc:
                raise line.error(f"tensor {key!r} was described as {self.tensors[key]!r} before")
            return
        if self.like is not None:
            held = self.like.tensor_table().get(key)
            if held is None:
                raise line.error(f"tensor {key!r} is not in like's tensor table")
            if repr(held) != desc:
                raise line.error(f"like's tensor {key!r} is {held!r}, not {desc}")
            self.tensors[key] = held
            return
        found = _DESCRIPTION.fullmatch(desc)
        if found is None or found.group(2) is None:
            raise line.error(
                f"{desc} cannot be rebuilt from text (not a tensor); pass like= a program that "
                "holds it"
            )
        type_name, shape_text, dtype_name = found.groups()
        shape = tuple(int(d) for d in shape_text.replace(" ", "").split(",") if d)
        dtype = getattr(torch, dtype_name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise line.error(f"{dtype_name} is not a torch dtype")
        value = torch.zeros(shape, dtype=dtype)
        if type_name == "Parameter":
            value = torch.nn.Parameter(value, requires_grad=requires_grad)
        self.tensors[key] = Opaque(value)

    def _calls(self, calls: dict[str, CallSignature]) -> None:
        for line in self._items(4):
            name = self._literal(line, line.text.strip().removesuffix(":"))
            if type(name) is not str or not line.text.endswith(":"):
                raise line.error("a preserved call starts with its quoted name and ':'")
            fields: dict[str, Any] = {}
            for item in self._items(6):
                key, sep, value = item.text.strip().partition(": ")
                if not sep or key in fields:
                    raise item.error("a call field reads 'KEY: VALUE', each key once")
                fields[key] = (item, value)
            calls[name] = self._call(line, fields)

    def _call(self, line: _Line, fields: dict[str, Any]) -> CallSignature:
        missing = {"inputs", "outputs", "in_spec", "out_spec"} - fields.keys()
        unknown = fields.keys() - {"inputs", "outputs", "in_spec", "out_spec", "forward_arg_names"}
        if missing or unknown:
            raise line.error(f"call fields missing {sorted(missing)}, unknown {sorted(unknown)}")

        def value(key: str) -> Any:
            item, text = fields[key]
            return self._expr(item, text, arg_specs=key in ("inputs", "outputs"))

        names = value("forward_arg_names") if "forward_arg_names" in fields else None
        return CallSignature(
            value("inputs"), value("outputs"), value("in_spec"), value("out_spec"), names
        )

    def _modules(self, modules: dict[str, Module]) -> None:
        """Every ``module`` line and its graphs; children follow the order paths are printed
        in (the printer walks the tree depth first in registration order)."""
        at_path: dict[str, str] = {}
        order: list[tuple[str, str]] = []
        fields: dict[str, dict[str, Any]] = {}
        while (line := self._peek()) is not None and line.text.startswith("  module "):
            self.at += 1
            path_text, sep, rest = line.text.removeprefix("  module ").partition(": ")
            if not sep:
                raise line.error("a module line reads 'module PATH: TYPE [KIND] id=ID'")
            path = "" if path_text == "<root>" else path_text
            if path in at_path:
                raise line.error(f"module path {path_text!r} is printed twice")
            if not at_path and path:
                raise line.error("the first module is the root, '<root>'")
            if rest.startswith("same object as "):
                other = rest.removeprefix("same object as ")
                mid = at_path.get("" if other == "<root>" else other)
                if mid is None or self._nested():
                    raise line.error(f"'same object as' names {other!r}, not printed before")
            else:
                mid = self._module(line, rest, path, fields)
            at_path[path] = mid
            order.append((path, mid))
        children: dict[str, dict[str, str]] = {mid: {} for mid in fields}
        for path, mid in order[1:]:
            parent_path, _, name = path.rpartition(".")
            parent = at_path.get(parent_path)
            if parent is None:
                raise ParseError(f"module {path!r} is printed before its parent {parent_path!r}")
            kids = children[parent]
            if kids.setdefault(name, mid) != mid:
                raise ParseError(f"module {path!r} names two different modules")
        for mid, f in fields.items():
            kids = tuple(children[mid].items())
            modules[mid] = Module(f["type_name"], f["kind"], kids, f["graphs"], peers=f["peers"])

    def _module(self, line: _Line, rest: str, path: str, fields: dict) -> str:
        found = _MODULE_LINE.fullmatch(rest)
        if found is None:
            raise line.error("a module line reads 'module PATH: TYPE [KIND] id=ID'")
        type_text, kind, mid_text = found.groups()
        mid = self._literal(line, mid_text) if mid_text else (path or "<root>")
        if type(mid) is not str or mid in fields:
            raise line.error(f"module id {mid!r} is not a new string")
        graphs: list[Graph] = []
        peers: list[tuple[str, str]] = []
        for header in self._items(4):
            if header.text.startswith("    peer ") and not graphs:
                peers.append(self._peer(header))
                continue
            if header.text.strip() != f"graph {len(graphs)}:":
                raise header.error(f"expected 'graph {len(graphs)}:'")
            graphs.append(Graph.of(self._node(x) for x in self._items(6)))
        fields[mid] = {
            "type_name": None if type_text == "?" else type_text,
            "kind": kind or PLAIN,
            "graphs": tuple(graphs),
            "peers": tuple(peers),
        }
        return mid

    def _peer(self, line: _Line) -> tuple[str, str]:
        name, sep, rest = line.text.strip().removeprefix("peer ").partition(": id=")
        peer = self._literal(line, rest) if sep else None
        if not name.isidentifier() or type(peer) is not str:
            raise line.error("a peer line reads 'peer NAME: id=ID'")
        return name, peer

    def _node(self, line: _Line) -> Node:
        text, val_text = _split_comment(line.text.strip())
        node = self._bare_node(line, text)
        if val_text is None:
            return node
        return attrs.evolve(node, meta=frozen_meta({"val": self._val(line, self._ast(line, val_text))}))

    def _val(self, line: _Line, node: ast.expr) -> Any:
        """A ``meta["val"]`` as ``ir.printer.format_val`` writes it."""
        if isinstance(node, ast.Tuple):
            return tuple(self._val(line, e) for e in node.elts)
        if isinstance(node, ast.List):
            return [self._val(line, e) for e in node.elts]
        if _names_a_size(node):  # ``s26``, ``4*s26``, ``Min(4, s26)``: a ``SymInt``
            return self._size(line, node)
        if isinstance(node, (ast.Constant, ast.UnaryOp)) or (
            isinstance(node, ast.Name) and node.id in _NAMED_FLOATS
        ):  # a number, ``None`` or a string, read as an argument is
            return self._value(line, node)
        keywords: dict[str, Any] = {}
        if isinstance(node, ast.Call) and not node.args:
            keywords = {k.arg: k.value for k in node.keywords}
            node = node.func
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
            raise line.error(f"{ast.unparse(node)!r} is not a val ('float32[2, 3]', ...)")
        if set(keywords) - {"stride", "device"}:
            raise line.error("a tensor val takes only stride= and device=")
        dtype = getattr(torch, node.value.id, None)
        if not isinstance(dtype, torch.dtype):
            raise line.error(f"{ast.unparse(node)!r} is not 'DTYPE[SIZES]'")
        sizes = self._sizes(line, node.slice)
        strides = contiguous_strides(sizes)
        if "stride" in keywords:
            strides = self._sizes(line, keywords["stride"])
            if not isinstance(keywords["stride"], ast.Tuple) or len(strides) != len(sizes):
                raise line.error(f"stride={ast.unparse(keywords['stride'])} does not match "
                                 f"sizes {ast.unparse(node.slice)}")
        device = self._literal(line, ast.unparse(keywords["device"])) if "device" in keywords \
            else "cpu"
        if self.fake_mode is None:
            if self.symbols:
                self._symbol_sizes(line)
            else:
                self.fake_mode = new_fake_mode()
        try:
            with self.fake_mode:
                return torch.empty_strided(sizes, strides, dtype=dtype, device=device)
        except (RuntimeError, ValueError, TypeError) as e:
            raise line.error(f"cannot make the val ({e})") from None

    def _sizes(self, line: _Line, node: ast.expr) -> tuple:
        """The sizes (or strides) of a tensor val: a tuple of sizes, or one size."""
        if isinstance(node, ast.Tuple):
            return tuple(self._size(line, e) for e in node.elts)
        return (self._size(line, node),)

    def _size(self, line: _Line, node: ast.expr) -> Any:
        """One size as ``ir.printer.format_size`` writes it: an integer, or an expression of
        the declared symbols (``+ - * // **``, ``Min``, ``Max``, ``Mod``, ``FloorDiv``)
        evaluated to a ``SymInt`` of the text's shape env."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in self.symbols:
                raise line.error(f"size symbol {node.id!r} is not declared (list it under "
                                 "'  range constraints:' or '  symbols:' as 'NAME in [LOW, "
                                 "HIGH]  # hint=N')")
            found = self._symbol_sizes(line)[node.id]
            if not isinstance(found, torch.SymInt):
                raise line.error(f"size symbol {node.id!r} has no hint (declare it with "
                                 "'  # hint=N')")
            return found
        try:
            if isinstance(node, ast.UnaryOp) and type(node.op) in _SIZE_SIGNS:
                return _SIZE_SIGNS[type(node.op)](self._size(line, node.operand))
            if isinstance(node, ast.BinOp) and type(node.op) in _SIZE_OPERATORS:
                left, right = self._size(line, node.left), self._size(line, node.right)
                return _SIZE_OPERATORS[type(node.op)](left, right)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in _SIZE_CALLS and len(node.args) == 2
                    and not node.keywords):
                left, right = (self._size(line, a) for a in node.args)
                return _SIZE_CALLS[node.func.id](left, right)
        except (RuntimeError, ValueError, TypeError, ZeroDivisionError) as e:
            raise line.error(f"cannot compute the size {ast.unparse(node)!r} ({e})") from None
        raise line.error(f"{ast.unparse(node)!r} is not a size (an integer or an expression of "
                         "size symbols)")

    def _bare_node(self, line: _Line, text: str) -> Node:
        if text.startswith("return"):
            name, body = "output", text.removeprefix("return")
            if body.startswith("["):
                name, sep, body = body[1:].partition("]")
                if not sep:
                    raise line.error("an output reads 'return[NAME] VALUE'")
            if not body.startswith(" "):
                raise line.error("an output reads 'return VALUE'")
            return Node(OUTPUT, name, "output", (self._expr(line, body.strip()),))
        found = re.fullmatch(r"%(\w+) = (\w+)(.*)", text)
        if found is None:
            raise line.error("a node reads '%NAME = OP[TARGET](ARGS)' or 'return VALUE'")
        name, op, rest = found.groups()
        if op == PLACEHOLDER and not rest:
            return Node(PLACEHOLDER, name, name)
        end = rest.find("](")
        if not rest.startswith("[") or end < 0 or not rest.endswith(")"):
            raise line.error("a node reads '%NAME = OP[TARGET](ARGS)'")
        target_text = rest[1:end]
        target = self._target(line, target_text) if op == CALL_FUNCTION else target_text
        args, kwargs = self._call_args(line, rest[end + 2 : -1])
        return Node(op, name, target, args, kwargs)

    # --- expressions -------------------------------------------------------------------------

    def _call_args(self, line: _Line, text: str) -> tuple[tuple, IDict]:
        call = self._ast(line, f"_({text})")
        if not isinstance(call, ast.Call) or any(isinstance(a, ast.Starred) for a in call.args):
            raise line.error("arguments are values and NAME=value pairs")
        if any(k.arg is None for k in call.keywords):
            raise line.error("'**' is not an argument")
        args = tuple(self._value(line, a) for a in call.args)
        kwargs = IDict(tuple((k.arg, self._value(line, k.value)) for k in call.keywords))
        return args, kwargs

    def _expr(self, line: _Line, text: str, arg_specs: bool = False) -> Any:
        tree = self._ast(line, text)
        if arg_specs:
            if not isinstance(tree, ast.Tuple):
                raise line.error("a call's inputs/outputs are a tuple")
            return tuple(self._arg_spec(line, e) for e in tree.elts)
        return self._value(line, tree)

    def _literal(self, line: _Line, text: str) -> Any:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise line.error(f"{text!r} is not a Python literal") from None

    def _ast(self, line: _Line, text: str) -> ast.expr:
        try:
            return ast.parse(_mark_refs(text), mode="eval").body
        except (SyntaxError, tokenize.TokenError, IndentationError) as e:
            raise line.error(f"cannot read the expression ({e.msg if hasattr(e, 'msg') else e})")

    def _value(self, line: _Line, node: ast.expr) -> Any:
        """An argument tree: ``%x`` refs, tuples, ``[...]`` IList, ``{...}`` IDict, literals,
        dotted names (operators, dtypes, ...), ``slice``/``device``/``torch.Size``, specs."""
        value = self._value
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Tuple):
            return tuple(value(line, e) for e in node.elts)
        if isinstance(node, ast.List):
            return IList(tuple(value(line, e) for e in node.elts))
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise line.error("'**' is not a dict entry")
            pairs = zip(node.keys, node.values)
            return IDict(tuple((value(line, k), value(line, v)) for k, v in pairs))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = value(line, node.operand)
            if type(inner) not in (int, float):
                raise line.error("a sign applies to a number")
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.Name) and node.id.startswith(_REF_MARK):
            return ref(node.id.removeprefix(_REF_MARK))
        if isinstance(node, ast.Name) and node.id in _NAMED_FLOATS:
            return _NAMED_FLOATS[node.id]
        if isinstance(node, ast.Name) and node.id == "leaf":
            return pytree.treespec_leaf()
        if isinstance(node, (ast.Name, ast.Attribute)):
            return self._target(line, _dotted(line, node))
        if isinstance(node, ast.Call):
            return self._constructor(line, node)
        raise line.error(f"{ast.unparse(node)!r} is not an argument value")

    def _constructor(self, line: _Line, node: ast.Call) -> Any:
        callee = _dotted(line, node.func)
        if callee == "tree":
            return self._spec(line, node)
        if any(k.arg is None for k in node.keywords):
            raise line.error("'**' is not an argument")
        args = [self._value(line, a) for a in node.args]
        kwargs = {k.arg: self._value(line, k.value) for k in node.keywords}
        if callee == "slice" and not kwargs and len(args) == 3:
            return ISlice(*args)
        if callee == "device":
            return torch.device(*args, **kwargs)
        if callee == "torch.Size" and not kwargs and len(args) == 1 and type(args[0]) is IList:
            return torch.Size(args[0].items)
        raise line.error(f"{callee}(...) is not a value the printer writes")

    def _spec(self, line: _Line, node: ast.Call) -> Any:
        if node.keywords or len(node.args) not in (2, 3) or not isinstance(node.args[1], ast.List):
            raise line.error("a spec reads 'tree(TYPE, [CHILDREN], CONTEXT)' or 'leaf'")
        kind = self._type(line, node.args[0])
        children = [self._value(line, c) for c in node.args[1].elts]
        if not all(isinstance(c, pytree.TreeSpec) for c in children):
            raise line.error("the children of a spec are specs")
        context = None
        if len(node.args) == 3:
            raw = node.args[2]
            if isinstance(raw, (ast.Name, ast.Attribute)):
                context = self._type(line, raw)
            else:
                context = self._literal(line, ast.unparse(raw))
        return pytree.TreeSpec(kind, context, children)

    def _type(self, line: _Line, node: ast.expr) -> Any:
        name = _dotted(line, node)
        return _BUILTIN_TYPES.get(name) or self._target(line, name)

    def _arg_spec(self, line: _Line, node: ast.expr) -> ArgSpec:
        if isinstance(node, ast.Name) and node.id.startswith(_REF_MARK):
            return ArgSpec("tensor", node.id.removeprefix(_REF_MARK))
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise line.error("a call argument reads '%NAME' or 'KIND(%NAME, value=V)'")
        name = None
        if node.args:
            first = node.args[0]
            if len(node.args) > 1 or not (
                isinstance(first, ast.Name) and first.id.startswith(_REF_MARK)
            ):
                raise line.error("a call argument names at most one value '%NAME'")
            name = first.id.removeprefix(_REF_MARK)
        value = None
        for k in node.keywords:
            if k.arg == "value":
                value = self._value(line, k.value)
            elif k.arg == "name" and name is None:
                name = self._literal(line, ast.unparse(k.value))
            else:
                raise line.error("a call argument takes only name= and value=")
        return ArgSpec(node.func.id, name, value)

    def _target(self, line: _Line, name: str) -> Any:
        """The object printed as ``name`` (checked: it prints as ``name`` again)."""
        if name in self.targets:
            return self.targets[name]
        found = _resolve(name)
        if found is None:
            raise line.error(
                f"cannot resolve {name!r}: import the module that defines it first (the parser "
                "imports only purefx, torch and the standard operator/builtins/math modules)"
            )
        if target_name(found) != name and str(found) != name:
            raise line.error(f"{name!r} resolves to an object printed as {target_name(found)!r}")
        self.targets[name] = found
        return found

    # --- lines -------------------------------------------------------------------------------

    def _peek(self) -> _Line | None:
        return self.lines[self.at] if self.at < len(self.lines) else None

    def _next(self) -> _Line | None:
        line = self._peek()
        self.at += line is not None
        return line

    def _items(self, indent: int) -> Iterator[_Line]:
        """The lines from here on at exactly ``indent`` spaces, one at a time (the caller reads
        each item's deeper lines before asking for the next)."""
        pad = " " * indent
        while (line := self._peek()) is not None and line.text.startswith(pad):
            if line.text.startswith(pad + " "):
                raise line.error(f"expected {indent} spaces of indentation")
            self.at += 1
            yield line

    def _nested(self) -> bool:
        line = self._peek()
        return line is not None and line.text.startswith("    ")


_BUILTIN_TYPES = {"tuple": tuple, "list": list, "dict": dict}
_SYMBOL_LINE = re.compile(r"([su]\d+) in \[(-?\d+|-?int_oo), (-?\d+|-?int_oo)\]")
_SIZE_SIGNS = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_SIZE_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                   ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_SIZE_CALLS = {"Min": torch.sym_min, "Max": torch.sym_max, "Mod": operator.mod,
               "FloorDiv": operator.floordiv}


def _names_a_size(node: ast.expr) -> bool:
    """Whether a val's text is a size expression: it names something other than a named float
    (a size symbol), outside a tensor's ``DTYPE[...]``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in _SIZE_CALLS
    if not isinstance(node, (ast.Name, ast.BinOp, ast.UnaryOp)):
        return False
    return any(isinstance(n, ast.Name) and n.id not in _NAMED_FLOATS for n in ast.walk(node))


def _dotted(line: _Line, node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(line, node.value)}.{node.attr}"
    raise line.error(f"{ast.unparse(node)!r} is not a dotted name")


def _resolve(name: str) -> Any:
    """The object at dotted ``name``: an attribute path from the longest imported module prefix,
    else a ``torch.ops`` namespace path (``aten.add.Tensor``); ``None`` when neither exists."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        module = sys.modules.get(module_name)
        if module is None and parts[0] in _KNOWN_ROOTS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                module = None
        if module is not None:
            found = ops.attribute_path(module, parts[cut:])
            if found is not None:
                return found
    if parts[0] not in _KNOWN_ROOTS and len(parts) >= 2:
        return ops.attribute_path(torch.ops, parts)
    return None


def _split_comment(text: str) -> tuple[str, str | None]:
    """A node line without its trailing ``# VAL`` comment, and the comment's text (``None``
    without one); a ``#`` inside a string is text."""
    if "#" not in text:
        return text, None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text, None
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            col = tok.start[1]
            return text[:col].rstrip(), tok.string[1:].strip()
    return text, None


def _mark_refs(text: str) -> str:
    """``%name`` (not valid Python) becomes a marked identifier; ``%`` inside strings stays."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    cuts = [
        tok.start[1]
        for tok, nxt in itertools.pairwise(tokens)
        if tok.type == tokenize.OP and tok.string == "%" and nxt.type == tokenize.NAME
        and nxt.start == tok.end
    ]
    for col in reversed(cuts):
        text = text[:col] + _REF_MARK + text[col + 1 :]
    return text
