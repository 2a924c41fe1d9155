// PyTorch eager ops as memory sees them: what each allocates in forward, what
// autograd saves (tools/autograd/derivatives.yaml: an input is saved only if
// the gradient of another input needs it), and what its backward allocates.
//
// Conventions: inputs are borrowed (the caller keeps its reference); the
// returned Var is a new reference the caller must Drop. `tokens` is b*s.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "tape.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// Runs `f(input)` as module `name`, whose own parameters are `params`, under
// ZeRO-3's module hooks (tape.h ModuleHooks): the module sees its input as
// the hooks rebind it, its caller sees the output as they rebind it. Without
// hooks, f(x).
template <class F>
Var InModule(Tape& tape, std::string_view name, const std::vector<Param*>& params, const Var& x,
             F&& f) {
  if (!tape.module_hooks) return f(x);
  Var in = x.t == kNoTensor ? Var{} : tape.Share(x);
  tape.module_hooks->Enter(name, params, in.t == kNoTensor ? nullptr : &in);
  Var out = f(in.t == kNoTensor ? x : in);
  if (in.t != kNoTensor) tape.Drop(in);
  tape.module_hooks->Leave(name, &out);
  return out;
}
// The name of the module owning `p` (its interned path).
std::string_view ModuleOf(Tape& tape, const Param& p);

// x.to(dtype): returns a new reference to x when the dtype already matches
// (aten::to returns self), else a copy with a ToCopyBackward node.
Var Cast(Tape& tape, const Var& x, uint8_t to_bytes);

// The autocast view of a leaf parameter: fp32 trainable leaves are cast once
// per autocast region and cached (autocast_mode.cpp cached_cast: fp32,
// requires_grad, is_leaf); other tensors are cast on every use.
Var AutocastParam(Tape& tape, Param& p);
// Drops every cached cast (torch.autocast.__exit__ -> clear_autocast_cache).
void ClearAutocastCache(Tape& tape);

// F.linear(x, W, b) with x of shape [tokens, in]: out [tokens, out].
// Saves x only if W requires grad and W only if x requires grad (mm/addmm in
// derivatives.yaml). Under autocast both operands are cast to the compute dtype.
// A targeted weight runs its LoRA layer (PEFT's; LitGPT's under --impl litgpt).
Var Linear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
           uint64_t out_features);
// The same without adapters (a LoRA layer's base layer and its adapters).
// `cached_weight_cast` false: the weight reaches the op as a view (LitGPT's
// `lora_A.transpose(0, 1)`), which autocast casts on every call instead of
// caching (autocast_mode.cpp cached_cast: leaves only).
Var PlainLinear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
                uint64_t out_features, bool cached_weight_cast = true);

// tensor.split / chunk along the last dimension: views of `whole`, one per
// entry of `numels` (a new reference each). Their backward (SplitBackward0 /
// SplitWithSizesBackward0) concatenates the pieces' gradients into one new
// whole-sized gradient.
std::vector<Var> Split(Tape& tape, const Var& whole, std::initializer_list<uint64_t> numels);

// Elementwise binary ops with PyTorch type promotion (result dtype = wider).
Var Mul(Tape& tape, const Var& a, const Var& b, std::string_view op = "aten::mul");
Var Add(Tape& tape, const Var& a, const Var& b);
// a * b where one operand broadcasts ([b, dim] against [b, tokens, dim]): the
// broadcast operand's gradient is made at the output's size and summed down
// (a full-size transient while the node runs; torch 2.13 CPU trace of
// diffusers' FLUX modulations and gates).
Var MulBroadcast(Tape& tape, const Var& a, const Var& b);
// scalar + a (1 + scale): AddBackward1 saves nothing and passes the gradient on.
Var AddScalar(Tape& tape, const Var& a);
// a += b: no new storage; `a` gets AddBackward0 (both gradients pass through).
Var AddInPlace(Tape& tape, const Var& a, const Var& b);
// a * scalar (saves nothing).
Var Scale(Tape& tape, const Var& a);
// x / scalar into a new tensor (DivBackward1 saves nothing): aten::div.
Var DivScalar(Tape& tape, const Var& a);
// A broadcast multiply by a parameter vector (norm weights): out like x.
Var MulParam(Tape& tape, const Var& x, Param& w, bool gemma_offset);

// An elementwise op whose output is like x and whose node saves x, or its own
// result (softmax, sigmoid, tanh, relu).
Var UnaryOp(Tape& tape, const Var& x, std::string_view op, std::string_view node, bool save_result);

