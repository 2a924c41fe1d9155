// DeepSpeed ZeRO stages 1 and 2 (DeepSpeedZeroOptimizer,
// deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeed 0.19.8): the trainable
// parameters flattened into one buffer split into N equal partitions; this
// rank keeps the fp32 master and the optimizer state of its partition, and
// its gradients are reduced bucket by bucket into a partition buffer. Which
// parameters a partition covers differs from rank to rank, so each data-
// parallel rank is lowered as its own class (rank_classes.cc).
#include <algorithm>
#include <unordered_map>

#include "int_math.h"
#include "sharding_modes.h"
#include "sharding_zero.h"

namespace vramscope::lower {
namespace {

// A trainable parameter's place in the flat buffer (bit16_groups_flat), in
// model.parameters() order (the optimizer's single param group; transformers'
// DeepSpeed integration passes the trainable parameters when the config names
// the optimizer).
struct FlatEntry {
  Param* param = nullptr;
  uint64_t offset = 0;  // first element in the flat buffer
  // Elements of this rank's partition the parameter covers (0: not in
  // params_in_partition), from element `first` of the parameter on.
  uint64_t first = 0, count = 0;
};

class Zero12Strategy final : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;

  void EndBackward() override;

 protected:
  std::string SetupModule() const override { return std::string(DataParallelName(s_.mode)); }
  void SetupBuffers() override;
  void OnGradAccumulated(TensorId* slot) override;
  void StepShards(const TrainingSetup& setup, OptimizerExtras* extras) override;

 private:
  // IPGBucket (one communication dtype: the model's, engine
  // communication_data_type): the contiguous buffer(s) and what is in them.
  struct Bucket {
    std::vector<TensorId> buffers;  // reduce_bucket_size elements; two with overlap_comm
    int index = 0;
    uint64_t elements = 0;
    std::vector<size_t> entries;  // flat_ indices, in arrival order
    int extra_large = -1;         // extra_large_param_to_reduce: a flat_ index
  };

  bool Stage2() const { return s_.mode == DataParallel::kZero2; }
  bool Offload() const { return s_.layout.offload != Offload::kNone; }
  bool Overlap() const { return s_.layout.zero.overlap_comm == 1; }
  bool Contiguous() const { return s_.layout.zero.contiguous_gradients || Offload(); }
  bool Boundary() const { return backward_index_ + 1 >= s_.micro_batches; }
  uint32_t ReduceStream() const {
    return Overlap() && !s_.tape->cpu_rules ? kReduceStream : kDefaultStream;
  }
  uint64_t BucketElements() const { return s_.layout.zero.ReduceBucket(s_.hidden); }

  void BuildLayout();
  void Flatten();
  void MakeMasterPartition();
  void SetupBuckets();
  void ReduceIndependent(size_t e);
  void ReduceIpgGrads();
  void AverageTensor();
  void AfterReduce(size_t e);
  void CopyGradsInPartition(size_t e);
  void OffloadGrad(size_t e);
  void ClearGrad(size_t e);
  void FlatPartition();
  void StepOnDevice(const TrainingSetup& setup, OptimizerExtras* extras);

  std::vector<FlatEntry> flat_;
  std::unordered_map<const TensorId*, size_t> entry_of_slot_;
  uint64_t partition_numel_ = 0;
  uint8_t bytes_ = kF32;    // the flat buffer's dtype (self.dtype: the first parameter's)
  uint64_t gip_numel_ = 0;  // grads_in_partition: the full params of this partition
  uint64_t largest_numel_ = 0;
  Bucket bucket_;
  bool ready_ = false;  // ready_for_gradients: this backward's buckets exist
  TensorId grads_in_partition_ = kNoTensor;
  std::vector<TensorId> all_grad_;  // all_grad_tensors: grads kept across micro-batches
  std::vector<TensorId> averaged_;  // averaged_gradients, until the step
  std::vector<size_t> deferred_;    // previous_reduced_grads (overlap_comm, no contiguous)
  std::vector<bool> host_accum_;    // accumulated_grads_in_cpu made (offload, micro-batches)
  Param master_;                    // single_partition_of_fp32_groups[0]
  uint64_t backward_index_ = 0;     // micro-batch within the optimizer step
};

// stage_1_and_2.py __init__: the flat buffer is padded to a multiple of
// 2 * N elements (nccl_start_alignment_factor 2 times the world size;
// parameter_alignment off) and cut into N partitions of flat / N; a
// partition's params_in_partition are the parameters overlapping it
// (get_partition_info), whole ones counted in full by grads_in_partition.
void Zero12Strategy::BuildLayout() {
  uint64_t total = 0;
  for (Param& p : s_.tape->params) {
    if (!p.trainable || p.numel == 0) continue;
    if (flat_.empty()) bytes_ = p.elem_bytes;
    flat_.push_back(FlatEntry{&p, total});
    entry_of_slot_[&p.grad] = flat_.size() - 1;
    total += p.numel;
    largest_numel_ = std::max(largest_numel_, p.numel);
  }
  const uint64_t align = 2ull * s_.world;
  partition_numel_ = CeilDiv(total, align) * align / s_.world;
  const uint64_t begin = partition_numel_ * s_.dp_rank, end = begin + partition_numel_;
  for (FlatEntry& e : flat_) {
    const uint64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.param->numel);
    if (lo >= hi) continue;
    e.first = lo - e.offset;
    e.count = hi - lo;
    gip_numel_ += e.param->numel;
  }
  host_accum_.assign(flat_.size(), false);
}

