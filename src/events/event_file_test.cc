// ReadEventFile: the path-level errors, and agreement with ParseEventText
// when lines cross the reader's 1 MiB chunk boundaries.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "test_util.h"
#include "vramscope/event_io.h"

namespace vramscope {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class EventFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("vs_events_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  fs::path dir_;
};

TEST_F(EventFileTest, ReadsTheSameStreamAsParseEventText) {
  const std::string text = events_test::DocExample();
  const std::string path = WriteFile("ok.ev", text);
  const Result<EventStream> from_file = ReadEventFile(path);
  ASSERT_TRUE(from_file.ok()) << from_file.error().message;
  const EventStream from_text = events_test::ParseOk(text);
  EXPECT_EQ(from_file->events(), from_text.events());
  EXPECT_EQ(from_file->strings(), from_text.strings());
  EXPECT_EQ(from_file->metadata(), from_text.metadata());
}

TEST_F(EventFileTest, MissingFile) {
  const std::string path = (dir_ / "nope.ev").string();
  const Result<EventStream> result = ReadEventFile(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, path + ": no such file");
}

TEST_F(EventFileTest, Directory) {
  const Result<EventStream> result = ReadEventFile(dir_.string());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, dir_.string() + ": is a directory, not an event file");
}

TEST_F(EventFileTest, Unreadable) {
  if (::geteuid() == 0) GTEST_SKIP() << "root can read files without permission";
  const std::string path = WriteFile("secret.ev", "vramscope-events 1\n");
  fs::permissions(path, fs::perms::none);
  const Result<EventStream> result = ReadEventFile(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, path + ": cannot open: Permission denied");
}

TEST_F(EventFileTest, OverTheSizeLimit) {
  const std::string path = WriteFile("big.ev", "vramscope-events 1\n# padding\n");
  EventReadLimits limits;
  limits.max_file_bytes = 20;
  const Result<EventStream> result = ReadEventFile(path, limits);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, path + ": 29 bytes is over the limit of 20 bytes");
}

TEST_F(EventFileTest, ErrorsNameThePathAndLine) {
  const std::string path = WriteFile("bad.ev", "vramscope-events 1\na 1 -5 act\n");
  const Result<EventStream> result = ReadEventFile(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, path + ":2: alloc size: '-5' is not an unsigned integer");
}

TEST_F(EventFileTest, EmptyFileAndCharacterDevice) {
  const std::string path = WriteFile("empty.ev", "");
  const Result<EventStream> result = ReadEventFile(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message,
            path + ":1: header: missing (the input is empty; expected 'vramscope-events 1')");
  const Result<EventStream> dev_null = ReadEventFile("/dev/null");
  ASSERT_FALSE(dev_null.ok());
  EXPECT_EQ(dev_null.error().message.rfind("/dev/null:1: header: missing", 0), 0u);
}

// A FIFO that nothing writes to would block open() forever; the reader opens
// it without waiting and reports "no data". With a writer attached (here the
// test itself) it reads as usual. Also: /dev/zero ends at the line limit.
TEST_F(EventFileTest, FifoWithAndWithoutWriterAndEndlessDevice) {
  const std::string path = (dir_ / "trace.fifo").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const Result<EventStream> no_writer = ReadEventFile(path);
  ASSERT_FALSE(no_writer.ok());
  EXPECT_EQ(no_writer.error().message, path + ": no data (a FIFO that nothing writes to)");

  const int writer = ::open(path.c_str(), O_RDWR);  // RDWR: does not wait for a reader
  ASSERT_GE(writer, 0);
  const std::string text = "vramscope-events 1\na 1 512 act\n";
  ASSERT_EQ(::write(writer, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  // The reader sees end of file once the last writer closes; ours closes
  // after the read has started, from another thread.
  std::thread closer([writer] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::close(writer);
  });
  const Result<EventStream> with_writer = ReadEventFile(path);
  closer.join();
  ASSERT_TRUE(with_writer.ok()) << with_writer.error().message;
  EXPECT_EQ(with_writer->size(), 1u);

  const Result<EventStream> zero = ReadEventFile("/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("longer than 65536 bytes"), std::string::npos)
      << zero.error().message;
}

// About 3 MiB of events with lines of varied length, so lines straddle the
// chunk boundaries at every offset class; no final newline.
TEST_F(EventFileTest, LinesAcrossChunkBoundaries) {
  std::string text = "vramscope-events 1\r\ns 1 " + std::string(5000, 'm') + "\r\n";
  for (uint64_t id = 0; text.size() < (size_t{3} << 20); ++id) {
    text += "a " + std::to_string(id) + " " + std::to_string(id * 977) + " act 1\r\n";
    if (id % 17 == 0) text += "# " + std::string(id % 1000, 'c') + "\n";
    text += "f " + std::to_string(id) + "\n";
  }
  text += "e";
  const std::string path = WriteFile("chunks.ev", text);
  const Result<EventStream> from_file = ReadEventFile(path);
  ASSERT_TRUE(from_file.ok()) << from_file.error().message;
  const EventStream from_text = events_test::ParseOk(text);
  EXPECT_EQ(from_file->events(), from_text.events());
  EXPECT_EQ(from_file->strings(), from_text.strings());
}

TEST_F(EventFileTest, OverlongLineAcrossChunksIsRejectedWithItsLineNumber) {
  std::string text = "vramscope-events 1\na 1 1 act\n# ";
  text.append(size_t{3} << 20, 'x');  // one 3 MiB comment line
  text += "\nf 1\n";
  const std::string path = WriteFile("long.ev", text);
  const Result<EventStream> result = ReadEventFile(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, path + ":3: line is longer than 65536 bytes");
}

TEST_F(EventFileTest, ErrorLineNumbersMatchParseEventTextAcrossChunks) {
  std::string text = "vramscope-events 1\n";
  for (int i = 0; i < 200000; ++i) text += "a " + std::to_string(i) + " 1 act\n";
  text += "f 999999999\n";
  const std::string path = WriteFile("late_error.ev", text);
  const Result<EventStream> result = ReadEventFile(path);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().message, path + ":200002: free id: 999999999 is not live");
}

}  // namespace
}  // namespace vramscope
