"""Feature detection across the torch versions the recorder supports (1.13 to 2.x).

Every helper here finds the right spelling of an API by looking for it, never by
comparing version numbers, and says which torch source it was checked against
(docs/trace-recorder.md, "Torch versions", names the files). Nothing here changes
torch's behaviour.
"""

import re

import torch

__all__ = [
    "TORCH_VERSION", "storage_id", "storage_key", "untyped_storage", "real_storage",
    "inner_tensors", "weak_ref_expired", "free_weak_ref", "new_weak_ref", "TorchDispatchMode",
    "TorchFunctionMode", "HAS_POST_ACCUMULATE_GRAD_HOOK", "register_module_forward_hook",
    "register_module_forward_pre_hook", "register_optimizer_step_hooks", "op_name",
    "mutates_storage_size", "backward_functions", "empty_cache_functions",
]

# Only for test skips and the `meta` header; behaviour never depends on it.
TORCH_VERSION = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)

if hasattr(torch.Tensor, "untyped_storage"):  # torch >= 2.0

    def untyped_storage(tensor):
        return tensor.untyped_storage()

else:  # torch 1.13: Tensor._storage() returns the UntypedStorage without a TypedStorage wrapper

    def untyped_storage(tensor):
        return tensor._storage()


def storage_key(storage):
    """StorageImpl address of a storage object (UntypedStorage._cdata, 1.13 and 2.x)."""
    return storage._cdata


# StorageImpl address of a tensor's storage: equal for a tensor and all its views.
# torch._C._storage_id (a pybind function in torch/csrc/jit/python/init.cpp) exists in
# 1.13 and 2.x and works on FakeTensors. It raises RuntimeError (NotImplementedError is
# a subclass) for tensors whose storage cannot be accessed: sparse, functorch-batched.
if hasattr(torch._C, "_storage_id"):
    storage_id = torch._C._storage_id
else:  # not seen in any release; the same number, reached through the storage object

    def storage_id(tensor):
        return untyped_storage(tensor)._cdata


def real_storage(tensor):
    """The UntypedStorage holding `tensor`'s bytes, or None if it holds none of its own.

    None for storages that cannot be accessed (1.13 raises NotImplementedError for the
    null storage of a `_make_wrapper_subclass` tensor) and for the placeholder storage a
    wrapper subclass has in 2.x: `nbytes()` is the logical size, the data pointer is
    null and the device is not meta ("Note [Invalid Python Storages]" in
    torch/csrc/StorageMethods.cpp). A DTensor's placeholder is as large as the global,
    unsharded tensor; counting it would be wrong. Meta and FakeTensor storages are
    real for our purpose (their nbytes() is what the device would allocate).
    """
    try:
        storage = untyped_storage(tensor)
    except RuntimeError:
        return None
    if type(tensor) not in _PLAIN_TYPES:
        try:
            if storage.device.type != "meta" and storage.nbytes() and not storage.data_ptr():
                return None
        except RuntimeError:
            return None
    return storage


def inner_tensors(tensor):
    """The tensors a traceable wrapper subclass (DTensor, jagged NestedTensor, float8 and
    quantized subclasses) keeps its data in, or None for any other tensor.

    Same test as torch.utils._python_dispatch.is_traceable_wrapper_subclass (2.1+):
    a Tensor subclass with __tensor_flatten__ and __tensor_unflatten__; the first item
    __tensor_flatten__ returns names the attributes that hold the inner tensors.
    """
    cls = type(tensor)
    if cls in _PLAIN_TYPES or not (hasattr(cls, "__tensor_flatten__")
                                    and hasattr(cls, "__tensor_unflatten__")):
        return None
    try:
        names = tensor.__tensor_flatten__()[0]
    except Exception:  # a subclass we cannot take apart: treat it like any tensor
        return None
    inner = []
    for name in names:
        value = getattr(tensor, name, None)
        if isinstance(value, torch.Tensor) and value is not tensor:
            inner.append(value)
    return inner


