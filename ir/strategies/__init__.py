"""Public hypothesis strategies for purefx property suites.

Two tiers:

- fast (``ir.strategies.programs``): Programs generated directly as IR, shaped like
  ``import_ep`` output and valid by construction; hundreds per second. Start here.
  ``crossing_programs`` draws the same programs with values and state crossing preserved call
  boundaries in most draws (what the preserved-call stages rewrite).
- like (``ir.strategies.programs_like``): the user's own program (an ``ExportedProgram`` or a
  Program) and variants of it, with inputs, for ``check_laws(pass_fn, programs=...)``.
- export (``ir.strategies.export``): exportable ``nn.Module`` hierarchies and their
  ``torch.export`` programs; end to end, about ten per second.
"""

from ir.strategies.coverage import Coverage, CoverageLog, coverage_of
from ir.strategies.export import (
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
from ir.strategies.like import FORMS, LikeExample, programs_like
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
    "FORMS",
    "MODULE_FEATURES",
    "OPSET_FEATURES",
    "OPT_IN_FEATURES",
    "PROGRAM_FEATURES",
    "ROOT_TYPE",
    "WIDTH",
    "Coverage",
    "CoverageLog",
    "LikeExample",
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
    "programs_like",
    "realize",
]
