// The lowering context: a Graph plus what PyTorch eager needs to decide
// dtypes and the autocast cache, and the model's parameters as leaves.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "autograd.h"

namespace vramscope::lower {

inline constexpr uint8_t kF32 = 4;
inline constexpr uint8_t kHalf = 2;  // bf16 or fp16: never mixed in one run
inline constexpr uint8_t kI64 = 8;
inline constexpr uint8_t kBool = 1;

// LitGPT's LoRAQKVLinear (litgpt/lora.py 0.5.13): one adapter pair over the
// fused qkv Linear, on the q, k and v slices that `enable_lora` selects.
struct LitgptQkvLora {
  uint64_t q_out = 0;   // n_head * head_size (0: not a LoRAQKVLinear)
  uint64_t kv_out = 0;  // n_query_groups * head_size
  bool q = false, k = false, v = false;
  uint64_t batch = 1;  // rows of a micro-batch (a transposed [b, s, r] gradient is copied when > 1)
  bool index_made = false;  // the lazily registered `_lora_ind` buffer exists
  uint64_t Parts() const { return uint64_t{q} + uint64_t{k} + uint64_t{v}; }
  // Out features of the adapted slices: lora_B's rows, the conv1d's channels.
  uint64_t AdaptedOut() const { return (q ? q_out : 0) + (k ? kv_out : 0) + (v ? kv_out : 0); }
};

// One parameter tensor (a leaf).
struct Param {
  std::string name;
  uint32_t module = 0;  // interned module path
  uint64_t numel = 0;
  uint8_t elem_bytes = kF32;
  uint64_t storage_bytes = 0;  // differs from numel*elem_bytes for NF4
  bool trainable = true;
  // A leaf with requires_grad=True that nothing trains (TRL's DPO reference:
  // from_pretrained leaves it on): autocast still caches its casts.
  bool requires_grad = false;
  bool nf4 = false;              // bitsandbytes Params4bit (QLoRA base weight)
  Var var;                       // leaf Var (fn = AccumulateGrad when trainable)
  TensorId grad = kNoTensor;     // .grad (kNoTensor: None)
  std::vector<TensorId> state;   // optimizer state tensors
  bool stepped = false;          // has been through an optimizer step (state is lazy)
  Var cast;                      // autocast cache entry (this forward); t = kNoTensor: none
  int lora_a = -1, lora_b = -1;  // indices of PEFT adapters in Tape::params
  LitgptQkvLora litgpt_qkv;      // --impl litgpt: the fused qkv's adapters (q_out 0: none)
  int unit = -1;                 // sharding unit (sharding.h), -1: none
  // The dtype PEFT reads as `lora_A.weight.dtype` when it casts its input, when
  // that differs from the dtype the adapter computes in (`var.elem_bytes`): an
  // FSDP1 unit of its own shows its sharded fp32 parameter until its forward
  // gathers the half one (sharding_fsdp.cc). 0: elem_bytes.
  uint8_t peft_view_bytes = 0;
  // transformers >= 5.0 stores a layer's experts stacked (gate_up_proj,
  // down_proj): the per-expert Params of one stacked tensor share a stack id
  // (0: not stacked), which per-tensor optimizer code treats as one tensor.
  uint32_t stack = 0;
};

// Sets tape.flat_linear_inputs for a scope (an MoE block's body).
class FlatLinearInputs;

// DeepSpeed ZeRO-3 hooks every nn.Module of the model (parameter_offload.py
// _register_deepspeed_module, DeepSpeed 0.19.8): the forward code reports each
// module it runs (InModule, ops.h); sharding_zero3.cc implements this.
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  // Entering module `name`, whose own parameters are `params`; `input` (may be
  // null) is its tensor input, rebound to the tensor the module's code sees.
  virtual void Enter(std::string_view name, const std::vector<Param*>& params, Var* input) = 0;
  // Leaving it: `output` (may be null) rebound to what its caller sees.
  virtual void Leave(std::string_view name, Var* output) = 0;
};

class Tape {
 public:
  explicit Tape(EventStream* out) : graph(out), out_(out) {}

