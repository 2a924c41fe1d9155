// vramscope validate: ground-truth records -> predictions -> error statistics.
#include "vramscope/validate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "vramscope/common/checked.h"
#include "vramscope/common/json_depth.h"
#include "vramscope/common/quote.h"
#include "vramscope/common/version.h"
#include "vramscope/estimate.h"
#include "vramscope/lower.h"
#include "vramscope/model.h"

namespace vramscope {
namespace {

using nlohmann::json;

// The record format this reader understands (tools/groundtruth/gtlib/schema.py).
constexpr std::string_view kFormat = "vramscope-groundtruth";
constexpr int kSchemaVersion = 1;

// Limits on what the readers accept (docs/hardening.md). Records nest 3
// levels; nlohmann::json builds every level (about 100 bytes each), so
// without a depth limit one 256 MiB line of '[' would take gigabytes. Each
// record costs an Estimate() later, hence the cap on records per file.
constexpr size_t kMaxJsonDepth = 64;
constexpr size_t kMaxRecordsPerFile = 100'000;
// One record (a line): real ones are a few KiB. nlohmann::json takes 10-30
// times a line's bytes to hold it, so a 120 MB line of small numbers would
// take gigabytes; longer lines are refused before any is parsed.
constexpr size_t kMaxRecordBytes = size_t{1} << 20;
constexpr size_t kMaxFieldBytesShown = 100;

// Text from the file (keys, ids, reasons) made fit for a one-line message:
// escaped and cut at `max_bytes` (common::QuoteForMessage), without quote
// marks, as the message already sets it apart.
std::string Printable(std::string_view text, size_t max_bytes) {
  return common::QuoteForMessage(text, max_bytes, '\0');
}

struct Ctx {
  std::string where;
  // `problem` is this program's text: what it quotes from the input (the
  // knob parsers' messages) is already quoted with common::QuoteForMessage,
  // so it is not escaped a second time.
  Error Fail(std::string_view field, std::string_view problem) const {
    return MakeError(
        fmt::format("{}: {}: {}", where, Printable(field, kMaxFieldBytesShown), problem));
  }
};

Result<const json*> Member(const Ctx& c, const json& obj, const char* key, std::string_view path) {
  auto it = obj.find(key);
  if (it == obj.end()) return c.Fail(path, "missing");
  return &*it;
}

Result<uint64_t> Bytes(const Ctx& c, const json& v, std::string_view path) {
  if (!v.is_number_integer() ||
      (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return c.Fail(path, "expected a non-negative integer");
  }
  return v.get<uint64_t>();
}

Result<std::string> Str(const Ctx& c, const json& v, std::string_view path) {
  if (!v.is_string()) return c.Fail(path, "expected a string");
  return v.get<std::string>();
}

Result<uint64_t> Count(const Ctx& c, const json& v, std::string_view path, uint64_t lo,
                       uint64_t hi) {
  VS_TRY(n, Bytes(c, v, path));
  if (n < lo || n > hi) return c.Fail(path, fmt::format("{} is outside {}..{}", n, lo, hi));
  return n;
}

// "2.11.0+cu128" -> 211; anything unreadable -> fallback.
int PackageVersion(const json& env, const char* package, int fallback) {
  auto pk = env.find("packages");
  if (pk == env.end() || !pk->is_object()) return fallback;
  auto v = pk->find(package);
  if (v == pk->end() || !v->is_string()) return fallback;
  const std::optional<common::MajorMinor> version =
      common::ParseMajorMinor(v->get_ref<const std::string&>());
  return version ? version->Packed() : fallback;
}

Status ParseKnobs(const Ctx& c, const json& knobs, MeasuredRun* run) {
  if (!knobs.is_object()) return c.Fail("knobs", "expected an object");
  TrainingSetup& s = run->setup;
  for (const auto& [key, v] : knobs.items()) {
    const std::string path = "knobs." + key;
    if (key == "model") {
      VS_TRY(m, Str(c, v, path));
      run->model = m;
    } else if (key == "batch") {
      VS_TRY(n, Count(c, v, path, 1, 1u << 20));
      s.batch = n;
    } else if (key == "seq") {
      VS_TRY(n, Count(c, v, path, 1, 1u << 24));
      s.seq = n;
    } else if (key == "grad_accum") {
      VS_TRY(n, Count(c, v, path, 1, 1u << 16));
      s.grad_accum = n;
    } else if (key == "steps") {
      VS_TRY(n, Count(c, v, path, 1, 100));
      s.steps = static_cast<uint32_t>(n);
    } else if (key == "lora_rank") {
      VS_TRY(n, Count(c, v, path, 1, 1u << 20));
      s.lora_rank = n;
    } else if (key == "lora_dropout") {
      if (!v.is_number() || v.get<double>() < 0 || v.get<double>() >= 1) {
        return c.Fail(path, "expected a number in [0, 1)");
      }
      s.lora_dropout = v.get<double>();
    } else {
      VS_TRY(text, Str(c, v, path));
      Status st = Ok{};
      auto wrap = [&](auto parsed, auto* out) -> Status {
        if (!parsed.ok()) return c.Fail(path, parsed.error().message);
        *out = *parsed;
        return Ok{};
      };
      if (key == "precision")
        st = wrap(ParsePrecision(text), &s.precision);
      else if (key == "optimizer")
        st = wrap(ParseOptimizer(text), &s.optimizer);
      else if (key == "finetune")
        st = wrap(ParseFinetune(text), &s.finetune);
      else if (key == "grad_ckpt")
        st = wrap(ParseGradCkpt(text), &s.grad_ckpt);
      else if (key == "attn")
        st = wrap(ParseAttention(text), &s.attn);
      else if (key == "loss")
        st = wrap(ParseLoss(text), &s.loss);
      else if (key == "lora_targets")
        st = wrap(ParseLoraTargets(text), &s.lora_targets);
      else if (key == "lora_dtype")
        st = wrap(ParseLoraDtype(text), &s.lora_dtype);
      else if (key == "impl")
        st = wrap(ParseModelImpl(text), &s.impl);
      else if (key == "alloc_conf")
        s.alloc_conf = text;
      else
        return c.Fail(path, "unknown knob (this vramscope cannot estimate it)");
      if (!st.ok()) return st.error();
    }
  }
  if (run->model.empty()) return c.Fail("knobs.model", "missing");
  return Ok{};
}

Status ParseMemory(const Ctx& c, const json& rec, MeasuredRun* run) {
  VS_TRY(mem, Member(c, rec, "memory", "memory"));
  if (!mem->is_object()) return c.Fail("memory", "expected an object for status ok");
  VS_TRY(pa, Member(c, *mem, "peak_allocated_bytes", "memory.peak_allocated_bytes"));
  VS_TRY(pa_v, Bytes(c, *pa, "memory.peak_allocated_bytes"));
  VS_TRY(pr, Member(c, *mem, "peak_reserved_bytes", "memory.peak_reserved_bytes"));
  VS_TRY(pr_v, Bytes(c, *pr, "memory.peak_reserved_bytes"));
  if (pa_v == 0) return c.Fail("memory.peak_allocated_bytes", "0 for status ok");
  if (pr_v < pa_v) return c.Fail("memory.peak_reserved_bytes", "smaller than peak_allocated_bytes");
  run->peak_allocated_bytes = pa_v;
  run->peak_reserved_bytes = pr_v;
  // What nvidia-smi showed: the harness's largest end-of-phase device reading;
  // without it, reserved plus the measured CUDA context.
  auto dev = mem->find("peak_device_used_bytes");
  if (dev != mem->end() && !dev->is_null()) {
    VS_TRY(d, Bytes(c, *dev, "memory.peak_device_used_bytes"));
    run->device_bytes = d;
  } else {
    auto ctx = mem->find("cuda_context_bytes");
    uint64_t context = 0;
    if (ctx != mem->end() && !ctx->is_null()) {
      VS_TRY(cb, Bytes(c, *ctx, "memory.cuda_context_bytes"));
      context = cb;
    }
    run->device_bytes = pr_v + context;
  }
  return Ok{};
}

Result<std::optional<MeasuredRun>> ParseRecord(const Ctx& c, const json& rec,
                                               std::string_view gpu_override,
                                               std::vector<std::string>* not_compared) {
  if (!rec.is_object()) return c.Fail("record", "not a JSON object");
  VS_TRY(fmt_v, Member(c, rec, "format", "format"));
  if (!fmt_v->is_string() || fmt_v->get<std::string>() != kFormat) {
    return c.Fail("format", fmt::format("expected \"{}\"", kFormat));
  }
  VS_TRY(ver, Member(c, rec, "schema_version", "schema_version"));
  if (!ver->is_number_integer() || ver->get<int64_t>() != kSchemaVersion) {
    return c.Fail("schema_version", fmt::format("this vramscope reads version {}", kSchemaVersion));
  }
  MeasuredRun run;
  run.where = c.where;
  VS_TRY(id, Member(c, rec, "id", "id"));
  VS_TRY(id_s, Str(c, *id, "id"));
  run.id = id_s;
  if (auto n = rec.find("name"); n != rec.end() && n->is_string()) run.name = n->get<std::string>();
  VS_TRY(status, Member(c, rec, "status", "status"));
  VS_TRY(status_s, Str(c, *status, "status"));
  run.status = status_s;
  if (status_s != "ok" && status_s != "oom") {
    if (status_s != "skipped" && status_s != "error") {
      return c.Fail("status", "expected ok, oom, skipped or error");
    }
    std::string reason;
    if (auto r = rec.find("reason"); r != rec.end() && r->is_string())
      reason = r->get<std::string>();
    not_compared->push_back(fmt::format("{}: {} {}: {}", c.where,
                                        Printable(run.id, kMaxFieldBytesShown), status_s,
                                        Printable(reason, 4 * kMaxFieldBytesShown)));
    return std::optional<MeasuredRun>{};
  }
  VS_TRY(knobs, Member(c, rec, "knobs", "knobs"));
  VS_TRY(k_ok, ParseKnobs(c, *knobs, &run));
  (void)k_ok;
  // What every harness run does beside the knobs (docs/groundtruth.md, "What is
  // measured"): model(input_ids=..., labels=...) with no attention_mask, and
  // config.use_cache = False set before training, and the model built with
  // from_config directly on the GPU, except QLoRA's, which from_pretrained
  // loads and quantizes from saved weights (gtlib/worker.py build_model).
  run.setup.attention_mask = false;
  run.setup.use_cache = false;
  run.setup.built_on_gpu = run.setup.finetune != Finetune::kQLora;
  VS_TRY(env, Member(c, rec, "env", "env"));
  if (!env->is_object()) return c.Fail("env", "expected an object");
  run.setup.torch_version = PackageVersion(*env, "torch", run.setup.torch_version);
  run.setup.transformers_version =
      PackageVersion(*env, "transformers", run.setup.transformers_version);
  if (!gpu_override.empty()) {
    run.setup.gpu = std::string(gpu_override);
  } else {
    auto gpu = env->find("gpu");
    if (gpu == env->end() || !gpu->is_object() || !gpu->contains("name") ||
        !(*gpu)["name"].is_string()) {
      return c.Fail("env.gpu.name", "missing (pass --gpu NAME)");
    }
    run.setup.gpu = (*gpu)["name"].get<std::string>();
  }
  if (status_s == "ok") {
    VS_TRY(m_ok, ParseMemory(c, rec, &run));
    (void)m_ok;
  }
  return std::optional<MeasuredRun>{std::move(run)};
}

// Calls visit(line_no, line) for each line that is not blank, in order,
// until it returns false.
template <typename Visit>
void ForEachRecordLine(std::string_view text, Visit visit) {
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    if (!visit(line_no, line)) return;
  }
}

// One non-blank line of a results file: a record, compared or listed.
Status ParseRecordLine(const Ctx& c, std::string_view line, std::string_view gpu_override,
                       MeasuredFile* file) {
  if (auto nul = common::FindNulByte(line)) return c.Fail("line", common::NulByteProblem(*nul));
  if (common::JsonNestsDeeperThan(line, kMaxJsonDepth)) {
    return c.Fail("line", fmt::format("JSON nested deeper than {} levels", kMaxJsonDepth));
  }
  json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (rec.is_discarded()) return c.Fail("line", "not valid JSON");
  VS_TRY(run, ParseRecord(c, rec, gpu_override, &file->not_compared));
  if (run) file->runs.push_back(std::move(*run));
  return Ok{};
}

ErrorStats Stats(const std::vector<double>& errors) {
  ErrorStats s;
  s.count = errors.size();
  std::vector<double> abs_errors;
  for (double e : errors) {
    abs_errors.push_back(std::fabs(e));
    if (e < -0.02) ++s.under_2pct;
    s.worst_under = std::max(s.worst_under, -e);
  }
  s.median_abs = Median(abs_errors);
  s.p90_abs = Percentile(abs_errors, 0.9);
  for (double a : abs_errors) s.max_abs = std::max(s.max_abs, a);
  return s;
}

}  // namespace

Result<MeasuredFile> ParseGroundTruth(std::string_view text, std::string_view label,
                                      std::string_view gpu_override) {
  // Counted before anything is parsed, so an oversized file fails at once.
  size_t records = 0;
  size_t first_over_line = 0;
  size_t long_line = 0, long_line_bytes = 0;
  ForEachRecordLine(text, [&](size_t line_no, std::string_view line) {
    if (line.size() > kMaxRecordBytes) {
      long_line = line_no;
      long_line_bytes = line.size();
      return false;
    }
    if (++records <= kMaxRecordsPerFile) return true;
    first_over_line = line_no;
    return false;
  });
  if (long_line != 0) {
    return Ctx{fmt::format("{}:{}", label, long_line)}.Fail(
        "line", fmt::format("{} bytes is above the limit of {} bytes for one record",
                            long_line_bytes, kMaxRecordBytes));
  }
  if (first_over_line != 0) {
    return Ctx{fmt::format("{}:{}", label, first_over_line)}.Fail(
        "file", fmt::format("more than {} records", kMaxRecordsPerFile));
  }
  MeasuredFile file;
  Status status = Ok{};
  ForEachRecordLine(text, [&](size_t line_no, std::string_view line) {
    Ctx c{fmt::format("{}:{}", label, line_no)};
    status = ParseRecordLine(c, line, gpu_override, &file);
    return status.ok();
  });
  if (!status.ok()) return status.error();
  return file;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least p of the values at or below it.
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size())));
  rank = std::clamp<size_t>(rank, 1, values.size());
  return values[rank - 1];
}