// flatten_dense_tensors_aligned (torch.cat), then _update_model_bit16_weights:
// every trainable parameter becomes a view of the flat buffer and its own
// storage goes. From 0.18.7 (PR #7828) the cat runs on the device when its
// free memory holds the flat buffer (flatten_on_accelerator), with the
// parameters still there; before, they were moved to the host first
// (move_to_cpu) and the host flat buffer copied to the device.
void Zero12Strategy::Flatten() {
  Graph& g = s_.tape->graph;
  const bool on_device = s_.layout.zero.deepspeed_version >= 1807;
  std::vector<TensorId> old;
  for (FlatEntry& e : flat_) old.push_back(e.param->var.t);
  if (!on_device) {
    for (TensorId t : old) g.Drop(t);
  }
  const TensorId flat =
      s_.Alloc(partition_numel_ * s_.world * bytes_, Category::kParameters, "zero::flatten");
  for (size_t i = 0; i < flat_.size(); ++i) {
    g.Ref(flat);
    if (on_device) g.Drop(old[i]);
    flat_[i].param->var.t = flat;
  }
  s_.buffers.push_back(flat);
}

// The fp32 master partition: `partition.detach().clone().to(device, fp32)`
// (a clone even when the model is fp32), on the host with offload_optimizer,
// where a bit16 copy of the partition (param_buffer_of_bit16_for_cpu_offload,
// torch.full) stages the update. initialize_optimizer_states then makes the
// fp32 gradient partition (torch.zeros): dropped at once without offload,
// the host gradient buffer with it.
void Zero12Strategy::MakeMasterPartition() {
  Graph& g = s_.tape->graph;
  const uint64_t part = partition_numel_;
  const TensorId clone = s_.Alloc(part * bytes_, Category::kOptimizerState, "aten::clone");
  master_.numel = part;
  master_.elem_bytes = kF32;
  master_.trainable = true;
  master_.module = s_.tape->module();
  // CPU rules: `.to("cpu")` of a CPU fp32 tensor is the tensor itself.
  const bool same = bytes_ == kF32 && (!Offload() || s_.tape->cpu_rules);
  if (same) {
    s_.buffers.push_back(clone);
  } else {
    const TensorId master =
        Offload() ? s_.HostAlloc(part * kF32, Category::kOptimizerState, "aten::_to_copy")
                  : s_.Alloc(part * kF32, Category::kOptimizerState, "aten::_to_copy");
    if (master != kNoTensor) s_.buffers.push_back(master);
    g.Drop(clone);
  }
  if (Offload()) {
    const TensorId staging = s_.HostAlloc(part * bytes_, Category::kOptimizerState, "aten::full");
    if (staging != kNoTensor) s_.buffers.push_back(staging);
    // temp_grad_buffer_for_cpu_offload (host) and _for_gpu_offload (device):
    // the largest parameter's numel in the model's dtype, kept.
    const TensorId host = s_.HostAlloc(largest_numel_ * bytes_, Category::kCommunication,
                                       "zero::temp_grad_buffer_for_cpu_offload");
    if (host != kNoTensor) s_.buffers.push_back(host);
    s_.buffers.push_back(s_.Alloc(largest_numel_ * bytes_, Category::kCommunication,
                                  "zero::temp_grad_buffer_for_gpu_offload"));
    const TensorId grad = s_.HostAlloc(part * kF32, Category::kGradients, "aten::zeros");
    if (grad != kNoTensor) s_.buffers.push_back(grad);
  } else {
    g.Drop(s_.Alloc(part * kF32, Category::kGradients, "aten::zeros"));
  }
}

