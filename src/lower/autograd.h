// A model of PyTorch eager tensor lifetimes and of the autograd engine, at the
// level memory cares about: which storages exist, who holds them (Python
// locals, saved tensors of graph nodes, gradient buffers, the autocast cache),
// and the order in which backward frees and allocates.
//
// Behaviours modelled (PyTorch 2.x; file names under pytorch/pytorch):
// - A tensor's storage is freed when its last reference goes (refcounting).
// - A graph node holds its saved tensors until it has run (retain_graph=False):
//   torch/csrc/autograd/saved_variable.cpp, Node::release_variables().
// - Backward runs ready nodes highest sequence number first; AccumulateGrad
//   nodes have the highest priority (torch/csrc/autograd/engine.cpp,
//   ReadyQueue / CompareNodeTaskTime; function.h: UINT64_MAX sequence_nr).
// - Gradients arriving at the same input are summed in the node's InputBuffer:
//   in place into the buffered tensor when nothing else references it, else in
//   place into the incoming one, else out of place
//   (torch/csrc/autograd/input_buffer.cpp, accumulate()).
// - AccumulateGrad steals the incoming gradient as .grad when it is its only
//   reference, else clones it; with .grad already set it adds in place
//   (torch/csrc/autograd/functions/accumulate_grad.h, accumulateGrad()).
// - Non-reentrant activation checkpointing drops the region's saved tensors in
//   forward and recomputes the region on the first unpack in backward, stopping
//   early once every saved tensor exists again (torch/utils/checkpoint.py,
//   _checkpoint_without_reentrant_generator, early_stop=True since 2.1).
//   Reentrant checkpointing recomputes the whole region (CheckpointFunction).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "vramscope/category.h"
#include "vramscope/event_stream.h"

namespace vramscope::lower {

using TensorId = uint32_t;
using NodeId = uint32_t;
inline constexpr TensorId kNoTensor = std::numeric_limits<uint32_t>::max();
inline constexpr NodeId kNoNode = std::numeric_limits<uint32_t>::max();

// A Python-level tensor: a storage plus where its gradient goes. Views share
// the storage (and, for memory purposes, the grad edge of their base).
struct Var {
  TensorId t = kNoTensor;
  uint64_t numel = 0;      // elements of this tensor (a view: of the view)
  uint8_t elem_bytes = 2;  // bytes per element of its dtype
  NodeId fn = kNoNode;     // grad_fn (or AccumulateGrad for leaves)
  uint32_t slot = 0;       // which output of fn this is
  uint64_t bytes() const { return numel * elem_bytes; }
  bool requires_grad() const { return fn != kNoNode; }
};

// How a node produces the gradient for one of its inputs.
struct GradOut {
  // kSlice: the incoming gradient of pass_slot passes on as a view of `bytes`
  // of it (CatBackward0 narrows its gradient, one view per input: no new storage).
  // kSaved: the node's backward writes the gradient into saved tensor number
  // `pass_slot` (in save order) and returns that storage (Liger's
  // LigerSiLUMulFunction): no new storage; a new one of `bytes` when the
  // saved tensor is not on the device (offloaded).
  enum class Mode : uint8_t { kNew, kPass, kSlice, kSaved };
  Mode mode = Mode::kNew;
  uint64_t bytes = 0;      // kNew: size of the gradient tensor
  uint32_t pass_slot = 0;  // kPass: forwards the incoming gradient of this slot
  // kNew: the gradient reaches its target as a view whose base autograd keeps
  // alive (a linear's input gradient, reshaped back from the folded matmul).
  bool view = false;
  Category category = Category::kTemporaries;
  NodeId target = kNoNode;
  uint32_t target_slot = 0;
};

class Graph {
 public:
  explicit Graph(EventStream* out);

