#include "output.h"

#include "command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "vramscope/common/quote.h"

namespace vramscope::cli {

std::string CheckWritableFile(const std::string& path) {
  if (path.empty()) return "an empty file name";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return fmt::format("{}: is a directory", path);
    if (::access(path.c_str(), W_OK) != 0) return fmt::format("{}: not writable", path);
    return {};
  }
  if (errno != ENOENT) return fmt::format("{}: {}", path, std::strerror(errno));
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return fmt::format("{}: no such directory {}", path, dir);
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return fmt::format("{}: cannot create a file in {}", path, dir);
  return {};
}

CLI::Option* AddOutputFileOption(CLI::App* sub, const std::string& flag, std::string* path,
                                 const std::string& help) {
  return sub->add_option(flag, *path, help)->check(CheckWritableFile, "", "writable");
}

void AddOutputFlags(CLI::App* sub, OutputOptions* out) {
  sub->add_flag("--json", out->json, "Print the report as JSON (integer bytes)");
  AddOutputFileOption(sub, "--html", &out->html_path,
                      "Also write a self-contained HTML report to FILE");
  AddOutputFileOption(sub, "--svg", &out->svg_path,
                      "Also write the memory timeline chart (SVG) to FILE");
  AddOutputFileOption(sub, "--csv", &out->csv_path, "Also write the timeline as CSV to FILE");
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return MakeError(fmt::format("{}: cannot open for writing", path));
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) return MakeError(fmt::format("{}: write failed", path));
  return Ok{};
}

namespace {

// The paths that name a descriptor this process already holds
// (`validate /dev/stdin < results.jsonl`, `cat results.jsonl | vramscope
// validate /dev/stdin`, a shell's `<(...)`): streams the caller set up
// deliberately, read to their end. Any other pipe, device or socket is refused.
bool IsOwnDescriptorPath(const std::string& path) {
  if (path == "/dev/stdin") return true;
  for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const std::string_view p(prefix);
    if (path.size() > p.size() && path.compare(0, p.size(), p) == 0 &&
        path.find_first_not_of("0123456789", p.size()) == std::string::npos) {
      return true;
    }
  }
  return false;
}

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes,
                                 bool allow_own_streams) {
  // O_NONBLOCK: opening a FIFO that no one writes to returns at once instead
  // of waiting for a writer; the kind of file is then checked on the open
  // descriptor (no window between a stat() and the open()).
  const Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return MakeError(fmt::format("{}: no such file", path));
    return MakeError(fmt::format("{}: cannot open for reading: {}", path, std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    return MakeError(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return MakeError(fmt::format("{}: is a directory, expected a file", path));
  }
  const bool regular = S_ISREG(st.st_mode);
  if (!regular && !(allow_own_streams && IsOwnDescriptorPath(path))) {
    return MakeError(fmt::format("{}: is {}, expected a regular file", path, FileKind(st.st_mode)));
  }
  // Checked before reading a byte; a stream is checked as it is read.
  if (regular && static_cast<uint64_t>(st.st_size) > max_bytes) {
    return MakeError(fmt::format("{}: {} bytes, larger than the {} byte limit", path,
                                 static_cast<uint64_t>(st.st_size), max_bytes));
  }
  // Blocking reads from here on: a stream the caller handed us is read to its end.
  const int flags = ::fcntl(f.fd, F_GETFL);
  if (flags >= 0) ::fcntl(f.fd, F_SETFL, flags & ~O_NONBLOCK);
  std::string text;
  if (regular) text.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return MakeError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
    }
    text.append(buffer, static_cast<size_t>(n));
    // A regular file can still grow while it is read.
    if (text.size() > max_bytes) {
      return MakeError(fmt::format("{}: larger than the {} byte limit", path, max_bytes));
    }
  }
  return text;
}

namespace {

// The option's value without the blanks strtoull/strtod skip ("  7").
std::string_view Trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\n\v\f\r");
  if (begin == std::string::npos) return {};
  const size_t end = text.find_last_not_of(" \t\n\v\f\r");
  return std::string_view(text).substr(begin, end - begin + 1);
}

// A value as quoted in a message (common::QuoteForMessage): at most 40 bytes
// of it, escaped, without quote marks.
std::string Quoted(std::string_view value) {
  return common::QuoteForMessage(value, common::kQuotedBytes, '\0');
}

