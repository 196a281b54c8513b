// `logitctl stress`: a correctness soak of a logitd server, the load a GPU
// box shared by many clients and CI jobs sees. Worker threads, each on its
// own connection, call every tensor RPC (Logits fp32 and bf16, Backward with
// every dtype mix, with and without accumulation, FetchGradient, Cast,
// CrossEntropy) with random shapes (M from 1 up to --stress_max_m, weights of
// odd sizes, outputs up to --stress_max_output_bytes) for --duration seconds,
// and check every result: sampled elements of integer-valued problems equal
// the exact sums bitwise, those of random ones sit inside the fp32
// accumulation bound of an fp64 reference. The report counts calls, errors
// (by status code), wrong results, calls slower than --stress_slow_call, and
// the server's device memory before and after.
#pragma once

#include <string>
#include <vector>

#include "logitd/client.h"

namespace logitd::logitctl {

// Exit code: 0 when every call succeeded with a right result, 1 when any
// failed or was wrong, 2 for a usage error or an unreachable server.
int RunStress(const std::vector<std::string>& words, const client::ClientOptions& options,
              const std::string& server);

}  // namespace logitd::logitctl