  // --- tensors -------------------------------------------------------------
  // Allocates a storage with one (Python) reference, on CUDA stream `stream`
  // (0: the default stream; side streams of the libraries: docs/parallel.md).
  // Checkpoint regions replay their allocations on the default stream, so a
  // side-stream allocation must not happen inside one.
  TensorId Alloc(uint64_t bytes, Category category, std::string_view op, uint32_t module,
                 uint32_t stream = 0);
  void Ref(TensorId t);
  void Drop(TensorId t);  // frees at zero references
  void Drop(const Var& v) { Drop(v.t); }
  bool Live(TensorId t) const;
  uint64_t Bytes(TensorId t) const;
  // Tensor.record_stream(stream) followed by the drop of the last reference:
  // the free waits for `stream`'s work. Returns the freed allocation's event
  // id, for UsesDone once that work is known complete; nullopt (a plain drop)
  // when other references keep the storage.
  std::optional<uint64_t> DropUsedOn(TensorId t, uint32_t stream);
  // The work a DropUsedOn waited for is complete (a CPU-side event wait).
  void UsesDone(uint64_t event_id) { out_->UsesDone(event_id); }
  void SetModule(uint32_t module) { module_ = module; }
  uint32_t module() const { return module_; }
  // Tensor.register_post_accumulate_grad_hook (torch >= 2.1): called with a
  // parameter's grad slot each time AccumulateGrad has stored into it.
  std::function<void(TensorId* grad_slot)> post_accumulate_hook;
  // The run is recorded under a TorchDispatchMode (vramscope's trace recorder, the
  // CPU fidelity check): a parameter's buffered gradient is then never added to
  // in place (Deliver).
  bool under_dispatch_mode = false;
  // torch.autograd.graph.save_on_cpu(pin_memory=True) (torch 1.10-2.11): a
  // saved tensor is copied to pinned host memory when saved (the graph keeps
  // no GPU reference) and copied back to the GPU when its node runs.
  bool offload_saved = false;
  // torchtune's OffloadActivations (training/_activation_offloading.py, 0.6.1,
  // with use_streams): while set, its pack hook sees what autograd saves outside
  // checkpoint regions and the inputs a region keeps (torch 2.13's checkpoint
  // saves them as SavedTensors: _CheckpointFrame.save_inputs). Each pack takes
  // the next id; a tensor of >= 1024 bytes that is not a parameter is copied to
  // pinned host memory, and its device tensor stays referenced by the forward
  // stash until a pack 5 ids later. In backward the first node that unpacks an
  // offloaded tensor releases the forward stash; a tensor no longer in it is
  // copied back and held by the backward stash until the hook of the next node
  // that brings one back (at once when something else references it by then),
  // and the rest go when backward ends (its queued callback). Checkpoint
  // regions only, non-reentrant: the recipes require it.
  bool offload_activations = false;
  // Called before a (non-AccumulateGrad) node runs in backward, with the module
  // it was recorded in: data-parallel sharding gathers parameters there
  // (FSDP pre-backward hooks, ZeRO-3 fetch_sub_module).
  std::function<void(uint32_t module)> pre_node_hook;
  // Hooks of the libraries' own autograd Functions and module hooks (DeepSpeed
  // ZeRO-3's PreBackwardFunctionForModule / PostBackwardFunctionModule and
  // forward module hooks, sharding_zero3.cc), by an id the caller chooses:
  // - `node_hook(id)` runs when backward reaches a node given SetNodeHook(n,
  //   id), before the node computes anything;
  // - `replay_hook(id)` runs while a checkpoint region is recomputed, at the
  //   point of the region's forward where ScriptHook(id) was called (a
  //   module's forward hooks fire again in the recompute).
  std::function<void(uint32_t id)> node_hook;
  std::function<void(uint32_t id)> replay_hook;
  void SetNodeHook(NodeId n, uint32_t id) { nodes_[n].hook = id; }
  void ScriptHook(uint32_t id);
  // Node `n` holds the caller's reference to `t` until it has run (a tensor
  // its saved variables alias); dropped at once if `n` is none or has run.
  void HoldUntilRun(NodeId n, TensorId t);
  // A non-reentrant checkpoint region is being recomputed: its saved tensors
  // are `x.detach()` of what the recompute computed (torch/utils/checkpoint.py
  // _checkpoint_hook), aliasing that storage even if the tensor is later
  // given new data.
  bool recomputing_by_storage() const { return recomputing_by_storage_; }
  // While one is alive, allocations and frees belong to a hook, not to the
  // checkpoint region being recorded: they are not replayed by its recompute
  // (the hook itself is, through ScriptHook) and may use any stream.
  class HookScope {
   public:
    explicit HookScope(Graph& g) : g_(g) { ++g_.hook_depth_; }
    ~HookScope() { --g_.hook_depth_; }
    HookScope(const HookScope&) = delete;
    HookScope& operator=(const HookScope&) = delete;

