#!/usr/bin/python3
"""Writes tests/data/snapshots/stacks_all.pickle: make_snapshots.py's training run as a
snapshot recorded with torch.cuda.memory._record_memory_history(stacks="all"), over 12
identical steps (no torch needed).

    /usr/bin/python3 tests/snapshots/make_stacks_all.py

With stacks="all" every frame list is CapturedTraceback's combined traceback
(torch/csrc/profiler/combined_traceback.cpp, symbolized innermost first): the unwinder's
own frames (torch::unwind::unwind, CapturedTraceback::gather), the caching allocator, the
dispatcher and ATen's tensor factories, the op's kernel wrapper, the Python binding, then
the Python frames where the interpreter's frames were (PyEval_* and friends between them),
and the thread's start at the bottom. The autograd engine's device threads have C++ frames
only. The C++ names and files below are the ones torch 2.x symbolizes for these frames
(torch/cuda/_memory_viz.py _frame_filter lists the ones it hides). Deterministic; commit
the output.
"""
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_snapshots as ms  # noqa: E402

PT = "/pytorch"
# Innermost first: what every allocation's stack starts with.
TOP = (("torch::unwind::unwind()", f"{PT}/torch/csrc/profiler/unwind/unwind.cpp", 356),
       ("torch::CapturedTraceback::gather(bool, bool, bool)",
        f"{PT}/torch/csrc/profiler/combined_traceback.cpp", 49),
       ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
        "unsigned long, CUstream_st*)", f"{PT}/c10/cuda/CUDACachingAllocator.cpp", 1417),
       ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
        f"{PT}/c10/cuda/CUDACachingAllocator.cpp", 3888),
       ("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, "
        "c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
        f"{PT}/aten/src/ATen/EmptyTensor.cpp", 150),
       ("at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, "
        "std::optional<c10::MemoryFormat>)", f"{PT}/aten/src/ATen/cuda/EmptyTensor.cpp", 23))
DISPATCH = (("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)",
             f"{PT}/build/aten/src/ATen/Operators_2.cpp", 4153),
            ("c10::impl::wrap_kernel_functor_unboxed_<...>::call(...)",
             f"{PT}/aten/src/ATen/core/boxing/impl/make_boxed_from_unboxed_functor.h", 485))
BINDING = (("torch::autograd::THPVariable_linear(_object*, _object*, _object*)",
            f"{PT}/torch/csrc/autograd/generated/python_nn_functions.cpp", 2291),
           ("_PyEval_EvalFrameDefault", "/usr/local/src/conda/python-3.11/Python/ceval.c", 5018),
           ("PyObject_Call", "/usr/local/src/conda/python-3.11/Objects/call.c", 355))
BOTTOM = (("Py_BytesMain", "/usr/local/src/conda/python-3.11/Modules/main.c", 734),
          ("__libc_start_main", "??", 0), ("_start", "??", 0))
THREAD = (("start_thread", "./nptl/pthread_create.c", 442), ("__clone3", "??", 0))


class AllFrames(ms.Frames):
    """make_snapshots.Frames with the C++ frames of a stacks="all" recording around them."""

    def stack(self, *frames):
        python = any(f[1].endswith(".py") for f in frames)
        if python:
            full = TOP + DISPATCH + BINDING + frames + BOTTOM
        else:  # the autograd engine's thread (or a workspace made there)
            full = TOP + DISPATCH + frames + THREAD
        return super().stack(*full)


def main():
    s = ms.strings()
    alloc = ms.MiniAllocator(1 << 62, s)
    ms.run_training(alloc, AllFrames(s), steps=12)
    snap = ms.build_snapshot(alloc, s, [], settings=True)
    path = os.path.join(ms.OUT, "stacks_all.pickle")
    ms.write(path, pickle.dumps(snap, protocol=4))
    print(f"{path}: {len(alloc.trace)} trace entries")


if __name__ == "__main__":
    main()
