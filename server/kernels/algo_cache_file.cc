#include "server/kernels/algo_cache_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace logitd::kernels {
namespace {

constexpr char kFormat[] = "logitd-algo-cache";
// 1: one platform per file ("platform", "entries"); read, and rewritten as 2.
// 2: "platforms": [{"platform", "entries"}], every platform the file has met.
constexpr int kFormatVersion = 2;

struct PlatformEntries {
  std::string platform;
  std::vector<nlohmann::json> entries;
};

struct Parsed {
  std::vector<PlatformEntries> platforms;
  std::string ignored;  // why the file was not read as a cache file
};

Parsed ParseText(const std::string& text) {
  Parsed out;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", std::string()) != kFormat) {
    out.ignored = "is not a logitd algorithm cache";
    return out;
  }
  const int version = j.value("format_version", 0);
  auto entries_of = [](const nlohmann::json& p) {
    std::vector<nlohmann::json> entries;
    const auto it = p.find("entries");
    if (it == p.end() || !it->is_array()) return entries;
    for (const nlohmann::json& e : *it) {
      if (e.is_object()) entries.push_back(e);
    }
    return entries;
  };
  if (version == 1) {
    out.platforms.push_back({j.value("platform", std::string()), entries_of(j)});
  } else if (version == kFormatVersion && j.contains("platforms") && j["platforms"].is_array()) {
    for (const nlohmann::json& p : j["platforms"]) {
      if (p.is_object())
        out.platforms.push_back({p.value("platform", std::string()), entries_of(p)});
    }
  } else {
    out.ignored = absl::StrCat("has format version ", version, ", which this logitd does not read");
  }
  return out;
}

// The file's contents; an absent file is an empty one.
absl::StatusOr<Parsed> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return Parsed{};
    return absl::PermissionDeniedError(
        absl::StrCat("algorithm cache ", path, ": cannot read it: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseText(text.str());
}

// Written beside the file and renamed over it: a reader (or a crash) sees
// the old file or the new one, never half of one.
absl::Status WriteFile(const std::string& path, const std::vector<PlatformEntries>& platforms) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const PlatformEntries& p : platforms) {
    nlohmann::ordered_json entry;
    entry["platform"] = p.platform;
    entry["entries"] = p.entries;
    list.push_back(std::move(entry));
  }
  j["platforms"] = std::move(list);
  const std::string text = j.dump(1);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("algorithm cache ", path, ": cannot write '",
                                                    tmp, "': ", std::strerror(errno)));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size() &&
                       std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = !written ? write_errno : errno;
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(
        absl::StrCat("algorithm cache ", path, ": cannot write '", tmp, "': ", std::strerror(e)));
  }
  return absl::OkStatus();
}

std::string LockPath(const std::string& path) { return absl::StrCat(path, ".lock"); }

}  // namespace

absl::StatusOr<AlgoCacheFile> AlgoCacheFile::Open(std::string path, std::string platform,
                                                  KeyOf key_of) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      // Parents as the umask allows; the directory the file lives in is the
      // server's own.
      std::filesystem::create_directories(dir, ec);
      if (!ec) {
        std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::replace, ec);
      }
      if (ec) {
        return absl::PermissionDeniedError(absl::StrCat("algorithm cache ", path,
                                                        ": cannot create directory '", dir.string(),
                                                        "': ", ec.message()));
      }
    }
  }
  const int fd = ::open(LockPath(path).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("algorithm cache ", path, ": cannot create '",
                                                    LockPath(path), "': ", std::strerror(errno)));
  }
  ::close(fd);
  return AlgoCacheFile(std::move(path), std::move(platform), std::move(key_of));
}

AlgoCacheFile::Loaded AlgoCacheFile::Load() const {
  Loaded out;
  absl::StatusOr<Parsed> parsed = ReadFile(path_);
  if (!parsed.ok()) {
    out.ignored = std::string(parsed.status().message());
    return out;
  }
  out.ignored = parsed->ignored;
  for (PlatformEntries& p : parsed->platforms) {
    if (p.platform == platform_) {
      for (nlohmann::json& e : p.entries) out.entries.push_back(std::move(e));
    } else {
      out.other_platform_entries += static_cast<int>(p.entries.size());
    }
  }
  return out;
}

absl::StatusOr<nlohmann::json> AlgoCacheFile::Claim(const nlohmann::json& entry) {
  const int fd = ::open(LockPath(path_).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("algorithm cache ", path_, ": cannot open '",
                                                    LockPath(path_), "': ", std::strerror(errno)));
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("algorithm cache ", path_, ": cannot lock '",
                                              LockPath(path_), "': ", std::strerror(errno)));
    }
  }
  // Closing the descriptor releases the lock.
  absl::StatusOr<Parsed> parsed = ReadFile(path_);
  if (!parsed.ok()) return parsed.status();
  const std::string key = key_of_(entry);
  PlatformEntries* mine = nullptr;
  for (PlatformEntries& p : parsed->platforms) {
    if (p.platform == platform_) mine = &p;
  }
  if (mine == nullptr) {
    parsed->platforms.push_back({platform_, {}});
    mine = &parsed->platforms.back();
  }
  for (const nlohmann::json& e : mine->entries) {
    if (key_of_(e) == key) return e;
  }
  mine->entries.push_back(entry);
  absl::Status written = WriteFile(path_, parsed->platforms);
  if (!written.ok()) return written;
  return entry;
}

}  // namespace logitd::kernels
