"""The two torch modes the recorder runs under, and the autograd-node pre-hook.

DispatchMode sees every ATen op below autograd (where storages are born); FunctionMode
sees torch functions above autograd (where autograd nodes are made and backward() is
called). Both hand everything to the Recorder and change nothing.
"""

import torch

from . import _torch_compat as compat

_Tensor = torch.Tensor


class DispatchMode(compat.TorchDispatchMode):
    """Sees every ATen op below autograd: where storages are born."""

    def __init__(self, recorder):
        super().__init__()
        self._recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        recorder = self._recorder
        recorder._see_inputs(args, kwargs)
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
