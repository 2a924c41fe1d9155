// Multi-GPU lowering: the sharding arithmetic of each mode checked against
// formulas written out here from the papers and library semantics (ZeRO paper
// Table 1 / Fig. 1 with K = 12, FSDP's sharded fp32 states, DDP's bucket
// copy, Megatron's 18 and 6 + 12/d bytes per parameter), not by calling the
// code under test; plus the 1F1B in-flight rule and the layout errors.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "test_models.h"

#include "vramscope/lower.h"

namespace vramscope {
namespace {

using lower_testing::TestGpu;
using lower_testing::Tiny;

// Parameter counts of the tiny model, by hand: h=256, i=688, kv heads 2 of
// head_dim 32, vocab 1000, 4 layers, untied head.
constexpr uint64_t kH = 256, kI = 688, kKv = 2 * 32, kV = 1000, kL = 4;
constexpr uint64_t kLayer = kH * kH + 2 * kH * kKv + kH * kH + 3 * kH * kI + 2 * kH;
constexpr uint64_t kParams = 2 * kV * kH + kL * kLayer + kH;

TrainingSetup Base() {
  TrainingSetup s;
  s.batch = 1;
  s.seq = 32;
  s.steps = 2;
  s.precision = Precision::kBf16Mixed;
  s.optimizer = OptimizerKind::kAdamWFused;
  s.parallel.zero.param_persistence_threshold = 0;  // shard everything
  return s;
}

using Bytes = std::array<uint64_t, kNumCategories>;

// Live bytes per category at the end of (step, phase): replays the stream.
Bytes LiveAtEnd(const EventStream& stream, uint32_t step, Phase phase) {
  Bytes live{};
  std::unordered_map<uint64_t, std::pair<Category, uint64_t>> alive;
  bool inside = false;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) {
      if (inside) return live;
      inside = e.step == step && e.phase == phase;
      continue;
    }
    if (e.kind == EventKind::kAlloc) {
      alive[e.id] = {e.category, e.size_bytes};
      live[static_cast<int>(e.category)] += e.size_bytes;
    } else if (e.kind == EventKind::kFree) {
      auto it = alive.find(e.id);
      live[static_cast<int>(it->second.first)] -= it->second.second;
      alive.erase(it);
    }
  }
  return live;
}

uint64_t At(const Bytes& b, Category c) { return b[static_cast<int>(c)]; }

// Live bytes per category when the first step begins (the setup has no phase
// marker of its own: it is everything before the first one).
Bytes LiveAtSetupEnd(const EventStream& stream) {
  Bytes live{};
  std::unordered_map<uint64_t, std::pair<Category, uint64_t>> alive;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) break;
    if (e.kind == EventKind::kAlloc) {
      alive[e.id] = {e.category, e.size_bytes};
      live[static_cast<int>(e.category)] += e.size_bytes;
    } else if (e.kind == EventKind::kFree) {
      auto it = alive.find(e.id);
      live[static_cast<int>(it->second.first)] -= it->second.second;
      alive.erase(it);
    }
  }
  return live;
}

// The most activation bytes alive at once over the whole stream.
uint64_t ActivationPeak(const EventStream& stream) {
  uint64_t live = 0, peak = 0;
  std::unordered_map<uint64_t, uint64_t> act;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kAlloc && e.category == Category::kActivations) {
      act[e.id] = e.size_bytes;
      live += e.size_bytes;
      peak = std::max(peak, live);
    } else if (e.kind == EventKind::kFree && act.count(e.id)) {
      live -= act[e.id];
      act.erase(e.id);
    }
  }
  return peak;
}
uint64_t ModelStates(const Bytes& b) {
  return At(b, Category::kParameters) + At(b, Category::kGradients) +
         At(b, Category::kOptimizerState);
}

std::vector<LoweredRank> Lower(const TrainingSetup& s) {
  auto r = LowerRankClasses(Tiny(), s, TestGpu());
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(*r) : std::vector<LoweredRank>{};
}

// Within the rounding of per-tensor ceil(numel / N) partitions and the
// 4-byte step counters of fused Adam.
void ExpectNear(uint64_t got, double want) {
  EXPECT_NEAR(static_cast<double>(got), want, 4096.0) << "got " << got << ", want " << want;
}

