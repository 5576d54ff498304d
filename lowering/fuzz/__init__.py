"""purefx's differential fuzzer of torch's compilers (``docs/fuzz.md``).

``differential(backends, ...)`` runs generated programs through eager and each backend and
returns a ``FuzzReport`` of ``Finding`` s, each shrunk, with a standalone repro script.
"""

from lowering.fuzz.backends import BUILTINS, Backend, FuzzError
from lowering.fuzz.fuzz_programs import default_programs
from lowering.fuzz.known import (
    BUILTIN_KNOWN,
    LOW_PRECISION_ROUNDING,
    PRECISION_CASTS,
    RANDOM_NUMBERS,
    Known,
)
from lowering.fuzz.refusals import DOCUMENTED_UNSUPPORTED, Documented
from lowering.fuzz.search import Finding, FuzzReport, differential, program_text
from lowering.fuzz.torch_bugs import LISTED_BUGS, ListedBug

__all__ = [
    "BUILTINS",
    "BUILTIN_KNOWN",
    "DOCUMENTED_UNSUPPORTED",
    "LISTED_BUGS",
    "LOW_PRECISION_ROUNDING",
    "PRECISION_CASTS",
    "RANDOM_NUMBERS",
    "Backend",
    "Documented",
    "Finding",
    "FuzzError",
    "FuzzReport",
    "Known",
    "ListedBug",
    "default_programs",
    "differential",
    "program_text",
]
