"""The one exception hierarchy of purefx.

Every error purefx raises on bad input is a ``PurefxError``; its message names the node, module or
argument at fault and says what to do about it.
"""

from __future__ import annotations


class PurefxError(Exception):
    """Base class of every error purefx raises for bad input or an unsupported program."""


class UnsupportedProgramError(PurefxError):
    """``import_ep`` / ``import_graph_module`` met a program it cannot represent faithfully."""


class VerifyError(PurefxError):
    """``verify`` found a Program that is not well formed (names the node or module)."""


class PassError(PurefxError):
    """A transform cannot apply to this Program (names the node or module and why)."""


class EditRefused(PassError):
    """purefx's editor (``transforms.edit.rewrite_nodes``) refused an edit a pass asked for: a
    write left undone, a dynamic size fixed, a value a signature names replaced by one of
    another shape, a node emitted that cannot run. A bug in the pass, not a program it
    declines: ``lowering.pass_laws.check_laws`` reports it as the law ``"edit_refused"``
    whatever its ``allowed_errors`` say of ``PassError``, unless they name ``EditRefused``
    itself."""


class LoweringError(PurefxError):
    """``lower`` cannot build torch modules for this Program."""


class InputError(PurefxError, TypeError):
    """A lowered module was called with inputs that do not match its exported signature."""


class InputConstraintError(PurefxError, RuntimeError):
    """A lowered module's input violates a shape or range constraint of the exported program."""


class LoadError(PurefxError):
    """``load_program`` cannot load this file: not a regular file, over a limit, not a program."""


class UntrustedProgramError(LoadError):
    """``load_program`` refused a file because loading it could run code from it (opt in with
    ``trust=True``, ``purefx --trust``)."""


class ExportError(LoweringError):
    """``export_ep`` cannot express this Program as a ``torch.export.ExportedProgram``."""


class NotAProgramError(PassError, LoweringError):
    """A function that takes a purefx ``Program`` got something else (``ir.program.require_program``
    raises it for passes, ``transform`` and ``lower`` alike)."""


class UnloadedStateError(LoweringError, RuntimeError):
    """A module lowered from a program exported on ``meta`` ran before its state was loaded:
    its tensors were made empty (uninitialized) on the target device, and one was never written
    (``load_state_dict``, ``torch.distributed.checkpoint.load``, an in-place copy)."""


def first_line(exc: BaseException | None, limit: int = 300) -> str:
    """The first line of ``exc``'s message, for quoting one exception inside another message.

    Parameters
    ----------
    exc:
        The exception quoted (``None`` gives ``""``).
    limit:
        The most characters kept.

    Returns
    -------
    The first line of ``str(exc)`` once blank lines and spaces around the message are stripped,
    shortened to about ``limit`` characters between words (:func:`shorten`); ``""`` when the
    message is blank.

    Laws: the result has no newline and at most ``limit`` characters; a one-line message of at
    most ``limit`` characters comes back stripped and otherwise as it is; a longer one is cut
    between words (inside one only where its first word alone is longer than ``limit``).

    Complexity: O(len(str(exc))).
    """
    if exc is None:
        return ""
    lines = str(exc).strip().splitlines()
    return shorten(lines[0], limit) if lines else ""


ELLIPSIS = " ..."
"""What :func:`shorten` puts where it cut a text."""


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, for quoting it.

    A text of at most ``limit`` characters comes back as it is. A longer one keeps its words up
    to the last space that leaves room for :data:`ELLIPSIS`, then ``" ..."``. Only a first word
    longer than the whole room (a hash, a blob: no word to keep) is cut inside, and marked by
    the same ``" ..."``; a limit too small for the marker keeps ``text[:limit]``.

    Laws: ``len(shorten(t, n)) <= n``; ``shorten(t, n) == t`` when ``len(t) <= n``; otherwise,
    where ``t`` has a space within the first ``n - 4`` characters, the result is a prefix of
    ``t`` that ends where a word of ``t`` ends, then ``" ..."``. Complexity: O(len(text)).
    """
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return text[:limit]
    room = limit - len(ELLIPSIS)
    cut = text.rfind(" ", 0, room + 1)
    kept = text[:cut].rstrip() if cut > 0 else ""
    return (kept or text[:room]) + ELLIPSIS


class OperatorFactsError(PurefxError, ValueError):
    """``ir.ops.register_facts`` / ``ir.ops.observe_facts`` cannot take these facts: the target
    is no operator overload, is in the verified table, names an argument its schema lacks, or
    cannot be observed on the arguments given."""