TEST(Parallel, OneGpuIsTheSingleGpuEstimate) {
  TrainingSetup plain = Base();
  TrainingSetup explicit_one = Base();
  explicit_one.parallel.gpus = 1;
  auto a = LowerRankClasses(Tiny(), plain, TestGpu());
  auto b = LowerRankClasses(Tiny(), explicit_one, TestGpu());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ(a->front().lowered.stream.events(), b->front().lowered.stream.events());
}

TEST(Parallel, ZeroStagesAtWorldSizeOneHoldSixteenBytesPerParameter) {
  // N = 1: every stage keeps the same 16 bytes per parameter after backward
  // (2 half params + 2 half grads + 12 fp32 master and moments).
  for (DataParallel z : {DataParallel::kZero1, DataParallel::kZero2, DataParallel::kZero3}) {
    TrainingSetup s = Base();
    s.parallel.dp_mode = z;
    auto ranks = Lower(s);
    ASSERT_EQ(ranks.size(), 1u);
    ExpectNear(ModelStates(LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kBackward)),
               16.0 * kParams);
  }
}

// The tiny model's parameters in model.parameters() order (DeepSpeed's flat
// buffer and ds_id order): embeddings, per layer q, k, v, o, gate, up, down
// and the two norms, the final norm, the untied lm_head.
std::vector<uint64_t> ParamOrder() {
  std::vector<uint64_t> numels = {kV * kH};
  for (uint64_t l = 0; l < kL; ++l) {
    for (uint64_t n : {kH * kH, kKv * kH, kKv * kH, kH * kH, kI * kH, kI * kH, kH * kI, kH, kH})
      numels.push_back(n);
  }
  numels.push_back(kH);
  numels.push_back(kV * kH);
  return numels;
}

TrainingSetup ZeroOn(DataParallel mode, uint32_t gpus) {
  TrainingSetup s = Base();
  s.parallel.gpus = gpus;
  s.parallel.dp_mode = mode;
  s.parallel.zero.hf_auto = true;  // reduce bucket h^2: small buffers
  return s;
}

TEST(Parallel, ZeroStages12HoldTheirPartitionRankByRank) {
  // stage_1_and_2.py (DeepSpeed 0.19.8), bf16 model on 4 ranks: the trainable
  // parameters are one flat bf16 buffer, padded to a multiple of 2N = 8
  // elements (kParams already is), cut into partitions of P = kParams / 4.
  // Each rank keeps the fp32 master of its partition (a clone, 4P), Adam's
  // moments (8P) and fused Adam's 4-byte step; after backward,
  // grads_in_partition: the full numel of every parameter overlapping its
  // partition (get_partition_info), in bf16. Worked out by hand:
  //   rank 0 [0, 820800): embed 256000 + layer 0's q..down 692224 = 948224
  //   rank 1: down0 176128 + norms 512 + layer 1 692736 + q2 65536 = 934912
  //   rank 2: layer 2 692736 + q3, k3, v3, o3 163840 = 856576
  //   rank 3: o3 65536 + gate3..down3 528384 + norms 768 + lm_head 256000 = 850688
  static_assert(kParams % 8 == 0);
  const uint64_t part = kParams / 4;
  const std::array<uint64_t, 4> gip = {948224, 934912, 856576, 850688};
  uint64_t offset = 0;
  std::array<uint64_t, 4> derived{};
  for (uint64_t n : ParamOrder()) {
    for (uint64_t r = 0; r < 4; ++r)
      derived[r] += offset < (r + 1) * part && offset + n > r * part ? n : 0;
    offset += n;
  }
  EXPECT_EQ(derived, gip);
  for (DataParallel mode : {DataParallel::kZero1, DataParallel::kZero2}) {
    auto ranks = Lower(ZeroOn(mode, 4));
    ASSERT_EQ(ranks.size(), 4u);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(ranks[r].rank_class, "dp rank " + std::to_string(r));
      EXPECT_EQ(ranks[r].ranks, std::vector<int>{r});
      const Bytes b = LiveAtEnd(ranks[r].lowered.stream, 2, Phase::kBackward);
      EXPECT_EQ(At(b, Category::kParameters), 2 * kParams) << r;
      EXPECT_EQ(At(b, Category::kGradients), 2 * gip[r]) << r;
      EXPECT_EQ(At(b, Category::kOptimizerState), 12 * part + 4) << r;
    }
  }
}

