// The text form of `logitctl bench`'s report: the run's settings, a table
// with one column per measured RPC (requests, errors by status code,
// requests/s, latency percentiles, payload GB/s each way, the server's
// average time split) and the efficiency against raw gRPC.
#pragma once

#include <array>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace logitd::logitctl {

// The fields of the server's timing trailer, in report order; a phase's
// "server_avg" holds each as "<part>_us".
inline constexpr std::array<absl::string_view, 7> kBenchTimingParts = {
    "queue", "receive", "h2d", "compute", "d2h", "send", "total"};

// Prints the report that `logitctl bench --json` prints as JSON.
void PrintBenchText(const nlohmann::json& report);

}  // namespace logitd::logitctl
