"""Functions that graphs built by purefx passes call at run time."""

from __future__ import annotations

from typing import Any

from ir.errors import InputError


def expect_constant(value: Any, expected: Any, where: str) -> Any:
    """Return ``value`` if it equals the constant the program was exported with, else raise.

    A preserved call's constant argument was specialized at export: another value would be
    silently ignored, so it is rejected by name.
    """
    if type(value) is not type(expected) or value != expected:
        raise InputError(
            f"{where} was exported with the constant {expected!r}; got {value!r}. Re-export "
            "with the new value (or make it a tensor input) to change it"
        )
    return value