TEST(Parallel, ZeroStages12NormEachGradientInDouble) {
  // step() -> get_grad_norm_direct: every gradient slice of the partition is
  // `.to(get_norm_dtype())`, torch.double on CUDA and CPU, one at a time: the
  // largest slice's 8 bytes per element is the step's largest temporary
  // before the flatten (rank 0 and 3: an embedding matrix, 256000; rank 1
  // and 2: a gate/up/down matrix, 176128).
  // (The partition's cast to fp32, 4 x P, is the other _to_copy.)
  const std::array<uint64_t, 4> largest = {256000, 176128, 176128, 256000};
  auto ranks = Lower(ZeroOn(DataParallel::kZero2, 4));
  ASSERT_EQ(ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const EventStream& stream = ranks[r].lowered.stream;
    uint64_t biggest = 0;
    for (const Event& e : stream.events()) {
      if (e.kind == EventKind::kAlloc && stream.String(e.op) == "aten::_to_copy" &&
          e.category == Category::kTemporaries && e.size_bytes != 4 * (kParams / 4)) {
        biggest = std::max<uint64_t>(biggest, e.size_bytes);
      }
    }
    EXPECT_EQ(biggest, 8 * largest[r]) << r;
  }
}

TEST(Parallel, ZeroStages12LowerRanks0And1AndTheLastPast8) {
  // Past 8 data-parallel ranks, rank 1 stands for the ranks between the first
  // and the last (rank_classes.cc).
  auto ranks = Lower(ZeroOn(DataParallel::kZero2, 16));
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[0].ranks, std::vector<int>{0});
  EXPECT_EQ(ranks[1].ranks.size(), 14u);
  EXPECT_EQ(ranks[1].rank_class, "dp ranks 1-14");
  EXPECT_EQ(ranks[2].ranks, std::vector<int>{15});
}

TEST(Parallel, Zero3SetupHoldsPartitionsMasterAndBuffers) {
  // stage3.py (0.19.8), bf16 on 4 ranks: each parameter partitioned to
  // ceil(numel / 4) (every numel here divides), the trainable partitions
  // defragmented into one buffer (2 x kParams/4); the fp32 master a clone
  // (4 x kParams/4); grad_partitions_flat_buffer in the model's dtype (2 x
  // kParams/4); the ipg bucket of reduce_bucket_size (HF auto: h^2 = 65536
  // elements, bf16).
  auto ranks = Lower(ZeroOn(DataParallel::kZero3, 4));
  ASSERT_EQ(ranks.size(), 1u);
  const Bytes b = LiveAtSetupEnd(ranks[0].lowered.stream);
  const uint64_t part = kParams / 4;
  EXPECT_EQ(At(b, Category::kParameters), 2 * part);
  EXPECT_EQ(At(b, Category::kOptimizerState), 4 * part);
  EXPECT_EQ(At(b, Category::kGradients), 2 * part);
  EXPECT_EQ(At(b, Category::kCommunication), 2 * kH * kH);
}

// Bytes of parameters alive beyond the partitions, at the end of step 2's
// forward and at most during it.
std::pair<uint64_t, uint64_t> GatheredInForward(const EventStream& stream) {
  const uint64_t partitions = At(LiveAtSetupEnd(stream), Category::kParameters);
  uint64_t live = 0, most = 0;
  std::unordered_map<uint64_t, uint64_t> params;
  bool inside = false;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) {
      if (inside) break;
      inside = e.step == 2 && e.phase == Phase::kForward;
      continue;
    }
    if (e.kind == EventKind::kAlloc && e.category == Category::kParameters) {
      params[e.id] = e.size_bytes;
      live += e.size_bytes;
    } else if (e.kind == EventKind::kFree && params.count(e.id)) {
      live -= params[e.id];
      params.erase(e.id);
    }
    if (inside) most = std::max(most, live);
  }
  return {live - partitions, most - partitions};
}