   private:
    Graph& g_;
  };
  uint64_t host_peak_bytes() const { return host_peak_bytes_; }
  uint32_t Intern(std::string_view s) { return out_->Intern(s); }

  // The pinned host memory OffloadActivations / save_on_cpu hold now.
  uint64_t host_live_bytes() const { return host_live_bytes_; }

  // --- graph ---------------------------------------------------------------
  // A node with `num_slots` differentiable outputs.
  NodeId AddNode(std::string_view op, uint32_t num_slots = 1);
  // The tensor node `n`'s op returned (Tape::Node): a save of any other
  // tensor is a save of an input, packed before the op's kernel runs.
  void SetOutput(NodeId n, TensorId t) { nodes_[n].output = t; }
  // The AccumulateGrad node of a leaf parameter; its grad lands in *grad_slot
  // (kNoTensor while .grad is None). `grad_bytes` is the size of .grad.
  NodeId AddAccumulateGrad(uint64_t grad_bytes, TensorId* grad_slot);
  // The node keeps `t` until it runs (in a checkpoint region: recomputed).
  void Save(NodeId n, TensorId t);
  // Gradient for input `input` of node `n`; ignored if input needs no grad.
  void Edge(NodeId n, const Var& input, uint64_t grad_bytes,
            Category category = Category::kTemporaries, bool view = false);
  void EdgePass(NodeId n, const Var& input, uint32_t from_slot = 0);
  // The input's gradient is a view of `bytes` of the incoming one (GradOut::kSlice).
  void EdgeSlice(NodeId n, const Var& input, uint64_t bytes, uint32_t from_slot = 0);
  // The input's gradient is written in place into the node's saved tensor
  // number `saved_index` (GradOut::kSaved), of `bytes`.
  void EdgeSaved(NodeId n, const Var& input, uint32_t saved_index, uint64_t bytes);
  // Transient allocations alive while `n` runs in backward, freed in order
  // after its gradients are computed.
  void Workspace(NodeId n, uint64_t bytes);
  // Transient allocations of `n`'s backward made after its workspace and all
  // freed before its gradients are made (a loop's temporaries: its peak).
  void Scratch(NodeId n, uint64_t bytes);
  // `n`'s gradients exist before its scratch (they are the accumulators the
  // loop writes into).
  void GradsBeforeScratch(NodeId n) { nodes_[n].grads_before_scratch = true; }
  // `n`'s backward runs cuBLAS gemms (mm, addmm, bmm, a matmul). Its generated
  // code computes the input gradients in the alphabetical order of the
  // argument names (torch 2.13 CPU, seen with a TorchDispatchMode: mm and bmm
  // (self, mat2) make mat2's gradient first, addmm (self, mat1, mat2) mat1's,
  // addmv (self, mat, vec) mat's, baddbmm (self, batch1, batch2) batch1's):
  // `second_input_first` for mm and bmm, whose edges are (self, mat2).
  void Gemm(NodeId n, bool second_input_first);

  // --- cuBLAS workspaces ----------------------------------------------------
  // One workspace per cuBLAS handle, allocated through the caching allocator
  // by the handle's first gemm and kept for the process's life
  // (CublasHandlePool.cpp getCurrentCUDABlasHandle -> getNewWorkspace, torch
  // 2.3+). The forward runs on the main thread's handle, backward on the
  // autograd engine's device thread and its own handle: each workspace appears
  // at that thread's first gemm, after the gemm's output is allocated, not at
  // the start of the pass. 0 bytes: none (CPU rules, a GPU without one).
  void SetCublasWorkspaces(uint64_t bytes) {
    forward_workspace_bytes_ = backward_workspace_bytes_ = bytes;
  }
  // A forward op is about to run a gemm (its output is allocated).
  void ForwardGemm() { MakeWorkspace(&forward_workspace_bytes_); }

