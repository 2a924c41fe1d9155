#include "sharding.h"

#include <algorithm>

#include "sharding_modes.h"

namespace vramscope::lower {
namespace {

// "model.layers.12.mlp" -> 12; -1 when the module is not in a decoder layer.
int LayerOfModule(std::string_view m) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (m.substr(0, kPrefix.size()) != kPrefix) return -1;
  int layer = 0;
  size_t i = kPrefix.size();
  if (i >= m.size() || m[i] < '0' || m[i] > '9') return -1;
  for (; i < m.size() && m[i] >= '0' && m[i] <= '9'; ++i) layer = layer * 10 + (m[i] - '0');
  return layer;
}

}  // namespace

TensorId ShardState::Alloc(uint64_t bytes, Category c, std::string_view op) {
  return tape->graph.Alloc(bytes, c, op, tape->module());
}

TensorId ShardState::HostAlloc(uint64_t bytes, Category c, std::string_view op) {
  if (tape->cpu_rules) return Alloc(bytes, c, op);
  host_bytes += bytes;
  return kNoTensor;
}

uint64_t ShardState::TrainableElements() const {
  uint64_t trainable = 0;
  for (const Param& p : tape->params) trainable += p.trainable ? p.numel : 0;
  return trainable;
}

std::unique_ptr<ShardingStrategy> ShardingStrategy::Make(Tape* tape, const TrainingSetup& setup,
                                                         uint32_t world, bool megatron,
                                                         uint64_t hidden_size, int num_layers,
                                                         uint32_t dp_rank, uint64_t micro_batches) {
  ShardState s;
  s.tape = tape;
  s.mode = setup.parallel.dp_mode;
  s.layout = setup.parallel;
  s.world = std::max<uint32_t>(1, world);
  s.dp_rank = std::min(dp_rank, s.world - 1);
  s.micro_batches = std::max<uint64_t>(1, micro_batches);
  s.hidden = hidden_size;
  s.num_layers = num_layers;
  s.mixed = setup.precision == Precision::kBf16Mixed || setup.precision == Precision::kFp16Mixed;
  s.checkpointed_layers = setup.grad_ckpt != GradCkpt::kNone;
  s.peft = setup.finetune != Finetune::kFull;
  s.qlora = setup.finetune == Finetune::kQLora;
  if (megatron) return MakeMegatronStrategy(std::move(s));
  switch (s.mode) {
    case DataParallel::kZero1:
    case DataParallel::kZero2: return MakeZeroStrategy(std::move(s));
    case DataParallel::kZero3: return MakeZero3Strategy(std::move(s));
    case DataParallel::kFsdp: return MakeFsdpStrategy(std::move(s));
    default: return MakeReplicatedStrategy(std::move(s));
  }
}

void ShardingStrategy::Setup() {
  s_.tape->SetModule(SetupModule());
  SetupBuffers();
  InstallHooks();
}

void ShardingStrategy::InstallHooks() {
  s_.tape->graph.post_accumulate_hook = [this](TensorId* slot) { OnGradAccumulated(slot); };
}

void ShardingStrategy::Step(const TrainingSetup& setup, OptimizerExtras* extras) {
  s_.tape->SetModule("optimizer");
  StepShards(setup, extras);
}

void ShardingStrategy::ZeroGrad() { lower::ZeroGrad(*s_.tape); }

void GatheringStrategy::AssignUnits() {
  units_.assign(s_.num_layers + 2, Unit{});
  std::vector<uint64_t> largest(units_.size(), 0);
  for (Param& p : s_.tape->params) {
    if (p.unit < 0) continue;
    const int u = MapUnit(p.unit);
    units_[u].params.push_back(&p);
    const uint64_t bytes = GatheredBytes(p);
    units_[u].gather_bytes += bytes;
    largest[u] = std::max(largest[u], bytes);
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].gather_bytes = std::min(units_[u].gather_bytes, GatherLimit(largest[u]));
  }
}