TEST(Parallel, Zero3KeepsParametersForReuseAndReleasesWithout) {
  // partitioned_param_coordinator.py (0.19.8): from the second forward the
  // trace is complete, and a module's parameters are released after its
  // forward only if not used again within stage3_max_reuse_distance
  // elements of the trace. The default 1e9 exceeds the whole model (and the
  // 5e7 prefetch bucket gathers it all at the first module): every
  // parameter is still gathered when the forward ends, 2 x kParams bytes.
  TrainingSetup s = ZeroOn(DataParallel::kZero3, 4);
  s.parallel.zero.hf_auto = false;
  EXPECT_EQ(GatheredInForward(Lower(s)[0].lowered.stream).first, 2 * kParams);
  // No reuse window and no prefetch: each module gathers its own parameters
  // and releases them after its forward (containers have none): nothing is
  // gathered at the end, at most the largest single matrix during it (an
  // embedding matrix, kV x kH in bf16).
  s.parallel.zero.max_reuse_distance = 0;
  s.parallel.zero.prefetch_bucket_elems = 0;
  const auto [at_end, most] = GatheredInForward(Lower(s)[0].lowered.stream);
  EXPECT_EQ(at_end, 0u);
  EXPECT_EQ(most, 2 * kV * kH);
}

TEST(Parallel, FsdpKeepsFp32ShardsOnly) {
  // accelerate + FSDP, bf16 mixed precision: fp32 sharded params, fp32
  // sharded grads after reduce-scatter, Adam moments on the shards: 16Ψ/N
  // after backward; 12Ψ/N after zero_grad(set_to_none).
  for (int version : {1, 2}) {
    TrainingSetup s = Base();
    s.parallel.gpus = 8;
    s.parallel.dp_mode = DataParallel::kFsdp;
    s.parallel.fsdp_version = version;
    auto ranks = Lower(s);
    ASSERT_EQ(ranks.size(), 1u);
    ExpectNear(ModelStates(LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kBackward)),
               16.0 * kParams / 8);
    ExpectNear(ModelStates(LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kOptimizer)),
               12.0 * kParams / 8);
  }
}

TEST(Parallel, DdpCopiesGradientsIntoBuckets) {
  // fp32 params + fp32 grads + Adam 8 bytes, and the Reducer's buckets hold
  // another copy of every gradient; gradient_as_bucket_view removes it.
  TrainingSetup s = Base();
  s.parallel.gpus = 4;
  s.parallel.dp_mode = DataParallel::kDdp;
  auto ranks = Lower(s);
  const Bytes b = LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kBackward);
  ExpectNear(ModelStates(b), 16.0 * kParams);
  ExpectNear(At(b, Category::kCommunication), 4.0 * kParams);
  s.parallel.gradient_as_bucket_view = true;
  ranks = Lower(s);
  const Bytes v = LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kBackward);
  ExpectNear(ModelStates(v), 12.0 * kParams);
  ExpectNear(At(v, Category::kCommunication), 4.0 * kParams);
}

// Parameters one tensor-parallel rank holds: column-parallel q, k, v, gate,
// up and row-parallel o, down split by t; the vocabulary padded to a
// multiple of 128·t and split; norms replicated.
double TpLocalParams(uint64_t t) {
  const uint64_t vocab = (kV + 128 * t - 1) / (128 * t) * 128 * t / t;
  const uint64_t layer = (kH * kH + 2 * kH * kKv + kH * kH + 3 * kH * kI) / t + 2 * kH;
  return static_cast<double>(2 * vocab * kH + kL * layer + kH);
}

TEST(Parallel, MegatronBytesPerParameter) {
  // Megatron-LM docs (distributed optimizer table), bf16 params with fp32
  // main grads: 18 bytes per local parameter, 6 + 12/d with the distributed
  // optimizer.
  TrainingSetup s = Base();
  s.parallel.gpus = 4;
  s.parallel.tp = 2;
  auto ranks = Lower(s);
  ASSERT_EQ(ranks.size(), 1u);
  const double local = TpLocalParams(2);
  ExpectNear(ModelStates(LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kBackward)), 18.0 * local);
  s.parallel.dp_mode = DataParallel::kZero1;
  ranks = Lower(s);
  ExpectNear(ModelStates(LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kBackward)),
             (6.0 + 12.0 / 2) * local);
}

