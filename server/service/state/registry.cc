#include "server/service/state/registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logitd/tensor.h"

namespace logitd::service {
namespace registry_internal {

// All fields are guarded by the owning registry's mutex.
struct Entry {
  std::string tenant;
  std::string handle;
  std::string name;
  std::int64_t v = 0;
  std::int64_t k = 0;
  std::uint64_t xxh3 = 0;
  std::shared_ptr<kernels::Weight> weight;
  std::uint64_t weight_bytes = 0;
  // The gradient buffer's bytes are charged to the budget.
  bool gradient_charged = false;
  // Backward calls accumulating into this weight right now.
  int accumulating = 0;
  // Outstanding RegisterWeight calls for these bytes not yet released.
  std::uint32_t registrations = 1;
  // Released: no longer in the table and no longer charged.
  bool released = false;
};

}  // namespace registry_internal

namespace {

// The same message whether or not another tenant holds the handle, so that
// a tenant learns nothing about the others' weights.
absl::Status HandleNotFound(const Tenant& tenant, absl::string_view handle) {
  return absl::NotFoundError(absl::StrCat(
      "weight handle '", handle, "' is not registered on this server",
      tenant.id.empty() ? "" : absl::StrCat(" for tenant '", tenant.id, "'"), " (see ListWeights",
      tenant.id.empty() ? "" : ", which lists this tenant's weights; handles are per tenant",
      "; handles do not survive a restart)"));
}

std::string LabelOf(absl::string_view name, absl::string_view handle, std::int64_t v,
                    std::int64_t k) {
  return absl::StrCat("'", name.empty() ? handle : name, "' ", ShapeString({v, k}));
}

}  // namespace

std::string WeightRecord::Label() const { return LabelOf(name, handle, v, k); }

// --- BudgetReservation -------------------------------------------------------

BudgetReservation::BudgetReservation(BudgetReservation&& o) noexcept { *this = std::move(o); }

BudgetReservation& BudgetReservation::operator=(BudgetReservation&& o) noexcept {
  if (this != &o) {
    Reset();
    registry_ = std::exchange(o.registry_, nullptr);
    tenant_ = std::move(o.tenant_);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

BudgetReservation::~BudgetReservation() { Reset(); }

void BudgetReservation::Reset() {
  if (registry_ != nullptr) registry_->ReturnReservation(tenant_, bytes_);
  registry_ = nullptr;
  tenant_.clear();
  bytes_ = 0;
}

// --- GradientTicket ----------------------------------------------------------

GradientTicket::GradientTicket(WeightRegistry* registry,
                               std::shared_ptr<registry_internal::Entry> entry)
    : registry_(registry), entry_(std::move(entry)) {}

GradientTicket::GradientTicket(GradientTicket&& o) noexcept { *this = std::move(o); }

GradientTicket& GradientTicket::operator=(GradientTicket&& o) noexcept {
  if (this != &o) {
    Reset();
    registry_ = std::exchange(o.registry_, nullptr);
    entry_ = std::move(o.entry_);
  }
  return *this;
}

GradientTicket::~GradientTicket() { Reset(); }

void GradientTicket::Reset() {
  if (registry_ != nullptr && entry_ != nullptr) registry_->EndAccumulate(*entry_);
  registry_ = nullptr;
  entry_.reset();
}

// --- WeightRegistry ----------------------------------------------------------

WeightRegistry::WeightRegistry(std::uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}
WeightRegistry::~WeightRegistry() = default;

std::string WeightRegistry::MakeHandle(std::uint64_t xxh3, std::int64_t v, std::int64_t k) {
  return absl::StrFormat("w-%016x-%dx%d", xxh3, v, k);
}

std::uint64_t WeightRegistry::WeightBytes(std::int64_t v, std::int64_t k) {
  return static_cast<std::uint64_t>(v) * static_cast<std::uint64_t>(k) * 2u;
}

std::uint64_t WeightRegistry::GradientBytes(std::int64_t v, std::int64_t k) {
  return static_cast<std::uint64_t>(v) * static_cast<std::uint64_t>(k) * 4u;
}

std::size_t WeightRegistry::weight_count() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

std::uint64_t WeightRegistry::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

std::uint64_t WeightRegistry::tenant_bytes_in_use(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenant_in_use_.find(tenant);
  return it == tenant_in_use_.end() ? 0 : it->second;
}

absl::Status WeightRegistry::Charge(const Tenant& tenant, std::uint64_t bytes,
                                    absl::string_view what) {
  auto it = tenant_in_use_.find(tenant.id);
  const std::uint64_t tenant_in_use = it == tenant_in_use_.end() ? 0 : it->second;
  const std::uint64_t quota = tenant.quota_bytes;
  if (quota > 0 && (bytes > quota || tenant_in_use > quota - bytes)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s needs %d bytes, but %s has a weight quota of %d bytes with %d in use (%d "
        "free); release this tenant's weights, or ask the server's operator to raise the "
        "tenant quota (--tenant_quota_bytes, or the third column of the --auth_tokens file)",
        what, bytes,
        tenant.id.empty() ? std::string("the default tenant")
                          : absl::StrCat("tenant '", tenant.id, "'"),
        quota, tenant_in_use, quota - std::min(tenant_in_use, quota)));
  }
  if (bytes > budget_bytes_ || in_use_ > budget_bytes_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s needs %d bytes, but the weight budget is %d bytes with %d in use (%d free); "
        "release weights or raise the server flag --weight_budget_bytes",
        what, bytes, budget_bytes_, in_use_, budget_bytes_ - std::min(in_use_, budget_bytes_)));
  }
  in_use_ += bytes;
  if (bytes > 0) tenant_in_use_[tenant.id] += bytes;
  return absl::OkStatus();
}

