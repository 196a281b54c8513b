// The Open Inference Protocol's system shared-memory extension (Triton's
// SystemSharedMemoryRegister, Status and Unregister, and the
// shared_memory_* parameters of ModelInfer's tensors), over logitd's own
// ShmRegistry. An OIP region is a name the client chooses, per tenant, for
// the window [offset, offset + byte_size) of a shared-memory object; the
// registry maps the object's first offset + byte_size bytes under a handle
// of its own, so --allow_shm, --shm_max_region_bytes, the regions a tenant
// may hold and the owner check are the registry's.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kserve/grpc_predict_v2.pb.h"
#include "server/service/state/registry.h"
#include "server/service/state/shm.h"

namespace logitd::service {

using OipParameters = google::protobuf::Map<std::string, inference::InferParameter>;

// Where one input or requested output of a ModelInfer request lies: its
// shared_memory_region, shared_memory_byte_size and (optional, default 0)
// shared_memory_offset parameters.
struct OipShmRef {
  std::string region;
  std::uint64_t offset = 0;
  std::uint64_t byte_size = 0;
};

// The shared-memory parameters of tensor `what`: nullopt when it has no
// shared_memory_region. InvalidArgument when that is not a non-empty
// string, shared_memory_byte_size is missing, or a size or offset is not an
// integer >= 0.
absl::StatusOr<std::optional<OipShmRef>> ParseOipShmRef(absl::string_view what,
                                                        const OipParameters& params);

// A registered region, as SystemSharedMemoryStatus reports it.
struct OipRegion {
  std::string name;
  // The shm_open name the client gave ("/name").
  std::string key;
  std::uint64_t offset = 0;
  std::uint64_t byte_size = 0;
};

// Thread-safe. Names are per tenant, like the registry's handles: one
// tenant never sees, uses or unregisters another's regions.
class OipShmRegions {
 public:
  // Not owning: `registry` outlives this.
  explicit OipShmRegions(ShmRegistry* registry) : registry_(registry) {}

  // Registers `region` for `tenant` and returns its mapping (to be pinned).
  // FailedPrecondition without --allow_shm; AlreadyExists when the tenant
  // holds a region of that name; InvalidArgument for an empty name, a
  // byte_size of 0, or offset + byte_size overflowing; otherwise as
  // ShmRegistry::Register for offset + byte_size bytes of the object `key`
  // (which must hold at least that many).
  absl::StatusOr<std::shared_ptr<ShmMapping>> Register(const Tenant& tenant,
                                                       const OipRegion& region);
  // Unregisters the tenant's region `name`, or all of them when `name` is
  // empty; an unknown name is no error (as Triton). A mapping goes when the
  // calls still using it end. FailedPrecondition without --allow_shm.
  absl::Status Unregister(const Tenant& tenant, absl::string_view name);
  // The tenant's region `name`, or all of them when `name` is empty.
  // NotFound for an unknown name; FailedPrecondition without --allow_shm.
  absl::StatusOr<std::vector<OipRegion>> Status(const Tenant& tenant, absl::string_view name) const;
  // The slice `ref` names for tensor `what`, which takes `want_bytes`.
  // NotFound for a region the tenant has not registered; InvalidArgument
  // when byte_size is not `want_bytes` or the slice leaves the region;
  // FailedPrecondition without --allow_shm.
  absl::StatusOr<ShmSlice> Resolve(const Tenant& tenant, absl::string_view what,
                                   const OipShmRef& ref, std::uint64_t want_bytes) const;

 private:
  struct Entry {
    OipRegion region;
    // The registry's handle of the mapping.
    std::string handle;
  };
  // (tenant id, region name).
  using Key = std::pair<std::string, std::string>;

  ShmRegistry* registry_;
  mutable absl::Mutex mu_;
  std::map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::service
