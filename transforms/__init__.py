"""Pure rewrites ``Program -> Program`` and the default pipeline."""

from transforms.inline import inline as inline
from transforms.pipeline import DEFAULT_PIPELINE, transform
from transforms.split import move_non_tensor_nodes_on_boundary as move_non_tensor_nodes_on_boundary
from transforms.split import split_by_tags as split_by_tags

__all__ = ["DEFAULT_PIPELINE", "transform"]
