"""Strings from a program that generated Python source spells: checked before any source is built.

Lowering writes Python source (``lowering/codegen.py`` through ``torch.fx``, ``lowering/direct.py``,
the forward signatures of ``lowering/modules.py``). A program read from a file is untrusted, and
some of its strings would reach that source as they are: method names, keyword argument names,
the steps of attribute and module paths. ``check_graph`` accepts a graph only if each is spelled
safely:

- method and keyword argument names: ``str.isidentifier()`` and not a keyword;
- steps of a dotted attribute or module path (``layers.0.weight``): an identifier, or a printable
  string without quotes or backslashes (fx spells it ``getattr(m, "0")``);
- keys of dict literals: ``str``, number, bool or ``None`` (spelled by ``repr``).

Anything else raises ``LoweringError`` naming the node, before any source exists, so a crafted
program can never run code by lowering. Node names and placeholder targets need no check: the
code generators never spell them as given (fx and ``lowering/direct.py`` make their own local
names, ``lowering.codegen.to_fx_graph`` gives a placeholder whose target is not an identifier its
local name instead). Other strings are spelled by ``repr``.
"""

from __future__ import annotations

import weakref
from keyword import iskeyword
from typing import Any

from ir.alpha import interned_key
from ir.args import IDict, IList, ISlice
from ir.errors import LoweringError
from ir.graph import Graph
from ir.module import split_call_target
from ir.node import CALL_FUNCTION, CALL_METHOD, CALL_MODULE, GET_ATTR, Node

_UNSAFE_IN_LITERAL = frozenset("\"'\\")


def is_identifier(name: object) -> bool:
    """Whether ``name`` is a ``str`` that Python source can use as a name as it is."""
    return type(name) is str and name.isidentifier() and not iskeyword(name)


def is_path_step(step: object) -> bool:
    """Whether ``step`` (one part of a dotted path) can be spelled in source: an identifier, or a
    non-empty printable string without quotes or backslashes (spelled ``getattr(m, "step")``)."""
    if type(step) is not str or not step:
        return False
    if step.isidentifier():
        return True
    return step.isprintable() and not _UNSAFE_IN_LITERAL.intersection(step)


def check_graph(graph: Graph, where: str) -> None:
    """Raise ``LoweringError`` unless every string of ``graph`` that source spells is safe (see the
    module docstring). ``where`` names the module in the message. O(nodes + keyword arguments)
    once per alpha key (every checked string is part of the key, node names are not), O(1) for
    a graph whose key passed before."""
    key = interned_key(graph)
    if key in _CHECKED:
        return
    for node in graph.nodes:
        _check_node(node, where)
    _CHECKED.add(key)


# Alpha keys of graphs that passed, for as long as some graph has that key.
_CHECKED: weakref.WeakSet = weakref.WeakSet()


def _check_node(node: Node, where: str) -> None:
    op = node.op
    if op == CALL_FUNCTION and (type(node.target) is str or not callable(node.target)):
        raise LoweringError(
            f"node {node.name!r} in {where} calls {node.target!r}, which is not a function; "
            "give call_function nodes the operator or function itself as target"
        )
    if op == CALL_METHOD:
        if not is_identifier(node.target):
            _fail(node, where, "method name", node.target)
    elif op == GET_ATTR or op == CALL_MODULE:
        target = node.target
        path = split_call_target(target)[0] if type(target) is str else target
        if type(path) is not str or not all(map(is_path_step, path.split("."))):
            _fail(node, where, "attribute path", target)
    kwargs = node.kwargs
    if isinstance(kwargs, IDict) and kwargs.items:
        _check_keywords(node, kwargs, where)
        _check_nested_keywords(node, (node.args, kwargs.values()), where)
    else:
        for item in node.args:  # what _check_nested_keywords does, without a call per node
            if type(item) in _NESTING:
                _check_nested_keywords(node, item, where)


def _check_keywords(node: Node, kwargs: IDict, where: str) -> None:
    keys = kwargs.keys()
    for key in keys:
        if not is_identifier(key):
            _fail(node, where, "keyword argument name", key)
    if len(set(keys)) != len(keys):
        _fail(node, where, "repeated keyword argument", keys)


def _check_nested_keywords(node: Node, tree: Any, where: str) -> None:
    """Dict literals inside arguments: their keys are spelled by ``repr``, but only a ``str``,
    number, bool or ``None`` key has a ``repr`` that reads back as itself."""
    kind = type(tree)
    if kind is tuple or kind is IList:
        for item in tree:
            if type(item) in _NESTING:  # other values hold no dict literal
                _check_nested_keywords(node, item, where)
    elif kind is IDict:
        for key, value in tree.items:
            if type(key) not in _KEY_TYPES:
                _fail(node, where, "dict key", key)
            if type(value) in _NESTING:
                _check_nested_keywords(node, value, where)
    elif kind is ISlice:
        _check_nested_keywords(node, (tree.start, tree.stop, tree.step), where)


_NESTING = frozenset({tuple, IList, IDict, ISlice})
_KEY_TYPES = frozenset({str, int, float, bool, type(None)})


def _fail(node: Node, where: str, what: str, value: Any) -> None:
    name = node.name if type(node.name) is str else repr(node.name)
    raise LoweringError(
        f"node {name!r} ({node.op}) of {where} has the {what} {value!r}, which generated Python "
        "code cannot spell safely; a program must use identifiers here (only letters, digits "
        "and '_', not starting with a digit, not a keyword)"
    )
