#include "stack_tags.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace vramscope::snapshot {
namespace {

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != s.npos; }
bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}
bool OneOf(std::string_view s, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), s) != names.end();
}

// torch/nn/modules/module.py (torch 2.0-2.11): __call__ is _wrapped_call_impl
// -> _call_impl -> forward; Module.to / .cuda / .half go through _apply.
uint32_t ModuleFrameTags(std::string_view name) {
  if (OneOf(name, {"_call_impl", "_wrapped_call_impl"})) return kTagForward;
  if (OneOf(name,
            {"_apply", "to", "cuda", "half", "bfloat16", "float", "to_empty", "load_state_dict",
             "_load_from_state_dict", "register_parameter", "register_buffer"})) {
    return kTagLoad;
  }
  return 0;
}

}  // namespace

uint32_t FrameTags(std::string_view name, std::string_view file) {
  uint32_t tags = 0;
  if (EndsWith(file, "torch/nn/modules/module.py")) tags |= ModuleFrameTags(name);
  if (name == "forward") tags |= kTagForward;

  // Optimizer.step is wrapped by optimizer.py's profile hook ("wrapper");
  // the work happens in torch/optim/<name>.py (_init_group creates the
  // state, _multi_tensor_* / _fused_* / _single_tensor_* update it).
  if (Contains(file, "torch/optim/")) {
    if (name == "zero_grad") {
      tags |= kTagZeroGrad;
    } else if (!Contains(file, "lr_scheduler")) {
      tags |= kTagOptimizer;
    }
  }
  // GradScaler.unscale_ / step / update allocate found_inf and friends.
  if (EndsWith(file, "amp/grad_scaler.py")) tags |= kTagOptimizer;
  // bitsandbytes 8-bit / paged optimizers.
  if (Contains(file, "bitsandbytes/optim/")) tags |= kTagOptimizer;

  // Tensor.backward -> torch.autograd.backward -> _engine_run_backward
  // (torch/autograd/graph.py, 2.2+) on the main thread; the engine's device
  // threads run the nodes (C++ frames with stacks="all", none otherwise).
  if (name == "backward" &&
      (EndsWith(file, "torch/_tensor.py") || EndsWith(file, "torch/autograd/__init__.py"))) {
    tags |= kTagBackward;
  }
  if (name == "_engine_run_backward" || Contains(name, "torch::autograd::Engine::") ||
      Contains(name, "torch::autograd::generated::") || Contains(name, "autograd::engine::") ||
      Contains(name, "torch::autograd::PyNode") || Contains(name, "torch::autograd::CppNode")) {
    tags |= kTagBackward;
  }
  if (Contains(name, "AccumulateGrad") || Contains(name, "accumulate_grad") ||
      Contains(name, "accumulateGrad")) {
    tags |= kTagAccumulateGrad | kTagBackward;
  }

  // Model loading and construction: transformers' from_pretrained and its
  // loaders (4.x), accelerate's dispatch, module constructors.
  if (OneOf(name, {"from_pretrained", "_load_pretrained_model", "_load_state_dict_into_meta_model",
                   "load_state_dict", "set_module_tensor_to_device", "load_checkpoint_and_dispatch",
                   "load_checkpoint_in_model", "dispatch_model", "reset_parameters",
                   "_init_weights", "init_weights", "post_init", "_initialize_weights"})) {
    tags |= kTagLoad;
  }
  if (name == "__init__" && Contains(file, "torch/nn/modules/")) tags |= kTagLoad;

  // Losses: torch.nn.functional (cross_entropy = log_softmax + nll_loss),
  // loss modules, transformers' loss_utils.py (ForCausalLMLoss, 4.46+).
  if (Contains(name, "cross_entropy") || Contains(name, "nll_loss") ||
      Contains(name, "log_softmax") || Contains(name, "mse_loss") ||
      OneOf(name, {"ForCausalLMLoss", "fixed_cross_entropy", "loss_function"}) ||
      EndsWith(file, "torch/nn/modules/loss.py") || EndsWith(file, "loss_utils.py")) {
    tags |= kTagLoss;
  }

  if (Contains(file, "torch/distributed/") || EndsWith(file, "torch/nn/parallel/distributed.py") ||
      Contains(name, "c10d::") || Contains(name, "ProcessGroupNCCL") || Contains(name, "nccl") ||
      Contains(name, "NCCL") || Contains(name, "Reducer::")) {
    tags |= kTagComm;
  }
  // cuBLAS: getCurrentCUDABlasHandle -> getNewWorkspace / getCUDABlasLtWorkspace;
  // cuDNN and others name their workspace buffers too.
  if (Contains(name, "Workspace") || Contains(name, "workspace")) tags |= kTagWorkspace;
  if (Contains(file, "torch/utils/checkpoint.py")) tags |= kTagCheckpoint;
  return tags;
}

