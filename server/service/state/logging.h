// Minimal leveled logging for the server: one line per event on stderr, with
// a UTC timestamp and the level. The Abseil this project builds against has
// no absl/log, and the server needs nothing more than this.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace logitd::service {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// "error" | "warning" | "info" | "debug".
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
absl::string_view LogLevelName(LogLevel level);

// Messages above this level are dropped. Default kInfo.
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

// Writes one line; safe to call from any thread (lines never interleave).
void Log(LogLevel level, absl::string_view message);

inline void LogError(absl::string_view message) { Log(LogLevel::kError, message); }
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogInfo(absl::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogDebug(absl::string_view message) { Log(LogLevel::kDebug, message); }

}  // namespace logitd::service
