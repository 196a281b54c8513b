#include "server/state_dir.h"

#include <pwd.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace logitd {
namespace {

// An absolute path from the environment, or empty.
std::string AbsoluteEnv(const GetEnv& getenv, const char* name) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] != '/') return std::string();
  return value;
}

}  // namespace

absl::StatusOr<std::string> DefaultStateDirectory(const GetEnv& getenv) {
  // systemd joins several StateDirectory= entries with ':'.
  const std::string systemd = AbsoluteEnv(getenv, "STATE_DIRECTORY");
  if (!systemd.empty()) {
    return std::string(std::pair<absl::string_view, absl::string_view>(
                           absl::StrSplit(systemd, absl::MaxSplits(':', 1)))
                           .first);
  }
  const std::string xdg = AbsoluteEnv(getenv, "XDG_STATE_HOME");
  if (!xdg.empty()) return absl::StrCat(xdg, "/logitd");
  std::string home = AbsoluteEnv(getenv, "HOME");
  if (home.empty()) {
    const passwd* pw = getpwuid(getuid());
    if (pw != nullptr && pw->pw_dir != nullptr && pw->pw_dir[0] == '/') home = pw->pw_dir;
  }
  if (home.empty()) {
    return absl::NotFoundError(
        "no state directory: none of STATE_DIRECTORY, XDG_STATE_HOME and HOME is an absolute "
        "path, and the user has no home directory");
  }
  return absl::StrCat(home, "/.local/state/logitd");
}

absl::StatusOr<std::string> AlgoCachePathFromFlag(absl::string_view flag, const GetEnv& getenv) {
  if (flag == "none") return std::string();
  if (flag == "auto") {
    absl::StatusOr<std::string> dir = DefaultStateDirectory(getenv);
    if (!dir.ok()) return dir.status();
    return absl::StrCat(*dir, "/algo_cache.json");
  }
  if (flag.empty()) {
    return absl::InvalidArgumentError(
        "--algo_cache: expected auto (the per-user state file), none, or a file path; got an "
        "empty value");
  }
  return std::string(flag);
}

absl::StatusOr<std::string> HistoryPathFromFlag(absl::string_view flag, const GetEnv& getenv) {
  if (flag == "none") return std::string();
  if (flag == "auto") {
    absl::StatusOr<std::string> dir = DefaultStateDirectory(getenv);
    if (!dir.ok()) return dir.status();
    return absl::StrCat(*dir, "/history.sqlite3");
  }
  if (flag.empty()) {
    return absl::InvalidArgumentError(
        "--history: expected auto (the per-user state directory's history.sqlite3), none, or "
        "a file path; got an empty value");
  }
  return std::string(flag);
}

}  // namespace logitd