  // --- checkpoint regions (gradient checkpointing) --------------------------
  void BeginCheckpoint(bool reentrant);
  void EndCheckpoint();
  // Keeps an input of the current region alive until the region's backward
  // has run (the checkpoint's recompute closure holds its arguments).
  void Keep(TensorId t);
  // An output of the current region that no gradient reaches (falcon's
  // returned attention weights). Reentrant checkpointing's backward gets zeros
  // of its size for it (autograd.Function materializes undefined gradients,
  // materialize_grads defaults to True, torch 2.x), alive until the region's
  // backward is done.
  void UngradedOutput(uint64_t bytes);
  bool in_checkpoint() const { return region_ != kNoRegion; }

  // --- backward ------------------------------------------------------------
  // Runs backward from `root` (a scalar loss): allocates the seed gradient
  // and executes every reachable node. Tensors allocated in backward are
  // tagged with the current module of the node running.
  // A pipeline stage runs it from its output with the gradient received from
  // the next stage: `seed_op` and `seed_category` name that tensor.
  void Backward(const Var& root, std::string_view seed_op = "aten::ones_like",
                Category seed_category = Category::kLoss);

  size_t num_nodes() const { return nodes_.size(); }

 private:
  struct Tensor {
    uint64_t bytes = 0;
    uint64_t event_id = 0;
    uint64_t event_index = 0;  // its alloc event in the stream
    int32_t refs = 0;
    bool from_cast = false;  // made by ToCopyBackward0: a fresh, dense tensor
    bool view = false;       // delivered as a view of a base that stays alive (GradOut::view)
  };
  // A temporary that autograd saves is an activation (saved for backward).
  void MarkSaved(TensorId t);
  uint64_t host_live_bytes_ = 0, host_peak_bytes_ = 0;
  uint64_t forward_workspace_bytes_ = 0, backward_workspace_bytes_ = 0;  // still to make
  // A tensor OffloadActivations copied to the host: its pack id, its device
  // tensor (referenced by the forward stash while it is there), its size.
  struct Packed {
    uint64_t id = 0;
    TensorId device = kNoTensor;
    uint64_t bytes = 0;
    uint32_t kept_index = 0;  // a region input: its index in Region::kept
  };
  struct Node {
    uint64_t seq = 0;
    uint32_t op = 0;
    uint32_t module = 0;
    uint32_t region = 0;
    int32_t deps = 0;
    bool ran = false;
    bool is_accumulate = false;
    uint64_t accumulate_bytes = 0;
    TensorId* grad_slot = nullptr;
    TensorId output = kNoTensor;  // what the op returned (SetOutput)
    std::vector<TensorId> slots;  // incoming gradients
    // Per slot: the bytes of the gradient when it is a slice (a view of part of
    // its storage, kSlice), else 0.
    std::vector<uint64_t> slice_bytes;
    std::vector<uint8_t> from_outside;  // per slot: delivered from outside the node's region
    std::vector<TensorId> saved;
    std::vector<GradOut> outs;
    std::vector<uint64_t> workspace;
    std::vector<uint64_t> scratch;
    bool grads_before_scratch = false;
    std::vector<std::pair<uint64_t, Category>> offloaded;  // saved on the host
    std::vector<Packed> packed;                            // offloaded by OffloadActivations
    bool gemm = false;                                     // runs cuBLAS gemms (Gemm)
    uint32_t hook = 0;                                     // SetNodeHook's id (0: none)
    bool second_input_first = false;  // its gradients are made in reverse edge order
  };
  // A recorded checkpoint region: how to recompute its saved tensors.
  struct ScriptOp {
    bool alloc = true;
    bool hook = false;   // ScriptHook: `local` is the hook's id
    uint32_t local = 0;  // index into the region's locals
    uint64_t bytes = 0;
    Category category = Category::kOther;
    uint32_t op = 0, module = 0;
  };
  struct Region {
    bool reentrant = false;
    bool recomputed = false;
    std::vector<ScriptOp> script;
    std::vector<TensorId> locals;                    // forward tensor of each local index
    std::vector<std::pair<NodeId, uint32_t>> saves;  // (node, local index)
    std::vector<TensorId> kept;                      // external inputs kept by the closure
    std::vector<Packed> packed_inputs;               // kept inputs OffloadActivations offloaded
    int32_t pending_nodes = 0;
    size_t pack_end = 0;                     // script length when the last Save was made
    std::vector<uint64_t> ungraded_outputs;  // bytes of outputs without a gradient
  };
  static constexpr uint32_t kNoRegion = 0;
  // The script length at which the current region's recompute has packed
  // `saved` for the node whose op returned `output`: before that output's
  // allocation for an input, the script's current end for the result.
  size_t PackPosition(const Region& r, TensorId output, TensorId saved) const;
  // The script index of local `t`'s allocation in region `r` (the current
  // one), or kNotInScript.
  static constexpr size_t kNotInScript = std::numeric_limits<size_t>::max();
  size_t AllocPosition(const Region& r, TensorId t) const;

