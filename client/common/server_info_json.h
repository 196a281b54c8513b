// ServerInfo as JSON, field names as in logitd.v1.ServerInfo: what
// `logitctl info --json` prints and the validation harness's reports record
// of the server, written in one place so the two cannot drift apart.
#pragma once

#include "logitd/client.h"
#include "nlohmann/json.hpp"

namespace logitd::client {

// The fields in a fixed order. `with_request_memory` adds the request-memory
// figures (budget, bytes in flight and their high water, requests in flight
// and their cap) after split_k: logitctl info shows them, the harness's
// reports leave them out.
nlohmann::ordered_json ServerInfoJson(const ServerInfo& info, bool with_request_memory);

}  // namespace logitd::client