// Activations. silu/gelu save their input; relu saves its result.
Var Silu(Tape& tape, const Var& x);
Var Gelu(Tape& tape, const Var& x);
Var Relu(Tape& tape, const Var& x);

// The activation of a non-gated MLP (kGelu, kRelu, kGeluNew, kGeluFast,
// kQuickGelu). The last three are transformers' Python expressions
// (activations.py, 4.57 / 5.x), an eager op per term: NewGELUActivation
// 0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3))) saves x, 0.5 * x, the tanh
// and 1 + tanh, where F.gelu saves x alone.
Var MlpActivation(Tape& tape, MlpKind kind, const Var& x);

// nn.Dropout(p) in training; identity (a new reference) when p == 0. On CUDA
// native_dropout saves a bool mask.
Var Dropout(Tape& tape, const Var& x, double p);

// LlamaRMSNorm / GemmaRMSNorm (modeling_llama.py, modeling_gemma.py): fp32
// upcast, pow, mean, rsqrt, multiply, cast back, weight multiply.
Var RmsNorm(Tape& tape, const Var& x, Param& w, uint64_t tokens, uint64_t hidden, bool gemma_style);
// T5LayerNorm (transformers models/t5): the variance from an fp32 copy, the
// input times the fp32 rsqrt, cast to a half weight's dtype, times the weight.
Var T5LayerNorm(Tape& tape, const Var& x, Param& w, uint64_t tokens);
Var RmsNormTorchtune(Tape& tape, const Var& x, Param& w, uint64_t tokens);
Var RmsNormLitgpt(Tape& tape, const Var& x, Param& w, uint64_t tokens);
// Liger-Kernel 0.8.5's LigerRMSNorm as monkey_patch.py installs it for
// llama / mistral / qwen2 (casting_mode "llama", in_place True); ops.cc.
Var LigerRmsNorm(Tape& tape, const Var& x, Param& w, uint64_t hidden);
// nn.LayerNorm (native_layer_norm): saves input, mean, rstd (fp32 per row).
// Under autocast layer_norm runs in fp32.
Var LayerNorm(Tape& tape, const Var& x, Param& w, Param* b, uint64_t tokens);
// nn.LayerNorm(elementwise_affine=False) when `w` is null (diffusers' AdaLayerNorm*).
Var LayerNorm(Tape& tape, const Var& x, Param* w, Param* b, uint64_t tokens);

// torch.nn.RMSNorm (torch 2.13 composite rms_norm, CPU: aten/src/ATen/native/
// layer_norm.cpp): half inputs upcast to fp32, x.pow(2).mean(-1,
// keepdim=True).add_(eps), rsqrt, x * rsqrt, * weight in fp32, type_as(x).
// `rows`: the vectors normalized (tokens x heads for per-head q / k norms).
// `fused`: CUDA's _fused_rms_norm kernel instead (torch >= 2.8; torch 2.13
// ships _fused_rms_norm_cuda): the output and an fp32 rstd, no temporaries.
Var TorchRmsNorm(Tape& tape, const Var& x, Param& w, uint64_t rows, bool fused = false);

// model.enable_input_require_grads(): the input embeddings' forward hook calls
// output.requires_grad_(True) (transformers modeling_utils.py, 4.57 / 5.x), so a
// frozen embedding's output becomes a leaf that requires grad and whose .grad
// autograd fills (freed with the graph after backward). PEFT's
// Reentrant checkpointing needs it with frozen embeddings (otherwise no input
// of a checkpointed layer requires grad and its adapters get none). Returns x
// (same storage), now a leaf.
Var RequireInputGrad(Tape& tape, Var x);
// Whether the setup calls it: frozen input embeddings (LoRA, QLoRA) with
// gradient checkpointing. PeftModel.__init__ (0.17-0.21) calls
// _prepare_model_for_gradient_checkpointing, hence enable_input_require_grads,
// when the model already checkpoints as the adapters are attached (the order
// of most scripts; prepare_model_for_kbit_training enables checkpointing first).
bool InputsRequireGrad(const TrainingSetup& setup);

// nn.Embedding: out [tokens, dim] in the weight's dtype; saves the indices;
// backward allocates a dense [vocab, dim] gradient. `require_grad`: the
// output is made to require grad by a forward hook of the module (PEFT's
// enable_input_require_grads, RequireInputGrad), before later hooks see it.
Var Embedding(Tape& tape, const Var& ids, Param& w, uint64_t tokens, uint64_t dim,
              bool require_grad = false);

}  // namespace vramscope::lower
