"""Pure rewrites ``Program -> Program`` and the default pipeline.

Every pass here is importable by name (``purefx --passes outline,sink_state`` uses these names).
"""

from transforms.dedup import deduplicate
from transforms.effects import remove_effect_tokens
from transforms.hop_split import split_hop_bodies
from transforms.inline import inline
from transforms.mutations import functional_to_inplace
from transforms.outline import outline, outline_and_sink, outline_by
from transforms.pipeline import DEFAULT_PIPELINE, pipeline, transform
from transforms.sink import sink_state
from transforms.split import move_non_tensor_nodes_on_boundary, split_by_tags
from transforms.stacks import fix_module_stacks
from transforms.stages import Edge, Stages, split_stages

__all__ = [
    "DEFAULT_PIPELINE",
    "Edge",
    "Stages",
    "deduplicate",
    "fix_module_stacks",
    "functional_to_inplace",
    "inline",
    "move_non_tensor_nodes_on_boundary",
    "outline",
    "outline_and_sink",
    "outline_by",
    "pipeline",
    "remove_effect_tokens",
    "sink_state",
    "split_by_tags",
    "split_hop_bodies",
    "split_stages",
    "transform",
]
