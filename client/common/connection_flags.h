// The connection every logitctl command makes, validate included: the
// client options its flags (--timeout, --chunk_bytes, --lb, --token,
// --token_file, --ca, --cert, --key, defined by logitctl) and $LOGITD_TOKEN
// say, read by name and checked in one place, so that no command reads them
// differently.
#pragma once

#include "absl/status/statusor.h"
#include "logitd/client.h"

namespace logitd::client {

// InvalidArgument for a negative --timeout, a zero --chunk_bytes, an unknown
// --lb, both --token and --token_file, an empty token file, --cert or --key
// without the other or without --ca; NotFound for a file that cannot be
// read. A flag this binary does not define keeps the option's default.
absl::StatusOr<ClientOptions> ClientOptionsFromFlags();

}  // namespace logitd::client
