// The libcurl HttpFetcher: one GET per call, no state kept between calls.
// Library vs_ingest_curl, linked by the CLI only: the core (vs_ingest) builds
// and links without libcurl.
#include <curl/curl.h>

#include <cctype>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "vramscope/local_io.h"

#ifndef VS_VERSION
#define VS_VERSION "dev"
#endif

namespace vramscope {
namespace {

// What the callbacks collect while the transfer runs.
struct Transfer {
  uint64_t max_body_bytes = 0;
  bool too_large = false;
  HttpResponse response;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  if (t->response.body.size() + bytes > t->max_body_bytes) {
    t->too_large = true;
    return 0;  // makes libcurl stop with CURLE_WRITE_ERROR
  }
  t->response.body.append(data, bytes);
  return bytes;
}

std::string Trim(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return std::string(s.substr(begin, end - begin));
}

bool NameIs(std::string_view name, std::string_view lower_expected) {
  if (name.size() != lower_expected.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(name[i])) != lower_expected[i]) return false;
  }
  return true;
}

// Called once per header line, for every response of a redirect chain; a
// status line starts a new response, so only the last one's headers remain.
size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  std::string_view line(data, bytes);
  if (line.substr(0, 5) == "HTTP/") {
    t->response.error_code.clear();
    t->response.error_message.clear();
    return bytes;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return bytes;
  std::string_view name = line.substr(0, colon);
  if (NameIs(name, "x-error-code")) t->response.error_code = Trim(line.substr(colon + 1));
  if (NameIs(name, "x-error-message")) t->response.error_message = Trim(line.substr(colon + 1));
  return bytes;
}

struct EasyDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct ListDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

class CurlFetcher final : public HttpFetcher {
 public:
  HttpResponse Get(const HttpRequest& request) override {
    // Process-wide libcurl set-up; thread-safe since libcurl 7.84.
    static const CURLcode kGlobal = curl_global_init(CURL_GLOBAL_DEFAULT);
    HttpResponse failed;
    failed.transport = HttpResponse::Transport::kUnreachable;
    if (kGlobal != CURLE_OK) {
      failed.transport_detail = curl_easy_strerror(kGlobal);
      return failed;
    }
    std::unique_ptr<CURL, EasyDeleter> curl(curl_easy_init());
    if (!curl) {
      failed.transport_detail = "libcurl could not start a transfer";
      return failed;
    }
    Transfer t;
    t.max_body_bytes = request.max_body_bytes;
    char error_text[CURL_ERROR_SIZE] = {};
    std::unique_ptr<curl_slist, ListDeleter> headers;
    if (!request.bearer_token.empty()) {
      // libcurl sends a custom Authorization header to the original host only,
      // never to another host a redirect leads to (CVE-2018-1000007 fix).
      const std::string auth = "Authorization: Bearer " + request.bearer_token;
      headers.reset(curl_slist_append(nullptr, auth.c_str()));
    }
    CURL* c = curl.get();
    curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    // Only http(s), also after a redirect: a Location of file:// or another
    // scheme must not make vramscope read anything else.
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS,
                     static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, static_cast<long>(request.connect_timeout_s));
    curl_easy_setopt(c, CURLOPT_TIMEOUT, static_cast<long>(request.total_timeout_s));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for DNS timeouts
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(request.max_body_bytes));
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");  // whatever libcurl can decode
    curl_easy_setopt(c, CURLOPT_USERAGENT, "vramscope/" VS_VERSION);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error_text);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());

    const CURLcode code = curl_easy_perform(c);
    HttpResponse& r = t.response;
    if (code == CURLE_OK) {
      long status = 0;
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
      r.status = status;
      return std::move(r);
    }
    r.body.clear();
    r.transport_detail = error_text[0] != '\0' ? Trim(error_text) : curl_easy_strerror(code);
    if (code == CURLE_OPERATION_TIMEDOUT) {
      r.transport = HttpResponse::Transport::kTimeout;
    } else if (code == CURLE_FILESIZE_EXCEEDED || (code == CURLE_WRITE_ERROR && t.too_large)) {
      r.transport = HttpResponse::Transport::kTooLarge;
      r.transport_detail = fmt::format("{} bytes", request.max_body_bytes);
    } else {
      r.transport = HttpResponse::Transport::kUnreachable;
    }
    return std::move(r);
  }
};

}  // namespace

std::unique_ptr<HttpFetcher> MakeCurlFetcher() { return std::make_unique<CurlFetcher>(); }

}  // namespace vramscope
