// A plain-socket exchange with a server on 127.0.0.1, for the tests of the
// HTTP metrics endpoint.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace logitd::testing {

// Connects to 127.0.0.1:port, writes `request` and returns all the server
// wrote back before closing. Unavailable when it cannot connect or the write
// is short.
absl::StatusOr<std::string> LoopbackExchange(int port, absl::string_view request);

}  // namespace logitd::testing
