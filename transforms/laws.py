"""The law checker at its public path: ``from transforms.laws import check_laws``.

This module is the public path fixed for the law checker (``check_laws``, ``LawViolation``,
``check_program`` and the other checks of ``lowering.pass_laws.__all__``). The implementation
lives in ``lowering.pass_laws`` because the semantics law lowers programs to run them against
torch; this module only re-exports it. It is the one upward import of ``transforms``, a door that
``tests/test_layering.py`` names; no library module imports it (library code imports
``lowering.pass_laws``, or ``transforms.machinery.law_violation`` for the error alone), so it closes no
import cycle.
"""

from lowering.pass_laws import *
from lowering.pass_laws import __all__  # noqa: F401
