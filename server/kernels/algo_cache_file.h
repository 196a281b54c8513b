// The file a GPU backend keeps its chosen GEMM algorithms in, shared by every
// server process of one user on one machine, so that a restarted server (or a
// second one beside it) runs the algorithms the first chose and gives the
// same bits. Entries are opaque JSON objects grouped by platform (device,
// driver and library versions: whatever makes a choice valid); the first
// process to record an entry for a key decides for all.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace logitd::kernels {

class AlgoCacheFile {
 public:
  // The key an entry is recorded under (e.g. its operation and shape).
  using KeyOf = std::function<std::string(const nlohmann::json& entry)>;

  // Creates the file's directory when missing (mode 0700, as a state
  // directory should be) and the lock file beside the file, so that a
  // directory the server cannot write is reported at start, not at the first
  // choice. The file itself is created by the first Claim.
  static absl::StatusOr<AlgoCacheFile> Open(std::string path, std::string platform, KeyOf key_of);

  struct Loaded {
    std::vector<nlohmann::json> entries;  // this platform's
    // Entries kept for other platforms (another GPU, driver or library).
    int other_platform_entries = 0;
    // Why nothing was read, when the file exists but is not a cache file
    // (it is then replaced by the next Claim); empty otherwise.
    std::string ignored;
  };
  // This platform's entries as the file holds them now (none when it does
  // not exist yet).
  Loaded Load() const;

  // Records `entry` unless the file already holds one with the same key for
  // this platform, and returns the entry that stands: `entry`, or the one
  // another process recorded first. The file is re-read and rewritten
  // atomically under an exclusive lock, so concurrent processes neither lose
  // each other's entries nor disagree about one.
  absl::StatusOr<nlohmann::json> Claim(const nlohmann::json& entry);

  const std::string& path() const { return path_; }
  const std::string& platform() const { return platform_; }

 private:
  AlgoCacheFile(std::string path, std::string platform, KeyOf key_of)
      : path_(std::move(path)), platform_(std::move(platform)), key_of_(std::move(key_of)) {}

  std::string path_;
  std::string platform_;
  KeyOf key_of_;
};

}  // namespace logitd::kernels
