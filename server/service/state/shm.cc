#include "server/service/state/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace logitd::service {
namespace {

// NAME_MAX of tmpfs, the leading '/' not counted.
constexpr std::size_t kMaxShmNameBytes = 255;

absl::Status RegionNotFound(const Tenant& tenant, absl::string_view handle) {
  return absl::NotFoundError(absl::StrCat(
      "shared-memory region '", handle, "' is not registered on this server",
      tenant.id.empty() ? "" : absl::StrCat(" for tenant '", tenant.id, "'"),
      " (register it with RegisterShm; region handles are per tenant and do not survive a "
      "release or a restart)"));
}

std::string Errno(int err) { return std::strerror(err); }

}  // namespace

ShmMapping::ShmMapping(int fd, std::byte* base, std::uint64_t bytes, std::string name)
    : fd_(fd), base_(base), bytes_(bytes), name_(std::move(name)) {}

ShmMapping::~ShmMapping() {
  pin_.reset();  // unpinned while still mapped
  munmap(base_, static_cast<std::size_t>(bytes_));
  close(fd_);
}

absl::Status ShmMapping::CheckStillSized() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory region '", name_, "': fstat failed: ", Errno(errno)));
  }
  if (static_cast<std::uint64_t>(st.st_size) < bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory region '", name_, "' was shrunk to ", st.st_size,
                     " bytes after it was registered with ", bytes_,
                     " bytes; release it and register it again"));
  }
  return absl::OkStatus();
}

absl::Status ValidateShmName(absl::string_view name) {
  if (name.empty() || name[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm name: expected a POSIX shared-memory name such as '/logitd-x', got '", name, "'"));
  }
  const absl::string_view rest = name.substr(1);
  if (rest.empty() || rest.size() > kMaxShmNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shm name: expected 1 to ", kMaxShmNameBytes,
                                                   " bytes after the leading '/', got ",
                                                   rest.size()));
  }
  if (absl::StrContains(rest, '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name '", name, "': no '/' allowed beyond the leading one"));
  }
  if (absl::StrContains(rest, '\0')) {
    return absl::InvalidArgumentError("shm name: holds a NUL byte");
  }
  if (rest == "." || absl::StrContains(rest, "..")) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm name '", name, "': '.' and '..' are not allowed"));
  }
  return absl::OkStatus();
}

absl::Status ValidateShmRef(absl::string_view what, const ShmRef& ref, std::uint64_t region_bytes,
                            std::uint64_t want_bytes, bool is_output, std::uint64_t align) {
  if (is_output ? ref.bytes < want_bytes : ref.bytes != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shm bytes ", ref.bytes, is_output ? " is less than the " : " is not the ",
        want_bytes, " bytes the tensor takes"));
  }
  if (ref.offset > region_bytes || ref.bytes > region_bytes - ref.offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shm offset ", ref.offset, " + bytes ",
                                                   ref.bytes, " exceeds region '", ref.region,
                                                   "' of ", region_bytes, " bytes"));
  }
  if (is_output && align > 1 && ref.offset % align != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shm offset ", ref.offset, " is not a multiple of ", align, " (the element size)"));
  }
  return absl::OkStatus();
}

absl::Status ShmRegistry::CheckAllowed(absl::string_view what) const {
  if (options_.allowed) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": shared memory is off on this server (start logitd with --allow_shm to use it)"));
}

absl::StatusOr<ShmRecord> ShmRegistry::Register(const Tenant& tenant, absl::string_view name,
                                                std::uint64_t bytes, SizeCheck check) {
  if (absl::Status s = CheckAllowed("RegisterShm"); !s.ok()) return s;
  if (absl::Status s = ValidateShmName(name); !s.ok()) return s;
  if (bytes == 0) {
    return absl::InvalidArgumentError("shm size: expected at least 1 byte, got 0");
  }
  if (bytes > options_.max_region_bytes ||
      bytes > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("shm region '", name, "' of ", bytes, " bytes exceeds the server's limit of ",
                     options_.max_region_bytes, " bytes (--shm_max_region_bytes)"));
  }
  {
    absl::MutexLock lock(&mu_);
    std::uint32_t held = 0;
    for (const auto& [key, mapping] : entries_) held += key.first == tenant.id ? 1 : 0;
    if (held >= options_.max_regions_per_tenant) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shm: ", held,
                       " regions registered already, the most one tenant may hold; "
                       "release one with ReleaseShm"));
    }
  }

  const std::string path(name);
  // shm_open adds O_NOFOLLOW and O_CLOEXEC; the object must exist already.
  const int fd = shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "shm region '", name, "': no such shared-memory object on the server's host"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("shm region '", name, "': the server cannot open it: ", Errno(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("shm region '", name, "': fstat: ", Errno(err)));
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "shm region '", name, "': expected a shared-memory object owned by the server's user (uid ",
        geteuid(), "), got one owned by uid ", st.st_uid));
  }
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (check == SizeCheck::kExact ? size != bytes : size < bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "shm region '", name, "': registered as ", check == SizeCheck::kExact ? "" : "reaching ",
        bytes, " bytes, but the object has ", st.st_size, " bytes"));
  }
  void* base =
      mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("shm region '", name, "': mmap of ", bytes, " bytes failed: ", Errno(err)));
  }
  auto mapping =
      std::make_shared<ShmMapping>(fd, static_cast<std::byte*>(base), bytes, std::string(name));

  absl::MutexLock lock(&mu_);
  std::string handle = absl::StrCat("shm-", next_id_++);
  entries_[Key(tenant.id, handle)] = mapping;
  return ShmRecord{std::move(handle), std::move(mapping)};
}

absl::StatusOr<ShmRecord> ShmRegistry::Find(const Tenant& tenant, absl::string_view handle) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(Key(tenant.id, std::string(handle)));
  if (it == entries_.end()) return RegionNotFound(tenant, handle);
  return ShmRecord{std::string(handle), it->second};
}

absl::Status ShmRegistry::Release(const Tenant& tenant, absl::string_view handle) {
  if (absl::Status s = CheckAllowed("ReleaseShm"); !s.ok()) return s;
  std::shared_ptr<ShmMapping> gone;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(Key(tenant.id, std::string(handle)));
  if (it == entries_.end()) return RegionNotFound(tenant, handle);
  gone = std::move(it->second);
  entries_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<ShmSlice> ShmRegistry::Resolve(const Tenant& tenant, absl::string_view what,
                                              const ShmRef& ref, std::uint64_t want_bytes,
                                              bool is_output, std::uint64_t align) const {
  if (absl::Status s = CheckAllowed(what); !s.ok()) return s;
  if (ref.region.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shm region: expected a handle from RegisterShm, got an empty one"));
  }
  absl::StatusOr<ShmRecord> r = Find(tenant, ref.region);
  if (!r.ok()) return r.status();
  if (absl::Status s = ValidateShmRef(what, ref, r->mapping->bytes(), want_bytes, is_output, align);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r->mapping->CheckStillSized(); !s.ok()) return s;
  ShmSlice slice;
  slice.data = r->mapping->base() + ref.offset;
  slice.offset = ref.offset;
  slice.bytes = ref.bytes;
  slice.mapping = std::move(r->mapping);
  return slice;
}

std::size_t ShmRegistry::region_count() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace logitd::service
