"""Pipeline stages: ``split_stages`` (``split``), the stage key and plan (``plan``) and the
balanced cut search with its cost rules (``balance``)."""

from transforms.stages.stage_cut import Edge, Stages, split_stages

__all__ = ["Edge", "Stages", "split_stages"]