namespace {

// Models by name as given in the records: each resolved once (a file of
// many records names a few models).
class ModelCache {
 public:
  explicit ModelCache(const ModelIo& io) : io_(io) {}
  const Result<ModelSpec>& Get(const std::string& name) {
    auto it = models_.find(name);
    if (it == models_.end()) it = models_.emplace(name, ResolveModel(name, io_)).first;
    return it->second;
  }

 private:
  const ModelIo& io_;
  std::map<std::string, Result<ModelSpec>> models_;
};

// The work budget of a whole validation (docs/hardening.md): the bound on
// the events of every record's estimate, summed before any is estimated.
// Records whose model does not resolve or whose own budget is exceeded fail
// on their own (a row problem) and add nothing.
Status CheckTotalWork(const std::vector<MeasuredFile>& files, ModelCache& models,
                      uint64_t max_events) {
  const uint64_t max_total_events =
      common::CheckedMul(max_events, kBatchBudgetFactor).value_or(UINT64_MAX);
  uint64_t total = 0;
  size_t runs = 0;
  for (const MeasuredFile& f : files) {
    for (const MeasuredRun& run : f.runs) {
      ++runs;
      const Result<ModelSpec>& model = models.Get(run.model);
      if (!model.ok()) continue;
      auto work = EstimateLoweringWork(*model, run.setup);
      if (!work.ok() || work->events > max_events) continue;
      total = common::SaturatingAdd(total, work->events);
    }
  }
  if (total <= max_total_events) return Ok{};
  return MakeError(fmt::format(
      "work budget: the {} records lower to about {} events in all, above the limit of {} ({} x "
      "--max-events; raise --max-events, or validate fewer records at a time)",
      runs, total, max_total_events, kBatchBudgetFactor));
}

}  // namespace

