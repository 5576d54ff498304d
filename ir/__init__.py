"""purefx's immutable graph IR: values, import, verification and printing."""

import logging

from ir.alpha import alpha_equivalent, graph_key, program_key
from ir.args import EMPTY_DICT, IDict, IList, ISlice, Ref, ref
from ir.errors import (
    EditRefused,
    InputConstraintError,
    InputError,
    LoadError,
    LoweringError,
    OperatorFactsError,
    PassError,
    PurefxError,
    UnloadedStateError,
    UnsupportedProgramError,
    UntrustedProgramError,
    VerifyError,
)
from ir.graph import Graph
from ir.import_ep import import_ep
from ir.import_gm import import_graph_module
from ir.load import Limits, load_program
from ir.module import Module, ModuleId
from ir.node import Node
from ir.parser import ParseError, parse_program
from ir.printer import format_graph, format_node, format_program, format_tree
from ir.program import Program
from ir.signature import ArgSpec, CallSignature, ExportSignature, InputSpec, OutputSpec
from ir.state import Opaque, Slot
from ir.verify import verify

# The library prints nothing: its "purefx" logger reaches only the handlers users add (a handler
# on it keeps Python's last-resort handler from writing its warnings to stderr).
logging.getLogger("purefx").addHandler(logging.NullHandler())

__all__ = [
    "EMPTY_DICT",
    "ArgSpec",
    "CallSignature",
    "EditRefused",
    "ExportSignature",
    "Graph",
    "IDict",
    "IList",
    "ISlice",
    "InputConstraintError",
    "InputError",
    "InputSpec",
    "Limits",
    "LoadError",
    "LoweringError",
    "Module",
    "ModuleId",
    "Node",
    "Opaque",
    "OperatorFactsError",
    "OutputSpec",
    "ParseError",
    "PassError",
    "Program",
    "PurefxError",
    "Ref",
    "Slot",
    "UnloadedStateError",
    "UnsupportedProgramError",
    "UntrustedProgramError",
    "VerifyError",
    "alpha_equivalent",
    "format_graph",
    "format_node",
    "format_program",
    "format_tree",
    "graph_key",
    "import_ep",
    "import_graph_module",
    "load_program",
    "parse_program",
    "program_key",
    "ref",
    "verify",
]