// Integer flags whose smallest accepted value is 1, so that a negative value's
// message names the range the flag's own check would (lower.cc ValidateSetup:
// --batch, --seq, --grad-accum, --steps, --lora-rank, --text-len,
// --target-len; flux.cc --vae-scale; parallel_flags.cc's counts; cmd_fit.cc
// --max-gpus). The others take 0 (--device 0, --top 0, --max-batch 0: none).
constexpr std::string_view kCountFlags[] = {"--batch",
                                            "--seq",
                                            "--grad-accum",
                                            "--steps",
                                            "--lora-rank",
                                            "--text-len",
                                            "--target-len",
                                            "--vae-scale",
                                            "--gpus",
                                            "--gpus-per-node",
                                            "--tp",
                                            "--pp",
                                            "--cp",
                                            "--ep",
                                            "--virtual-stages",
                                            "--fsdp-version",
                                            "--max-gpus",
                                            "--ddp-bucket-cap-mb"};

uint64_t SmallestValue(std::string_view flag) {
  for (std::string_view count : kCountFlags) {
    if (count == flag) return 1;
  }
  return 0;
}

// CLI11 validator of every integer option: "" when the value is acceptable,
// else the problem. No flag of vramscope takes a negative number (a count, a
// size, a device index), so a minus sign is refused for signed options too
// (--device -5 would otherwise mean "the default device"). A value that is
// no number at all is left to CLI11's own conversion error. `smallest`: the
// least value the flag accepts, for the message.
std::string CheckNonNegativeInteger(const std::string& text, uint64_t smallest) {
  const std::string_view v = Trimmed(text);
  if (!v.empty() && v.front() == '-') {
    return fmt::format("{} is negative; expected {} or more", Quoted(v), smallest);
  }
  errno = 0;
  char* end = nullptr;
  std::strtoull(std::string(v).c_str(), &end, 0);
  if (errno == ERANGE) return fmt::format("{} is out of range (over 2^64-1)", Quoted(v));
  return {};
}

// A signed flag (CLI11 "INT") holds at most 2^63-1: CLI11 2.1 would turn a
// larger value into 2^63-1 and the range check would then quote that number,
// not the one typed (--gpus 18446744073709551615 "is outside 1..1048576" as
// 9223372036854775807).
std::string CheckNonNegativeSignedInteger(const std::string& text, uint64_t smallest) {
  if (std::string problem = CheckNonNegativeInteger(text, smallest); !problem.empty()) {
    return problem;
  }
  const std::string_view v = Trimmed(text);
  char* end = nullptr;
  const unsigned long long value = std::strtoull(std::string(v).c_str(), &end, 0);
  if (value > static_cast<unsigned long long>(INT64_MAX)) {
    return fmt::format("{} is out of range (over 2^63-1)", Quoted(v));
  }
  return {};
}

std::string CheckFinite(const std::string& text) {
  char* end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (end != text.c_str() && !std::isfinite(d)) {
    return fmt::format("{} is not a finite number", Quoted(Trimmed(text)));
  }
  return {};
}

}  // namespace

void CheckNumericFlags(CLI::App* sub) {
  for (CLI::Option* option : sub->get_options()) {
    if (option->get_type_size() == 0) continue;  // a flag: takes no value
    // CLI11's type names: UINT for unsigned integers, INT for signed ones,
    // FLOAT for floating point (a vector of them: the same name), then
    // ":DESCRIPTION" of each validator already attached.
    std::string type = option->get_type_name();
    type = type.substr(0, type.find(':'));
    // No description: --help stays as it is.
    const uint64_t smallest = SmallestValue(option->get_name());
    if (type == "UINT") {
      option->check(
          [smallest](const std::string& v) { return CheckNonNegativeInteger(v, smallest); }, "",
          "non-negative");
    } else if (type == "INT") {
      option->check(
          [smallest](const std::string& v) { return CheckNonNegativeSignedInteger(v, smallest); },
          "", "non-negative");
    } else if (type == "FLOAT") {
      option->check(CheckFinite, "", "finite");
    }
  }
}

namespace {
std::vector<std::string>& PendingWarnings() {
  // One list per thread: the CLI runs one command per process, the Python
  // module one per calling thread.
  thread_local std::vector<std::string> lines;
  return lines;
}
}  // namespace

