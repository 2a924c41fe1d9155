// --from FILE: DeepSpeed config JSON, HF TrainingArguments JSON, accelerate's
// config and Axolotl's training config to flags, and which format a file is
// (TRL, torchtune and LitGPT are read in from_trl.cc, from_torchtune.cc,
// from_litgpt.cc).
// Each mapping cites the library code it follows; docs/configs.md has the
// table. No file is opened here but through the injected reader.
#include "from_config.h"
#include "from_config_internal.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "output.h"
#include "vramscope/common/checked.h"
#include "vramscope/common/json_depth.h"
#include "vramscope/common/quote.h"
#include "yaml_json.h"

namespace vramscope::cli {
// A named namespace, not an anonymous one: the CLI is a unity build, and these
// short names must not meet another file's helpers.
namespace fromcfg {

namespace {

// Containers nested deeper than this are shown as [...] / {...}: a message is
// built without unbounded recursion whatever value it quotes.
constexpr int kShownDepth = 8;
// Bytes of rendering past which Shown stops (QuoteForMessage cuts at 40).
constexpr size_t kShownBytes = 2 * common::kQuotedBytes;

// Compact JSON of `v` into *out, stopping once it is longer than kShownBytes.
// Non-finite numbers (YAML's .inf and .nan) are written as YAML writes them:
// nlohmann's dump would print `null`, which is not what the file says.
void AppendShown(const Json& v, int depth, std::string* out) {
  if (out->size() > kShownBytes) return;
  if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    const double d = v.get<double>();
    *out += std::isnan(d) ? ".nan" : d < 0 ? "-.inf" : ".inf";
    return;
  }
  if (!v.is_structured()) {
    *out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
    return;
  }
  if (depth >= kShownDepth) {
    *out += v.is_array() ? "[...]" : "{...}";
    return;
  }
  *out += v.is_array() ? '[' : '{';
  for (auto it = v.begin(); it != v.end() && out->size() <= kShownBytes; ++it) {
    if (it != v.begin()) *out += ',';
    if (v.is_object()) {
      *out += Json(it.key()).dump(-1, ' ', false, Json::error_handler_t::replace) + ":";
    }
    AppendShown(*it, depth + 1, out);
  }
  *out += v.is_array() ? ']' : '}';
}

}  // namespace

std::string Shown(const Json& v) {
  std::string text;
  AppendShown(v, 0, &text);
  return common::QuoteForMessage(text, common::kQuotedBytes, '\'');
}

// An object member that must be an object when present (null: absent).
Result<const Json*> Object(const Reader& r, const Json& parent, const char* key,
                           const std::string& path) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return static_cast<const Json*>(nullptr);
  if (!it->is_object()) return r.Bad(path, fmt::format("{} is not an object", Shown(*it)));
  return &*it;
}

// A whole number in lo..hi, or "auto" (nullopt), or absent (nullopt).
// DeepSpeed's pydantic config takes 1e9 as an int (runtime/zero/config.py
// declares the sizes `int`, coercing whole floats), so 5e8 is read as 500000000.
Result<std::optional<int64_t>> Number(const Reader& r, const Json& parent, const char* key,
                                      const std::string& path, int64_t lo, int64_t hi) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return std::optional<int64_t>{};
  if (it->is_string() && it->get<std::string>() == "auto") return std::optional<int64_t>{};
  const bool whole =
      it->is_number_integer() ||
      (it->is_number_float() && std::isfinite(it->get<double>()) &&
       std::floor(it->get<double>()) == it->get<double>() && std::fabs(it->get<double>()) < 9e15);
  if (!whole) return r.Bad(path, fmt::format("{} is not a whole number or \"auto\"", Shown(*it)));
  const int64_t v = it->is_number_float() ? static_cast<int64_t>(it->get<double>())
                    : it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)
                        ? INT64_MAX
                        : it->get<int64_t>();
  if (v < lo || v > hi) return r.Bad(path, fmt::format("{} is outside {}..{}", v, lo, hi));
  return std::optional<int64_t>{v};
}

// A boolean, or "auto" / absent (nullopt).
Result<std::optional<bool>> Bool(const Reader& r, const Json& parent, const char* key,
                                 const std::string& path) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return std::optional<bool>{};
  if (it->is_string() && it->get<std::string>() == "auto") return std::optional<bool>{};
  if (!it->is_boolean()) return r.Bad(path, fmt::format("{} is not true or false", Shown(*it)));
  return std::optional<bool>{it->get<bool>()};
}

Result<std::optional<double>> Fraction(const Reader& r, const Json& parent, const char* key,
                                       const std::string& path) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return std::optional<double>{};
  if (!it->is_number() || !(it->get<double>() >= 0 && it->get<double>() < 1)) {
    return r.Bad(path, fmt::format("{} is not a number in [0, 1)", Shown(*it)));
  }
  return std::optional<double>{it->get<double>()};
}

// A string member, or "" when absent / null.
Result<std::string> String(const Reader& r, const Json& parent, const char* key,
                           const std::string& path) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return std::string();
  if (!it->is_string()) return r.Bad(path, fmt::format("{} is not a string", Shown(*it)));
  return it->get<std::string>();
}

// The ZeRO offload blocks (runtime/zero/offload_config.py, 0.14-0.16: device
// none|cpu|nvme). offload_param is read by stage 3 only (stage_1_and_2.py
// never looks at it), and vramscope's --offload params includes the optimizer.
Status ReadZeroOffload(const Reader& r, const Json& zero, int64_t stage) {
  bool optimizer = false, params = false;
  for (const char* key : {"offload_optimizer", "offload_param"}) {
    const std::string path = fmt::format("zero_optimization.{}", key);
    VS_TRY(block, Object(r, zero, key, path));
    if (!block) continue;
    VS_TRY(device, String(r, *block, "device", path + ".device"));
    if (device.empty() || device == "none") continue;
    if (device != "cpu" && device != "nvme") {
      return r.Bad(path + ".device",
                   fmt::format("{} is not one of none, cpu, nvme", Shown(Json(device))));
    }
    if (device == "nvme") {
      r.NotModelled(path + ".device",
                    "nvme: modelled as cpu; the GPU side is alike, host and NVMe buffers are not");
    }
    (key == std::string_view("offload_param") ? params : optimizer) = true;
  }
  if (params && stage != 3) {
    r.NotModelled("zero_optimization.offload_param", "ignored by DeepSpeed below stage 3");
    params = false;
  }
  if (params && !optimizer) {
    r.NotModelled("zero_optimization.offload_param",
                  "without offload_optimizer: modelled as --offload params, which offloads both");
  }
  if (params) {
    r.Set("--offload", "params", "zero_optimization.offload_param.device");
  } else if (optimizer) {
    r.Set("--offload", "optimizer", "zero_optimization.offload_optimizer.device");
  }
  return Ok{};
}

