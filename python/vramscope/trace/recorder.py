"""The recorder: watches every ATen op of a training step and logs storage lifetimes.

How it sees things:
- every op, below autograd, through a TorchDispatchMode: an op output whose storage is
  new is an allocation (a view shares its base's storage and allocates nothing);
- the release of a storage, through a weak reference per live storage (storage_table.py),
  checked before each allocation is logged, so the live set is exact at every
  allocation;
- the module an op belongs to, through global nn.Module forward pre/post hooks; in
  backward, through a pre-hook on every autograd node created in forward, tagged with
  the module that created it (a TorchFunctionMode sees each node as it is made);
- the phase: forward starts when the model is called, backward when Tensor.backward /
  torch.autograd.grad is called (or the first tagged node runs), optimizer when an
  optimizer's step() is called.

Nothing the recorder holds keeps a tensor alive, so it changes no allocation of the
program it watches. One Recorder records one run; it is not reentrant. Its bookkeeping
takes a lock, because a backward pass over CUDA tensors calls it from autograd's device
thread while the calling thread may be running the CPU nodes of the same graph.
"""

import functools
import threading
import weakref

import torch

from . import _torch_compat as compat
from .event_writer import write_event_stream
from .records import (
    BACKWARD,
    BETWEEN,
    EXTERNAL,
    FORWARD_LOSS,
    FORWARD_MODEL,
    GRAD,
    LOSS,
    OPTIM,
    OPTIMIZER_STEP,
    PARAM,
    SETUP,
    AllocRecord,
)
from ._modes import DispatchMode, FunctionMode, make_node_prehook
from ._tensors import iter_tensors, resolve_device
from .result import summarise
from .storage_table import StorageTable

__version__ = "0.1.0"

_Tensor = torch.Tensor
_NODE_TAG = "vramscope_module"
_STORAGE_RESIZE = "UntypedStorage.resize_"


