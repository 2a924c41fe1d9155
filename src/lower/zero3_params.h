// DeepSpeed ZeRO-3's parameter side as memory sees it (DeepSpeed 0.19.8):
// the module hooks (parameter_offload.py), the PartitionedParameterCoordinator
// that fetches, prefetches and releases each module's parameters
// (partitioned_param_coordinator.py) and the all-gathers behind them
// (partition_parameters.py). Private to sharding_zero3.cc.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "sharding.h"

namespace vramscope::lower {

class Zero3Params final : public ModuleHooks {
 public:
  struct Options {
    uint64_t prefetch_bucket = 0;  // stage3_prefetch_bucket_size (elements)
    uint64_t max_live = 0;         // stage3_max_live_parameters
    uint64_t max_reuse = 0;        // stage3_max_reuse_distance
    uint64_t persistence = 0;      // stage3_param_persistence_threshold
    bool offload_params = false;   // offload_param: partitions on the host
    uint32_t gather_stream = 0;    // where gathered parameters are allocated
    // F.linear is torch's (DeepSpeed before 0.19.4 without zero.Init): what a
    // module's forward saves for backward aliases its gathered weights.
    bool forward_saves_storage = false;
  };
  Zero3Params(ShardState* s, Options options);

  // Every parameter of the model becomes a ZeRO parameter (ds_id in
  // named_parameters order), its partition a ceil(numel / N) slice.
  void Register();
  // create_reduce_and_remove_grad_hooks gathers and frees each trainable
  // parameter once at init (param.all_gather(); param.partition()).
  void GatherOnceEach();
  // Installs the hooks on the tape and its graph.
  void Install();

  void Enter(std::string_view name, const std::vector<Param*>& params, Var* input) override;
  void Leave(std::string_view name, Var* output) override;
  // stage3.py backward_epilogue -> release_backward_leftovers.
  void ReleaseBackwardLeftovers();
  // step(): _partition_all_parameters (release_and_reset_all, persistent
  // ones too) and _post_step's all-gather of the persistent parameters.
  void ReleaseAll();
  void GatherPersistent();

  uint64_t partition_numel(const Param& p) const;

 private:
  enum class Status : uint8_t { kNotAvailable, kInflight, kAvailable };
  struct ZParam {
    Param* param = nullptr;
    uint64_t numel = 0, partition = 0;
    bool persist = false;
    Status status = Status::kNotAvailable;
    int handle = -1;            // in the inflight registry
    TensorId data = kNoTensor;  // the gathered parameter's storage
    std::vector<int> active;    // ds_active_sub_modules
  };
  struct ZModule {
    std::string name;
    std::vector<int> params;  // direct parameters (iter_params, recurse=False), by ds_id
    int grads_remaining = 0;  // ds_grads_remaining
    int inputs_with_grad = 0;
    std::vector<int> recompute;    // ds_recompute_parameters
    NodeId output_node = kNoNode;  // the node that made its output (saved its weights)
    bool input_with_grad = false;  // its input required grad (autograd saved the weight)
  };
  // An all-gather in flight: one flat buffer for a coalesced gather
  // (_all_gather_coalesced), none for a single parameter's (sequential).
  struct Handle {
    TensorId flat = kNoTensor;
    std::vector<int> params;
    int refs = 0;  // registry entries still holding it
    bool complete = false;
  };
  enum class Trace : uint8_t { kInvalid, kRecord, kComplete };
  struct InTrace {
    int param;
    int step;
  };
  enum HookKind : uint32_t { kEnter = 0, kLeave = 1, kPreBackward = 2, kPostBackward = 3 };

  int ModuleId(std::string_view name, const std::vector<Param*>& params);
  void OnHook(uint32_t id, bool replay);
  void PreForward(int m);
  void PostForward(int m);
  void ResetStep();
  void Fetch(int m, bool forward);
  void Prefetch(const std::vector<int>& fetched);
  void AllGather(const std::vector<int>& params);
  void Wait(int p);
  void Release(int m, bool forward);
  std::vector<int> ToRelease(int m) const;
  // `pin`: the node its data stays alive for (a non-reentrant recompute's
  // saved weights alias the gathered storage).
  void ReleaseParam(int p, NodeId pin = kNoNode);
  void CleanInflight();
  void InvalidateIfOffTrace(int m);
  void BuildParamTrace();
  void Wrap(Var* v, uint32_t hook_id, std::string_view op);

  ShardState* s_;
  Options o_;
  std::vector<ZParam> params_;
  std::unordered_map<const Param*, int> param_of_;
  std::vector<ZModule> modules_;
  std::map<std::string, int, std::less<>> module_of_;
  std::vector<Handle> handles_;
  Trace trace_ = Trace::kInvalid;
  std::vector<int> submodule_order_;
  std::vector<InTrace> param_order_;
  std::deque<InTrace> queue_;
  std::unordered_map<int, int> most_recent_;  // param -> step (absent: -1e10)
  std::unordered_map<int, std::deque<int>> module_steps_;
  int step_id_ = 0;
  int64_t n_available_ = 0;
  std::vector<int> active_backward_;  // __active_backward_submodules, in order
  bool recompute_ = false;            // replaying a checkpoint region's forward
  PendingFrees released_;             // gathered parameters freed after use (CUDA)
};

}  // namespace vramscope::lower
