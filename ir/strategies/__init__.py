"""Public hypothesis strategies for purefx property suites.

Two tiers:

- fast (``ir.strategies.programs``): Programs generated directly as IR, shaped like
  ``import_ep`` output and valid by construction; hundreds per second. Start here. Besides a
  fixed vocabulary, its ``opset`` steps call the operators of the verified table
  (``ir.opset.table()``) with the arguments of their checked samples (``ops=`` restricts them;
  :data:`OPSET_FEATURES` widen them: strides, integer / bool / half values, train-mode norms,
  in-place variants, core aten rows).
  ``crossing_programs`` draws the same programs with values and state crossing preserved call
  boundaries in most draws (what the preserved-call stages rewrite). What it draws and how
  often is data in modules of their own: ``swarm`` (the features and their shares),
  ``step_kinds`` (one row per kind of body step), ``vocabulary`` (operators and literals).
- export (``ir.strategies.module_trees``): exportable ``nn.Module`` hierarchies and their
  ``torch.export`` programs; end to end, about ten per second.

The user's own program and variants of it (``programs_like``) draws forms that the pipeline and
``export_ep`` make, so it lives above them, in ``lowering.like``.

What a run reached: ``CoverageLog().track(strategy)`` collects a :class:`Coverage` (the table's
operators called, the opset features shown) over every program drawn; ``coverage_of(program)``
for one program (``docs/testing.md``, "The opset generators").
"""

from ir.strategies.coverage import Coverage, CoverageLog, coverage_of
from ir.strategies.module_trees import (
    ALL_FEATURES,
    MODULE_FEATURES,
    PROGRAM_FEATURES,
    ModuleSpec,
    ProgramSpec,
    example_inputs,
    export_spec,
    exported_programs,
    fresh_export,
    module_specs,
    program_specs,
    realize,
)
from ir.strategies.opset_steps import OPSET_FEATURES
from ir.strategies.programs import (
    CROSSING_FEATURES,
    DETERMINISTIC_FEATURES,
    FEATURES,
    OPT_IN_FEATURES,
    ROOT_TYPE,
    WIDTH,
    check_features,
    crossing_programs,
    program_inputs,
    programs,
)

__all__ = [
    "ALL_FEATURES",
    "CROSSING_FEATURES",
    "DETERMINISTIC_FEATURES",
    "FEATURES",
    "MODULE_FEATURES",
    "OPSET_FEATURES",
    "OPT_IN_FEATURES",
    "PROGRAM_FEATURES",
    "ROOT_TYPE",
    "WIDTH",
    "Coverage",
    "CoverageLog",
    "ModuleSpec",
    "ProgramSpec",
    "check_features",
    "coverage_of",
    "crossing_programs",
    "example_inputs",
    "export_spec",
    "exported_programs",
    "fresh_export",
    "module_specs",
    "program_inputs",
    "program_specs",
    "programs",
    "realize",
]