Result<Validation> Validate(std::vector<MeasuredFile> files, const ModelIo& io,
                            uint64_t max_events) {
  ModelCache models(io);
  if (Status s = CheckTotalWork(files, models, max_events); !s.ok()) return s.error();
  Validation v;
  std::vector<double> err_alloc, err_reserved, err_device;
  EstimateOptions options;
  options.timeline = false;
  options.top_allocations = 0;
  for (MeasuredFile& f : files) {
    for (auto& line : f.not_compared) v.not_compared.push_back(std::move(line));
    for (MeasuredRun& run : f.runs) {
      ValidationRow row;
      row.run = std::move(run);
      row.run.setup.max_events = max_events;
      row.knobs = {{"model", row.run.model}};
      for (auto& kv : DescribeSetup(row.run.setup)) row.knobs.push_back(std::move(kv));
      const Result<ModelSpec>& model = models.Get(row.run.model);
      if (!model.ok()) {
        row.problem = model.error().message;
      } else if (auto est = Estimate(*model, row.run.setup, options); !est.ok()) {
        row.problem = est.error().message;
      } else {
        const Report& r = est->report;
        row.estimated = true;
        row.predicted_allocated_bytes = FullPeakAllocatedBytes(r.worst());
        row.predicted_reserved_bytes = r.worst().sim.peak_reserved_bytes;
        row.predicted_device_bytes = r.needed_bytes();
        row.predicted_fits = r.fits();
      }
      if (row.estimated && row.run.status == "ok") {
        err_alloc.push_back(
            RelativeError(row.predicted_allocated_bytes, row.run.peak_allocated_bytes));
        err_reserved.push_back(
            RelativeError(row.predicted_reserved_bytes, row.run.peak_reserved_bytes));
        err_device.push_back(RelativeError(row.predicted_device_bytes, row.run.device_bytes));
        if (!row.predicted_fits) ++v.fits_mispredicted;
      }
      if (row.run.status == "oom") {
        ++v.oom_runs;
        if (row.estimated && !row.predicted_fits) ++v.oom_predicted;
      }
      v.rows.push_back(std::move(row));
    }
  }
  v.allocated = Stats(err_alloc);
  v.reserved = Stats(err_reserved);
  v.device = Stats(err_device);
  return v;
}

