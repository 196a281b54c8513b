// OipShmRegions: the Open Inference Protocol's system shared-memory regions
// over the service's ShmRegistry.
#include "server/service/oip/oip_shm.h"

#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/service/state/status.h"

namespace logitd::service {
namespace {

// The same message whether or not another tenant has a region of that name.
absl::Status RegionNotFound(const Tenant& tenant, absl::string_view name) {
  return absl::NotFoundError(absl::StrCat(
      "system shared-memory region '", name, "' is not registered on this server",
      tenant.id.empty() ? "" : absl::StrCat(" for tenant '", tenant.id, "'"),
      " (register it with SystemSharedMemoryRegister; regions are per tenant and do not survive "
      "an unregister or a restart)"));
}

// An integer parameter >= 0 of a tensor's shared-memory parameters.
absl::StatusOr<std::uint64_t> SizeParameter(absl::string_view what, absl::string_view key,
                                            const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param:
      if (p.int64_param() >= 0) return static_cast<std::uint64_t>(p.int64_param());
      break;
    case inference::InferParameter::kUint64Param:
      return p.uint64_param();
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": parameter '", key, "': expected an integer >= 0 (int64_param)"));
}

}  // namespace

absl::StatusOr<std::optional<OipShmRef>> ParseOipShmRef(absl::string_view what,
                                                        const OipParameters& params) {
  auto region = params.find("shared_memory_region");
  if (region == params.end()) return std::nullopt;
  OipShmRef ref;
  if (region->second.parameter_choice_case() != inference::InferParameter::kStringParam ||
      region->second.string_param().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": parameter 'shared_memory_region': expected the name of a registered region"));
  }
  ref.region = region->second.string_param();
  auto size = params.find("shared_memory_byte_size");
  if (size == params.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": parameter 'shared_memory_byte_size': expected the tensor's size in "
                     "the region, got none"));
  }
  LOGITD_ASSIGN_OR_RETURN(ref.byte_size,
                          SizeParameter(what, "shared_memory_byte_size", size->second));
  if (auto offset = params.find("shared_memory_offset"); offset != params.end()) {
    LOGITD_ASSIGN_OR_RETURN(ref.offset,
                            SizeParameter(what, "shared_memory_offset", offset->second));
  }
  return ref;
}

absl::StatusOr<std::shared_ptr<ShmMapping>> OipShmRegions::Register(const Tenant& tenant,
                                                                    const OipRegion& region) {
  LOGITD_RETURN_IF_ERROR(registry_->CheckAllowed("SystemSharedMemoryRegister"));
  if (region.name.empty()) {
    return absl::InvalidArgumentError("region name: expected one, got an empty name");
  }
  if (region.byte_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("region '", region.name, "': byte_size: expected at least 1 byte, got 0"));
  }
  if (region.offset > std::numeric_limits<std::uint64_t>::max() - region.byte_size) {
    return absl::InvalidArgumentError(absl::StrCat("region '", region.name, "': offset ",
                                                   region.offset, " + byte_size ", region.byte_size,
                                                   " overflows"));
  }
  // glibc's shm_open takes "name" as "/name"; the registry wants the slash.
  const std::string key =
      absl::StartsWith(region.key, "/") ? region.key : absl::StrCat("/", region.key);
  absl::MutexLock lock(&mu_);
  const Key k(tenant.id, region.name);
  if (entries_.count(k) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("system shared-memory region '", region.name,
                     "' is registered already; unregister it first, or choose another name"));
  }
  LOGITD_ASSIGN_OR_RETURN(ShmRecord r,
                          registry_->Register(tenant, key, region.offset + region.byte_size,
                                              ShmRegistry::SizeCheck::kAtLeast));
  entries_[k] = Entry{region, r.handle};
  return std::move(r.mapping);
}

absl::Status OipShmRegions::Unregister(const Tenant& tenant, absl::string_view name) {
  LOGITD_RETURN_IF_ERROR(registry_->CheckAllowed("SystemSharedMemoryUnregister"));
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.lower_bound(Key(tenant.id, std::string(name)));
       it != entries_.end() && it->first.first == tenant.id;) {
    if (!name.empty() && it->first.second != name) break;
    // NotFound only when logitd.v1's ReleaseShm let go of the handle already.
    registry_->Release(tenant, it->second.handle).IgnoreError();
    it = entries_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OipRegion>> OipShmRegions::Status(const Tenant& tenant,
                                                             absl::string_view name) const {
  LOGITD_RETURN_IF_ERROR(registry_->CheckAllowed("SystemSharedMemoryStatus"));
  std::vector<OipRegion> regions;
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.lower_bound(Key(tenant.id, std::string(name)));
       it != entries_.end() && it->first.first == tenant.id; ++it) {
    if (!name.empty() && it->first.second != name) break;
    regions.push_back(it->second.region);
  }
  if (!name.empty() && regions.empty()) return RegionNotFound(tenant, name);
  return regions;
}

absl::StatusOr<ShmSlice> OipShmRegions::Resolve(const Tenant& tenant, absl::string_view what,
                                                const OipShmRef& ref,
                                                std::uint64_t want_bytes) const {
  LOGITD_RETURN_IF_ERROR(registry_->CheckAllowed(what));
  Entry entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(Key(tenant.id, ref.region));
    if (it == entries_.end()) return RegionNotFound(tenant, ref.region);
    entry = it->second;
  }
  if (ref.byte_size != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shared_memory_byte_size ",
                                                   ref.byte_size, " is not the ", want_bytes,
                                                   " bytes the tensor takes"));
  }
  // First against the client's window, so that the message names its numbers.
  const ShmRef in_window{ref.region, ref.offset, ref.byte_size};
  LOGITD_RETURN_IF_ERROR(ValidateShmRef(what, in_window, entry.region.byte_size, want_bytes,
                                        /*is_output=*/false, 1));
  const ShmRef in_mapping{entry.handle, entry.region.offset + ref.offset, ref.byte_size};
  absl::StatusOr<ShmSlice> slice =
      registry_->Resolve(tenant, what, in_mapping, want_bytes, /*is_output=*/false, 1);
  // NotFound: logitd.v1's ReleaseShm let go of the handle.
  if (absl::IsNotFound(slice.status())) return RegionNotFound(tenant, ref.region);
  return slice;
}

}  // namespace logitd::service
