// A small host tensor: dtype, shape and an owned byte buffer, row-major and
// little-endian. This is what the client library takes and returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace logitd {

enum class DType { kBf16, kFp32, kInt32, kInt64 };

// Bytes per element.
std::size_t ElementSize(DType dtype);
// "bf16", "fp32", "int32", "int64".
absl::string_view DTypeName(DType dtype);
// Accepts the names above plus the usual aliases ("bfloat16", "float32", "f32", "BF16", ...).
absl::StatusOr<DType> ParseDType(absl::string_view name);

// "[16, 4096]".
std::string ShapeString(absl::Span<const std::int64_t> shape);

// Product of dims, checked: InvalidArgument for a negative or zero dim, or a
// product (times element_size) past INT64_MAX.
absl::StatusOr<std::int64_t> CheckedElementCount(absl::Span<const std::int64_t> shape);
absl::StatusOr<std::int64_t> CheckedByteCount(absl::Span<const std::int64_t> shape, DType dtype);

// xxh3-64 (seed 0) of a byte range: the digest every tensor travels with.
std::uint64_t Xxh3(const void* data, std::size_t size);
// Copies `size` bytes from src to dst and returns their Xxh3, in one pass:
// block by block, each block hashed while it is still in cache.
std::uint64_t CopyXxh3(void* dst, const void* src, std::size_t size);

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor. Use Create() for shapes from untrusted input.
  Tensor(DType dtype, std::vector<std::int64_t> shape);
  static absl::StatusOr<Tensor> Create(DType dtype, std::vector<std::int64_t> shape);
  // Like Create, but the bytes are left as the allocator returns them: for a
  // tensor that is about to be overwritten in full (received, computed), so
  // that gigabytes are not zeroed first for nothing.
  static absl::StatusOr<Tensor> CreateUninitialized(DType dtype, std::vector<std::int64_t> shape);

  // A moved-from tensor is empty: no shape, no bytes.
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  // Copies are explicit: tensors can be gigabytes.
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor Clone() const;

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_[static_cast<std::size_t>(i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return nbytes_; }

  std::byte* bytes() { return bytes_.get(); }
  const std::byte* bytes() const { return bytes_.get(); }
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(bytes_.get());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes_.get());
  }

  std::uint64_t Digest() const { return Xxh3(bytes_.get(), nbytes_); }

  // Element i widened to double (bf16/fp32 exactly; integers exactly below 2^53).
  double At(std::int64_t i) const;

 private:
  struct FreeBytes {
    void operator()(std::byte* p) const noexcept;
  };
  Tensor(DType dtype, std::vector<std::int64_t> shape, bool zero);

  DType dtype_ = DType::kFp32;
  std::vector<std::int64_t> shape_;
  std::int64_t numel_ = 0;
  std::size_t nbytes_ = 0;
  std::unique_ptr<std::byte[], FreeBytes> bytes_;
};

}  // namespace logitd
