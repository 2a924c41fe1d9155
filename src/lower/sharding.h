// Data-parallel model states on one rank, tensor by tensor: where parameters,
// gradients and optimizer state live, which buffers the library adds, and what
// it gathers, reduces and frees around each unit of the forward and backward
// pass. One ShardingStrategy per library family (sharding_*.cc); each rule
// names the library behaviour and version (docs/parallel.md lists them all).
//
// Units: 0 = embeddings, 1..L = decoder layers, L+1 = final norm + lm_head.
// FSDP wraps each decoder layer (accelerate TRANSFORMER_BASED_WRAP); its root
// unit holds units 0 and L+1.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optimizer.h"
#include "tape.h"
#include "vramscope/parallel.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// The CUDA streams the libraries allocate on (docs/parallel.md, "Side
// streams"). The caching allocator keeps one pool per stream, and a block
// used on another stream (record_stream) is reusable only once that work is
// done.
inline constexpr uint32_t kDefaultStream = 0;
// FSDP1 _unshard_stream, FSDP2 all_gather_copy_in_stream, DeepSpeed ZeRO-3
// __allgather_stream (overlap_comm, the stage-3 default).
inline constexpr uint32_t kGatherStream = 1;
// FSDP1 _post_backward_stream, FSDP2 reduce_scatter_stream, DeepSpeed
// ZeRO-3 reduce_and_partition_stream.
inline constexpr uint32_t kReduceStream = 2;
// FSDP1 _pre_unshard_stream (CPU offload's host-to-device copies).
inline constexpr uint32_t kPreUnshardStream = 3;

// Frees that wait for another stream's work (Graph::DropUsedOn), in groups
// (one per unit), oldest first; a CPU-side wait completes the oldest group.
// CUDA events of one stream complete in order, so completing a group
// completes every older free on the same streams.
class PendingFrees {
 public:
  void Add(std::optional<uint64_t> event_id) {
    if (!event_id) return;
    if (groups_.empty() || closed_) groups_.emplace_back();
    closed_ = false;
    groups_.back().push_back(*event_id);
  }
  // The current group is complete: the next Add starts a new one.
  void EndGroup() { closed_ = true; }
  size_t groups() const { return groups_.size(); }
  // Waits for the oldest group (event.synchronize() on its event).
  void CompleteOldest(Graph& g);
  void CompleteAll(Graph& g) {
    while (!groups_.empty()) CompleteOldest(g);
  }

 private:
  std::deque<std::vector<uint64_t>> groups_;
  bool closed_ = true;
};

// What every strategy knows of the run and holds on the rank; the helpers
// shared by several strategies (sharding_zero.cc) work on it.
struct ShardState {
  Tape* tape = nullptr;
  DataParallel mode = DataParallel::kNone;
  ParallelLayout layout;
  uint32_t world = 1;    // ranks that shard model states
  uint32_t dp_rank = 0;  // the data-parallel rank simulated (ZeRO-1/2 partitions differ by rank)
  uint64_t micro_batches =
      1;                // simulated micro-batches per optimizer step (the last is the boundary)
  uint64_t hidden = 0;  // the model's hidden size (ZeRO's "auto" sizes)
  int num_layers = 0;
  bool mixed = false;                // fp32 master weights (a *-mixed precision)
  bool checkpointed_layers = false;  // activation checkpointing of every decoder layer
  bool peft = false;                 // adapters (LoRA / QLoRA) on a frozen base
  bool qlora = false;                // a 4-bit (bitsandbytes) base
  bool tied_embeddings = false;      // lm_head is the input embedding
  std::vector<Param> shards;         // what the optimizer steps (partitions)
  std::vector<TensorId> buffers;     // persistent communication / master buffers
  uint64_t host_bytes = 0;
  std::vector<std::string> notes;

  TensorId Alloc(uint64_t bytes, Category c, std::string_view op);  // in the current module
  // A tensor DeepSpeed keeps in host memory (offload): on the device stream
  // under CPU rules, where host and device are the same memory; otherwise
  // counted in host_bytes only (kNoTensor).
  TensorId HostAlloc(uint64_t bytes, Category c, std::string_view op);
  uint64_t TrainableElements() const;
};

class ShardingStrategy {
 public:
  // `world` is the number of ranks that shard model states (dp, or the GPUs of
  // one node for hybrid FSDP); `megatron` selects Megatron-LM's DDP and
  // distributed optimizer (--zero 1) under --tp/--pp/--cp/--ep.
  // `dp_rank` is the data-parallel rank the class simulates and
  // `micro_batches` the micro-batches simulated per optimizer step.
  static std::unique_ptr<ShardingStrategy> Make(Tape* tape, const TrainingSetup& setup,
                                                uint32_t world, bool megatron, uint64_t hidden_size,
                                                int num_layers, uint32_t dp_rank = 0,
                                                uint64_t micro_batches = 1);
  explicit ShardingStrategy(ShardState state) : s_(std::move(state)) {}  // abstract: see Make
  virtual ~ShardingStrategy() = default;

