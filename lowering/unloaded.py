"""State made empty from a ``meta`` export, and the check that it was loaded before it runs.

A program exported under ``torch.device("meta")`` holds meta tensors: shapes and dtypes, no
values. ``lower(p, device=d)`` (and so ``stage_module``) makes each such tensor *empty*
(uninitialized, ``torch.empty_strided``) on ``d``, under its original fqn, so that only the state
of the module being built is ever allocated; the user then fills it from a checkpoint
(``torch.distributed.checkpoint.load`` into ``m.state_dict()``, or ``m.load_state_dict``).

How "loaded" is known, without global state: every way of filling a registered tensor either
writes it in place (``load_state_dict``'s ``copy_``, ``dcp.load``, ``broadcast``,
``t.copy_(...)``), which advances the tensor's own version counter, or puts another tensor
object at its fqn (``load_state_dict(assign=True)``, ``setattr``). ``lower`` records, on the
module it returns, each empty tensor with its version at build time; a forward pre-hook compares
them at the first call and raises ``UnloadedStateError`` naming the first fqn (state order) still
as built. Once every tensor passed, the hook removes itself: later calls pay nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from ir.errors import UnloadedStateError
from ir.torch_seam import module_buffers, module_parameters, tensor_version


def is_meta(value: Any) -> bool:
    """Whether ``value`` is a tensor on ``meta`` (no values to copy). O(1)."""
    return isinstance(value, torch.Tensor) and value.device.type == "meta"


def empty_like_on(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor of ``value``'s size, stride and dtype on ``device`` (a meta
    tensor's stand-in until its values are loaded). O(1) plus the allocation."""
    return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=device)


class LoadCheck:
    """A forward pre-hook: the first call raises ``UnloadedStateError`` naming the first fqn
    whose tensor is still the empty one ``lower`` made, at the version it had (nothing wrote it,
    nothing replaced it). Passing once removes the hook. Picklable (plain attributes).

    ``made``: ``(fqn, kind, tensor, version)`` per empty tensor, in state order (tied fqns once).
    """

    def __init__(self, made: list[tuple[str, str, torch.Tensor, int]]) -> None:
        self.made = made
        self.handle: Any = None

    def unloaded(self, root: torch.nn.Module) -> str | None:
        """The first fqn not loaded yet, or ``None``. O(state)."""
        return next((entry[0] for entry in self.made if _still_empty(root, *entry)), None)

    def __call__(self, root: torch.nn.Module, args: Any) -> None:
        fqn = self.unloaded(root)
        if fqn is not None:
            count = sum(1 for entry in self.made if _still_empty(root, *entry))
            raise UnloadedStateError(
                f"{fqn!r} was never loaded ({count} of {len(self.made)} state tensors are still "
                "uninitialized): the program was exported on 'meta', so its state was made "
                "empty on the device. Load the weights first, e.g. "
                "`sd = m.state_dict(); torch.distributed.checkpoint.load(sd, checkpoint_id=...)` "
                "or `m.load_state_dict(sd)` (a non-persistent buffer or constant: write it in "
                "place, `m.get_buffer(fqn).copy_(value)`)"
            )
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def _still_empty(root: torch.nn.Module, fqn: str, kind: str, tensor: torch.Tensor,
                 version: int) -> bool:
    """Whether ``tensor`` is still registered at ``fqn`` at ``version``: nothing wrote or
    replaced it."""
    return _registered(root, fqn, kind) is tensor and tensor_version(tensor) == version


def _registered(root: torch.nn.Module, fqn: str, kind: str) -> Any:
    owner_path, _, name = fqn.rpartition(".")
    owner = root
    if owner_path:
        try:
            owner = root.get_submodule(owner_path)
        except AttributeError:
            return None
    if kind == "parameter":
        found = module_parameters(owner).get(name)
    elif kind == "buffer":
        found = module_buffers(owner).get(name)
    else:
        found = None
    return found if found is not None else owner.__dict__.get(name)


def watch_loading(root: torch.nn.Module, made: list[tuple[str, str, torch.Tensor, int]]) -> None:
    """Install a ``LoadCheck`` on ``root`` for the empty tensors in ``made`` (nothing when
    empty). O(1)."""
    if not made:
        return
    check = LoadCheck(made)
    check.handle = root.register_forward_pre_hook(check)


__all__ = ["LoadCheck", "empty_like_on", "is_meta", "watch_loading"]