void GatheringStrategy::InstallHooks() {
  s_.tape->unit_hook = [this](int unit, bool begin) { OnForwardUnit(unit, begin); };
  s_.tape->graph.pre_node_hook = [this](uint32_t module) { OnBackwardNode(module); };
  ShardingStrategy::InstallHooks();
}

void PendingFrees::CompleteOldest(Graph& g) {
  if (groups_.empty()) return;
  for (uint64_t id : groups_.front()) g.UsesDone(id);
  groups_.pop_front();
  if (groups_.empty()) closed_ = true;
}

void GatheringStrategy::AllocGathered(Unit& unit, std::string_view op) {
  unit.gathered = s_.tape->graph.Alloc(unit.gather_bytes, Category::kParameters, op,
                                       s_.tape->module(), GatheredStream());
}

void GatheringStrategy::Release(int unit) {
  if (unit < 0) return;
  Unit& u = units_[unit];
  if (u.gathered == kNoTensor) return;
  if (ReleaseRecordsDefaultStream()) {
    released_.Add(s_.tape->graph.DropUsedOn(u.gathered, kDefaultStream));
  } else {
    s_.tape->graph.Drop(u.gathered);
  }
  u.gathered = kNoTensor;
  AfterRelease(unit);
  released_.EndGroup();
}

void GatheringStrategy::WaitForOldestRelease() {
  if (released_.groups() >= 2) released_.CompleteOldest(s_.tape->graph);
}

int GatheringStrategy::UnitOfModule(uint32_t module) {
  if (module >= unit_of_module_.size()) unit_of_module_.resize(module + 1, -2);
  int& u = unit_of_module_[module];
  if (u != -2) return u;
  const std::string_view m = s_.tape->out()->String(module);
  const int layer = LayerOfModule(m);
  if (layer >= 0) {
    u = layer + 1;
  } else if (m == "model" || m == "model.embed_tokens" || m == "model.rotary_emb" ||
             m == "pipeline" || m.substr(0, 18) == "model.embed_tokens") {
    u = 0;
  } else {
    u = s_.num_layers + 1;  // final norm, lm_head, loss
  }
  u = MapUnit(u);
  return u;
}

void GatheringStrategy::OnBackwardNode(uint32_t module) {
  const uint32_t saved_module = s_.tape->module();
  if (!in_backward_) {
    in_backward_ = true;
    OnBackwardStart();
    s_.tape->graph.SetModule(saved_module);
  }
  // The loss's nodes (the model's own ops after the head) belong to no unit:
  // the libraries' pre-backward hooks sit on each unit's forward outputs
  // (FSDP1 _register_pre_backward_hooks, FSDP2 _register_pre_backward_hook,
  // DeepSpeed ZeRO-3 _register_hooks_recursively), so the head's unit begins
  // when the logits' gradient is made.
  if (backward_unit_ < 0 && s_.tape->out()->String(module) == "model") return;
  const int unit = UnitOfModule(module);
  if (unit == backward_unit_) return;
  const bool root = backward_unit_ >= 0 && ReducedAtEnd(backward_unit_);
  if (backward_unit_ >= 0 && !root) {
    ReduceUnit(backward_unit_);
    Release(backward_unit_);
  }
  backward_unit_ = unit;
  Gather(unit);
  AfterBackwardGather(unit);
  s_.tape->graph.SetModule(saved_module);
}

void GatheringStrategy::EndBackward() {
  const uint32_t saved_module = s_.tape->module();
  if (backward_unit_ >= 0) ReduceUnit(backward_unit_);
  BeforeReleaseAll();
  for (size_t u = 0; u < units_.size(); ++u) Release(static_cast<int>(u));
  AfterReleaseAll();
  // The reduce stream is waited for at the end of backward (DeepSpeed
  // independent_gradient_partition_epilogue synchronizes it; for FSDP the
  // final callback's wait_stream is assumed to have completed by the next
  // allocation: docs/parallel.md).
  reduced_grads_.CompleteAll(s_.tape->graph);
  backward_unit_ = -1;
  in_backward_ = false;
  s_.tape->graph.SetModule(saved_module);
}

}  // namespace vramscope::lower