void Zero12Strategy::SetupBuffers() {
  BuildLayout();
  if (flat_.empty()) return;
  Flatten();
  MakeMasterPartition();
}

// setup_buckets, at the first gradient hook of a backward: with
// contiguous_gradients (the default; forced on by offload) one buffer of
// reduce_bucket_size elements in the model's dtype, two with overlap_comm.
void Zero12Strategy::SetupBuckets() {
  if (ready_) return;
  ready_ = true;
  if (!Contiguous()) return;
  const int count = Overlap() ? 2 : 1;
  for (int i = 0; i < count; ++i) {
    bucket_.buffers.push_back(
        s_.Alloc(BucketElements() * bytes_, Category::kCommunication, "zero::ipg_buffer"));
  }
  bucket_.index = 0;
}

// create_gradient_handling_hooks -> process_gradients: stage 2 (and stage 1
// with overlap_comm) reduces each gradient as its hook fires; stage 1 only
// makes the buckets and reduces after backward (reduce_gradients).
void Zero12Strategy::OnGradAccumulated(TensorId* slot) {
  auto it = entry_of_slot_.find(slot);
  if (it == entry_of_slot_.end() || *slot == kNoTensor) return;
  const uint32_t saved_module = s_.tape->module();
  s_.tape->SetModule("zero");
  SetupBuckets();
  if (Stage2() || (Overlap() && Boundary())) ReduceIndependent(it->second);
  s_.tape->graph.SetModule(saved_module);
}

// reduce_independent_p_g_buckets_and_remove_grads: a gradient that does not
// fit in the bucket's remaining room first flushes it; one larger than the
// whole bucket stays in its own storage and is reduced alone (cloned first
// under offload's gradient safety); the others are copied into the bucket and
// .grad becomes a view of it, freeing the gradient.
void Zero12Strategy::ReduceIndependent(size_t e) {
  Graph& g = s_.tape->graph;
  TensorId& grad = flat_[e].param->grad;
  const uint64_t numel = flat_[e].param->numel;
  if (bucket_.elements + numel > BucketElements()) {
    ReduceIpgGrads();
    if (Contiguous() && Overlap()) bucket_.index = 1 - bucket_.index;
  }
  if (Contiguous()) {
    if (numel > BucketElements()) {
      if (Offload()) {
        const TensorId clone = s_.Alloc(numel * bytes_, Category::kGradients, "aten::clone");
        g.Drop(grad);
        grad = clone;
      }
      bucket_.extra_large = static_cast<int>(e);
    } else if (!bucket_.buffers.empty()) {
      g.Ref(bucket_.buffers[bucket_.index]);
      g.Drop(grad);
      grad = bucket_.buffers[bucket_.index];
    }
  }
  bucket_.elements += numel;
  bucket_.entries.push_back(e);
}

// average_tensor with reduce_scatter (the default): the bucket is cut into
// one slice per (parameter, owning rank), consecutive slices of one rank
// merged; with use_multi_rank_bucket_allreduce (the default) they are all-
// reduced in groups closed once past reduce_bucket_size elements
// (allreduce_and_scatter), each group flattened by allreduce_bucket — a
// torch.cat unless it is a single tensor (_flatten_dense_tensors returns a
// view of one) — and freed once copied back.
void Zero12Strategy::AverageTensor() {
  Graph& g = s_.tape->graph;
  std::vector<size_t> entries = bucket_.entries;
  if (bucket_.extra_large >= 0) entries = {static_cast<size_t>(bucket_.extra_large)};
  std::vector<uint64_t> slices;
  int64_t previous_rank = -1;
  for (size_t e : entries) {
    const uint64_t lo = flat_[e].offset, hi = lo + flat_[e].param->numel;
    for (uint64_t r = lo / partition_numel_; r * partition_numel_ < hi; ++r) {
      const uint64_t n =
          std::min(hi, (r + 1) * partition_numel_) - std::max(lo, r * partition_numel_);
      if (static_cast<int64_t>(r) == previous_rank) {
        slices.back() += n;
      } else {
        slices.push_back(n);
      }
      previous_rank = static_cast<int64_t>(r);
    }
  }
  uint64_t count = 0, numel = 0;
  auto flush = [&] {
    if (count > 1) {
      g.Drop(g.Alloc(numel * bytes_, Category::kCommunication, "zero::allreduce_bucket",
                     s_.tape->module(), ReduceStream()));
    }
    count = numel = 0;
  };
  for (uint64_t n : slices) {
    ++count;
    numel += n;
    if (numel > BucketElements()) flush();
  }
  flush();
}

