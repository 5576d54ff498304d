"""Signatures: the export signature of the root graph and the per-fqn module call signatures."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ir.slot_init import slot_init

# Input kinds (what a root placeholder stands for).
USER_INPUT = "user_input"
PARAMETER = "parameter"
BUFFER = "buffer"
CONSTANT_TENSOR = "constant_tensor"
CUSTOM_OBJ = "custom_obj"
TOKEN = "token"
STATE_INPUT_KINDS = (PARAMETER, BUFFER, CONSTANT_TENSOR, CUSTOM_OBJ)

# Output kinds (what a root output stands for).
USER_OUTPUT = "user_output"
BUFFER_MUTATION = "buffer_mutation"
USER_INPUT_MUTATION = "user_input_mutation"
PARAMETER_MUTATION = "parameter_mutation"
OUTPUT_TOKEN = "token"
LOSS_OUTPUT = "loss_output"
MUTATION_KINDS = (BUFFER_MUTATION, USER_INPUT_MUTATION, PARAMETER_MUTATION)

# Argument kinds of a call signature.
TENSOR = "tensor"
SYM_INT = "sym_int"
SYM_FLOAT = "sym_float"
SYM_BOOL = "sym_bool"
CONSTANT = "constant"
OBJECT = "custom_obj"
TOKEN_ARG = "token"


@slot_init
@attrs.frozen(cache_hash=True)
class InputSpec:
    """What the root graph's placeholder ``name`` stands for; ``target`` is the state fqn."""

    kind: str
    name: str
    target: str | None = None
    persistent: bool | None = None


@slot_init
@attrs.frozen(cache_hash=True)
class OutputSpec:
    """What the root graph's output at the same position stands for.

    ``name`` is the produced value's node name (``None`` for a literal output); ``target`` is the
    mutated buffer fqn or user input name.
    """

    kind: str
    name: str | None
    target: str | None = None


@slot_init
@attrs.frozen(cache_hash=True)
class ExportSignature:
    """Input specs (one per root placeholder, in order) and output specs (one per root output)."""

    inputs: tuple[InputSpec, ...] = ()
    outputs: tuple[OutputSpec, ...] = ()

    def user_inputs(self) -> tuple[InputSpec, ...]:
        """The specs of ``USER_INPUT`` placeholders, in order."""
        return tuple(s for s in self.inputs if s.kind == USER_INPUT)

    def user_outputs(self) -> tuple[OutputSpec, ...]:
        """The specs of ``USER_OUTPUT`` outputs, in order."""
        return tuple(s for s in self.outputs if s.kind in (USER_OUTPUT, LOSS_OUTPUT))


@slot_init
@attrs.frozen(cache_hash=True)
class ArgSpec:
    """One flat input or output of a preserved call: a named value or a constant ``value``."""

    kind: str
    name: str | None = None
    value: Any = None


@slot_init
@attrs.frozen(cache_hash=True)
class CallSignature:
    """A preserved module call signature: flat inputs/outputs and their pytree specs."""

    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    in_spec: Any
    out_spec: Any
    forward_arg_names: tuple[str, ...] | None = None

    def renamed(
        self, inputs: Mapping[str, str] | None = None, outputs: Mapping[str, str] | None = None
    ) -> CallSignature:
        """A copy whose inputs named in ``inputs`` and outputs named in ``outputs`` (old name ->
        new name) name the new values; every other spec as it is. O(specs)."""

        def rename(specs: tuple[ArgSpec, ...], names: Mapping[str, str]) -> tuple[ArgSpec, ...]:
            return tuple(
                attrs.evolve(a, name=names[a.name]) if a.name in names else a for a in specs
            )

        return attrs.evolve(
            self,
            inputs=rename(self.inputs, inputs or {}),
            outputs=rename(self.outputs, outputs or {}),
        )
