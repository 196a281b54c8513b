#include "logitd/tensor.h"

#include <xxhash.h>

#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "logitd/bf16.h"

namespace logitd {

std::size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return 2;
    case DType::kFp32:
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "bf16";
    case DType::kFp32:
      return "fp32";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "bf16" || n == "bfloat16") return DType::kBf16;
  if (n == "fp32" || n == "f32" || n == "float32" || n == "float") return DType::kFp32;
  if (n == "int32" || n == "i32") return DType::kInt32;
  if (n == "int64" || n == "i64") return DType::kInt64;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "': expected bf16, fp32, int32 or int64"));
}

std::string ShapeString(absl::Span<const std::int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::int64_t> CheckedElementCount(absl::Span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), ": every dimension must be >= 1"));
    }
    if (n > std::numeric_limits<std::int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), ": element count overflows int64"));
    }
    n *= d;
  }
  return n;
}

absl::StatusOr<std::int64_t> CheckedByteCount(absl::Span<const std::int64_t> shape, DType dtype) {
  absl::StatusOr<std::int64_t> n = CheckedElementCount(shape);
  if (!n.ok()) return n.status();
  const auto es = static_cast<std::int64_t>(ElementSize(dtype));
  if (*n > std::numeric_limits<std::int64_t>::max() / es) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), ": byte count overflows int64"));
  }
  return *n * es;
}

std::uint64_t Xxh3(const void* data, std::size_t size) { return XXH3_64bits(data, size); }

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = 1;
  for (std::int64_t d : shape_) numel_ *= d;
  bytes_.resize(static_cast<std::size_t>(numel_) * ElementSize(dtype_));
}

absl::StatusOr<Tensor> Tensor::Create(DType dtype, std::vector<std::int64_t> shape) {
  absl::StatusOr<std::int64_t> nbytes = CheckedByteCount(shape, dtype);
  if (!nbytes.ok()) return nbytes.status();
  if (static_cast<std::uint64_t>(*nbytes) > std::numeric_limits<std::size_t>::max()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor ", ShapeString(shape), " does not fit in memory"));
  }
  return Tensor(dtype, std::move(shape));
}

Tensor Tensor::Clone() const {
  Tensor t(dtype_, shape_);
  if (!bytes_.empty()) std::memcpy(t.bytes_.data(), bytes_.data(), bytes_.size());
  return t;
}

double Tensor::At(std::int64_t i) const {
  switch (dtype_) {
    case DType::kBf16:
      return Bf16ToFloat(data<Bf16Bits>()[i]);
    case DType::kFp32:
      return data<float>()[i];
    case DType::kInt32:
      return data<std::int32_t>()[i];
    case DType::kInt64:
      return static_cast<double>(data<std::int64_t>()[i]);
  }
  return 0;
}

}  // namespace logitd
