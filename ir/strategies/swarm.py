"""The swarm: which features a generated program switches on, and how often each kind of
step is drawn.

``ir.strategies.programs`` draws a subset of :data:`FEATURES` per program (swarm testing: one
run mixes sparse and dense programs, and shrinking switches features off). Each feature has a
flag byte and is on where that byte reaches its share (:data:`ON_SHARE`: half the draws
unless a row says otherwise); the flags come in three groups, each one byte string drawn
only where one of its features may be on (the first always), so an opt-in feature added
changes no default draw (:data:`FLAG_GROUPS`). The shares of
the steps themselves (the opset's, the lone inputs', the targeted steps', the closing run's
room) are here too: what is drawn is ``ir.strategies.step_kinds`` and
``ir.strategies.vocabulary``; how often is this module.
"""

from __future__ import annotations

from collections.abc import Collection
from fractions import Fraction
from types import MappingProxyType

import attrs
from hypothesis import strategies as st

from ir.strategies.opset_steps import OPSET_FEATURES

FEATURES = (
    "nesting",
    "repeated_calls",
    "shared_modules",
    "tied_parameters",
    "matrices",
    "buffers",
    "non_persistent",
    "constants",
    "inplace_mutation",
    "functional_mutation",
    "input_mutation",
    "preserved_calls",
    "keyword_inputs",
    "pytree_outputs",
    "multi_result_ops",
    "kwargs_ops",
    "divergent_calls",
    "crossing_reads",
    "activations",
    "constant_builders",
    "random_ops",
    "inplace_copies",
    "large_linears",
    "repeated_subexpressions",
    "overwrites",
    "near_duplicates",
    "identities",
    "inplace_ops",
    # the motifs bugs need (state and alias traffic, everyday ops) and values at the edges
    "state_traffic",
    "view_writes",
    "clone_writes",
    "masks",
    "softmax",
    "int_math",
    "output_aliasing",
    # opt-in (drawn from their own bytes, so the default features' draws are as they were)
    "crossing_state",
    "stale_signatures",
    "grad_regions",
    "edge_values",
    # the opset steps (``ir.strategies.opset_steps``), drawn from their own bytes too
    *OPSET_FEATURES,
    # a symbolic batch (with the opset's flags)
    "symbolic_sizes",
    # values at the edges at the operands of ops (a motif, with the opset's flags too)
    "edge_operands",
)
"""Every feature :func:`programs` can switch on (the swarm draws a subset per example)."""

CROSSING_FEATURES = frozenset(
    {"preserved_calls", "crossing_reads", "crossing_state", "functional_mutation"}
)
"""The features :func:`crossing_programs` always switches on: preserved calls, the values and
the state that cross their boundaries outside their signatures, and the functional buffer
updates whose intermediate values ``insert_ivals`` writes back."""

OPT_IN_FEATURES = frozenset({"crossing_state", "stale_signatures", "grad_regions", "edge_values"})
"""Features drawn only when named in ``features`` (or ``always``): the last ones added, so that
``programs()`` draws what it drew before them (the examples the suite's derandomized tests
meet stay the same); and ``grad_regions`` puts nodes in a higher-order-op body, where a pass
written on the root graph does not look; ``edge_values`` puts inf and nan in state, where a
correct pass checked with a tolerance (fake quantization) differs from its input, until the
semantics law says what a tolerance means where the input's own output is not finite. Their
flags are drawn after the others', and only
when one of them may be on."""

OPSET_SHARE = 8
"""The opset's share of the body steps: one in ``OPSET_SHARE`` calls the opset (and it is one
of the kinds the others draw among); a closing run of ``max_ops`` to ``2 max_ops`` opset steps
ends the root's body, cut where the program reaches ``max_nodes`` (the body leaves it
:data:`CLOSING_RESERVE`). One in four made a correct pass of the held-out suite
(``simplify_identities``) change 2 programs of 100: the fixed vocabulary's identities were too
rare."""

DETERMINISTIC_FEATURES = frozenset(FEATURES) - {"random_ops"} - OPT_IN_FEATURES
"""Every feature but ``random_ops`` (and the :data:`OPT_IN_FEATURES`): programs that compute the
same on every call. For a test that compares two runs without seeding them alike
(``lowering.pass_laws`` seeds both sides of its semantics law, and uses every feature)."""


