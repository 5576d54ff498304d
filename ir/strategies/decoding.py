"""How a generated program's bytes become its choices.

``ir.strategies.programs`` draws a few fixed-size byte strings per program (hypothesis spends
about 70 us per draw, so the number of draws, not their decoding, sets the rate) and decodes
each totally: every byte string is a program, a zeroed byte is the simplest choice, and every
choice is taken modulo what is available where it is used. This module is that decoding: the
sizes of the byte strings, a body step's three bytes (:func:`decode_step`), their scattering
with the program's mix (:func:`scattered`), back-offsets (:func:`back`) and the salts that keep
one choice's hash apart from another's.
"""

from __future__ import annotations

import functools

from hypothesis import strategies as st

from ir.args import Ref
from ir.strategies.opset_steps import scatter

STEP = 3
"""Bytes per body step (see :func:`decode_step`)."""

RECORD = 7
"""Bytes per module object (see ``programs._Decoder._objects``)."""

HEADER_BYTES = st.binary(min_size=6, max_size=6)
"""The program's header: batch, the state's seed (two bytes), the user inputs and keywords."""

OUTPUT_BYTES = st.binary(min_size=4, max_size=4)
"""The outputs' structure and back-offsets."""

REGION_BYTES = st.binary(min_size=2, max_size=2)
"""Where a ``grad_regions`` run starts and how long it is."""

OPSET_STEP_BYTES = st.binary(min_size=4, max_size=4)
"""An opset step: its row (with the program's seed), its sample, its arguments' seed and choices."""

MOTIF_BYTES = st.binary(min_size=4 * 6, max_size=4 * 6)
"""Place and step bytes of the root's motif steps, four per motif (six motifs' worth)."""

MOTIF_SALT = 16381
"""Salt of a motif's place and step past :data:`MOTIF_BYTES` (``programs._Decoder._draw_body``)."""

LONE_SALT = 8191
"""Salt of ``programs._Decoder._lone``'s hash (apart from the steps' own scattering)."""

EDGE_SALT = 4099
"""Salt of the ``edge_operands`` step's choices (scattered with the body's mix)."""


@functools.cache
def count(most: int, least: int = 0) -> st.SearchStrategy[int]:
    """A count in ``[least, most]`` (memoized per bounds). O(1)."""
    return st.integers(least, most)


@functools.cache
def body_bytes(most: int) -> st.SearchStrategy[bytes]:
    """A body's bytes: its step count, then :data:`STEP` bytes for each of ``most`` steps
    (fixed size: shrinking the count never misaligns the steps after it). O(1)."""
    return st.binary(min_size=1 + STEP * most, max_size=1 + STEP * most)


def decode_step(a: int, b: int, c: int) -> tuple[int, ...]:
    """``(is_call, kind, x, y, z)`` from three bytes (``(0, 0, 0)`` is skipped by the caller).

    ``is_call``: call a child (when the module has one) instead of an op; ``kind``: which op
    among those available here; ``x``: back-offset of the first operand; ``y``, ``z``: the
    second operand / op variant / child, each taken modulo what is available. Half the steps
    (bit 7 of ``a`` clear) read one of the two latest values, so chains of ops, and what they
    compute, reach the outputs more often than uniform offsets would let them.
    """
    return (a & 1, c, a >> 1 if a & 128 else a >> 1 & 1, b & 15, b >> 4)


def scattered(step: tuple[int, ...], mix: int, at: int) -> tuple[int, ...]:
    """``step`` with its kind, ``y`` and ``z`` taken from its bytes scattered with the
    body's ``mix`` and its place ``at`` (``is_call`` and the back-offset ``x`` stay as drawn).

    Hypothesis draws small bytes and repeats far more often than others, and how much so
    varies from one run to the next: read as they are, the kinds of a run's steps cluster
    (one seed drew ``gelu`` in 2 programs of 100, another in 25), so a bug that needs one
    kind was caught under some seeds and missed under others. Scattered, every kind is
    about equally likely under every seed. A zeroed step is still skipped by the caller, so
    shrinking still drops steps. O(1)."""
    is_call, kind, x, y, z = step
    h = scatter(mix, at, kind, y, z)
    return is_call, h & 0xFF, x, h >> 8 & 15, h >> 12 & 15


def back(vals: list[Ref], offset: int) -> Ref:
    """The value ``offset`` places back from the most recent one (modulo how many there are)."""
    return vals[-1 - offset % len(vals)]
