// DDP's buckets and FSDP's units as the HF Trainer / accelerate 1.15 build them
// (docs/parallel.md), checked with sizes written out by hand from the tiny
// model's shapes, not by calling the code under test. The real-rank checks of
// the same rules are the multi-rank fidelity points (docs/fidelity.md).
#include <cstdint>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "test_models.h"

#include "vramscope/lower.h"

// A named namespace: the unity build joins this file with parallel_test.cc.
namespace vramscope::parallel_fsdp_test {

using lower_testing::TestGpu;
using lower_testing::Tiny;

// The tiny model by hand: h=256, i=688, 2 kv heads of 32, vocab 1000, 4 layers,
// untied head.
constexpr uint64_t kH = 256, kI = 688, kKv = 2 * 32, kV = 1000, kL = 4;
constexpr uint64_t kLayer = kH * kH + 2 * kH * kKv + kH * kH + 3 * kH * kI + 2 * kH;
constexpr uint64_t kParams = 2 * kV * kH + kL * kLayer + kH;
// LoRA r=8 on q and v of one layer: A [8, h] twice, B [h, 8] and [kKv, 8].
constexpr uint64_t kLoraLayer = 2 * 8 * kH + kH * 8 + kKv * 8;

// One allocation of the stream: its size and where it was made and freed.
struct Life {
  uint64_t bytes = 0;
  uint32_t born_step = 0;
  Phase born = Phase::kSetup;
  std::optional<std::pair<uint32_t, Phase>> freed;
};

std::vector<Life> LivesOf(const EventStream& s, std::string_view op) {
  std::vector<Life> out;
  std::unordered_map<uint64_t, size_t> index;
  uint32_t step = 0;
  Phase phase = Phase::kSetup;
  for (const Event& e : s.events()) {
    if (e.kind == EventKind::kPhase) {
      step = e.step;
      phase = e.phase;
    } else if (e.kind == EventKind::kAlloc && s.String(e.op) == op) {
      index[e.id] = out.size();
      out.push_back({e.size_bytes, step, phase, std::nullopt});
    } else if (e.kind == EventKind::kFree && index.count(e.id)) {
      out[index[e.id]].freed = std::make_pair(step, phase);
      index.erase(e.id);
    }
  }
  return out;
}

TrainingSetup Fp32(DataParallel mode, int fsdp_version = 2) {
  TrainingSetup s;
  s.batch = 1;
  s.seq = 32;
  s.steps = 2;
  s.precision = Precision::kFp32;
  s.optimizer = OptimizerKind::kAdamWFused;
  s.parallel.gpus = 2;
  s.parallel.dp_mode = mode;
  s.parallel.fsdp_version = fsdp_version;
  return s;
}

EventStream Stream(const TrainingSetup& s) {
  auto r = LowerRankClasses(Tiny(), s, TestGpu());
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r->front().lowered.stream) : EventStream{};
}

// torch 2.13 DistributedDataParallel: one bucket of every fp32 gradient at
// construction, then at the second forward buckets of at least bucket_cap_mb
// (the first of at least 1 MiB with the default cap) holding the same bytes.
TEST(ParallelFsdp, DdpBucketsAreOneAtConstructionThenRebuiltByCap) {
  TrainingSetup s = Fp32(DataParallel::kDdp);
  for (uint64_t cap_mb : {uint64_t{25}, uint64_t{1}}) {
    s.parallel.ddp_bucket_cap_mb = cap_mb;
    const std::vector<Life> buckets = LivesOf(Stream(s), "ddp::bucket");
    ASSERT_GE(buckets.size(), 2u);
    EXPECT_EQ(buckets[0].bytes, 4 * kParams);
    EXPECT_EQ(buckets[0].born, Phase::kSetup);
    ASSERT_TRUE(buckets[0].freed);
    EXPECT_EQ(*buckets[0].freed, std::make_pair(uint32_t{2}, Phase::kForward));
    uint64_t rebuilt = 0;
    for (size_t i = 1; i < buckets.size(); ++i) {
      EXPECT_EQ(buckets[i].born_step, 2u);
      EXPECT_EQ(buckets[i].born, Phase::kForward);
      const uint64_t limit = i == 1 && cap_mb == 25 ? uint64_t{1} << 20 : cap_mb << 20;
      if (i + 1 < buckets.size()) EXPECT_GE(buckets[i].bytes, limit) << i;
      rebuilt += buckets[i].bytes;
    }
    EXPECT_EQ(rebuilt, 4 * kParams);
    // The broadcast of the module states: one flat copy (under 250 MiB), freed.
    const std::vector<Life> flat = LivesOf(Stream(s), "ddp::broadcast_coalesced");
    ASSERT_EQ(flat.size(), 1u);
    EXPECT_EQ(flat[0].bytes, 4 * kParams);
    EXPECT_EQ(*flat[0].freed, std::make_pair(uint32_t{0}, Phase::kSetup));
  }
}