TEST(Parallel, PipelineStagesHoldTheirLayersAndMicroBatchesInFlight) {
  // 1F1B: stage s runs min(pp - s, m) forwards before its first backward, so
  // the first stage holds pp micro-batches of activations and the last one.
  TrainingSetup s = Base();
  s.parallel.gpus = 4;
  s.parallel.pp = 4;
  s.parallel.microbatches = 8;
  s.optimizer = OptimizerKind::kSgd;  // no optimizer state: activations dominate
  auto ranks = Lower(s);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[0].rank_class, "first stage");
  EXPECT_EQ(ranks[1].rank_class, "middle stages");
  EXPECT_EQ(ranks[2].rank_class, "last stage");
  EXPECT_EQ(ranks[1].ranks, (std::vector<int>{1, 2}));
  // One layer per stage; first stage: embedding + layer 0, last: layer 3 +
  // final norm + head.
  // SGD keeps no moments: bf16 params 2 + fp32 main grads 4 + fp32 main
  // params 4 = 10 bytes per parameter of the stage.
  ExpectNear(ModelStates(LiveAtEnd(ranks[0].lowered.stream, 1, Phase::kBackward)),
             10.0 * (kV * kH + kLayer));
  ExpectNear(ModelStates(LiveAtEnd(ranks[2].lowered.stream, 1, Phase::kBackward)),
             10.0 * (kV * kH + kLayer + kH));
  // Middle stage 1 of 4 runs pp - 1 - 1 = 2 warm-up forwards; its third
  // forward completes before the first backward, so its activation peak is
  // two finished micro-batches plus the peak of a third.
  s.parallel.microbatches = 1;
  auto single = Lower(s);
  const uint64_t one_done =
      At(LiveAtEnd(single[1].lowered.stream, 1, Phase::kForward), Category::kActivations);
  const uint64_t one_peak = ActivationPeak(single[1].lowered.stream);
  ASSERT_GT(one_done, 0u);
  EXPECT_EQ(ActivationPeak(ranks[1].lowered.stream), 2 * one_done + one_peak);
  // The last stage (no warm-up) never holds more than one micro-batch.
  EXPECT_EQ(ActivationPeak(ranks[2].lowered.stream), ActivationPeak(single[2].lowered.stream));
}

TEST(Parallel, TensorPlusSequenceParallelDividesEveryActivation) {
  // Korthikanti et al. 2022 (arXiv:2205.05198) §4.2.2: with tensor and
  // sequence parallelism every activation a layer saves is split t ways
  // (sbh/t (34 + 5as/h) for GPT), while tensor parallelism alone leaves the
  // LayerNorm / dropout / residual regions whole (sbh (10 + 24/t + ...)).
  // Pure bf16 (no autocast) so that one GPU and Megatron store the same
  // dtypes; flash attention (no s^2 term); activations saved at the end of
  // the first forward.
  auto saved = [](uint32_t tp, bool sp) {
    TrainingSetup s = Base();
    s.precision = Precision::kBf16;
    s.attn = Attention::kFlash;
    s.batch = 2;
    s.seq = 64;
    s.parallel.gpus = tp;
    s.parallel.tp = tp;
    s.parallel.sp = sp;
    auto ranks = Lower(s);
    return At(LiveAtEnd(ranks[0].lowered.stream, 1, Phase::kForward), Category::kActivations);
  };
  const double one = static_cast<double>(saved(1, false));
  for (uint32_t t : {2u, 4u}) {
    EXPECT_NEAR(static_cast<double>(saved(t, true)), one / t, one * 0.02) << "tp " << t;
    EXPECT_GT(saved(t, false), saved(t, true)) << "tp " << t;
  }
}