namespace {

// "known_gaps": {"<12-hex id>": "why it is outside the gate", ...}
Status ParseKnownGaps(const Ctx& c, const json& v,
                      std::vector<std::pair<std::string, std::string>>* gaps) {
  if (!v.is_object()) return c.Fail("known_gaps", "expected an object of id: reason");
  for (const auto& [id, why] : v.items()) {
    const bool hex =
        id.size() == 12 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!hex) return c.Fail("known_gaps", fmt::format("'{}' is not a 12-hex record id", id));
    if (!why.is_string() || why.get<std::string>().empty()) {
      return c.Fail("known_gaps." + id, "expected the reason (a non-empty string)");
    }
    gaps->emplace_back(id, why.get<std::string>());
  }
  return Ok{};
}

bool IsKnownGap(const Thresholds& t, const std::string& id) {
  for (const auto& [gap, why] : t.known_gaps) {
    if (gap == id) return true;
  }
  return false;
}

}  // namespace

Result<Thresholds> ParseThresholds(std::string_view text, std::string_view label) {
  Ctx c{std::string(label)};
  if (auto nul = common::FindNulByte(text)) return c.Fail("file", common::NulByteProblem(*nul));
  if (common::JsonNestsDeeperThan(text, kMaxJsonDepth)) {
    return c.Fail("file", fmt::format("JSON nested deeper than {} levels", kMaxJsonDepth));
  }
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return c.Fail("file", "not a JSON object");
  Thresholds t;
  struct Limits {
    const char* key;
    std::optional<double>*median, *max, *under;
  };
  const Limits groups[] = {
      {"peak_allocated", &t.allocated_median_abs, &t.allocated_max_abs, &t.allocated_max_under},
      {"peak_reserved", &t.reserved_median_abs, &t.reserved_max_abs, &t.reserved_max_under},
      {"device", &t.device_median_abs, &t.device_max_abs, &t.device_max_under},
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "comment") continue;
    if (key == "known_gaps") {
      if (Status st = ParseKnownGaps(c, v, &t.known_gaps); !st.ok()) return st.error();
      continue;
    }
    if (key == "require_oom_predicted") {
      if (!v.is_boolean()) return c.Fail(key, "expected true or false");
      t.require_oom_predicted = v.get<bool>();
      continue;
    }
    const Limits* g = nullptr;
    for (const Limits& cand : groups) {
      if (key == cand.key) g = &cand;
    }
    if (g == nullptr) return c.Fail(key, "unknown key");
    if (!v.is_object()) return c.Fail(key, "expected an object");
    for (const auto& [lk, lv] : v.items()) {
      const std::string path = key + "." + lk;
      if (!lv.is_number() || lv.get<double>() < 0 || lv.get<double>() > 10) {
        return c.Fail(path, "expected a fraction between 0 and 10");
      }
      if (lk == "median_abs_error")
        *g->median = lv.get<double>();
      else if (lk == "max_abs_error")
        *g->max = lv.get<double>();
      else if (lk == "max_under_estimate")
        *g->under = lv.get<double>();
      else
        return c.Fail(path, "unknown limit (median_abs_error, max_abs_error, max_under_estimate)");
    }
  }
  return t;
}

