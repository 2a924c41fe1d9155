// Hostile input: truncation at every byte, binary garbage, huge lines. The
// reader must return (never crash or hang) and every error must be one
// printable line that starts with "NAME:LINE: ".
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"
#include "vramscope/event_io.h"

namespace vramscope {
namespace {

using events_test::DocExample;

// Error messages are single printable lines (no control bytes from input).
void ExpectWellFormedError(const Result<EventStream>& result) {
  ASSERT_FALSE(result.ok());
  const std::string& message = result.error().message;
  ASSERT_EQ(message.rfind("t.ev:", 0), 0u) << message;
  for (char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    ASSERT_TRUE(byte >= 0x20 && byte < 0x7f) << "unprintable byte in: " << message;
  }
  EXPECT_LT(message.size(), 300u) << message;
}

size_t CountLines(std::string_view text) {
  size_t lines = 0;
  for (size_t pos = 0; pos < text.size(); ++lines) {
    const size_t newline = text.find('\n', pos);
    pos = newline == std::string_view::npos ? text.size() : newline + 1;
  }
  return lines;
}

// A file cut anywhere either parses (the cut fell on a record boundary or
// left a valid prefix of one) or fails on its last, cut line.
TEST(EventReaderRobustness, TruncatedAtEveryByte) {
  const std::string text = DocExample();
  ASSERT_FALSE(text.empty());
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const std::string_view prefix(text.data(), cut);
    const Result<EventStream> result = ParseEventText(prefix, "t.ev");
    if (result.ok()) continue;
    ExpectWellFormedError(result);
    const size_t last_line = std::max<size_t>(1, CountLines(prefix));
    EXPECT_EQ(result.error().message.rfind("t.ev:" + std::to_string(last_line) + ":", 0), 0u)
        << "cut at " << cut << ": " << result.error().message;
  }
}

TEST(EventReaderRobustness, BinaryGarbageWithoutHeader) {
  std::mt19937_64 rng(1);
  for (int round = 0; round < 200; ++round) {
    std::string garbage(1 + rng() % 4096, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    ExpectWellFormedError(ParseEventText(garbage, "t.ev"));
  }
}

TEST(EventReaderRobustness, BinaryGarbageAfterHeader) {
  std::mt19937_64 rng(2);
  for (int round = 0; round < 200; ++round) {
    std::string text = "vramscope-events 1\n";
    const size_t n = 1 + rng() % 4096;
    for (size_t i = 0; i < n; ++i) text.push_back(static_cast<char>(rng()));
    const Result<EventStream> result = ParseEventText(text, "t.ev");
    if (!result.ok()) ExpectWellFormedError(result);
  }
}

// Garbage made of the format's own tokens reaches deeper rules than random
// bytes; whatever parses must also pass Validate().
TEST(EventReaderRobustness, ShuffledTokens) {
  const char* tokens[] = {"a",
                          "f",
                          "p",
                          "e",
                          "s",
                          "meta",
                          "1",
                          "2",
                          "0",
                          "-1",
                          "act",
                          "param",
                          "forward",
                          "18446744073709551616",
                          "4611686018427387905",
                          "#",
                          "\t",
                          "x",
                          "\r"};
  std::mt19937_64 rng(3);
  for (int round = 0; round < 2000; ++round) {
    std::string text = "vramscope-events 1\n";
    const int lines = 1 + static_cast<int>(rng() % 12);
    for (int line = 0; line < lines; ++line) {
      const int count = 1 + static_cast<int>(rng() % 5);
      for (int t = 0; t < count; ++t) {
        text += tokens[rng() % std::size(tokens)];
        text += ' ';
      }
      text += '\n';
    }
    const Result<EventStream> result = ParseEventText(text, "t.ev");
    if (result.ok()) {
      EXPECT_TRUE(result->Validate().ok()) << text;
    } else {
      ExpectWellFormedError(result);
    }
  }
}

TEST(EventReaderRobustness, VeryLongLineWithoutNewline) {
  std::string text = "vramscope-events 1\na 1 ";
  text.append(size_t{1} << 22, '9');  // 4 MiB of digits, no newline
  const Result<EventStream> result = ParseEventText(text, "t.ev");
  ExpectWellFormedError(result);
  EXPECT_EQ(result.error().message, "t.ev:2: line is longer than 65536 bytes");
}

TEST(EventReaderRobustness, LongestAcceptedNumberTokenIsStillChecked) {
  // 60 000 digits fit in a line but not in 64 bits.
  std::string text = "vramscope-events 1\na 1 ";
  text.append(60000, '9');
  text += " act\n";
  const Result<EventStream> result = ParseEventText(text, "t.ev");
  ExpectWellFormedError(result);
  EXPECT_EQ(result.error().message,
            "t.ev:2: alloc size: '9999999999999999999999999999999999999999'... is out of range "
            "(the limit is 2^62 bytes)");
}

TEST(EventReaderRobustness, ManyLinesOfOnlyNewlines) {
  const std::string text = "vramscope-events 1\n" + std::string(1 << 20, '\n');
  const Result<EventStream> result = ParseEventText(text, "t.ev");
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->size(), 0u);
}

// The fuzzer's seed corpus (valid files and near misses) doubles as a
// regression suite: every file gives a well-formed error or a stream that
// survives a write/read round trip. Inputs that once crashed the fuzzer are
// added to that folder, so they are replayed here on every test run.
TEST(EventReaderRobustness, FuzzCorpusFiles) {
  const std::filesystem::path dir =
      std::filesystem::path(VS_SOURCE_DIR) / "fuzz" / "corpus" / "event_reader";
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    SCOPED_TRACE(entry.path().filename().string());
    const Result<EventStream> result = ParseEventText(buffer.str(), "t.ev");
    ++files;
    if (!result.ok()) {
      ExpectWellFormedError(result);
      continue;
    }
    const std::string written = WriteEventText(*result);
    const Result<EventStream> reread = ParseEventText(written, "t.ev");
    ASSERT_TRUE(reread.ok()) << reread.error().message;
    EXPECT_EQ(reread->size(), result->size());
    EXPECT_EQ(WriteEventText(*reread), written);
  }
  EXPECT_GE(files, 10u);
}

}  // namespace
}  // namespace vramscope