ProgressLine::ProgressLine(std::string what)
    : what_(std::move(what)),
      terminal_(::isatty(::fileno(stderr)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {
  // VRAMSCOPE_PROGRESS_AFTER_MS moves the one-second threshold (tests set 0).
  if (const char* after = std::getenv("VRAMSCOPE_PROGRESS_AFTER_MS")) {
    char* end = nullptr;
    const long ms = std::strtol(after, &end, 10);
    if (end != after && *end == '\0' && ms >= 0 && ms <= 3600000)
      delay_ = std::chrono::milliseconds(ms);
  }
}

ProgressLine::~ProgressLine() { Done(); }

void ProgressLine::Done() {
  if (shown_) std::fputs("\r\033[K", stderr);  // erase the line
  shown_ = false;
  terminal_ = false;
}

void ProgressLine::Update(size_t done, size_t total) {
  if (!terminal_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < delay_ || (shown_ && now - last_ < std::chrono::milliseconds(100))) return;
  last_ = now;
  shown_ = true;
  std::fprintf(stderr, "\r\033[Kvramscope %s: %zu of %zu", what_.c_str(), done, total);
  std::fflush(stderr);
}

void DeferWarning(std::string line) { PendingWarnings().push_back(std::move(line)); }

std::vector<std::string> TakeWarnings() {
  std::vector<std::string> lines = std::move(PendingWarnings());
  PendingWarnings().clear();
  return lines;
}

int FlushWarnings(int exit_code) {
  if (exit_code == kExitOk) {
    for (const std::string& line : PendingWarnings()) {
      std::fprintf(stderr, "vramscope: warning: %s\n", OneLine(line).c_str());
    }
  }
  PendingWarnings().clear();
  return exit_code;
}

namespace {

// The length of the valid UTF-8 sequence at text[i], or 0 (RFC 3629: no
// overlong forms, no surrogates, nothing past U+10FFFF).
size_t Utf8Length(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char lead = b(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    n = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    n = 3;
    if (lead == 0xe0) lo = 0xa0;
    if (lead == 0xed) hi = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    n = 4;
    if (lead == 0xf0) lo = 0x90;
    if (lead == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (i + n > text.size() || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

std::string OneLine(std::string text) {
  constexpr size_t kMaxBytes = 1000;
  const bool cut = text.size() > kMaxBytes;
  if (cut) text.resize(kMaxBytes);
  std::string out;
  out.reserve(text.size() + 3);
  for (size_t i = 0; i < text.size();) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u < 0x80) {
      const bool blank = u == '\n' || u == '\r' || u == '\t';
      out += blank ? ' ' : (u < 0x20 || u == 0x7f) ? '?' : static_cast<char>(u);
      ++i;
      continue;
    }
    // C1 controls (U+0080-U+009F: CSI is U+009B) and bytes that are not
    // UTF-8 (a lone 0x9b is CSI to an 8-bit terminal) become '?' too.
    const size_t n = Utf8Length(text, i);
    const bool c1 = n == 2 && u == 0xc2 && static_cast<unsigned char>(text[i + 1]) <= 0x9f;
    if (n == 0 || c1) {
      out += '?';
      i += n == 0 ? 1 : n;
      continue;
    }
    out.append(text, i, n);
    i += n;
  }
  if (cut) out += "...";
  return out;
}

int FailBadInput(const Error& error) {
  std::fprintf(stderr, "vramscope: error: %s\n", OneLine(error.message).c_str());
  return kExitBadInput;
}

int WriteOutputFiles(std::initializer_list<OutputFile> files) {
  for (const OutputFile& f : files) {
    if (f.path.empty()) continue;
    Status s = WriteTextFile(f.path, f.render());
    if (!s.ok()) return FailBadInput(s.error());
  }
  return kExitOk;
}

int WriteReportFiles(const Report& report, const OutputOptions& out) {
  return WriteOutputFiles({{out.html_path, [&] { return RenderHtml(report); }},
                           {out.svg_path, [&] { return RenderSvg(report); }},
                           {out.csv_path, [&] { return RenderTimelineCsv(report); }}});
}

int EmitReport(const Report& report, const OutputOptions& out) {
  const std::string main_text = out.json ? RenderJson(report) : RenderText(report);
  std::fwrite(main_text.data(), 1, main_text.size(), stdout);
  if (!main_text.empty() && main_text.back() != '\n') std::fputc('\n', stdout);
  return WriteReportFiles(report, out);
}

}  // namespace vramscope::cli
