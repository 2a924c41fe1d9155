"""Feature detection across the torch versions the recorder supports (1.13 to 2.x).

Each helper names the versions it was written against. Nothing here changes torch's
behaviour; it only finds the right spelling of an API.
"""

import re

import torch

__all__ = [
    "TORCH_VERSION", "storage_id", "untyped_storage", "weak_ref_expired", "free_weak_ref",
    "new_weak_ref", "TorchDispatchMode", "TorchFunctionMode", "HAS_OPTIMIZER_STEP_HOOKS",
    "HAS_POST_ACCUMULATE_GRAD_HOOK", "register_module_forward_hook",
    "register_module_forward_pre_hook", "op_name", "mutates_storage_size", "backward_functions",
]

TORCH_VERSION = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())

# StorageImpl address of a tensor's storage: equal for a tensor and all its views.
# torch._C._storage_id exists in 1.13 and in 2.x (FakeTensor included). It raises
# RuntimeError for tensors without a storage (sparse, nested, wrapper subclasses).
storage_id = torch._C._storage_id

if hasattr(torch.Tensor, "untyped_storage"):  # torch >= 2.0

    def untyped_storage(tensor):
        return tensor.untyped_storage()

else:  # torch 1.13: Tensor._storage() returns the UntypedStorage without a TypedStorage wrapper

    def untyped_storage(tensor):
        return tensor._storage()


# Weak references to a StorageImpl (c10::weak_intrusive_ptr released into an int).
# A weak reference never keeps the bytes alive: the data is released when the last
# strong reference goes, and `expired` then answers True. Holding it does keep the
# StorageImpl object itself allocated, so its address cannot be reused by a new
# storage while we hold the reference. Same spelling in 1.13 and 2.x (it backs
# torch.multiprocessing.reductions.StorageWeakRef).
weak_ref_expired = torch.UntypedStorage._expired
free_weak_ref = torch.UntypedStorage._free_weak_ref


def new_weak_ref(storage):
    return storage._weak_ref()


from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402  (1.13 and 2.x)
from torch.overrides import TorchFunctionMode  # noqa: E402  (1.13 and 2.x)

# Optimizer.register_step_pre_hook / register_step_post_hook: torch >= 2.0.
HAS_OPTIMIZER_STEP_HOOKS = hasattr(torch.optim.Optimizer, "register_step_pre_hook")

# Tensor.register_post_accumulate_grad_hook: torch >= 2.1.
HAS_POST_ACCUMULATE_GRAD_HOOK = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")

# Global nn.Module forward hooks: torch >= 1.12 (hook(module, inputs[, outputs])).
from torch.nn.modules.module import (  # noqa: E402
    register_module_forward_hook,
    register_module_forward_pre_hook,
)


def op_name(func):
    """'aten::addmm' for an OpOverload (1.13 and 2.x); str(func) for anything else."""
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return schema.name
    return str(func)


def mutates_storage_size(func):
    """True for ops that may change the byte size of an existing storage in place.

    resize_ / resize_as_ / set_ and out= variants (which resize their output) are the
    only ATen ops that do; ordinary in-place ops keep the size.
    """
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    name = schema.name.split("::")[-1]
    if name in ("resize_", "resize_as_", "_resize_output_", "set_", "resize_as_sparse_"):
        return True
    return schema.overload_name.startswith("out") or schema.overload_name.endswith("_out")


def backward_functions():
    """The Python entry points that start an autograd backward pass.

    Tensor.backward and torch.autograd.grad reach a TorchFunctionMode in 1.13 and 2.x;
    torch.autograd.backward does in 2.x. Anything else is still detected by the node
    pre-hooks (the first backward node that runs).
    """
    return frozenset((torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad))
