// The byte format the request fuzzer reads, shared by the fuzzer, its seed
// writer and the corpus replayer:
//
//   byte 0   which call: 0 RegisterWeight, 1 Logits, 2 Backward, 3 Cast,
//            4 CrossEntropy (taken modulo 5)
//   byte 1   V of the weight the call runs against: 1 + (byte % 64)
//   byte 2   K of that weight: 1 + (byte % 64)
//   byte 3   per-call byte limit (--max_request_bytes, and the weight budget
//            for RegisterWeight): 2^(byte % 21), plus 1 when bit 7 is set
//   then     frames, each a little-endian uint16 length and that many bytes:
//            one serialized request message of the call's type per frame (a
//            frame cut short by the end of the input keeps what is there)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace logitd::fuzz {

enum class Call : std::uint8_t {
  kRegisterWeight = 0,
  kLogits = 1,
  kBackward = 2,
  kCast = 3,
  kCrossEntropy = 4
};
inline constexpr int kCallCount = 5;
inline constexpr std::size_t kPrefixBytes = 4;

struct RequestInput {
  Call call = Call::kLogits;
  std::int64_t v = 1;
  std::int64_t k = 1;
  std::uint64_t max_request_bytes = 1;
  std::vector<std::string> messages;
};

// Nothing is rejected: a short input decodes as far as it goes.
inline RequestInput DecodeRequestInput(const std::uint8_t* data, std::size_t size) {
  RequestInput in;
  std::uint8_t prefix[kPrefixBytes] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < kPrefixBytes && i < size; ++i) prefix[i] = data[i];
  in.call = static_cast<Call>(prefix[0] % kCallCount);
  in.v = 1 + prefix[1] % 64;
  in.k = 1 + prefix[2] % 64;
  in.max_request_bytes = (std::uint64_t{1} << (prefix[3] % 21)) + ((prefix[3] & 0x80) ? 1 : 0);
  std::size_t pos = kPrefixBytes;
  while (pos + 2 <= size) {
    const std::size_t len = data[pos] | (std::size_t{data[pos + 1]} << 8);
    pos += 2;
    const std::size_t take = len < size - pos ? len : size - pos;
    in.messages.emplace_back(reinterpret_cast<const char*>(data + pos), take);
    pos += take;
  }
  return in;
}

// The inverse, for the seed writer: `limit_byte` is byte 3 as described above.
inline std::string EncodeRequestInput(Call call, std::uint8_t v_byte, std::uint8_t k_byte,
                                      std::uint8_t limit_byte,
                                      const std::vector<std::string>& messages) {
  std::string out;
  out.push_back(static_cast<char>(call));
  out.push_back(static_cast<char>(v_byte));
  out.push_back(static_cast<char>(k_byte));
  out.push_back(static_cast<char>(limit_byte));
  for (const std::string& m : messages) {
    const std::size_t len = m.size() > 0xffff ? 0xffff : m.size();
    out.push_back(static_cast<char>(len & 0xff));
    out.push_back(static_cast<char>(len >> 8));
    out.append(m, 0, len);
  }
  return out;
}

// The fuzzer's body (request_fuzzer.cc): decodes an input, runs it through
// validation and reassembly, aborts on a broken invariant and returns the
// status the service would have ended the call with (OK when accepted).
absl::Status RunRequest(const std::uint8_t* data, std::size_t size);

}  // namespace logitd::fuzz
