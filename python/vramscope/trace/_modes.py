"""The two torch modes the recorder runs under, and the autograd-node pre-hook.

DispatchMode sees every ATen op below autograd (where storages are born); FunctionMode
sees torch functions above autograd (where autograd nodes are made and backward() is
called). Both hand everything to the Recorder and change nothing.

Both can be called from more than one thread at once: a backward pass over CUDA
tensors runs on autograd's device thread while the calling thread works through the
CPU nodes of the same graph (torch/csrc/autograd/engine.cpp; the graph task's
ThreadLocalState carries the mode stacks there). The Recorder serialises its own
bookkeeping; the ops themselves run unlocked.
"""

import torch

from . import _torch_compat as compat

_Tensor = torch.Tensor

# Custom ops whose kernels are Python functions over torch ops: bitsandbytes' (0.44+
# registers gemm_4bit, dequantize_4bit, dequantize_blockwise, ... with torch.library).
# Under the mode one arrives as a single op, and what its kernel allocates and frees
# inside (0.50.2's gemm_4bit: the dequantized absmax and the whole dequantized weight)
# would go unseen. Their kernel is run for the tensors' backend with this mode pushed
# again, so that its inner ops are recorded like any others.
_TRANSPARENT_NAMESPACES = frozenset({"bitsandbytes"})
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def _backend_keyset(args, kwargs):
    """The dispatch key set of the first tensor argument's backend, or None."""
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, _Tensor):
            key = _BACKEND_KEYS.get(value.device.type)
            if key is None:
                return None
            return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    return None


class DispatchMode(compat.TorchDispatchMode):
    """Sees every ATen op below autograd: where storages are born."""

    # torch 2.x: a HigherOrderOperator called in eager mode (torch.cond, flex_attention,
    # invoke_subgraph, ...) raises NotImplementedError under a user dispatch mode that
    # has no rule for it, unless the mode sets this; then the HOP reaches
    # __torch_dispatch__ like an op (torch/_ops.py, HigherOrderOperator.dispatch). We
    # pass it through: its outputs are recorded, its inner ops are not seen. Unused
    # before that attribute existed.
    supports_higher_order_operators = True

    def __init__(self, recorder):
        super().__init__()
        self._recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        recorder = self._recorder
        recorder._see_inputs(args, kwargs)
        keys = None
        if getattr(func, "namespace", None) in _TRANSPARENT_NAMESPACES:
            keys = _backend_keyset(args, kwargs)
        if keys is not None and hasattr(func, "redispatch"):
            with self:
                out = func.redispatch(keys, *args, **kwargs)
        else:
            out = func(*args, **kwargs)
        recorder._see_outputs(func, out)
        return out


class FunctionMode(compat.TorchFunctionMode):
    """Sees every torch function above autograd: tags new autograd nodes, spots backward()."""

    def __init__(self, recorder):
        super().__init__()
        self._recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        recorder = self._recorder
        if func in recorder._backward_funcs:
            return recorder._run_backward(func, args, kwargs)
        out = func(*args, **kwargs)
        if isinstance(out, _Tensor):
            if out.grad_fn is not None:
                recorder._tag_node(out.grad_fn)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, _Tensor) and item.grad_fn is not None:
                    recorder._tag_node(item.grad_fn)
        return out


def make_node_prehook(recorder_ref, module_id):
    # Holds the recorder weakly: graphs that outlive the recording must not keep it alive.
    def prehook(grad_outputs):
        recorder = recorder_ref()
        if recorder is not None:
            recorder._on_backward_node(module_id)
        return None

    return prehook
