#include "logitd/tensor.h"

#include <sys/mman.h>
#include <xxhash.h>
#ifdef LOGITD_HAVE_XXH_DISPATCH
// XXH3_64bits and XXH3_64bits_update become their runtime-dispatched (AVX2,
// AVX-512) versions: the same digests, faster (see LogitdDependencies.cmake).
#include <xxh_x86dispatch.h>
#endif

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

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

std::uint64_t CopyXxh3(void* dst, const void* src, std::size_t size) {
  // A quarter of a typical L2: the block is read back from cache by the hash.
  constexpr std::size_t kBlock = std::size_t{256} << 10;
  if (size <= kBlock) {
    if (size != 0) std::memcpy(dst, src, size);
    return Xxh3(dst, size);
  }
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr || XXH3_64bits_reset(state) != XXH_OK) {
    if (state != nullptr) XXH3_freeState(state);
    std::memcpy(dst, src, size);
    return Xxh3(dst, size);
  }
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  for (std::size_t at = 0; at < size; at += kBlock) {
    const std::size_t n = std::min(kBlock, size - at);
    std::memcpy(d + at, s + at, n);
    XXH3_64bits_update(state, d + at, n);
  }
  const std::uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

namespace {

// Buffers from this size up are placed on 2 MiB boundaries and offered to the
// kernel for transparent huge pages: a 128 MiB response then takes 64 page
// faults instead of 32768 when it is first written.
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
constexpr std::size_t kHugeFrom = std::size_t{8} << 20;

std::byte* AllocateBytes(std::size_t n, bool zero) {
  if (n == 0) return nullptr;
  void* p = nullptr;
  if (n >= kHugeFrom) {
    const std::size_t rounded = (n + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
    (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only: fine where refused
    if (zero) std::memset(p, 0, n);
  } else {
    p = zero ? std::calloc(n, 1) : std::malloc(n);
    if (p == nullptr) throw std::bad_alloc();
  }
  return static_cast<std::byte*>(p);
}

}  // namespace

void Tensor::FreeBytes::operator()(std::byte* p) const noexcept { std::free(p); }

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape)
    : Tensor(dtype, std::move(shape), true) {}

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape, bool zero)
    : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = 1;
  for (std::int64_t d : shape_) numel_ *= d;
  nbytes_ = static_cast<std::size_t>(numel_) * ElementSize(dtype_);
  bytes_.reset(AllocateBytes(nbytes_, zero));
}

Tensor::Tensor(Tensor&& o) noexcept
    : dtype_(o.dtype_),
      shape_(std::move(o.shape_)),
      numel_(std::exchange(o.numel_, 0)),
      nbytes_(std::exchange(o.nbytes_, 0)),
      bytes_(std::move(o.bytes_)) {
  o.shape_.clear();
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    o.shape_.clear();
    numel_ = std::exchange(o.numel_, 0);
    nbytes_ = std::exchange(o.nbytes_, 0);
    bytes_ = std::move(o.bytes_);
  }
  return *this;
}

namespace {

absl::Status CheckCreatable(DType dtype, const std::vector<std::int64_t>& shape) {
  absl::StatusOr<std::int64_t> nbytes = CheckedByteCount(shape, dtype);
  if (!nbytes.ok()) return nbytes.status();
  if (static_cast<std::uint64_t>(*nbytes) > std::numeric_limits<std::size_t>::max()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor ", ShapeString(shape), " does not fit in memory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> Tensor::Create(DType dtype, std::vector<std::int64_t> shape) {
  if (absl::Status s = CheckCreatable(dtype, shape); !s.ok()) return s;
  return Tensor(dtype, std::move(shape), true);
}

absl::StatusOr<Tensor> Tensor::CreateUninitialized(DType dtype, std::vector<std::int64_t> shape) {
  if (absl::Status s = CheckCreatable(dtype, shape); !s.ok()) return s;
  return Tensor(dtype, std::move(shape), false);
}

Tensor Tensor::Clone() const {
  Tensor t(dtype_, shape_, false);
  if (nbytes_ != 0) std::memcpy(t.bytes_.get(), bytes_.get(), nbytes_);
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
