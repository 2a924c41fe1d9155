// Data-parallel model states on one rank, tensor by tensor: where parameters,
// gradients and optimizer state live, which buffers the library adds, and
// what it gathers, reduces and frees around each unit of the forward and
// backward pass. One class per library family would repeat the unit
// bookkeeping, so one runtime switches on the mode; each rule names the
// library behaviour and version (docs/parallel.md lists them all).
//
// Units: 0 = embeddings, 1..L = decoder layers, L+1 = final norm + lm_head.
// FSDP wraps each decoder layer (accelerate TRANSFORMER_BASED_WRAP); its root
// unit holds units 0 and L+1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optimizer.h"
#include "tape.h"
#include "vramscope/parallel.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

class DataParallelRuntime {
 public:
  // `world` is the number of ranks that shard model states (dp, or the GPUs
  // of one node for hybrid FSDP); `megatron` selects Megatron-LM's DDP and
  // distributed optimizer (--zero 1) under --tp/--pp/--cp/--ep.
  DataParallelRuntime(Tape* tape, const TrainingSetup& setup, uint32_t world, bool megatron,
                      uint64_t hidden_size, int num_layers);

  DataParallel mode() const { return mode_; }
  // The model's parameters in their engine's dtype live in half precision on
  // the GPU (DeepSpeed casts the module; FSDP gathers param_dtype; Megatron
  // keeps bf16 params): no autocast weight copies.
  bool casts_model_to_half() const;
  // Bytes of one parameter's persistent GPU storage (a shard or the whole).
  uint64_t StorageBytes(const Param& p) const;
  // After the parameters exist: persistent buffers (fp32 master partitions,
  // DDP buckets, ZeRO-3 bucket and gradient partition), hooks installed.
  void Setup();
  // The optimizer step, and zero_grad(set_to_none=True).
  void Step(const TrainingSetup& setup, OptimizerExtras* extras);
  void ZeroGrad();
  // After each micro-batch's backward: the last unit's reduce and release.
  void EndBackward();

  uint64_t host_bytes() const { return host_bytes_; }
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  struct Unit {
    std::vector<Param*> params;     // whose storage is sharded or bucketed
    uint64_t gather_bytes = 0;      // all-gathered working set (ZeRO-3 / FSDP)
    TensorId gathered = kNoTensor;
  };
  int UnitOfModule(uint32_t module);
  int FsdpUnit(int unit) const;     // FSDP: units 0 and L+1 are the root
  void Gather(int unit);
  // The backward prefetch of `unit`: FSDP2 issues its all-gather (the flat
  // output) and copies out later; FSDP1 gathers it whole.
  void Prefetch(int unit);
  void Release(int unit);
  void ReduceUnit(int unit);        // gradients of a finished backward unit
  void OnForwardUnit(int unit, bool begin);
  void OnBackwardNode(uint32_t module);
  void OnGradAccumulated(TensorId* slot);
  bool KeptAcrossTurn(int unit) const;  // ZeRO-3 max_reuse_distance
  void StepShards(const TrainingSetup& setup, OptimizerExtras* extras);
  // Setup, per library: units and gather sizes, then each mode's persistent buffers.
  void AssignUnits();
  void SetupMegatron();
  void SetupDdp();
  void SetupZero();
  void SetupFsdp();
  TensorId AllocBuffer(uint64_t bytes, Category c, std::string_view op);  // in the current module
  uint64_t TrainableElements() const;

  Tape* tape_;
  DataParallel mode_;
  ParallelLayout layout_;
  uint32_t world_;
  bool megatron_;
  uint64_t hidden_;
  int num_layers_;
  bool mixed_;                      // fp32 master weights (a *-mixed precision)
  std::vector<Unit> units_;         // index: unit id (FSDP: root at 0)
  std::vector<int> unit_of_module_; // interned module -> unit (-2: unknown yet)
  std::vector<Param*> param_of_slot_owner_;
  int backward_unit_ = -1;
  // FSDP2: the forward's AllGatherState (the last copied-out all-gather output,
  // kept until the next forward copy-out or the root's post-forward) and the
  // backward prefetches issued but not yet copied out, per unit.
  TensorId forward_all_gather_state_ = kNoTensor;
  std::vector<TensorId> prefetched_output_;
  bool in_backward_ = false;
  TensorId reduce_scatter_state_ = kNoTensor;  // FSDP2: the last reduce-scatter's input
  std::vector<Param> shards_;       // what the optimizer steps (partitions)
  std::vector<TensorId> buffers_;   // persistent communication buffers
  TensorId ipg_bucket_ = kNoTensor;
  std::vector<TensorId> ipg_;          // ZeRO-1/2 ipg buffers of this backward
  uint64_t largest_numel_ = 0;         // ZeRO-1/2 offload: largest trainable param
  TensorId grad_partition_ = kNoTensor;
  std::vector<TensorId> main_grads_;   // Megatron fp32 main_grad buffer
  uint64_t host_bytes_ = 0;
  std::vector<std::string> notes_;
};

}  // namespace vramscope::lower
