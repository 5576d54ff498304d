"""Lowering: build runnable torch modules from a purefx Program."""

import warnings

# The ``purefx`` command imports this package first, and with it torch. torch warns at import
# when NumPy is missing or broken ("Failed to initialize NumPy"), which nothing here uses: that
# one message is silenced for this import only (the filters are restored after it; a program
# that imported torch before is unaffected).
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    from lowering.export import export_ep
    from lowering.lower import lower
    from lowering.modules import Holder, LoweredDispatcher, LoweredModule
    from lowering.root import LoweredRoot
    from lowering.stage_modules import (
        broadcast_shared_state,
        format_stage_plan,
        load_stage_state,
        merge_stage_state_dicts,
        pipeline_stage,
        stage_module,
        stage_ranks,
        sync_shared_grads,
    )

__all__ = [
    "Holder",
    "LoweredDispatcher",
    "LoweredModule",
    "LoweredRoot",
    "broadcast_shared_state",
    "export_ep",
    "format_stage_plan",
    "load_stage_state",
    "lower",
    "merge_stage_state_dicts",
    "pipeline_stage",
    "stage_module",
    "stage_ranks",
    "sync_shared_grads",
]
