// Status helpers missing from abseil 20220623: early return on error and
// assign-or-return. Use at fallible boundaries only.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KV_STATUS_CONCAT_INNER_(a, b) a##b
#define KV_STATUS_CONCAT_(a, b) KV_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function if it is not OK.
#define KV_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::absl::Status kv_status_tmp_ = (expr);          \
    if (!kv_status_tmp_.ok()) return kv_status_tmp_; \
  } while (0)

// `KV_ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns from a StatusOr,
// returning its status on error.
#define KV_ASSIGN_OR_RETURN(lhs, expr)                                      \
  KV_ASSIGN_OR_RETURN_IMPL_(KV_STATUS_CONCAT_(kv_statusor_, __LINE__), lhs, \
                            expr)
#define KV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()
