// Weight registry: content-derived handles, deduplication, the byte budget
// (checked before anything is allocated) and release semantics.
#include "server/service/state/registry.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace logitd::service {
namespace {

using ::testing::HasSubstr;

// The default tenant (a server without --auth_tokens).
const Tenant kTenant;

// Stands in for a backend's weight; counts live instances so tests can see
// when the storage goes.
class FakeWeight final : public kernels::Weight {
 public:
  FakeWeight(std::int64_t v, std::int64_t k, std::atomic<int>* live) : Weight(v, k), live_(live) {
    ++*live_;
  }
  ~FakeWeight() override { --*live_; }
  std::uint64_t weight_bytes() const override { return v() * k() * 2; }
  std::uint64_t gradient_bytes() const override { return gradient_ ? v() * k() * 4 : 0; }
  void CreateGradient() { gradient_ = true; }

 private:
  std::atomic<int>* live_;
  std::atomic<bool> gradient_{false};
};

class RegistryTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeWeight> MakeWeight(std::int64_t v, std::int64_t k) {
    return std::make_shared<FakeWeight>(v, k, &live_);
  }
  InsertResult Register(WeightRegistry& r, std::uint64_t xxh3, std::int64_t v, std::int64_t k,
                        const std::string& name = "lm_head", const Tenant& tenant = kTenant) {
    absl::StatusOr<BudgetReservation> res = r.ReserveWeight(tenant, "'lm_head'", v, k);
    EXPECT_TRUE(res.ok()) << res.status();
    return r.Insert(tenant, std::move(*res), WeightRegistry::MakeHandle(xxh3, v, k), name, v, k,
                    xxh3, MakeWeight(v, k));
  }
  std::atomic<int> live_{0};
};

TEST_F(RegistryTest, HandleIsDerivedFromDigestAndShape) {
  EXPECT_EQ(WeightRegistry::MakeHandle(0x0123456789abcdefull, 32768, 4096),
            "w-0123456789abcdef-32768x4096");
  EXPECT_EQ(WeightRegistry::MakeHandle(1, 2, 3), "w-0000000000000001-2x3");
  EXPECT_NE(WeightRegistry::MakeHandle(1, 2, 3), WeightRegistry::MakeHandle(1, 3, 2));
}

TEST_F(RegistryTest, SameBytesSameHandleNoSecondCopy) {
  WeightRegistry r(1 << 20);
  InsertResult a = Register(r, 42, 16, 8);
  EXPECT_FALSE(a.already_registered);
  EXPECT_EQ(r.bytes_in_use(), 16u * 8 * 2);
  InsertResult b = Register(r, 42, 16, 8, "another name");
  EXPECT_TRUE(b.already_registered);
  EXPECT_EQ(a.record.handle, b.record.handle);
  // The first registration's name stays; the second copy was dropped.
  EXPECT_EQ(b.record.name, "lm_head");
  EXPECT_EQ(b.record.weight, a.record.weight);
  EXPECT_EQ(r.bytes_in_use(), 16u * 8 * 2);
  EXPECT_EQ(r.List(kTenant).size(), 1u);
  a = {};
  b = {};
  EXPECT_EQ(live_.load(), 1);
}

TEST_F(RegistryTest, DifferentShapeIsDifferentWeight) {
  WeightRegistry r(1 << 20);
  InsertResult a = Register(r, 42, 16, 8);
  InsertResult b = Register(r, 42, 8, 16);
  EXPECT_FALSE(b.already_registered);
  EXPECT_NE(a.record.handle, b.record.handle);
  EXPECT_EQ(r.List(kTenant).size(), 2u);
}

