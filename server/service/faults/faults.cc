#include "server/service/faults/faults.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "logitd/bf16.h"

namespace logitd::service {
namespace {

constexpr std::pair<const char*, FaultSet::Bit> kNames[] = {
    {"logits_bit", FaultSet::kLogitsBit},
    {"fp32_as_bf16", FaultSet::kFp32AsBf16},
    {"nan_to_zero", FaultSet::kNanToZero},
    {"dx_bit", FaultSet::kDxBit},
    {"dw_bit", FaultSet::kDwBit},
    {"cast_bit", FaultSet::kCastBit},
    {"flaky_bit", FaultSet::kFlakyBit},
    {"digest", FaultSet::kDigest},
    {"device_faults", FaultSet::kDeviceFaults},
};

#ifdef LOGITD_TEST_FAULTS
// Element 0's lowest bit is bit 0 of byte 0 in little-endian order, for
// every dtype.
void FlipLowestBit(std::byte* data, std::size_t bytes) {
  if (bytes > 0) data[0] ^= std::byte{1};
}
#endif

}  // namespace

std::string FaultSet::ToString() const {
  std::vector<std::string> on;
  for (const auto& [name, bit] : kNames) {
    if (has(bit)) on.emplace_back(name);
  }
  return absl::StrJoin(on, ",");
}

bool TestFaultsCompiledIn() {
#ifdef LOGITD_TEST_FAULTS
  return true;
#else
  return false;
#endif
}

absl::StatusOr<FaultSet> ParseFaults(absl::string_view spec) {
  FaultSet set;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    bool known = false;
    for (const auto& [name, bit] : kNames) {
      if (part == name) {
        set.bits |= bit;
        known = true;
      }
    }
    if (!known) {
      std::vector<std::string> names;
      for (const auto& [name, bit] : kNames) names.emplace_back(name);
      return absl::InvalidArgumentError(absl::StrCat("--test_fault: expected names from {",
                                                     absl::StrJoin(names, ", "), "}, got '", part,
                                                     "'"));
    }
  }
  if (set.any() && !TestFaultsCompiledIn()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--test_fault=", spec,
        ": this logitd was built without test faults (configure with "
        "-DLOGITD_ENABLE_TEST_FAULTS=ON to get a server that produces deliberately wrong "
        "results)"));
  }
  return set;
}

#ifdef LOGITD_TEST_FAULTS

void FaultInjector::OnLogits(DType dtype, std::byte* y, std::size_t bytes) {
  if (!faults_.any()) return;
  if (faults_.has(FaultSet::kFp32AsBf16) && dtype == DType::kFp32) {
    for (std::size_t off = 0; off + 4 <= bytes; off += 4) {
      float f;
      std::memcpy(&f, y + off, 4);
      f = RoundToBf16(f);
      std::memcpy(y + off, &f, 4);
    }
  }
  if (faults_.has(FaultSet::kNanToZero)) {
    if (dtype == DType::kFp32) {
      for (std::size_t off = 0; off + 4 <= bytes; off += 4) {
        float f;
        std::memcpy(&f, y + off, 4);
        if (std::isnan(f)) std::memset(y + off, 0, 4);
      }
    } else if (dtype == DType::kBf16) {
      for (std::size_t off = 0; off + 2 <= bytes; off += 2) {
        Bf16Bits b;
        std::memcpy(&b, y + off, 2);
        if ((b & 0x7fffu) > 0x7f80u) std::memset(y + off, 0, 2);
      }
    }
  }
  if (faults_.has(FaultSet::kLogitsBit)) FlipLowestBit(y, bytes);
  if (faults_.has(FaultSet::kFlakyBit)) {
    // Calls 2, 4, 6, ...: two identical requests in a row never agree.
    if (logits_calls_.fetch_add(1) % 2 == 1) FlipLowestBit(y, bytes);
  }
}

std::uint64_t FaultInjector::OutputDigest(absl::string_view method, absl::string_view /*output*/,
                                          std::uint64_t digest) const {
  const bool wrong = faults_.has(FaultSet::kDigest) && method == "Logits";
  return wrong ? digest ^ 0x9e3779b97f4a7c15ull : digest;
}

void FaultInjector::OnDx(std::byte* dx, std::size_t bytes) const {
  if (faults_.has(FaultSet::kDxBit)) FlipLowestBit(dx, bytes);
}

void FaultInjector::OnDw(std::byte* dw, std::size_t bytes) const {
  if (faults_.has(FaultSet::kDwBit)) FlipLowestBit(dw, bytes);
}

void FaultInjector::OnCast(std::byte* out, std::size_t bytes) const {
  if (faults_.has(FaultSet::kCastBit)) FlipLowestBit(out, bytes);
}

#else  // !LOGITD_TEST_FAULTS: ParseFaults never yields a fault, so nothing to do.

void FaultInjector::OnLogits(DType, std::byte*, std::size_t) {}
std::uint64_t FaultInjector::OutputDigest(absl::string_view, absl::string_view,
                                          std::uint64_t digest) const {
  return digest;
}
void FaultInjector::OnDx(std::byte*, std::size_t) const {}
void FaultInjector::OnDw(std::byte*, std::size_t) const {}
void FaultInjector::OnCast(std::byte*, std::size_t) const {}

#endif

}  // namespace logitd::service