void WeightRegistry::Refund(const std::string& tenant, std::uint64_t bytes) {
  in_use_ -= std::min(bytes, in_use_);
  auto it = tenant_in_use_.find(tenant);
  if (it == tenant_in_use_.end()) return;
  it->second -= std::min(bytes, it->second);
  if (it->second == 0) tenant_in_use_.erase(it);
}

void WeightRegistry::ReturnReservation(const std::string& tenant, std::uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Refund(tenant, bytes);
}

absl::StatusOr<BudgetReservation> WeightRegistry::ReserveWeight(const Tenant& tenant,
                                                                absl::string_view label,
                                                                std::int64_t v, std::int64_t k) {
  const std::uint64_t bytes = WeightBytes(v, k);
  absl::MutexLock lock(&mu_);
  absl::Status s =
      Charge(tenant, bytes, absl::StrCat("weight ", label, " bf16 ", ShapeString({v, k})));
  if (!s.ok()) return s;
  return BudgetReservation(this, tenant.id, bytes);
}

WeightRecord WeightRegistry::Snapshot(const Entry& e) {
  WeightRecord r;
  r.handle = e.handle;
  r.name = e.name;
  r.v = e.v;
  r.k = e.k;
  r.xxh3 = e.xxh3;
  r.bytes = e.weight_bytes + (e.gradient_charged ? GradientBytes(e.v, e.k) : 0);
  r.has_gradient = e.weight != nullptr && e.weight->gradient_bytes() > 0;
  r.registrations = e.registrations;
  r.weight = e.weight;
  return r;
}

InsertResult WeightRegistry::Insert(const Tenant& tenant, BudgetReservation reservation,
                                    const std::string& handle, const std::string& name,
                                    std::int64_t v, std::int64_t k, std::uint64_t xxh3,
                                    std::shared_ptr<kernels::Weight> weight) {
  absl::MutexLock lock(&mu_);
  Key key(tenant.id, handle);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    // The reservation's destructor would take mu_ again: return its bytes here.
    Refund(reservation.tenant_, reservation.bytes_);
    reservation.registry_ = nullptr;
    ++it->second->registrations;
    return InsertResult{Snapshot(*it->second), true};
  }
  auto e = std::make_shared<Entry>();
  e->tenant = tenant.id;
  e->handle = handle;
  e->name = name;
  e->v = v;
  e->k = k;
  e->xxh3 = xxh3;
  e->weight = std::move(weight);
  // The reservation's bytes now belong to the entry.
  e->weight_bytes = reservation.bytes_;
  reservation.registry_ = nullptr;
  entries_.emplace(std::move(key), e);
  return InsertResult{Snapshot(*e), false};
}