namespace {

// The error statistics of the compared records outside t.known_gaps; the
// known gaps that no longer miss (every error within the limits' max) go to
// `stale`. A gap naming no record here is no failure: the same thresholds
// file serves other measurements (tests/accuracy_test.py checks that every
// gap names a committed record).
void GateStats(const Validation& v, const Thresholds& t, ErrorStats out[3],
               std::vector<std::string>* stale) {
  std::vector<double> errors[3];
  for (const ValidationRow& row : v.rows) {
    if (!row.estimated || row.run.status != "ok") continue;
    const double e[3] = {RelativeError(row.predicted_allocated_bytes, row.run.peak_allocated_bytes),
                         RelativeError(row.predicted_reserved_bytes, row.run.peak_reserved_bytes),
                         RelativeError(row.predicted_device_bytes, row.run.device_bytes)};
    if (!IsKnownGap(t, row.run.id)) {
      for (int i = 0; i < 3; ++i) errors[i].push_back(e[i]);
      continue;
    }
    const std::optional<double> max[3] = {t.allocated_max_abs, t.reserved_max_abs,
                                          t.device_max_abs};
    bool misses = false;
    for (int i = 0; i < 3; ++i) misses = misses || (max[i] && std::fabs(e[i]) > *max[i]);
    if (!misses) {
      stale->push_back(
          fmt::format("known gap {} is within every limit now: remove it", row.run.id));
    }
  }
  for (int i = 0; i < 3; ++i) out[i] = Stats(errors[i]);
}

}  // namespace

