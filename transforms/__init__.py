"""Pure rewrites ``Program -> Program`` and the default pipeline."""

from transforms.pipeline import DEFAULT_PIPELINE, transform

__all__ = ["DEFAULT_PIPELINE", "transform"]
