// The CUDA streams of the sharding libraries, as the lowering emits them
// (docs/parallel.md "Side streams"). Each expectation is worked out here from
// the library code, not from the lowering:
//  - FSDP1 (torch 2.4-2.13 _runtime_utils.py _unshard / _reshard,
//    _flat_param.py _free_unsharded_flat_param, _limiter_utils.py): the
//    unsharded flat parameter is allocated on _unshard_stream, freed at reshard
//    after record_stream on the computation stream; before each all-gather the
//    rate limiter waits for the oldest queued free once two are queued. The
//    autograd gradient is record_stream'ed on _post_backward_stream, whose
//    allocations (the sharded gradient) live in that stream's pool.
//  - FSDP2 (_fully_shard/_fsdp_collectives.py, _fsdp_param_group.py): never
//    calls record_stream; the flat all-gather output is allocated on the
//    copy-in stream, the per-parameter outputs on the current stream, the
//    reduce-scatter output on reduce_scatter_stream.
//  - DeepSpeed ZeRO-3 (0.19.8 partitioned_param_coordinator.py,
//    partition_parameters.py free_param, stage3.py): gathers on
//    __allgather_stream, released after record_stream(current_stream());
//    gradients record_stream'ed on reduce_and_partition_stream, which the
//    epilogue synchronizes at the end of backward.
//  - DDP and ZeRO 1-2 allocate on the default stream only and call no
//    record_stream (ProcessGroupNCCL >= 2.8 stashes tensors instead).
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_models.h"

#include "vramscope/lower.h"

namespace vramscope {
namespace {

using lower_testing::TestGpu;
using lower_testing::Tiny;

TrainingSetup Sharded(DataParallel mode, int fsdp_version = 2) {
  TrainingSetup s;
  s.batch = 1;
  s.seq = 32;
  s.steps = 2;
  s.precision = Precision::kBf16Mixed;
  s.optimizer = OptimizerKind::kAdamWFused;
  s.parallel.gpus = 4;
  s.parallel.dp_mode = mode;
  s.parallel.fsdp_version = fsdp_version;
  s.parallel.zero.param_persistence_threshold = 0;  // shard everything
  s.parallel.zero.max_reuse_distance = 0;           // release every module
  return s;
}

EventStream Lowered(const TrainingSetup& s) {
  auto r = LowerRankClasses(Tiny(), s, TestGpu());
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok() || r->empty()) return EventStream{};
  EXPECT_TRUE((*r)[0].lowered.stream.Validate().ok());
  return std::move((*r)[0].lowered.stream);
}

// The events of one (step, phase).
std::vector<Event> PhaseEvents(const EventStream& stream, uint32_t step, Phase phase) {
  std::vector<Event> out;
  bool inside = false;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) {
      inside = e.step == step && e.phase == phase;
      continue;
    }
    if (inside) out.push_back(e);
  }
  return out;
}

// The life of every allocation made by `op`, as tokens in stream order:
// G<x> its allocation (x: a, b, ... in allocation order over the whole
// stream), R<x> its free after a record_stream, F<x> a plain free, X<x> the
// CPU-side wait that completes its use.
class OpTrace {
 public:
  OpTrace(const EventStream& stream, std::string_view op) : stream_(stream), op_(op) {
    for (const Event& e : stream.events()) {
      if (e.kind == EventKind::kAlloc && stream.String(e.op) == op_) {
        label_[e.id] = std::string(1, static_cast<char>('a' + label_.size() % 26));
      }
    }
  }
  std::string Of(const std::vector<Event>& events) const {
    std::string out;
    std::set<uint64_t> used;
    for (const Event& e : events) {
      auto it = label_.find(e.id);
      if (e.kind == EventKind::kPhase || e.kind == EventKind::kEmptyCache || it == label_.end())
        continue;
      if (e.kind == EventKind::kAlloc && stream_.String(e.op) != op_) continue;
      std::string token;
      switch (e.kind) {
        case EventKind::kAlloc: token = "G"; break;
        case EventKind::kRecordStream: used.insert(e.id); continue;
        case EventKind::kFree: token = used.erase(e.id) ? "R" : "F"; break;
        case EventKind::kUsesDone: token = "X"; break;
        default: continue;
      }
      out += (out.empty() ? "" : " ") + token + it->second;
    }
    return out;
  }

 private:
  const EventStream& stream_;
  std::string op_;
  std::map<uint64_t, std::string> label_;
};

