// Same-host shared memory: POSIX shared-memory objects (shm_open names,
// "/name", under /dev/shm) that a client creates, sizes and registers once;
// tensor calls then read inputs from and write outputs to them instead of
// streaming the bytes over gRPC. Off unless the server runs with --allow_shm.
//
// Regions belong to one tenant, like weights: another tenant's handle is
// NotFound. The server maps a region only when the object is owned by the
// server's own user, so the trust boundary is the Unix user: a client that
// can hand the server a region could signal the server process anyway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/service/state/registry.h"

namespace logitd::service {

struct ShmOptions {
  // --allow_shm: without it every shm request is FailedPrecondition.
  bool allowed = false;
  // Largest region the server maps, bytes.
  std::uint64_t max_region_bytes = std::uint64_t{16} << 30;
  // Regions one tenant may hold at once.
  std::uint32_t max_regions_per_tenant = 64;
  // --shm_in_place: a tensor call's inputs in a region are read where they
  // lie, their digest checked on a thread of its own while the backend
  // works (Call::ReadInPlace), instead of copied out and checked first.
  bool in_place = false;
};

// One mapped region; unmapped when the last reference goes (its release, or
// the end of a call that still used it).
class ShmMapping {
 public:
  ShmMapping(int fd, std::byte* base, std::uint64_t bytes, std::string name);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  std::byte* base() const { return base_; }
  std::uint64_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  // FailedPrecondition when the object was shrunk below the registered size
  // since registration (touching the lost pages would fault).
  absl::Status CheckStillSized() const;
  // Keeps `pin` (Backend::PinHostMemory's token) until just before unmapping.
  void set_pin(std::shared_ptr<void> pin) { pin_ = std::move(pin); }

 private:
  int fd_;
  std::byte* base_;
  std::uint64_t bytes_;
  std::string name_;
  std::shared_ptr<void> pin_;
};

// A region as a call sees it.
struct ShmRecord {
  std::string handle;
  std::shared_ptr<ShmMapping> mapping;
};

// A slice of a region as a request names it, whichever front door it came
// in by (logitd.v1's ShmRef, the Open Inference Protocol's parameters):
// the region's handle, and bytes [offset, offset + bytes) of it.
struct ShmRef {
  std::string region;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

// A checked slice [offset, offset + bytes) of a region, and where it is.
struct ShmSlice {
  std::shared_ptr<ShmMapping> mapping;
  std::byte* data = nullptr;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

// The shm_open name a RegisterShm request gives: "/" then 1 to 254 bytes
// without '/', NUL, or a "." / ".." name. InvalidArgument otherwise.
absl::Status ValidateShmName(absl::string_view name);

// Checks a ShmRef of tensor `what` against its region: the region named,
// offset + bytes inside the region (no overflow), `bytes` equal to
// `want_bytes` (an input) or at least it (an output), and an output offset
// aligned to `align` bytes. InvalidArgument with the numbers otherwise.
absl::Status ValidateShmRef(absl::string_view what, const ShmRef& ref, std::uint64_t region_bytes,
                            std::uint64_t want_bytes, bool is_output, std::uint64_t align);

// Thread-safe. Entries are keyed by (tenant, handle), as in WeightRegistry.
class ShmRegistry {
 public:
  explicit ShmRegistry(ShmOptions options) : options_(options) {}

  bool allowed() const { return options_.allowed; }
  std::uint64_t max_region_bytes() const { return options_.max_region_bytes; }
  // FailedPrecondition naming --allow_shm when shared memory is off.
  absl::Status CheckAllowed(absl::string_view what) const;

  // How Register checks the object's size against `bytes`.
  enum class SizeCheck {
    // The object has exactly `bytes` (logitd.v1's RegisterShm).
    kExact,
    // The object has at least `bytes`, of which the first `bytes` are mapped
    // (a region at an offset of a larger object, as the Open Inference
    // Protocol registers them).
    kAtLeast,
  };

  // Opens and maps `name` (read-write) for `tenant`. FailedPrecondition
  // without --allow_shm; InvalidArgument for a bad name, a size of 0, or an
  // object whose size does not pass `check`; ResourceExhausted over the size
  // limit or the tenant's region count; NotFound when no such object exists;
  // PermissionDenied when it is not the server user's own regular object.
  absl::StatusOr<ShmRecord> Register(const Tenant& tenant, absl::string_view name,
                                     std::uint64_t bytes, SizeCheck check = SizeCheck::kExact);
  // NotFound (the same message whether or not another tenant holds it).
  absl::StatusOr<ShmRecord> Find(const Tenant& tenant, absl::string_view handle) const;
  // Forgets the region; its mapping goes when calls still using it end.
  absl::Status Release(const Tenant& tenant, absl::string_view handle);
  // The slice `ref` names, checked (Find, then ValidateShmRef).
  absl::StatusOr<ShmSlice> Resolve(const Tenant& tenant, absl::string_view what, const ShmRef& ref,
                                   std::uint64_t want_bytes, bool is_output,
                                   std::uint64_t align) const;

  std::size_t region_count() const;

 private:
  using Key = std::pair<std::string, std::string>;

  const ShmOptions options_;
  mutable absl::Mutex mu_;
  std::uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<Key, std::shared_ptr<ShmMapping>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::service