namespace {

std::string_view BaseName(std::string_view file) {
  const size_t slash = file.find_last_of('/');
  return slash == file.npos ? file : file.substr(slash + 1);
}

// Library code the user did not write: prefer the first frame outside it.
bool IsTorchFile(std::string_view file) {
  return Contains(file, "/torch/") || file.rfind("torch/", 0) == 0;
}

// Frames that say nothing about who asked for the memory, in a stack recorded
// with C++ frames (stacks="all"): the unwinder and the traceback gatherer at
// the top, the interpreter's own frames (torch 2.13 torch/cuda/_memory_viz.py
// _frame_filter omits these), and between an op and cudaMalloc the caching
// allocator, the dispatcher and ATen's tensor factories.
bool IsRuntimeFrame(std::string_view name, std::string_view file) {
  static constexpr std::string_view kNames[] = {
      // _memory_viz.py omit_functions
      "unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start",
      "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_",
      // the allocator, the dispatcher, tensor factories, thread start
      "CUDACachingAllocator", "c10::cuda::", "c10::Dispatcher", "c10::impl::", "c10::BoxedKernel",
      "c10::KernelFunction", "at::_ops::", "at::detail::empty", "at::native::empty", "at::empty",
      "at::TensorBase at::detail::", "start_thread", "__clone"};
  // _memory_viz.py omit_filenames, and the allocator's source file.
  static constexpr std::string_view kFiles[] = {"core/boxing",
                                                "/Register",
                                                "/Redispatch",
                                                "pythonrun.c",
                                                "Modules/main.c",
                                                "Objects/call.c",
                                                "Objects/methodobject.c",
                                                "pycore_ceval.h",
                                                "ceval.c",
                                                "cpython/abstract.h",
                                                "CUDACachingAllocator"};
  if (EndsWith(file, ".py")) return false;
  for (std::string_view n : kNames) {
    if (Contains(name, n)) return true;
  }
  for (std::string_view f : kFiles) {
    if (Contains(file, f)) return true;
  }
  return false;
}

std::string ShortName(std::string_view name) {
  // C++ names: drop the argument list and keep the last two scopes.
  if (const size_t paren = name.find('('); paren != name.npos && paren > 0) {
    name = name.substr(0, paren);
  }
  if (name.size() > 60) name = name.substr(name.size() - 60);
  return std::string(name);
}

// The op is the innermost Python frame (what a stacks="python" snapshot has
// first); without one (the autograd engine's threads) the innermost frame
// that is not the runtime's (IsRuntimeFrame), so a stacks="all" snapshot
// names torch.nn.functional's linear or MmBackward0, not torch::unwind.
StackInfo Classify(const Snapshot& snapshot, const std::vector<uint32_t>& stack,
                   const std::vector<uint32_t>& frame_tags) {
  StackInfo info;
  const SnapshotFrame* user = nullptr;
  const SnapshotFrame* python = nullptr;
  const SnapshotFrame* native = nullptr;  // innermost non-runtime C++ frame
  for (uint32_t f : stack) {
    info.tags |= frame_tags[f];
    const SnapshotFrame& frame = snapshot.frames[f];
    if (EndsWith(frame.filename, ".py")) {
      if (python == nullptr) python = &frame;
      if (user == nullptr && !IsTorchFile(frame.filename)) user = &frame;
    } else if (native == nullptr && !IsRuntimeFrame(frame.name, frame.filename)) {
      native = &frame;
    }
  }
  if (stack.empty()) return info;
  const SnapshotFrame* site = user != nullptr ? user : python;
  const SnapshotFrame* op = python != nullptr   ? python
                            : native != nullptr ? native
                                                : &snapshot.frames[stack.front()];
  if (site != nullptr) {
    info.site = fmt::format("{}:{} {}", BaseName(site->filename), site->line, site->name);
  } else {
    info.site = ShortName(op->name);
  }
  info.op = ShortName(op->name);
  return info;
}

}  // namespace

std::vector<StackInfo> ClassifyStacks(const Snapshot& snapshot) {
  std::vector<uint32_t> frame_tags(snapshot.frames.size());
  for (size_t i = 0; i < snapshot.frames.size(); ++i) {
    frame_tags[i] = FrameTags(snapshot.frames[i].name, snapshot.frames[i].filename);
  }
  std::vector<StackInfo> infos;
  infos.reserve(snapshot.stacks.size());
  for (const auto& stack : snapshot.stacks) infos.push_back(Classify(snapshot, stack, frame_tags));
  return infos;
}

}  // namespace vramscope::snapshot