// Streams that allocations of `op` use, and the streams their uses record.
std::set<uint32_t> AllocStreams(const EventStream& stream, std::string_view op) {
  std::set<uint32_t> out;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kAlloc && stream.String(e.op) == op) out.insert(e.stream);
  }
  return out;
}

size_t CountKind(const EventStream& stream, EventKind kind) {
  size_t n = 0;
  for (const Event& e : stream.events()) n += e.kind == kind;
  return n;
}

// Units: a = root (embeddings + final norm + head), then layers 1-4. In the
// forward every layer is resharded after its forward; the root is not. The
// limiter waits for the oldest queued free before an all-gather once two
// are queued: b is waited for before the third layer's gather, c before the
// fourth's.
TEST(Streams, Fsdp1ForwardGathersOnTheUnshardStreamUnderTheRateLimiter) {
  const EventStream s = Lowered(Sharded(DataParallel::kFsdp, 1));
  const OpTrace gathers(s, "fsdp::all_gather");
  EXPECT_EQ(gathers.Of(PhaseEvents(s, 1, Phase::kForward)), "Ga Gb Rb Gc Rc Xb Gd Rd Xc Ge Re");
  EXPECT_EQ(AllocStreams(s, "fsdp::all_gather"), (std::set<uint32_t>{1}));
  EXPECT_EQ(s.metadata().at("stream.1"), "unshard (FSDP1)");
}

// Backward with BACKWARD_PRE prefetch, from the forward's queue [d e]:
// layer 4 is gathered (wait d) and layer 3 prefetched (one queued: no wait);
// each later unit reshards the previous layer and prefetches the next, waiting
// for the oldest queued free; the root is resharded at the end.
TEST(Streams, Fsdp1BackwardPrefetchesUnderTheRateLimiter) {
  TrainingSetup setup = Sharded(DataParallel::kFsdp, 1);
  setup.parallel.fsdp_backward_prefetch = FsdpPrefetch::kPre;
  const EventStream s = Lowered(setup);
  const OpTrace gathers(s, "fsdp::all_gather");
  EXPECT_EQ(gathers.Of(PhaseEvents(s, 1, Phase::kBackward)), "Xd Gf Gg Rf Xe Gh Rg Xf Gi Rh Ri Ra");
}

// Without prefetch (NO_PREFETCH, the HF Trainer's default), from the same
// queue [d e]: each layer is gathered at its own pre-backward, after the
// previous layer's reshard is queued and the oldest queued free waited for.
TEST(Streams, Fsdp1BackwardWithoutPrefetchGathersOneLayerAtATime) {
  const EventStream s = Lowered(Sharded(DataParallel::kFsdp, 1));
  const OpTrace gathers(s, "fsdp::all_gather");
  EXPECT_EQ(gathers.Of(PhaseEvents(s, 1, Phase::kBackward)),
            "Xd Gf Rf Xe Gg Rg Xf Gh Rh Xg Gi Ri Ra");
}

// The unsharded gradients are freed after record_stream on the post-backward
// stream, every such free is completed before the optimizer runs, and the
// sharded gradients live in the post-backward stream's pool.
TEST(Streams, Fsdp1GradientsWaitForThePostBackwardStream) {
  const EventStream s = Lowered(Sharded(DataParallel::kFsdp, 1));
  std::set<uint64_t> recorded_on_2, done;
  for (const Event& e : PhaseEvents(s, 1, Phase::kBackward)) {
    if (e.kind == EventKind::kRecordStream && e.stream == 2) recorded_on_2.insert(e.id);
    if (e.kind == EventKind::kUsesDone) done.insert(e.id);
  }
  EXPECT_FALSE(recorded_on_2.empty());
  for (uint64_t id : recorded_on_2) EXPECT_EQ(done.count(id), 1u) << id;
  EXPECT_EQ(AllocStreams(s, "fsdp::sharded_grad"), (std::set<uint32_t>{2}));
  EXPECT_EQ(AllocStreams(s, "fsdp::reduce_scatter_output"), (std::set<uint32_t>{2}));
}

TEST(Streams, Fsdp2NeverRecordsStreams) {
  const EventStream s = Lowered(Sharded(DataParallel::kFsdp, 2));
  EXPECT_EQ(CountKind(s, EventKind::kRecordStream), 0u);
  EXPECT_EQ(CountKind(s, EventKind::kUsesDone), 0u);
  EXPECT_EQ(AllocStreams(s, "fsdp::all_gather_output"), (std::set<uint32_t>{1}));
  EXPECT_EQ(AllocStreams(s, "fsdp::all_gather"), (std::set<uint32_t>{0}));
  EXPECT_EQ(AllocStreams(s, "fsdp::reduce_scatter_input"), (std::set<uint32_t>{0}));
  EXPECT_EQ(AllocStreams(s, "fsdp::reduce_scatter_output"), (std::set<uint32_t>{2}));
  EXPECT_EQ(AllocStreams(s, "fsdp::sharded_grad"), (std::set<uint32_t>{2}));
}

