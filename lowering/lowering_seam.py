"""The private torch symbols that only lowering uses: the one place ``lowering`` reaches them.

Lowering builds torch objects (modules, fx graphs, ``ExportedProgram``s) and so touches more of
torch's insides than the IR: nn.Module's own tables, fake tensors, export's verifier, the
tracing and compiling state, dynamo's frame hooks. Each is named here once, with what purefx
uses it for and how torch 2.13, 2.14 and 2.15 differ in it; what the IR layer also needs (pytree,
operator classes and schemas, module tables as dicts) comes from ``ir/torch_seam.py``.
``tests/test_torch_seam.py`` checks each symbol against the installed torch.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from types import CodeType
from typing import Any

import torch
import torch.nn.modules.module as _nn_module
from torch._export.utils import get_keystr
from torch._export.verifier import TrainingIRVerifier, Verifier
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.pipelining import PipelineStage
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.nn.parallel import DistributedDataParallel

from ir.errors import LoweringError
from ir.torch_seam import pytree

__all__ = [
    "BUFFER_TABLE",
    "INTERPRETER_FLAG",
    "MODULE_TABLE",
    "NON_PERSISTENT_BUFFERS",
    "PARAMETER_TABLE",
    "CheckedPipelineStage",
    "FakeTensor",
    "FakeTensorMode",
    "TrainingIRVerifier",
    "Verifier",
    "aoti_compile_and_load",
    "data_parallel_inner",
    "decompositions_drop_eval_dropout",
    "detect_fake_mode",
    "eval_frame_callback",
    "extract_tensor_metadata",
    "get_keystr",
    "global_module_hook_tables",
    "global_module_hooks_set",
    "global_registration_hooks_set",
    "identity_aot_backend",
    "inductor_config_patched",
    "init_module_state",
    "is_fx_symbolic_tracing",
    "jit_tracing",
    "new_parameter",
    "reset_dynamo",
    "run_frame_eagerly",
    "script_object_type_name",
    "set_eval_frame",
    "sync_parameter_list",
    "tracing_state",
]

# Documentation of the re-exported names (each keeps its own docstring):
# - get_keystr (torch._export.utils): a key path as torch spells it in messages (``[0]['x']``);
#   input errors name the input that way. Same in 2.13-2.15.
# - Verifier, TrainingIRVerifier (torch._export.verifier): the dialect check ``export_ep`` hands
#   to the ExportedProgram (ATEN for a functional graph, TRAINING when it mutates). Same in
#   2.13-2.15.
# - detect_fake_mode (torch._guards), FakeTensorMode, FakeTensor (torch._subclasses.fake_tensor):
#   export_ep computes missing ``val`` meta under the program's own fake mode. Same in 2.13-2.15.
# - is_fx_symbolic_tracing (torch.fx._symbolic_trace): whether ``torch.fx.symbolic_trace`` is
#   running, when lowered modules must run their hierarchical code. Same in 2.13-2.15.

# The ``__dict__`` keys of nn.Module's own tables. Direct code (``lowering/direct.py``) reads
# state from them by name, and leaf copies (``lowering/leaf.py``) build them. Same in 2.13-2.15.
PARAMETER_TABLE = "_parameters"
BUFFER_TABLE = "_buffers"
MODULE_TABLE = "_modules"
NON_PERSISTENT_BUFFERS = "_non_persistent_buffers_set"

# The field that ``UnflattenedModule`` and ``InterpreterModule`` set and read in ``forward``
# (run the graph through ``torch.fx.Interpreter`` instead of its code): the lowered classes
# subclass them, so they set it too, under this name. Same in 2.13-2.15.
INTERPRETER_FLAG = "_run_with_interpreter"


def decompositions_drop_eval_dropout() -> bool:
    """Whether ``ExportedProgram.run_decompositions`` decomposes an eval-mode ``aten.dropout`` to
    nothing. False in torch 2.13, which makes it a ``clone`` and renames a preserved call
    signature that names the dropout to that clone. True in 2.14 and 2.15, where such a
    signature is left naming a node that is gone and torch's verifier raises ``Input dropout
    does not exist in the graph``: on torch's own ``torch.export`` result as on ``export_ep``'s,
    so a program can be decomposed only where torch's own can (2.13 already does this to a
    no-op ``aten.to``: see ``tests/zoo_hf.py``)."""
    return torch.__version__ >= "2.14"


def extract_tensor_metadata(tensor: torch.Tensor) -> Any:
    """The ``TensorMetadata`` that ``ShapeProp`` stores as a node's ``tensor_meta``
    (``torch.fx.passes.shape_prop._extract_tensor_metadata``). Same in 2.13-2.15."""
    return _extract_tensor_metadata(tensor)


def global_module_hooks_set() -> bool:
    """Whether a global forward or backward (pre-)hook is registered for all modules
    (``register_module_forward_hook`` and friends): direct code must not skip them. Reads
    ``torch.nn.modules.module._global_*_hooks`` (``global_module_hook_tables``). Same in
    2.13-2.15."""
    return any(_HOOK_TABLES)


def global_module_hook_tables() -> tuple[dict, ...]:
    """The four tables ``global_module_hooks_set`` reads (forward, forward pre, backward,
    backward pre), themselves: registering a global hook adds to one in place, so code that
    holds them sees every hook. Same in 2.13-2.15."""
    return (
        _nn_module._global_forward_hooks,
        _nn_module._global_forward_pre_hooks,
        _nn_module._global_backward_hooks,
        _nn_module._global_backward_pre_hooks,
    )


_HOOK_TABLES = global_module_hook_tables()  # filled in place: registering adds to a table


def global_registration_hooks_set() -> bool:
    """Whether a global parameter or buffer registration hook is registered: then lowering
    registers state through ``register_parameter``/``register_buffer`` instead of writing the
    tables. Reads ``torch.nn.modules.module._global_*_registration_hooks``. Same in 2.13-2.15."""
    return bool(
        _nn_module._global_parameter_registration_hooks
        or _nn_module._global_buffer_registration_hooks
    )


def _module_state_recipe() -> tuple[tuple[str, Any, Any], ...] | None:
    """``(name, factory, value)`` for each attribute ``nn.Module.__init__`` sets, read from a
    module torch built: a new empty container (``factory()``) for a table or hook dict, the
    value itself for a flag. ``None`` when some attribute is neither (then modules are built
    by ``nn.Module.__init__`` itself)."""
    recipe = []
    for name, value in torch.nn.Module().__dict__.items():
        if type(value) in (dict, set, OrderedDict) and not value:
            recipe.append((name, type(value), None))
        elif value is None or type(value) in (bool, int, str):
            recipe.append((name, None, value))
        else:
            return None
    return tuple(recipe)


_MODULE_STATE = _module_state_recipe()


def init_module_state(module: torch.nn.Module) -> None:
    """Initialise ``module`` as ``torch.nn.Module.__init__(module)`` does: the same attributes,
    in the same order, each table and hook dict a new empty one; without its argument checks
    and API-usage log, at about a third of its cost (lowering builds thousands of modules).
    Falls back to ``nn.Module.__init__`` if torch ever sets an attribute of another kind. 2.13
    to 2.15 set the same seventeen (``training``, the tables, the hook dicts)."""
    if _MODULE_STATE is None:
        torch.nn.Module.__init__(module)
        return
    state = module.__dict__
    for name, factory, value in _MODULE_STATE:
        state[name] = value if factory is None else factory()


# - new_parameter (``torch.Tensor._make_subclass`` bound to ``torch.nn.Parameter``):
#   ``new_parameter(data, requires_grad)`` is ``torch.nn.Parameter(data, requires_grad)`` for
#   ``data`` whose type is exactly ``torch.Tensor``: what ``Parameter.__new__`` itself does for
#   such data, without its Python frame (lowering makes a parameter per weight). Same in
#   2.13-2.15.
new_parameter = functools.partial(torch.Tensor._make_subclass, torch.nn.Parameter)


# - tracing_state (torch._C._get_tracing_state): ``None`` unless ``torch.jit.trace`` is tracing;
#   the C function itself, for generated code that asks on every call. Same in 2.13-2.15.
tracing_state = torch._C._get_tracing_state


def jit_tracing() -> bool:
    """Whether ``torch.jit.trace`` is tracing the current call (``torch._C._get_tracing_state``).
    Same in 2.13-2.15."""
    return torch._C._get_tracing_state() is not None


# - eval_frame_callback (torch._C._dynamo.eval_frame.get_eval_frame_callback): dynamo's current
#   frame callback, set while a ``torch.compile``d function runs: the lowered root's ``forward``
#   asks it whether it is called from one. Same in 2.13-2.15.
# - set_eval_frame (torch._C._dynamo.eval_frame.set_eval_frame): installs a frame callback
#   (``None``: frames run eagerly) and returns the one it replaces. Same in 2.13-2.15.
# Both are the C functions themselves, not Python wrappers: ``forward`` runs in a frame dynamo
# skips while compiling the frames it calls, and a wrapper would be such a frame.
eval_frame_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback
set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame


def run_frame_eagerly(code: CodeType) -> None:
    """Tell dynamo to run frames of ``code`` without compiling them while still compiling the
    frames they call (``torch._C._dynamo.eval_frame.set_code_exec_strategy`` with
    ``_FrameExecStrategy(SKIP, DEFAULT)``). The lowered root's ``forward`` is run this way.
    Same in 2.13-2.15."""
    frames = torch._C._dynamo.eval_frame
    frames.set_code_exec_strategy(
        code, frames._FrameExecStrategy(frames._FrameAction.SKIP, frames._FrameAction.DEFAULT)
    )


def script_object_type_name(obj: torch.ScriptObject) -> str:
    """The qualified class name of a TorchScript custom object (``obj._type()``), as a custom-
    object input spec names it. Same in 2.13-2.15."""
    return obj._type().qualified_name()


def sync_parameter_list(plist: torch.nn.ParameterList) -> None:
    """Make a ``ParameterList`` whose ``_parameters`` table was filled directly know its length
    (its ``_size`` field, which ``len`` and ``append`` use). Same in 2.13-2.15."""
    plist._size = len(plist._parameters)


# --- pipeline stages ----------------------------------------------------------------------------
# - CheckedPipelineStage (a subclass of torch.distributed.pipelining.PipelineStage): what
#   ``lowering/stage_modules.py`` needs from torch's stage beyond its public API. (1) A hook before
#   each micro-batch's forward: it overrides ``forward_one_chunk(fwd_chunk_id, args, kwargs,
#   save_forward_output)``, which every schedule calls once per micro-batch (the first stage's
#   ``args`` are the micro-batch's positional inputs, ``kwargs`` every stage's keyword inputs).
#   (2) What the stage keeps of each micro-batch's forward for its backward. torch normalizes a
#   non-tuple output to ``(output,)`` and later treats each item as a tensor, so for a last stage
#   returning a dict the seam keeps the output's tensor leaves instead. Where it is kept differs:
#   2.13 and 2.14: ``fwd_cache``, ``{chunk id: (outputs as a tuple, flat input tensors)}``;
#   2.15: ``_forward_chunk_states``, ``{chunk id: state}``, a state built by
#   ``_make_forward_chunk_state(outputs as a tuple, flat input tensors)`` and holding the inputs
#   as ``input_values``. Which one is found by what the stage has (no version string); a stage
#   with neither (a torch outside the supported range) is a ``LoweringError`` naming the torch
#   and what to do, where an ``AttributeError`` would come from deep in the schedule. Checked
#   by ``tests/test_torch_seam_stages.py``: the installed torch's layout, and the seam's
#   handling of each layout on a stand-in stage (that test fails if the names it relies on
#   change).


class CheckedPipelineStage(PipelineStage):
    """A ``torch.distributed.pipelining.PipelineStage`` that calls
    ``check(chunk_id, args, kwargs)`` before it runs each micro-batch (a raise there stops the
    micro-batch before this rank sends anything for it), and keeps a last stage's non-tuple
    output (a dict, a list) as its tensor leaves for backward.

    Construct it as ``PipelineStage`` with one extra keyword, ``check``. Overrides
    ``forward_one_chunk`` and replaces the micro-batch's kept forward (layout described above)."""

    def __init__(self, *args: Any, check: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.purefx_check = check

    def forward_one_chunk(self, fwd_chunk_id: int, args: tuple[Any, ...],
                          kwargs: dict[str, Any] | None = None, save_forward_output: bool = True):
        """Run ``check`` on the micro-batch's own inputs, then torch's ``forward_one_chunk``."""
        self.purefx_check(fwd_chunk_id, args, kwargs or {})
        output = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        if self.is_last and not isinstance(output, (torch.Tensor, tuple)):
            leaves = tuple(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
            self._keep_for_backward(fwd_chunk_id, leaves)
        return output

    def _keep_for_backward(self, fwd_chunk_id: int, outputs: tuple[torch.Tensor, ...]) -> None:
        """Make the forward torch kept for micro-batch ``fwd_chunk_id`` hold ``outputs`` as its
        outputs, with the inputs it already holds (in whichever layout the stage has: the
        comment above).

        Raises:
            LoweringError: the stage keeps its forward in neither layout (a torch release
            outside ``torch>=2.13,<2.16``), naming the installed torch and what to do.

        Complexity: O(len(outputs))."""
        if hasattr(self, "_forward_chunk_states"):
            state = self._forward_chunk_states[fwd_chunk_id]
            self._forward_chunk_states[fwd_chunk_id] = self._make_forward_chunk_state(
                outputs, state.input_values)
        elif hasattr(self, "fwd_cache"):
            _outputs, inputs = self.fwd_cache[fwd_chunk_id]
            self.fwd_cache[fwd_chunk_id] = (outputs, inputs)
        else:
            raise LoweringError(
                f"pipeline stage {getattr(self, 'stage_index', '?')}: torch "
                f"{torch.__version__}'s PipelineStage keeps a micro-batch's forward in neither "
                "layout purefx knows (`_forward_chunk_states`, torch 2.15; `fwd_cache`, torch "
                "2.13 and 2.14), so a last stage returning a dict or another non-tuple output "
                "cannot be kept for its backward. Install a torch purefx supports "
                "(torch>=2.13,<2.16), or make the program return a tensor or a tuple of tensors"
            )


def data_parallel_inner(module: torch.nn.Module) -> torch.nn.Module:
    """The module a data-parallel wrapper holds: ``DistributedDataParallel.module`` (whose state
    keys gain a ``module.`` prefix); any other module (FSDP2's ``fully_shard`` changes the
    module's class in place and keeps its keys) is returned as it is. Same in 2.13-2.15."""
    return module.module if isinstance(module, DistributedDataParallel) else module


def reset_dynamo() -> None:
    """Forget every compiled frame (``torch._dynamo.reset()``): the next ``torch.compile`` call
    compiles afresh, with no cache hit and no recompile limit reached. Same in 2.13-2.15."""
    torch._dynamo.reset()


def inductor_config_patched(config: dict) -> Any:
    """A context manager under which inductor's config holds ``config``
    (``torch._inductor.config.patch``). Same in 2.13-2.15 (the option names vary)."""
    import torch._inductor.config

    return torch._inductor.config.patch(config)


def identity_aot_backend() -> Any:
    """A ``torch.compile`` backend that runs AOTAutograd (functionalization, the joint graph,
    its partition) and compiles each graph to itself: ``aot_autograd(fw_compiler=...)`` of
    ``torch._dynamo.backends.common`` with an identity compiler. Same in 2.13-2.15."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=lambda gm, example_inputs: gm)


def aoti_compile_and_load(ep: Any, package_path: str) -> Any:
    """``ep`` compiled ahead of time by inductor into the package ``package_path`` and loaded
    back, a callable (``torch._inductor.aoti_compile_and_package`` then
    ``aoti_load_package``). Same in 2.13-2.15."""
    import torch._inductor

    path = torch._inductor.aoti_compile_and_package(ep, package_path=package_path)
    return torch._inductor.aoti_load_package(path)
