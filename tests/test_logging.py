"""The library prints nothing: its ``purefx`` logger reaches only the handlers users add."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

from zoo import CASES, export_case  # tests/ is on sys.path (conftest)

from ir import import_ep
from lowering import lower
from transforms import transform


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def bare_logging() -> Iterator[io.StringIO]:
    """Logging as in a program that configured none: no root handlers (pytest adds its own for
    each test phase, so this runs inside the test), and Python's last-resort handler writing to
    a buffer we can read."""
    fallback = io.StringIO()
    root = logging.getLogger()
    saved = logging.lastResort, root.handlers
    logging.lastResort, root.handlers = logging.StreamHandler(fallback), []
    try:
        yield fallback
    finally:
        logging.lastResort, root.handlers = saved


def _run_a_program_that_warns() -> None:
    """``a.leaf`` calls ``norm``, a peer module: a legal export whose module stacks do not nest,
    which the pipeline repairs with a warning on the ``purefx`` logger."""
    lower(transform(import_ep(export_case(CASES["ancestor_sibling"]))))


def test_warnings_never_reach_stderr_by_themselves(capfd):
    with bare_logging() as fallback:
        _run_a_program_that_warns()
    out, err = capfd.readouterr()
    assert fallback.getvalue() == "" and err == "" and out == ""


def test_warnings_reach_a_handler_the_user_adds(capfd):
    seen = _Collect()
    logger = logging.getLogger("purefx")
    logger.addHandler(seen)
    try:
        with bare_logging() as fallback:
            _run_a_program_that_warns()
    finally:
        logger.removeHandler(seen)
    warned = [r for r in seen.records if r.levelno == logging.WARNING]
    assert warned and "do not nest" in warned[0].getMessage()
    assert fallback.getvalue() == "" and capfd.readouterr().err == ""


def test_the_library_logger_has_a_null_handler():
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("purefx").handlers)