// accelerate's FSDP2 with untied embeddings: the input embedding is a unit of
// its own, resharded after its forward; [final norm, lm_head] is one group
// kept gathered from its forward into the backward.
TEST(ParallelFsdp, Fsdp2UntiedEmbeddingIsAUnitOfItsOwn) {
  const std::vector<Life> gathers = LivesOf(Stream(Fp32(DataParallel::kFsdp)), "fsdp::all_gather");
  const uint64_t embed = kV * kH * 4, tail = (kH + kV * kH) * 4, layer = kLayer * 4;
  int embeds = 0, tails = 0, layers = 0;
  for (const Life& g : gathers) {
    if (g.born_step != 1) continue;
    if (g.bytes == embed && g.born == Phase::kForward) {
      ++embeds;
      EXPECT_EQ(*g.freed, std::make_pair(uint32_t{1}, Phase::kForward));
    } else if (g.bytes == tail) {
      ++tails;
      EXPECT_EQ(g.born, Phase::kForward);
      EXPECT_EQ(*g.freed, std::make_pair(uint32_t{1}, Phase::kBackward));
    } else if (g.bytes == layer) {
      ++layers;
    }
  }
  EXPECT_EQ(embeds, 1);
  EXPECT_EQ(tails, 1);
  EXPECT_EQ(layers, 2 * static_cast<int>(kL));  // forward and backward
}

TrainingSetup Lora(int fsdp_version) {
  TrainingSetup s = Fp32(DataParallel::kFsdp, fsdp_version);
  s.finetune = Finetune::kLora;
  s.lora_rank = 8;
  s.lora_targets = {"q", "v"};
  return s;
}

// A PEFT model under FSDP2 through the HF Trainer: accelerate does not
// recognise PEFT's wrap policy, so all four layers and their adapters are one
// root group, gathered once in the forward and kept to the end of backward.
// --fsdp-wrap layers gathers each layer (and its adapters) around its use.
TEST(ParallelFsdp, Fsdp2PeftThroughTheTrainerKeepsEveryLayerInTheRoot) {
  const uint64_t root = kL * (kLayer + kLoraLayer) * 4;
  const std::vector<Life> gathers = LivesOf(Stream(Lora(2)), "fsdp::all_gather");
  int roots = 0;
  for (const Life& g : gathers) {
    if (g.born_step != 1 || g.bytes != root) continue;
    ++roots;
    EXPECT_EQ(g.born, Phase::kForward);
    EXPECT_EQ(*g.freed, std::make_pair(uint32_t{1}, Phase::kBackward));
  }
  EXPECT_EQ(roots, 1);
  TrainingSetup layers = Lora(2);
  layers.parallel.fsdp_wrap = FsdpWrap::kLayers;
  int per_layer = 0;
  for (const Life& g : LivesOf(Stream(layers), "fsdp::all_gather")) {
    EXPECT_NE(g.bytes, root);
    per_layer += g.born_step == 1 && g.bytes == (kLayer + kLoraLayer) * 4;
  }
  EXPECT_EQ(per_layer, 2 * static_cast<int>(kL));
}

// FSDP1 under PEFT's wrap policy: each adapter weight is a unit of its own, so
// a layer's gather is its frozen base alone.
TEST(ParallelFsdp, Fsdp1PeftLayerUnitsHoldTheFrozenBaseOnly) {
  int layers = 0;
  for (const Life& g : LivesOf(Stream(Lora(1)), "fsdp::all_gather")) {
    EXPECT_NE(g.bytes, (kLayer + kLoraLayer) * 4);
    layers += g.born_step == 1 && g.bytes == kLayer * 4;
  }
  EXPECT_EQ(layers, 2 * static_cast<int>(kL));
}

// Under bf16-mixed the frozen base is sharded in the model's fp32 (accelerate
// casts nothing frozen; MixedPrecision casts what it gathers, to half).
TEST(ParallelFsdp, MixedPrecisionShardsTheFrozenBaseInFp32AndGathersHalf) {
  for (int version : {1, 2}) {
    TrainingSetup s = Lora(version);
    s.precision = Precision::kBf16Mixed;
    const EventStream stream = Stream(s);
    uint64_t setup_params = 0;
    for (const Event& e : stream.events()) {
      if (e.kind == EventKind::kPhase) break;
      if (e.kind == EventKind::kAlloc && e.category == Category::kParameters)
        setup_params += e.size_bytes;
    }
    // Every tensor's shard is ceil(numel / 2) fp32 elements; all numels are even.
    EXPECT_EQ(setup_params, (kParams + kL * kLoraLayer) * 4 / 2) << version;
    // FSDP1: each layer's frozen base; FSDP2 under the Trainer: the root's four
    // layers and their adapters, in half.
    const uint64_t half = version == 1 ? kLayer * 2 : kL * (kLayer + kLoraLayer) * 2;
    int gathers = 0;
    for (const Life& g : LivesOf(stream, "fsdp::all_gather"))
      gathers += g.born_step == 1 && g.bytes == half;
    EXPECT_EQ(gathers, version == 1 ? 2 * static_cast<int>(kL) : 1) << version;
  }
}

}  // namespace vramscope::parallel_fsdp_test