// reduce_ipg_grads: the bucket (or the extra-large gradient) is reduced, then
// each of its parameters is handled: stage 2 drops the gradients of other
// ranks' parameters and copies its own into the partition buffer; stage 1
// copies its own and leaves the rest as views of the bucket.
void Zero12Strategy::ReduceIpgGrads() {
  Graph& g = s_.tape->graph;
  for (size_t e : deferred_) ClearGrad(e);
  deferred_.clear();
  if (!bucket_.entries.empty()) {
    if (Contiguous()) {
      AverageTensor();
    } else if (bucket_.entries.size() > 1) {
      // buffered_reduce_fallback -> allreduce_no_retain: one torch.cat of the
      // bucket's gradients.
      g.Drop(g.Alloc(bucket_.elements * bytes_, Category::kCommunication, "zero::allreduce_bucket",
                     s_.tape->module(), ReduceStream()));
    }
    for (size_t e : bucket_.entries) AfterReduce(e);
  }
  bucket_.entries.clear();
  bucket_.elements = 0;
  bucket_.extra_large = -1;
}

void Zero12Strategy::AfterReduce(size_t e) {
  const bool mine = flat_[e].count > 0;
  if (Stage2()) {
    if (!mine) {
      if (Overlap() && !Contiguous()) {
        deferred_.push_back(e);  // cleared at the next reduction
      } else {
        ClearGrad(e);
      }
    } else if (Contiguous()) {
      CopyGradsInPartition(e);
    }
  } else if (Contiguous() && mine) {
    CopyGradsInPartition(e);
  }
}

// copy_grads_in_partition: grads_in_partition (the full numel of every
// parameter of this partition, the model's dtype) made at the first copy,
// .grad becoming a view of it; with offload the gradient goes to the host.
void Zero12Strategy::CopyGradsInPartition(size_t e) {
  if (Offload()) {
    OffloadGrad(e);
    return;
  }
  Graph& g = s_.tape->graph;
  if (grads_in_partition_ == kNoTensor) {
    grads_in_partition_ = g.Alloc(gip_numel_ * bytes_, Category::kGradients,
                                  "zero::grads_in_partition", s_.tape->module(), ReduceStream());
  }
  TensorId& grad = flat_[e].param->grad;
  g.Ref(grads_in_partition_);
  g.Drop(grad);
  grad = grads_in_partition_;
}

// The offload path of copy_grads_in_partition: accumulating micro-batches
// keep a host buffer per parameter (accumulated_grads_in_cpu, its numel, the
// model's dtype); at the boundary the partition's slice is normed in fp64
// (set_norm_for_param_grad_in_gpu: `.to(get_norm_dtype())`, a double copy),
// cast to fp32 when the model is half (async_inplace_copy_grad_to_fp32_
// buffer_from_gpu), copied to the host gradient and .grad dropped.
void Zero12Strategy::OffloadGrad(size_t e) {
  Graph& g = s_.tape->graph;
  const FlatEntry& f = flat_[e];
  if ((s_.micro_batches > 1) && !host_accum_[e]) {
    host_accum_[e] = true;
    const TensorId acc = s_.HostAlloc(f.param->numel * bytes_, Category::kGradients,
                                      "zero::accumulated_grads_in_cpu");
    if (acc != kNoTensor) s_.buffers.push_back(acc);
  }
  if (!Boundary()) return;
  NormTemporary(s_, f.count);
  const TensorId cast = bytes_ == kF32 ? kNoTensor
                                       : g.Alloc(f.count * kF32, Category::kTemporaries,
                                                 "aten::_to_copy", s_.tape->module());
  ClearGrad(e);
  if (cast != kNoTensor) g.Drop(cast);
}

void Zero12Strategy::ClearGrad(size_t e) {
  TensorId& grad = flat_[e].param->grad;
  if (grad == kNoTensor) return;
  s_.tape->graph.Drop(grad);
  grad = kNoTensor;
}

