// Test-only fault injection (--test_fault): deliberately wrong outputs that
// let the validation harness prove each of its suites can fail. The faults
// exist only in builds configured with LOGITD_ENABLE_TEST_FAULTS=ON; other
// builds refuse a non-empty --test_fault and compile every hook to a no-op.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "logitd/tensor.h"

namespace logitd::service {

// Which faults are on; one bit per fault name.
struct FaultSet {
  enum Bit : std::uint32_t {
    kLogitsBit = 1u << 0,   // "logits_bit": flip bit 0 of element 0 of every Logits output
    kFp32AsBf16 = 1u << 1,  // "fp32_as_bf16": fp32 logits rounded to bf16 precision
    kNanToZero = 1u << 2,   // "nan_to_zero": NaN logits replaced by 0
    kDxBit = 1u << 3,       // "dx_bit": flip bit 0 of element 0 of dX
    kDwBit = 1u << 4,       // "dw_bit": flip bit 0 of element 0 of dW (and FetchGradient)
    kCastBit = 1u << 5,     // "cast_bit": flip bit 0 of element 0 of Cast output
    kFlakyBit = 1u << 6,    // "flaky_bit": logits_bit on every second Logits call
    kDigest = 1u << 7,      // "digest": announce a wrong xxh3 for Logits outputs
    // "device_faults": a Cast whose first value has the bits
    // kernels::kTestDeviceTrap traps on the device (a sticky fault), one with
    // kernels::kTestDeviceHang hangs it for 30 s (see backend.h)
    kDeviceFaults = 1u << 8,
  };
  std::uint32_t bits = 0;

  bool any() const { return bits != 0; }
  bool has(Bit b) const { return (bits & b) != 0; }
  // "logits_bit,digest"; empty when none.
  std::string ToString() const;
};

// True when this build was configured with LOGITD_ENABLE_TEST_FAULTS=ON.
bool TestFaultsCompiledIn();

// Parses "name[,name...]" (empty → none). InvalidArgument for an unknown name;
// FailedPrecondition for any fault in a build without fault support.
absl::StatusOr<FaultSet> ParseFaults(absl::string_view spec);

// Applies the configured faults to outputs just before they are digested
// and sent: to their bytes through the backend decorator of
// fault_backend.h, to their digests in the tensor call. Thread-safe.
class FaultInjector {
 public:
  explicit FaultInjector(FaultSet faults = {}) : faults_(faults) {}
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  const FaultSet& faults() const { return faults_; }

  // y: a Logits output of `dtype` (kFp32 or kBf16), `bytes` long.
  void OnLogits(DType dtype, std::byte* y, std::size_t bytes);
  // The xxh3 announced for output `output` of call `method`, computed as
  // `digest` ("digest" changes the Logits call's).
  std::uint64_t OutputDigest(absl::string_view method, absl::string_view output,
                             std::uint64_t digest) const;
  void OnDx(std::byte* dx, std::size_t bytes) const;
  void OnDw(std::byte* dw, std::size_t bytes) const;
  void OnCast(std::byte* out, std::size_t bytes) const;

 private:
  const FaultSet faults_;
  std::atomic<std::uint64_t> logits_calls_{0};
};

}  // namespace logitd::service