TEST(Parallel, InterleavedScheduleHoldsMoreChunksOnTheFirstStage) {
  // Korthikanti et al. 2022 §4.2.3 (Megatron's interleaved 1F1B): the first
  // stage's activation memory is that of L layers times (1 + (p-1)/(p*v)),
  // against L layers for plain 1F1B. Tiny model: 4 layers, p = 2, v = 2:
  // ratio 1 + 1/4. Counted in saved activations of whole micro-batch chunks.
  auto first_stage_peak = [](uint32_t v) {
    TrainingSetup s = Base();
    s.parallel.gpus = 2;
    s.parallel.pp = 2;
    s.parallel.virtual_stages = v;
    s.parallel.microbatches = 4;
    s.optimizer = OptimizerKind::kSgd;
    s.steps = 1;
    auto ranks = Lower(s);
    return static_cast<double>(ActivationPeak(ranks[0].lowered.stream));
  };
  EXPECT_NEAR(first_stage_peak(2) / first_stage_peak(1), 1.25, 0.05);
}

TEST(Parallel, ZeroInitAbsentMovesTheWholeModelFirst) {
  // DeepSpeed 0.19.8 installs its memory-saving linear
  // (LinearFunctionForZeroStage3) through Init(module=...) as well as under
  // zero.Init (partition_parameters.py Init.__init__): without zero.Init only
  // the setup differs. On a GPU, engine._configure_distributed_model first
  // moves the whole bf16 model to the device (2 x kParams), then partitions
  // it; on the CPU that move is a no-op.
  TrainingSetup s = ZeroOn(DataParallel::kZero3, 4);
  s.grad_ckpt = GradCkpt::kFull;
  auto with_init = Lower(s);
  s.parallel.zero.zero_init = false;
  auto without_init = Lower(s);
  uint64_t moved = 0;
  for (const Event& e : without_init[0].lowered.stream.events()) {
    if (e.kind == EventKind::kAlloc &&
        without_init[0].lowered.stream.String(e.op) == "deepspeed::module.to(device)")
      moved += e.size_bytes;
  }
  EXPECT_EQ(moved, 2 * kParams);
  for (uint32_t step : {1u, 2u}) {
    for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
      EXPECT_EQ(LiveAtEnd(with_init[0].lowered.stream, step, p),
                LiveAtEnd(without_init[0].lowered.stream, step, p));
    }
  }
  s.device_rules = DeviceRules::kCpu;
  const auto cpu = Lower(s);  // kept alive: a range-for over a temporary's member dangles
  for (const Event& e : cpu[0].lowered.stream.events()) {
    EXPECT_FALSE(e.kind == EventKind::kAlloc &&
                 e.size_bytes == 2 * kParams);  // CPU rules: no whole-model copy
  }
}

TEST(Parallel, ImpossibleLayoutsAreOneLineErrors) {
  struct Case {
    const char* what;
    void (*edit)(TrainingSetup&);
    const char* needle;
  };
  const Case cases[] = {
      {"tp does not divide heads",
       [](TrainingSetup& s) {
         s.parallel.gpus = 3;
         s.parallel.tp = 3;
       },
       "--tp: 3 does not divide"},
      {"more stages than layers",
       [](TrainingSetup& s) {
         s.parallel.gpus = 8;
         s.parallel.pp = 8;
       },
       "--pp: 8 pipeline stages for the 4 layers"},
      {"gpus not tp x pp x cp",
       [](TrainingSetup& s) {
         s.parallel.gpus = 6;
         s.parallel.tp = 4;
       },
       "not a multiple of tp x pp x cp"},
      {"offload without sharding",
       [](TrainingSetup& s) {
         s.parallel.gpus = 2;
         s.parallel.dp_mode = DataParallel::kDdp;
         s.parallel.offload = Offload::kOptimizer;
       },
       "--offload: needs --zero"},
      {"ZeRO-3 under tp",
       [](TrainingSetup& s) {
         s.parallel.gpus = 4;
         s.parallel.tp = 2;
         s.parallel.dp_mode = DataParallel::kZero3;
       },
       "Megatron"},
      {"ep without experts",
       [](TrainingSetup& s) {
         s.parallel.gpus = 2;
         s.parallel.ep = 2;
         s.parallel.dp_mode = DataParallel::kNone;
       },
       "--ep: tiny has no experts"},
  };
  for (const Case& c : cases) {
    TrainingSetup s = Base();
    c.edit(s);
    auto r = LowerRankClasses(Tiny(), s, TestGpu());
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.error().message.find(c.needle), std::string::npos)
        << c.what << ": " << r.error().message;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << c.what;
  }
}

}  // namespace
}  // namespace vramscope
