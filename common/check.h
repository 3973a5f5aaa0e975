// KV_CHECK: for conditions that "cannot happen" (programming errors). Aborts
// with file, line and message. Never use it for what a request or the
// environment can cause: return a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvserve::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line,
                                     const char* cond, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: KV_CHECK failed: %s %s\n", file, line, cond,
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace kvserve::internal

#define KV_CHECK(cond, ...)                                             \
  do {                                                                  \
    if (!(cond)) [[unlikely]]                                           \
      ::kvserve::internal::CheckFailed(__FILE__, __LINE__, #cond,       \
                                       ::absl::StrCat("" __VA_ARGS__)); \
  } while (0)

// KV_DCHECK: a KV_CHECK for debug builds (NDEBUG undefined) and sanitizer
// builds (KVSERVE_DCHECK_ALWAYS_ON, set by CMake with KVSERVE_SANITIZE);
// elsewhere the condition is not evaluated.
#if !defined(NDEBUG) || defined(KVSERVE_DCHECK_ALWAYS_ON)
#define KV_DCHECK_IS_ON 1
#else
#define KV_DCHECK_IS_ON 0
#endif

#if KV_DCHECK_IS_ON
#define KV_DCHECK(cond, ...) KV_CHECK(cond, __VA_ARGS__)
#else
#define KV_DCHECK(cond, ...) \
  do {                       \
  } while (false && (cond))
#endif