// independent_gradient_partition_epilogue: the last bucket is reduced; the
// partition's gradients are kept (all_grad_tensors, added to across micro-
// batches) and at the boundary become averaged_gradients (get_flat_partition:
// views, plus zeros for the padding of the last partition); the buckets and
// grads_in_partition are released (_release_ipg_buffers) and every .grad
// cleared (_clear_param_grad_only).
void Zero12Strategy::EndBackward() {
  if (flat_.empty()) return;
  const uint32_t saved_module = s_.tape->module();
  s_.tape->SetModule("zero");
  Graph& g = s_.tape->graph;
  const bool epilogue = Stage2() || Boundary();
  if (!Stage2() && Boundary() && !Overlap()) {
    // reduce_gradients (stage 1, after backward): every gradient, in order.
    for (size_t e = 0; e < flat_.size(); ++e) {
      if (flat_[e].param->grad != kNoTensor) ReduceIndependent(e);
    }
  }
  if (epilogue) {
    ReduceIpgGrads();
    if (!Offload()) FlatPartition();
    for (TensorId t : bucket_.buffers) g.Drop(t);
    bucket_.buffers.clear();
    if (grads_in_partition_ != kNoTensor) g.Drop(grads_in_partition_);
    grads_in_partition_ = kNoTensor;
    ready_ = false;
    for (size_t e = 0; e < flat_.size(); ++e) ClearGrad(e);
  }
  ++backward_index_;
  g.SetModule(saved_module);
}

// get_all_grad_tensors / get_flat_partition (return_tensor_list): references
// to the partition's gradients (a missing one is torch.zeros_like), added in
// place into the previous micro-batches' (all_grad_tensors); at the boundary
// they become averaged_gradients, with zeros for the padding past the last
// parameter.
void Zero12Strategy::FlatPartition() {
  Graph& g = s_.tape->graph;
  std::vector<TensorId> grads;
  uint64_t covered = 0;
  for (const FlatEntry& f : flat_) {
    if (f.count == 0) continue;
    covered += f.count;
    if (f.param->grad == kNoTensor) {
      grads.push_back(s_.Alloc(f.param->numel * bytes_, Category::kGradients, "aten::zeros_like"));
    } else {
      g.Ref(f.param->grad);
      grads.push_back(f.param->grad);
    }
  }
  if (all_grad_.empty()) {
    all_grad_ = std::move(grads);
  } else {
    for (TensorId t : grads) g.Drop(t);  // added into the kept ones in place
  }
  if (!Boundary()) return;
  averaged_ = std::move(all_grad_);
  all_grad_.clear();
  if (covered < partition_numel_) {
    averaged_.push_back(
        s_.Alloc((partition_numel_ - covered) * bytes_, Category::kGradients, "aten::zeros"));
  }
}

// step() without offload: the global norm (get_grad_norm_direct: each
// partition gradient `.to(torch.double)` in turn), the partition's gradients
// flattened (torch.cat; one tensor: a view) and cast to fp32, the bit16
// gradients freed (averaged_gradients = None), the optimizer stepped on the
// fp32 master, the fp32 gradient dropped; the update is copied into the
// bit16 partition and all-gathered into the flat buffer in place.
void Zero12Strategy::StepOnDevice(const TrainingSetup& setup, OptimizerExtras* extras) {
  Graph& g = s_.tape->graph;
  for (const FlatEntry& f : flat_) {
    if (f.count > 0) NormTemporary(s_, f.count);
  }
  if (averaged_.empty()) return;
  TensorId flat = averaged_.front();
  if (averaged_.size() == 1) {
    g.Ref(flat);
  } else {
    flat = s_.Alloc(partition_numel_ * bytes_, Category::kTemporaries, "aten::cat");
  }
  TensorId grad = flat;
  if (bytes_ != kF32) {
    grad = s_.Alloc(partition_numel_ * kF32, Category::kTemporaries, "aten::_to_copy");
    g.Drop(flat);
  }
  for (TensorId t : averaged_) g.Drop(t);
  averaged_.clear();
  master_.grad = grad;
  OptimizerStepParams(*s_.tape, setup, {&master_}, extras);
  g.Drop(grad);
  master_.grad = kNoTensor;
}

// step() with offload: the norm comes from per-parameter scalars, the
// optimizer runs on the host partition (DeepSpeedCPUAdam's fp32 moments: 8
// bytes per element), the update is copied back through the pinned bit16
// buffer into the device partition in place.
void Zero12Strategy::StepShards(const TrainingSetup& setup, OptimizerExtras* extras) {
  if (flat_.empty()) return;
  backward_index_ = 0;
  if (!Offload()) {
    StepOnDevice(setup, extras);
    return;
  }
  if (s_.tape->cpu_rules) {
    // CPU rules: the host optimizer (here torch's, as the reference runs it)
    // steps in the same memory.
    master_.grad = kNoTensor;
    OptimizerStepParams(*s_.tape, setup, {&master_}, extras);
  } else if (!master_.stepped) {
    master_.stepped = true;
    s_.host_bytes += 8 * partition_numel_;
  }
}

}  // namespace

std::unique_ptr<ShardingStrategy> MakeZeroStrategy(ShardState state) {
  return std::make_unique<Zero12Strategy>(std::move(state));
}

}  // namespace vramscope::lower
