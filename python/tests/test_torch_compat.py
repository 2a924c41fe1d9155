"""Paths written for torch 2.x behaviour, exercised on whatever torch is installed.

The 2.x facts behind them are in docs/trace-recorder.md ("Torch versions"). Each test
builds the situation with APIs that exist in 1.13 too, so it runs here.
"""

import pytest
import torch
from torch import nn

import vramscope_trace
from test_recorder import allocs, events_of, mlp
from vramscope_trace import _torch_compat
from vramscope_trace._modes import DispatchMode


def _unwrap(value):
    return value.elem if isinstance(value, _Wrapper) else value


class _Wrapper(torch.Tensor):
    """A wrapper tensor subclass like DTensor: its own storage holds no bytes."""

    @staticmethod
    def __new__(cls, elem):
        out = torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype,
                                                  device=elem.device)
        out.elem = elem
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args = [_unwrap(a) for a in args]
        kwargs = {k: _unwrap(v) for k, v in (kwargs or {}).items()}
        out = func(*args, **kwargs)
        return cls(out) if isinstance(out, torch.Tensor) else out


class _TraceableWrapper(_Wrapper):
    """The same with the 2.x flatten protocol (DTensor, jagged NestedTensor, float8)."""

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return _TraceableWrapper(inner["elem"])


def test_a_traceable_wrapper_subclass_is_recorded_as_its_inner_tensors(tmp_path):
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        w = _TraceableWrapper(torch.randn(1000))
        y = w * 2  # the dispatch mode sees aten::mul on wrappers; the bytes are y.elem's
        del w, y
        torch.randn(1)
    events = events_of(path)
    assert [(e[2], e[4]) for e in allocs(events)] == [
        (4000, "aten::randn"), (4000, "aten::mul"), (4, "aten::randn")]
    assert [e[:2] for e in events if e[0] == "f"][:2] == [("f", 1), ("f", 2)]


def test_wrapper_subclass_parameters_are_their_inner_tensors(tmp_path):
    inner = torch.randn(10, 10)
    path = tmp_path / "t.events"
    with vramscope_trace.record(path, inputs=[_TraceableWrapper(inner)]):
        pass
    assert [(e[2], e[3]) for e in allocs(events_of(path))] == [(400, "other")]


def test_a_wrapper_without_bytes_of_its_own_is_not_counted(tmp_path):
    # No flatten protocol: its own storage is a placeholder of the logical size (2.x)
    # or not accessible at all (1.13); either way it allocates nothing.
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        w = _Wrapper(torch.randn(1000))
        y = w * 2  # the inner aten::mul runs inside the subclass, unseen
        del w, y
    assert [(e[2], e[4]) for e in allocs(events_of(path))] == [(4000, "aten::randn")]


def test_storage_resize_frees_and_reallocates(tmp_path):
    # FSDP frees unsharded parameters with untyped_storage().resize_(0) and brings them
    # back with resize_(n): no ATen op, so the recorder wraps UntypedStorage.resize_.
    # (Under a TorchFunctionMode, torch 1.13's Tensor._storage() answers a TypedStorage,
    # whose resize_ counts elements and calls UntypedStorage.resize_ with bytes.)
    path = tmp_path / "t.events"
    sizes = []
    with vramscope_trace.record(path):
        x = torch.empty(1000)
        storage = _torch_compat.untyped_storage(x)
        storage.resize_(0)
        torch.randn(1)
        storage.resize_(100)
        sizes.append(storage.nbytes())
        storage.resize_(200)
        sizes.append(storage.nbytes())
        del x, storage
        torch.randn(2)
    events = [e[:5] for e in events_of(path)]
    assert sizes[0] in (100, 400) and sizes[1] == 2 * sizes[0]
    assert events == [
        ("a", 1, 4000, "other", "aten::empty"), ("f", 1),
        ("a", 2, 4, "other", "aten::randn"), ("f", 2),
        ("a", 3, sizes[0], "other", "UntypedStorage.resize_"),
        ("a", 4, sizes[1], "other", "UntypedStorage.resize_"), ("f", 3),
        ("f", 4), ("a", 5, 8, "other", "aten::randn"), ("f", 5)]
    assert "resize_" not in vars(torch.UntypedStorage)


