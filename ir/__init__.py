"""purefx's immutable graph IR: values, import, verification and printing."""

from ir.alpha import alpha_equivalent, graph_key, program_key
from ir.args import EMPTY_DICT, IDict, IList, ISlice, Ref, ref
from ir.errors import (
    InputConstraintError,
    InputError,
    LoweringError,
    PassError,
    PurefxError,
    UnsupportedProgramError,
    VerifyError,
)
from ir.graph import Graph
from ir.import_ep import import_ep, import_graph_module
from ir.module import Module, ModuleId
from ir.node import Node
from ir.parser import ParseError, parse_program
from ir.printer import format_graph, format_node, format_program, format_tree
from ir.program import Program
from ir.signature import ArgSpec, CallSignature, ExportSignature, InputSpec, OutputSpec
from ir.state import Opaque, Slot
from ir.verify import verify

__all__ = [
    "EMPTY_DICT",
    "ArgSpec",
    "CallSignature",
    "ExportSignature",
    "Graph",
    "IDict",
    "IList",
    "ISlice",
    "InputConstraintError",
    "InputError",
    "InputSpec",
    "LoweringError",
    "Module",
    "ModuleId",
    "Node",
    "Opaque",
    "OutputSpec",
    "ParseError",
    "PassError",
    "Program",
    "PurefxError",
    "Ref",
    "Slot",
    "UnsupportedProgramError",
    "VerifyError",
    "alpha_equivalent",
    "format_graph",
    "format_node",
    "format_program",
    "format_tree",
    "graph_key",
    "import_ep",
    "import_graph_module",
    "parse_program",
    "program_key",
    "ref",
    "verify",
]
