// Where a logitd server keeps what must outlive the process (the GEMM
// algorithm cache), for the user it runs as, when no flag names a place.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace logitd {

// Reads an environment variable; null when unset.
using GetEnv = std::function<const char*(const char*)>;

// systemd's $STATE_DIRECTORY (a unit with StateDirectory=; its first entry),
// else $XDG_STATE_HOME/logitd, else $HOME/.local/state/logitd (HOME from the
// password database when unset). Relative values are ignored, as the XDG
// base directory specification asks. NOT_FOUND when none can be found.
absl::StatusOr<std::string> DefaultStateDirectory(const GetEnv& getenv);

// The file --algo_cache names: `flag` is "auto" (the state directory's
// algo_cache.json), "none" (no file: empty result) or a path.
absl::StatusOr<std::string> AlgoCachePathFromFlag(absl::string_view flag, const GetEnv& getenv);

// The file --history names: "auto" (the state directory's
// history.sqlite3), "none" (no history: empty result) or a path.
absl::StatusOr<std::string> HistoryPathFromFlag(absl::string_view flag, const GetEnv& getenv);

}  // namespace logitd