// ZeRO-3 (DeepSpeed 0.19.8) in its first forward, while the trace is being
// recorded, gathers each module's parameters at its forward pre-hook and
// releases all of them at its forward hook (release_sub_module). Modules in
// order: the model, the base model, the embedding (a), the rotary embedding,
// layer 0, its input norm (b), self_attn, q (c), k (d), v (e), o (f), the
// post-attention norm (g), mlp, gate (h), act_fn, up (i), down (j), layer 1,
// ... Every module's fetch first waits for the oldest release once two are
// pending (the assumed lag, docs/parallel.md), containers' fetches too.
TEST(Streams, Zero3GathersOnTheAllGatherStreamAndReleasesAfterRecordStream) {
  const EventStream s = Lowered(Sharded(DataParallel::kZero3));
  const OpTrace gathers(s, "zero3::all_gather");
  const std::string first_layer =
      "Ga Ra Gb Rb Xa Gc Rc Xb Gd Rd Xc Ge Re Xd Gf Rf Xe Gg Rg Xf Gh Rh Xg Gi Ri Xh Gj Rj Xi Gk "
      "Rk";
  EXPECT_EQ(gathers.Of(PhaseEvents(s, 1, Phase::kForward)).substr(0, first_layer.size()),
            first_layer);
  EXPECT_EQ(AllocStreams(s, "zero3::all_gather"), (std::set<uint32_t>{1}));
  // The synchronous gathers (init's param.all_gather(), the persistent
  // parameters after a step) run on the current stream.
  EXPECT_EQ(AllocStreams(s, "zero3::all_gather_sync"), (std::set<uint32_t>{0}));
  EXPECT_EQ(s.metadata().at("stream.2"), "reduce-and-partition (DeepSpeed)");
  // Gradients: record_stream on reduce_and_partition_stream, all completed
  // by the epilogue's synchronize before the optimizer step.
  size_t recorded_on_2 = 0, done = 0;
  for (const Event& e : PhaseEvents(s, 1, Phase::kBackward)) {
    recorded_on_2 += e.kind == EventKind::kRecordStream && e.stream == 2;
    done += e.kind == EventKind::kUsesDone;
  }
  EXPECT_GT(recorded_on_2, 0u);
  EXPECT_GE(done, recorded_on_2);
}

// offload_param: each gather first copies the rank's partition to the device
// on the all-gather stream (`ds_tensor.to(device)` in _all_gather_sequential:
// a quarter of the padded gathered bytes on 4 ranks) and frees it once the
// gather buffer holds it.
TEST(Streams, Zero3OffloadParamsStagesPartitionsOnTheAllGatherStream) {
  TrainingSetup setup = Sharded(DataParallel::kZero3);
  setup.parallel.offload = Offload::kParams;
  const EventStream s = Lowered(setup);
  EXPECT_EQ(AllocStreams(s, "zero3::partition_to_device"), (std::set<uint32_t>{1}));
  std::vector<uint64_t> staged, gathered;
  for (const Event& e : PhaseEvents(s, 1, Phase::kForward)) {
    if (e.kind != EventKind::kAlloc) continue;
    if (s.String(e.op) == "zero3::partition_to_device") staged.push_back(e.size_bytes);
    if (s.String(e.op) == "zero3::all_gather") gathered.push_back(e.size_bytes);
  }
  ASSERT_EQ(staged.size(), gathered.size());
  for (size_t i = 0; i < staged.size(); ++i) EXPECT_EQ(staged[i], gathered[i] / 4);
  const OpTrace trace(s, "zero3::partition_to_device");
  EXPECT_EQ(trace.Of(PhaseEvents(s, 1, Phase::kForward)).substr(0, 11), "Ga Fa Gb Fb");
}

TEST(Streams, DdpAndZero12UseTheDefaultStreamOnly) {
  for (DataParallel mode : {DataParallel::kDdp, DataParallel::kZero1, DataParallel::kZero2}) {
    const EventStream s = Lowered(Sharded(mode));
    for (const Event& e : s.events()) {
      ASSERT_NE(e.kind, EventKind::kRecordStream);
      if (e.kind == EventKind::kAlloc) ASSERT_EQ(e.stream, 0u);
    }
  }
}