TEST_F(RegistryTest, BudgetRefusedBeforeAllocationWithNumbersInMessage) {
  WeightRegistry r(1000);
  InsertResult a = Register(r, 1, 10, 20);  // 400 bytes
  ASSERT_EQ(r.bytes_in_use(), 400u);
  const int live_before = live_.load();
  absl::StatusOr<BudgetReservation> res = r.ReserveWeight(kTenant, "'big'", 20, 20);  // 800 bytes
  ASSERT_EQ(res.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(res.status().message());
  EXPECT_THAT(msg, HasSubstr("'big'"));
  EXPECT_THAT(msg, HasSubstr("800 bytes"));   // asked
  EXPECT_THAT(msg, HasSubstr("1000 bytes"));  // budget
  EXPECT_THAT(msg, HasSubstr("400 in use"));  // in use
  EXPECT_THAT(msg, HasSubstr("--weight_budget_bytes"));
  // Nothing was created or charged.
  EXPECT_EQ(live_.load(), live_before);
  EXPECT_EQ(r.bytes_in_use(), 400u);
}

TEST_F(RegistryTest, ReservationReturnsBudgetWhenDropped) {
  WeightRegistry r(1000);
  {
    absl::StatusOr<BudgetReservation> res = r.ReserveWeight(kTenant, "'w'", 10, 40);  // 800
    ASSERT_TRUE(res.ok());
    EXPECT_EQ(r.bytes_in_use(), 800u);
    // A second upload cannot fit while the first is in flight.
    EXPECT_EQ(r.ReserveWeight(kTenant, "'w2'", 10, 40).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(r.bytes_in_use(), 0u);
  EXPECT_TRUE(r.ReserveWeight(kTenant, "'w2'", 10, 40).ok());
}

TEST_F(RegistryTest, DuplicateInsertReturnsReservation) {
  WeightRegistry r(10000);
  InsertResult a = Register(r, 7, 10, 10);  // 200
  absl::StatusOr<BudgetReservation> res = r.ReserveWeight(kTenant, "'again'", 10, 10);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(r.bytes_in_use(), 400u);
  InsertResult b =
      r.Insert(kTenant, std::move(*res), a.record.handle, "again", 10, 10, 7, MakeWeight(10, 10));
  EXPECT_TRUE(b.already_registered);
  EXPECT_EQ(r.bytes_in_use(), 200u);
}

TEST_F(RegistryTest, ReleaseFreesBytesAndKeepsInFlightWeightAlive) {
  WeightRegistry r(1 << 20);
  InsertResult a = Register(r, 9, 16, 8);
  absl::StatusOr<WeightRecord> in_flight = r.Find(kTenant, a.record.handle);
  ASSERT_TRUE(in_flight.ok());
  a = {};
  absl::StatusOr<WeightRegistry::Released> freed = r.Release(kTenant, in_flight->handle);
  ASSERT_TRUE(freed.ok());
  // Held by a call: nothing is freed now, all of it when the call ends; the
  // budget has it back at once.
  EXPECT_EQ(freed->bytes_freed, 0u);
  EXPECT_EQ(freed->bytes_freed_when_calls_end, 16u * 8 * 2);
  EXPECT_EQ(freed->registrations_left, 0u);
  EXPECT_EQ(r.bytes_in_use(), 0u);
  EXPECT_TRUE(r.List(kTenant).empty());
  // A call still holding the weight keeps the storage until it ends.
  EXPECT_EQ(live_.load(), 1);
  in_flight = absl::NotFoundError("");
  EXPECT_EQ(live_.load(), 0);
}

TEST_F(RegistryTest, ReleaseOfAnIdleWeightFreesItNow) {
  WeightRegistry r(1 << 20);
  InsertResult a = Register(r, 9, 16, 8);
  const std::string handle = a.record.handle;
  a = {};
  absl::StatusOr<WeightRegistry::Released> freed = r.Release(kTenant, handle);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(freed->bytes_freed, 16u * 8 * 2);
  EXPECT_EQ(freed->bytes_freed_when_calls_end, 0u);
  EXPECT_EQ(live_.load(), 0);
}

TEST_F(RegistryTest, UnknownHandleIsNotFoundNamingTheHandle) {
  WeightRegistry r(1 << 20);
  absl::StatusOr<WeightRecord> f = r.Find(kTenant, "w-nope");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("'w-nope'"));
  absl::StatusOr<WeightRegistry::Released> rel = r.Release(kTenant, "w-nope");
  EXPECT_EQ(rel.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(rel.status().message()), HasSubstr("'w-nope'"));
  EXPECT_EQ(r.BeginAccumulate(kTenant, "w-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryTest, ReleaseTwiceIsNotFound) {
  WeightRegistry r(1 << 20);
  InsertResult a = Register(r, 3, 4, 4);
  ASSERT_TRUE(r.Release(kTenant, a.record.handle).ok());
  EXPECT_EQ(r.Release(kTenant, a.record.handle).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryTest, EachRegistrationNeedsItsRelease) {
  // Two clients sharing a server register the same bytes; the first to
  // release must not pull the weight from under the second.
  WeightRegistry r(1 << 20);
  InsertResult a = Register(r, 11, 16, 8);
  InsertResult b = Register(r, 11, 16, 8);
  ASSERT_TRUE(b.already_registered);
  EXPECT_EQ(b.record.registrations, 2u);
  absl::StatusOr<WeightRegistry::Released> first = r.Release(kTenant, a.record.handle);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->bytes_freed, 0u);
  EXPECT_EQ(first->registrations_left, 1u);
  EXPECT_EQ(r.bytes_in_use(), 16u * 8 * 2);
  absl::StatusOr<WeightRecord> again = r.AddRegistration(kTenant, a.record.handle);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->registrations, 2u);
  ASSERT_TRUE(r.Release(kTenant, a.record.handle).ok());
  EXPECT_EQ(r.AddRegistration(kTenant, "w-nope").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<WeightRecord> still = r.Find(kTenant, a.record.handle);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->registrations, 1u);
  absl::StatusOr<WeightRegistry::Released> last = r.Release(kTenant, a.record.handle);
  ASSERT_TRUE(last.ok());
  // `a` and `still` hold the weight as a call would: it goes when they do.
  EXPECT_EQ(last->bytes_freed + last->bytes_freed_when_calls_end, 16u * 8 * 2);
  EXPECT_EQ(r.Find(kTenant, a.record.handle).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryTest, ForcedReleaseDropsEveryRegistration) {
  WeightRegistry r(1 << 20);
  InsertResult a = Register(r, 12, 16, 8);
  Register(r, 12, 16, 8);
  Register(r, 12, 16, 8);
  absl::StatusOr<WeightRegistry::Released> rel =
      r.Release(kTenant, a.record.handle, /*force=*/true);
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ(rel->bytes_freed_when_calls_end, 16u * 8 * 2);  // `a` holds it
  EXPECT_EQ(rel->registrations_left, 0u);
  EXPECT_EQ(r.bytes_in_use(), 0u);
  EXPECT_EQ(r.Find(kTenant, a.record.handle).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryTest, GradientBufferCountsAgainstBudget) {
  // Weight 10x10 bf16 = 200 bytes; its fp32 gradient = 400 bytes.
  WeightRegistry r(500);
  InsertResult a = Register(r, 5, 10, 10);
  absl::StatusOr<GradientTicket> t = r.BeginAccumulate(kTenant, a.record.handle);
  ASSERT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("gradient"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("400 bytes"));
  EXPECT_EQ(r.bytes_in_use(), 200u);

  WeightRegistry big(600);
  InsertResult b = Register(big, 5, 10, 10);
  auto* fake = static_cast<FakeWeight*>(b.record.weight.get());
  {
    absl::StatusOr<GradientTicket> t1 = big.BeginAccumulate(kTenant, b.record.handle);
    ASSERT_TRUE(t1.ok()) << t1.status();
    EXPECT_EQ(big.bytes_in_use(), 600u);
    // A concurrent accumulate is not charged twice.
    absl::StatusOr<GradientTicket> t2 = big.BeginAccumulate(kTenant, b.record.handle);
    ASSERT_TRUE(t2.ok()) << t2.status();
    EXPECT_EQ(big.bytes_in_use(), 600u);
    fake->CreateGradient();
  }
  // The buffer exists now: the charge stays, and later accumulates are free.
  EXPECT_EQ(big.bytes_in_use(), 600u);
  absl::StatusOr<WeightRecord> rec = big.Find(kTenant, b.record.handle);
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(rec->has_gradient);
  EXPECT_EQ(rec->bytes, 600u);
  EXPECT_TRUE(big.BeginAccumulate(kTenant, b.record.handle).ok());
  absl::StatusOr<WeightRegistry::Released> freed = big.Release(kTenant, b.record.handle);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(freed->bytes_freed + freed->bytes_freed_when_calls_end, 600u);
  EXPECT_EQ(big.bytes_in_use(), 0u);
}

TEST_F(RegistryTest, FailedAccumulateReturnsGradientCharge) {
  WeightRegistry r(600);
  InsertResult a = Register(r, 5, 10, 10);
  {
    absl::StatusOr<GradientTicket> t = r.BeginAccumulate(kTenant, a.record.handle);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(r.bytes_in_use(), 600u);
    // The backend call fails without creating the buffer.
  }
  EXPECT_EQ(r.bytes_in_use(), 200u);
}

TEST_F(RegistryTest, TicketOutlivingReleaseDoesNotTouchBudget) {
  WeightRegistry r(600);
  InsertResult a = Register(r, 5, 10, 10);
  absl::StatusOr<GradientTicket> t = r.BeginAccumulate(kTenant, a.record.handle);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(r.Release(kTenant, a.record.handle).ok());
  EXPECT_EQ(r.bytes_in_use(), 0u);
  t = absl::CancelledError("");
  EXPECT_EQ(r.bytes_in_use(), 0u);
}

TEST_F(RegistryTest, LabelUsesNameOrHandle) {
  WeightRecord w;
  w.handle = "w-1-2x3";
  w.v = 2;
  w.k = 3;
  EXPECT_EQ(w.Label(), "'w-1-2x3' [2, 3]");
  w.name = "lm_head";
  EXPECT_EQ(w.Label(), "'lm_head' [2, 3]");
}

TEST_F(RegistryTest, TenantsSeeOnlyTheirOwnWeights) {
  WeightRegistry r(1 << 20);
  const Tenant a{"team-a", 0};
  const Tenant b{"team-b", 0};
  const std::string handle = Register(r, 42, 16, 8, "w", a).record.handle;
  EXPECT_TRUE(r.Find(a, handle).ok());
  absl::StatusOr<WeightRecord> other = r.Find(b, handle);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(other.status().message(), HasSubstr("for tenant 'team-b'"));
  EXPECT_EQ(r.AddRegistration(b, handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.BeginAccumulate(b, handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.Release(b, handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.List(a).size(), 1u);
  EXPECT_TRUE(r.List(b).empty());
  EXPECT_TRUE(r.List(kTenant).empty());

  // The same bytes registered by b are b's own entry, charged to b.
  InsertResult mine = Register(r, 42, 16, 8, "w", b);
  EXPECT_FALSE(mine.already_registered);
  EXPECT_EQ(mine.record.handle, handle);
  EXPECT_EQ(r.tenant_bytes_in_use("team-a"), 256u);
  EXPECT_EQ(r.tenant_bytes_in_use("team-b"), 256u);
  EXPECT_EQ(r.bytes_in_use(), 512u);
  ASSERT_TRUE(r.Release(a, handle).ok());
  EXPECT_TRUE(r.Find(b, handle).ok());
  EXPECT_EQ(r.tenant_bytes_in_use("team-a"), 0u);
  EXPECT_EQ(r.bytes_in_use(), 256u);
}

TEST_F(RegistryTest, TenantQuotaIsCheckedBeforeTheBudget) {
  WeightRegistry r(1 << 20);
  const Tenant small{"small", 1000};
  {
    absl::StatusOr<BudgetReservation> res = r.ReserveWeight(small, "'w'", 10, 40);  // 800
    ASSERT_TRUE(res.ok()) << res.status();
    absl::StatusOr<BudgetReservation> more = r.ReserveWeight(small, "'w2'", 10, 40);
    EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(more.status().message(), HasSubstr("tenant 'small' has a weight quota of 1000"));
    EXPECT_THAT(more.status().message(), HasSubstr("--tenant_quota_bytes"));
    // Another tenant is not held to small's quota.
    EXPECT_TRUE(r.ReserveWeight(Tenant{"big", 0}, "'w3'", 10, 40).ok());
  }
  EXPECT_EQ(r.bytes_in_use(), 0u);
  EXPECT_EQ(r.tenant_bytes_in_use("small"), 0u);
  // The gradient buffer counts against the quota too.
  const std::string handle = Register(r, 7, 10, 20, "w", small).record.handle;  // 400
  absl::StatusOr<GradientTicket> t = r.BeginAccumulate(small, handle);          // +800
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.tenant_bytes_in_use("small"), 400u);
}

}  // namespace
}  // namespace logitd::service
