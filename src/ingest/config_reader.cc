#include "config_reader.h"

#include <cmath>

#include <fmt/format.h>

namespace vramscope::ingest {

using nlohmann::json;

std::string DescribeJson(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case json::value_t::string:
      return "string " + common::QuoteForMessage(value.get_ref<const std::string&>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return fmt::format("number {}", value.dump());
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a non-JSON value";
  }
}

ConfigReader::ConfigReader(const json& object, std::string context)
    : object_(object), context_(std::move(context)) {}

const json* ConfigReader::Find(std::string_view key) const {
  if (!object_.is_object()) return nullptr;
  auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

bool ConfigReader::Has(std::string_view key) const {
  const json* v = Find(key);
  return v != nullptr && !v->is_null();
}

bool ConfigReader::IsNull(std::string_view key) const {
  const json* v = Find(key);
  return v != nullptr && v->is_null();
}

void ConfigReader::Fail(std::string_view field, std::string_view problem) {
  if (error_) return;
  error_ = MakeError(fmt::format("{}: {}: {}", context_, field, problem));
}

std::optional<uint64_t> ConfigReader::OptUint(std::string_view key, uint64_t min, uint64_t max) {
  const json* v = Find(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_number_integer()) {
    Fail(key, fmt::format("expected an integer, got {}", DescribeJson(*v)));
    return std::nullopt;
  }
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u < min || u > max) {
      Fail(key, fmt::format("{} is out of range [{}, {}]", u, min, max));
      return std::nullopt;
    }
    return u;
  }
  int64_t i = v->get<int64_t>();
  if (i < 0 || static_cast<uint64_t>(i) < min || static_cast<uint64_t>(i) > max) {
    Fail(key, fmt::format("{} is out of range [{}, {}]", i, min, max));
    return std::nullopt;
  }
  return static_cast<uint64_t>(i);
}

uint64_t ConfigReader::Uint(std::string_view key, uint64_t def, uint64_t min, uint64_t max) {
  return OptUint(key, min, max).value_or(def);
}

std::optional<uint64_t> ConfigReader::OptUintAny(std::initializer_list<std::string_view> keys,
                                                 uint64_t min, uint64_t max) {
  for (std::string_view key : keys) {
    if (Has(key)) return OptUint(key, min, max);
  }
  return std::nullopt;
}

bool ConfigReader::Bool(std::string_view key, bool def) {
  const json* v = Find(key);
  if (v == nullptr || v->is_null()) return def;
  if (!v->is_boolean()) {
    Fail(key, fmt::format("expected true or false, got {}", DescribeJson(*v)));
    return def;
  }
  return v->get<bool>();
}

double ConfigReader::Number(std::string_view key, double def, double min, double max) {
  const json* v = Find(key);
  if (v == nullptr || v->is_null()) return def;
  if (!v->is_number()) {
    Fail(key, fmt::format("expected a number, got {}", DescribeJson(*v)));
    return def;
  }
  double d = v->get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    Fail(key, fmt::format("{} is out of range [{}, {}]", v->dump(), min, max));
    return def;
  }
  return d;
}

std::string ConfigReader::String(std::string_view key, std::string def) {
  const json* v = Find(key);
  if (v == nullptr || v->is_null()) return def;
  if (!v->is_string()) {
    Fail(key, fmt::format("expected a string, got {}", DescribeJson(*v)));
    return def;
  }
  return v->get<std::string>();
}

bool ConfigReader::IsArray(std::string_view key) const {
  const json* v = Find(key);
  return v != nullptr && v->is_array();
}

std::vector<uint64_t> ConfigReader::UintList(std::string_view key, uint64_t max) {
  std::vector<uint64_t> out;
  const json* v = Find(key);
  if (v == nullptr || v->is_null()) return out;
  if (!v->is_array()) {
    Fail(key, fmt::format("expected an array of integers, got {}", DescribeJson(*v)));
    return out;
  }
  for (const json& item : *v) {
    if (!item.is_number_integer() ||
        (item.is_number_integer() && !item.is_number_unsigned() && item.get<int64_t>() < 0)) {
      Fail(key, fmt::format("expected non-negative integers, got {}", DescribeJson(item)));
      return {};
    }
    uint64_t u = item.get<uint64_t>();
    if (u > max) {
      Fail(key, fmt::format("{} is out of range [0, {}]", u, max));
      return {};
    }
    out.push_back(u);
  }
  return out;
}

std::vector<std::string> ConfigReader::StringList(std::string_view key) {
  std::vector<std::string> out;
  const json* v = Find(key);
  if (v == nullptr || v->is_null()) return out;
  if (!v->is_array()) {
    Fail(key, fmt::format("expected an array of strings, got {}", DescribeJson(*v)));
    return out;
  }
  for (const json& item : *v) {
    if (!item.is_string()) {
      Fail(key, fmt::format("expected strings, got {}", DescribeJson(item)));
      return {};
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

void ConfigReader::Adopt(const ConfigReader& nested) {
  if (!error_ && !nested.ok()) error_ = nested.error();
}

const json* ConfigReader::Object(std::string_view key) {
  const json* v = Find(key);
  if (v == nullptr || v->is_null()) return nullptr;
  if (!v->is_object()) {
    Fail(key, fmt::format("expected an object, got {}", DescribeJson(*v)));
    return nullptr;
  }
  return v;
}

}  // namespace vramscope::ingest