def test_a_direct_torch_autograd_backward_starts_the_backward_phase(tmp_path):
    # torch.autograd.backward reaches no TorchFunctionMode in any torch version.
    model = mlp()
    path = tmp_path / "t.events"
    original = torch.autograd.backward
    with vramscope_trace.record(path, model=model):
        loss = model(torch.randn(4, 16)).sum()
        torch.autograd.backward(loss)
    assert torch.autograd.backward is original
    events = events_of(path)
    start = events.index(("p", 1, "backward"))
    ones = [i for i, e in enumerate(events) if e[0] == "a" and e[4] == "aten::ones_like"]
    assert ones and all(i > start for i in ones)  # the seed gradient belongs to backward


class _OptimizerWrapper(torch.optim.Optimizer):
    """Like wrappers that never call Optimizer.__init__: step hooks would never run."""

    def __init__(self, inner):  # pylint: disable=super-init-not-called
        self.inner = inner

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def step(self, closure=None):
        return self.inner.step(closure)

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none=set_to_none)


def test_optimizer_step_hooks_are_used_only_where_they_run(tmp_path):
    model = mlp()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    handles = _torch_compat.register_optimizer_step_hooks(sgd, print, print)
    if hasattr(torch.optim.Optimizer, "register_step_pre_hook"):  # torch >= 2.0
        assert handles is not None
        for handle in handles:
            handle.remove()
    else:
        assert handles is None
    wrapper = _OptimizerWrapper(sgd)
    assert _torch_compat.register_optimizer_step_hooks(wrapper, print, print) is None
    path = tmp_path / "t.events"
    vramscope_trace.record_step(model, (torch.randn(4, 16), None), lambda out, _: out.sum(),
                                wrapper, steps=2, path=path)
    phases = [e[1:] for e in events_of(path) if e[0] == "p"]
    assert phases == [(1, "forward"), (1, "backward"), (1, "optimizer"),
                      (2, "forward"), (2, "backward"), (2, "optimizer")]
    assert "step" not in vars(wrapper)


def test_every_empty_cache_entry_point_is_recorded(tmp_path):
    functions = _torch_compat.empty_cache_functions()
    assert (torch.cuda, "empty_cache") in functions
    before = [getattr(namespace, name) for namespace, name in functions]
    path = tmp_path / "t.events"
    with vramscope_trace.record(path):
        for namespace, name in functions:
            try:
                getattr(namespace, name)()
            except RuntimeError:  # some 2.x torch.accelerator builds refuse without a device
                pass
    assert events_of(path) == [("e",)] * len(functions)
    assert [getattr(namespace, name) for namespace, name in functions] == before


def test_higher_order_operators_pass_through_the_dispatch_mode():
    # torch 2.x raises NotImplementedError for a HOP under a user dispatch mode unless
    # the mode accepts them (torch/_ops.py); 1.13 has no HOPs and ignores the flag.
    assert DispatchMode.supports_higher_order_operators is True


def test_inner_tensors_only_for_the_flatten_protocol():
    assert _torch_compat.inner_tensors(torch.randn(2)) is None
    assert _torch_compat.inner_tensors(nn.Parameter(torch.randn(2))) is None
    assert _torch_compat.inner_tensors(_Wrapper(torch.randn(2))) is None
    inner = torch.randn(2)
    assert _torch_compat.inner_tensors(_TraceableWrapper(inner))[0] is inner


@pytest.mark.parametrize("make", [lambda: torch.randn(3), lambda: torch.empty(3, device="meta")])
def test_real_storage_of_plain_and_meta_tensors(make):
    tensor = make()
    storage = _torch_compat.real_storage(tensor)
    assert storage is not None and storage.nbytes() == 12
    assert _torch_compat.storage_key(storage) == _torch_compat.storage_id(tensor)
