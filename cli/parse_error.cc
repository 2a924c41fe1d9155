// ParseErrorMessage: a command-line parse error as the one line users read.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "output.h"
#include "vramscope/common/quote.h"

namespace vramscope::cli {
namespace {

// A flag as typed: "--x" or "-x", not a negative number ("-2" is a value).
bool LooksLikeFlag(std::string_view arg) {
  return arg.size() > 1 && arg[0] == '-' && !(arg[1] >= '0' && arg[1] <= '9') && arg[1] != '.';
}

// Levenshtein distance, for "did you mean".
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known flag nearest to `typed` (at most 2 edits, or a prefix of it), "" if none.
std::string NearestFlag(const CLI::App& app, std::string_view typed) {
  const std::string_view name = typed.substr(0, typed.find('='));
  std::string best;
  size_t best_distance = 3;
  std::vector<const CLI::App*> apps = {&app};
  for (const CLI::App* sub : app.get_subcommands()) apps.push_back(sub);
  for (const CLI::App* a : apps) {
    for (const CLI::Option* option : a->get_options()) {
      for (const std::string& lname : option->get_lnames()) {
        const std::string flag = "--" + lname;
        const size_t d = flag.rfind(name, 0) == 0 ? 1 : EditDistance(name, flag);
        if (d < best_distance) best = flag, best_distance = d;
      }
    }
  }
  return best;
}

}  // namespace

std::string ParseErrorMessage(const CLI::App& app, const CLI::ParseError& error) {
  if (dynamic_cast<const CLI::ExtrasError*>(&error) == nullptr) return OneLine(error.what());
  // CLI11 2.1 lists the leftovers of a reversed argument list ("8 --lora-rnk"
  // for `--lora-rnk 8`): an unknown flag is the news, its value follows it.
  const std::vector<std::string> left = app.remaining(true);
  for (auto it = left.rbegin(); it != left.rend(); ++it) {
    if (!LooksLikeFlag(*it)) continue;
    const std::string_view flag = std::string_view(*it).substr(0, it->find('='));
    const std::string shown = common::QuoteForMessage(flag, common::kQuotedBytes, '\0');
    const std::string nearest = NearestFlag(app, *it);
    return nearest.empty() ? fmt::format("unknown flag {}", shown)
                           : fmt::format("unknown flag {} (did you mean {}?)", shown, nearest);
  }
  std::string args;
  for (auto it = left.rbegin(); it != left.rend(); ++it) {
    args += (args.empty() ? "" : " ") + common::QuoteForMessage(*it, common::kQuotedBytes, '\0');
  }
  return fmt::format("unexpected argument{} {}", left.size() > 1 ? "s" : "", args);
}

}  // namespace vramscope::cli
