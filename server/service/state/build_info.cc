#include "server/service/state/build_info.h"

#ifndef LOGITD_VERSION
#define LOGITD_VERSION "unknown"
#endif
#ifndef LOGITD_BUILD_ID
#define LOGITD_BUILD_ID "unknown"
#endif

namespace logitd::service {

absl::string_view Version() { return LOGITD_VERSION; }
absl::string_view BuildId() { return LOGITD_BUILD_ID; }

}  // namespace logitd::service
