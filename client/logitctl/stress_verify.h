// What `logitctl stress` checks Verify with: logitd's own outputs of one
// call, sent back as another implementation's, pass; the same with one
// element far from its value is found outside the proven bound, that
// element listed first.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "client/logitctl/stress_checks.h"
#include "logitd/client.h"

namespace logitd::logitctl::stress {

// One Verify round of M tokens over weight w: the logits, the cross-entropy's
// loss and lse per token, or LogProbs' logprob, lse and entropy (picked by
// rng), computed by the server a call before; every row or a seeded sample
// of them. *rpc names what was verified ("Verify(logits)", ...). The
// failed call's status in *status, else what is wrong, or empty.
std::string VerifyOwnOutputs(client::Client& c, const StressWeight& w, std::int64_t m,
                             std::mt19937_64& rng, std::string* rpc, absl::Status* status);

}  // namespace logitd::logitctl::stress
