// YAML to nlohmann::json through libyaml's event parser (no recursion: the
// open mappings and sequences are an explicit stack, bounded by max_depth).
#include "yaml_json.h"

#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#ifdef VS_HAVE_YAML
#include <yaml.h>
#endif

namespace vramscope::cli {
namespace yamljson {

using Json = nlohmann::json;

// YAML 1.1 plain-scalar resolution as PyYAML's SafeLoader does it, for the
// forms config files use; anything else stays a string.
Json PlainScalar(std::string_view s) {
  static constexpr std::string_view kNull[] = {"", "~", "null", "Null", "NULL"};
  static constexpr std::string_view kTrue[] = {"true", "True", "TRUE", "yes", "Yes",
                                               "YES",  "on",   "On",   "ON"};
  static constexpr std::string_view kFalse[] = {"false", "False", "FALSE", "no", "No",
                                                "NO",    "off",   "Off",   "OFF"};
  for (std::string_view v : kNull) {
    if (s == v) return Json(nullptr);
  }
  for (std::string_view v : kTrue) {
    if (s == v) return Json(true);
  }
  for (std::string_view v : kFalse) {
    if (s == v) return Json(false);
  }
  std::string digits;
  for (char c : s) {
    if (c != '_') digits += c;  // PyYAML allows 1_000_000
  }
  const std::string_view body = digits.size() && (digits[0] == '-' || digits[0] == '+')
                                    ? std::string_view(digits).substr(1)
                                    : std::string_view(digits);
  // A leading 0 is octal in YAML 1.1 (PyYAML: 010 is 8); like 0x.., 0b.. and
  // 1:30 (base 60) it stays a string here, an error where a number is due.
  const bool all_digits = !body.empty() && body.find_first_not_of("0123456789") == body.npos &&
                          (body.size() == 1 || body[0] != '0');
  if (all_digits && body.size() <= 18) return Json(std::strtoll(digits.c_str(), nullptr, 10));
  if (all_digits) return Json(std::strtod(digits.c_str(), nullptr));
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    return Json(digits[0] == '-' ? -INFINITY : INFINITY);
  }
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return Json(NAN);
  // A float needs a dot (YAML 1.1: "1e9" is a string, "1.0e+9" a float).
  if (body.find('.') != body.npos && body.find_first_of("0123456789") != body.npos &&
      body.find_first_not_of("0123456789.eE+-") == body.npos) {
    char* end = nullptr;
    const double v = std::strtod(digits.c_str(), &end);
    if (end == digits.c_str() + digits.size()) return Json(v);
  }
  return Json(std::string(s));
}

#ifdef VS_HAVE_YAML

// A scalar key that is not a string, as the mapping's (string) key: YAML's
// own spelling for the non-finite floats, which JSON would write as null.
std::string KeyText(const Json& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    const double d = v.get<double>();
    return std::isnan(d) ? ".nan" : d < 0 ? "-.inf" : ".inf";
  }
  return v.dump();
}

// One open mapping or sequence: the value, and for a mapping the key read
// last (its value comes next).
struct Open {
  Json value;
  std::string key;
  bool have_key = false;
};

struct Builder {
  size_t max_values = 0, values_left = 0;
  std::vector<Open> stack;
  Json document;
  bool done = false;  // the document's root is complete

  // Adds a finished value to the innermost open node (or as the root).
  Status Add(Json v) {
    if (stack.empty()) {
      document = std::move(v);
      done = true;
      return Ok{};
    }
    Open& top = stack.back();
    if (top.value.is_array()) {
      top.value.push_back(std::move(v));
    } else if (!top.have_key) {
      if (!v.is_string() && !v.is_number() && !v.is_boolean() && !v.is_null()) {
        return MakeError("a mapping key that is not a scalar is not supported");
      }
      top.key = v.is_string() ? v.get<std::string>() : v.is_null() ? "null" : KeyText(v);
      top.have_key = true;
    } else {
      top.value[top.key] = std::move(v);  // a repeated key: the last wins, as in PyYAML
      top.have_key = false;
    }
    return Ok{};
  }
};

