"""Pure rewrites ``Program -> Program`` and the default pipeline.

Every pass here is importable by name (``purefx --passes outline,sink_state`` uses these names).
The default pipeline, in order (``transforms.pipeline.pipeline``): ``remove_effect_tokens``,
``functional_to_inplace``, ``split_hop_bodies``, ``fix_module_stacks``; the preserved-call
stages (``transforms.preserved``) ``fill_call_gaps``, ``repair_call_signatures``,
``rematerialize``, ``insert_ivals``; then ``outline`` (the walk), ``sink_state`` (whose last
step is the listed pass ``hold_foreign_state``), ``deduplicate``. The cleanup passes, listed
but not in the default pipeline: ``eliminate_dead_code``, ``cse``, ``fold_constants``.
``named_passes()`` gives every listed pass by its name.

``rewrite_nodes`` (``transforms.edit``) is not a pass but how a user writes one: a function over
nodes with an edit context (``Edit``) that does the bookkeeping; ``docs/passes.md``.
"""

# ``transforms.inline`` is the pass, and also the door module of that path: Python binds a
# submodule on its package when first imported, so the door is imported before the pass is bound
# here, else a later ``import transforms.inline`` would turn ``transforms.inline`` into the module
from transforms import inline as _inline_door
from transforms.edit import Edit, rewrite_nodes
from transforms.passes.constant_folding import fold_constants
from transforms.passes.dce import eliminate_dead_code
from transforms.passes.dedup import deduplicate
from transforms.passes.effect_tokens import remove_effect_tokens
from transforms.passes.foreign_state import hold_foreign_state
from transforms.passes.hop_split import split_hop_bodies
from transforms.passes.inlining import inline
from transforms.passes.module_stacks import fill_call_gaps, fix_module_stacks
from transforms.passes.move_device import move_to_device
from transforms.passes.mutations import functional_to_inplace
from transforms.passes.outline import outline, outline_and_sink, outline_by
from transforms.passes.state_sinking import sink_state
from transforms.passes.subexpressions import cse
from transforms.passes.tag_split import move_non_tensor_nodes_on_boundary, split_by_tags
from transforms.pipeline import DEFAULT_PIPELINE, named_passes, pipeline, transform
from transforms.preserved import insert_ivals, rematerialize, repair_call_signatures
from transforms.stages import Edge, Stages, split_stages

__all__ = [
    "DEFAULT_PIPELINE",
    "Edge",
    "Edit",
    "Stages",
    "cse",
    "deduplicate",
    "eliminate_dead_code",
    "fill_call_gaps",
    "fix_module_stacks",
    "fold_constants",
    "functional_to_inplace",
    "hold_foreign_state",
    "inline",
    "insert_ivals",
    "move_non_tensor_nodes_on_boundary",
    "move_to_device",
    "named_passes",
    "outline",
    "outline_and_sink",
    "outline_by",
    "pipeline",
    "rematerialize",
    "remove_effect_tokens",
    "repair_call_signatures",
    "rewrite_nodes",
    "sink_state",
    "split_by_tags",
    "split_hop_bodies",
    "split_stages",
    "transform",
]

del _inline_door
