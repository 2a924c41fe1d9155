// Two C++ library functions that libc++ 13 (the one emscripten 3.1.6 ships)
// lacks, for the WebAssembly build only: force-included into its every source
// (cmake/wasm.cmake); the native build uses the standard library's own.
//
// std::from_chars for double (floating-point from_chars came with libc++ 20):
// same contract as the standard's for chars_format::general on the inputs the
// engine parses (alloc-conf values, sweep grids): no leading space, no '+', no
// hexadecimal; ptr is one past the last character consumed; ERANGE on
// overflow. strtod does the conversion (the "C" locale is the only one in a
// wasm module), from a NUL-terminated copy because [first, last) is not one.
#pragma once

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>

#if defined(__EMSCRIPTEN__) && defined(_LIBCPP_VERSION) && _LIBCPP_VERSION < 200000

namespace std {

inline from_chars_result from_chars(const char* first, const char* last, double& value) {
  const bool well_started = first < last && (isdigit(static_cast<unsigned char>(*first)) ||
                                             *first == '-' || *first == '.' || *first == 'i' ||
                                             *first == 'I' || *first == 'n' || *first == 'N');
  const bool hex = last - first >= 2 && first[0] == '0' && (first[1] == 'x' || first[1] == 'X');
  if (!well_started || hex) return {first, errc::invalid_argument};
  const string copy(first, last);
  char* end = nullptr;
  errno = 0;
  const double parsed = strtod(copy.c_str(), &end);
  const ptrdiff_t used = end - copy.c_str();
  if (used == 0) return {first, errc::invalid_argument};
  if (errno == ERANGE) return {first + used, errc::result_out_of_range};
  value = parsed;
  return {first + used, errc{}};
}

}  // namespace std

#endif

// std::make_unique_for_overwrite (libc++ 16; src/snapshot/document.cc): a
// default-initialised object or array, as the standard's.
#if defined(__EMSCRIPTEN__) && !defined(__cpp_lib_smart_ptr_for_overwrite)

namespace std {

template <class T>
requires(!is_array_v<T>) unique_ptr<T> make_unique_for_overwrite() { return unique_ptr<T>(new T); }

template <class T>
requires is_unbounded_array_v<T> unique_ptr<T> make_unique_for_overwrite(size_t n) {
  return unique_ptr<T>(new remove_extent_t<T>[n]);
}

}  // namespace std

#endif