// FSDP1 CPUOffload with MixedPrecision: per unshard, on the pre-unshard
// stream, a full-precision device copy of the shard (fp32 after accelerate's
// upcast) is cast into the bf16 _mp_shard (half its bytes) and freed; the
// _mp_shard is read by the all-gather on the unshard stream (record_stream)
// and freed after it. Without offload none of this exists.
TEST(Streams, Fsdp1OffloadStagesShardsOnThePreUnshardStream) {
  TrainingSetup setup = Sharded(DataParallel::kFsdp, 1);
  setup.parallel.offload = Offload::kParams;
  const EventStream s = Lowered(setup);
  EXPECT_EQ(AllocStreams(s, "fsdp::h2d_sharded_param"), (std::set<uint32_t>{3}));
  EXPECT_EQ(AllocStreams(s, "fsdp::mp_shard"), (std::set<uint32_t>{3}));
  std::map<uint64_t, uint64_t> h2d, mp;
  for (const Event& e : s.events()) {
    if (e.kind != EventKind::kAlloc) continue;
    if (s.String(e.op) == "fsdp::h2d_sharded_param") h2d[h2d.size()] = e.size_bytes;
    if (s.String(e.op) == "fsdp::mp_shard") mp[mp.size()] = e.size_bytes;
  }
  ASSERT_EQ(h2d.size(), mp.size());
  for (const auto& [i, bytes] : h2d) EXPECT_EQ(bytes, 2 * mp[i]);
  const OpTrace h2d_trace(s, "fsdp::h2d_sharded_param");
  const OpTrace mp_trace(s, "fsdp::mp_shard");
  EXPECT_EQ(h2d_trace.Of(PhaseEvents(s, 1, Phase::kForward)).substr(0, 8), "Ga Fa Gb");
  EXPECT_EQ(mp_trace.Of(PhaseEvents(s, 1, Phase::kForward)).substr(0, 5), "Ga Ra");
  EXPECT_TRUE(AllocStreams(Lowered(Sharded(DataParallel::kFsdp, 1)), "fsdp::mp_shard").empty());
}

// FSDP1 CPUOffload keeps every unit's device sharded gradient
// (_saved_grad_shard) until the end of backward (prepare_gradient_for_optim
// in the final callback): five units' outputs are alive at once.
TEST(Streams, Fsdp1OffloadKeepsShardedGradientsUntilBackwardEnds) {
  TrainingSetup setup = Sharded(DataParallel::kFsdp, 1);
  setup.parallel.offload = Offload::kParams;
  const EventStream s = Lowered(setup);
  size_t live = 0, most = 0;
  std::set<uint64_t> outputs;
  for (const Event& e : PhaseEvents(s, 1, Phase::kBackward)) {
    if (e.kind == EventKind::kAlloc && s.String(e.op) == "fsdp::reduce_scatter_output") {
      outputs.insert(e.id);
      most = std::max(most, ++live);
    } else if (e.kind == EventKind::kFree && outputs.count(e.id)) {
      --live;
    }
  }
  EXPECT_EQ(most, 5u);
  EXPECT_EQ(live, 0u);
}

// FSDP2 CPUOffloadPolicy: on the copy-in stream each unit's shards are
// copied to the device (fp32) and cast to bf16 (half the bytes); the casts
// live until the flat all-gather output has been allocated.
TEST(Streams, Fsdp2OffloadCopiesShardsOnTheCopyInStream) {
  TrainingSetup setup = Sharded(DataParallel::kFsdp, 2);
  setup.parallel.offload = Offload::kParams;
  const EventStream s = Lowered(setup);
  EXPECT_EQ(AllocStreams(s, "fsdp::h2d_sharded_param"), (std::set<uint32_t>{1}));
  EXPECT_EQ(AllocStreams(s, "fsdp::all_gather_input"), (std::set<uint32_t>{1}));
  std::vector<std::string> order;
  for (const Event& e : PhaseEvents(s, 1, Phase::kForward)) {
    const std::string op(s.String(e.op));
    if (e.kind == EventKind::kAlloc && op.rfind("fsdp::", 0) == 0) order.push_back(op);
    if (order.size() == 3) break;
  }
  EXPECT_EQ(order, (std::vector<std::string>{"fsdp::h2d_sharded_param", "fsdp::all_gather_input",
                                             "fsdp::all_gather_output"}));
}

}  // namespace
}  // namespace vramscope
