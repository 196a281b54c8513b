// `logitctl bench`: RPC-level load against a logitd server, in the spirit of
// Triton's perf_analyzer. Worker threads call one RPC through the C++ client
// library for a number of requests or seconds and the report gives requests/s,
// latency percentiles, payload GB/s each way, errors by status code and the
// server's time split from each call's "logitd-timing" trailer. A tensor RPC
// is followed by the same load over the Probe RPC (plain gRPC moving the same
// bytes), so that every report states logitd's efficiency against raw gRPC
// measured in the same run.
#pragma once

#include <string>
#include <vector>

#include "logitd/client.h"

namespace logitd::logitctl {

// Runs `logitctl bench` as the bench flags (defined in bench.cc) say. `words`
// are the command's positional words ("bench" and nothing after it).
// Returns logitctl's exit code: 0 when every request succeeded, 1 when any
// failed (the report counts them by status code), 2 for a usage error or an
// unreachable server.
int RunBench(const std::vector<std::string>& words, const client::ClientOptions& options,
             const std::string& server);

}  // namespace logitd::logitctl
