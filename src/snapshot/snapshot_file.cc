// ParseSnapshot / ReadSnapshotFile: format detection and the file seam.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "readers.h"

namespace vramscope {
namespace {

// Read-only mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  Status Open(const std::string& path, uint64_t max_bytes) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      struct stat st;
      if (stat(path.c_str(), &st) != 0) return MakeError(fmt::format("{}: no such file", path));
      return MakeError(fmt::format("{}: cannot open for reading", path));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      close(fd);
      return MakeError(fmt::format("{}: cannot stat", path));
    }
    if (S_ISDIR(st.st_mode)) {
      close(fd);
      return MakeError(fmt::format("{}: is a directory, expected a snapshot file", path));
    }
    if (!S_ISREG(st.st_mode)) {
      close(fd);
      return MakeError(fmt::format("{}: not a regular file", path));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > max_bytes) {
      close(fd);
      return MakeError(fmt::format("{}: {} bytes is larger than the {}-byte limit (max_file_bytes)",
                                   path, size_, max_bytes));
    }
    if (size_ > 0) {
      // MAP_POPULATE: the reader touches every byte once, in order; mapping
      // it all up front costs far less than a page fault per 4 KiB.
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
      if (p == MAP_FAILED) {
        close(fd);
        return MakeError(fmt::format("{}: cannot map the file into memory", path));
      }
      data_ = p;
      // One sequential pass: let the kernel read ahead and drop pages behind.
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
};

}  // namespace

Result<Snapshot> ParseSnapshot(std::string_view bytes, std::string_view name,
                               const SnapshotReadLimits& limits) {
  if (bytes.size() > limits.max_file_bytes) {
    return MakeError(fmt::format("{}: {} bytes is larger than the {}-byte limit (max_file_bytes)",
                                 name, bytes.size(), limits.max_file_bytes));
  }
  if (bytes.empty()) return MakeError(fmt::format("{}: empty file", name));
  const auto first = static_cast<unsigned char>(bytes[0]);
  // PROTO (protocol 2+), or any other opcode: a protocol 0/1 pickle still
  // goes through the pickle machine, which names what it refuses (GLOBAL...).
  if (first == 0x80 || (first != '{' && first != '[' && snapshot::IsPickleOpcode(first))) {
    int protocol = 0;
    auto doc = snapshot::ParsePickle(bytes, name, limits, &protocol);
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
    if (!doc.ok()) return doc.error();
    return snapshot::ExtractSnapshot(*doc, name, "json", /*shared_containers=*/false);
  }
  return MakeError(
      fmt::format("{}: not a memory snapshot: neither a pickle (first byte 0x80, as "
                  "torch.cuda.memory._dump_snapshot writes) nor JSON (first byte 0x{:02x})",
                  name, first));
}

Result<Snapshot> ReadSnapshotFile(const std::string& path, const SnapshotReadLimits& limits) {
  MappedFile file;
  if (Status s = file.Open(path, limits.max_file_bytes); !s.ok()) return s.error();
  return ParseSnapshot(file.bytes(), path, limits);
}

}  // namespace vramscope
