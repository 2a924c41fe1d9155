// JSON snapshots: the same structure as the pickle, as MemoryViz.js accepts
// it (it tries JSON before pickle). nlohmann::json's SAX parser feeds a
// handler that builds the compact Document directly, so no json DOM (which
// would cost ~10x the text) is ever built; the parser keeps its own nesting
// on a heap stack, so deep input cannot overflow the call stack.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

#include "entry_decoder.h"
#include "readers.h"
#include "vramscope/common/json_depth.h"
#include "vramscope/common/quote.h"

namespace vramscope::snapshot {
namespace {

// nlohmann::json's parse error quotes the token it read, which can be the
// whole of a long string: show this much of the message.
constexpr size_t kMaxParseErrorBytesShown = 200;

class Builder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  Builder(std::string_view name, const SnapshotReadLimits& limits, uint64_t input_bytes)
      : name_(name),
        limits_(limits),
        budget_(MemoryBudgetBytes(limits, input_bytes)),
        max_items_(std::min<uint64_t>(limits.max_container_items, 0xffffffffu)),
        doc_(input_bytes) {}

  bool null() override { return Add(Value::None()); }
  bool boolean(bool b) override { return Add(Value::Bool(b)); }
  bool number_integer(number_integer_t v) override { return Add(doc_.AddInt(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Add(doc_.AddUint(v)); }
  bool number_float(number_float_t v, const string_t&) override { return Add(doc_.AddFloat(v)); }
  bool string(string_t& s) override { return AddString(s); }
  bool binary(binary_t&) override { return Fail("binary values are not JSON"); }
  bool key(string_t& s) override { return AddString(s); }
  bool start_object(std::size_t) override { return Open(Kind::kDict); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(Kind::kList); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    std::string what = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, ..." -> "parse error at ..."
    if (const size_t close = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
      what = what.substr(close + 2);
    }
    // The message quotes the offending token: keep the error one printable
    // line of bounded length.
    error_ = fmt::format("{}: JSON: {} (byte {})", name_,
                         common::QuoteForMessage(what, kMaxParseErrorBytesShown, '\0'), position);
    return false;
  }

  Result<Document> Finish() {
    if (!error_.empty()) return MakeError(error_);
    if (words_.size() != 1 || !open_.empty()) {
      return MakeError(fmt::format("{}: JSON: no complete value", name_));
    }
    doc_.set_root(Value::FromBits(words_[0]));
    return std::move(doc_);
  }
  const std::string& error() const { return error_; }

 private:
  bool Fail(const std::string& problem) {
    if (error_.empty()) error_ = fmt::format("{}: JSON: {}", name_, problem);
    return false;
  }
  bool Add(Value v) {
    words_.push_back(v.bits());
    return true;
  }
  bool AddString(const std::string& s) {
    const Value v = Intern(s);
    return error_.empty() && Add(v);
  }
  // Keys and short values repeat in every trace entry: store each once.
  Value Intern(const std::string& s) {
    if (s.size() > limits_.max_string_bytes) {
      Fail(fmt::format("a string of {} bytes is over the limit (max_string_bytes)", s.size()));
      return Value::None();
    }
    if (s.size() > 64) return doc_.AddString(Kind::kStr, s);
    auto it = interned_.find(s);
    if (it != interned_.end()) return it->second;
    const Value v = doc_.AddString(Kind::kStr, s);
    interned_.emplace(s, v);
    return v;
  }
  bool Open(Kind kind) {
    if (open_.size() >= limits_.max_depth) {
      return Fail(fmt::format("values nest deeper than {} levels (max_depth)", limits_.max_depth));
    }
    open_.push_back(OpenContainer{kind, words_.size()});
    return true;
  }
  bool Close() {
    const OpenContainer c = open_.back();
    open_.pop_back();
    const uint64_t n = words_.size() - c.begin;
    if (n > max_items_) {
      return Fail(fmt::format("a {} of {} items is over the limit (max_container_items)",
                              KindName(c.kind), n));
    }
    Value v;
    if (!(c.kind == Kind::kDict && limits_.compact_trace_entries &&
          DecodeEntry(words_.data() + c.begin, n, &v))) {
      v = doc_.NewContainer(c.kind);
      doc_.Append(v, words_.data() + c.begin, n);
    }
    words_.resize(c.begin);
    words_.push_back(v.bits());
    const uint64_t used = doc_.MemoryBytes() + words_.capacity() * 8 + interned_.size() * 96;
    if (used > budget_) {
      return Fail(fmt::format("the decoded values would need more than {} bytes (max_memory_bytes)",
                              budget_));
    }
    return error_.empty();
  }

  // A completed object that is a trace entry becomes a record (see
  // entry_decoder.h); JSON has no references, so no container is needed.
  bool DecodeEntry(const uint64_t* pairs, uint64_t n, Value* entry) {
    EntryFields f;
    if (!decoder_.Scan(doc_, pairs, n, &f) || !f.has_action) return false;
    TraceEntry e;
    if (!decoder_.TryDecode(doc_, f, &e) || doc_.num_entries() >= 0xffffffffu) return false;
    const bool frames = f.has_frames && e.action != TraceAction::kOther;
    *entry = doc_.AddEntry(e, frames ? f.frames : Value::None());
    return true;
  }

  struct OpenContainer {
    Kind kind;
    uint64_t begin;
  };
  std::string_view name_;
  const SnapshotReadLimits& limits_;
  uint64_t budget_;
  uint64_t max_items_;
  Document doc_;
  std::vector<uint64_t> words_;  // items of the open containers, innermost last
  std::vector<OpenContainer> open_;
  std::unordered_map<std::string, Value> interned_;
  EntryDecoder decoder_;
  std::string error_;
};

}  // namespace

Result<Document> ParseJson(std::string_view text, std::string_view name,
                           const SnapshotReadLimits& limits) {
  if (auto nul = common::FindNulByte(text)) {
    return MakeError(fmt::format("{}: JSON: {}", name, common::NulByteProblem(*nul)));
  }
  Builder builder(name, limits, text.size());
  try {
    const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
    if (!ok && builder.error().empty())
      return MakeError(fmt::format("{}: JSON: parse error", name));
  } catch (const std::exception& e) {
    return MakeError(fmt::format("{}: JSON: {}", name, e.what()));
  }
  return builder.Finish();
}

}  // namespace vramscope::snapshot
