#include "server/service/state/build_info.h"

// LOGITD_BUILD_ID, written at build time (cmake/LogitdBuildId.cmake).
#include "logitd_build_id.h"

#ifndef LOGITD_VERSION
#define LOGITD_VERSION "unknown"
#endif

namespace logitd::service {

absl::string_view Version() { return LOGITD_VERSION; }
absl::string_view BuildId() { return LOGITD_BUILD_ID; }

}  // namespace logitd::service
