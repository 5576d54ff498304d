"""Lowering: build runnable torch modules from a purefx Program."""

from lowering.export import export_ep
from lowering.lower import lower
from lowering.modules import Holder, LoweredDispatcher, LoweredModule
from lowering.root import LoweredRoot

__all__ = ["Holder", "LoweredDispatcher", "LoweredModule", "LoweredRoot", "export_ep", "lower"]
