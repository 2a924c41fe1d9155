// RenderTimelineCsv: the timeline as a table for spreadsheets and plotting
// scripts. RFC 4180 quoting; integer bytes; "\n" line ends.
#include <iterator>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "report_format.h"
#include "vramscope/report.h"

namespace vramscope {
namespace {

// Quotes a field when it holds a comma, a quote or a line break (RFC 4180).
std::string CsvField(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

void AppendRows(const RankReport& rank, bool with_rank_class, std::string* out) {
  const std::string rank_class = CsvField(report_internal::SanitizeText(rank.rank_class));
  for (const TimelinePoint& p : rank.sim.timeline) {
    if (with_rank_class) {
      out->append(rank_class);
      out->push_back(',');
    }
    fmt::format_to(std::back_inserter(*out), "{},{},{},{},{}", p.event_index, p.step,
                   PhaseName(p.phase), p.allocated_bytes, p.reserved_bytes);
    for (uint64_t bytes : p.by_category) fmt::format_to(std::back_inserter(*out), ",{}", bytes);
    out->push_back('\n');
  }
}

}  // namespace

std::string RenderTimelineCsv(const Report& report) {
  // One rank class: its rows as they are. Several: a leading rank_class column
  // so one file holds them all and filters by class.
  const bool several = report.ranks.size() > 1;
  std::string out = several ? "rank_class," : "";
  out += "event_index,step,phase,allocated_bytes,reserved_bytes";
  for (Category c : kAllCategories) {
    out += ',';
    out += CategoryJsonKey(c);
  }
  out += '\n';
  if (several) {
    for (const RankReport& rank : report.ranks) AppendRows(rank, true, &out);
  } else if (!report.ranks.empty()) {
    AppendRows(report.ranks.front(), false, &out);
  }
  return out;
}

}  // namespace vramscope
