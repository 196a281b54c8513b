// The server's table of registered weights: content-derived handles, the
// weight byte budget (weights and their fp32 gradient buffers), and the
// shared ownership that makes releasing a weight safe while calls use it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/kernels/backend.h"

namespace logitd::service {

// Who a call acts for. Weights and their gradient buffers belong to one
// tenant: another tenant cannot see or use them, even with the right handle.
struct Tenant {
  // "" for the single default tenant of a server without --auth_tokens.
  std::string id;
  // Bytes of weights and gradient buffers this tenant may hold at most; 0 =
  // only the server's budget applies.
  std::uint64_t quota_bytes = 0;
};

class WeightRegistry;
namespace registry_internal {
struct Entry;
}  // namespace registry_internal

// A registered weight as callers see it: a snapshot of its metadata plus a
// reference that keeps the backend's storage alive for the caller's call.
struct WeightRecord {
  std::string handle;
  std::string name;
  std::int64_t v = 0;
  std::int64_t k = 0;
  std::uint64_t xxh3 = 0;
  // Bytes counted against the budget: the bf16 weight, plus the fp32
  // gradient buffer once one is reserved.
  std::uint64_t bytes = 0;
  bool has_gradient = false;
  // Outstanding registrations of these bytes (see Release).
  std::uint32_t registrations = 0;
  std::shared_ptr<kernels::Weight> weight;

  // "'lm_head.weight' [32768, 4096]" (the handle when the name is empty), for messages.
  std::string Label() const;
};

// Budget held for a weight whose bytes are still arriving. Move-only; gives
// the bytes back when destroyed unless WeightRegistry::Insert consumed it.
class BudgetReservation {
 public:
  BudgetReservation() = default;
  BudgetReservation(BudgetReservation&& o) noexcept;
  BudgetReservation& operator=(BudgetReservation&& o) noexcept;
  BudgetReservation(const BudgetReservation&) = delete;
  BudgetReservation& operator=(const BudgetReservation&) = delete;
  ~BudgetReservation();

  std::uint64_t bytes() const { return bytes_; }
  bool active() const { return registry_ != nullptr; }

 private:
  friend class WeightRegistry;
  BudgetReservation(WeightRegistry* registry, std::string tenant, std::uint64_t bytes)
      : registry_(registry), tenant_(std::move(tenant)), bytes_(bytes) {}
  void Reset();

  WeightRegistry* registry_ = nullptr;
  std::string tenant_;
  std::uint64_t bytes_ = 0;
};

// Held by a Backward call that accumulates into a weight's gradient buffer.
// The buffer's bytes are charged to the budget before the backend creates it;
// if every accumulating call ends without the backend having created it (all
// failed), the charge is returned when the last ticket goes.
class GradientTicket {
 public:
  GradientTicket() = default;
  GradientTicket(GradientTicket&& o) noexcept;
  GradientTicket& operator=(GradientTicket&& o) noexcept;
  GradientTicket(const GradientTicket&) = delete;
  GradientTicket& operator=(const GradientTicket&) = delete;
  ~GradientTicket();

 private:
  friend class WeightRegistry;
  GradientTicket(WeightRegistry* registry, std::shared_ptr<registry_internal::Entry> entry);
  void Reset();

  WeightRegistry* registry_ = nullptr;
  std::shared_ptr<registry_internal::Entry> entry_;
};

struct InsertResult {
  WeightRecord record;
  // True when an identical weight (same handle) was already registered; the
  // new copy was dropped, its reservation returned, and the existing entry's
  // registration count raised by one.
  bool already_registered = false;
};

// Thread-safe. Entries are keyed by (tenant, handle): every lookup names the
// tenant, so one tenant's handle is NotFound for another. Bytes are charged
// to the server's budget and to the tenant's quota in one place
// (Charge/Refund).
class WeightRegistry {
 public:
  explicit WeightRegistry(std::uint64_t budget_bytes);
  ~WeightRegistry();
  WeightRegistry(const WeightRegistry&) = delete;
  WeightRegistry& operator=(const WeightRegistry&) = delete;

