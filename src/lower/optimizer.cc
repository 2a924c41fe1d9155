#include "optimizer.h"

#include <algorithm>
#include <map>

namespace vramscope::lower {
namespace {

std::vector<Param*> WithGrad(Tape& tape) {
  std::vector<Param*> out;
  for (Param& p : tape.params) {
    if (p.trainable && p.grad != kNoTensor) out.push_back(&p);
  }
  return out;
}

uint64_t Bytes(const Param& p) { return p.numel * p.elem_bytes; }

void AddState(Tape& tape, Param& p, uint64_t bytes, std::string_view op) {
  p.state.push_back(tape.graph.Alloc(bytes, Category::kOptimizerState, op, p.module));
}

// torch.optim AdamW with foreach (torch 2.x; read in torch/optim/adam.py of
// a 2.8+ copy, where AdamW is Adam with decoupled_weight_decay=True, and in
// the 2.4-era adamw.py _multi_tensor_adamw, which allocates the same):
// _multi_tensor_adam, per (device, dtype) group of
// Optimizer._group_tensors_by_device_and_dtype:
//  - step counters live on the CPU (torch.tensor(0.0) unless capturable or
//    fused) and are bumped there: no device bytes;
//  - decoupled weight decay (AdamW's default 1e-2) is _foreach_mul_ on the
//    params, _foreach_lerp_ / _foreach_mul_ / _foreach_addcmul_ update the
//    moments in place; the bias corrections and step sizes are Python floats;
//  - exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs): one full-size
//    temporary per parameter of the group, divided and offset in place,
//    consumed by _foreach_addcdiv_, and released when the name is rebound by
//    the next group (after that group's list exists) or when the function
//    returns.
// Not modelled: maximize (a _foreach_neg copy of the grads), Adam's coupled
// weight decay (a _foreach_add copy), amsgrad (a third state). Groups are
// keyed here by element size; torch iterates a hash map of (device, dtype),
// whose order is unspecified: smaller elements first here.
void AdamForeach(Tape& tape, const std::vector<Param*>& params) {
  std::map<uint8_t, std::vector<Param*>> groups;
  for (Param* p : params) groups[p->elem_bytes].push_back(p);
  std::vector<TensorId> previous;
  for (auto& [bytes, group] : groups) {
    std::vector<TensorId> sqrt_list;
    for (Param* p : group) {
      sqrt_list.push_back(
          tape.graph.Alloc(Bytes(*p), Category::kTemporaries, "aten::_foreach_sqrt", p->module));
    }
    // The previous group's list is released when the name is rebound.
    for (TensorId t : previous) tape.graph.Drop(t);
    previous = std::move(sqrt_list);
  }
  for (TensorId t : previous) tape.graph.Drop(t);
}

// torch.optim _single_tensor_adam (foreach=False; torch 2.x): per parameter,
// denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps): the sqrt
// temporary dies once divided; denom lives until the next parameter's denom
// replaces it.
// Stacked experts (transformers 5.x) are one tensor each: their temporaries
// have the whole stack's size, once.
void AdamForLoop(Tape& tape, const std::vector<Param*>& params) {
  std::map<uint32_t, uint64_t> stack_bytes;
  for (const Param* p : params) {
    if (p->stack != 0) stack_bytes[p->stack] += Bytes(*p);
  }
  TensorId denom = kNoTensor;
  for (Param* p : params) {
    uint64_t bytes = Bytes(*p);
    if (p->stack != 0) {
      auto it = stack_bytes.find(p->stack);
      if (it == stack_bytes.end()) continue;  // the stack's first member did it
      bytes = it->second;
      stack_bytes.erase(it);
    }
    TensorId sq = tape.graph.Alloc(bytes, Category::kTemporaries, "aten::sqrt", p->module);
    TensorId div = tape.graph.Alloc(bytes, Category::kTemporaries, "aten::div", p->module);
    tape.graph.Drop(sq);
    if (denom != kNoTensor) tape.graph.Drop(denom);
    denom = div;
  }
  if (denom != kNoTensor) tape.graph.Drop(denom);
}

// _multi_tensor_sgd: while some momentum_buffer is missing, each is
// torch.clone(grad).detach() (first step); later steps update the
// buffers in place (_foreach_mul_, _foreach_add_).
void SgdMomentumStep(Tape& tape, const std::vector<Param*>& params, bool first_step) {
  if (first_step) {
    for (Param* p : params) AddState(tape, *p, Bytes(*p), "aten::clone");
  }
}

// torch.optim Adam._init_group (torch 2.x, AdamW shares it from 2.7):
// per parameter in order, state["step"], then exp_avg and exp_avg_sq
// (zeros_like). `step` is a CPU tensor unless fused or capturable;
// fused keeps it on the device as a float32 scalar (_get_scalar_dtype
// (is_fused=True)): 4 bytes, one 512-byte small-pool block each.
// _fused_adamw then bumps the steps with _foreach_add_ and runs
// torch._fused_adamw_ in place: no temporaries.
void AdamWStep(Tape& tape, OptimizerKind kind, const std::vector<Param*>& params, bool first_step) {
  if (first_step) {
    for (Param* p : params) {
      // CPU rules: the "CPU tensor" step is on the device, float32 (4 bytes).
      if (kind == OptimizerKind::kAdamWFused || tape.cpu_rules) {
        AddState(tape, *p, 4, "aten::zeros");  // step
      }
      AddState(tape, *p, Bytes(*p), "aten::zeros_like");  // exp_avg
      AddState(tape, *p, Bytes(*p), "aten::zeros_like");  // exp_avg_sq
    }
  }
  if (kind == OptimizerKind::kAdamW) AdamForeach(tape, params);
  if (kind == OptimizerKind::kAdamWForLoop) AdamForLoop(tape, params);
}

// bitsandbytes Optimizer2State (read in bitsandbytes 0.50.2,
// bitsandbytes/optim/optimizer.py): step() walks the params in order and, at
// a param's first step, init_state allocates
//  - for p.numel() < min_8bit_size (4096), or 32-bit optimizers: state1 and
//    state2 as fp32 buffers of p's shape;
//  - otherwise state1 and state2 as uint8 buffers of p's shape, then absmax1
//    and absmax2 (torch.zeros, fp32, one per 256-value block), and, before the
//    first of them, the two 256-entry fp32 quantization maps moved to the GPU
//    once per optimizer (name2qmap["dynamic"], ["udynamic"]).
// get_state_buffer: a paged optimizer takes CUDA managed memory (F.get_paged,
// outside PyTorch's allocator) only for params of >= 1e5 elements; smaller
// ones get zeros_like on the device, and absmax is always on the device.
// update_step runs one in-place kernel per param: no temporaries.
void BitsAndBytesStep(Tape& tape, OptimizerKind kind, const std::vector<Param*>& params,
                      bool first_step, OptimizerExtras* extras) {
  constexpr uint64_t kMin8BitNumel = 4096;
  constexpr uint64_t kMinPagedNumel = 100000;
  constexpr uint64_t kBlock = 256;
  constexpr uint64_t kQmapBytes = 256 * 4;
  const bool paged = kind != OptimizerKind::kAdamW8bit;
  const bool eight_bit = kind != OptimizerKind::kPagedAdamW;
  if (!first_step) return;
  bool qmaps_on_device = false;
  for (Param* p : params) {
    const bool uint8_states = eight_bit && p->numel >= kMin8BitNumel;
    const uint64_t state_bytes = uint8_states ? p->numel : p->numel * 4;
    if (uint8_states && !qmaps_on_device) {
      AddState(tape, *p, kQmapBytes, "bnb::qmap_dynamic");
      AddState(tape, *p, kQmapBytes, "bnb::qmap_udynamic");
      qmaps_on_device = true;
    }
    for (const char* name : {"bnb::state1", "bnb::state2"}) {
      if (paged && p->numel >= kMinPagedNumel) {
        extras->managed_state_bytes += state_bytes;
      } else {
        AddState(tape, *p, state_bytes, name);
      }
    }
    if (uint8_states) {
      const uint64_t absmax_bytes = (p->numel + kBlock - 1) / kBlock * 4;
      AddState(tape, *p, absmax_bytes, "bnb::absmax1");
      AddState(tape, *p, absmax_bytes, "bnb::absmax2");
    }
  }
}

// transformers.optimization.Adafactor: factored second moment for 2-D
// params (row + column vectors), full for 1-D; no first moment by
// default. Per param: update = grad**2 + eps and the approximated
// update: two full-size fp32 temporaries.
void AdafactorStep(Tape& tape, const std::vector<Param*>& params, bool first_step) {
  for (Param* p : params) {
    if (first_step)
      AddState(tape, *p, std::max<uint64_t>(4, p->numel / 256 * 4), "adafactor::exp_avg_sq");
    TensorId a = tape.graph.Alloc(p->numel * 4, Category::kTemporaries, "aten::pow", p->module);
    TensorId b = tape.graph.Alloc(p->numel * 4, Category::kTemporaries, "aten::mul", p->module);
    tape.graph.Drop(a);
    tape.graph.Drop(b);
  }
}

// lion-pytorch: exp_avg state; update = exp_avg.clone().lerp_(grad).sign_()
void LionStep(Tape& tape, const std::vector<Param*>& params, bool first_step) {
  for (Param* p : params) {
    if (first_step) AddState(tape, *p, Bytes(*p), "aten::zeros_like");
    TensorId u = tape.graph.Alloc(Bytes(*p), Category::kTemporaries, "aten::clone", p->module);
    tape.graph.Drop(u);
  }
}

}  // namespace

void OptimizerStep(Tape& tape, const TrainingSetup& setup, bool first_step,
                   OptimizerExtras* extras) {
  tape.SetModule("optimizer");
  (void)first_step;  // state is created for params without state (torch.optim _init_group)
  OptimizerStepParams(tape, setup, WithGrad(tape), extras);
}

void OptimizerStepParams(Tape& tape, const TrainingSetup& setup, const std::vector<Param*>& params,
                         OptimizerExtras* extras) {
  // Lazy state (torch.optim _init_group; bitsandbytes init_state): a param
  // gets its state at its first step. All params step together except with
  // optimizer-in-backward, so "first" is per param.
  const bool first_step =
      !params.empty() && params.front()->state.empty() && !params.front()->stepped;
  for (Param* p : params) p->stepped = true;
  switch (setup.optimizer) {
    case OptimizerKind::kNone: return;
    case OptimizerKind::kSgd:
      // torch.optim _multi_tensor_sgd (torch 2.x, default weight_decay 0):
      // _foreach_add_(params, grads, alpha=-lr), in place.
      return;
    case OptimizerKind::kSgdMomentum: SgdMomentumStep(tape, params, first_step); return;
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdamWFused:
    case OptimizerKind::kAdamWForLoop: AdamWStep(tape, setup.optimizer, params, first_step); return;
    case OptimizerKind::kAdamW8bit:
    case OptimizerKind::kPagedAdamW8bit:
    case OptimizerKind::kPagedAdamW:
      BitsAndBytesStep(tape, setup.optimizer, params, first_step, extras);
      return;
    case OptimizerKind::kAdafactor: AdafactorStep(tape, params, first_step); return;
    case OptimizerKind::kLion: LionStep(tape, params, first_step); return;
  }
}

void ZeroGrad(Tape& tape) {
  for (Param& p : tape.params) {
    if (p.grad != kNoTensor) {
      tape.graph.Drop(p.grad);
      p.grad = kNoTensor;
    }
  }
}

}  // namespace vramscope::lower