// The ZeRO sizes (runtime/zero/config.py, 0.14-0.16). "auto" is filled by HF
// (transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig
// trainer_config_finalize: reduce_bucket_size = hidden^2, prefetch = 0.9
// hidden^2, persistence threshold = 10 hidden): --zero-buckets hf-auto. A
// key left out keeps DeepSpeed's default, so those are then set explicitly.
Status ReadZeroSizes(const Reader& r, const Json& zero) {
  struct Size {
    const char* key;
    const char* flag;
    int64_t deepspeed_default;  // elements; 0: not an "auto" key
  };
  static constexpr Size kSizes[] = {
      {"reduce_bucket_size", "--zero-reduce-bucket-size", 500'000'000},
      {"stage3_prefetch_bucket_size", "--zero-prefetch-bucket-size", 50'000'000},
      {"stage3_param_persistence_threshold", "--zero-persistence-threshold", 100'000},
      {"sub_group_size", "--zero-sub-group-size", 0},
      {"stage3_max_live_parameters", "--zero-max-live-parameters", 0},
      {"stage3_max_reuse_distance", "--zero-max-reuse-distance", 0}};
  bool any_auto = false;
  for (const Size& s : kSizes) {
    auto it = zero.find(s.key);
    any_auto = any_auto || (s.deepspeed_default > 0 && it != zero.end() && *it == "auto");
  }
  if (any_auto) r.Set("--zero-buckets", "hf-auto", "zero_optimization (\"auto\" sizes)");
  for (const Size& s : kSizes) {
    const std::string path = fmt::format("zero_optimization.{}", s.key);
    const int64_t lo = s.key == std::string_view("sub_group_size") ? 1 : 0;
    VS_TRY(v, Number(r, zero, s.key, path, lo, int64_t{1} << 40));
    if (v) {
      r.SetCount(s.flag, *v, path);
    } else if (any_auto && s.deepspeed_default > 0 && !zero.contains(s.key)) {
      r.SetCount(s.flag, s.deepspeed_default, path + " (absent: DeepSpeed default)");
    }
  }
  return Ok{};
}

// zero_optimization (runtime/zero/config.py, 0.14-0.16): stage 0..3 (0: no
// ZeRO, nothing to set), offload, sizes; the switches vramscope does not model.
Status ReadZero(const Reader& r, const Json& root) {
  VS_TRY(zero, Object(r, root, "zero_optimization", "zero_optimization"));
  if (!zero) return Ok{};
  VS_TRY(stage, Number(r, *zero, "stage", "zero_optimization.stage", 0, 3));
  const int64_t s = stage.value_or(0);  // DeepSpeed's default stage is 0
  if (s > 0) r.SetCount("--zero", s, "zero_optimization.stage");
  if (Status st = ReadZeroOffload(r, *zero, s); !st.ok()) return st;
  if (Status st = ReadZeroSizes(r, *zero); !st.ok()) return st;
  // overlap_comm: DeepSpeed defaults it on for stage 3 and off below
  // (config.py overlap_comm_valid); stages 1-2 keep two ipg buckets with it.
  VS_TRY(overlap, Bool(r, *zero, "overlap_comm", "zero_optimization.overlap_comm"));
  if (overlap)
    r.Set("--zero-overlap-comm", *overlap ? "on" : "off", "zero_optimization.overlap_comm");
  VS_TRY(contiguous,
         Bool(r, *zero, "contiguous_gradients", "zero_optimization.contiguous_gradients"));
  if (contiguous && !*contiguous) {
    r.NotModelled("zero_optimization.contiguous_gradients", "false: modelled as true");
  }
  for (const char* key : {"zero_quantized_weights", "zero_quantized_gradients",
                          "zero_hpz_partition_size", "mics_shard_size"}) {
    auto it = zero->find(key);
    if (it != zero->end() && !it->is_null() && *it != false && *it != 0 && *it != 1 && *it != -1)
      r.NotModelled(fmt::format("zero_optimization.{}", key), "ZeRO++ / MiCS");
  }
  return Ok{};
}

// fp16 / bf16 blocks (runtime/config.py get_fp16_enabled / get_bfloat16_enabled,
// 0.14-0.16; "bfloat16" is the older name of "bf16"). DeepSpeed casts the
// module to half and keeps fp32 master weights: vramscope's *-mixed under
// --zero (docs/parallel.md). "auto" is left to TrainingArguments / --precision.
Status ReadDeepSpeedPrecision(const Reader& r, const Json& root) {
  std::optional<bool> fp16, bf16;
  for (const char* key : {"fp16", "bf16", "bfloat16"}) {
    VS_TRY(block, Object(r, root, key, key));
    if (!block) continue;
    VS_TRY(enabled, Bool(r, *block, "enabled", fmt::format("{}.enabled", key)));
    if (enabled && *enabled) (key == std::string_view("fp16") ? fp16 : bf16) = true;
  }
  if (fp16 && bf16) {
    return r.Bad("fp16.enabled", "and bf16.enabled are both true (DeepSpeed refuses both)");
  }
  if (fp16) r.Set("--precision", "fp16-mixed", "fp16.enabled");
  if (bf16) r.Set("--precision", "bf16-mixed", "bf16.enabled");
  return Ok{};
}

// Batch keys (runtime/config.py _batch_assertion, 0.14-0.16): train_batch_size
// = micro x accumulation x data-parallel world size, so with all three given
// the world size is --gpus. "auto" is left to TrainingArguments or flags.
Status ReadDeepSpeedBatch(const Reader& r, const Json& root) {
  constexpr int64_t kMaxBatch = int64_t{1} << 32;
  VS_TRY(micro, Number(r, root, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu",
                       1, kMaxBatch));
  VS_TRY(accum, Number(r, root, "gradient_accumulation_steps", "gradient_accumulation_steps", 1,
                       kMaxBatch));
  VS_TRY(total, Number(r, root, "train_batch_size", "train_batch_size", 1, int64_t{1} << 50));
  if (micro) r.SetCount("--batch", *micro, "train_micro_batch_size_per_gpu");
  if (accum) r.SetCount("--grad-accum", *accum, "gradient_accumulation_steps");
  if (micro && accum && total) {
    // Each factor is within 2^32, so the product may not fit: checked, never
    // wrapped (a wrap to 0 was then a divisor: SIGFPE).
    const auto product =
        common::CheckedMul(static_cast<uint64_t>(*micro), static_cast<uint64_t>(*accum));
    if (!product || *product > static_cast<uint64_t>(*total)) {
      return r.Bad("train_batch_size",
                   fmt::format("{} is less than micro-batch x accumulation ({} x {})", *total,
                               *micro, *accum));
    }
    const auto per_gpu = static_cast<int64_t>(*product);
    if (*total % per_gpu != 0) {
      return r.Bad(
          "train_batch_size",
          fmt::format("{} is not a multiple of micro-batch x accumulation ({})", *total, per_gpu));
    }
    r.SetCount("--gpus", *total / per_gpu, "train_batch_size");
  }
  return Ok{};
}

// The optimizer block (runtime/config.py get_optimizer_name lower-cases a
// DEEPSPEED_OPTIMIZERS name; engine._configure_basic_optimizer builds
// FusedAdam for "adam"/"adamw" on the GPU, DeepSpeedCPUAdam when offloaded,
// FusedLion for "lion"). Without the block HF Trainer builds its own (optim).
Status ReadDeepSpeedOptimizer(const Reader& r, const Json& root) {
  VS_TRY(block, Object(r, root, "optimizer", "optimizer"));
  if (!block) return Ok{};
  VS_TRY(type, String(r, *block, "type", "optimizer.type"));
  std::string lower;
  for (char c : type) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "adam" || lower == "adamw") {
    r.Set("--optimizer", "adamw-fused", "optimizer.type");
  } else if (lower == "lion") {
    r.Set("--optimizer", "lion", "optimizer.type");
  } else if (!lower.empty()) {
    r.NotModelled("optimizer.type",
                  fmt::format("{}: the optimizer is left to --optimizer", Shown(Json(type))));
  }
  return Ok{};
}

// Keys that change memory and that vramscope does not model; a present,
// non-default value is listed. Everything else (scheduler, logging,
// gradient_clipping, steps_per_print, ...) does not change memory.
void ListDeepSpeedNotModelled(const Reader& r, const Json& root) {
  if (auto ac = root.find("activation_checkpointing"); ac != root.end() && ac->is_object()) {
    for (const char* key :
         {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization"}) {
      if (ac->value(key, Json(false)) == true) {
        r.NotModelled(fmt::format("activation_checkpointing.{}", key),
                      "DeepSpeed's own checkpointing API; HF models use torch.utils.checkpoint");
      }
    }
  }
  for (const char* key : {"communication_data_type", "data_types", "amp", "torch_autocast",
                          "compile", "tensor_parallel", "sparse_attention"}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    if (it->is_object() && it->value("enabled", Json(true)) == false) continue;
    r.NotModelled(key, "not modelled");
  }
}

Status ReadDeepSpeed(const Reader& r, const Json& root) {
  if (Status st = ReadZero(r, root); !st.ok()) return st;
  if (Status st = ReadDeepSpeedPrecision(r, root); !st.ok()) return st;
  if (Status st = ReadDeepSpeedBatch(r, root); !st.ok()) return st;
  if (Status st = ReadDeepSpeedOptimizer(r, root); !st.ok()) return st;
  ListDeepSpeedNotModelled(r, root);
  return Ok{};
}

// TrainingArguments.optim (transformers training_args.py OptimizerNames and
// trainer.py get_optimizer_cls_and_kwargs, 4.57 / 5.x) -> --optimizer.
constexpr std::pair<std::string_view, const char*> kHfOptimizers[] = {
    {"adamw_torch", "adamw"},  // torch.optim.AdamW (foreach on CUDA)
    {"adamw_torch_fused", "adamw-fused"},
    {"adamw_bnb_8bit", "adamw-8bit"},
    {"adamw_8bit", "adamw-8bit"},
    {"paged_adamw_8bit", "paged-adamw-8bit"},
    {"paged_adamw_32bit", "paged-adamw"},
    {"adafactor", "adafactor"},
    {"sgd", "sgd"},  // torch.optim.SGD; momentum from optim_args (SgdFlag)
};

// HF's "sgd" takes momentum from optim_args ("momentum=0.9,nesterov=True";
// trainer_optimizer.py _get_sgd in 5.x, trainer.py in 4.57): any non-zero
// momentum keeps a momentum buffer.
const char* SgdFlag(const Json& root) {
  auto it = root.find("optim_args");
  // Axolotl's optim_args may be a mapping (schemas/training.py: str | dict).
  if (it != root.end() && it->is_object()) {
    auto m = it->find("momentum");
    const bool on =
        m != it->end() && ((m->is_number() && m->get<double>() != 0) ||
                           (m->is_string() && std::atof(m->get<std::string>().c_str()) != 0));
    return on ? "sgd-momentum" : "sgd";
  }
  if (it == root.end() || !it->is_string()) return "sgd";
  const std::string args = it->get<std::string>();
  const size_t at = args.find("momentum=");
  if (at == std::string::npos) return "sgd";
  const double momentum = std::atof(args.c_str() + at + 9);
  return momentum != 0 ? "sgd-momentum" : "sgd";
}

// per_device_train_batch_size, gradient_accumulation_steps, bf16 / fp16
// (bf16: the default precision; fp16: fp32 weights under autocast; neither:
// fp32), optim.
Status ReadHfBasics(const Reader& r, const Json& root) {
  constexpr int64_t kMaxBatch = int64_t{1} << 32;
  VS_TRY(batch, Number(r, root, "per_device_train_batch_size", "per_device_train_batch_size", 1,
                       kMaxBatch));
  if (batch) r.SetCount("--batch", *batch, "per_device_train_batch_size");
  VS_TRY(accum, Number(r, root, "gradient_accumulation_steps", "gradient_accumulation_steps", 1,
                       kMaxBatch));
  if (accum) r.SetCount("--grad-accum", *accum, "gradient_accumulation_steps");
  VS_TRY(bf16, Bool(r, root, "bf16", "bf16"));
  VS_TRY(fp16, Bool(r, root, "fp16", "fp16"));
  if (bf16.value_or(false) && fp16.value_or(false)) {
    return r.Bad("bf16", "and fp16 are both true (TrainingArguments refuses both)");
  }
  // bf16 is Trainer(bf16=True)'s autocast; the weights are what the script's
  // from_pretrained loaded: float32 under transformers 4.x, the checkpoint's
  // dtype under 5.x. That is the default precision (ApplyLibraryDefaults), so
  // bf16 alone leaves --precision to it.
  if (fp16.value_or(false)) r.Set("--precision", "fp16-mixed", "fp16");
  if (bf16 && fp16 && !*bf16 && !*fp16) r.Set("--precision", "fp32", "bf16, fp16");
  VS_TRY(optim, String(r, root, "optim", "optim"));
  if (!optim.empty()) {
    const char* flag = nullptr;
    for (const auto& [name, value] : kHfOptimizers) flag = name == optim ? value : flag;
    if (optim == "sgd") flag = SgdFlag(root);
    if (flag) {
      r.Set("--optimizer", flag, "optim");
    } else {
      r.NotModelled("optim", fmt::format("{}: left to --optimizer", Shown(Json(optim))));
    }
  }
  return Ok{};
}

// gradient_checkpointing (+ gradient_checkpointing_kwargs.use_reentrant).
// Without kwargs, modeling_utils.py gradient_checkpointing_enable picks
// use_reentrant=True in transformers 4.35-4.57 and False in 5.x
// (docs/lowering.md), so the file's mode follows --transformers-version.
Status ReadHfCheckpointing(const Reader& r, const Json& root) {
  VS_TRY(on, Bool(r, root, "gradient_checkpointing", "gradient_checkpointing"));
  if (!on || !*on) return Ok{};
  VS_TRY(kwargs, Object(r, root, "gradient_checkpointing_kwargs", "gradient_checkpointing_kwargs"));
  std::optional<bool> reentrant;
  if (kwargs) {
    VS_TRY(v, Bool(r, *kwargs, "use_reentrant", "gradient_checkpointing_kwargs.use_reentrant"));
    reentrant = v;
  }
  const bool re = reentrant.value_or(r.transformers_major < 5);
  r.Set("--grad-ckpt", re ? "reentrant" : "full",
        reentrant ? "gradient_checkpointing_kwargs.use_reentrant" : "gradient_checkpointing");
  return Ok{};
}

// fsdp's options as a list (to_dict) or one space-separated string
// (training_args.py FSDPOption: full_shard, shard_grad_op, hybrid_shard,
// hybrid_shard_zero2, no_shard, offload, auto_wrap). transformers 5.x also
// takes fsdp=true with the sharding in fsdp_config: the option "true".
Result<std::vector<std::string>> FsdpOptions(const Reader& r, const Json& root) {
  std::vector<std::string> options;
  auto it = root.find("fsdp");
  if (it == root.end() || it->is_null() || *it == false) return options;
  if (*it == true) return std::vector<std::string>{"true"};
  auto add_words = [&](const std::string& text) {
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find(' ', start);
      if (end == std::string::npos) end = text.size();
      if (end > start) options.push_back(text.substr(start, end - start));
      start = end + 1;
    }
  };
  if (it->is_string()) {
    add_words(it->get<std::string>());
  } else if (it->is_array()) {
    if (Status st = ShortList(r, *it, "fsdp"); !st.ok()) return st.error();
    for (const Json& v : *it) {
      if (!v.is_string()) return r.Bad("fsdp", fmt::format("{} is not a string", Shown(v)));
      add_words(v.get<std::string>());
    }
  } else {
    return r.Bad("fsdp", fmt::format("{} is not true, a string or a list of strings", Shown(*it)));
  }
  if (options.size() > kMaxListItems) {
    return r.Bad("fsdp", fmt::format("{} options; TrainingArguments has {} at most", options.size(),
                                     kMaxListItems));
  }
  return options;
}