  // The model's parameters in their engine's dtype live in half precision on
  // the GPU (DeepSpeed casts the module; FSDP gathers param_dtype; Megatron
  // keeps bf16 params): no autocast weight copies.
  bool casts_model_to_half() const { return s_.mixed && HalfEngine(); }
  // Bytes of one parameter's persistent GPU storage (a shard or the whole).
  virtual uint64_t StorageBytes(const Param& p) const { return p.storage_bytes; }
  // After the parameters exist: persistent buffers (fp32 master partitions,
  // DDP buckets, ZeRO-3 bucket and gradient partition), hooks installed.
  void Setup();
  // The optimizer step (in module "optimizer").
  void Step(const TrainingSetup& setup, OptimizerExtras* extras);
  // After the adapters are placed: the dtypes they compute in, when the
  // library gathers them in another one (FSDP's MixedPrecision).
  virtual void OnAdaptersPlaced(std::vector<Param>* /*params*/) const {}
  // zero_grad(set_to_none=True).
  virtual void ZeroGrad();
  // After each micro-batch's backward: the last unit's reduce and release.
  virtual void EndBackward() {}
  // As the wrapped model's forward begins (DDP's _pre_forward).
  virtual void BeginForward() {}

  uint64_t host_bytes() const { return s_.host_bytes; }
  // Before the parameters are placed: facts of the model the wrapping depends on.
  void SetTiedEmbeddings(bool tied) { s_.tied_embeddings = tied; }
  const std::vector<std::string>& notes() const { return s_.notes; }

 protected:
  // Whether the engine casts the model to the half dtype under mixed precision.
  virtual bool HalfEngine() const { return true; }
  // The module name its setup allocations carry ("ddp", "zero3", "megatron", ...).
  virtual std::string SetupModule() const = 0;
  virtual void SetupBuffers() = 0;
  virtual void InstallHooks();
  virtual void StepShards(const TrainingSetup& setup, OptimizerExtras* extras) = 0;
  // A parameter's .grad is complete (register_post_accumulate_grad_hook).
  virtual void OnGradAccumulated(TensorId* /*slot*/) {}

  ShardState s_;
};

// What ZeRO-3 and FSDP share: parameters gathered per unit around its forward
// and backward, gradients reduced per unit as its backward ends.
class GatheringStrategy : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;
  void EndBackward() override;

 protected:
  struct Unit {
    std::vector<Param*> params;  // whose storage is sharded
    uint64_t gather_bytes = 0;   // all-gathered working set
    TensorId gathered = kNoTensor;
  };
  // The all-gathered bytes of one parameter in its unit (0: never gathered).
  virtual uint64_t GatheredBytes(const Param& p) const = 0;
  // A bound on a unit's gathered set given its largest parameter (ZeRO-3's prefetch).
  virtual uint64_t GatherLimit(uint64_t /*largest_bytes*/) const { return UINT64_MAX; }
  // The unit a parameter or module belongs to (FSDP: units 0 and L+1 are the root).
  virtual int MapUnit(int unit) const { return unit; }
  virtual void Gather(int unit) = 0;
  // The backward prefetch of `unit` (FSDP); plain gathers by default.
  virtual void Prefetch(int unit) { Gather(unit); }
  virtual void ReduceUnit(int unit) = 0;
  virtual void OnForwardUnit(int unit, bool begin) = 0;
  // The first backward node of a micro-batch; and a unit's backward starting.
  virtual void OnBackwardStart() {}
  virtual void AfterBackwardGather(int /*unit*/) {}
  // A unit (FSDP's root) whose gradients are reduced only at the end of backward.
  virtual bool ReducedAtEnd(int /*unit*/) const { return false; }
  // Around EndBackward's release of every unit.
  virtual void BeforeReleaseAll() {}
  virtual void AfterReleaseAll() {}

  void AssignUnits();
  void InstallHooks() override;
  // The stream the gathered parameters are allocated on, and whether their
  // release records the default stream first (FSDP1 _free_unsharded_flat_param,
  // DeepSpeed free_param: record_stream(current_stream()) then free).
  virtual uint32_t GatheredStream() const { return kDefaultStream; }
  virtual bool ReleaseRecordsDefaultStream() const { return false; }
  // Allocates `unit`'s gathered parameters (module set by the caller).
  void AllocGathered(Unit& unit, std::string_view op);
  void Release(int unit);
  // After Release freed a unit's gathered parameters, in the same wait group
  // (FSDP1 offload: the staged device shard goes too).
  virtual void AfterRelease(int /*unit*/) {}
  // Before a unit's all-gather: FSDP1's rate limiter (_limiter_utils.py
  // _FreeEventQueue, at most 2 frees in flight: the oldest is waited for
  // once two are queued), torch 2.4-2.13.
  void WaitForOldestRelease();
  int UnitOfModule(uint32_t module);
  void OnBackwardNode(uint32_t module);

  std::vector<Unit> units_;          // index: unit id (FSDP: root at 0)
  PendingFrees released_;            // gathered parameters freed after a default-stream use
  PendingFrees reduced_grads_;       // gradients freed after a reduce-stream use
  std::vector<int> unit_of_module_;  // interned module -> unit (-2: unknown yet)
  int backward_unit_ = -1;
  bool in_backward_ = false;
};

}  // namespace vramscope::lower
