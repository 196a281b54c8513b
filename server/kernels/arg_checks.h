// The checks the operations' CheckArgs make of their arguments, in one
// wording for every backend and operation ("<call>: x is null", "<call>:
// expected m (rows of x) >= 1, got 0", ...).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "logitd/tensor.h"

namespace logitd::kernels {

inline absl::Status CheckNotNull(absl::string_view call, absl::string_view name, const void* p) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(call, ": ", name, " is null"));
  return absl::OkStatus();
}

inline absl::Status CheckRows(absl::string_view call, std::int64_t m) {
  if (m < 1) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": expected m (rows of x) >= 1, got ", m));
  }
  return absl::OkStatus();
}

// The dtypes every floating-point tensor of the interface may take.
inline absl::Status CheckFloatDType(absl::string_view call, absl::string_view name, DType dtype) {
  if (dtype != DType::kFp32 && dtype != DType::kBf16) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": expected ", name, " fp32 or bf16, got ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

// A tensor the call reads or writes must have a byte count that fits in
// int64 (and so in size_t): backends then size it without overflow.
inline absl::Status CheckBytes(absl::string_view call, absl::string_view name,
                               std::initializer_list<std::int64_t> shape, DType dtype) {
  absl::StatusOr<std::int64_t> bytes = CheckedByteCount(shape, dtype);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": ", name, " ", DTypeName(dtype), ": ", bytes.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace logitd::kernels