// One FSDP option (or an FSDP1 reshard_after_forward strategy name) into
// *sharding / *offload; an unknown one is an error naming `key`.
Status FsdpOption(const Reader& r, const std::string& o, const char* key, std::string* sharding,
                  bool* offload) {
  if (o == "full_shard") {
    *sharding = "full";
  } else if (o == "shard_grad_op") {
    *sharding = "grad-op";
  } else if (o == "hybrid_shard" || o == "hybrid_shard_zero2") {
    *sharding = "hybrid";
    if (o == "hybrid_shard_zero2") r.NotModelled(key, "hybrid_shard_zero2: modelled as hybrid");
  } else if (o == "offload") {
    *offload = true;
  } else if (o == "no_shard") {
    r.NotModelled(key, "no_shard: left to the layout flags");
  } else if (o != "auto_wrap") {
    return r.Bad(key, fmt::format("{} is not an FSDP option", Shown(Json(o))));
  }
  return Ok{};
}

// fsdp_config with the "fsdp_" prefix stripped, as TrainingArguments does.
Result<Json> FsdpConfig(const Reader& r, const Json& root) {
  VS_TRY(config, Object(r, root, "fsdp_config", "fsdp_config"));
  Json cfg = Json::object();
  if (config) {
    for (const auto& [k, v] : config->items()) cfg[k.rfind("fsdp_", 0) == 0 ? k.substr(5) : k] = v;
  }
  return cfg;
}

Status ReadFsdpPrefetch(const Reader& r, const Json& cfg, std::string_view key);

// FSDP (training_args.py, 4.57: __post_init__ fsdp -> accelerate's FSDP_*
// environment, FSDP1 unless accelerate's config says otherwise; 5.x:
// _apply_legacy_fsdp_to_config and fsdp_config "version", default 2,
// "reshard_after_forward" true/false = full_shard/shard_grad_op for FSDP2,
// a strategy name for FSDP1, "cpu_offload").
Status ReadHfFsdp(const Reader& r, const Json& root) {
  VS_TRY(options, FsdpOptions(r, root));
  if (options.empty()) return Ok{};
  VS_TRY(cfg, FsdpConfig(r, root));
  std::string sharding = options.front() == "true" ? "full" : "";
  bool offload = false;
  for (const std::string& o : options) {
    if (o == "true") continue;
    if (Status st = FsdpOption(r, o, "fsdp", &sharding, &offload); !st.ok()) return st;
  }
  if (auto raf = cfg.find("reshard_after_forward"); raf != cfg.end() && !raf->is_null()) {
    if (raf->is_boolean()) {
      sharding = *raf == true ? "full" : "grad-op";
    } else if (!raf->is_string()) {
      return r.Bad("fsdp_config.reshard_after_forward",
                   fmt::format("{} is not true, false or a strategy name", Shown(*raf)));
    } else if (Status st = FsdpOption(r, raf->get<std::string>(),
                                      "fsdp_config.reshard_after_forward", &sharding, &offload);
               !st.ok()) {
      return st;
    }
  }
  VS_TRY(cpu_offload, Bool(r, cfg, "cpu_offload", "fsdp_config.cpu_offload"));
  offload = offload || cpu_offload.value_or(false);
  if (sharding.empty()) return Ok{};
  r.Set("--fsdp", sharding, "fsdp");
  if (offload) r.Set("--offload", "params", "fsdp offload");
  VS_TRY(version, Number(r, cfg, "version", "fsdp_config.version", 1, 2));
  const int64_t default_version = r.transformers_major >= 5 ? 2 : 1;
  r.SetCount("--fsdp-version", version.value_or(default_version),
             version ? "fsdp_config.version" : "fsdp (the transformers version's default)");
  if (Status st = ReadFsdpPrefetch(r, cfg, "fsdp_config.backward_prefetch"); !st.ok()) return st;
  VS_TRY(ckpt, Bool(r, cfg, "activation_checkpointing", "fsdp_config.activation_checkpointing"));
  // accelerate wraps each layer in checkpoint_wrapper (CheckpointImpl.NO_REENTRANT).
  if (ckpt.value_or(false)) r.Set("--grad-ckpt", "full", "fsdp_config.activation_checkpointing");
  return Ok{};
}

Status ParseRoot(const Reader& r, const std::string& text, bool allow_hf);

// A DeepSpeed config JSON named by `key` of the file being read; a relative
// path is relative to that file.
Status ReadDeepSpeedFile(const Reader& r, const std::string& name, std::string_view key) {
  // The path names the nested file in every message about it: one with line
  // breaks or escapes (C0, or C1 such as U+009B, a terminal's CSI) would split
  // or color them (found by fuzz_accelerate_yaml).
  if (common::HasControlCharacters(name))
    return r.Bad(key, fmt::format("the path {} has control characters",
                                  common::QuoteForMessage(name, common::kQuotedBytes, '\'')));
  if (name.empty()) return r.Bad(key, "an empty path");
  std::filesystem::path path(name);
  if (path.is_relative()) path = std::filesystem::path(r.file).parent_path() / path;
  auto text = (*r.read)(path.string());
  if (!text.ok()) return r.Bad(key, text.error().message);
  Reader inner{path.string(), r.out, r.transformers_major, r.read};
  return ParseRoot(inner, *text, /*allow_hf=*/false);
}

// "deepspeed": a config dict, or a path read as a DeepSpeed config (relative
// to the TrainingArguments file, as HfTrainerDeepSpeedConfig reads it
// relative to the working directory the file was written for).
Status ReadHfDeepSpeed(const Reader& r, const Json& root) {
  auto it = root.find("deepspeed");
  if (it == root.end() || it->is_null()) return Ok{};
  VS_TRY(fsdp, FsdpOptions(r, root));
  if (!fsdp.empty()) {
    return r.Bad("deepspeed", "and fsdp are both set (TrainingArguments refuses both)");
  }
  if (it->is_object()) return ReadDeepSpeed(r, *it);
  if (!it->is_string()) {
    return r.Bad("deepspeed", fmt::format("{} is not a path or an object", Shown(*it)));
  }
  return ReadDeepSpeedFile(r, it->get<std::string>(), "deepspeed");
}

// TrainingArguments keys that change memory and are not modelled.
void ListHfNotModelled(const Reader& r, const Json& root) {
  auto on = [&](const char* key) {
    auto it = root.find(key);
    return it != root.end() && !it->is_null() && *it != false && *it != 0 && *it != "" &&
           *it != Json::array();
  };
  if (on("torch_compile")) r.NotModelled("torch_compile", "compiled graphs are not modelled");
  if (on("torch_empty_cache_steps")) r.NotModelled("torch_empty_cache_steps", "not modelled");
  if (on("label_smoothing_factor")) r.NotModelled("label_smoothing_factor", "not modelled");
  if (on("optim_target_modules")) r.NotModelled("optim_target_modules", "GaLore / APOLLO");
  if (on("auto_find_batch_size")) r.NotModelled("auto_find_batch_size", "not modelled");
  // The Trainer calls _apply_liger_kernel_to_instance (liger-kernel 0.8.5):
  // RMSNorm, RoPE, SwiGLU and the fused linear cross-entropy, --liger.
  if (on("use_liger_kernel")) r.Set("--liger", "true", "use_liger_kernel");
}

