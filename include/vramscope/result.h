// Result<T>: the one error path of the vramscope core library.
//
// Expected failures (bad input, unsupported option, malformed file) are values:
// a function returns Result<T> holding either a T or an Error whose message
// names the input, the field and the problem in one line. The library never
// prints, exits or throws for expected failures; the CLI maps an Error to a
// message on stderr and exit code 2. Bugs (violated invariants) abort with
// file:line through VS_CHECK.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace vramscope {

// One line saying what is wrong, e.g. "trace.ev:12: size: -5 is negative".
struct Error {
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void> equivalent.
struct Ok {};
using Status = Result<Ok>;

inline Error MakeError(std::string message) { return Error{std::move(message)}; }

}  // namespace vramscope

// Aborts with file:line when an internal invariant is violated. Never reachable
// from user input: inputs are validated and rejected with an Error first.
#define VS_CHECK(cond)                                                                       \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: internal check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

// Propagates an error from an expression of type Result<...>.
#define VS_TRY(var, expr)                                \
  auto var##_result_ = (expr);                           \
  if (!var##_result_.ok()) return var##_result_.error(); \
  auto& var = var##_result_.value()