  // "w-<16 hex digits of xxh3>-<V>x<K>": the same bytes and shape always give
  // the same handle, on any server.
  static std::string MakeHandle(std::uint64_t xxh3, std::int64_t v, std::int64_t k);
  // Bytes of a bf16 weight [v, k] and of its fp32 gradient buffer; the
  // caller has checked v*k*4 for overflow.
  static std::uint64_t WeightBytes(std::int64_t v, std::int64_t k);
  static std::uint64_t GradientBytes(std::int64_t v, std::int64_t k);

  std::uint64_t budget_bytes() const { return budget_bytes_; }
  // All tenants together.
  std::uint64_t bytes_in_use() const;
  std::uint64_t tenant_bytes_in_use(absl::string_view tenant) const;
  // Weights held, all tenants together.
  std::size_t weight_count() const;

  // Charges a weight [v, k] of `label` to the budget and to the tenant's
  // quota before any of its bytes are received. ResourceExhausted, naming the
  // quota or the budget, the bytes in use and the bytes asked, when it does
  // not fit.
  absl::StatusOr<BudgetReservation> ReserveWeight(const Tenant& tenant, absl::string_view label,
                                                  std::int64_t v, std::int64_t k);

  // Adds a loaded weight of `tenant` under `handle`, its budget taken from
  // `reservation` (made for the same tenant). When the tenant holds the
  // handle already (a concurrent registration of the same bytes won), returns
  // that entry and drops `weight` and the reservation.
  InsertResult Insert(const Tenant& tenant, BudgetReservation reservation,
                      const std::string& handle, const std::string& name, std::int64_t v,
                      std::int64_t k, std::uint64_t xxh3, std::shared_ptr<kernels::Weight> weight);

  // NotFound naming the handle, also when another tenant holds it.
  absl::StatusOr<WeightRecord> Find(const Tenant& tenant, absl::string_view handle) const;
  // Counts one more registration of a weight the tenant holds already (its
  // bytes were sent again and matched). NotFound when it is not held.
  absl::StatusOr<WeightRecord> AddRegistration(const Tenant& tenant, absl::string_view handle);
  // The tenant's weights, in handle order.
  std::vector<WeightRecord> List(const Tenant& tenant) const;
  // Takes one registration away (all of them when `force`); when none is
  // left, removes the entry and returns the bytes it had charged to the
  // budget. Calls holding the weight finish normally; its storage goes with
  // the last of them.
  // What a release freed: the memory that went at once, and the memory that
  // goes when the calls still using the weight end. Both are returned to the
  // budget and the tenant's quota at once.
  struct Released {
    std::uint64_t bytes_freed = 0;
    std::uint64_t bytes_freed_when_calls_end = 0;
    std::uint32_t registrations_left = 0;
  };
  absl::StatusOr<Released> Release(const Tenant& tenant, absl::string_view handle,
                                   bool force = false);

  // Charges the weight's fp32 gradient buffer to the budget and the tenant's
  // quota unless it is already charged. ResourceExhausted when it does not
  // fit; NotFound for a handle the tenant does not hold. Hold the ticket for
  // the duration of the backend call.
  absl::StatusOr<GradientTicket> BeginAccumulate(const Tenant& tenant, absl::string_view handle);

 private:
  friend class BudgetReservation;
  friend class GradientTicket;
  using Entry = registry_internal::Entry;
  // (tenant id, handle).
  using Key = std::pair<std::string, std::string>;

  absl::Status Charge(const Tenant& tenant, std::uint64_t bytes, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Refund(const std::string& tenant, std::uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnReservation(const std::string& tenant, std::uint64_t bytes);
  void EndAccumulate(Entry& entry);
  static WeightRecord Snapshot(const Entry& entry);

  const std::uint64_t budget_bytes_;
  mutable absl::Mutex mu_;
  std::uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes charged per tenant; a tenant with nothing charged has no entry.
  std::map<std::string, std::uint64_t, std::less<>> tenant_in_use_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::service