Status ReadTrainingArguments(const Reader& r, const Json& root) {
  if (Status st = ReadHfBasics(r, root); !st.ok()) return st;
  if (Status st = ReadHfCheckpointing(r, root); !st.ok()) return st;
  VS_TRY(cap, Number(r, root, "ddp_bucket_cap_mb", "ddp_bucket_cap_mb", 1, 1 << 16));
  if (cap) r.SetCount("--ddp-bucket-cap-mb", *cap, "ddp_bucket_cap_mb");
  if (Status st = ReadHfFsdp(r, root); !st.ok()) return st;
  ListHfNotModelled(r, root);
  // Last: DeepSpeed's own blocks win over optim (HF does not build an
  // optimizer when the DeepSpeed config has one).
  return ReadHfDeepSpeed(r, root);
}

// --- accelerate's config file (accelerate 1.15: commands/config/config_args.py
// ClusterConfig, commands/launch.py, utils/launch.py, utils/dataclasses.py) ---

// A boolean as accelerate takes it: true/false, or one of str_to_bool's
// strings (utils/environment.py: y/yes/t/true/on/1, n/no/f/false/off/0),
// since launch.py passes the fsdp_* keys through the environment as text.
Result<std::optional<bool>> Truth(const Reader& r, const Json& parent, const char* key,
                                  const std::string& path) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return std::optional<bool>{};
  if (it->is_boolean()) return std::optional<bool>{it->get<bool>()};
  if (it->is_string()) {
    std::string v;
    for (char c : it->get<std::string>()) v += static_cast<char>(std::tolower((unsigned char)c));
    for (const char* t : {"y", "yes", "t", "true", "on", "1"}) {
      if (v == t) return std::optional<bool>{true};
    }
    for (const char* f : {"n", "no", "f", "false", "off", "0"}) {
      if (v == f) return std::optional<bool>{false};
    }
  }
  return r.Bad(path, fmt::format("{} is not true or false", Shown(*it)));
}

// YAML 1.1 (PyYAML, which accelerate uses) reads an unquoted NO / no as
// false, which accelerate then refuses; `accelerate config` quotes it.
Status NotUnquotedNo(const Reader& r, const Json& root, const char* key, const char* word) {
  auto it = root.find(key);
  if (it == root.end() || !it->is_boolean()) return Ok{};
  return r.Bad(key, fmt::format("{} is not a string (YAML reads an unquoted {} as false: "
                                "write '{}', as `accelerate config` does)",
                                Shown(*it), word, word));
}

// num_processes is the total over all machines (launch.py: nproc_per_node =
// num_processes // num_machines, nnodes = num_machines): --gpus. -1, the
// ClusterConfig default, means "given at launch": left to --gpus.
Status ReadAccelerateProcesses(const Reader& r, const Json& root, const std::string& type) {
  VS_TRY(n, Number(r, root, "num_processes", "num_processes", -1, 1 << 20));
  VS_TRY(machines, Number(r, root, "num_machines", "num_machines", 1, 1 << 16));
  if (n && *n == 0) return r.Bad("num_processes", "0 is not a count of processes (or -1)");
  if (type == "NO" || !n || *n < 0) return Ok{};
  const int64_t m = machines.value_or(1);
  if (*n % m != 0) {
    return r.Bad("num_processes", fmt::format("{} is not a multiple of num_machines ({})", *n, m));
  }
  r.SetCount("--gpus", *n, "num_processes");
  if (m > 1) {
    if (*n / m > 64) {
      return r.Bad("num_processes",
                   fmt::format("{} / num_machines {} is over 64 GPUs per node", *n, m));
    }
    r.SetCount("--gpus-per-node", *n / m, "num_processes / num_machines");
  }
  return Ok{};
}

// mixed_precision (utils/dataclasses.py PrecisionType, lower-cased by
// launch.py): no -> fp32, fp16 / bf16 -> *-mixed (autocast with fp32 weights
// under DDP / FSDP, DeepSpeed's fp16 / bf16 blocks under DEEPSPEED, as the
// JSON readers map them); fp8 is not modelled. An older config's `fp16: true`
// stands for mixed_precision fp16 (config_args.py process_config).
Status ReadAcceleratePrecision(const Reader& r, const Json& root) {
  if (Status st = NotUnquotedNo(r, root, "mixed_precision", "no"); !st.ok()) return st;
  VS_TRY(mp, String(r, root, "mixed_precision", "mixed_precision"));
  if (mp.empty()) {
    VS_TRY(fp16, Bool(r, root, "fp16", "fp16"));
    if (fp16.value_or(false)) r.Set("--precision", "fp16-mixed", "fp16");
    return Ok{};
  }
  std::string lower;
  for (char c : mp) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "no") {
    r.Set("--precision", "fp32", "mixed_precision");
  } else if (lower == "fp16" || lower == "bf16") {
    r.Set("--precision", lower + "-mixed", "mixed_precision");
  } else if (lower == "fp8") {
    r.NotModelled("mixed_precision", "fp8: left to --precision");
  } else {
    return r.Bad("mixed_precision",
                 fmt::format("{} is not one of no, fp16, bf16, fp8", Shown(Json(mp))));
  }
  return Ok{};
}

