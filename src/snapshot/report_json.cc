#include "report_json.h"

#include "vramscope/result.h"

namespace vramscope::snapshot {

std::string AppendJsonMember(std::string report_json, std::string_view key,
                             const nlohmann::ordered_json& value) {
  using Json = nlohmann::ordered_json;
  constexpr std::string_view kObjectEnd = "\n}\n";
  const std::string key_json = Json(std::string(key)).dump();
  VS_CHECK(report_json.size() > kObjectEnd.size() && report_json.ends_with(kObjectEnd));
  VS_CHECK(report_json.find("\n  " + key_json + ": ") == std::string::npos);
  report_json.resize(report_json.size() - kObjectEnd.size());
  report_json += ",\n  ";
  report_json += key_json;
  report_json += ": ";
  for (const char c : value.dump(2, ' ', false, Json::error_handler_t::replace)) {
    report_json += c;
    if (c == '\n') report_json += "  ";
  }
  report_json += kObjectEnd;
  return report_json;
}

}  // namespace vramscope::snapshot