# Weak references to a StorageImpl (c10::weak_intrusive_ptr released into an int), in
# torch/csrc/StorageSharing.cpp: `_weak_ref` (method), `_free_weak_ref` and `_expired`
# (static, take the int) in 1.13 and 2.x, same signatures; `_expired` is "strong
# refcount == 0". A weak reference never keeps the bytes alive: the data is released
# when the last strong reference goes, and `expired` then answers True. Holding it does
# keep the StorageImpl object itself allocated, so its address cannot be reused by a new
# storage while we hold the reference. They also back
# torch.multiprocessing.reductions.StorageWeakRef.
weak_ref_expired = torch.UntypedStorage._expired
free_weak_ref = torch.UntypedStorage._free_weak_ref


def new_weak_ref(storage):
    return storage._weak_ref()


from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402  (1.13 and 2.x)
from torch.overrides import TorchFunctionMode  # noqa: E402  (1.13 and 2.x)

# Tensor.register_post_accumulate_grad_hook: torch >= 2.1 (torch/_tensor.py). Raises
# RuntimeError for tensors that do not require grad or are not leaves.
HAS_POST_ACCUMULATE_GRAD_HOOK = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")

# Global nn.Module forward hooks: torch >= 1.12 (hook(module, args[, output])). 2.x adds
# keyword-only with_kwargs/always_call; the defaults keep the 1.13 behaviour.
from torch.nn.modules.module import (  # noqa: E402
    register_module_forward_hook,
    register_module_forward_pre_hook,
)


def register_optimizer_step_hooks(optimizer, pre, post):
    """Step pre/post hooks on `optimizer` (torch >= 2.0); returns their handles, or None
    where they cannot work, and the caller wraps the instance's step() instead.

    The hooks are called by the wrapper Optimizer._patch_step_function puts around the
    class's step() in Optimizer.__init__ (and marks with `step.hooked`). An object that
    only looks like an optimizer, or a subclass that did not call Optimizer.__init__
    (some wrappers do not), has no hook dicts or an unwrapped step(): hooks registered
    there would never run.
    """
    register_pre = getattr(optimizer, "register_step_pre_hook", None)
    register_post = getattr(optimizer, "register_step_post_hook", None)
    if register_pre is None or register_post is None:
        return None
    if not getattr(getattr(type(optimizer), "step", None), "hooked", False):
        return None
    try:
        pre_handle = register_pre(lambda opt, args, kwargs: pre(opt))
    except (AttributeError, TypeError, RuntimeError):  # NotImplementedError included
        return None
    try:
        post_handle = register_post(lambda opt, args, kwargs: post(opt))
    except (AttributeError, TypeError, RuntimeError):
        pre_handle.remove()
        return None
    return [pre_handle, post_handle]


def op_name(func):
    """'aten::addmm' for an OpOverload (1.13 and 2.x); str(func) for anything else
    (a HigherOrderOperator prints its name)."""
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return schema.name
    return str(func)


def mutates_storage_size(func):
    """True for ops that may change the byte size of an existing storage in place.

    resize_ / resize_as_ / set_ and out= variants (which resize their output) are the
    only ATen ops that do; ordinary in-place ops keep the size. (UntypedStorage.resize_
    is no op at all; the recorder wraps it separately.)
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

    Tensor.backward and torch.autograd.grad call handle_torch_function, so they reach a
    TorchFunctionMode (1.13 and 2.x). torch.autograd.backward does not, in any version
    (torch/autograd/__init__.py): the recorder wraps the module attribute instead, and
    it is listed here so that a torch that starts dispatching it is handled the same way.
    Anything else is still detected by the node pre-hooks (the first backward node).
    """
    return frozenset((torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad))


def empty_cache_functions():
    """(namespace, attribute) of every caching-allocator empty_cache the recorder wraps:
    torch.cuda.empty_cache (and torch.cuda.memory's, the same function), and
    torch.accelerator.empty_cache where it exists (2.6+; it calls the allocator
    directly, not torch.cuda.empty_cache)."""
    found = []
    for owner_name in ("cuda", "accelerator"):
        owner = getattr(torch, owner_name, None)
        if owner is None:
            continue
        for namespace in (owner, getattr(owner, "memory", None)):
            if namespace is not None and callable(getattr(namespace, "empty_cache", None)):
                found.append((namespace, "empty_cache"))
    return found