std::vector<std::string> CheckThresholds(const Validation& v, const Thresholds& t) {
  std::vector<std::string> failures;
  ErrorStats gated[3];
  GateStats(v, t, gated, &failures);
  auto check = [&](const char* what, const ErrorStats& s, const std::optional<double>& median,
                   const std::optional<double>& max, const std::optional<double>& under) {
    if (s.count == 0) return;
    if (median && s.median_abs > *median) {
      failures.push_back(fmt::format("{}: median |error| {:.2f}% > {:.2f}%", what,
                                     100 * s.median_abs, 100 * *median));
    }
    if (max && s.max_abs > *max) {
      failures.push_back(
          fmt::format("{}: max |error| {:.2f}% > {:.2f}%", what, 100 * s.max_abs, 100 * *max));
    }
    if (under && s.worst_under > *under) {
      failures.push_back(fmt::format("{}: an under-estimate of {:.2f}% > {:.2f}%", what,
                                     100 * s.worst_under, 100 * *under));
    }
  };
  check("peak allocated", gated[0], t.allocated_median_abs, t.allocated_max_abs,
        t.allocated_max_under);
  check("peak reserved", gated[1], t.reserved_median_abs, t.reserved_max_abs, t.reserved_max_under);
  check("device", gated[2], t.device_median_abs, t.device_max_abs, t.device_max_under);
  if (t.require_oom_predicted && v.oom_predicted < v.oom_runs) {
    failures.push_back(fmt::format("out of memory: {} of {} measured OOMs predicted to fit",
                                   v.oom_runs - v.oom_predicted, v.oom_runs));
  }
  for (const ValidationRow& row : v.rows) {
    if (!row.estimated)
      failures.push_back(fmt::format("{}: could not estimate: {}", row.run.where, row.problem));
  }
  return failures;
}

}  // namespace vramscope