// constants.py FSDP_SHARDING_STRATEGY; FullyShardedDataParallelPlugin takes
// a name (any case) or its 1-based number (torch's ShardingStrategy values).
constexpr const char* kAccelerateStrategies[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                                 "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};

// An FSDP1 sharding strategy into --fsdp's value through FsdpOption, the
// TrainingArguments mapping ("" for NO_SHARD: left to the layout flags).
Result<std::string> AccelerateStrategy(const Reader& r, const Json& v, const char* key) {
  std::string name = v.is_string() ? v.get<std::string>() : "";
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int64_t number = 0;
  if (v.is_number_integer()) number = v.get<int64_t>();
  if (name.size() == 1 && name[0] >= '1' && name[0] <= '5') number = name[0] - '0';
  if (number >= 1 && number <= 5) name = kAccelerateStrategies[number - 1];
  bool known = false;
  for (const char* s : kAccelerateStrategies) known = known || name == s;
  if (!known) {
    return r.Bad(key, fmt::format("{} is not one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                                  "HYBRID_SHARD, HYBRID_SHARD_ZERO2 or 1..5",
                                  Shown(v)));
  }
  std::string option;
  for (char c : name) option += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string sharding;
  bool offload = false;
  if (Status st = FsdpOption(r, option, key, &sharding, &offload); !st.ok()) return st.error();
  return sharding;
}

// The sharding that `accelerate launch` 1.15 runs (utils/launch.py,
// utils/dataclasses.py FullyShardedDataParallelPlugin __post_init__,
// accelerator.py "sharding_strategy or reshard_after_forward"): for FSDP1 the
// launcher always exports FSDP_SHARDING_STRATEGY (the file's
// fsdp_sharding_strategy, else FULL_SHARD) and the plugin takes it first, so
// fsdp_reshard_after_forward never decides; FSDP2 takes
// fsdp_reshard_after_forward as a boolean (true: full, false: grad-op).
// Absent: FULL_SHARD / true. Sets *key to the key it came from.
Result<std::string> AccelerateSharding(const Reader& r, const Json& cfg, int64_t version,
                                       std::string* key) {
  auto strategy = cfg.find("sharding_strategy");
  auto raf = cfg.find("reshard_after_forward");
  const bool has_strategy = strategy != cfg.end() && !strategy->is_null();
  const bool has_raf = raf != cfg.end() && !raf->is_null();
  *key = "fsdp_config (absent: accelerate's default, full shard)";
  if (version == 1 && has_strategy) {
    *key = "fsdp_config.fsdp_sharding_strategy";
    return AccelerateStrategy(r, *strategy, "fsdp_config.fsdp_sharding_strategy");
  }
  if (has_strategy) {
    r.NotModelled("fsdp_config.fsdp_sharding_strategy",
                  "ignored by FSDP2, which follows fsdp_reshard_after_forward");
  }
  if (version == 1) {
    if (has_raf) {
      *key =
          "fsdp_config (no fsdp_sharding_strategy: accelerate launch exports FULL_SHARD, which "
          "FSDP1 takes before fsdp_reshard_after_forward)";
    }
    return std::string("full");
  }
  if (!has_raf) return std::string("full");
  *key = "fsdp_config.fsdp_reshard_after_forward";
  VS_TRY(reshard, Truth(r, cfg, "reshard_after_forward", *key));
  return std::string(reshard.value_or(true) ? "full" : "grad-op");
}

// FSDP keys that change memory and are not modelled, at a non-default value.
void ListAccelerateFsdpNotModelled(const Reader& r, const Json& cfg) {
  if (cfg.value("activation_checkpointing_offload", Json(false)) == true) {
    r.NotModelled("fsdp_config.fsdp_activation_checkpointing_offload",
                  "checkpointed inputs offloaded to the CPU");
  }
  if (auto p = cfg.find("auto_wrap_policy");
      p != cfg.end() && p->is_string() && *p != "TRANSFORMER_BASED_WRAP") {
    r.NotModelled("fsdp_config.fsdp_auto_wrap_policy",
                  fmt::format("{}: vramscope wraps each transformer layer", Shown(*p)));
  }
  if (cfg.value("forward_prefetch", Json(false)) == true) {
    r.NotModelled("fsdp_config.fsdp_forward_prefetch", "true: not modelled");
  }
}

// FSDP1's backward_prefetch ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH", any
// case: accelerate's FullyShardedDataParallelPlugin and TrainingArguments upper-case
// it, 1.15 / 5.24) into --fsdp-backward-prefetch; absent: NO_PREFETCH, both defaults.
Status ReadFsdpPrefetch(const Reader& r, const Json& cfg, std::string_view key) {
  auto it = cfg.find("backward_prefetch");
  if (it == cfg.end() || it->is_null()) return Ok{};
  if (!it->is_string()) return r.Bad(key, fmt::format("{} is not a string", Shown(*it)));
  std::string value = it->get<std::string>();
  for (char& c : value) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const char* flag = value == "BACKWARD_PRE"    ? "pre"
                     : value == "BACKWARD_POST" ? "post"
                     : value == "NO_PREFETCH"   ? "none"
                                                : nullptr;
  if (flag == nullptr) {
    return r.Bad(key,
                 fmt::format("{} is not BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH", Shown(*it)));
  }
  r.Set("--fsdp-backward-prefetch", flag, std::string(key));
  return Ok{};
}

// distributed_type FSDP: fsdp_config's keys with the fsdp_ prefix stripped, as
// launch.py copies them (fsdp_version, default 1; the sharding; fsdp_offload_params;
// fsdp_activation_checkpointing: checkpoint_wrapper, non-reentrant).
Status ReadAccelerateFsdp(const Reader& r, const Json& root) {
  VS_TRY(cfg, FsdpConfig(r, root));
  VS_TRY(version, Number(r, cfg, "version", "fsdp_config.fsdp_version", 1, 2));
  const int64_t v = version.value_or(1);  // launch.py --fsdp_version default "1"
  std::string key;
  VS_TRY(sharding, AccelerateSharding(r, cfg, v, &key));
  ListAccelerateFsdpNotModelled(r, cfg);
  if (sharding.empty()) return Ok{};  // NO_SHARD: listed by FsdpOption
  if (Status st = ReadFsdpPrefetch(r, cfg, "fsdp_config.fsdp_backward_prefetch"); !st.ok())
    return st;
  r.Set("--fsdp", sharding, key);
  r.SetCount(
      "--fsdp-version", v,
      version ? "fsdp_config.fsdp_version" : "fsdp_config (absent: accelerate's default, 1)");
  VS_TRY(offload, Truth(r, cfg, "offload_params", "fsdp_config.fsdp_offload_params"));
  if (offload.value_or(false)) r.Set("--offload", "params", "fsdp_config.fsdp_offload_params");
  VS_TRY(ckpt,
         Truth(r, cfg, "activation_checkpointing", "fsdp_config.fsdp_activation_checkpointing"));
  if (ckpt.value_or(false)) {
    r.Set("--grad-ckpt", "full", "fsdp_config.fsdp_activation_checkpointing");
  }
  return Ok{};
}

// The deepspeed_config keys that DeepSpeedPlugin maps to a DeepSpeed config
// (utils/dataclasses.py plugin_to_config_mapping), which it refuses next to
// deepspeed_config_file (_deepspeed_config_checks).
constexpr std::pair<const char*, const char*> kAccelerateDeepSpeedKeys[] = {
    {"zero_stage", "zero_optimization.stage"},
    {"offload_optimizer_device", "zero_optimization.offload_optimizer.device"},
    {"offload_param_device", "zero_optimization.offload_param.device"},
    {"gradient_accumulation_steps", "gradient_accumulation_steps"},
    {"gradient_clipping", ""},
    {"zero3_save_16bit_model", ""},
    {"offload_optimizer_nvme_path", ""},
    {"offload_param_nvme_path", ""}};

// deepspeed_config_file: read through the DeepSpeed reader, the other keys
// refused as accelerate does (mixed_precision too, launch.py
// mp_from_config_flag).
Status ReadAccelerateDeepSpeedFile(const Reader& r, const Json& root, const Json& cfg,
                                   const std::string& file) {
  for (const auto& [key, unused] : kAccelerateDeepSpeedKeys) {
    if (cfg.contains(key)) {
      return r.Bad(fmt::format("deepspeed_config.{}", key),
                   "and deepspeed_config_file are both set (accelerate refuses both: "
                   "set it in the DeepSpeed config)");
    }
  }
  if (root.contains("mixed_precision") && !root["mixed_precision"].is_null()) {
    return r.Bad("mixed_precision",
                 "and deepspeed_config.deepspeed_config_file are both set (accelerate refuses "
                 "both: set fp16 / bf16 in the DeepSpeed config)");
  }
  return ReadDeepSpeedFile(r, file, "deepspeed_config.deepspeed_config_file");
}

// distributed_type DEEPSPEED: deepspeed_config_file, or the keys
// DeepSpeedPlugin turns into a DeepSpeed config (zero_stage, default 2;
// offload_*_device; gradient_accumulation_steps), read by the DeepSpeed
// reader under the accelerate key names.
Status ReadAccelerateDeepSpeed(const Reader& r, const Json& root) {
  VS_TRY(block, Object(r, root, "deepspeed_config", "deepspeed_config"));
  const Json cfg = block ? *block : Json::object();
  VS_TRY(file, String(r, cfg, "deepspeed_config_file", "deepspeed_config.deepspeed_config_file"));
  if (!file.empty() && file != "none") return ReadAccelerateDeepSpeedFile(r, root, cfg, file);
  Json ds = {{"zero_optimization", {{"stage", cfg.value("zero_stage", Json(2))}}}};
  std::vector<std::pair<std::string, std::string>> rename;
  for (const auto& [key, ds_key] : kAccelerateDeepSpeedKeys) {
    if (*ds_key == '\0') continue;
    const std::string name = fmt::format("deepspeed_config.{}", key);
    const bool absent_stage = !cfg.contains(key) && std::string_view(key) == "zero_stage";
    rename.emplace_back(ds_key, absent_stage ? name + " (absent: accelerate's default 2)" : name);
    auto it = cfg.find(key);
    if (it == cfg.end() || std::string_view(key) == "zero_stage") continue;
    if (std::string_view(key) == "gradient_accumulation_steps") {
      ds[key] = *it;
    } else {
      const bool optimizer = std::string_view(key) == "offload_optimizer_device";
      ds["zero_optimization"][optimizer ? "offload_optimizer" : "offload_param"]["device"] = *it;
    }
  }
  rename.emplace_back("zero_optimization.offload_param", "deepspeed_config.offload_param_device");
  Reader inner = r;
  inner.rename = &rename;
  return ReadDeepSpeed(inner, ds);
}

// Top-level keys that change memory and are not modelled.
void ListAccelerateNotModelled(const Reader& r, const Json& root) {
  std::string backend;
  if (auto d = root.find("dynamo_config"); d != root.end() && d->is_object()) {
    backend = d->value("dynamo_backend", Json("NO")).is_string()
                  ? d->value("dynamo_backend", std::string("NO"))
                  : "?";
  } else if (auto b = root.find("dynamo_backend"); b != root.end() && b->is_string()) {
    backend = b->get<std::string>();
  }
  if (!backend.empty() && backend != "NO" && backend != "no") {
    r.NotModelled("dynamo_config.dynamo_backend", "compiled graphs are not modelled");
  }
  if (auto p = root.find("parallelism_config"); p != root.end() && p->is_object() && !p->empty()) {
    r.NotModelled("parallelism_config", "accelerate's ParallelismConfig: give --tp / --cp");
  }
  if (root.value("use_cpu", Json(false)) == true) {
    r.NotModelled("use_cpu", "training on the CPU");
  }
}

// distributed_type (utils/dataclasses.py DistributedType): NO (one process),
// MULTI_GPU (DDP), FSDP, DEEPSPEED; the other types are not modelled.
Status ReadAccelerateType(const Reader& r, const Json& root, const std::string& type) {
  if (type == "MULTI_GPU") {
    r.Set("--ddp", "true", "distributed_type");
  } else if (type == "FSDP") {
    return ReadAccelerateFsdp(r, root);
  } else if (type == "DEEPSPEED") {
    return ReadAccelerateDeepSpeed(r, root);
  } else if (type != "NO") {
    static constexpr const char* kOthers[] = {
        "MULTI_CPU", "MULTI_NPU", "MULTI_MLU",   "MULTI_SDAA", "MULTI_MUSA",
        "MULTI_XPU", "XLA",       "MEGATRON_LM", "MULTI_HPU",  "MULTI_NEURON"};
    bool known = false;
    for (const char* o : kOthers) known = known || type == o;
    if (!known) {
      return r.Bad("distributed_type",
                   fmt::format("{} is not one of NO, MULTI_GPU, FSDP, DEEPSPEED, MULTI_CPU, "
                               "MULTI_XPU, XLA, MEGATRON_LM, ...",
                               Shown(Json(type))));
    }
    r.NotModelled("distributed_type", fmt::format("{}: left to the layout flags", type));
  }
  return Ok{};
}

// An accelerate config (ClusterConfig): compute_environment LOCAL_MACHINE,
// distributed_type required (config_args.py process_config).
Status ReadAccelerate(const Reader& r, const Json& root) {
  VS_TRY(env, String(r, root, "compute_environment", "compute_environment"));
  if (!env.empty() && env != "LOCAL_MACHINE") {
    return r.Bad(
        "compute_environment",
        fmt::format("{} is not LOCAL_MACHINE (SageMaker configs are not read)", Shown(Json(env))));
  }
  if (Status st = NotUnquotedNo(r, root, "distributed_type", "NO"); !st.ok()) return st;
  VS_TRY(type, String(r, root, "distributed_type", "distributed_type"));
  if (type.empty()) return r.Bad("distributed_type", "missing (accelerate requires it)");
  if (Status st = ReadAccelerateProcesses(r, root, type); !st.ok()) return st;
  if (Status st = ReadAcceleratePrecision(r, root); !st.ok()) return st;
  if (Status st = ReadAccelerateType(r, root, type); !st.ok()) return st;
  ListAccelerateNotModelled(r, root);
  return Ok{};
}

// --- Axolotl's training config, the file of `axolotl train config.yml`
// (axolotl v0.18.0-9-g067b021c8: utils/schemas/{config,training,peft,model,
// fsdp,enums}.py, utils/config/__init__.py resolve_dtype / normalize_config,
// core/builders/base.py, loaders/model.py, loaders/adapter.py) ---

// base_model is required (schemas/model.py) and no accelerate config has it.
bool LooksLikeAxolotl(const Json& root) {
  if (!root.contains("base_model")) return false;
  for (const char* key : {"micro_batch_size", "sequence_len", "adapter", "datasets"}) {
    if (root.contains(key)) return true;
  }
  return false;
}

// Axolotl's `if cfg.key` test: present, and not null / false / 0 / "" / empty.
bool Truthy(const Json& root, const char* key) {
  auto it = root.find(key);
  return it != root.end() && !it->is_null() && *it != false && *it != 0 && *it != "" &&
         *it != Json::array() && *it != Json::object();
}

// Axolotl's pydantic fields: a bool is true / false and a count a whole
// number; "auto" (which Number and Bool take for DeepSpeed and HF) is refused.
Result<std::optional<bool>> AxFlag(const Reader& r, const Json& parent, const char* key,
                                   const std::string& path) {
  auto it = parent.find(key);
  if (it != parent.end() && it->is_string()) {
    return r.Bad(path, fmt::format("{} is not true or false", Shown(*it)));
  }
  return Bool(r, parent, key, path);
}

Result<std::optional<int64_t>> AxCount(const Reader& r, const Json& parent, const char* key,
                                       const std::string& path, int64_t lo, int64_t hi) {
  auto it = parent.find(key);
  if (it != parent.end() && it->is_string()) {
    return r.Bad(path, fmt::format("{} is not a whole number", Shown(*it)));
  }
  return Number(r, parent, key, path, lo, hi);
}

// base_model: every command takes the model as its MODEL argument, so the
// file's is reported, not applied. sequence_len (schemas/config.py, default
// 512) -> --seq; micro_batch_size (schemas/training.py, default 1, as
// vramscope's) -> --batch; gradient_accumulation_steps, or batch_size //
// micro_batch_size when only batch_size is given (normalize_config;
// schemas/validation.py refuses both) -> --grad-accum.
Status ReadAxolotlBatch(const Reader& r, const Json& root) {
  VS_TRY(model, String(r, root, "base_model", "base_model"));
  if (!model.empty()) {
    r.Note(fmt::format("model {}", common::QuoteForMessage(model, common::kQuotedBytes, '\'')),
           "base_model", "not applied, the MODEL argument names the model estimated");
  }
  constexpr int64_t kMax = int64_t{1} << 32;
  VS_TRY(seq, AxCount(r, root, "sequence_len", "sequence_len", 1, int64_t{1} << 24));
  r.SetCount("--seq", seq.value_or(512),
             seq ? "sequence_len" : "sequence_len (absent: Axolotl's default 512)");
  VS_TRY(micro, AxCount(r, root, "micro_batch_size", "micro_batch_size", 1, kMax));
  if (micro) r.SetCount("--batch", *micro, "micro_batch_size");
  VS_TRY(accum,
         AxCount(r, root, "gradient_accumulation_steps", "gradient_accumulation_steps", 1, kMax));
  VS_TRY(total, AxCount(r, root, "batch_size", "batch_size", 1, kMax));
  if (accum && total) {
    return r.Bad("batch_size",
                 "and gradient_accumulation_steps are both set (Axolotl refuses both)");
  }
  if (accum) r.SetCount("--grad-accum", *accum, "gradient_accumulation_steps");
  if (total) {
    const int64_t steps = *total / micro.value_or(1);
    if (steps < 1) {
      return r.Bad("batch_size", fmt::format("{} is less than micro_batch_size", *total));
    }
    r.SetCount("--grad-accum", steps, "batch_size / micro_batch_size");
  }
  return Ok{};
}

// bf16 ("auto" or a bool, default "auto"), fp16, bfloat16, float16
// (utils/config/__init__.py resolve_dtype): "auto" is bf16 unless fp16 is
// set, on a GPU with bf16 (Ampere on); bf16 clears fp16. The model is loaded
// in torch_dtype (loaders/model.py model_kwargs): bf16 for bf16 / bfloat16,
// fp16 for fp16 / float16 / load_in_8bit, else fp32, and TrainingArguments'
// bf16 / fp16 autocast to that same dtype: no fp32 master weights, vramscope's
// bf16 / fp16. Under DeepSpeed ("auto" fp16 / bf16 blocks follow
// TrainingArguments) and FSDP (accelerate upcasts low-precision parameters
// when mixed precision is on, accelerator.py prepare_model) the master
// weights are fp32: *-mixed.
Status ReadAxolotlPrecision(const Reader& r, const Json& root) {
  std::optional<bool> bf16;  // nullopt: "auto"
  if (auto it = root.find("bf16"); it != root.end() && !it->is_null() && *it != "auto") {
    if (!it->is_boolean())
      return r.Bad("bf16", fmt::format("{} is not true, false or \"auto\"", Shown(*it)));
    bf16 = it->get<bool>();
  }
  VS_TRY(fp16, AxFlag(r, root, "fp16", "fp16"));
  VS_TRY(bfloat16, AxFlag(r, root, "bfloat16", "bfloat16"));
  VS_TRY(float16, AxFlag(r, root, "float16", "float16"));
  VS_TRY(int8, AxFlag(r, root, "load_in_8bit", "load_in_8bit"));
  const bool amp_bf16 = bf16.value_or(!fp16.value_or(false));
  const bool amp_fp16 = !amp_bf16 && fp16.value_or(false);
  std::string dtype = "fp32", key = "bf16";
  if (amp_bf16 || bfloat16.value_or(false)) {
    dtype = "bf16";
    key = !amp_bf16 ? "bfloat16"
          : bf16    ? "bf16"
                    : "bf16 (\"auto\" or absent: bf16 on a GPU that has it, Ampere on)";
  } else if (amp_fp16 || float16.value_or(false) || int8.value_or(false)) {
    dtype = "fp16";
    key = amp_fp16 ? "fp16" : float16.value_or(false) ? "float16" : "load_in_8bit";
  }
  const bool sharded =
      Truthy(root, "deepspeed") || Truthy(root, "fsdp") || Truthy(root, "fsdp_config");
  const bool mixed = sharded && (amp_bf16 || amp_fp16);
  r.Set("--precision", mixed ? dtype + "-mixed" : dtype, key);
  return Ok{};
}

// adapter (schemas/peft.py: lora, qlora, llama-adapter or a plugin's) with
// load_in_4bit / load_in_8bit, refused without an adapter; qlora requires
// load_in_4bit and refuses load_in_8bit (validate_qlora). loaders/model.py
// builds the 4-bit BitsAndBytesConfig (nf4, double quantization) for qlora
// only, and an 8-bit one for lora + load_in_8bit.
Result<std::string> ReadAxolotlAdapter(const Reader& r, const Json& root) {
  VS_TRY(adapter, String(r, root, "adapter", "adapter"));
  VS_TRY(in4, AxFlag(r, root, "load_in_4bit", "load_in_4bit"));
  VS_TRY(in8, AxFlag(r, root, "load_in_8bit", "load_in_8bit"));
  const bool q4 = in4.value_or(false), q8 = in8.value_or(false);
  if (adapter.empty() && (q4 || q8)) {
    return r.Bad(q4 ? "load_in_4bit" : "load_in_8bit",
                 "true without an adapter (Axolotl refuses a quantized full fine-tune)");
  }
  if (adapter == "qlora") {
    if (q8) return r.Bad("load_in_8bit", "true with adapter qlora (Axolotl refuses it)");
    if (!q4) return r.Bad("adapter", "qlora without load_in_4bit: true (Axolotl refuses it)");
    r.Set("--finetune", "qlora", "adapter, load_in_4bit");
  } else if (adapter == "lora") {
    r.Set("--finetune", "lora", "adapter");
    if (q8) r.NotModelled("load_in_8bit", "8-bit (LLM.int8) base weights: modelled as fp16 ones");
    if (q4) {
      r.NotModelled(
          "load_in_4bit",
          "with adapter lora: Axolotl quantizes to 4 bits for qlora only; modelled as lora");
    }
  } else if (!adapter.empty()) {
    r.NotModelled("adapter", fmt::format("{}: left to --finetune", Shown(Json(adapter))));
  }
  return adapter;
}

// PEFT module names (lora_target_modules) -> --lora-targets names.
constexpr std::pair<std::string_view, const char*> kLoraModules[] = {
    {"q_proj", "q"},       {"k_proj", "k"},   {"v_proj", "v"},       {"o_proj", "o"},
    {"gate_proj", "gate"}, {"up_proj", "up"}, {"down_proj", "down"}, {"lm_head", "lm_head"}};

// lora_target_modules (a list of module names; one string is a PEFT regular
// expression over full names, but "all-linear" PEFT's shorthand) and
// lora_target_linear (find_all_linear_names, loaders/adapter.py: every linear
// layer but the output embedding, vramscope's all-linear). "": left to
// --lora-targets (neither key: PEFT's per-architecture default, q,v for
// Llama-style models, vramscope's default too).
Result<std::string> AxolotlTargets(const Reader& r, const Json& root) {
  VS_TRY(linear, AxFlag(r, root, "lora_target_linear", "lora_target_linear"));
  std::vector<std::string> names, out;
  auto it = root.find("lora_target_modules");
  const bool one_string = it != root.end() && it->is_string();
  if (one_string) names.push_back(it->get<std::string>());
  if (it != root.end() && it->is_array()) {
    if (Status st = ShortList(r, *it, "lora_target_modules"); !st.ok()) return st.error();
    for (const Json& v : *it) {
      if (!v.is_string())
        return r.Bad("lora_target_modules", fmt::format("{} is not a string", Shown(v)));
      names.push_back(v.get<std::string>());
    }
  } else if (it != root.end() && !it->is_null() && !one_string) {
    return r.Bad("lora_target_modules", fmt::format("{} is not a string or a list", Shown(*it)));
  }
  if (linear.value_or(false)) out.push_back("all-linear");
  for (const std::string& name : names) {
    const char* target = name == "all-linear" ? "all-linear" : nullptr;
    for (const auto& [module, t] : kLoraModules)
      target = !one_string && module == name ? t : target;
    if (!target && linear.value_or(false)) continue;  // a linear layer all-linear covers
    if (!target) {
      r.NotModelled("lora_target_modules",
                    fmt::format("{}: left to --lora-targets", Shown(Json(name))));
      return std::string();
    }
    if (std::find(out.begin(), out.end(), target) == out.end()) out.push_back(target);
  }
  std::string joined;
  for (const std::string& t : out) joined += (joined.empty() ? "" : ",") + t;
  return joined;
}

// lora_r -> --lora-rank; lora_dropout (default 0.0 with an adapter:
// schemas/peft.py validate_lora_dropout; vramscope's is 0.05) ->
// --lora-dropout; the targets.
Status ReadAxolotlLora(const Reader& r, const Json& root) {
  VS_TRY(rank, AxCount(r, root, "lora_r", "lora_r", 1, 1 << 16));
  if (rank) r.SetCount("--lora-rank", *rank, "lora_r");
  double dropout = 0;
  if (auto it = root.find("lora_dropout"); it != root.end() && !it->is_null()) {
    if (!it->is_number())
      return r.Bad("lora_dropout", fmt::format("{} is not a number", Shown(*it)));
    dropout = it->get<double>();
    if (!(dropout >= 0 && dropout < 1)) {
      return r.Bad("lora_dropout", fmt::format("{} is outside [0, 1)", Shown(*it)));
    }
  }
  r.SetFraction("--lora-dropout", dropout,
                root.contains("lora_dropout") && !root["lora_dropout"].is_null()
                    ? "lora_dropout"
                    : "lora_dropout (absent: Axolotl's default 0.0)");
  VS_TRY(targets, AxolotlTargets(r, root));
  const bool linear = root.value("lora_target_linear", Json(false)) == true;
  const bool modules =
      root.contains("lora_target_modules") && !root["lora_target_modules"].is_null();
  if (!targets.empty()) {
    r.Set("--lora-targets", targets,
          linear && modules ? "lora_target_linear, lora_target_modules"
          : linear          ? "lora_target_linear"
                            : "lora_target_modules");
  }
  return Ok{};
}

// gradient_checkpointing (true, false, "offload", "offload_disk";
// schemas/config.py) with gradient_checkpointing_kwargs.use_reentrant.
// Without kwargs normalize_config sets use_reentrant True, unless
// unfrozen_parameters or rl is set, where the trainer builder passes False
// (core/builders/base.py _configure_gradient_checkpointing); kwargs without
// use_reentrant: the transformers version's default (as TrainingArguments).
Status ReadAxolotlCheckpointing(const Reader& r, const Json& root) {
  auto it = root.find("gradient_checkpointing");
  if (it == root.end() || it->is_null() || *it == false) return Ok{};
  const bool offload = *it == "offload" || *it == "offload_disk";
  if (!offload && *it != true) {
    return r.Bad("gradient_checkpointing",
                 fmt::format("{} is not true, false, \"offload\" or \"offload_disk\"", Shown(*it)));
  }
  VS_TRY(kwargs, Object(r, root, "gradient_checkpointing_kwargs", "gradient_checkpointing_kwargs"));
  std::optional<bool> reentrant;
  std::string key = "gradient_checkpointing_kwargs.use_reentrant";
  if (kwargs) {
    VS_TRY(v, Bool(r, *kwargs, "use_reentrant", key));
    reentrant = v;
    if (!v) key = "gradient_checkpointing (use_reentrant not given: the transformers default)";
    if (!v) reentrant = r.transformers_major < 5;
  } else if (Truthy(root, "unfrozen_parameters") || Truthy(root, "rl")) {
    reentrant = false;
    key = "gradient_checkpointing (with unfrozen_parameters or rl: use_reentrant false)";
  } else {
    reentrant = true;
    key = "gradient_checkpointing (no kwargs: Axolotl sets use_reentrant true)";
  }
  r.Set("--grad-ckpt", *reentrant ? "reentrant" : "full", key);
  if (offload) {
    r.NotModelled(
        "gradient_checkpointing",
        fmt::format("{}: checkpointed layer inputs offloaded; modelled as kept on the GPU",
                    it->get<std::string>()));
  }
  return Ok{};
}

// attn_implementation (schemas/enums.py CANONICAL_ATTN_IMPLS) or the
// deprecated booleans it replaces (LEGACY_ATTN_FLAG_TO_IMPL, in this order:
// the first set wins; with attn_implementation Axolotl refuses them). Neither:
// nothing is passed to from_pretrained (loaders/model.py
// _set_attention_config): transformers' default, sdpa, vramscope's too.
constexpr std::pair<const char*, const char*> kAxolotlLegacyAttention[] = {
    {"xformers_attention", "xformers"},
    {"sage_attention", "sage"},
    {"flex_attention", "flex_attention"},
    {"flash_attention", "flash_attention_2"},
    {"sdp_attention", "sdpa"},
    {"eager_attention", "eager"}};

Status ReadAxolotlAttention(const Reader& r, const Json& root) {
  VS_TRY(impl, String(r, root, "attn_implementation", "attn_implementation"));
  std::string key = "attn_implementation";
  for (const auto& [flag, name] : kAxolotlLegacyAttention) {
    VS_TRY(on, AxFlag(r, root, flag, flag));
    if (!on.value_or(false) || (key != "attn_implementation" && !impl.empty())) continue;
    if (!impl.empty()) {
      return r.Bad(flag, "and attn_implementation are both set (Axolotl refuses both)");
    }
    impl = name;
    key = flag;
  }
  if (impl == "eager" || impl == "sdpa") {
    r.Set("--attn", impl, key);
  } else if (impl == "flash_attention_2" || impl == "flash_attention_3") {
    r.Set("--attn", "flash", key);
    if (impl == "flash_attention_3")
      r.NotModelled(key, "flash_attention_3: modelled as FlashAttention-2");
  } else if (!impl.empty()) {
    r.NotModelled(key, fmt::format("{}: left to --attn", Shown(Json(impl))));
  }
  return Ok{};
}

// optimizer (schemas/training.py, default adamw_torch_fused) is
// TrainingArguments.optim (the same names); Axolotl's own optimizers
// (optimi_adamw, ao_adamw_*, adopt_adamw, muon, ...) are not modelled.
Status ReadAxolotlOptimizer(const Reader& r, const Json& root) {
  VS_TRY(optim, String(r, root, "optimizer", "optimizer"));
  const std::string name = optim.empty() ? "adamw_torch_fused" : optim;
  const char* flag = nullptr;
  for (const auto& [hf, value] : kHfOptimizers) flag = hf == name ? value : flag;
  if (name == "sgd") flag = SgdFlag(root);
  if (flag) {
    r.Set("--optimizer", flag,
          optim.empty() ? "optimizer (absent: Axolotl's default adamw_torch_fused)" : "optimizer");
  } else {
    r.NotModelled("optimizer", fmt::format("{}: left to --optimizer", Shown(Json(optim))));
  }
  return Ok{};
}

// The Liger plugin (integrations/liger/args.py): liger_rope, liger_rms_norm,
// liger_glu_activation (or its older name liger_swiglu) and
// liger_fused_linear_cross_entropy all on are what use_liger_kernel applies:
// --liger. liger_fused_linear_cross_entropy alone -> --loss fused-linear; the
// layer kernels in a partial set are listed as not modelled
// (ListAxolotlNotModelled).
bool AxolotlLigerAll(const Json& root) {
  return Truthy(root, "liger_rope") && Truthy(root, "liger_rms_norm") &&
         (Truthy(root, "liger_glu_activation") || Truthy(root, "liger_swiglu")) &&
         Truthy(root, "liger_fused_linear_cross_entropy");
}

Status ReadAxolotlLoss(const Reader& r, const Json& root) {
  VS_TRY(flce,
         AxFlag(r, root, "liger_fused_linear_cross_entropy", "liger_fused_linear_cross_entropy"));
  if (AxolotlLigerAll(root)) {
    r.Set("--liger", "true",
          "liger_rope, liger_rms_norm, liger_glu_activation, liger_fused_linear_cross_entropy");
  } else if (flce.value_or(false)) {
    r.Set("--loss", "fused-linear", "liger_fused_linear_cross_entropy");
  }
  return Ok{};
}

// Keys that change memory and are not modelled, listed when set (a size of 1
// is none). Everything else (datasets, output_dir, learning_rate, wandb_*,
// sample_packing, ...) leaves the memory of a step as the knobs above give it.
void ListAxolotlNotModelled(const Reader& r, const Json& root) {
  static constexpr std::pair<const char*, const char*> kKeys[] = {
      {"torch_compile", "compiled graphs are not modelled"},
      {"fp8", "TorchAO fp8 training"},
      {"activation_offloading", "activations offloaded to the CPU or disk"},
      {"layer_offloading", "parameters offloaded to the CPU between uses"},
      {"selective_checkpointing", "ops saved inside checkpointed layers"},
      {"unfrozen_parameters", "only some parameters trained"},
      {"rl", "preference / RL training (reference model, several completions)"},
      {"gptq", "a GPTQ-quantized base model"},
      {"lora_modules_to_save", "fully trained copies of these modules"},
      {"lora_target_parameters", "LoRA on parameters (MoE experts)"},
      {"peft_use_dora", "DoRA's magnitude vectors and activations"},
      {"peft_layers_to_transform", "LoRA on some layers only"},
      {"lora_rank_pattern", "per-module ranks"},
      {"peft_layer_replication", "replicated layers"},
      {"cut_cross_entropy", "Cut Cross Entropy: left to --loss"},
      {"chunked_cross_entropy",
       "the whole logits, then upcast a chunk at a time: not --loss chunked, which splits lm_head"},
      {"liger_cross_entropy", "Liger's cross-entropy without lm_head: left to --loss"},
      {"liger_rope", ""},
      {"liger_rms_norm", ""},
      {"liger_rms_norm_gated", "Liger kernel"},
      {"liger_layer_norm", "Liger kernel"},
      {"liger_glu_activation", ""},
      {"liger_swiglu", ""},
      {"tensor_parallel_size", "give --tp"},
      {"context_parallel_size", "give --cp"},
      {"expert_parallel_size", "expert parallelism"},
      {"dp_shard_size", "accelerate's ParallelismConfig"},
      {"dp_replicate_size", "accelerate's ParallelismConfig"}};
  const bool liger_all = AxolotlLigerAll(root);
  for (const auto& [key, why] : kKeys) {
    const std::string_view k = key;
    const bool in_liger = k == "liger_rope" || k == "liger_rms_norm" ||
                          k == "liger_glu_activation" || k == "liger_swiglu";
    if (liger_all && in_liger) continue;  // --liger
    if (Truthy(root, key) && root[key] != 1)
      r.NotModelled(key, in_liger ? "a Liger kernel without the full set (--liger)" : why);
  }
}

// fsdp (the deprecated option list) / fsdp_config, passed to
// TrainingArguments by the trainer builder (core/builders/base.py: fsdp =
// cfg.fsdp or True, fsdp_config as is), so read by the TrainingArguments
// mapping; the version is fsdp_version, else fsdp_config.fsdp_version, else 1
// (schemas/validation.py _resolve_fsdp_version); fsdp_config.offload_params
// is accelerate's FSDP_OFFLOAD_PARAMS (utils/trainer.py setup_fsdp_envs).
Status ReadAxolotlFsdp(const Reader& r, const Json& root) {
  VS_TRY(given, Object(r, root, "fsdp_config", "fsdp_config"));
  const bool listed = Truthy(root, "fsdp");
  // The builder's `if cfg.fsdp_config or cfg.fsdp`: an empty mapping is off.
  if ((!given || given->empty()) && !listed) return Ok{};
  Json cfg = Json::object();
  if (given) {
    for (const auto& [k, v] : given->items()) cfg[k.rfind("fsdp_", 0) == 0 ? k.substr(5) : k] = v;
  }
  VS_TRY(top, AxCount(r, root, "fsdp_version", "fsdp_version", 1, 2));
  VS_TRY(inner, AxCount(r, cfg, "version", "fsdp_config.fsdp_version", 1, 2));
  VS_TRY(offload, AxFlag(r, cfg, "offload_params", "fsdp_config.offload_params"));
  cfg["version"] = top.value_or(inner.value_or(1));
  cfg["cpu_offload"] = offload.value_or(false);
  const Json hf = {{"fsdp", listed ? root["fsdp"] : Json(true)}, {"fsdp_config", cfg}};
  const std::vector<std::pair<std::string, std::string>> rename = {
      {"fsdp", listed ? "fsdp" : "fsdp_config (Axolotl passes fsdp: true)"},
      {"fsdp_config.version", top     ? "fsdp_version"
                              : inner ? "fsdp_config.fsdp_version"
                                      : "fsdp_config (no fsdp_version: Axolotl's default 1)"},
      {"fsdp offload", "fsdp_config.offload_params"}};
  Reader named = r;
  named.rename = &rename;
  ListAccelerateFsdpNotModelled(r, cfg);
  return ReadHfFsdp(named, hf);
}

// deepspeed: a path (relative to this file) or a dict (schemas/config.py),
// read as TrainingArguments' deepspeed is; with FSDP too TrainingArguments
// refuses both.
Status ReadAxolotlDeepSpeed(const Reader& r, const Json& root) {
  auto it = root.find("deepspeed");
  if (it == root.end() || it->is_null()) return Ok{};
  if (Truthy(root, "fsdp") || Truthy(root, "fsdp_config")) {
    return r.Bad("deepspeed",
                 "and fsdp / fsdp_config are both set (TrainingArguments refuses both)");
  }
  if (it->is_object()) return ReadDeepSpeed(r, *it);
  if (!it->is_string()) {
    return r.Bad("deepspeed", fmt::format("{} is not a path or an object", Shown(*it)));
  }
  return ReadDeepSpeedFile(r, it->get<std::string>(), "deepspeed");
}

// In the order of the knobs' precedence: FSDP's activation_checkpointing after
// gradient_checkpointing, the DeepSpeed file (its optimizer block) last.
Status ReadAxolotl(const Reader& r, const Json& root) {
  if (Status st = ReadAxolotlBatch(r, root); !st.ok()) return st;
  if (Status st = ReadAxolotlPrecision(r, root); !st.ok()) return st;
  VS_TRY(adapter, ReadAxolotlAdapter(r, root));
  if (adapter == "lora" || adapter == "qlora") {
    if (Status st = ReadAxolotlLora(r, root); !st.ok()) return st;
  }
  if (Status st = ReadAxolotlCheckpointing(r, root); !st.ok()) return st;
  if (Status st = ReadAxolotlAttention(r, root); !st.ok()) return st;
  if (Status st = ReadAxolotlOptimizer(r, root); !st.ok()) return st;
  if (Status st = ReadAxolotlLoss(r, root); !st.ok()) return st;
  ListAxolotlNotModelled(r, root);
  if (Status st = ReadAxolotlFsdp(r, root); !st.ok()) return st;
  return ReadAxolotlDeepSpeed(r, root);
}

bool LooksLikeAccelerate(const Json& root) {
  return root.contains("distributed_type") || root.contains("compute_environment");
}

// Which format: keys only DeepSpeed has, then keys only TrainingArguments has.
bool LooksLikeDeepSpeed(const Json& root) {
  for (const char* key : {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
                          "zero_allow_untested_optimizer"}) {
    if (root.contains(key)) return true;
  }
  for (const char* key : {"fp16", "bf16", "optimizer"}) {
    if (root.contains(key) && root[key].is_object()) return true;
  }
  return false;
}

bool LooksLikeTrainingArguments(const Json& root) {
  for (const char* key : {"per_device_train_batch_size", "output_dir", "optim", "deepspeed", "fsdp",
                          "gradient_checkpointing", "learning_rate"}) {
    if (root.contains(key)) return true;
  }
  return false;
}

// A .yaml / .yml file is YAML; so is any other that does not start with '{'
// or '[' and reads as a YAML mapping with an accelerate or Axolotl key (accelerate's own
// config may be .json too, then read as JSON). nullopt: read as JSON.
Result<std::optional<Json>> ParseYaml(const Reader& r, const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '{' || text[first] == '[')) {
    return std::optional<Json>{};
  }
  const std::string ext = std::filesystem::path(r.file).extension().string();
  const bool named_yaml = ext == ".yaml" || ext == ".yml" || ext == ".YAML" || ext == ".YML";
  auto root = YamlToJson(text, kMaxConfigDepth);
  if (named_yaml && !root.ok())
    return MakeError(fmt::format("{}: {}", r.file, root.error().message));
  if (named_yaml && !root->is_object()) {
    return MakeError(fmt::format(
        "{}: not a YAML mapping (an accelerate, Axolotl, TRL, torchtune or LitGPT config)",
        r.file));
  }
  if (named_yaml ||
      (root.ok() && root->is_object() &&
       (LooksLikeAccelerate(*root) || LooksLikeAxolotl(*root) || LooksLikeTrl(*root) ||
        LooksLikeTorchtune(*root) || LooksLikeLitgpt(*root)))) {
    return std::optional<Json>{std::move(*root)};
  }
  return std::optional<Json>{};
}