Error Refused(const yaml_event_t& e, std::string_view what) {
  return MakeError(fmt::format("line {}: {} not supported (plain mappings, sequences and scalars)",
                               e.start_mark.line + 1, what));
}

// Anchors and tags on a node; aliases are their own event.
Status CheckNode(const yaml_event_t& e) {
  const yaml_char_t* anchor = nullptr;
  const yaml_char_t* tag = nullptr;
  if (e.type == YAML_SCALAR_EVENT) {
    anchor = e.data.scalar.anchor;
    tag = e.data.scalar.tag;
  } else if (e.type == YAML_MAPPING_START_EVENT) {
    anchor = e.data.mapping_start.anchor;
    tag = e.data.mapping_start.tag;
  } else if (e.type == YAML_SEQUENCE_START_EVENT) {
    anchor = e.data.sequence_start.anchor;
    tag = e.data.sequence_start.tag;
  }
  if (anchor) return Refused(e, "an anchor (&) is");
  if (tag) return Refused(e, "a tag (!) is");
  return Ok{};
}

// One event into the builder; *end is set at the end of the stream.
Status Step(const yaml_event_t& e, size_t max_depth, Builder* b, bool* end) {
  if (Status st = CheckNode(e); !st.ok()) return st;
  if (e.type == YAML_SCALAR_EVENT || e.type == YAML_MAPPING_START_EVENT ||
      e.type == YAML_SEQUENCE_START_EVENT) {
    if (b->values_left == 0) {
      return MakeError(fmt::format("line {}: more values than a config holds (the limit is {})",
                                   e.start_mark.line + 1, b->max_values));
    }
    --b->values_left;
  }
  switch (e.type) {
    case YAML_STREAM_END_EVENT: *end = true; return Ok{};
    case YAML_DOCUMENT_START_EVENT:
      if (b->done) return Refused(e, "a second document (---) is");
      return Ok{};
    case YAML_ALIAS_EVENT: return Refused(e, "an alias (*) is");
    case YAML_SCALAR_EVENT: {
      const std::string_view s(reinterpret_cast<const char*>(e.data.scalar.value),
                               e.data.scalar.length);
      const bool plain = e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
      return b->Add(plain ? PlainScalar(s) : Json(std::string(s)));
    }
    case YAML_MAPPING_START_EVENT:
    case YAML_SEQUENCE_START_EVENT:
      if (b->stack.size() >= max_depth) {
        return MakeError(fmt::format("nested deeper than {} levels", max_depth));
      }
      b->stack.push_back(
          {e.type == YAML_MAPPING_START_EVENT ? Json::object() : Json::array(), "", false});
      return Ok{};
    case YAML_MAPPING_END_EVENT:
    case YAML_SEQUENCE_END_EVENT: {
      Json v = std::move(b->stack.back().value);
      b->stack.pop_back();
      return b->Add(std::move(v));
    }
    default: return Ok{};  // stream start, document end
  }
}

#endif  // VS_HAVE_YAML

}  // namespace yamljson

#ifdef VS_HAVE_YAML

bool YamlSupported() { return true; }

Result<nlohmann::json> YamlToJson(const std::string& text, size_t max_depth, size_t max_values) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return MakeError("libyaml: out of memory");
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text.data()),
                               text.size());
  yamljson::Builder b;
  b.max_values = b.values_left = max_values;
  Status status = Ok{};
  for (bool end = false; !end && status.ok();) {
    yaml_event_t e;
    if (!yaml_parser_parse(&parser, &e)) {
      status = MakeError(fmt::format("not valid YAML (line {}, column {}: {})",
                                     parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                                     parser.problem ? parser.problem : "unknown problem"));
      break;
    }
    status = yamljson::Step(e, max_depth, &b, &end);
    yaml_event_delete(&e);
  }
  yaml_parser_delete(&parser);
  if (!status.ok()) return status.error();
  return std::move(b.document);
}

#else

bool YamlSupported() { return false; }

Result<nlohmann::json> YamlToJson(const std::string&, size_t, size_t) {
  return MakeError(
      "a YAML file, and this vramscope was built without libyaml (libyaml-dev, scripts/deps.sh)");
}

#endif

}  // namespace vramscope::cli
