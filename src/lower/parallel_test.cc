// Multi-GPU lowering: the sharding arithmetic of each mode checked against
// formulas written out here from the papers and library semantics (ZeRO paper
// Table 1 / Fig. 1 with K = 12, FSDP's sharded fp32 states, DDP's bucket
// copy, Megatron's 18 and 6 + 12/d bytes per parameter), not by calling the
// code under test; plus the 1F1B in-flight rule and the layout errors.
#include <array>
#include <cstdint>

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

TEST(Parallel, ZeroStagesMatchThePaper) {
  // Rajbhandari et al. 2019, §5.1 (K = 12 for mixed-precision Adam):
  // P_os = 4Ψ + KΨ/N, P_os+g = 2Ψ + (2+K)Ψ/N, P_os+g+p = (4+K)Ψ/N.
  const double psi = kParams, n = 4, k = 12;
  const std::pair<DataParallel, double> cases[] = {
      {DataParallel::kZero1, 4 * psi + k * psi / n},
      {DataParallel::kZero2, 2 * psi + (2 + k) * psi / n},
      {DataParallel::kZero3, (4 + k) * psi / n}};
  for (const auto& [mode, want] : cases) {
    TrainingSetup s = Base();
    s.parallel.gpus = 4;
    s.parallel.dp_mode = mode;
    auto ranks = Lower(s);
    ASSERT_EQ(ranks.size(), 1u);
    ExpectNear(ModelStates(LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kBackward)), want);
  }
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

TEST(Parallel, ZeroInitAbsentPinsGatheredLinearWeights) {
  // Without deepspeed.zero.Init every gathered Linear weight (all but the
  // embedding) stays alive from its forward to its backward.
  TrainingSetup s = Base();
  s.parallel.gpus = 4;
  s.parallel.dp_mode = DataParallel::kZero3;
  s.parallel.zero.zero_init = false;
  s.parallel.zero.max_reuse_distance = 0;  // nothing kept for reuse
  auto ranks = Lower(s);
  const Bytes with = LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kForward);
  s.parallel.zero.zero_init = true;
  ranks = Lower(s);
  const Bytes without = LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kForward);
  // With zero.Init and no reuse window nothing stays gathered; without it,
  // every layer and the head (all but the embedding) does.
  ExpectNear(At(with, Category::kParameters) - At(without, Category::kParameters),
             2.0 * (kL * kLayer + kV * kH + kH));
}

TEST(Parallel, ZeroInitAbsentReleasesCheckpointedLayersAfterForward) {
  // Under activation checkpointing a decoder layer's forward saves nothing, so
  // without zero.Init only the head's gathered weights (not checkpointed)
  // stay pinned to the turn from forward to backward: the layers' go at
  // release, as with zero.Init (sharding_zero.cc SavesGatheredWeights).
  TrainingSetup s = Base();
  s.parallel.gpus = 4;
  s.parallel.dp_mode = DataParallel::kZero3;
  s.parallel.zero.max_reuse_distance = 0;
  s.grad_ckpt = GradCkpt::kFull;
  s.parallel.zero.zero_init = false;
  auto ranks = Lower(s);
  const Bytes without_init = LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kForward);
  s.parallel.zero.zero_init = true;
  ranks = Lower(s);
  const Bytes with_init = LiveAtEnd(ranks[0].lowered.stream, 2, Phase::kForward);
  ExpectNear(At(without_init, Category::kParameters) - At(with_init, Category::kParameters),
             2.0 * (kV * kH + kH));
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
