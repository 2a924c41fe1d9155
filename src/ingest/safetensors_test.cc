// Safetensors header reading: valid files and every way a header can lie.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "safetensors.h"
#include "test_util.h"
#include "vramscope/local_io.h"

namespace vramscope::ingest {
namespace {

using testing::FakeTensor;
using testing::IsOneLine;
using testing::MakeSafetensors;

Result<std::vector<SafetensorsTensor>> ParseHeaderBytes(const std::string& bytes) {
  return ParseSafetensorsHeader(bytes, bytes.size(), "w.safetensors");
}

// A file image whose header is `header` verbatim, followed by `data_bytes` zeros.
std::string WithHeader(const std::string& header, uint64_t data_bytes) {
  std::string out(8, '\0');
  testing::SetHeaderLength(out, header.size());
  return out + header + std::string(data_bytes, '\0');
}

std::string HeaderErrorOf(const std::string& bytes) {
  auto r = ParseHeaderBytes(bytes);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_TRUE(IsOneLine(r.error().message)) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("w.safetensors: ", 0), 0u) << r.error().message;
  return r.error().message;
}

TEST(SafetensorsTest, ReadsNamesShapesAndDtypes) {
  std::string bytes = MakeSafetensors({{"a.weight", "BF16", {4, 8}},
                                       {"b.bias", "F32", {8}},
                                       {"scalar", "F16", {}},
                                       {"empty", "I8", {0, 3}}});
  auto r = ParseHeaderBytes(bytes);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].name, "a.weight");
  EXPECT_EQ((*r)[0].dtype, "BF16");
  EXPECT_EQ((*r)[0].shape, (std::vector<uint64_t>{4, 8}));
  EXPECT_EQ((*r)[0].numel, 32u);
  EXPECT_EQ((*r)[1].data_begin, 64u);
  EXPECT_EQ((*r)[2].numel, 1u);  // shape [] is a scalar
}

TEST(SafetensorsTest, HeaderLengthPastTheEndOfTheFile) {
  std::string bytes = MakeSafetensors({{"a", "F32", {2}}});
  testing::SetHeaderLength(bytes, bytes.size());  // lies: longer than what follows
  EXPECT_NE(HeaderErrorOf(bytes).find("runs past the end"), std::string::npos);
}

TEST(SafetensorsTest, HeaderLengthOverTheLimitIsRejectedBeforeReading) {
  std::string bytes(8, '\0');
  testing::SetHeaderLength(bytes, kMaxSafetensorsHeaderBytes + 1);
  // The file claims to be large enough; the limit still applies.
  auto r = ParseSafetensorsHeader(bytes, 1ULL << 40, "w.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("exceeds the 100000000 byte limit"), std::string::npos);
  testing::SetHeaderLength(bytes, ~0ULL);
  EXPECT_FALSE(ParseSafetensorsHeader(bytes, 1ULL << 40, "w.safetensors").ok());
}

TEST(SafetensorsTest, TooShortOrNotJson) {
  EXPECT_NE(HeaderErrorOf("abc").find("too short"), std::string::npos);
  EXPECT_NE(HeaderErrorOf(WithHeader("{not json", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(HeaderErrorOf(WithHeader("[1,2]", 0)).find("not a JSON object"), std::string::npos);
}

TEST(SafetensorsTest, OffsetsMustStayInsideTheDataArea) {
  std::string header = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  EXPECT_TRUE(ParseHeaderBytes(WithHeader(header, 16)).ok());
  EXPECT_NE(HeaderErrorOf(WithHeader(header, 15)).find("past the 15 data bytes"),
            std::string::npos);
}

TEST(SafetensorsTest, SizeMustMatchDtypeTimesShape) {
  std::string header = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}})";
  EXPECT_NE(HeaderErrorOf(WithHeader(header, 8)).find("needs 16"), std::string::npos);
  std::string reversed = R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})";
  EXPECT_NE(HeaderErrorOf(WithHeader(reversed, 8)).find("end before begin"), std::string::npos);
}

TEST(SafetensorsTest, OverlappingTensors) {
  std::string header = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})";
  EXPECT_NE(HeaderErrorOf(WithHeader(header, 16)).find("overlap"), std::string::npos);
}

TEST(SafetensorsTest, MalformedEntries) {
  EXPECT_NE(HeaderErrorOf(
                WithHeader(R"({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})", 1))
                .find("unknown \"Q4\""),
            std::string::npos);
  EXPECT_NE(HeaderErrorOf(
                WithHeader(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4))
                .find("shape"),
            std::string::npos);
  EXPECT_NE(
      HeaderErrorOf(WithHeader(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4))
          .find("data_offsets"),
      std::string::npos);
  EXPECT_NE(HeaderErrorOf(WithHeader(R"({"a": 5})", 0)).find("tensor \"a\""), std::string::npos);
  EXPECT_NE(
      HeaderErrorOf(WithHeader(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],
                                   "data_offsets": [0, 4]}})",
                               4))
          .find("too large"),
      std::string::npos);
}

// Hostile headers (docs/hardening.md): deep nesting is refused before
// parsing; names quoted in messages are escaped and cut.
TEST(SafetensorsTest, HostileNestingAndNames) {
  EXPECT_NE(
      HeaderErrorOf(WithHeader(std::string(100000, '['), 0)).find("nested deeper than 64 levels"),
      std::string::npos);
  const std::string name =
      HeaderErrorOf(WithHeader(R"({"w\u001b[2J\n)" + std::string(500, 'x') + R"(": 5})", 0));
  EXPECT_NE(name.find(R"(tensor "w\x1b[2J\x0axxx)"), std::string::npos) << name;
  EXPECT_LT(name.size(), 250u) << name;
  for (char c : name) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << name;
}

TEST(SafetensorsTest, ReadsOnlyTheHeaderFromDisk) {
  testing::TempDir dir;
  std::string bytes = MakeSafetensors({{"w", "BF16", {1024, 1024}}});
  testing::WriteFile(dir.path() / "m.safetensors", bytes);
  auto r = ReadSafetensorsHeader(DiskFileSystem(), dir.path() / "m.safetensors");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)[0].numel, 1024u * 1024);
  // A lying length on disk: the message names the file.
  testing::SetHeaderLength(bytes, 1ULL << 33);
  testing::WriteFile(dir.path() / "liar.safetensors", bytes);
  auto liar = ReadSafetensorsHeader(DiskFileSystem(), dir.path() / "liar.safetensors");
  ASSERT_FALSE(liar.ok());
  EXPECT_NE(liar.error().message.find("liar.safetensors"), std::string::npos);
  EXPECT_TRUE(IsOneLine(liar.error().message));
}

// Issue 24: a NUL and garbage after the header's object, and a header of
// more JSON items than any checkpoint within kMaxTensors has, are refused
// before parsing (99 MB of tiny entries took 3 GB as a document).
TEST(SafetensorsTest, NulAfterTheHeaderAndTooManyItemsAreErrors) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_NE(HeaderErrorOf(WithHeader(header + std::string("\0xx", 3), 4)).find("header: NUL byte"),
            std::string::npos);
  std::string many = R"({"__metadata__": {"x": [)";
  for (int i = 0; i < 3'300'000; ++i) many += "1,";
  many += "1]}}";
  EXPECT_NE(HeaderErrorOf(WithHeader(many, 0)).find("JSON items"), std::string::npos);
}

}  // namespace
}  // namespace vramscope::ingest
