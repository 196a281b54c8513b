// Admission against the request-memory budget and the concurrency cap:
// exact statuses, waiting, and that tickets give everything back.
#include "server/service/state/admission.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace logitd::service {
namespace {

using ::testing::HasSubstr;

AdmissionOptions Options(std::uint64_t bytes, std::uint32_t calls, absl::Duration wait) {
  AdmissionOptions o;
  o.memory_bytes = bytes;
  o.max_concurrent_requests = calls;
  o.max_wait = wait;
  return o;
}

const auto kNever = [] { return false; };

TEST(AdmissionTest, TicketsAreCountedAndGiveEverythingBack) {
  RequestAdmission a(Options(1000, 4, absl::ZeroDuration()));
  {
    absl::StatusOr<AdmissionTicket> t1 = a.Admit("x", 600, absl::InfiniteFuture(), kNever);
    ASSERT_TRUE(t1.ok()) << t1.status();
    EXPECT_EQ(t1->waited(), absl::ZeroDuration());
    absl::StatusOr<AdmissionTicket> t2 = a.Admit("x", 400, absl::InfiniteFuture(), kNever);
    ASSERT_TRUE(t2.ok()) << t2.status();
    EXPECT_EQ(a.Stats().bytes_in_flight, 1000u);
    EXPECT_EQ(a.Stats().requests_in_flight, 2u);
    AdmissionTicket moved = std::move(*t1);
    EXPECT_EQ(moved.bytes(), 600u);
    EXPECT_FALSE(t1->active());
    EXPECT_EQ(a.Stats().bytes_in_flight, 1000u);
  }
  const AdmissionStats s = a.Stats();
  EXPECT_EQ(s.bytes_in_flight, 0u);
  EXPECT_EQ(s.requests_in_flight, 0u);
  EXPECT_EQ(s.bytes_high_water, 1000u);
  EXPECT_EQ(s.requests_high_water, 2u);
}

TEST(AdmissionTest, LargerThanTheBudgetIsRefusedAtOnce) {
  RequestAdmission a(Options(1000, 4, absl::Seconds(30)));
  const absl::Time t0 = absl::Now();
  absl::StatusOr<AdmissionTicket> t = a.Admit("logits", 1001, absl::InfiniteFuture(), kNever);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("--request_memory_bytes"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
}

TEST(AdmissionTest, WaitRunsOutWithResourceExhaustedOrDeadlineExceeded) {
  RequestAdmission a(Options(1000, 4, absl::Milliseconds(100)));
  absl::StatusOr<AdmissionTicket> held = a.Admit("x", 900, absl::InfiniteFuture(), kNever);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<AdmissionTicket> t = a.Admit("x", 200, absl::InfiniteFuture(), kNever);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  t = a.Admit("x", 200, absl::Now() + absl::Milliseconds(20), kNever);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  t = a.Admit("x", 200, absl::InfiniteFuture(), [] { return true; });
  EXPECT_EQ(t.status().code(), absl::StatusCode::kCancelled) << t.status();
  EXPECT_EQ(a.Stats().requests_in_flight, 1u);
}

TEST(AdmissionTest, ConcurrencyCapMakesCallsWait) {
  RequestAdmission a(Options(1000, 1, absl::Milliseconds(50)));
  absl::StatusOr<AdmissionTicket> held = a.Admit("x", 1, absl::InfiniteFuture(), kNever);
  ASSERT_TRUE(held.ok());
  absl::StatusOr<AdmissionTicket> t = a.Admit("x", 1, absl::InfiniteFuture(), kNever);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("--max_concurrent_requests"));
}

TEST(AdmissionTest, AWaitingCallIsAdmittedWhenMemoryComesBack) {
  RequestAdmission a(Options(1000, 4, absl::Seconds(30)));
  auto held = std::make_unique<AdmissionTicket>(
      std::move(a.Admit("x", 800, absl::InfiniteFuture(), kNever)).value());
  std::atomic<bool> admitted{false};
  std::thread waiter([&] {
    absl::StatusOr<AdmissionTicket> t = a.Admit("x", 800, absl::InfiniteFuture(), kNever);
    EXPECT_TRUE(t.ok()) << t.status();
    EXPECT_GE(t->waited(), absl::Milliseconds(40));
    admitted = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(admitted.load());
  held.reset();
  waiter.join();
  EXPECT_TRUE(admitted.load());
  EXPECT_EQ(a.Stats().bytes_in_flight, 0u);
}

}  // namespace
}  // namespace logitd::service