def _locked(method):
    """Runs `method` holding the recorder's lock (re-entrant: locked methods call each other)."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class Recorder:
    """Records storage allocations and frees of the code run between start() and stop().

    path: where the event stream is written at stop().
    model: the nn.Module being trained; calling it, or a module that wraps it (DDP, a
        DeepSpeed engine, FSDP made inside the recording), starts a forward phase. If
        None, the first module called at top level is taken as the model.
    optimizer: an optimizer or a list of them; their step() is the optimizer phase.
    inputs: tensors (nested lists/tuples/dicts) that exist before recording and should
        appear as setup allocations (the batch).
    device: only storages on this device are recorded (one trace = one GPU). Default:
        the device of the model's parameters.
    meta: extra (key, value) pairs for `meta` records.
    """

    def __init__(self, path, model=None, optimizer=None, inputs=None, device=None, meta=()):
        self.path = str(path)
        self.model = model
        if optimizer is None:
            self.optimizers = []
        elif isinstance(optimizer, (list, tuple)):
            self.optimizers = list(optimizer)
        else:
            self.optimizers = [optimizer]
        self._inputs = inputs
        self.device = resolve_device(device, model, self.optimizers, inputs)
        self._extra_meta = list(meta)
        self._table = StorageTable()
        self._events = []
        self._strings = [""]
        self._string_ids = {"": 0}
        self._op_ids = {}  # OpOverload -> string id
        self._resizes = {}  # OpOverload -> may change a storage's size
        self._next_alloc_id = 1
        self._num_allocations = 0
        self._step = 0
        self._phase = "setup"
        self._phase_index = 0
        self._region = SETUP
        self._module_stack = []  # (id(module), string id)
        self._module_ids = {}  # id(module) -> string id
        self._wraps_model = {}  # id(top-level module) -> whether self.model is inside it
        self._backward_module = 0
        self._backward_depth = 0
        self._backward_funcs = compat.backward_functions()
        self._prehooks = {}  # module string id -> node pre-hook
        # Weak references: a parameter that a wrapper replaces while we record (FSDP's
        # sharding, DeepSpeed's flattening) must be freed as it would be unrecorded.
        self._params = []
        self._param_modules = {}  # id(parameter) -> string id of the module owning it
        self._handles = []
        self._restores = []
        self._modes = []
        self._active = False
        self._lock = threading.RLock()
        self.result = None

    # ----------------------------------------------------------------- lifecycle

    def start(self):
        if self._active or self.result is not None:
            raise RuntimeError("a Recorder records once; make a new one")
        try:
            if self.model is not None:
                self._name_modules(self.model)
            self._register_existing()
            self._install_hooks()
            self._active = True
            for mode in (FunctionMode(self), DispatchMode(self)):
                mode.__enter__()
                self._modes.append(mode)
        except BaseException:
            for mode in reversed(self._modes):
                mode.__exit__(None, None, None)
            self._modes = []
            self._active = False
            self._uninstall_hooks()
            self._table.release()
            raise
        return self

    def stop(self):
        """Stops recording and writes the file; returns a RecordResult."""
        if not self._active:
            return self.result
        try:
            for mode in reversed(self._modes):
                mode.__exit__(None, None, None)
        finally:
            self._active = False
            self._modes = []
            self._uninstall_hooks()
        self._collect_frees()
        self._table.release()
        meta = [("source", "vramscope-python-recorder"),
                ("recorder-version", __version__),
                ("torch", torch.__version__),
                ("device", str(self.device) if self.device is not None else "all"),
                ("steps", str(self._step))]
        if self.model is not None:
            meta.append(("model", type(self.model).__name__))
        if self.optimizers:
            meta.append(("optimizer", ",".join(type(o).__name__ for o in self.optimizers)))
        meta.extend(self._extra_meta)
        file_bytes = write_event_stream(self.path, meta, self._strings, self._events)
        self.result = self._summarise(file_bytes)
        return self.result

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        self.stop()
        return False

    @_locked
    def add_optimizer(self, optimizer):
        """Watches an optimizer made after recording started (DeepSpeed's, inside
        deepspeed.initialize; one over FSDP's sharded parameters): its step() is an
        optimizer phase from now on, its parameters' gradients are marked as such, and
        its parameters and state that exist already are adopted."""
        if not self._active:
            raise RuntimeError("add_optimizer: the recorder is not recording")
        self.optimizers.append(optimizer)
        known = {id(p) for p in self._live_params()}
        for group in optimizer.param_groups:
            for tensor in group["params"]:
                self._adopt(tensor, PARAM, self._param_modules.get(id(tensor), 0))
                if id(tensor) not in known:
                    known.add(id(tensor))
                    self._params.append(weakref.ref(tensor))
                    self._hook_grad(tensor)
        self._scan_optimizer_state(optimizer)
        handles = compat.register_optimizer_step_hooks(
            optimizer, self._on_optimizer_pre, self._on_optimizer_post)
        if handles is not None:
            self._handles.extend(handles)
        else:
            self._patch_step(optimizer)

    # ----------------------------------------------------------------- setup

    def _intern(self, text):
        string_id = self._string_ids.get(text)
        if string_id is None:
            string_id = len(self._strings)
            self._strings.append(text)
            self._string_ids[text] = string_id
        return string_id

    def _name_modules(self, model):
        for name, module in model.named_modules():
            path = "model." + name if name else "model"
            self._module_ids.setdefault(id(module), self._intern(path))

    def _module_id(self, module):
        string_id = self._module_ids.get(id(module))
        if string_id is None:
            # A module outside the model (a loss module) or made during forward.
            name = type(module).__name__
            if self._module_stack:
                name = self._strings[self._module_stack[-1][1]] + "." + name
            string_id = self._intern(name)
            self._module_ids[id(module)] = string_id
        return string_id

    def _register_existing(self):
        """Storages alive before recording become setup allocations, so a trace stands alone."""
        params = {}
        if self.model is not None:
            for module in self.model.modules():
                module_id = self._module_ids.get(id(module), 0)
                for tensor in module.parameters(recurse=False):
                    params.setdefault(id(tensor), tensor)
                    self._param_modules.setdefault(id(tensor), module_id)
                    self._adopt(tensor, PARAM, module_id, external=False)
                for tensor in module.buffers(recurse=False):
                    self._adopt(tensor, PARAM, module_id, external=False)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for tensor in group["params"]:
                    params.setdefault(id(tensor), tensor)
                    self._adopt(tensor, PARAM, 0, external=False)
        self._params = [weakref.ref(p) for p in params.values()]
        self._scan_grads()
        for optimizer in self.optimizers:
            self._scan_optimizer_state(optimizer)
        for tensor in iter_tensors(self._inputs):
            self._adopt(tensor, 0, 0)

    def _install_hooks(self):
        self._handles.append(compat.register_module_forward_pre_hook(self._on_module_pre))
        self._handles.append(compat.register_module_forward_hook(self._on_module_post))
        for optimizer in self.optimizers:
            handles = compat.register_optimizer_step_hooks(
                optimizer, self._on_optimizer_pre, self._on_optimizer_post)
            if handles is not None:
                self._handles.extend(handles)
            else:
                self._patch_step(optimizer)
        for param in self._live_params():
            self._hook_grad(param)
        for namespace, name in compat.empty_cache_functions():
            self._wrap_attribute(namespace, name, self._empty_cache_wrapper)
        # torch.autograd.backward reaches no TorchFunctionMode (see backward_functions).
        self._wrap_attribute(torch.autograd, "backward", self._backward_wrapper)
        # UntypedStorage.resize_ is no ATen op: FSDP frees and re-allocates through it.
        self._wrap_attribute(torch.UntypedStorage, "resize_", self._storage_resize_wrapper)

    def _hook_grad(self, param):
        """Marks the parameter's .grad as a gradient once autograd has accumulated it."""
        if not compat.HAS_POST_ACCUMULATE_GRAD_HOOK or not param.requires_grad:
            return
        try:
            self._handles.append(param.register_post_accumulate_grad_hook(
                lambda p: self._mark(p.grad, GRAD)))
        except RuntimeError:
            pass  # not a leaf: the scans after backward() still find its grad

    def _wrap_attribute(self, owner, name, make_wrapper):
        """Replaces owner.name with make_wrapper(original) until the recording stops."""
        had_own = name in vars(owner)
        previous = vars(owner).get(name)
        original = getattr(owner, name)
        wrapper = make_wrapper(original)
        setattr(owner, name, wrapper)

        def restore():
            if vars(owner).get(name) is wrapper:
                if had_own:
                    setattr(owner, name, previous)
                else:
                    delattr(owner, name)

        self._restores.append(restore)

    def _empty_cache_wrapper(self, original):
        @functools.wraps(original)
        def empty_cache(*args, **kwargs):
            if self._active:
                self._on_empty_cache()
            return original(*args, **kwargs)

        return empty_cache

    def _backward_wrapper(self, original):
        @functools.wraps(original)
        def backward(*args, **kwargs):
            if not self._active:
                return original(*args, **kwargs)
            return self._run_backward(original, args, kwargs)

        return backward

    def _storage_resize_wrapper(self, original):
        @functools.wraps(original)
        def resize_(storage, size):
            out = original(storage, size)
            if self._active:
                self._on_storage_resized(storage)
            return out

        return resize_

    def _patch_step(self, optimizer):
        """Wraps this optimizer's step() where step hooks are missing (torch < 2.0) or would
        not run (see _torch_compat.register_optimizer_step_hooks)."""
        had_own = "step" in optimizer.__dict__
        previous = optimizer.__dict__.get("step")
        original = optimizer.step

        def step(*args, **kwargs):
            self._on_optimizer_pre(optimizer)
            try:
                return original(*args, **kwargs)
            finally:
                self._on_optimizer_post(optimizer)

        optimizer.step = step

        def restore():
            if optimizer.__dict__.get("step") is step:
                if had_own:
                    optimizer.step = previous
                else:
                    del optimizer.step

        self._restores.append(restore)

    def _uninstall_hooks(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for restore in reversed(self._restores):
            restore()
        self._restores = []

    # ----------------------------------------------------------------- storages

    def _adopt(self, tensor, flags, module_id, op_id=0, external=True, collect=True):
        """Marks `tensor`'s storage with `flags`, registering it first if it is new.

        A storage registered here by anything but an op output (external=True) was made
        before recording or outside ATen. `collect` first logs the frees that happened
        since the last check, so the new allocation lands after them. A wrapper tensor
        subclass (DTensor, ...) owns no bytes: the tensors inside it are adopted instead.
        """
        if type(tensor) is not _Tensor:
            inner = compat.inner_tensors(tensor)
            if inner is not None:
                for item in inner:
                    self._adopt(item, flags, module_id, op_id, external, collect)
                return
        try:
            key = compat.storage_id(tensor)
        except RuntimeError:
            return
        record = self._table.get(key)
        if record is not None:
            record.flags |= flags
            return
        if self.device is not None and tensor.device != self.device:
            return
        storage = compat.real_storage(tensor)
        if storage is None:
            return
        self._register(key, storage, storage.nbytes(), flags, module_id, op_id, external,
                       collect)

    def _register(self, key, storage, size_bytes, flags, module_id, op_id, external, collect):
        if collect and self._active:
            self._collect_frees()
        if external:
            flags |= EXTERNAL
        record = AllocRecord(self._next_alloc_id, size_bytes, op_id, module_id,
                             self._phase_index, flags, self._region)
        self._next_alloc_id += 1
        self._num_allocations += 1
        self._table.add(key, storage, record)
        self._events.append(("a", record))

    @_locked
    def _mark(self, tensor, flags):
        if isinstance(tensor, _Tensor):
            self._adopt(tensor, flags, self._current_module())

    def _current_module(self):
        if self._module_stack:
            return self._module_stack[-1][1]
        if self._phase == "backward":
            return self._backward_module
        return 0

    def _op_id(self, func):
        op_id = self._op_ids.get(func)
        if op_id is None:
            op_id = self._intern(compat.op_name(func))
            self._op_ids[func] = op_id
        return op_id

    @_locked
    def _see_inputs(self, args, kwargs):
        """Storages first met as op inputs were made outside ATen or before recording."""
        live = self._table._live
        storage_id = compat.storage_id
        for arg in args:
            if isinstance(arg, _Tensor):
                try:
                    if storage_id(arg) in live:
                        continue
                except RuntimeError:
                    continue
                self._adopt(arg, 0, self._current_module())
            elif isinstance(arg, (list, tuple)):
                for item in arg:
                    if isinstance(item, _Tensor):
                        try:
                            if storage_id(item) in live:
                                continue
                        except RuntimeError:
                            continue
                        self._adopt(item, 0, self._current_module())
        if kwargs:
            for value in kwargs.values():
                if isinstance(value, _Tensor):
                    try:
                        if storage_id(value) in live:
                            continue
                    except RuntimeError:
                        continue
                    self._adopt(value, 0, self._current_module())

    @_locked
    def _see_outputs(self, func, out):
        if isinstance(out, _Tensor):
            outs = (out,)
        elif isinstance(out, (list, tuple)):
            outs = list(iter_tensors(out))
        else:
            return
        live = self._table._live
        storage_id = compat.storage_id
        resizes = self._resizes.get(func)
        if resizes is None:
            resizes = self._resizes[func] = compat.mutates_storage_size(func)
        new = None
        for tensor in outs:
            try:
                key = storage_id(tensor)
            except RuntimeError:
                continue
            record = live.get(key)
            if record is None:
                if new is None:
                    new = []
                new.append(tensor)
            elif resizes:
                self._check_resize(func, key, tensor, record)
        if new is not None:
            self._collect_frees()
            op_id = self._op_id(func)
            module_id = self._current_module()
            for tensor in new:
                self._adopt(tensor, 0, module_id, op_id, external=False, collect=False)

    def _check_resize(self, func, key, tensor, record):
        """resize_/set_/out= may give a live storage a new size: a new allocation, then a free."""
        try:
            size_bytes = compat.untyped_storage(tensor).nbytes()
        except RuntimeError:
            return
        if size_bytes != record.size_bytes:
            self._resized(key, record, size_bytes, self._op_id(func))

    def _resized(self, key, record, size_bytes, op_id):
        self._collect_frees()
        if size_bytes == 0:  # the bytes are gone, the (empty) storage lives on
            self._table.discard(key)
            record.free_phase_index = self._phase_index
            self._events.append(("f", record))
            return
        grown = AllocRecord(self._next_alloc_id, size_bytes, op_id,
                            self._current_module(), self._phase_index, record.flags,
                            self._region)
        self._next_alloc_id += 1
        self._num_allocations += 1
        old = self._table.replace(key, grown)
        self._events.append(("a", grown))
        old.free_phase_index = self._phase_index
        self._events.append(("f", old))

    @_locked
    def _on_storage_resized(self, storage):
        """UntypedStorage.resize_ ran (FSDP's free and re-allocation of parameters)."""
        key = compat.storage_key(storage)
        size_bytes = storage.nbytes()
        record = self._table.get(key)
        if record is not None:
            if size_bytes != record.size_bytes:
                self._resized(key, record, size_bytes, self._intern(_STORAGE_RESIZE))
        elif size_bytes and (self.device is None or storage.device == self.device):
            self._register(key, storage, size_bytes, 0, self._current_module(),
                           self._intern(_STORAGE_RESIZE), False, True)

    @_locked
    def _on_empty_cache(self):
        self._collect_frees()
        self._events.append(("e",))

    @_locked
    def _collect_frees(self):
        dead = self._table.collect_dead()
        if dead:
            phase_index = self._phase_index
            append = self._events.append
            for record in dead:
                record.free_phase_index = phase_index
                append(("f", record))

    def _live_params(self):
        return [p for p in (ref() for ref in self._params) if p is not None]

    def _scan_grads(self):
        for param in self._live_params():
            grad = param.grad
            if grad is not None:
                self._adopt(grad, GRAD, self._param_modules.get(id(param), 0))

    def _scan_optimizer_state(self, optimizer):
        for state in optimizer.state.values():
            for tensor in iter_tensors(state):
                self._adopt(tensor, OPTIM, 0)

    # ----------------------------------------------------------------- phases

    def _set_phase(self, phase, step):
        self._collect_frees()
        if phase != self._phase or step != self._step:
            self._phase = phase
            self._step = step
            self._phase_index += 1
            self._events.append(("p", step, phase))

    def _begin_forward(self):
        step = self._step
        if self._phase in ("setup", "optimizer") or (self._phase == "backward"
                                                      and not self.optimizers):
            step += 1
        self._set_phase("forward", step)
        self._region = FORWARD_MODEL

    def _begin_backward(self, roots):
        if roots is not None:
            for tensor in iter_tensors(roots):
                self._adopt(tensor, LOSS, 0)
        self._set_phase("backward", self._step)
        self._region = BACKWARD
        self._backward_module = 0

    def _run_backward(self, func, args, kwargs):
        with self._lock:
            if self._backward_depth == 0:
                roots = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
                self._begin_backward(roots)
            self._backward_depth += 1
        try:
            return func(*args, **kwargs)  # unlocked: autograd's threads call back into us
        finally:
            with self._lock:
                self._backward_depth -= 1
                if self._backward_depth == 0 and self._active:
                    self._collect_frees()
                    self._scan_grads()

    @_locked
    def _on_module_pre(self, module, inputs):
        if not self._active:
            return
        if self._backward_depth == 0:
            if self.model is None and not self._module_stack:
                self.model = module
                self._name_modules(module)
            if module is self.model or (not self._module_stack and self._wraps(module)):
                self._begin_forward()
        self._module_stack.append((id(module), self._module_id(module)))

    def _wraps(self, module):
        """Whether a module called at top level holds the model (a wrapper made inside the
        recording: its own forward work, DDP's bucket rebuild or ZeRO's gathers, belongs
        to the forward). Asked once per module."""
        known = self._wraps_model.get(id(module))
        if known is None:
            known = any(m is self.model for m in module.modules())
            self._wraps_model[id(module)] = known
        return known

    @_locked
    def _on_module_post(self, module, inputs, outputs):
        if not self._active:
            return
        stack = self._module_stack
        module_key = id(module)
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == module_key:
                del stack[i:]
                break
        if module is self.model and self._backward_depth == 0 and self._phase == "forward":
            self._region = FORWARD_LOSS
            for tensor in iter_tensors(outputs):
                self._adopt(tensor, LOSS, 0)

    @_locked
    def _on_optimizer_pre(self, optimizer):
        if not self._active:
            return
        self._set_phase("optimizer", self._step)
        self._region = OPTIMIZER_STEP

    @_locked
    def _on_optimizer_post(self, optimizer):
        if not self._active:
            return
        self._collect_frees()
        self._scan_optimizer_state(optimizer)
        self._scan_grads()
        self._region = BETWEEN

    # ----------------------------------------------------------------- autograd nodes

    @_locked
    def _tag_node(self, node):
        """Remembers which module made `node`; its pre-hook names that module in backward."""
        metadata = node.metadata
        if _NODE_TAG in metadata:
            return
        module_id = self._module_stack[-1][1] if self._module_stack else 0
        metadata[_NODE_TAG] = module_id
        hook = self._prehooks.get(module_id)
        if hook is None:
            hook = self._prehooks[module_id] = make_node_prehook(weakref.ref(self), module_id)
        try:
            node.register_prehook(hook)
        except (AttributeError, RuntimeError):
            pass  # a node kind without pre-hooks: its backward ops keep the previous module

    @_locked
    def _on_backward_node(self, module_id):
        if not self._active:
            return
        if self._backward_depth == 0 and self._phase != "backward":
            self._begin_backward(None)  # backward started by an entry point we did not see
        self._backward_module = module_id

    # ----------------------------------------------------------------- summary

    def _summarise(self, file_bytes):
        return summarise(self.path, self._events, file_bytes, self._num_allocations, self._step)
