#include "server/service/state/logging.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace logitd::service {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

absl::Mutex& StderrMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "error") return LogLevel::kError;
  if (n == "warning" || n == "warn") return LogLevel::kWarning;
  if (n == "info") return LogLevel::kInfo;
  if (n == "debug") return LogLevel::kDebug;
  return absl::InvalidArgumentError(
      absl::StrCat("expected error, warning, info or debug, got '", name, "'"));
}

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kDebug:
      return "DEBUG";
  }
  return "?";
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

void Log(LogLevel level, absl::string_view message) {
  if (!LogEnabled(level)) return;
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   LogLevelName(level), " ", message, "\n");
  absl::MutexLock lock(&StderrMutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace logitd::service