TARGETED_STEPS = 2
"""How many of the targeted features switched on get a step of their own at the root (the
first from a drawn start): two, so the opset's share of the body keeps its room (one for each
of eight features took the 200 default draws from 308-377 operators to 253-320)."""

LONE_INPUT_SHARE = 4
"""One step of the fixed vocabulary in ``LONE_INPUT_SHARE`` (outside preserved calls) reads a
new user input that nothing else reads, as a model's first layer reads its input, instead of
an earlier value. The inputs a program starts with are read by several steps (the first steps
read the latest values), so an op on an input read once, what a pass that treats a placeholder
as an intermediate gets wrong (``relu_`` of a user input), came up only where a far read
landed on an old input: 0 to 4 programs in 100, depending on the seed."""


CLOSING_RESERVE = 3
"""With the opset on, the body's ordinary steps stop at ``max_nodes - max_nodes //
CLOSING_RESERVE`` nodes, so the closing run of opset steps has room; the motif steps (one of
each feature switched on, at drawn places of the root's body) still run up to ``max_nodes``,
so the reserve takes nothing from the motifs that bugs need (cut at the reserve, a motif bug
of ``tests/laws/test_planted_motif_bugs.py`` was missed). Without it the
motif steps filled the default 60 nodes before the closing run in a third of the programs,
and 200 default draws reached 269 operators and 89 % of the models'
(``python -m bench.opset_coverage``)."""


ON_SHARE: MappingProxyType[str, Fraction] = MappingProxyType({
    # the opset in fifteen draws of sixteen: its steps reach the table
    "opset": Fraction(15, 16),
    # a symbolic batch in one of four: its programs cost more to draw and to judge
    "symbolic_sizes": Fraction(1, 4),
    # poisoned operands in three of eight: in half, the poison hid a planted state bug under
    # one seed of 20
    "edge_operands": Fraction(3, 8),
})
"""The share of draws each feature is on in, where the swarm may switch it on (every other
feature: one half). A share is a multiple of 1/256: its flag byte is at least ``256 * (1 -
share)``."""

DEFAULT_SHARE = Fraction(1, 2)
"""The share of draws a feature without a row of :data:`ON_SHARE` is on in."""


@attrs.frozen
class FlagGroup:
    """Features whose flags are one byte string, drawn always or only where one of them may
    be on (so that adding an opt-in feature moves no default draw)."""

    features: tuple[str, ...]
    always_drawn: bool
    strategy: st.SearchStrategy[bytes] = attrs.field(init=False, default=attrs.Factory(
        lambda g: st.binary(min_size=len(g.features), max_size=len(g.features)),
        takes_self=True))


_FLAGGED = (*OPSET_FEATURES, "symbolic_sizes", "edge_operands")
FLAG_GROUPS: tuple[FlagGroup, ...] = (
    FlagGroup(tuple(f for f in FEATURES if f not in OPT_IN_FEATURES and f not in _FLAGGED),
              always_drawn=True),
    FlagGroup(tuple(f for f in FEATURES if f in OPT_IN_FEATURES), always_drawn=False),
    FlagGroup(_FLAGGED, always_drawn=False),
)
"""The flag groups in the order they are drawn: the first features, the opt-in ones, then the
opset's features with ``symbolic_sizes`` and ``edge_operands`` (the last added)."""

_ON_FROM = {f: 256 - int(256 * ON_SHARE.get(f, DEFAULT_SHARE)) for f in FEATURES}


def switched_on(draw: st.DrawFn, allowed: Collection[str], always: frozenset[str]
                ) -> frozenset[str]:
    """The features one program switches on: each of ``allowed`` whose flag byte reaches its
    share, and every one of ``always``. One draw per group drawn. O(len(FEATURES))."""
    on = set(always)
    for group in FLAG_GROUPS:
        if not group.always_drawn and not any(f in allowed for f in group.features):
            continue
        flags = draw(group.strategy)
        on.update(f for f, byte in zip(group.features, flags)
                  if f in allowed and byte >= _ON_FROM[f])
    return frozenset(on)