  Graph graph;
  // Autocast: fp32 leaves used by autocast-eligible ops are cast to
  // `compute_bytes` (aten/src/ATen/autocast_mode.cpp, cached_cast).
  bool autocast = false;
  uint8_t compute_bytes = kHalf;
  bool grad_enabled = true;
  double lora_dropout = 0;
  // PEFT's disable_adapter() (TRL's DPO reference forward under LoRA): every
  // LoRA layer runs its base layer only.
  bool adapters_disabled = false;
  // Parameters outside `params` whose autocast casts the cache may hold (TRL's
  // DPO reference copy).
  std::vector<Param>* other_params = nullptr;
  // CPU kernels instead of CUDA's where they allocate differently (setup.h DeviceRules).
  bool cpu_rules = false;
  // --impl torchtune: torchtune's RMSNorm and rotary embeddings (ops.cc
  // RmsNormTorchtune, transformer.cc RopeTorchtune).
  bool torchtune_modules = false;
  // --impl litgpt: LitGPT's RMSNorm, RoPE and attention (ops.cc RmsNormLitgpt,
  // transformer.cc RopeLitgpt), and the RoPE cache buffers (PlaceBuffers),
  // which each forward slices.
  bool litgpt_modules = false;
  // --liger: Liger-Kernel's RMSNorm, RoPE and SwiGLU (ops.cc LigerRmsNorm,
  // transformer.cc LigerRope / LigerSwiGlu); `liger_sm_count` sizes
  // LigerRMSNorm's per-SM dW buffer (multi_processor_count; 1 when unknown,
  // as rms_norm_backward starts from).
  bool liger = false;
  uint64_t liger_sm_count = 1;
  Var rope_cos, rope_sin;
  // LitGPT's fine-tuning loop variable `logits`: the previous step's chunks,
  // alive until this step's forward returns its own (loss.cc).
  std::vector<Var> loop_logits;
  int torch_version = 0;  // setup.torch_version (213 = 2.13): version-dependent kernels
  // Linear inputs are 2-D [tokens, in] here (an MoE block's `hidden_states.view(-1,
  // hidden_dim)`): their gradients are the matmul's own output, not a reshaped view.
  bool flat_linear_inputs = false;
  // The forward's DynamicCache: per layer the key and value states it holds until
  // the model's output is dropped (null: no cache).
  std::vector<Var>* kv_cache = nullptr;
  // .grad slots of non-parameter leaves (enable_input_require_grads): stable
  // addresses for AccumulateGrad; the graph (and so the grads) go after each
  // micro-batch's backward.
  std::deque<TensorId> input_grads;
  std::deque<TensorId>
      input_leaves;  // the leaves (AccumulateGrad's reference), aligned with input_grads
  bool kv_cache_copies =
      true;  // transformers >= 4.54 copies (torch.cat); older ones keep references
  bool kv_values_take_key_dtype = false;  // transformers 4.x: the value cache has the keys' dtype
  // Called when the forward enters (begin) and leaves a sharding unit: 0 =
  // embeddings, 1..L = decoder layer L-1, L+1 = final norm + lm_head.
  std::function<void(int unit, bool begin)> unit_hook;
  // Megatron's sequence-parallel all-gather buffer (persistent, reused).
  TensorId sp_gather_buffer = kNoTensor;
  // DeepSpeed ZeRO-3's module hooks (null: none).
  ModuleHooks* module_hooks = nullptr;
  // F.linear is DeepSpeed's LinearFunctionForZeroStage3 (zero/linear.py,
  // 0.19.8: installed by zero.Init and by Init(module=...) alike while
  // memory_efficient_linear is on): its setup_context saves the input
  // whatever needs a gradient.
  bool zero3_linear = false;
  void Unit(int unit, bool begin) {
    if (unit_hook) unit_hook(unit, begin);
  }

  void SetModule(std::string_view path) { graph.SetModule(out_->Intern(path)); }
  uint32_t module() const { return graph.module(); }

  // A new tensor owned by the caller (one reference), no grad_fn.
  Var New(uint64_t numel, uint8_t elem_bytes, Category category, std::string_view op) {
    Var v;
    v.numel = numel;
    v.elem_bytes = elem_bytes;
    v.t = graph.Alloc(numel * elem_bytes, category, op, graph.module());
    return v;
  }
  // Another reference to the same storage (a Python alias or a view).
  Var Share(const Var& v) {
    graph.Ref(v.t);
    return v;
  }
  void Drop(Var& v) {
    graph.Drop(v.t);
    v.t = kNoTensor;
  }
  // A node for an op producing `out`, which then requires grad.
  NodeId Node(std::string_view op, Var* out, uint32_t slots = 1) {
    if (!grad_enabled) return kNoNode;
    NodeId n = graph.AddNode(op, slots);
    if (out) {
      out->fn = n;
      out->slot = 0;
      graph.SetOutput(n, out->t);
    }
    return n;
  }
  std::vector<Param> params;
  EventStream* out() { return out_; }

 private:
  EventStream* out_;
};

class FlatLinearInputs {
 public:
  explicit FlatLinearInputs(Tape& tape) : tape_(tape), was_(tape.flat_linear_inputs) {
    tape.flat_linear_inputs = true;
  }
  ~FlatLinearInputs() { tape_.flat_linear_inputs = was_; }
  FlatLinearInputs(const FlatLinearInputs&) = delete;
  FlatLinearInputs& operator=(const FlatLinearInputs&) = delete;

 private:
  Tape& tape_;
  bool was_;
};

}  // namespace vramscope::lower
