"""A timed run on one torch thread, the caller's thread count given back after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(1)`` (timings not spread over the cores) and
    restore the caller's count afterwards, raised or not: a bench run in the test suite's
    worker leaves it the share of the cores the suite gave it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
