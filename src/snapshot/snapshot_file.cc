// ParseSnapshot / ReadSnapshotFile: format detection and the file seam.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "readers.h"

namespace vramscope {
namespace {

// Only a regular file within the size limit is read (checked before any
// byte is: a FIFO, socket or character device would block or never end).
Status CheckRegular(const std::string& path, const struct stat& st, uint64_t max_bytes) {
  if (S_ISDIR(st.st_mode)) {
    return MakeError(fmt::format("{}: is a directory, expected a snapshot file", path));
  }
  if (!S_ISREG(st.st_mode)) {
    const char* what = S_ISFIFO(st.st_mode)   ? "a FIFO (named pipe)"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a regular file";
    return MakeError(
        fmt::format("{}: is {}, expected a regular snapshot file (nothing was read)", path, what));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return MakeError(fmt::format("{}: {} bytes is larger than the {}-byte limit (max_file_bytes)",
                                 path, size, max_bytes));
  }
  return Ok{};
}

// Read-only mapping of a whole file; unmapped on destruction. Pages behind
// the reader are dropped as it goes (Consumed), so a file of any size costs
// a window of it, not all of it, in resident memory; dropped pages of a
// read-only file mapping read back from the page cache if touched again.
class MappedFile final : public snapshot::InputWindow {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() override {
    if (data_ != nullptr) munmap(data_, size_);
  }
  void Consumed(uint64_t offset) override {
    constexpr uint64_t kPage = 4096;
    const uint64_t upto = std::min(offset, size_) / kPage * kPage;
    if (data_ == nullptr || upto <= released_) return;
    madvise(static_cast<char*>(data_) + released_, upto - released_, MADV_DONTNEED);
    released_ = upto;
  }
  Status Open(const std::string& path, uint64_t max_bytes) {
    // stat before open: opening a FIFO without a writer blocks forever, and a
    // device or socket is no snapshot either. Only regular files are read.
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR)
        return MakeError(fmt::format("{}: no such file", path));
      return MakeError(fmt::format("{}: cannot read ({})", path, std::strerror(errno)));
    }
    if (Status s = CheckRegular(path, st, max_bytes); !s.ok()) return s;
    // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open
    // still returns at once (and the fstat below refuses it).
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return MakeError(fmt::format("{}: cannot open for reading", path));
    if (fstat(fd, &st) != 0) {
      close(fd);
      return MakeError(fmt::format("{}: cannot stat", path));
    }
    if (Status s = CheckRegular(path, st, max_bytes); !s.ok()) {
      close(fd);
      return s;
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      // No MAP_POPULATE: that would make the whole file resident at once.
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        close(fd);
        return MakeError(fmt::format("{}: cannot map the file into memory", path));
      }
      data_ = p;
      // One sequential pass: let the kernel read ahead.
      madvise(data_, size_, MADV_SEQUENTIAL);
    }
    close(fd);
    return Ok{};
  }
  std::string_view bytes() const {
    return data_ == nullptr ? std::string_view()
                            : std::string_view(static_cast<const char*>(data_), size_);
  }

 private:
  void* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t released_ = 0;
};

// What torch.save writes, told apart before the pickle machine would refuse
// it as "would import or call a Python object" (true, but not the point): a
// zip archive (torch >= 1.6, `_use_new_zipfile_serialization`) or the legacy
// format, a pickle of the magic number 0x1950a86a20f9469cfc6c first
// (torch/serialization.py, MAGIC_NUMBER; LONG1 of 10 bytes, little endian).
// Returns an empty view for anything else.
std::string_view CheckpointKind(std::string_view bytes) {
  using namespace std::string_view_literals;
  if (bytes.starts_with("PK\x03\x04"sv) || bytes.starts_with("PK\x05\x06"sv)) {
    return "a zip archive, as torch.save writes";
  }
  constexpr std::string_view kLegacyMagic = "\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"sv;
  if (bytes.size() > 2 && bytes[0] == '\x80' && bytes.substr(2).starts_with(kLegacyMagic)) {
    return "a legacy torch.save file (its magic number first)";
  }
  return {};
}

Result<Snapshot> Parse(std::string_view bytes, std::string_view name,
                       const SnapshotReadLimits& limits, snapshot::InputWindow* window) {
  if (bytes.size() > limits.max_file_bytes) {
    return MakeError(fmt::format("{}: {} bytes is larger than the {}-byte limit (max_file_bytes)",
                                 name, bytes.size(), limits.max_file_bytes));
  }
  if (bytes.empty()) return MakeError(fmt::format("{}: empty file", name));
  if (std::string_view kind = CheckpointKind(bytes); !kind.empty()) {
    return MakeError(
        fmt::format("{}: {}: this is a model checkpoint, not a memory snapshot (a snapshot is what "
                    "torch.cuda.memory._dump_snapshot writes)",
                    name, kind));
  }
  const auto first = static_cast<unsigned char>(bytes[0]);
  // PROTO (protocol 2+), or any other opcode: a protocol 0/1 pickle still
  // goes through the pickle machine, which names what it refuses (GLOBAL...).
  if (first == 0x80 || (first != '{' && first != '[' && snapshot::IsPickleOpcode(first))) {
    int protocol = 0;
    auto doc = snapshot::ParsePickle(bytes, name, limits, &protocol, window);
    if (!doc.ok()) return doc.error();
    return snapshot::ExtractSnapshot(*doc, name, fmt::format("pickle protocol {}", protocol),
                                     /*shared_containers=*/true);
  }
  size_t i = 0;
  while (i < bytes.size() &&
         (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\r' || bytes[i] == '\t')) {
    ++i;
  }
  if (i < bytes.size() && (bytes[i] == '{' || bytes[i] == '[')) {
    auto doc = snapshot::ParseJson(bytes, name, limits);
    if (window != nullptr) window->Consumed(bytes.size());  // the Document owns its strings
    if (!doc.ok()) return doc.error();
    return snapshot::ExtractSnapshot(*doc, name, "json", /*shared_containers=*/false);
  }
  return MakeError(
      fmt::format("{}: not a memory snapshot: neither a pickle (first byte 0x80, as "
                  "torch.cuda.memory._dump_snapshot writes) nor JSON (first byte 0x{:02x})",
                  name, first));
}

}  // namespace

Result<Snapshot> ParseSnapshot(std::string_view bytes, std::string_view name,
                               const SnapshotReadLimits& limits) {
  return Parse(bytes, name, limits, nullptr);
}

Result<Snapshot> ReadSnapshotFile(const std::string& path, const SnapshotReadLimits& limits) {
  MappedFile file;
  if (Status s = file.Open(path, limits.max_file_bytes); !s.ok()) return s.error();
  return Parse(file.bytes(), path, limits, &file);
}

}  // namespace vramscope