Status ParseRoot(const Reader& r, const std::string& text, bool allow_hf) {
  if (text.find('\0') != std::string::npos) {
    return MakeError(fmt::format("{}: contains a NUL byte, not a JSON text", r.file));
  }
  if (allow_hf) {
    VS_TRY(yaml, ParseYaml(r, text));
    if (yaml && LooksLikeTorchtune(*yaml)) return ReadTorchtune(r, *yaml);
    if (yaml && LooksLikeLitgpt(*yaml)) return ReadLitgpt(r, *yaml);
    // An accelerate key decides as before; else base_model with an Axolotl key.
    if (yaml && !LooksLikeAccelerate(*yaml) && LooksLikeAxolotl(*yaml))
      return ReadAxolotl(r, *yaml);
    if (yaml && !LooksLikeAccelerate(*yaml) && LooksLikeTrl(*yaml)) return ReadTrl(r, *yaml);
    if (yaml) return ReadAccelerate(r, *yaml);
  }
  if (common::JsonNestsDeeperThan(text, kMaxConfigDepth)) {
    return MakeError(fmt::format("{}: nested deeper than {} levels", r.file, kMaxConfigDepth));
  }
  // As the YAML layer's value limit: parsed, millions of tiny items would
  // take hundreds of megabytes; no config has a quarter million.
  if (common::JsonHasMoreItemsThan(text, size_t{1} << 18)) {
    return MakeError(fmt::format("{}: more than {} values (not a config)", r.file, 1 << 18));
  }
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return MakeError(fmt::format("{}: not valid JSON", r.file));
  if (!root.is_object()) return MakeError(fmt::format("{}: not a JSON object", r.file));
  if (allow_hf && LooksLikeTorchtune(root)) return ReadTorchtune(r, root);
  if (allow_hf && LooksLikeLitgpt(root)) return ReadLitgpt(r, root);
  if (allow_hf && LooksLikeAccelerate(root)) return ReadAccelerate(r, root);
  if (allow_hf && LooksLikeAxolotl(root)) return ReadAxolotl(r, root);
  if (allow_hf && LooksLikeTrl(root)) return ReadTrl(r, root);
  if (LooksLikeDeepSpeed(root)) return ReadDeepSpeed(r, root);
  if (allow_hf && LooksLikeTrainingArguments(root)) return ReadTrainingArguments(r, root);
  return MakeError(fmt::format(
      "{}: neither a DeepSpeed config nor TrainingArguments JSON (no key such as "
      "zero_optimization, train_micro_batch_size_per_gpu or per_device_train_batch_size)",
      r.file));
}

}  // namespace fromcfg

Status ParseConfigText(const std::string& file, const std::string& text, int transformers_major,
                       const ConfigFileReader& read, FromConfig* out) {
  const fromcfg::Reader r{file, out, transformers_major, &read};
  return fromcfg::ParseRoot(r, text, /*allow_hf=*/true);
}

Result<FromConfig> ReadConfigFiles(const std::vector<std::string>& paths, int transformers_major) {
  // A file a config names is checked as a regular file, with no exception for
  // /dev/stdin and the like: those are the caller's own streams only when the
  // caller typed them (--from /dev/stdin), not when a file says so (reading
  // the terminal would wait for it to close).
  const ConfigFileReader read = [](const std::string& path) {
    return ReadTextFile(path, kMaxConfigFileBytes, /*allow_own_streams=*/false);
  };
  FromConfig config;
  for (const std::string& path : paths) {
    VS_TRY(text, ReadTextFile(path, kMaxConfigFileBytes));
    if (Status st = ParseConfigText(path, text, transformers_major, read, &config); !st.ok()) {
      return st.error();
    }
  }
  return config;
}

}  // namespace vramscope::cli
