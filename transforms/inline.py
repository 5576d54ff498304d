"""Inlining at its public path, ``transforms.inline``: ``inline`` (the pass, the inverse of
``outline``), ``inline_with_calls`` and ``restacked`` (each node's chain of calls, and its module
stack rebuilt from them), ``CallChain`` and ``ROOT_STACK_KEY``. They live in
``transforms.passes.inlining``.

A door: it only re-exports, for users; the library imports each name from its home.
"""

from transforms.passes.inlining import (
    ROOT_STACK_KEY,
    CallChain,
    inline,
    inline_with_calls,
    restacked,
)

__all__ = ["ROOT_STACK_KEY", "CallChain", "inline", "inline_with_calls", "restacked"]