absl::StatusOr<WeightRecord> WeightRegistry::Find(const Tenant& tenant,
                                                  absl::string_view handle) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(Key(tenant.id, handle));
  if (it == entries_.end()) {
    return HandleNotFound(tenant, handle);
  }
  return Snapshot(*it->second);
}

absl::StatusOr<WeightRecord> WeightRegistry::AddRegistration(const Tenant& tenant,
                                                             absl::string_view handle) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(Key(tenant.id, handle));
  if (it == entries_.end()) {
    return HandleNotFound(tenant, handle);
  }
  ++it->second->registrations;
  return Snapshot(*it->second);
}

std::vector<WeightRecord> WeightRegistry::List(const Tenant& tenant) const {
  absl::MutexLock lock(&mu_);
  std::vector<WeightRecord> out;
  // Keys sort by tenant first: the tenant's entries are one run, in handle order.
  for (auto it = entries_.lower_bound(Key(tenant.id, std::string()));
       it != entries_.end() && it->first.first == tenant.id; ++it) {
    out.push_back(Snapshot(*it->second));
  }
  return out;
}

absl::StatusOr<WeightRegistry::Released> WeightRegistry::Release(const Tenant& tenant,
                                                                 absl::string_view handle,
                                                                 bool force) {
  std::shared_ptr<Entry> e;
  std::uint64_t freed = 0;
  bool in_use = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(Key(tenant.id, handle));
    if (it == entries_.end()) {
      return HandleNotFound(tenant, handle);
    }
    if (!force && it->second->registrations > 1) {
      --it->second->registrations;
      return Released{0, 0, it->second->registrations};
    }
    e = std::move(it->second);
    entries_.erase(it);
    freed = e->weight_bytes + (e->gradient_charged ? GradientBytes(e->v, e->k) : 0);
    Refund(e->tenant, freed);
    e->released = true;
    e->gradient_charged = false;
    // In-flight calls hold their own reference to the backend's weight: its
    // memory goes when the last of them ends.
    in_use = e->weight.use_count() > 1;
    e->weight.reset();
  }
  // `e` (and possibly the backend's storage) is destroyed here, outside the lock.
  if (in_use) return Released{0, freed, 0};
  return Released{freed, 0, 0};
}

absl::StatusOr<GradientTicket> WeightRegistry::BeginAccumulate(const Tenant& tenant,
                                                               absl::string_view handle) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(Key(tenant.id, handle));
  if (it == entries_.end()) {
    return HandleNotFound(tenant, handle);
  }
  Entry& e = *it->second;
  if (!e.gradient_charged) {
    absl::Status s = Charge(
        tenant, GradientBytes(e.v, e.k),
        absl::StrCat("the fp32 gradient buffer of weight ", LabelOf(e.name, e.handle, e.v, e.k)));
    if (!s.ok()) return s;
    e.gradient_charged = true;
  }
  ++e.accumulating;
  return GradientTicket(this, it->second);
}

void WeightRegistry::EndAccumulate(Entry& e) {
  absl::MutexLock lock(&mu_);
  --e.accumulating;
  if (e.released || e.accumulating > 0 || !e.gradient_charged) return;
  // Every accumulating call has ended; if none made the backend create the
  // buffer (they all failed), the charge was for nothing.
  if (e.weight == nullptr || e.weight->gradient_bytes() == 0) {
    e.gradient_charged = false;
    Refund(e.tenant, GradientBytes(e.v, e.k));
  }
}

}  // namespace logitd::service
