// What one call moved and where its time went, whichever front door it
// came in by: filled as the call runs, read by CallRunner (call.h) for the
// trailers, the metrics and the log line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "server/service/state/registry.h"

namespace logitd::service {

// Bytes moved by one call, for its log line and metrics, and where its time
// went, for its "logitd-timing" trailer (see logitd.proto). -1: not measured
// for this call, left out of the trailer.
struct CallStats {
  // Who the call acts for: set before the call's body runs.
  Tenant tenant;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  // Tensor payload bytes (chunk data) received and sent, for the metrics.
  std::uint64_t tensor_bytes_in = 0;
  std::uint64_t tensor_bytes_out = 0;
  std::int64_t queue_us = -1;
  std::int64_t receive_us = -1;
  std::int64_t h2d_us = -1;
  std::int64_t compute_us = -1;
  std::int64_t d2h_us = -1;
  // Rows a block of a call run in row blocks; -1 for one run whole.
  std::int64_t pipeline_rows = -1;
  // The GEMMs the backend ran, for the "logitd-gemm" trailer.
  std::string gemms;
  // When the response started streaming out: send_us runs from here to the
  // end of the call.
  std::optional<absl::Time> send_start;
};

inline std::int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

}  // namespace logitd::service
