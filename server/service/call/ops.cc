#include "server/service/call/ops.h"

namespace logitd::service {

WeightDims DimsOf(const WeightRecord& w) { return WeightDims{w.v, w.k, w.Label()}; }

absl::StatusOr<WeightRecord> FindWeight(const WeightRegistry& registry, const Tenant& tenant,
                                        absl::string_view handle) {
  if (handle.empty()) {
    return absl::InvalidArgumentError(
        "weight_handle: expected a handle from RegisterWeight, got an empty string");
  }
  return registry.Find(tenant, handle);
}

}  // namespace logitd::service