  // `slice_bytes`: the gradient is a view of that many bytes of `grad` (0: all of it).
  void Deliver(NodeId target, uint32_t slot, TensorId grad, uint32_t from_region,
               uint64_t slice_bytes = 0);
  // Allocates a pending cuBLAS workspace (outside any checkpoint region's
  // script: a recompute does not make it again) and marks it made.
  void MakeWorkspace(uint64_t* pending_bytes);
  // Runs one node in backward (engine.cpp evaluate_function): an
  // AccumulateGrad stores its gradient; any other node recomputes its
  // checkpoint region if needed, computes its gradients, releases what it
  // held and delivers the gradients to their targets.
  void Run(NodeId n);
  // AccumulateGrad: the incoming gradient becomes .grad, or is added to it.
  void RunAccumulateGrad(Node& node);
  // Whether node `n` saved tensors in its (checkpoint) region: running it
  // unpacks them, which triggers the region's recompute.
  bool UnpacksInRegion(NodeId n) const;
  // Reentrant checkpointing: the gradients arriving from outside the region
  // stay alive until the region's backward is done.
  void KeepOutputGrads(Node& node);
  // The node's tensors saved on the host, copied back to the device.
  std::vector<TensorId> UnpackOffloaded(const Node& node);
  // The node's transient workspace, tagged with its op.
  std::vector<TensorId> AllocWorkspace(const Node& node, std::string_view op);
  // The gradients the node produces, paired with the edge each goes along:
  // new tensors, or its incoming gradient passed on (one more reference).
  struct Produced {
    const GradOut* out;
    TensorId grad;
    uint64_t slice_bytes;  // 0: the whole storage
  };
  std::vector<Produced> ProduceGrads(const Node& node, std::string_view op);
  // The node's scratch: allocated in order, then all freed.
  void RunScratch(const Node& node, std::string_view op);
  // After the node's gradients exist: its workspace, saved tensors, unpacked
  // copies and incoming gradients go, in that order.
  void ReleaseAfterRun(Node& node, const std::vector<TensorId>& workspace,
                       const std::vector<TensorId>& unpacked);
  // One more node of `region` has run: after the last, the tensors the
  // checkpoint kept go.
  void FinishRegionNode(uint32_t region);
  void Recompute(uint32_t region);
  int32_t LocalOf(uint32_t region, TensorId t) const;
  // OffloadActivations (autograd_offload.cc): the pack hook (true: offloaded),
  // bringing a packed tensor back, and the hook run after a node that did.
  bool Pack(TensorId t, Packed* packed);
  TensorId Unpack(const Packed& p, std::vector<TensorId>* brought_back);
  void BringBackInputs(Region& r, std::vector<TensorId>* brought_back);
  std::vector<TensorId> UnpackPacked(const Node& node, std::vector<TensorId>* brought_back);
  void AfterUnpackingNode(const std::vector<TensorId>& brought_back);
  void ReleaseOffloadStashes();
  bool KeptOwned(const Region& r, size_t kept_index) const;
  uint64_t next_pack_id_ = 0;
  std::vector<std::pair<uint64_t, TensorId>> fwd_stash_;  // (pack id, device tensor)
  std::vector<TensorId> bwd_stash_;                       // brought back by earlier nodes
  std::vector<TensorId> brought_back_;                    // by the node running now

  EventStream* out_;
  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<Region> regions_;  // index 0 unused
  uint32_t region_ = kNoRegion;
  int hook_depth_ = 0;  // HookScopes alive: allocations outside the region's script
  bool recomputing_by_storage_ = false;
  // The region whose script records allocations now (none inside a hook).
  uint32_t ScriptRegion() const { return hook_depth_ > 0 ? kNoRegion : region_; }
  uint64_t next_seq_ = 0;
  uint64_t next_event_id_ = 1;
  uint32_t module_ = 0;
};

}  // namespace vramscope::lower
