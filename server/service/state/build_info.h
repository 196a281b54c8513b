// logitd's version and build identifier, fixed when the server is compiled
// (CMake's PROJECT_VERSION and LOGITD_BUILD_ID); reported in ServerInfo and
// the startup line so results can be tied to the binary that made them.
#pragma once

#include "absl/strings/string_view.h"

namespace logitd::service {

// "0.1.0".
absl::string_view Version();
// Git revision and build type, e.g. "3f2a1c9b0d1e-Release".
absl::string_view BuildId();

}  // namespace logitd::service
