"""Every private name of torch the project uses, and nothing else: an upgrade that moves one breaks this module
alone, and tests/test_private_apis.py says which name and which torch version.

Each import is lazy, inside the function (or the module attribute) that needs it: torch._dynamo costs ~2 s of a
process's start. FakeTensorMode: tensors with shapes, dtypes and devices but no data; TorchDispatchMode: the base of a
mode that sees every aten op a step dispatches."""

from __future__ import annotations

import torch

CHECKED_WITH = "2.13.0"


def raise_recompile_limit(at_least: int) -> None:
    """Dynamo's recompile limit per code object (`recompile_limit`, `cache_size_limit` before torch 2.7): a block's
    graphs for training, evaluation and each rank's pass count against it, and past it a fullgraph compile fails."""
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), at_least))


def assume_constant_result(fn):
    """torch.compiler.assume_constant_result(fn) without its import of torch._dynamo: the mark is the attribute
    dynamo reads when it traces (a process that builds a model and never compiles, an evaluation's, saves ~2 s)."""
    fn._dynamo_marked_constant = True
    return fn


def tree_leaves(tree) -> list:
    """torch's pytree flattening (tuples, lists, dicts, named tuples of tensors), for an op's arguments."""
    from torch.utils._pytree import tree_leaves as leaves
    return leaves(tree)


def storage_key(storage: torch.UntypedStorage) -> int:
    """An id of the storage behind a tensor that holds for fake tensors too (data_ptr does not)."""
    return storage._cdata


def __getattr__(name: str):
    if name == "FakeTensorMode":
        from torch._subclasses.fake_tensor import FakeTensorMode
        return FakeTensorMode
    if name == "TorchDispatchMode":
        from torch.utils._python_dispatch import TorchDispatchMode
        return TorchDispatchMode
    raise AttributeError(name)
