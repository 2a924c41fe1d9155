// ParseEventText and ReadEventFile: splitting input into lines for the
// EventParser. The file reader streams in chunks, so memory is the events
// plus one chunk and one partial line, not the whole file.
#include "vramscope/event_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "event_parser.h"

namespace vramscope {
namespace {

using events_internal::EventParser;

// Reserving the event vector up front avoids regrowth, which copies every
// event and touches twice the memory: on large inputs it cost more than the
// parsing itself. Reserved but unused capacity is address space only (pages
// are touched on first write). Capped so that a pathological input (say,
// gigabytes of comments) cannot make the reader ask for an absurd block.
constexpr uint64_t kMaxReservedEvents = uint64_t{1} << 26;  // 2.5 GiB of events

size_t EventsToReserve(uint64_t event_upper_bound, const EventReadLimits& limits) {
  return static_cast<size_t>(std::min({event_upper_bound, limits.max_events, kMaxReservedEvents}));
}

// Every event is one line, so the line count bounds the event count; counting
// newlines with memchr is an order of magnitude faster than parsing them.
uint64_t CountLines(std::string_view text) {
  uint64_t lines = 0;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    const void* newline = std::memchr(p, '\n', static_cast<size_t>(end - p));
    ++lines;
    if (newline == nullptr) break;
    p = static_cast<const char*>(newline) + 1;
  }
  return lines;
}

// A file is read in chunks, so its lines are not counted ahead; the shortest
// event line of realistic files ("f 12345") is about 8 bytes.
constexpr uint64_t kMinBytesPerEventGuess = 8;

Error OverSizeLimit(std::string_view name, uint64_t bytes, const EventReadLimits& limits,
                    bool at_least) {
  return MakeError(fmt::format("{}: {}{} bytes is over the limit of {} bytes", name,
                               at_least ? "more than " : "", bytes, limits.max_file_bytes));
}

std::string ErrnoMessage(int error_number) {
  return std::error_code(error_number, std::generic_category()).message();
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// fopen(path, "rb"), except that a FIFO is opened without waiting for a
// writer: open() of a FIFO that no process writes to blocks forever. With a
// writer attached (a shell pipe, <(...)) it reads as usual; with none, the
// first read sees end of file. Sets errno on failure.
std::FILE* OpenForReading(const std::string& path, bool fifo) {
  if (!fifo) return std::fopen(path.c_str(), "rb");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  // Reads block again from here on: a writer that is slow to write is waited for.
  const int flags = ::fcntl(fd, F_GETFL);
  std::FILE* file = nullptr;
  if (flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) file = ::fdopen(fd, "rb");
  if (file == nullptr) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
  }
  return file;
}

// Feeds the complete lines of `chunk` to the parser; the unterminated tail
// goes to `partial` (prefixed by what `partial` already held). `partial`
// never grows past one over-long line: such a line is handed to the parser,
// which rejects it.
Status FeedChunk(std::string_view chunk, std::string& partial, uint64_t max_line_bytes,
                 EventParser& parser) {
  size_t pos = 0;
  while (pos < chunk.size()) {
    const void* newline = std::memchr(chunk.data() + pos, '\n', chunk.size() - pos);
    if (newline == nullptr) {
      partial.append(chunk.substr(pos));
      // +1: a line may end in '\r', which does not count towards its length.
      if (partial.size() - 1 > max_line_bytes) return parser.ParseLine(partial);
      return Ok{};
    }
    const size_t end = static_cast<size_t>(static_cast<const char*>(newline) - chunk.data());
    Status status = Ok{};
    if (partial.empty()) {
      status = parser.ParseLine(chunk.substr(pos, end - pos));
    } else {
      partial.append(chunk.substr(pos, end - pos));
      status = parser.ParseLine(partial);
      partial.clear();
    }
    if (!status.ok()) return status;
    pos = end + 1;
  }
  return Ok{};
}

}  // namespace

Result<EventStream> ParseEventText(std::string_view text, std::string_view name,
                                   const EventReadLimits& limits) {
  if (text.size() > limits.max_file_bytes) {
    return OverSizeLimit(name, text.size(), limits, /*at_least=*/false);
  }
  EventParser parser(name, limits);
  parser.ReserveEvents(EventsToReserve(CountLines(text), limits));
  size_t pos = 0;
  while (pos < text.size()) {
    const void* newline = std::memchr(text.data() + pos, '\n', text.size() - pos);
    const size_t end = newline == nullptr
                           ? text.size()
                           : static_cast<size_t>(static_cast<const char*>(newline) - text.data());
    if (Status status = parser.ParseLine(text.substr(pos, end - pos)); !status.ok()) {
      return status.error();
    }
    pos = end + 1;
  }
  return parser.Finish();
}

Result<EventStream> ReadEventFile(const std::string& path, const EventReadLimits& limits) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec || status.type() == std::filesystem::file_type::not_found) {
    if (status.type() == std::filesystem::file_type::not_found) {
      return MakeError(fmt::format("{}: no such file", path));
    }
    return MakeError(fmt::format("{}: cannot read: {}", path, ec.message()));
  }
  if (status.type() == std::filesystem::file_type::directory) {
    return MakeError(fmt::format("{}: is a directory, not an event file", path));
  }
  uint64_t known_size = 0;
  if (status.type() == std::filesystem::file_type::regular) {
    known_size = std::filesystem::file_size(path, ec);
    if (!ec && known_size > limits.max_file_bytes) {
      return OverSizeLimit(path, known_size, limits, /*at_least=*/false);
    }
  }
  errno = 0;
  const bool fifo = status.type() == std::filesystem::file_type::fifo;
  std::unique_ptr<std::FILE, FileCloser> file(OpenForReading(path, fifo));
  if (!file) return MakeError(fmt::format("{}: cannot open: {}", path, ErrnoMessage(errno)));

  EventParser parser(path, limits);
  parser.ReserveEvents(EventsToReserve(known_size / kMinBytesPerEventGuess, limits));
  constexpr size_t kChunkBytes = size_t{1} << 20;
  std::vector<char> chunk(kChunkBytes);
  std::string partial;
  uint64_t total_bytes = 0;
  for (;;) {
    const size_t n = std::fread(chunk.data(), 1, chunk.size(), file.get());
    if (n == 0) break;
    total_bytes += n;
    // Checked while reading too: pipes and devices have no size up front,
    // and a regular file may grow while it is read.
    if (total_bytes > limits.max_file_bytes) {
      return OverSizeLimit(path, limits.max_file_bytes, limits, /*at_least=*/true);
    }
    Status fed = FeedChunk({chunk.data(), n}, partial, limits.max_line_bytes, parser);
    if (!fed.ok()) return fed.error();
  }
  if (std::ferror(file.get())) {
    return MakeError(fmt::format("{}: read error: {}", path, ErrnoMessage(errno)));
  }
  if (fifo && total_bytes == 0) {
    return MakeError(fmt::format("{}: no data (a FIFO that nothing writes to)", path));
  }
  if (!partial.empty()) {
    if (Status status = parser.ParseLine(partial); !status.ok()) return status.error();
  }
  return parser.Finish();
}

}  // namespace vramscope
